"""The result of a fit: estimates, posterior, trajectories; save and load (NetCDF)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .ode.system import ODESystem


@dataclass(frozen=True)
class FitResult:
    """Everything :func:`fit` produced.

    Attributes
    ----------
    system : the ODESystem
    posterior : ArviZ DataTree of the sampling step
    estimates : xarray.Dataset, ``theta`` (estimate, parameter) for ``sampled`` (posterior
        mean) and ``refined``; ``stderr`` (parameter) of the refined estimate; ``truth``
        (parameter) when known
    trajectories : xarray.Dataset, ``x`` (estimate, time_dense, state) integrated from x0
        for each estimate (and ``truth`` when known); ``y`` (time, observed)
    timings : seconds per step; n_ode_solves : solves per step
    """

    system: ODESystem
    posterior: object
    estimates: xr.Dataset
    trajectories: xr.Dataset
    timings: Mapping[str, float]
    n_ode_solves: Mapping[str, int]

    @property
    def theta(self) -> np.ndarray:
        """The refined parameter estimate (P,)."""
        return self.estimates["theta"].sel(estimate="refined").values

    def parameter_table(self) -> pd.DataFrame:
        """True (if known), sampled and refined parameters with the refined standard errors."""
        e = self.estimates
        table = pd.DataFrame({
            "sampled": e["theta"].sel(estimate="sampled").values,
            "refined": e["theta"].sel(estimate="refined").values,
            "refined_stderr": e["stderr"].values,
        }, index=pd.Index(list(self.system.parameters), name="parameter"))
        if "truth" in e:
            table.insert(0, "true", e["truth"].values)
        return table

    def plot_states(self, **kwargs):
        """Every state: truth, observations, sampling-step and refined trajectories."""
        from .plots import plot_states

        return plot_states(self, **kwargs)

    def plot_parameters(self, **kwargs):
        """Parameter estimates (sampled with its posterior, refined with +-2 se) against the truth."""
        from .plots import plot_parameters

        return plot_parameters(self, **kwargs)

    def save(self, path: str | Path) -> Path:
        """Write the result to one NetCDF file (groups: the DataTree's, plus estimates and trajectories)."""
        path = Path(path)
        tree = self.posterior.copy()
        tree["pgpgm_estimates"] = xr.DataTree(self.estimates)
        tree["pgpgm_trajectories"] = xr.DataTree(self.trajectories)
        tree.attrs["pgpgm_system"] = json.dumps({
            "name": self.system.name, "parameters": list(self.system.parameters),
            "equations": {s: str(e) for s, e in zip(self.system.states, self.system.expressions)},
        })
        tree.attrs["pgpgm_timings"] = json.dumps(dict(self.timings))
        tree.attrs["pgpgm_n_ode_solves"] = json.dumps(dict(self.n_ode_solves))
        tree.to_netcdf(path, engine="h5netcdf")
        return path


def load_result(path: str | Path) -> FitResult:
    """Read a result written by :meth:`FitResult.save`."""
    tree = xr.open_datatree(path, engine="h5netcdf").load()
    sysd = json.loads(tree.attrs["pgpgm_system"])
    eqs = {s: e.replace("Abs(", "abs(") for s, e in sysd["equations"].items()}
    system = ODESystem.from_equations(eqs, sysd["parameters"], name=sysd["name"])
    estimates = tree["pgpgm_estimates"].to_dataset()
    trajectories = tree["pgpgm_trajectories"].to_dataset()
    post = tree.copy()
    for g in ("pgpgm_estimates", "pgpgm_trajectories"):
        del post[g]
    return FitResult(system, post, estimates, trajectories, json.loads(tree.attrs["pgpgm_timings"]),
                     json.loads(tree.attrs["pgpgm_n_ode_solves"]))

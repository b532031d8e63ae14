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
    posterior : ArviZ DataTree of the main posterior: NUTS on the ODE model (step 4, the
        default), its Laplace approximation, or the gradient-matching chains when the fit
        ran without step 4 (``fit(posterior=None)``)
    estimates : xarray.Dataset, ``theta`` (estimate, parameter) for ``sampled``
        (gradient-matching posterior mean), ``refined`` and, with step 4, ``posterior``
        (its mean); ``stderr`` (parameter) of the refined estimate; ``truth`` (parameter)
        when known
    trajectories : xarray.Dataset, ``x`` (estimate, time_dense, state) integrated from x0
        for each estimate (and ``truth`` when known); ``y`` (time, observed)
    timings : seconds per step; n_ode_solves : solves per step
    gradient_matching : ArviZ DataTree of the gradient-matching chains (step 2)
    diagnostics : xarray.Dataset, ``rhat``, ``ess_bulk``, ``ess_tail`` (sampler, variable)
        and ``divergences`` (sampler) for ``sampler`` in ``gradient_matching`` and, with
        step 4, ``posterior``
    """

    system: ODESystem
    posterior: object
    estimates: xr.Dataset
    trajectories: xr.Dataset
    timings: Mapping[str, float]
    n_ode_solves: Mapping[str, int]
    gradient_matching: object = None
    diagnostics: xr.Dataset | None = None

    @property
    def theta(self) -> np.ndarray:
        """The refined parameter estimate (P,)."""
        return self.estimates["theta"].sel(estimate="refined").values

    @property
    def x0(self) -> dict[str, float]:
        """The refined initial value of every state, by name."""
        return dict(zip(self.system.states, map(float, self.estimates.attrs["refined_x0"])))

    def parameter_table(self) -> pd.DataFrame:
        """Per parameter: true (if known), sampled (gradient-matching mean), refined with its
        standard error, and with step 4 the posterior mean, sd, 94 % interval and R-hat."""
        e = self.estimates
        params = list(self.system.parameters)
        table = pd.DataFrame({
            "sampled": e["theta"].sel(estimate="sampled").values,
            "refined": e["theta"].sel(estimate="refined").values,
            "refined_stderr": e["stderr"].values,
        }, index=pd.Index(params, name="parameter"))
        if "truth" in e:
            table.insert(0, "true", e["truth"].values)
        if "posterior" in e["estimate"].values:
            post = self.posterior.posterior
            table["posterior_mean"] = [float(post[p].mean()) for p in params]
            table["posterior_sd"] = [float(post[p].std()) for p in params]
            table["hdi_3%"] = [float(post[p].quantile(0.03)) for p in params]
            table["hdi_97%"] = [float(post[p].quantile(0.97)) for p in params]
            table["r_hat"] = self.diagnostics["rhat"].sel(sampler="posterior", variable=params).values
        return table

    def summary(self, **kwargs) -> pd.DataFrame:
        """ArviZ's summary table of the main posterior's scalar quantities (parameters, and
        with step 4 the observed states' initial values and noise sds)."""
        import arviz as az

        post = self.posterior.posterior
        names = [n for n in post.data_vars if post[n].ndim == 2]
        return az.summary(self.posterior, var_names=names, **kwargs)

    def convergence_problems(self) -> dict[str, list[str]]:
        """Failed convergence checks per posterior (empty lists when every check passes)."""
        from .diagnostics import problems

        if self.diagnostics is None:
            return {}
        return {str(s): problems(_one_sampler(self.diagnostics, s)) for s in self.diagnostics["sampler"].values}

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
        if self.gradient_matching is not None and self.gradient_matching is not self.posterior:
            tree["pgpgm_gradient_matching"] = self.gradient_matching.copy()
        if self.diagnostics is not None:
            tree["pgpgm_diagnostics"] = xr.DataTree(self.diagnostics)
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
    extra = {g: post[g] for g in ("pgpgm_gradient_matching", "pgpgm_diagnostics") if g in post.children}
    for g in ("pgpgm_estimates", "pgpgm_trajectories", *extra):
        del post[g]
    gm = extra["pgpgm_gradient_matching"].copy() if "pgpgm_gradient_matching" in extra else post
    diag = extra["pgpgm_diagnostics"].to_dataset() if "pgpgm_diagnostics" in extra else None
    return FitResult(system, post, estimates, trajectories, json.loads(tree.attrs["pgpgm_timings"]),
                     json.loads(tree.attrs["pgpgm_n_ode_solves"]), gm, diag)


def _one_sampler(diag: xr.Dataset, sampler: str) -> xr.Dataset:
    """The diagnostics of one sampler, as :func:`pgpgm.diagnostics.diagnose` returns them."""
    one = diag.sel(sampler=sampler).dropna("variable", how="all")
    return one[["rhat", "ess_bulk", "ess_tail"]].assign_attrs(divergences=int(one["divergences"]))

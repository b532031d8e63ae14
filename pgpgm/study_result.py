"""The result of a study fit: estimates and trajectories with an experiment dimension, the joint
posterior, a figure with a panel per experiment, save and load (the file machinery of
:class:`pgpgm.FitResult`: one NetCDF file with a checksum)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from .errors import ODESolveError, ResultFileError
from .fit_result import FitResult, load_result
from .ode.system import ODESystem
from .posterior.diagnostics import problems
from .solve import Integrator
from .study.model import varying_name

_STUDY_ATTR = "pgpgm_study"


@dataclass(frozen=True)
class StudyResult:
    """Everything :func:`pgpgm.fit_study` produced.

    Attributes
    ----------
    system : the ODESystem
    estimates : xarray.Dataset: ``theta`` (estimate, experiment, parameter) for ``separate`` (each
        experiment refined alone, its known inputs held), ``joint`` (the joint refinement) and, with step
        4, ``posterior`` (the mean); ``stderr`` (experiment, parameter) of the joint refinement;
        ``x0`` (estimate, experiment, state); ``noise_sd`` (estimate, experiment, observed) each state's
        noise parameter (sd, of log y for lognormal; alpha for negbin; 1 for Poisson) (joint: the shared
        one, or the experiment's own with ``noise_per_experiment``); ``nll`` (estimate, experiment) (joint: the joint NLL on every experiment);
        ``population`` (estimate_population, statistic, hierarchical) with statistics ``mu``, ``sigma`` (log scale) and
        ``median`` = exp(mu), at ``start`` (from the refined values) and ``posterior`` (mean) when there are
        hierarchical parameters; attrs ``shared``, ``varying``, ``hierarchical`` (JSON), ``joint_nll``,
        ``nll_per_start`` (JSON), ``noise`` (JSON: the noise model by observed state), ``noise_names`` (JSON:
        the joint refinement's noise parameters)
    trajectories : xarray.Dataset: ``x`` (estimate, experiment, point, state) on ``time``
        (experiment, point), each experiment's own plotting grid; ``y`` (experiment, sample, observed) the
        measurements at ``time_obs`` (experiment, sample), NaN-padded
    posterior : ArviZ DataTree of step 4 (joint NUTS), None without it
    diagnostics : xarray.Dataset of step 4 (``rhat``, ``ess_bulk``, ``ess_tail`` by variable), or None
    timings, n_ode_solves : by step
    fits : (K,) the per-experiment :class:`pgpgm.FitResult` of steps 1-3 (not saved)
    model : the joint ``pm.Model`` of step 4 (not saved): open it to extend it and sample again
    """

    system: ODESystem
    estimates: xr.Dataset
    trajectories: xr.Dataset
    posterior: Any
    diagnostics: xr.Dataset | None
    timings: Mapping[str, float]
    n_ode_solves: Mapping[str, int]
    fits: tuple = ()
    model: Any = None

    # ------------------------------------------------------------------ views
    @property
    def experiments(self) -> list[str]:
        return [str(e) for e in self.estimates["experiment"].values]

    def theta(self, estimate: str = "joint") -> pd.DataFrame:
        """Parameters by experiment (rows) for ``estimate`` (``separate``, ``joint``, ``posterior``)."""
        return self.estimates["theta"].sel(estimate=estimate).to_pandas()

    @property
    def nll(self) -> float:
        """The joint negative log likelihood at the joint refinement (every experiment, constants included)."""
        return float(self.estimates.attrs["joint_nll"])

    @property
    def population(self) -> pd.DataFrame:
        """Hierarchical parameters (rows) by statistic and estimate (columns: ``(estimate, statistic)``)."""
        if "population" not in self.estimates:
            return pd.DataFrame()
        pop = self.estimates["population"]
        return pd.DataFrame({(str(est), str(st)): pop.sel(estimate_population=est, statistic=st).to_pandas()
                             for est in pop["estimate_population"].values for st in pop["statistic"].values})

    def convergence_problems(self) -> list[str]:
        """Step 4's failed checks (R-hat > 1.01, ESS < 400, divergences); empty when converged or absent."""
        return [] if self.diagnostics is None else problems(self.diagnostics)

    def plot(self, *, columns: int = 4, panel=(3.2, 2.4)):
        """A panel per experiment: the measurements, the separate and joint trajectories of the observed
        states, and the posterior mean's when step 4 ran."""
        import matplotlib.pyplot as plt

        traj = self.trajectories
        names = self.experiments
        rows = -(-len(names) // columns)
        cols = min(columns, len(names))
        fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False,
                                 layout="constrained", sharex=False)
        styles = {"separate": ("tab:orange", "--"), "joint": ("tab:blue", "-"), "posterior": ("tab:green", ":")}
        for ax, e in zip(axes.flat, names):
            t = traj["time"].sel(experiment=e).values
            for s in traj["observed"].values:
                for est in traj["estimate"].values:
                    color, ls = styles.get(str(est), ("gray", "-"))
                    ax.plot(t, traj["x"].sel(estimate=est, experiment=e, state=s), ls, color=color, lw=1.2,
                            label=f"{est} {s}")
                ax.plot(traj["time_obs"].sel(experiment=e), traj["y"].sel(experiment=e, observed=s), "k.", ms=4,
                        label=f"measured {s}")
            ax.set_title(str(e), fontsize=9)
        for ax in axes.flat[len(names):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=7)
        return fig

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the result to one NetCDF file with a checksum (:meth:`pgpgm.FitResult.save`'s machinery);
        the per-experiment fits and the model are not stored. Read it back with :func:`load_study`."""
        post = self.posterior if self.posterior is not None else xr.DataTree()
        est = self.estimates.copy()
        est.attrs[_STUDY_ATTR] = 1
        return FitResult(self.system, post, est, self.trajectories, dict(self.timings), dict(self.n_ode_solves),
                         None, self.diagnostics).save(path)

    # ------------------------------------------------------------------ assembly
    @classmethod
    def assemble(cls, *, system, names, observations, fits, separate, joint, refinements, layout, hierarchical,
                 varying, tree, model, diagnostics, solver, dense_points, timings, n_ode_solves) -> StudyResult:
        """The result from :func:`pgpgm.fit_study`'s parts."""
        P, S, K = system.n_parameters, system.n_states, len(names)
        observed = list(joint.observed)
        estimates_names = ["separate", "joint"] + (["posterior"] if tree is not None else [])
        theta = np.full((len(estimates_names), K, P), np.nan)
        x0 = np.full((len(estimates_names), K, S), np.nan)
        noise = np.full((len(estimates_names), K, len(observed)), np.nan)
        nll = np.full((len(estimates_names), K), np.nan)
        for j, s in enumerate(separate):
            theta[0, j], x0[0, j], nll[0, j] = s.thetas[0], s.x0s[0], s.nll
            for m, st in enumerate(s.observed):
                noise[0, j, observed.index(st)] = s.noise_sd[m]
        theta[1], x0[1], nll[1] = joint.thetas, joint.x0s, joint.nll
        for j, e in enumerate(names):  # the shared noise parameters, or each experiment's own
            noise[1, j] = [joint.noise_of(st, e) for st in observed]
        se = np.full((K, P), np.nan)
        for j, e in enumerate(names):
            for a, p in enumerate(system.parameters):
                key = p if p in layout.shared else varying_name(p, e)
                if key in joint.names:
                    se[j, a] = joint.stderr[joint.names.index(key)]
                elif p in layout.fixed[j]:
                    se[j, a] = 0.0
        if tree is not None:
            post = tree.posterior
            for j, e in enumerate(names):
                for a, p in enumerate(system.parameters):
                    if p in layout.fixed[j]:
                        theta[2, j, a] = layout.fixed[j][p]
                    else:
                        key = p if p in post and p in layout.shared else varying_name(p, e)
                        theta[2, j, a] = float(post[key].mean())
                x0[2, j] = x0[1, j]
                for i in layout.free_x0[j]:
                    key = f"{system.states[i]}_0[{e}]"
                    x0[2, j, i] = float(post[key].mean())
                for m, st in enumerate(observed):
                    for key in (f"sigma_{st}[{e}]", f"alpha_{st}[{e}]", f"sigma_{st}", f"alpha_{st}"):
                        if key in post:
                            noise[2, j, m] = float(post[key].mean())
                            break
        data_vars = {
            "theta": (("estimate", "experiment", "parameter"), theta),
            "stderr": (("experiment", "parameter"), se),
            "x0": (("estimate", "experiment", "state"), x0),
            "noise_sd": (("estimate", "experiment", "observed"), noise),
            "nll": (("estimate", "experiment"), nll),
        }
        coords = {"estimate": estimates_names, "experiment": list(names), "parameter": list(system.parameters),
                  "state": list(system.states), "observed": observed}
        if hierarchical:
            hp = list(hierarchical)
            pop_est = ["start"] + (["posterior"] if tree is not None else [])
            pop = np.full((len(pop_est), 3, len(hp)), np.nan)
            for h, p in enumerate(hp):
                logs = np.log([joint.value(varying_name(p, e)) for j, e in enumerate(names)
                               if p not in layout.fixed[j]])
                pop[0, :, h] = np.mean(logs), np.std(logs), np.exp(np.mean(logs))
                if tree is not None:
                    mu = tree.posterior[f"mu_{p}"]
                    pop[1, :, h] = float(mu.mean()), float(tree.posterior[f"sigma_{p}"].mean()), float(np.exp(mu).mean())
            data_vars["population"] = (("estimate_population", "statistic", "hierarchical"), pop)
            coords |= {"estimate_population": pop_est, "statistic": ["mu", "sigma", "median"], "hierarchical": hp}
        attrs = {"shared": json.dumps(list(layout.shared)), "varying": json.dumps(list(varying)),
                 "hierarchical": json.dumps(dict(hierarchical)), "joint_nll": float(joint.nll),
                 "nll_per_start": json.dumps({k: float(r.nll) for k, r in refinements.items()}),
                 "joint_message": joint.message,
                 "noise": json.dumps(dict(zip(observed, joint.noise or ("normal",) * len(observed)))),
                 "noise_names": json.dumps(list(joint.noise_names or observed))}
        estimates = xr.Dataset(data_vars, coords=coords, attrs=attrs)
        # trajectories on each experiment's own grid
        X = np.full((len(estimates_names), K, dense_points, S), np.nan)
        T = np.zeros((K, dense_points))
        n_max = max(o.times.size for o in observations)
        Y, TO = np.full((K, n_max, len(observed)), np.nan), np.full((K, n_max), np.nan)
        for j, obs in enumerate(observations):
            T[j] = np.linspace(obs.times[0], obs.times[-1], dense_points)
            integ = Integrator(system, T[j], solver)
            for k in range(len(estimates_names)):
                try:
                    X[k, j] = integ.solve(theta[k, j], x0[k, j])
                except ODESolveError:
                    pass
            TO[j, : obs.times.size] = obs.times
            for m, st in enumerate(obs.states):
                Y[j, : obs.times.size, observed.index(st)] = np.where(obs.mask[:, m], obs.values[:, m], np.nan)
        trajectories = xr.Dataset(
            {"x": (("estimate", "experiment", "point", "state"), X), "time": (("experiment", "point"), T),
             "y": (("experiment", "sample", "observed"), Y), "time_obs": (("experiment", "sample"), TO)},
            coords={"estimate": estimates_names, "experiment": list(names), "state": list(system.states),
                    "observed": observed})
        return cls(system, estimates, trajectories, tree, diagnostics, dict(timings), dict(n_ode_solves), fits, model)


def load_study(path: str | Path, *, verify: bool = True) -> StudyResult:
    """Read a result written by :meth:`StudyResult.save` (checked against its checksum).

    Raises
    ------
    ResultFileError : as :func:`pgpgm.load_result`, and for a file of a single fit.
    """
    r = load_result(path, verify=verify)
    if not r.estimates.attrs.get(_STUDY_ATTR):
        raise ResultFileError(f"{path} holds a single fit, not a study: read it with pgpgm.load_result")
    est = r.estimates.copy()
    est.attrs.pop(_STUDY_ATTR, None)
    post = r.posterior if "posterior" in r.posterior.children else None
    return StudyResult(r.system, est, r.trajectories, post, r.diagnostics, r.timings, r.n_ode_solves)

"""The whole method: GP fit, gradient-matching MCMC, least-squares refinement."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .density import PriorSpec, build_model
from .ode import ODESolver, SolverOptions
from .refine import LeastSquaresProblem, Refinement, refine
from .sampler import sample
from .system import ODESystem

_DENSE = 400  # points of the plotted trajectories


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


def fit(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
    kernel: str = "rbf",
    gamma: float = 0.3,
    priors: Mapping[str, PriorSpec] | PriorSpec | None = (0.0, 10.0),
    noise_sd: float | Sequence[float] | None = None,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int = 0,
    init="spread",
    refine_x0: bool = True,
    true_theta=None,
    backend: str = "auto",
    solver_options: SolverOptions | None = None,
    progressbar: bool = True,
) -> FitResult:
    """Infer the parameters and latent states of ``system`` from partial observations.

    Runs METHOD.md's three steps: GP fit per observed state, ``tune + draws``
    Metropolis-within-Gibbs iterations per chain on the gradient-matching density
    (chains start apart, see ``init`` of :func:`pgpgm.sample`), least-squares refinement
    from the pooled posterior mean and from each chain's mean, keeping the lowest cost
    (bounded by the uniform prior bounds when priors are given as bounds).

    Parameters are those of :func:`pgpgm.build_model` and :func:`pgpgm.sample`;
    ``refine_x0`` also refines the observed states' initial values (started at their
    posterior means) in the least-squares step; ``true_theta`` (P,) (or ``data.attrs["theta"]`` from :func:`pgpgm.simulate`) adds
    the ground truth to tables and figures.
    """
    timings, t0 = {}, time.perf_counter()
    model = build_model(system, data, observed, x0=x0, kernel=kernel, gamma=gamma, priors=priors,
                        noise_sd=noise_sd, backend=backend, solver_options=solver_options, seed=seed)
    setup = model.pgpgm
    timings["gp"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    tree = sample(model, draws=draws, tune=tune, chains=chains, seed=seed, init=init, progressbar=progressbar)
    timings["sampling"] = time.perf_counter() - t1
    post = tree.posterior
    theta_s = np.array([float(post[p].mean()) for p in system.parameters])
    x0_full = setup.x0.copy()
    for m, s in enumerate(setup.obs.states):
        x0_full[setup.observed_idx[m]] = float(post[s].isel(time=0).mean())

    t2 = time.perf_counter()
    bounds = setup.prior_bounds  # the uniform priors' support, None for other priors
    problem = LeastSquaresProblem(system, setup.obs.times, setup.obs.values, setup.observed_idx, setup.noise_sd,
                                  x0_full, free_x0=setup.observed_idx if refine_x0 else (), backend=backend,
                                  options=solver_options)
    # multi-start: from the pooled posterior mean and from every chain's mean; keep the best
    starts = [theta_s] + ([np.array([float(post[p].sel(chain=c).mean()) for p in system.parameters])
                           for c in post.chain.values] if post.sizes["chain"] > 1 else [])
    refinements = [refine(problem, th, bounds) for th in starts]
    ref: Refinement = min(refinements, key=lambda r: r.cost)
    x0_refined = ref.x0
    timings["refinement"] = time.perf_counter() - t2
    timings["total"] = time.perf_counter() - t0

    if true_theta is None and isinstance(data, xr.Dataset) and "theta" in data.attrs:
        true_theta = data.attrs["theta"]
    est = xr.Dataset(
        {"theta": (("estimate", "parameter"), np.vstack([theta_s, ref.theta])),
         "stderr": (("parameter",), ref.stderr),
         "covariance": (("parameter", "parameter_"), ref.covariance)},
        coords={"estimate": ["sampled", "refined"], "parameter": list(system.parameters),
                "parameter_": list(system.parameters)},
        attrs={"refined_x0": ref.x0.tolist(), "refinement_cost": ref.cost,
               "refinement_costs_per_start": [r.cost for r in refinements], "refinement_success": int(ref.success), "refinement_message": ref.message},
    )
    t = setup.obs.times
    dense = np.linspace(t[0], t[-1], _DENSE)
    solver = ODESolver(system, dense, backend=backend, options=solver_options)
    rows, labels = [], []
    for label, th, x0_ in (("sampled", theta_s, x0_full), ("refined", ref.theta, x0_refined)):
        rows.append(_safe_solve(solver, th, x0_))
        labels.append(label)
    if true_theta is not None:
        true_theta = np.asarray(true_theta, float)
        est["truth"] = ("parameter", true_theta)
        x0_true = (np.asarray(data.attrs["x0"], float) if isinstance(data, xr.Dataset) and "x0" in data.attrs
                   else x0_full)
        rows.append(_safe_solve(solver, true_theta, x0_true))
        labels.append("truth")
    traj = xr.Dataset(
        {"x": (("estimate", "time_dense", "state"), np.stack(rows)),
         "y": (("time", "observed"), setup.obs.values),
         "noise_sd": (("observed",), setup.noise_sd)},
        coords={"estimate": labels, "time_dense": dense, "time": t, "state": list(system.states),
                "observed": list(setup.obs.states)},
    )
    solves = {"sampling": setup.op.solver.n_solves if setup.op is not None else 0,
              "refinement": sum(r.n_solves for r in refinements)}
    return FitResult(system, tree, est, traj, timings, solves)


def _safe_solve(solver: ODESolver, theta, x0) -> np.ndarray:
    from .errors import ODESolveError

    try:
        return solver.solve(theta, x0)
    except ODESolveError:
        return np.full((solver.times.size, solver.system.n_states), np.nan)

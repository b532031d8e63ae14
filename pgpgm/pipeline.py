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
from .result import FitResult
from .solve.base import ODESolver, SolverOptions
from .refine import LeastSquaresProblem, Refinement, refine
from .sampling import sample
from .ode.system import ODESystem

_DENSE = 400  # points of the plotted trajectories


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

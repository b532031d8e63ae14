"""The whole method: GP fit, gradient-matching MCMC, least-squares refinement."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from .data import as_observations
from .density import fit_gps, gradient_matching_density
from .errors import ODESolveError
from .ode.system import ODESystem
from .priors import PriorSpec
from .refine import LeastSquaresProblem, Refinement, refine
from .result import FitResult
from .sampling import sample
from .solve import Integrator, Solver

_DENSE = 400  # points of the plotted trajectories


def fit(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
    kernel: str = "rbf",
    gamma: float = 0.3,
    priors: Mapping[str, PriorSpec] | PriorSpec | None = None,
    noise_sd: float | Sequence[float] | None = None,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int = 0,
    init="spread",
    refine_x0: bool = True,
    true_theta=None,
    solver: Solver | None = None,
    progressbar: bool = True,
) -> FitResult:
    """Infer the parameters and latent states of ``system`` from partial observations.

    Runs METHOD.md's three steps: GP fit per observed state, ``tune + draws``
    Metropolis-within-Gibbs iterations per chain on the gradient-matching density
    (chains start apart, see ``init`` of :func:`pgpgm.sample`), least-squares refinement
    from the pooled posterior mean and from each chain's mean, keeping the lowest cost
    (bounded by the uniform prior bounds when priors are given as bounds).

    Parameters are those of :func:`pgpgm.gradient_matching_density` and :func:`pgpgm.sample`;
    ``solver`` (default :func:`pgpgm.default_solver`) does every ODE solve of the fit;
    ``refine_x0`` also refines the observed states' initial values (started at their
    posterior means) in the least-squares step; ``true_theta`` (P,) (or ``data.attrs["theta"]`` from :func:`pgpgm.simulate`) adds
    the ground truth to tables and figures.
    """
    timings, t0 = {}, time.perf_counter()
    obs = as_observations(data, observed, system)
    gps = fit_gps(obs, kernel, noise_sd=noise_sd, seed=seed)
    timings["gp"] = time.perf_counter() - t0
    integrator = Integrator(system, obs.times, solver)
    density = gradient_matching_density(system, data, obs.states, x0=x0, kernel=kernel, gamma=gamma, priors=priors,
                                        noise_sd=noise_sd, gp_fits=gps, solver=integrator, seed=seed)
    t1 = time.perf_counter()
    tree = sample(density, draws=draws, tune=tune, chains=chains, seed=seed, init=init, progressbar=progressbar)
    timings["sampling"] = time.perf_counter() - t1
    n_sampling = integrator.n_solves
    post = tree.posterior
    theta_s = np.array([float(post[p].mean()) for p in system.parameters])
    x0_full = np.array(density.initial_state([float(post[s].isel(time=0).mean()) for s in obs.states]))

    t2 = time.perf_counter()
    bounds = density.priors.bounds  # the uniform priors' support, None for other priors
    problem = LeastSquaresProblem(integrator, obs.values, density.observed_idx, density.noise_sd, x0_full,
                                  free_x0=density.observed_idx if refine_x0 else ())
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
    t = obs.times
    dense = Integrator(system, np.linspace(t[0], t[-1], _DENSE), integrator.solver)
    rows, labels = [], []
    for label, th, x0_ in (("sampled", theta_s, x0_full), ("refined", ref.theta, x0_refined)):
        rows.append(_safe_solve(dense, th, x0_))
        labels.append(label)
    if true_theta is not None:
        true_theta = np.asarray(true_theta, float)
        est["truth"] = ("parameter", true_theta)
        x0_true = (np.asarray(data.attrs["x0"], float) if isinstance(data, xr.Dataset) and "x0" in data.attrs
                   else x0_full)
        rows.append(_safe_solve(dense, true_theta, x0_true))
        labels.append("truth")
    traj = xr.Dataset(
        {"x": (("estimate", "time_dense", "state"), np.stack(rows)),
         "y": (("time", "observed"), obs.values),
         "noise_sd": (("observed",), density.noise_sd)},
        coords={"estimate": labels, "time_dense": dense.times, "time": t, "state": list(system.states),
                "observed": list(obs.states)},
    )
    solves = {"sampling": n_sampling, "refinement": sum(r.n_solves for r in refinements)}
    return FitResult(system, tree, est, traj, timings, solves)


def _safe_solve(solver: Integrator, theta, x0) -> np.ndarray:
    try:
        return solver.solve(theta, x0)
    except ODESolveError:
        return np.full((solver.times.size, solver.system.n_states), np.nan)

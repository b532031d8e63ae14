"""The whole method: GP fit, gradient-matching MCMC, least-squares refinement."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from .data import as_float_array, as_observations, check_count, check_gamma, initial_values, noise_levels
from .density import fit_gps, gradient_matching_density
from .diagnostics import diagnose, warn_if_unconverged
from .errors import DataError, IdentifiabilityWarning, ODESolveError
from .ode.system import ODESystem
from .posterior import build_ode_model, laplace_posterior, log_scale_names, sample_posterior
from .gp.kernels import KERNELS
from .priors import PriorSpec, Priors
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
    seed: int | None = 0,
    init="spread",
    scheme="block",
    refine_x0: bool = True,
    true_theta=None,
    solver: Solver | None = None,
    posterior: str | None = "nuts",
    posterior_draws: int = 500,
    posterior_tune: int = 500,
    posterior_chains: int = 4,
    nuts_sampler: str = "pymc",
    cores: int | None = None,
    progressbar: bool = True,
) -> FitResult:
    """Infer the parameters and latent states of ``system`` from partial observations.

    Runs the method's three steps (README, "How it works") - GP fit per observed state, ``tune + draws``
    Metropolis-within-Gibbs iterations per chain on the gradient-matching density
    (chains start apart, see ``init`` of :func:`pgpgm.sample`), least-squares refinement
    from the pooled posterior mean and from each chain's mean, keeping the lowest cost
    (bounded by the uniform prior bounds when priors are given as bounds) - and a fourth:
    the posterior of the ODE model itself (:mod:`pgpgm.posterior`), started at the
    refined optimum.

    ``posterior`` : ``"nuts"`` (default; ``posterior_chains`` chains of ``posterior_tune``
    + ``posterior_draws`` NUTS iterations, in parallel processes (``cores``), with
    ``nuts_sampler`` ``"pymc"`` or ``"nutpie"``), ``"laplace"`` (draws from the Gaussian
    approximation at the refined optimum) or None (the gradient-matching chains are the
    result's posterior). A :class:`~pgpgm.diagnostics.ConvergenceWarning` names every
    parameter of the main posterior with R-hat > 1.01, ESS < 400, and any divergences.

    Parameters are those of :func:`pgpgm.gradient_matching_density` and :func:`pgpgm.sample`;
    ``solver`` (default :func:`pgpgm.default_solver`) does every ODE solve of the fit;
    ``scheme`` is the gradient-matching step's (``"block"`` or the paper's ``"elementwise"``);
    ``refine_x0`` also refines the observed states' initial values (started at their
    posterior means) in the least-squares step; ``true_theta`` (P,) (or ``data.attrs["theta"]`` from :func:`pgpgm.simulate`) adds
    the ground truth to tables and figures. ``seed=None`` draws a fresh seed; the seed used is
    recorded in ``json.loads(result.gradient_matching.attrs["pgpgm_settings"])["seed"]``.

    Raises
    ------
    DataError
        before any computation, for unusable data (see :func:`pgpgm.data.as_observations`),
        ``x0``, ``noise_sd``, ``gamma``, ``priors``, ``kernel``, ``true_theta``, or counts
        (``draws``, ``tune``, ``chains``, ``seed``, ``posterior_*``) that are not whole numbers
        in range.
    ODESolveError
        when every refinement start fails.
    """
    timings, t0 = {}, time.perf_counter()
    # every argument is checked here, before any GP fit, compiled kernel or sampler runs
    if seed is None:  # a fresh seed, recorded in the sampler's settings (result.tree attrs)
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    seed = check_count(seed, "seed", minimum=0)
    draws, tune, chains = (check_count(draws, "draws", minimum=1), check_count(tune, "tune", minimum=0),
                           check_count(chains, "chains", minimum=1))
    if posterior not in ("nuts", "laplace", None):
        raise DataError(f"posterior must be 'nuts', 'laplace' or None, got {posterior!r}")
    posterior_draws = check_count(posterior_draws, "posterior_draws", minimum=1)
    posterior_tune = check_count(posterior_tune, "posterior_tune", minimum=0)
    posterior_chains = check_count(posterior_chains, "posterior_chains", minimum=1)
    if nuts_sampler not in ("pymc", "nutpie"):
        raise DataError(f"nuts_sampler must be 'pymc' or 'nutpie', got {nuts_sampler!r}")
    if cores is not None:
        cores = check_count(cores, "cores", minimum=1)
    if isinstance(kernel, str) and kernel not in KERNELS:
        raise DataError(f"unknown kernel {kernel!r}; built-in kernels are {sorted(KERNELS)}")
    check_gamma(gamma)
    obs = as_observations(data, observed, system)
    initial_values(system, data, x0, system.index_of_states(obs.states))
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    Priors.from_user(system.parameters, priors)
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (system.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {system.n_parameters} finite numbers {list(system.parameters)}, "
                            f"got {true_theta!r}")
    gps = fit_gps(obs, kernel, noise_sd=noise_sd, seed=seed)
    timings["gp"] = time.perf_counter() - t0
    integrator = Integrator(system, obs.times, solver)
    density = gradient_matching_density(system, data, obs.states, x0=x0, kernel=kernel, gamma=gamma, priors=priors,
                                        noise_sd=noise_sd, gp_fits=gps, solver=integrator, seed=seed)
    t1 = time.perf_counter()
    # step 2 in this process (cores=1): worker processes would each compile the model again
    tree = sample(density, draws=draws, tune=tune, chains=chains, seed=seed, init=init, scheme=scheme, cores=1,
                  progressbar=progressbar)
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
    # noise sds the user did not give are estimated with theta (maximum likelihood); the GP's are the start
    refinements = [refine(problem, th, bounds, estimate_noise=noise_sd is None, warn=False) for th in starts]
    usable = [r for r in refinements if np.isfinite(r.nll)]
    if not usable:
        raise ODESolveError("every refinement start failed: " + "; ".join(r.message for r in refinements))
    ref: Refinement = min(usable, key=lambda r: r.nll)
    if ref.undetermined:
        warnings.warn(f"the data do not determine {', '.join(ref.undetermined)}: their standard errors are infinite; "
                      "fix or give tighter priors to some of them, or measure more states", IdentifiabilityWarning,
                      stacklevel=2)
    x0_refined = ref.x0
    timings["refinement"] = time.perf_counter() - t2

    t = obs.times
    dense = Integrator(system, np.linspace(t[0], t[-1], _DENSE), integrator.solver)
    diagnostics = {"gradient_matching": diagnose(tree, system.parameters)}
    main, solves_post = tree, 0
    t3 = time.perf_counter()
    if posterior == "nuts":
        model, layout = build_ode_model(system, obs, x0=ref.x0, priors=density.priors, noise_sd=noise_sd,
                                        noise_center=density.noise_sd, solver=integrator.solver,
                                        dense_times=dense.times,
                                        log_scale=log_scale_names(density.priors, ref.theta, ref.stderr))
        center, sd = _refined_point(layout, ref, obs)
        names = {**{p: p for p in layout.parameters},
                 **{f"x0[{s}]": n for s, n in zip(obs.states, layout.initial)}}
        covariance = ([names[q] for q in ref.q_names], ref.q_covariance)
        main = sample_posterior(model, center, sd, covariance=covariance, draws=posterior_draws, tune=posterior_tune,
                                chains=posterior_chains, cores=cores, seed=seed, nuts_sampler=nuts_sampler,
                                progressbar=progressbar)
        diagnostics["posterior"] = diagnose(main, layout.free)
        if "n_steps" in main.sample_stats:
            solves_post = int(main.sample_stats["n_steps"].sum())
    elif posterior == "laplace":
        main = laplace_posterior(dense, ref, draws=posterior_draws * posterior_chains, seed=seed)
    timings["posterior"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    label = "posterior" if posterior == "nuts" else "gradient_matching"
    if posterior != "laplace":
        warn_if_unconverged(diagnostics[label], "NUTS" if posterior == "nuts" else "gradient-matching")

    if true_theta is None and isinstance(data, xr.Dataset) and "theta" in data.attrs:
        true_theta = data.attrs["theta"]
    estimates = [("sampled", theta_s), ("refined", ref.theta)]
    if posterior is not None:
        estimates.append(("posterior", np.array([float(main.posterior[p].mean()) for p in system.parameters])))
    est = xr.Dataset(
        {"theta": (("estimate", "parameter"), np.vstack([v for _, v in estimates])),
         "stderr": (("parameter",), ref.stderr),
         "covariance": (("parameter", "parameter_"), ref.covariance),
         "x0": (("state",), ref.x0),
         "nll_per_start": (("start",), [r.nll for r in refinements])},
        coords={"estimate": [k for k, _ in estimates], "parameter": list(system.parameters),
                "state": list(system.states),
                "parameter_": list(system.parameters)},
        attrs={"refinement_cost": ref.cost, "refinement_nll": ref.nll, "noise_estimated": int(noise_sd is None),
               "jacobian_rank": ref.rank, "undetermined": ", ".join(ref.undetermined),
               "refinement_success": int(ref.success), "refinement_message": ref.message},
    )
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
         "noise_sd": (("observed",), ref.noise_sd),
         "noise_sd_gp": (("observed",), density.noise_sd)},
        coords={"estimate": labels, "time_dense": dense.times, "time": t, "state": list(system.states),
                "observed": list(obs.states)},
    )
    solves = {"sampling": n_sampling, "refinement": sum(r.n_solves for r in refinements), "posterior": solves_post}
    return FitResult(system, main, est, traj, timings, solves, tree, _stack_diagnostics(diagnostics))


def _refined_point(layout, ref: Refinement, obs) -> tuple[dict[str, float], dict[str, float]]:
    """The refined optimum by the ODE model's variable names, and a spread for each: the
    refinement's standard errors of theta and the free initial values (10 % of the value
    where undetermined), sigma/sqrt(2N) for a noise sd."""
    se = dict(zip(ref.q_names, np.sqrt(np.diag(ref.q_covariance))))
    center, sd = {}, {}
    idx = [list(layout.states).index(s) for s in obs.states]
    for name, key, v in [*zip(layout.parameters, layout.parameters, ref.theta),
                         *((n, f"x0[{s}]", ref.x0[i]) for n, s, i in zip(layout.initial, obs.states, idx))]:
        s = se.get(key, np.nan)
        center[name] = float(v)
        sd[name] = float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(float(v)), 1e-3)
    for name, sig in zip(layout.noise, ref.noise_sd):
        center[name], sd[name] = float(sig), float(sig) / np.sqrt(2 * obs.times.size)
    return center, sd


def _stack_diagnostics(diagnostics: dict[str, xr.Dataset]) -> xr.Dataset:
    """One Dataset (sampler, variable) from the per-sampler diagnostics."""
    parts = [d.expand_dims(sampler=[k]).assign(divergences=("sampler", [d.attrs["divergences"]]))
             for k, d in diagnostics.items()]
    return xr.concat(parts, dim="sampler", join="outer", combine_attrs="drop")


def _safe_solve(solver: Integrator, theta, x0) -> np.ndarray:
    try:
        return solver.solve(theta, x0)
    except ODESolveError:
        return np.full((solver.times.size, solver.system.n_states), np.nan)

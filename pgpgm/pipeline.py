"""The whole method: GP fit, gradient-matching MCMC, least-squares refinement."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import xarray as xr

from .checks import as_float_array, check_count, check_gamma, noise_levels

from .data import as_observations, initial_values
from .matching.density import fit_gps, gradient_matching_density, per_state
from .refinement.bounds import bound_report, warn_at_bounds
from .posterior.diagnostics import diagnose, warn_if_unconverged
from .errors import DataError, IdentifiabilityWarning, ODESolveError
from .ode.system import ODESystem
from .posterior.nuts import (MAX_ROUNDS, PosteriorBudget, build_ode_model, laplace_posterior, log_scale_names,
                        posterior_notes, sample_posterior)
from .gp.kernels import KERNELS
from .logscale import Problem, plan_scales
from .priors import PriorSpec, Priors
from .refinement.least_squares import LeastSquaresProblem, Refinement, refine
from .result import FitResult
from .matching import get_scheme, sample
from .stopping import RefinedAgreement
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
    posterior_rounds: int = MAX_ROUNDS,
    posterior_budget: PosteriorBudget | float | None = PosteriorBudget(),
    nuts_sampler: str = "pymc",
    cores: int | None = None,
    progressbar: bool = True,
    stop="agree",
    noise: str | Mapping[str, str] | None = None,
    transform: Mapping[str, str] | None = None,
    grid=None,
    fixed: Mapping[str, float] | None = None,
) -> FitResult:
    """Infer the parameters and latent states of ``system`` from partial observations.

    Runs the method's three steps (README, "How it works") - GP fit per observed state, ``tune + draws``
    Metropolis-within-Gibbs iterations per chain on the gradient-matching density
    (chains start apart, see ``init`` of :func:`pgpgm.sample`), least-squares refinement
    from the pooled posterior mean and from each chain's mean (or, when ``stop="agree"`` stopped
    the chains, from the best optimum the last check refined them to: the same refinements),
    keeping the lowest cost (bounded by the uniform prior bounds when priors are given as bounds;
    ``result.estimates["nll_per_start"]`` names the starts) - and a fourth:
    the posterior of the ODE model itself (:mod:`pgpgm.posterior`), started at the
    refined optimum.

    ``posterior`` : ``"nuts"`` (default; ``posterior_chains`` chains of ``posterior_tune``
    + ``posterior_draws`` NUTS iterations, in parallel processes (``cores``), with
    ``nuts_sampler`` ``"pymc"`` or ``"nutpie"``; with ``"pymc"``, up to ``posterior_rounds``
    rounds while the draws fail R-hat <= 1.01, ESS >= 400 or have divergences, see
    :func:`pgpgm.posterior.nuts.sample_posterior`'s ``max_rounds``; all rounds within ``posterior_budget``:
    a :class:`pgpgm.PosteriorBudget`, default 60 s and 300000 gradient evaluations, a number of
    seconds, or None for no limit; once it is spent the fit returns the draws it has with a
    ConvergenceWarning saying so; chains that sit in separate modes are named, each with the optimum
    its mean refines to, instead of pooled), ``"laplace"`` (draws from the Gaussian
    approximation at the refined optimum) or None (the gradient-matching chains are the
    result's posterior). A :class:`~pgpgm.posterior.diagnostics.ConvergenceWarning` names every
    parameter of the main posterior with R-hat > 1.01, ESS < 400, and any divergences.

    Parameters are those of :func:`pgpgm.gradient_matching_density` and :func:`pgpgm.sample`;
    ``solver`` (default :func:`pgpgm.default_solver`) does every ODE solve of the fit;
    ``scheme`` is the gradient-matching step's (``"block"``, the paper's ``"elementwise"``, or a
    scheme object such as ``pgpgm.Block(n_moves=8)``); step 2 runs its chains in this process;
    ``stop`` : ``"agree"`` (default) ends step 2 once the best least-squares optimum
    refined from the chains' running means has settled (checked at 100 iterations and every
    50 after; one interval when every chain refines to it, two when they differ) and fits the
    data as well as the GPs do (residual sd at most twice the noise level of each observed
    state) off the prior box's bounds; while it does not, least squares from points spread
    over the prior box search beside the chains, and such an optimum stops the chains only
    once 20 of those points found nothing better
    (:class:`pgpgm.stopping.RefinedAgreement`: the chains have found the basin);
    ``"never"`` runs the whole budget ``tune + draws`` per chain (the published setting);
    a stop rule object is used as given. When and why step 2 stopped:
    ``result.estimates.attrs["sampling_stop_reason"]``, ``["sampling_iterations"]`` and
    ``result.gradient_matching.attrs["pgpgm_stopping"]`` (JSON, every check).
    ``noise`` (``"normal"``, ``"lognormal"`` or a mapping observed state -> one of them) and
    ``transform`` (mapping state -> ``"log"``) put states on the log scale: see :mod:`pgpgm.logscale`
    (lognormal noise: every step on the log scale, noise sds on the log scale, ``noise_sd`` too;
    ``"log"``: GP fit and gradient matching only). ``refine_x0`` also refines the observed
    states' initial values (started at their posterior means) in the least-squares step; ``true_theta`` (P,) (or ``data.attrs["theta"]`` from :func:`pgpgm.simulate`) adds
    the ground truth to tables and figures. ``seed=None`` draws a fresh seed; the seed used is
    recorded in ``json.loads(result.gradient_matching.attrs["pgpgm_settings"])["seed"]``.

    Data: each observed state may have its own times and missing values (a tidy long
    DataFrame ``time, state, value``, a wide one with NaN, or a simulated Dataset with NaN;
    at least 3 measurements per state). Each state's GP is fitted to its own measurements;
    the density, the refinement's solve and the posterior live on one grid, the union of the
    observation times or ``grid`` (e.g. denser; it must span the data); the observation
    terms (sampling, refinement residuals, posterior likelihood) count measured values only.
    ``kernel`` and ``gamma`` may be mappings observed state -> value.

    ``fixed={"t6": 0.3}`` holds parameters at known values: they are substituted into the
    equations (:meth:`pgpgm.ODESystem.fix`) and take no part in sampling, refinement and the
    posterior; the result keeps every parameter (``estimates["fixed"]`` marks them, with
    standard error 0, and ``parameter_table()`` reports them as fixed). Priors and ``init``
    values given for fixed parameters are ignored.

    Unknown initial values: ``x0={"H": (0, 50)}`` (a Uniform prior) or ``x0={"H": callable}``
    for a latent state makes ``H_0`` a free variable: sampled with the parameters in step 2,
    refined by least squares with a standard error (``estimates["x0_stderr"]``; the Jacobian
    from the sensitivity solve), free in the step-4 model. ``result.x0`` gives the refined
    initial value of every state. Known initial values keep the fast path.

    A refined estimate on a bound of its Uniform prior within its own uncertainty (2 standard
    errors), or a posterior (step 4's or the Laplace draws, not step 2's chains) with more than 10 %
    of its draws within half their sd (at most 1 % of the box width) of a bound, gives a
    :class:`~pgpgm.errors.BoundWarning` naming the parameter and the bound, with a hint to
    widen the prior; ``result.at_bounds`` and the ``at_bound`` column of
    ``result.parameter_table()`` record it (:mod:`pgpgm.refinement.bounds`).

    Raises
    ------
    DataError
        before any computation, for unusable data (see :func:`pgpgm.data.as_observations`),
        ``x0``, ``noise_sd``, ``gamma``, ``priors``, ``kernel``, ``true_theta``, or counts
        (``draws``, ``tune``, ``chains``, ``seed``, ``posterior_*``) that are not whole numbers
        in range.
    ODESolveError
        when every refinement start fails.
    SamplingError
        when no chain start that ``init`` chooses has a finite density.
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
    scheme = get_scheme(scheme)
    posterior_draws = check_count(posterior_draws, "posterior_draws", minimum=1)
    posterior_tune = check_count(posterior_tune, "posterior_tune", minimum=0)
    posterior_chains = check_count(posterior_chains, "posterior_chains", minimum=1)
    posterior_rounds = check_count(posterior_rounds, "posterior_rounds", minimum=1)
    posterior_budget = PosteriorBudget.of(posterior_budget)
    if nuts_sampler not in ("pymc", "nutpie"):
        raise DataError(f"nuts_sampler must be 'pymc' or 'nutpie', got {nuts_sampler!r}")
    if cores is not None:
        cores = check_count(cores, "cores", minimum=1)
    if isinstance(stop, str) and stop not in ("agree", "never"):
        raise DataError(f"stop must be 'agree' (stop when the chains agree), 'never' (the whole budget) or a stop "
                        f"rule object, got {stop!r}")
    for k in (kernel.values() if isinstance(kernel, Mapping) else [kernel]):
        if isinstance(k, str) and k not in KERNELS:
            raise DataError(f"unknown kernel {k!r}; built-in kernels are {sorted(KERNELS)}")
    obs = as_observations(data, observed, system, grid=grid)
    per_state(kernel, obs.states, "kernel")  # a mapping names observed states only
    for v in per_state(gamma, obs.states, "gamma"):
        check_gamma(v)
    scales = plan_scales(system, data, observed, x0, noise_sd, noise, transform, grid=grid)  # None: no log scale
    if scales is not None:  # fit the likelihood problem (lognormal states as log_<state>); scales.back maps back
        system, data, obs, x0 = (scales.likelihood.system, scales.likelihood.data, scales.likelihood.obs,
                                 scales.likelihood.x0)
    # the problem of the GP fit and gradient matching (steps 1-2): the data as given, or on the log scale
    gm = scales.matching if scales is not None else Problem(system, data, obs, x0, noise_sd)
    if scales is not None:  # per-state kernels and gammas by the matching problem's state names
        kernel, gamma = scales.matching_keys(kernel), scales.matching_keys(gamma)
    initial_values(system, data, x0, system.index_of_states(obs.states))
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (system.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {system.n_parameters} finite numbers {list(system.parameters)}, "
                            f"got {true_theta!r}")
    full, fixed = system, dict(fixed or {})
    if fixed:  # fixed parameters become numbers in the equations: the fit runs on the others
        system = full.fix(fixed)
        gm = replace(gm, system=system if gm.system is full else gm.system.fix(fixed))
        fixed = {k: float(v) for k, v in fixed.items()}
        if isinstance(priors, Mapping):
            priors = {k: v for k, v in priors.items() if k not in fixed}
        if not isinstance(init, str):
            values = as_float_array(init, "init")
            if values.shape == (full.n_parameters,):
                init = values[[full.parameters.index(p) for p in system.parameters]]
    Priors.from_user(system.parameters, priors)
    gps = fit_gps(gm.obs, kernel, noise_sd=gm.noise_sd, seed=seed)
    timings["gp"] = time.perf_counter() - t0
    integrator = Integrator(system, obs.times, solver)
    gm_integrator = integrator if gm.system is system else Integrator(gm.system, obs.times, integrator.solver)
    density = gradient_matching_density(gm.system, gm.data, gm.obs.states, x0=gm.x0, kernel=kernel, gamma=gamma,
                                        priors=priors, noise_sd=gm.noise_sd, gp_fits=gps, solver=gm_integrator,
                                        seed=seed, grid=grid)
    t1 = time.perf_counter()
    own_rule = isinstance(stop, str) and stop == "agree"  # its checks refine step 3's problem
    if own_rule:
        stop = RefinedAgreement(density, gm_integrator, density.priors.bounds, refine_x0=refine_x0,
                                estimate_noise=gm.noise_sd is None, seed=seed)
    # step 2 in this process (cores=1): worker processes would each compile the model again
    tree = sample(density, draws=draws, tune=tune, chains=chains, seed=seed, init=init, scheme=scheme, cores=1,
                  progressbar=progressbar, stop=stop)
    stopping = json.loads(tree.attrs["pgpgm_stopping"])
    timings["sampling"] = time.perf_counter() - t1
    n_sampling = gm_integrator.n_solves
    post = tree.posterior
    theta_s = np.array([float(post[p].mean()) for p in system.parameters])
    unknown = [system.states[i] for i in density.unknown_x0_idx]  # latent states with unknown initial values
    noise_start = density.noise_sd  # the GP's noise sds: the refinement's start and step 4's prior centre
    on_log_for_matching = scales is not None and gm is not scales.likelihood

    def start_x0(sel) -> np.ndarray:  # (S,) the chains' mean initial state (sel: all chains or one)
        mean = lambda s: float(post[s].isel(time=0).sel(**sel).mean())  # noqa: E731
        x = np.array(density.initial_state([mean(s) for s in density.obs.states], [mean(s) for s in unknown]))
        return scales.matching_to_likelihood(x, noise_start)[0] if on_log_for_matching else x

    x0_full = start_x0({})
    if on_log_for_matching:
        noise_start = scales.matching_to_likelihood(x0_full, noise_start)[1]

    t2 = time.perf_counter()
    bounds = density.priors.bounds  # the uniform priors' support, None for other priors
    free_x0 = (density.observed_idx if refine_x0 else ()) + density.unknown_x0_idx  # unknown ones always
    problem = LeastSquaresProblem(integrator, obs.values, density.observed_idx, noise_start, x0_full,
                                  free_x0=free_x0)
    # multi-start: from the pooled posterior mean and from every chain's mean (its parameters and its
    # free initial values, as the stop checks refine them); keep the best
    starts = {"pooled mean": np.concatenate([theta_s, x0_full[list(free_x0)]])}
    last = stopping["checks"][-1] if stopping["checks"] else None
    same_problem = own_rule and last is not None and gm.system is system and not on_log_for_matching
    if same_problem and stopping["stopped"]:
        # the chains stopped at a check whose windows are the kept draws: that check refined every
        # chain's mean (and any box start) already (this problem, these bounds); go on from the best
        starts["last check's best optimum"] = np.array(last["best_q"])
    elif post.sizes["chain"] > 1:
        starts |= {f"chain {c} mean": np.concatenate([[float(post[p].sel(chain=c).mean()) for p in system.parameters],
                                                     start_x0({"chain": c})[list(free_x0)]])
                   for c in post.chain.values}
    if same_problem and not stopping["stopped"] and last["box_q"]:  # the stop rule's search of the prior box
        starts["box search's best optimum"] = np.array(last["box_q"])
    # noise sds the user did not give are estimated with theta (maximum likelihood); the GP's are the start
    refinements = [refine(problem, th, bounds, estimate_noise=noise_sd is None, warn=False) for th in starts.values()]
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
                                        noise_center=noise_start, solver=integrator.solver,
                                        dense_times=dense.times,
                                        x0_priors=dict(zip(unknown, density.x0_priors.specs)),
                                        log_scale=log_scale_names(density.priors, ref.theta, ref.stderr))
        center, sd = _refined_point(layout, ref, obs, (*obs.states, *unknown))
        names = {**{p: p for p in layout.parameters},
                 **{f"x0[{s}]": n for s, n in zip((*obs.states, *unknown), layout.initial)}}
        covariance = ([names[q] for q in ref.q_names], ref.q_covariance)
        main = sample_posterior(model, center, sd, covariance=covariance, draws=posterior_draws, tune=posterior_tune,
                                chains=posterior_chains, cores=cores, seed=seed, nuts_sampler=nuts_sampler,
                                max_rounds=posterior_rounds, progressbar=progressbar, budget=posterior_budget,
                                warn=False)
        modes = json.loads(main.attrs.get("pgpgm_modes", "[]"))
        for mode in modes:  # each mode's mean refined: which optimum it belongs to, and how well it fits
            m = mode["mean"]
            q0 = np.array([m[p] for p in layout.parameters]
                          + [m[names[q]] for q in ref.q_names[len(layout.parameters):]])
            r = refine(problem, q0, bounds, estimate_noise=noise_sd is None, warn=False)
            mode["refined"], mode["nll"] = dict(zip(layout.parameters, map(float, r.theta))), float(r.nll)
        main.attrs["pgpgm_modes"] = json.dumps(modes)
        diagnostics["posterior"] = diagnose(main, layout.free)
        if "pgpgm_round_gradient_evaluations" in main.attrs:  # every round's draws, not just those kept
            solves_post = sum(json.loads(main.attrs["pgpgm_round_gradient_evaluations"]))
        elif "n_steps" in main.sample_stats:
            solves_post = int(main.sample_stats["n_steps"].sum())
    elif posterior == "laplace":
        main = laplace_posterior(dense, ref, draws=posterior_draws * posterior_chains, seed=seed)
    timings["posterior"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    label = "posterior" if posterior == "nuts" else "gradient_matching"
    if posterior != "laplace":
        warn_if_unconverged(diagnostics[label], "NUTS" if posterior == "nuts" else
                            "gradient-matching" + (" (its chains stopped early, stop='agree'; stop='never' runs them "
                                                   "to the end)" if stopping["stopped"] else ""),
                            notes=posterior_notes(main) if posterior == "nuts" else ())

    # the bound checks use the exact posterior's draws, not step 2's chains (they only locate the basin)
    draws = {p: main.posterior[p].values for p in system.parameters if p in main.posterior} if posterior else None
    at_bounds = bound_report(density.priors, ref.theta, draws, stderr=ref.stderr)
    warn_at_bounds(at_bounds)

    if true_theta is None and isinstance(data, xr.Dataset) and "theta" in data.attrs:
        true_theta = data.attrs["theta"]
    estimates = [("sampled", theta_s), ("refined", ref.theta)]
    if posterior is not None:
        estimates.append(("posterior", np.array([float(main.posterior[p].mean()) for p in system.parameters])))
    free = [full.parameters.index(p) for p in system.parameters]

    def every(values, fill=None):  # free-parameter values (P_free,) to all parameters (P,)
        out = np.array([fixed.get(p, np.nan) if fill is None else fill for p in full.parameters], float)
        out[free] = values
        return out

    cov = np.zeros((full.n_parameters, full.n_parameters))
    cov[np.ix_(free, free)] = ref.covariance
    est = xr.Dataset(
        {"theta": (("estimate", "parameter"), np.vstack([every(v) for _, v in estimates])),
         "stderr": (("parameter",), every(ref.stderr, 0.0)),
         "covariance": (("parameter", "parameter_"), cov),
         "fixed": (("parameter",), np.array([p in fixed for p in full.parameters])),
         "at_bound": (("parameter",), [",".join(a.side for a in at_bounds if a.parameter == p)
                                       for p in full.parameters]),
         "x0": (("state",), ref.x0),
         "x0_stderr": (("state",), _x0_stderr(ref, system.states)),
         "x0_unknown": (("state",), np.array([s in unknown for s in system.states])),
         "nll_per_start": (("start",), [r.nll for r in refinements])},
        coords={"estimate": [k for k, _ in estimates], "parameter": list(full.parameters), "start": list(starts),
                "state": list(system.states),
                "parameter_": list(full.parameters)},
        # with estimated noise sds the scaled cost is N/2 at every optimum: only the likelihood compares fits
        attrs={"refinement_cost": ref.cost if noise_sd is not None else np.nan, "refinement_nll": ref.nll,
               "noise_estimated": int(noise_sd is None),
               "jacobian_rank": ref.rank, "undetermined": ", ".join(ref.undetermined),
               "refinement_success": int(ref.success), "refinement_message": ref.message,
               "sampling_stopped": int(stopping["stopped"]), "sampling_stop_reason": stopping["reason"],
               "sampling_iterations": stopping["iterations"],
               "bound_warnings": "\n".join(a.message for a in at_bounds)},
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
        truth_solve = Integrator(full, dense.times, integrator.solver) if fixed else dense
        rows.append(_safe_solve(truth_solve, true_theta, x0_true))
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
    result = FitResult(full, main, est, traj, timings, solves, tree, _stack_diagnostics(diagnostics))
    return result if scales is None else scales.back(result)  # on the original scale


def _refined_point(layout, ref: Refinement, obs, initial_states) -> tuple[dict[str, float], dict[str, float]]:
    """The refined optimum by the ODE model's variable names, and a spread for each: the
    refinement's standard errors of theta and the free initial values (10 % of the value
    where undetermined), sigma/sqrt(2N) for a noise sd."""
    se = _q_stderr(ref)
    center, sd = {}, {}
    idx = [list(layout.states).index(s) for s in initial_states]
    for name, key, v in [*zip(layout.parameters, layout.parameters, ref.theta),
                         *((n, f"x0[{s}]", ref.x0[i]) for n, s, i in zip(layout.initial, initial_states, idx))]:
        s = se.get(key, np.nan)
        center[name] = float(v)
        sd[name] = float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(float(v)), 1e-3)
    for name, sig, n in zip(layout.noise, ref.noise_sd, obs.n_obs):
        center[name], sd[name] = float(sig), float(sig) / np.sqrt(2 * n)
    return center, sd


def _q_stderr(ref: Refinement) -> dict[str, float]:
    """Standard errors of the refinement's unknowns by name (``theta`` names, ``x0[<state>]``)."""
    return dict(zip(ref.q_names, np.sqrt(np.diag(ref.q_covariance))))


def _x0_stderr(ref: Refinement, states) -> np.ndarray:
    """(S,) standard errors of the refined initial values (0 where the value was held fixed)."""
    se = _q_stderr(ref)
    return np.array([se.get(f"x0[{s}]", 0.0) for s in states])


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

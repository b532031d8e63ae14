"""Step 3: least squares of the ODE solution from every start the chains (or the prior box) give
(:func:`refine_step`, :func:`refine_observables`, :func:`refine_from_box` -> :class:`Refined`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from ..data import initial_value_priors, initial_values
from ..errors import IdentifiabilityWarning, ODESolveError
from ..logscale import MeasurementNoise
from ..matching.density import (
    GradientMatchingDensity,
)
from ..observables import Observables
from ..priors import Priors, PriorSpec
from ..refinement import LeastSquaresProblem, ObservablesProblem, Refinement, refine
from ..refinement.optima import (
    CompetingOptimum,
    competing_optima,
    outside_boxes,
    refine_from_loose_bounds,
    refine_inside_boxes,
)
from ..refinement.multistart import SearchResult, hessian, multistart
from ..solve import Integrator, default_solver
from ..study.joint import JointLayout, JointProblem, JointRefinement, refine_joint
from .match import Matched
from .options import FitOptions
from .prepare import PetabDesign, Prepared, StudyDesign


@dataclass(frozen=True, eq=False)
class Refined:
    """Step 3: the best refinement ``best`` of those from every start (``starts`` name -> (Q,)), the
    chains' pooled means (``theta_sampled`` (P,), ``x0_sampled`` (S,)), the least-squares problem,
    the GPs' noise sds carried to the likelihood's scale (``noise_start`` (M,)), the latent states
    with unknown initial values, and the optima that compete with the best (``competing``)."""

    best: Refinement
    refinements: tuple[Refinement, ...]
    starts: dict[str, np.ndarray]
    problem: LeastSquaresProblem
    theta_sampled: np.ndarray
    x0_sampled: np.ndarray
    noise_start: np.ndarray
    unknown: tuple[str, ...]
    priors: Priors | None = None
    x0_priors: dict | None = None
    competing: tuple[CompetingOptimum, ...] = ()


def profile_phi(spec: Observables, integrator: Integrator, y: np.ndarray, theta: np.ndarray, x0: np.ndarray,
                bounds: np.ndarray | None, n_theta: int, given: np.ndarray | None = None) -> np.ndarray:
    """(F,) start of the observation parameters for the start (theta (P,), x0 (S,)): with the trajectory
    solved once, least squares over phi alone of the observables' residuals, each observable scaled by
    the sd of its data, from the middle of phi's prior box (from 1 without a box). The observation
    parameters (scales, offsets) enter h directly, so this cheap fit puts them where the chains' theta
    explains the data best; step 3 then refines everything jointly. ``given`` (F,): values held (the
    observation parameters step 2 sampled, NaN for those fitted here)."""
    from scipy import optimize

    F = len(spec.parameters) - n_theta
    if F == 0:
        return np.zeros(0)
    held = np.full(F, np.nan) if given is None else np.asarray(given, float).reshape(F)
    sub = np.flatnonzero(np.isnan(held))  # the entries fitted here
    lo, hi = ((bounds[n_theta:, 0], bounds[n_theta:, 1]) if bounds is not None else (np.full(F, -np.inf),
                                                                                   np.full(F, np.inf)))
    phi0 = np.where(np.isnan(held), np.where(np.isfinite(lo) & np.isfinite(hi), (lo + hi) / 2, 1.0), held)
    if sub.size == 0:
        return phi0
    try:
        x = integrator.solve(np.concatenate([theta, phi0]), x0)
    except ODESolveError:
        return phi0
    t, mask = integrator.times, np.isfinite(y)
    scale = np.array([float(np.std(y[mask[:, o], o])) or 1.0 for o in range(y.shape[1])])

    def phi_of(v):
        out = phi0.copy()
        out[sub] = v
        return out

    def res(v):
        with np.errstate(all="ignore"):
            r = (spec.values(t, x, np.concatenate([theta, phi_of(v)])) - y) / scale
        return np.where(np.isfinite(r), r, 1e6)[mask]

    def jac(v):
        _, dp = spec.jacobians(t, x, np.concatenate([theta, phi_of(v)]))
        return (dp[:, :, n_theta + sub] / scale[None, :, None])[mask]

    try:
        return phi_of(optimize.least_squares(res, phi0[sub], jac=jac, bounds=(lo[sub], hi[sub]), method="trf",
                                             max_nfev=100).x)
    except (ValueError, np.linalg.LinAlgError):
        return phi0


def refine_observables(prepared: Prepared, matched: Matched, options: FitOptions) -> Refined:
    """Step 3 with observables: least squares of the observables' residuals
    (:class:`~pgpgm.refinement.ObservablesProblem`) over (theta, phi, free initial values) from the
    chains' pooled mean and each chain's mean: theta and the observation parameters step 2 sampled (the
    scales and offsets of ``prepared.scaled``) at the chains' means, the other observation parameters
    started by :func:`profile_phi`; the best by likelihood. A state measured up to a scale starts at its
    known initial value, else at (y0 - c) / a from the chains' means; a directly measured state's known initial value
    (``prepared.x0_observed``) is held. The noise sds start at the GP's
    for the observables with a GP and at the residual sd of the pooled start for the others."""
    system, density, run, spec, obs = prepared.system, matched.density, matched.run, prepared.observables, prepared.obs
    post = run.tree.posterior
    gm_params = prepared.matching.system.parameters  # theta, then the observation parameters step 2 sampled
    n_theta = len(spec.parameters) - len(spec.observation_parameters)
    prior = prepared.likelihood_priors
    bounds = prior.refinement_bounds
    sampled_unknown = tuple(system.states[i] for i in density.unknown_x0_idx)  # unknown latent x0 in step 2
    unknown, x0_priors = sampled_unknown, None
    free_x0 = (density.observed_idx if options.refine_x0 else ()) + density.unknown_x0_idx
    if prepared.scaled:  # the scaled states are latent here: their initial value known, or free with its prior
        direct_idx = tuple(system.index_of_states(prepared.direct))
        priors_x0 = initial_value_priors(system, prepared.x0, direct_idx)
        unknown = tuple(s for s in system.states if s in priors_x0)
        x0_priors = {s: priors_x0[s] for s in unknown}
        known = initial_values(system, None, prepared.x0, direct_idx)
        free_x0 = (direct_idx if options.refine_x0 else ()) + tuple(system.states.index(s) for s in unknown)
    held = {system.states.index(s): v for s, v in (prepared.x0_observed or {}).items()}  # known: not refined
    free_x0 = tuple(i for i in free_x0 if i not in held)

    def start(sel) -> tuple[np.ndarray, np.ndarray]:  # (step 2's parameters, x0 (S,)) the chains' means
        mean = lambda s: float(post[s].isel(time=0).sel(**sel).mean())
        theta = np.array([float(post[p].sel(**sel).mean()) for p in gm_params])
        x0 = np.array(density.initial_state([mean(s) for s in density.obs.states], [mean(s) for s in sampled_unknown]),
                      dtype=float)
        for sc in prepared.scaled:  # the matching state is the measurement y: P = (y - c) / a at t0
            i = system.states.index(sc.state)
            x0[i] = known[i] if np.isfinite(known[i]) else sc.state_value(x0[i], dict(zip(gm_params, theta)))
        x0[list(held)] = list(held.values())
        return theta, x0

    def parameters(theta_gm: np.ndarray, x0: np.ndarray) -> np.ndarray:  # (P + F,) the other phi profiled
        given = dict(zip(gm_params, theta_gm))
        theta = np.array([given[p] for p in spec.parameters[:n_theta]])
        held = np.array([given.get(p, np.nan) for p in spec.observation_parameters])
        return np.concatenate([theta, profile_phi(spec, integrator, obs.values, theta, x0, bounds, n_theta, held)])

    integrator = matched.integrator
    theta_s, x0_full = start({})
    p_s = parameters(theta_s, x0_full)
    sels = {"pooled mean": {}} | ({f"chain {c} mean": {"chain": c} for c in post.chain.values}
                                  if post.sizes["chain"] > 1 else {})
    starts = {}
    for name, sel in sels.items():
        if not sel:
            p, x0 = p_s, x0_full
        else:
            theta, x0 = start(sel)
            p = parameters(theta, x0)
        starts[name] = np.concatenate([p, x0[list(free_x0)]])
    # noise sds: the GP's for the observables with a GP (steps 1-2), the residual sd at the pooled start for the others
    O = len(obs.states)
    noise_start = np.empty(O)
    try:
        resid = spec.values(integrator.times, integrator.solve(p_s, x0_full), p_s) - obs.values
    except ODESolveError:
        resid = np.full(obs.values.shape, np.nan)
    gp_sd = dict(zip(density.obs.states, density.noise_sd))  # matching state (a state, or a scaled observable)
    for o, n in enumerate(obs.states):
        y = obs.state_values(o)
        floor = 1e-3 * (float(np.std(y)) or float(np.max(np.abs(y))) or 1.0)
        if spec.identity.get(n, n) in gp_sd:
            noise_start[o] = gp_sd[spec.identity.get(n, n)]
        else:
            r = resid[obs.mask[:, o], o]
            noise_start[o] = max(float(np.sqrt(np.mean(r**2))), floor) if np.all(np.isfinite(r)) else 100 * floor
    if options.noise_sd is not None:  # known sds (normal and lognormal: of log y, set from plan.known below)
        noise_start = np.broadcast_to(np.asarray(options.noise_sd, float).reshape(-1), (O,)).copy()
    problem, noise_start, starts, refinements, k, competing = _refine_observables_from(
        prepared, options, integrator, spec, noise_start, x0_full, free_x0, starts, bounds,
        x0_priors if x0_priors is not None else dict(zip(sampled_unknown, density.x0_priors.specs)))
    return Refined(refinements[k], refinements, starts, problem, p_s, x0_full, noise_start, unknown, prior, x0_priors,
                   competing)


#: starts of step 3 spread over the prior box when no state is measured directly (refine_from_box)
BOX_STARTS = 20


#: step 3's start (``result.nll_per_start``) of the best held to the boxes of the unknown initial values
INSIDE_BOXES = "the best held inside the initial values' prior boxes"


def unknown_x0_priors(refined: Refined, density: GradientMatchingDensity | None) -> dict[str, PriorSpec]:
    """The unknown initial values' priors by state: step 3's own (``refined.x0_priors``: with observables)
    or step 2's ``density``'s (None where steps 1-2 did not run, and then ``refined.x0_priors`` is set)."""
    return dict(zip(refined.unknown, density.x0_priors.specs)) if refined.x0_priors is None else refined.x0_priors


def _x0_boxes(unknown: Sequence[str], specs: Sequence[PriorSpec]) -> dict[str, tuple[float, float]]:
    """Step 3's q name ``"x0[<state>]"`` -> the (lower, upper) of each unknown initial value's Uniform prior
    (``unknown`` (U,) states, ``specs`` (U,) their priors; other priors have no box)."""
    return {f"x0[{st}]": (float(spec[0]), float(spec[1])) for st, spec in zip(unknown, specs) if not callable(spec)}


def refine_from_box(prepared: Prepared, options: FitOptions, n_starts: int = BOX_STARTS) -> Refined:
    """Step 3 when no state is measured directly (observables only, so no steps 1-2): least squares of
    the observables' residuals from ``n_starts`` points of a Latin hypercube (seeded by the fit's seed)
    over the prior boxes of theta, phi and the unknown latent initial values; the best by likelihood.
    Noise sds start at the given ones, else at 10 % of each observable's data sd, and are estimated.
    ``theta_sampled`` and ``x0_sampled`` are the best refinement's start."""
    from scipy.stats import qmc

    system, spec, obs = prepared.system, prepared.observables, prepared.obs
    prior = prepared.likelihood_priors
    x0_priors = {s: v for s, v in initial_value_priors(system, prepared.x0, []).items()}
    unknown = tuple(s for s in system.states if s in x0_priors)
    free_x0 = tuple(system.states.index(s) for s in unknown)
    x0_full = initial_values(system, None, prepared.x0, [])
    box = np.vstack([prior.bounds.reshape(-1, 2)] + [np.array([x0_priors[s]], float) for s in unknown])
    x0_full[list(free_x0)] = box[len(prior.names):].mean(axis=1)
    u = qmc.LatinHypercube(d=box.shape[0], seed=options.seed).random(n_starts)
    inner = box[:, 0] + (box[:, 1] - box[:, 0]) * (0.02 + 0.96 * u)  # inside the box, off its faces
    starts = {f"box start {i}": q for i, q in enumerate(inner)}
    O = len(obs.states)
    if options.noise_sd is not None:
        noise_start = np.broadcast_to(np.asarray(options.noise_sd, float).reshape(-1), (O,)).copy()
    else:
        noise_start = np.array([0.1 * (float(np.std(obs.state_values(o))) or 1.0) for o in range(O)])
    integrator = Integrator(system, obs.times, options.solver)
    problem, noise_start, starts, refinements, k, competing = _refine_observables_from(
        prepared, options, integrator, spec, noise_start, x0_full, free_x0, starts, prior.bounds, x0_priors)
    theta0, x0_start = problem.split(list(starts.values())[k])
    return Refined(refinements[k], refinements, starts, problem, theta0, x0_start, noise_start, unknown, prior,
                   x0_priors, competing)


def refine_step(prepared: Prepared, matched: Matched | None, options: FitOptions, timings: dict) -> Refined:
    """Step 3 (``timings["refinement"]``, seconds): least squares of the ODE solution from the chains' pooled
    mean and each chain's mean (or, when fit's stop rule stopped the chains, from the best optimum its last check
    refined them to), and from the stop rule's box search; the best by likelihood. With observables,
    :func:`refine_observables`; without steps 1-2 (``matched`` None), :func:`refine_from_box`."""
    started = time.perf_counter()
    if matched is None:
        refined = refine_from_box(prepared, options)
    elif prepared.observables is not None:
        refined = refine_observables(prepared, matched, options)
    else:
        refined = _refine_states(prepared, matched, options)
    timings["refinement"] = time.perf_counter() - started
    return refined


def _refine_states(prepared: Prepared, matched: Matched, options: FitOptions) -> Refined:
    """:func:`refine_step` where the data measure states directly."""
    system, density, run, scales = prepared.system, matched.density, matched.run, prepared.scales
    post = run.tree.posterior
    theta_s = np.array([float(post[p].mean()) for p in system.parameters])
    unknown = tuple(system.states[i] for i in density.unknown_x0_idx)  # latent states with unknown initial values
    noise_start = density.noise_sd  # the GP's noise sds: the refinement's start and step 4's prior centre
    on_log = prepared.on_log_for_matching

    def start_x0(sel) -> np.ndarray:  # (S,) the chains' mean initial state (sel: all chains or one)
        mean = lambda s: float(post[s].isel(time=0).sel(**sel).mean())
        x = np.array(density.initial_state([mean(s) for s in density.obs.states], [mean(s) for s in unknown]))
        return scales.matching_to_likelihood(x, noise_start)[0] if on_log else x

    x0_full = start_x0({})
    if on_log:
        noise_start = scales.matching_to_likelihood(x0_full, noise_start)[1]
    bounds = density.priors.refinement_bounds  # the uniform priors' boxes, +-inf for other priors
    free_x0 = (density.observed_idx if options.refine_x0 else ()) + density.unknown_x0_idx  # unknown ones always
    if prepared.x0_observed:  # known initial values of observed states: held, not refined
        for st, v in prepared.x0_observed.items():
            x0_full[system.states.index(st)] = v
        free_x0 = tuple(i for i in free_x0 if system.states[i] not in prepared.x0_observed)
    plan = prepared.noise
    if plan is None:
        problem = LeastSquaresProblem(matched.integrator, prepared.obs.values, density.observed_idx, noise_start,
                                      x0_full, free_x0=free_x0)
    else:  # the measurement noise models: each state's noise parameter, given or started from the GP
        noise_start = noise_parameters_start(plan, prepared.obs, noise_start)
        problem = LeastSquaresProblem(matched.integrator, prepared.obs.values, density.observed_idx, noise_start,
                                      x0_full, free_x0=free_x0, noise=plan.names)
    # multi-start: from the pooled posterior mean and from every chain's mean (its parameters and its
    # free initial values, as the stop checks refine them); keep the best
    starts = {"pooled mean": np.concatenate([theta_s, x0_full[list(free_x0)]])}
    last = run.last
    same_problem = (matched.own_rule and last is not None and prepared.matching.system is system and not on_log
                    and plan is None)
    if plan is not None and matched.own_rule and last is not None and not on_log:
        # the stop rule refined a Gaussian problem: its optima start this likelihood's refinement too
        def fit_q(q: np.ndarray) -> np.ndarray:  # the stop rule's q, or its theta where x0 is held here
            return q if q.size == len(problem.q_names) else q[:system.n_parameters]

        starts["Gaussian optimum"] = fit_q(np.array(last.best_q))
        if last.box_q:
            starts["box search's Gaussian optimum"] = fit_q(np.array(last.box_q))
    if same_problem and run.stopped:
        # the chains stopped at a check whose windows are the kept draws: that check refined every
        # chain's mean (and any box start) already (this problem, these bounds); go on from the best
        starts["last check's best optimum"] = np.array(last.best_q)
    elif post.sizes["chain"] > 1:
        starts |= {f"chain {c} mean": np.concatenate([[float(post[p].sel(chain=c).mean()) for p in system.parameters],
                                                     start_x0({"chain": c})[list(free_x0)]])
                   for c in post.chain.values}
    if same_problem and not run.stopped and last.box_q:  # the stop rule's search of the prior box
        starts["box search's best optimum"] = np.array(last.box_q)
    if same_problem and not run.stopped and last.kept_q:  # a chain's optimum it has left since
        starts["an earlier check's best optimum"] = np.array(last.kept_q)
    # noise sds the user did not give are estimated with theta (maximum likelihood); the GP's are the start
    estimate_noise = options.noise_sd is None if plan is None else plan.estimated
    # the stop rule's optima (each chain's, the box search's best): it compares likelihoods, not points, so
    # they may lie in another optimum as good as the best (a symmetry): candidates of competing optima
    others = {}
    if matched.own_rule and last is not None and prepared.matching.system is system and not on_log:
        P = system.n_parameters
        others = {f"chain {c}'s optimum at the stop rule's last check": np.array(th, float)[:P]
                  for c, th in enumerate(last.theta)}
        if last.box_q:
            others["the stop rule's box search's best optimum"] = np.array(last.box_q, float)[:P]
    starts, refinements, k, competing = _refine_from(problem, starts, bounds, estimate_noise, others,
                                                     _x0_boxes(unknown, density.x0_priors.specs))
    return Refined(refinements[k], refinements, starts, problem, theta_s, x0_full, noise_start, unknown,
                   competing=competing)


def _refine_observables_from(prepared: Prepared, options: FitOptions, integrator: Integrator, spec: Observables,
                             noise_start: np.ndarray, x0_full: np.ndarray, free_x0, starts: dict[str, np.ndarray],
                             bounds: np.ndarray, x0_priors: Mapping[str, PriorSpec] | None):
    """Step 3 of a fit with observables from every start: the problem (the observables' likelihood with
    the fit's noise models), the noise parameters' start (O,), every start (``starts`` and the loose
    parameters' bound starts), the refinements and the best's index. ``x0_priors``: the unknown initial
    values' priors by state (their boxes hold the best: :func:`_refine_from`), or None."""
    plan = prepared.noise
    if plan is not None:
        noise_start = noise_parameters_start(plan, prepared.obs, noise_start)
    problem = ObservablesProblem.of(integrator, spec, prepared.obs.values, noise_start, x0_full, free_x0=free_x0,
                                    noise=None if plan is None else plan.names)
    estimate_noise = options.noise_sd is None if plan is None else plan.estimated
    boxes = _x0_boxes(list(x0_priors), list(x0_priors.values())) if x0_priors else {}
    starts, refinements, k, competing = _refine_from(problem, starts, bounds, estimate_noise, x0_boxes=boxes)
    return problem, noise_start, starts, refinements, k, competing


def _refine_from(problem: LeastSquaresProblem, starts: dict[str, np.ndarray], bounds: np.ndarray,
                 estimate_noise, others: Mapping[str, np.ndarray] | None = None,
                 x0_boxes: Mapping[str, tuple[float, float]] | None = None
                 ) -> tuple[dict[str, np.ndarray], tuple[Refinement, ...], int, tuple[CompetingOptimum, ...]]:
    """Step 3 from every start (``starts``: name -> (Q,) point of ``problem``) and, where the best leaves
    a parameter loose across its box, from that optimum with the parameter at each bound
    (:func:`~pgpgm.refinement.optima.refine_from_loose_bounds`): every start (``starts`` and those), the
    refinements in their order, the index of the best (the lowest negative log likelihood; the first of
    equals), and the optima that compete with it (:func:`~pgpgm.refinement.optima.competing_optima`:
    among the refinements, ``others`` (name -> (P,) or (Q,) points, e.g. the stop rule's optima) and the
    best with two parameters exchanged). The free initial values are refined unbounded; where the best
    has some outside its box in ``x0_boxes`` (q name ``"x0[<state>]"`` -> its Uniform prior's (lower,
    upper)), it is refined once more held to those boxes
    (:func:`~pgpgm.refinement.optima.refine_inside_boxes`: from its point and every given start, each moved
    into the boxes), and the best is the best of the refinements inside them (the report names what the data
    said outside). Raises :class:`ODESolveError` when every
    start failed; warns when the data do not determine some parameters at the best."""
    refinements = tuple(refine(problem, q, bounds, estimate_noise=estimate_noise, warn=False)
                        for q in starts.values())
    given = starts  # the loose parameters' and the boxes' starts come after these
    usable = [k for k, r in enumerate(refinements) if np.isfinite(r.nll)]
    if not usable:
        raise ODESolveError("every refinement start failed: " + "; ".join(r.message for r in refinements))
    k = min(usable, key=lambda j: refinements[j].nll)
    loose = refine_from_loose_bounds(problem, refinements[k], bounds, estimate_noise)
    if loose:  # the best's loose parameters from their bounds: kept if better
        starts = {**starts, **{name: q for name, (q, _) in loose.items()}}
        refinements += tuple(r for _, r in loose.values())
        k = min((j for j, r in enumerate(refinements) if np.isfinite(r.nll)), key=lambda j: refinements[j].nll)
    boxes = x0_boxes or {}
    points = {INSIDE_BOXES: refinements[k].q,
              **{f"{name}, inside the initial values' prior boxes": q for name, q in given.items()}}
    inside = refine_inside_boxes(problem, refinements[k], points, bounds, boxes, estimate_noise)
    if inside:  # the best and the starts held to the initial values' boxes
        starts = {**starts, **{name: q for name, (q, _) in inside.items()}}
        refinements += tuple(r for _, r in inside.values())
    within = [j for j, r in enumerate(refinements) if not outside_boxes(r.q, r.q_names, boxes)]
    if inside:  # the best of those inside them (where none succeeded, the best outside stays)
        k = min((j for j in within if np.isfinite(refinements[j].nll)), key=lambda j: refinements[j].nll, default=k)
    best = refinements[k]
    names = best.q_names[:best.theta.size]
    competing = competing_optima(problem, best, [refinements[j] for j in within], others or {}, bounds, names,
                                 estimate_noise=estimate_noise, labels=[list(starts)[j] for j in within])
    if refinements[k].undetermined:
        names = refinements[k].undetermined
        what = "its standard error is" if len(names) == 1 else "their standard errors are"
        which = "it" if len(names) == 1 else "some of them"
        warnings.warn(f"the data do not determine {', '.join(names)}: {what} infinite; fix or give a tighter prior "
                      f"to {which}, or measure more states", IdentifiabilityWarning, stacklevel=4)
    return starts, refinements, k, competing


def noise_parameters_start(plan: MeasurementNoise, obs, gp_sd) -> np.ndarray:
    """(M,) the start of each observed state's noise parameter in step 3: the given one, else from the
    GP's noise sd ``gp_sd`` (M,) (state units, steps 1-2 work on the data's scale): normal sd as is,
    lognormal sd / median y (the delta method: the sd of log y), negbin alpha by the moments
    mean(y)^2 / (sd^2 - mean(y)) (Var = mu + mu^2/alpha; 100 when the GP sees no overdispersion),
    clipped to [0.1, 1e4]; 1 (unused) for Poisson."""
    out = np.ones(len(plan.names))
    for m, name in enumerate(plan.names):
        y = obs.state_values(m)
        if np.isfinite(plan.known[m]):
            out[m] = plan.known[m]
        elif name == "normal":
            out[m] = gp_sd[m]
        elif name == "lognormal":
            out[m] = gp_sd[m] / float(np.median(np.abs(y)))
        elif name == "negbin":
            excess = gp_sd[m] ** 2 - float(np.mean(y))
            out[m] = float(np.clip(np.mean(y) ** 2 / excess, 0.1, 1e4)) if excess > 0 else 100.0
    return out


# ----------------------------------------------------------------------------- studies
@dataclass(frozen=True, eq=False)
class StudyRefined:
    """Step 3 of a study: ``separate`` (K,) each experiment refined alone with its known inputs; the joint
    problem ``joint`` (its ``layout``: shared parameters once, varying ones per experiment, each experiment's
    free initial values ``free`` (K,) state indices), its refinement from every start (``refinements``, by
    start name) and the best of them ``best``."""

    separate: tuple[JointRefinement, ...]
    joint: JointProblem
    layout: JointLayout
    refinements: dict[str, JointRefinement]
    best: JointRefinement
    shared: tuple[str, ...]
    free: tuple[tuple[int, ...], ...]


def refine_study(design: StudyDesign, fits: Sequence, options: FitOptions, timings: dict) -> StudyRefined:
    """Step 3 of a study from each experiment's own steps 1-3 (``fits`` (K,) :class:`~pgpgm.fit_result.FitResult`):
    each experiment refined alone with every known input held (observed states' known initial values too), from
    its fit's optimum and from the other experiments' median; then every experiment jointly (stacked residuals,
    one noise parameter per observed state shared by the experiments unless ``design.per_experiment``), from
    each experiment's own optimum and from their mean; the best likelihood. ``timings`` gains the seconds of the
    ``"separate refinement"`` and the ``"joint refinement"``."""
    system, study, observations, plan = design.system, design.study, design.observations, design.plan
    solver = options.solver or default_solver()
    names = study.names
    x0s, free = [], []
    for e, r in zip(study.experiments, fits):
        x0s.append(np.array([e.x0.get(s, r.x0[s]) for s in system.states], float))
        free.append(tuple(i for i, s in enumerate(system.states) if s not in e.x0))
    problems = tuple(LeastSquaresProblem(Integrator(system, obs.times, solver), obs.values,
                                         system.index_of_states(obs.states), 1.0, x0s[j], free_x0=free[j],
                                         **({} if plan is None else {"noise": tuple(plan[0][s] for s in obs.states)}))
                     for j, obs in enumerate(observations))
    bounds = design.prior.refinement_bounds
    started = time.perf_counter()
    separate = tuple(_refine_alone(design, j, fits, problems, free, x0s) for j in range(len(names)))
    timings["separate refinement"], started = time.perf_counter() - started, time.perf_counter()
    var_all = (*design.varying, *design.hierarchical)
    shared = tuple(p for p in system.parameters if p not in var_all and not all(p in e.fixed for e in study.experiments))
    layout = JointLayout(tuple(system.parameters), shared, tuple(p for p in system.parameters if p in var_all), names,
                         tuple(dict(e.fixed) for e in study.experiments), tuple(free), tuple(system.states))
    joint = JointProblem(problems, layout, design.observed, bounds, None if plan is None else
                         tuple(plan[0][s] for s in design.observed), design.per_experiment)
    thetas = [s.thetas[0] for s in separate]
    own_x0 = [s.x0s[0] for s in separate]
    starts = {f"experiment {e}": layout.pack(thetas, own_x0, thetas[j]) for j, e in enumerate(names)}
    if len(names) > 1:
        starts["mean"] = layout.pack(thetas, own_x0, np.nanmean(np.array(thetas), axis=0))
    refinements = {k: refine_joint(joint, q, _noise_start(design, joint.noise_names)) for k, q in starts.items()}
    best = min(refinements.values(), key=lambda r: r.nll)
    timings["joint refinement"] = time.perf_counter() - started
    return StudyRefined(separate, joint, layout, refinements, best, shared, tuple(free))


def _noise_start(design: StudyDesign, slots: Sequence[str]) -> np.ndarray | None:
    """The known noise parameters of the noise slots ``slots`` (``"<state>"`` or ``"<state>[<experiment>]"``),
    NaN where estimated; None where every one is estimated under Gaussian noise."""
    if design.plan is None:
        return None if design.given_sd is None else np.array([design.given_sd[n.split("[", 1)[0]] for n in slots])
    return np.array([design.plan[1][n.split("[", 1)[0]] for n in slots])


#: optima whose NLLs differ by less than this are equally good (a symmetry of the model, e.g. ka <-> ke)
TIE = 1e-6


def _refine_alone(design: StudyDesign, j: int, fits: Sequence, problems: Sequence[LeastSquaresProblem],
                  free: Sequence[tuple[int, ...]], x0s: Sequence[np.ndarray]) -> JointRefinement:
    """Experiment j refined alone with its known inputs, from its own fit's optimum and from the median of the
    other experiments' (j's fixed values held): the best NLL; among optima within :data:`TIE` of it
    (a symmetry of the model: pk-oral's curve is the same with ka and ke swapped), the one nearest, in log
    parameters, to the other experiments' median - the branch consistent with the study."""
    system, e, plan = design.system, design.study.experiments[j], design.plan
    own = tuple(p for p in system.parameters if p not in e.fixed)
    lay = JointLayout(tuple(system.parameters), own, (), (e.name,), (dict(e.fixed),), (free[j],),
                      tuple(system.states))
    states = design.observations[j].states
    jp = JointProblem((problems[j],), lay, states, design.prior.refinement_bounds,
                      None if plan is None else tuple(plan[0][s] for s in states))
    starts = [fits[j].theta]
    others = None
    if len(fits) > 1:
        others = np.median([f.theta for k, f in enumerate(fits) if k != j], axis=0)
        starts.append(others)
    outs = []
    for theta in starts:
        theta = np.array([e.fixed.get(p, v) for p, v in zip(system.parameters, theta)])
        outs.append(refine_joint(jp, lay.pack([theta], [x0s[j]], theta), _noise_start(design, states)))
    best = min(r.nll for r in outs)
    tied = [r for r in outs if r.nll <= best + TIE * max(1.0, abs(best))]
    if len(tied) > 1 and others is not None:
        log_others = np.log(np.maximum(others, 1e-300))
        return min(tied, key=lambda r: float(np.sum((np.log(np.maximum(r.thetas[0], 1e-300)) - log_others) ** 2)))
    return tied[0]


# ----------------------------------------------------------------------------- PEtab problems
@dataclass(frozen=True, eq=False)
class PetabRefined:
    """Step 3 of a PEtab problem: the search (its best optimum ``search.best`` (V_e,) on the parameters' scales),
    the optimum's covariance (V_e, V_e) on those scales (the inverse curvature of the nll; NaN where it is not
    positive definite) and the standard errors (V_e,)."""

    search: SearchResult
    covariance: np.ndarray
    stderr: np.ndarray


def refine_petab(design: PetabDesign, options: FitOptions, timings: dict) -> PetabRefined:
    """Step 3 of :func:`pgpgm.fit_petab` (``timings["refinement"]``, seconds): the multi-start search
    (:func:`~pgpgm.refinement.multistart.multistart`, seeded by the fit's seed) over the estimated parameters'
    bounds on their scales, by least squares where every noise is normal, else L-BFGS-B on PEtab's nll and
    gradient; then the optimum's covariance from the nll's curvature there."""
    started = time.perf_counter()
    problem = design.problem
    residuals = (lambda z: problem.noise_residuals(z, jacobian=True)) if design.normal else None
    bar = tqdm(total=design.search.max_starts, desc="step 3: multi-start", disable=not options.progressbar,
               leave=False)

    def progress(k: int, best: float) -> None:
        bar.update(1)
        bar.set_postfix(best_nll=f"{best:.4g}")

    try:
        found = multistart(problem.nll_and_gradient, design.lower, design.upper, design.search, seed=options.seed,
                           residuals=residuals, progress=progress)
    finally:
        bar.close()
    H = hessian(problem.nll_and_gradient, found.best)
    covariance = np.full(H.shape, np.nan)
    if np.all(np.isfinite(H)) and np.all(np.linalg.eigvalsh(H) > 0):
        covariance = np.linalg.inv(H)
    timings["refinement"] = time.perf_counter() - started
    return PetabRefined(found, covariance, np.sqrt(np.diag(covariance)))

"""Step 4: the posterior of the ODE model from the refined optimum (:func:`posterior_step` -> :class:`Posterior`):
NUTS on the model :func:`pgpgm.posterior.build_ode_model` writes, the Laplace approximation, or step 2's chains."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConvergenceWarning, IdentifiabilityWarning, LaplaceError, StartError
from ..ode.system import ODESystem
from ..posterior.laplace import gaussian_draws, laplace_posterior
from ..posterior.petab_model import build_petab_model
from ..posterior.model import (
    build_ode_model,
    initial_value_name,
    log_scale_names,
    positive_initial_values,
)
from ..posterior.rounds import NUTSRun, run_nuts
from ..posterior.scales import choose_scales
from ..priors import Priors, PriorSpec
from ..refinement import LeastSquaresProblem, Refinement, refine
from ..solve import Integrator, Solver, default_solver
from ..study.joint import JointRefinement
from ..study.model import build_study_model, noise_variable, varying_name, x0_name
from .match import Matched
from .options import NUTS, FitOptions, Laplace
from .prepare import PetabDesign, Prepared, StudyDesign
from .refine import PetabRefined, Refined, StudyRefined, unknown_x0_priors

#: points of the plotted trajectories (per experiment in a study: :data:`STUDY_DENSE_POINTS`)
DENSE_POINTS = 400
STUDY_DENSE_POINTS = 200


@dataclass(frozen=True, eq=False)
class Posterior:
    """Step 4: the main posterior tree (NUTS, Laplace, or step 2's chains), the NUTS run (None
    otherwise), the free variables of the model, the gradient evaluations it took, and the ``pm.Model``
    it sampled (a study's joint model; None for a single fit, whose model is rebuilt on demand)."""

    tree: Any
    nuts: NUTSRun | None
    free: tuple[str, ...]
    solves: int
    model: Any = None
    stand_in: bool = False  # step 4 could not start: this is what posterior=None gives (a warning said why)


def posterior_step(prepared: Prepared, matched: Matched | None, refined: Refined, options: FitOptions,
                   timings: dict) -> Posterior:
    """Step 4 (``timings["posterior"]``, seconds): NUTS on the ODE model from the refined optimum (each separate
    mode's mean refined: which optimum it belongs to), the Laplace approximation, or step 2's chains
    (``options.posterior`` None)."""
    started = time.perf_counter()
    try:
        post = _posterior(prepared, matched, refined, options)
    except (StartError, LaplaceError) as failed:
        _warn_no_start(failed, "result.estimates['at_bound']")
        post = replace(_posterior(prepared, matched, refined, replace(options, posterior=None)), stand_in=True)
    timings["posterior"] = time.perf_counter() - started
    return post


def _warn_no_start(failed: StartError | LaplaceError, bounds: str) -> None:
    """The warning of a step 4 that could not start (its caller's result holds steps 1-3); ``bounds``: where the
    result says which parameters sit on a bound."""
    if isinstance(failed, LaplaceError):
        warnings.warn(f"step 4 (Laplace) has no approximation at the refined optimum ({failed}): the result holds "
                      "steps 1-3 only, as with posterior=None. The IdentifiabilityWarning, if any, names what the "
                      "data leave open; posterior='nuts' samples the posterior over the prior box instead",
                      IdentifiabilityWarning, stacklevel=4)
        return
    warnings.warn(f"step 4 (NUTS) could not start from the refined optimum ({failed}): the result holds steps 1-3 "
                  "only, as with posterior=None. The refined point may sit where the model cannot be solved (a "
                  f"parameter on a bound: see {bounds}); narrow the priors away from it, or try "
                  "posterior=pgpgm.NUTS(sampler='pymc')", ConvergenceWarning, stacklevel=4)


def _posterior(prepared: Prepared, matched: Matched | None, refined: Refined, options: FitOptions) -> Posterior:
    system, obs, ref = prepared.system, prepared.obs, refined.best
    density = matched.density if matched is not None else None  # None: no steps 1-2 (refine_from_box)
    spec = options.posterior
    prior = density.priors if refined.priors is None else refined.priors  # with observables: phi's too
    x0_priors = unknown_x0_priors(refined, density)
    t = obs.times
    solver = refined.problem.integrator.solver  # step 3's (matched.integrator's)
    dense = Integrator(system, np.linspace(t[0], t[-1], DENSE_POINTS), solver)
    if isinstance(spec, NUTS):
        plan = prepared.noise
        if plan is None:
            noise_args = {"noise_sd": options.noise_sd, "noise_center": refined.noise_start}
        else:  # sds' priors about their starts (as the Gaussian ones), alpha's about its refined value
            noise_args = {"noise": plan.names, "noise_sd": plan.known,
                          "noise_center": np.where(np.array(plan.names) == "negbin", ref.noise_sd, refined.noise_start)}
        refined_x0 = {s: (ref.x0[system.states.index(s)], ref.q_stderr.get(f"x0[{s}]", np.nan))
                      for s in prepared.direct if s not in (prepared.x0_observed or {})}
        started = time.perf_counter()  # the budget counts building the model (compiling its solve) too
        own = _own_scale(refined.problem, ref, prior, x0_priors)
        model, layout = build_ode_model(system, obs, x0=ref.x0, priors=prior, **noise_args,
                                        solver=spec.solver_at(solver, system, t, ref.theta, ref.x0),
                                        dense_times=dense.times, x0_priors=x0_priors,
                                        log_scale=tuple(n for n in log_scale_names(prior) if n not in own),
                                        own_scale=own,
                                        positive_x0=positive_initial_values(system, refined_x0),
                                        **({"x0_observed": prepared.x0_observed} if prepared.x0_observed else {}),
                                        **({"observables": prepared.observables} if prepared.observables else {}))
        initial = tuple(s for s in (*prepared.direct, *refined.unknown) if s not in (prepared.x0_observed or {}))
        center, sd = _refined_point(layout, ref, obs, initial)
        names = {**{p: p for p in layout.parameters},
                 **{f"x0[{s}]": n for s, n in zip(initial, layout.initial)}}
        covariance = ([names[q] for q in ref.q_names], ref.q_covariance)
        run = run_nuts(model, center, sd, covariance=covariance, draws=spec.draws, tune=spec.tune, chains=spec.chains,
                       cores=spec.cores, seed=options.seed, nuts_sampler=spec.sampler, max_rounds=spec.rounds,
                       progressbar=options.progressbar, budget=spec.budget, warn=False, metric=spec.metric,
                       started=started, ess=spec.ess, sd_error=spec.sd_error)
        modes = [m.record() for m in run.modes]
        for mode in modes:  # each mode's mean refined: which optimum it belongs to, and how well it fits
            m = mode["mean"]
            q0 = np.array([m[p] for p in layout.parameters]
                          + [m[names[q]] for q in ref.q_names[len(layout.parameters):]])
            r = refine(refined.problem, q0, prior.refinement_bounds, warn=False,
                       estimate_noise=options.noise_sd is None if prepared.noise is None else prepared.noise.estimated)
            mode["refined"], mode["nll"] = dict(zip(layout.parameters, map(float, r.theta))), float(r.nll)
        run.tree.attrs["pgpgm_modes"] = json.dumps(modes)
        run.tree.attrs["pgpgm_own_scale"] = json.dumps(sorted(own))  # the rest of log_scale_names: log scale
        if run.gradient_evaluations:  # every round's draws, not just those kept
            solves = sum(run.gradient_evaluations)
        elif "n_steps" in run.tree.sample_stats:
            solves = int(run.tree.sample_stats["n_steps"].sum())
        else:
            solves = 0
        return Posterior(run.tree, run, tuple(layout.free), solves)
    if isinstance(spec, Laplace):
        return Posterior(laplace_posterior(dense, ref, draws=spec.draws, seed=options.seed), None, (), 0)
    return Posterior(matched.run.tree, None, (), 0)


def _own_scale(problem: LeastSquaresProblem, ref: Refinement, prior: Priors,
               x0_priors: Mapping[str, PriorSpec]) -> dict[str, float]:
    """The Uniform(0, upper) parameters and unknown latent initial values step 4 samples on their own
    scale, with their soft wall's width, by step 4's variable names
    (:func:`~pgpgm.posterior.scales.choose_scales` on the refinement's log likelihood and Fisher
    information, noise held at its refined parameters); the parameters left stay on the log scale, the
    initial values on the log-odds of their box."""
    initial = {f"x0[{s}]": initial_value_name(s) for s in x0_priors}  # refinement name -> step 4's
    boxes = Priors((*prior.names, *initial), (*prior.specs, *x0_priors.values()))
    box = dict(zip(boxes.names, boxes.specs))
    uppers = {n: box[n][1] for n in log_scale_names(boxes) if n in prior.names or n in ref.q_names}
    if not uppers:
        return {}
    scaled = problem.with_noise_sd(ref.noise_sd)

    def logp(q: np.ndarray) -> float:
        return -problem.nll(q, ref.noise_sd)

    def conditional_sd(q: np.ndarray) -> np.ndarray:
        J = scaled.jacobian(q)
        with np.errstate(divide="ignore"):
            return 1.0 / np.sqrt(np.einsum("kq,kq->q", J, J))

    choices = choose_scales(logp, ref.q, ref.q_covariance, ref.q_names, uppers, conditional_sd)
    return {initial.get(c.name, c.name): c.width for c in choices if c.own}


def _refined_point(layout, ref: Refinement, obs, initial_states) -> tuple[dict[str, float], dict[str, float]]:
    """The refined optimum by the ODE model's variable names, and a spread for each: the
    refinement's standard errors of theta and the free initial values (10 % of the value
    where undetermined), sigma/sqrt(2N) for a noise sd."""
    se = ref.q_stderr
    center, sd = {}, {}
    idx = [list(layout.states).index(s) for s in initial_states]
    for name, key, v in [*zip(layout.parameters, layout.parameters, ref.theta),
                         *((n, f"x0[{s}]", ref.x0[i]) for n, s, i in zip(layout.initial, initial_states, idx))]:
        s = se.get(key, np.nan)
        center[name] = float(v)
        sd[name] = float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(float(v)), 1e-3)
    for name, m in zip(layout.noise, layout.noise_states):
        sig, n = ref.noise_sd[m], obs.n_obs[m]
        center[name], sd[name] = float(sig), float(sig) / np.sqrt(2 * n)
    return center, sd


# ----------------------------------------------------------------------------- studies
def posterior_study(design: StudyDesign, refined: StudyRefined, options: FitOptions,
                    timings: dict) -> Posterior | None:
    """Step 4 of a study: NUTS (:func:`~pgpgm.posterior.rounds.run_nuts`) on one joint ``pm.Model``
    (:func:`~pgpgm.study.model.build_study_model`) started at the joint optimum; hierarchical parameters
    (``log p[e] = mu_p + sigma_p z_p[e]``, non-centred by default) start with z[e] from the refined values, mu and
    sigma from their log mean and sd. ``NUTS(sampler="auto")`` runs PyMC's rounds for a hierarchical model:
    the Laplace approximation nutpie is whitened by cannot describe the funnel of a population sd (4 subjects,
    tests/test_study.py: nutpie 196 s of a 240 s budget, PyMC 38 s); nutpie for any other.
    ``timings["posterior"]``: its seconds. None (warned) where NUTS cannot start."""
    started = time.perf_counter()
    system, spec, best, study = design.system, options.posterior, refined.best, design.study
    names, free, plan = study.names, refined.free, design.plan
    solver = options.solver or default_solver()
    model = build_study_model(system, design.observations, names, best.x0s, free,
                              [dict(e.fixed) for e in study.experiments], varying=design.varying,
                              hierarchical=design.hierarchical, priors=design.prior,
                              noise_center=dict(zip(best.noise_names, best.noise_sd)),
                              noise_sd=design.given_sd if plan is None else plan[1],
                              solver=study_solver(spec, solver, system, design.observations, best),
                              population_priors=design.population_priors, centred=design.centred,
                              noise=None if plan is None else plan[0], noise_per_experiment=design.per_experiment,
                              positive_x0=_study_positive_x0(system, names, best, free))
    joint = refined.joint
    n_obs = dict(zip(joint.noise_names, joint.n_obs().tolist()))
    known = (design.given_sd or {}) if plan is None else {s: v for s, v in plan[1].items() if np.isfinite(v)}
    center, spread = _study_start(design, refined, known, n_obs)
    engine = "pymc" if spec.sampler == "auto" and design.hierarchical else spec.sampler
    try:
        run = run_nuts(model, center, spread, covariance=_study_covariance(best, design.hierarchical, design.centred),
                       draws=spec.draws, tune=spec.tune, chains=spec.chains, cores=spec.cores, seed=options.seed,
                       nuts_sampler=engine, max_rounds=spec.rounds, progressbar=options.progressbar,
                       budget=spec.budget, warn=False, ess=spec.ess, sd_error=spec.sd_error)
    except StartError as failed:
        _warn_no_start(failed, "result.theta('joint') against the priors")
        return None
    timings["posterior"] = time.perf_counter() - started
    return Posterior(run.tree, run, tuple(rv.name for rv in model.free_RVs), sum(run.gradient_evaluations), model)


def _study_covariance(best: JointRefinement, hier, centred: bool):
    """The joint refinement's covariance by step 4's variable names (shared and varying parameters, free initial
    values; a centred hierarchical value as its log): the dense seed of the NUTS mass matrix. None when it is
    not finite (then a diagonal seed from the standard errors)."""
    if best.covariance is None or not np.all(np.isfinite(best.covariance)):
        return None
    names, scale = [], np.ones(len(best.names))
    for i, n in enumerate(best.names):
        if n.startswith("x0["):  # x0[s][e] -> s_0[e]
            s, e = n[3:].split("][", 1)
            names.append(x0_name(s, e[:-1]))
            continue
        p = n.split("[", 1)[0]
        if p in hier:
            if not centred:
                names.append(f"_not_sampled_{i}")  # the non-centred z depends on mu and sigma: left out
                continue
            names.append(f"log_{n}")
            scale[i] = 1.0 / best.q[i]
        else:
            names.append(n)
    return names, best.covariance * np.outer(scale, scale)


def study_solver(posterior: NUTS, solver: Solver, system: ODESystem, observations, best: JointRefinement) -> Solver:
    """Step 4's solver for the joint model: :meth:`NUTS.solver_for`, or its fallback (CVODE) alone where
    DOPRI5 gives up at any experiment's refined point (:meth:`NUTS.solver_at`)."""
    chosen = posterior.solver_for(solver)
    for obs, theta, x0 in zip(observations, best.thetas, best.x0s):
        at = posterior.solver_at(solver, system, obs.times, theta, x0)
        if at != chosen:
            return at
    return chosen


def _study_positive_x0(system: ODESystem, names: Sequence[str], best: JointRefinement,
                       free: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Per experiment, the free initial values step 4 samples on the log scale
    (:func:`pgpgm.posterior.model.positive_initial_values` at the joint optimum)."""
    def refined(name: str) -> tuple[float, float]:
        k = best.names.index(name)
        return float(best.q[k]), float(best.stderr[k])

    return [tuple(system.states.index(s) for s in positive_initial_values(
        system, {system.states[i]: refined(f"x0[{system.states[i]}][{e}]") for i in free[j]}))
        for j, e in enumerate(names)]


def _study_start(design: StudyDesign, refined: StudyRefined, known: Mapping[str, float],
                 n_obs: Mapping[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """Step 4's centre and spread by variable name: the joint optimum and its standard errors; hierarchical
    parameters from the refined values: mu, sigma their log mean and sd, z[e] the standardised logs (centred:
    log p[e] itself); noise parameters sigma / sqrt(2 n) about their refined values."""
    system, best, layout, centred = design.system, refined.best, refined.layout, design.centred
    center, sd = {}, {}

    def se_or(name, value):
        s = best.stderr[best.names.index(name)] if name in best.names else np.nan
        return float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(value), 1e-3)

    for p in refined.shared:
        center[p] = best.value(p)
        sd[p] = se_or(p, center[p])
    for j, e in enumerate(layout.experiments):
        for p in design.varying:
            if p not in layout.fixed[j]:
                n = varying_name(p, e)
                center[n] = best.value(n)
                sd[n] = se_or(n, center[n])
        for i in refined.free[j]:
            s = system.states[i]
            n = f"x0[{s}][{e}]"
            center[x0_name(s, e)] = best.value(n)
            sd[x0_name(s, e)] = se_or(n, center[x0_name(s, e)])
    K = len(layout.experiments)
    for p in design.hierarchical:
        keys = [(e, varying_name(p, e)) for j, e in enumerate(layout.experiments) if p not in layout.fixed[j]]
        logs = np.log(np.maximum([best.value(n) for _, n in keys], 1e-300))
        mu, sig = float(np.mean(logs)), float(max(np.std(logs), 0.05))
        center[f"mu_{p}"], sd[f"mu_{p}"] = mu, sig / np.sqrt(max(K, 1))
        center[f"sigma_{p}"], sd[f"sigma_{p}"] = sig, sig / np.sqrt(2 * max(K, 1))
        for (e, n), lv in zip(keys, logs):
            rel = se_or(n, best.value(n)) / max(best.value(n), 1e-300)
            if centred:
                center[f"log_{p}[{e}]"], sd[f"log_{p}[{e}]"] = float(lv), float(min(max(rel, 0.01), 1.0))
            else:
                center[f"z_{p}[{e}]"] = (lv - mu) / sig
                sd[f"z_{p}[{e}]"] = float(min(max(rel / sig, 0.05), 1.0))
    for slot, model, v in zip(refined.joint.noise_names, refined.joint.models, best.noise_sd):
        if model == "poisson" or slot.split("[", 1)[0] in known:
            continue
        name = noise_variable(slot, model)
        center[name] = float(v)
        sd[name] = float(v) / np.sqrt(2 * n_obs[slot])
    return center, sd


# ----------------------------------------------------------------------------- PEtab problems
def posterior_petab(design: PetabDesign, refined: PetabRefined, options: FitOptions, timings: dict) -> Posterior | None:
    """Step 4 of :func:`pgpgm.fit_petab` (``timings["posterior"]``): NUTS on the problem's posterior over the
    estimated parameters on their scales (:func:`~pgpgm.posterior.petab_model.build_petab_model`; PyMC's engine
    where ``NUTS(sampler="auto")``: the likelihood is a Python Op, which nutpie's compiled model would call through
    object mode), started at the refined optimum with the dense mass matrix of its covariance; draws from the
    Gaussian at the optimum (:class:`Laplace`, kept inside the bounds); or None (``posterior=None``)."""
    spec = options.posterior
    if spec is None:
        return None
    started = time.perf_counter()
    problem, best = design.problem, refined.search.best
    names = tuple(p.id for p in problem.estimated)
    if isinstance(spec, Laplace):
        try:
            tree = gaussian_draws(names, best, refined.covariance, spec.draws, options.seed, design.lower,
                                  design.upper)
        except LaplaceError as failed:
            _warn_no_start(failed, "result.parameter_table(), refined against lower and upper")
            return None
        timings["posterior"] = time.perf_counter() - started
        return Posterior(tree, None, names, 0)
    with warnings.catch_warnings():  # the likelihood is a Python Op by design: PyTensor's numba backend says so
        warnings.filterwarnings("ignore", "Numba will use object mode to run Petab", UserWarning)
        return _nuts_petab(design, refined, options, timings, started)


def _nuts_petab(design: PetabDesign, refined: PetabRefined, options: FitOptions, timings: dict,
                started: float) -> Posterior | None:
    """:func:`posterior_petab`'s NUTS (None, warned, where it cannot start)."""
    spec, problem, best = options.posterior, design.problem, refined.search.best
    model, names = build_petab_model(problem)
    width = design.upper - design.lower
    sd = np.where(np.isfinite(refined.stderr) & (refined.stderr > 0), refined.stderr, 0.01 * width)
    covariance = (list(names), refined.covariance) if np.all(np.isfinite(refined.covariance)) else None
    try:
        run = run_nuts(model, dict(zip(names, map(float, best))), dict(zip(names, map(float, sd))),
                       covariance=covariance, draws=spec.draws, tune=spec.tune, chains=spec.chains, cores=spec.cores,
                       seed=options.seed, nuts_sampler="pymc" if spec.sampler == "auto" else spec.sampler,
                       max_rounds=spec.rounds, progressbar=options.progressbar, budget=spec.budget, warn=False,
                       ess=spec.ess, sd_error=spec.sd_error, started=started)
    except StartError as failed:
        _warn_no_start(failed, "result.parameter_table(), refined against lower and upper")
        return None
    timings["posterior"] = time.perf_counter() - started
    return Posterior(run.tree, run, names, sum(run.gradient_evaluations), model)

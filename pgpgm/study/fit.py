"""Many experiments in one fit (:func:`fit_study`): steps 1-2 per experiment, step 3 and step 4 joint."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import CompetingOptimaWarning, ConvergenceWarning, DataError
from ..logscale import measurement_noise
from ..ode.system import ODESystem
from ..pipeline import NUTS, fit
from ..posterior.diagnostics import causes_of_poor_mixing, diagnose, mixing_problems, warn_if_unconverged
from ..posterior.nuts import PosteriorBudget, positive_initial_values, posterior_notes, run_nuts, warn_if_imprecise
from ..priors import Priors
from ..refinement import LeastSquaresProblem
from ..solve import Integrator, Solver, default_solver
from .design import Study
from .joint import JointLayout, JointProblem, JointRefinement, refine_joint
from .model import (
    build_study_model,
    check_hierarchical,
    noise_variable,
    varying_name,
    x0_name,
)
from .result import StudyResult

_DENSE = 200  # points per experiment of the plotted trajectories
#: step 4's default budget for a study (a joint model costs K solves per gradient)
STUDY_BUDGET = PosteriorBudget(300.0, None)


def fit_study(
    system: ODESystem,
    study: Study,
    *,
    varying: Sequence[str] = (),
    hierarchical: Mapping[str, str] | None = None,
    priors=None,
    noise_sd: float | Mapping[str, float] | None = None,
    seed: int = 0,
    posterior: str | NUTS | None = "nuts",
    posterior_draws: int = 500,
    posterior_tune: int = 500,
    posterior_chains: int = 4,
    posterior_budget: PosteriorBudget | float | None = STUDY_BUDGET,
    cores: int | None = None,
    solver: Solver | None = None,
    population_priors: Mapping[str, Any] | None = None,
    centred: bool = False,
    progressbar: bool = False,
    fit_kwargs: Mapping[str, Any] | None = None,
    noise: str | Mapping[str, Any] | None = None,
    noise_per_experiment: bool | Sequence[str] = False,
) -> StudyResult:
    """Fit every experiment of ``study`` together.

    - Steps 1-2 (and 3) per experiment: :func:`pgpgm.fit` of each experiment's data with its known
      initial values (latent states) and fixed values, ``posterior=None`` (``fit_kwargs`` are passed
      on: ``draws``, ``kernel``, ``stop`` ...). Each finds its experiment's basin.
    - Each experiment refined alone with every known input (observed states' known initial values,
      e.g. C(0) = 0, held: :func:`pgpgm.fit` frees them), from its fit's optimum and from the other
      experiments' median: ``result.theta("separate")``.
    - Step 3, a joint least-squares refinement (:mod:`pgpgm.study.joint`): shared parameters once,
      ``varying`` and ``hierarchical`` ones per experiment, one noise sd per observed state shared by the
      experiments (estimated unless ``noise_sd`` gives it; one per experiment for the states of
      ``noise_per_experiment``), each state's likelihood its ``noise`` model's; started from each experiment's own
      optimum and from their mean (shared parameters; the varying ones from each experiment's own),
      keeping the best likelihood.
    - Step 4, NUTS on one joint ``pm.Model`` (:func:`pgpgm.study.model.build_study_model`; rounds and
      budget of :func:`pgpgm.posterior.nuts.run_nuts`), started at the joint optimum; hierarchical
      parameters (``{"ka": "lognormal"}``: log ka[e] = mu_ka + sigma_ka z_ka[e], non-centred) start with
      z[e] from the refined values, mu and sigma from their log mean and sd. With the default engine
      (``NUTS(sampler="auto")``) a hierarchical model runs PyMC's rounds, any other nutpie
      (:func:`pgpgm.posterior.nuts.auto_sampler`).

    Parameters
    ----------
    system : the ODESystem shared by the experiments
    study : a :class:`Study`
    varying : parameters with an unknown value per experiment (the others are shared)
    hierarchical : parameter -> ``"lognormal"``: per experiment, around an unknown population
    priors : the parameters' priors as in :func:`pgpgm.fit` (a Uniform box bounds the refinements)
    noise_sd : known noise sd (one number, or by observed state; of log y for lognormal states), for every
        experiment
    noise : the measurement noise model of each observed state, as :func:`pgpgm.fit` takes it: ``"normal"``
        (default), ``"lognormal"`` (log y ~ N(log x, sd^2) where measured: a state that starts at 0, e.g. an
        oral dose's concentration, is fine), ``"poisson"``, ``"negbin"`` (PyMC's NB(mu, alpha)), one name
        for every state or a mapping state -> a name or a :mod:`pgpgm.noise` object (its parameter then
        known). Steps 1-2 of each experiment fit as :func:`pgpgm.fit` does with it; the separate and
        joint refinements use the model's residuals (deviance residuals for counts) and estimate its
        parameter (sd, of log y for lognormal; alpha for negbin; Poisson has none) by maximum
        likelihood; step 4 its likelihood (``sigma_<s>`` / ``alpha_<s>`` ~ LogNormal(log refined, 2)).
    noise_per_experiment : True, or the observed states whose noise parameter is one per experiment
        (labs or assays that differ: ``sigma_<s>[<e>]``, ``alpha_<s>[<e>]``, estimates ``noise_sd`` by
        experiment); default False: one per observed state, shared by the experiments
    posterior : ``"nuts"`` (with ``posterior_*``, ``cores``), a :class:`pgpgm.NUTS`, or None (steps 1-3 only)
    population_priors : callables ``name -> PyMC variable`` for ``mu_<p>`` / ``sigma_<p>`` (default
        Normal(0, 3) and HalfNormal(1) on the log scale)
    centred : hierarchical parameters as ``log_<p>[<e>] ~ Normal(mu, sigma)`` (centred) instead of the
        default non-centred ``z_<p>[<e>]``; better when each experiment's data determine its value well

    Returns
    -------
    StudyResult

    Raises
    ------
    DataError : before any computation: a study that is not a :class:`Study`, unusable data in an
        experiment, a ``varying`` or ``hierarchical`` name that is not a parameter, an unknown population
        kind, a parameter both varying and hierarchical, a bad ``noise_sd``, an unknown noise model or a
        measurement it cannot explain (counts that are negative or not whole numbers, values <= 0 under
        lognormal noise), ``noise_per_experiment`` naming a state that is not observed.
    """
    t_start = time.perf_counter()
    if not isinstance(system, ODESystem):
        raise DataError(f"system must be a pgpgm.ODESystem (e.g. pgpgm.load_model(name).system), got "
                        f"{type(system).__name__}")
    if not isinstance(study, Study):
        raise DataError(f"study must be a pgpgm.Study (Study.from_tidy / Study.from_mapping), got {type(study).__name__}")
    varying = (varying,) if isinstance(varying, str) else tuple(varying)
    bad = [p for p in varying if p not in system.parameters]
    if bad:
        raise DataError(f"varying names {bad}, which are not parameters of {system.name}; its parameters are "
                        f"{list(system.parameters)}")
    hier = check_hierarchical(system, hierarchical, varying)
    for p in (*varying, *hier):
        if all(p in e.fixed for e in study.experiments):
            raise DataError(f"{p!r} is fixed in every experiment, so it cannot vary by experiment")
    observations = study.check(system)
    observed = tuple(dict.fromkeys(s for o in observations for s in o.states))
    prior = Priors.from_user(system.parameters, priors)
    given_sd = _noise_sd(noise_sd, observed)
    plan = _noise_plan(noise, observations, observed, given_sd)  # None: Gaussian throughout (the plain path)
    if plan is not None:
        _check_known_start(study, observations, plan[0])
    per_experiment = _per_experiment(noise_per_experiment, observed)
    if isinstance(posterior, str) and posterior == "nuts":
        posterior = NUTS(posterior_draws, posterior_tune, posterior_chains, budget=posterior_budget, cores=cores)
    elif posterior is not None and not isinstance(posterior, NUTS):
        raise DataError(f"posterior must be 'nuts', None or pgpgm.NUTS(...), got {posterior!r}")
    fit_kwargs = dict(fit_kwargs or {})
    clash = {"x0", "fixed", "posterior", "observed", "noise"} & set(fit_kwargs)
    if clash:
        raise DataError(f"fit_kwargs must not hold {sorted(clash)}: the study gives them")
    solver = solver or default_solver()
    timings: dict[str, float] = {}

    # steps 1-2 (and fit's own step 3) per experiment: each experiment's basin
    t0 = time.perf_counter()
    fits = []
    for e, obs in zip(study.experiments, observations):
        if noise is not None:
            fit_kwargs["noise"] = {s: v for s, v in noise.items() if s in obs.states} if isinstance(noise, Mapping) \
                else noise
        with warnings.catch_warnings():  # step 2's chains stop early by design: only the basin matters here
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", CompetingOptimaWarning)  # one warning for the study, below
            fits.append(fit(system, e.data, study.observed, x0=dict(e.x0), fixed=dict(e.fixed) or None, priors=priors,
                            noise_sd=given_sd and [given_sd[s] for s in _states_of(e, observations, study)],
                            posterior=None, seed=seed, solver=solver, progressbar=progressbar, **fit_kwargs))
    timings["steps 1-2"] = time.perf_counter() - t0
    _warn_competing(study.names, fits)

    # each experiment alone with every known input, then step 3 jointly
    t0 = time.perf_counter()
    names = study.names
    K, S = len(names), system.n_states
    x0s, free = [], []
    for e, obs, r in zip(study.experiments, observations, fits):
        x = np.array([e.x0.get(s, r.x0[s]) for s in system.states], float)
        x0s.append(x)
        free.append(tuple(i for i, s in enumerate(system.states) if s not in e.x0))
    problems = tuple(LeastSquaresProblem(Integrator(system, obs.times, solver), obs.values,
                                         system.index_of_states(obs.states), 1.0, x0s[j], free_x0=free[j],
                                         **({} if plan is None else {"noise": tuple(plan[0][s] for s in obs.states)}))
                     for j, obs in enumerate(observations))
    bounds = prior.bounds
    separate = [_refine_alone(j, e, fits, problems, observations, free, x0s, system, bounds, given_sd, plan)
                for j, e in enumerate(study.experiments)]
    timings["separate refinement"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    var_all = (*varying, *hier)
    shared = tuple(p for p in system.parameters if p not in var_all and not all(p in e.fixed for e in study.experiments))
    layout = JointLayout(tuple(system.parameters), shared, tuple(p for p in system.parameters if p in var_all), names,
                         tuple(dict(e.fixed) for e in study.experiments), tuple(free), tuple(system.states))
    joint = JointProblem(problems, layout, observed, bounds, None if plan is None else
                         tuple(plan[0][s] for s in observed), per_experiment)
    thetas = [s.thetas[0] for s in separate]
    own_x0 = [s.x0s[0] for s in separate]
    starts = {f"experiment {e}": layout.pack(thetas, own_x0, thetas[j]) for j, e in enumerate(names)}
    if K > 1:
        starts["mean"] = layout.pack(thetas, own_x0, np.nanmean(np.array(thetas), axis=0))
    if plan is None:
        sd = None if given_sd is None else np.array([given_sd[n.split("[", 1)[0]] for n in joint.noise_names])
    else:
        sd = np.array([plan[1][n.split("[", 1)[0]] for n in joint.noise_names])
    refinements = {k: refine_joint(joint, q, sd) for k, q in starts.items()}
    best = min(refinements.values(), key=lambda r: r.nll)
    timings["joint refinement"] = time.perf_counter() - t0
    timings["steps 1-3"] = time.perf_counter() - t_start

    # step 4: the joint model
    tree, model, diag = None, None, None
    if posterior is not None:
        t0 = time.perf_counter()
        model = build_study_model(system, observations, names, best.x0s, free,
                                  [dict(e.fixed) for e in study.experiments], varying=varying, hierarchical=hier,
                                  priors=prior, noise_center=dict(zip(best.noise_names, best.noise_sd)),
                                  noise_sd=given_sd if plan is None else plan[1],
                                  solver=_step4_solver(posterior, solver, system, observations, best),
                                  population_priors=population_priors, centred=centred,
                                  noise=None if plan is None else plan[0], noise_per_experiment=per_experiment,
                                  positive_x0=_positive_x0(system, names, best, free))
        n_obs = dict(zip(joint.noise_names, joint.n_obs().tolist()))
        known = (given_sd or {}) if plan is None else {s: v for s, v in plan[1].items() if np.isfinite(v)}
        center, spread = _start(system, layout, best, hier, varying, shared, joint, free, known, n_obs, centred)
        covariance = _covariance(best, layout, hier, centred)
        # "auto" is PyMC's rounds for a hierarchical model: the Laplace approximation nutpie is whitened by
        # cannot describe the funnel of a population sd (4 subjects, tests/test_study.py: nutpie 196 s of a
        # 240 s budget, PyMC 38 s)
        engine = "pymc" if posterior.sampler == "auto" and hier else posterior.sampler
        run = run_nuts(model, center, spread, covariance=covariance, draws=posterior.draws, tune=posterior.tune, chains=posterior.chains,
                       cores=posterior.cores, seed=seed, nuts_sampler=engine, max_rounds=posterior.rounds,
                       progressbar=progressbar, budget=posterior.budget, warn=False, ess=posterior.ess,
                       sd_error=posterior.sd_error)
        tree = run.tree
        free_names = [rv.name for rv in model.free_RVs]
        diag = diagnose(tree, free_names, posterior.ess)
        notes = posterior_notes(tree)
        if mixing_problems(diag):  # what the joint refinement says the data leave open
            notes += causes_of_poor_mixing([n for n, se in zip(best.names, best.stderr) if not np.isfinite(se)], ())
        warn_if_unconverged(diag, "NUTS (study)", notes=notes, stacklevel=2)
        if not mixing_problems(diag):
            warn_if_imprecise(tree, "NUTS (study)", stacklevel=2)
        timings["posterior"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    solves = {"steps 1-3 per experiment": int(sum(sum(r.n_ode_solves.values()) for r in fits)),
              "separate refinement": int(sum(s.n_solves for s in separate)),
              "joint refinement": int(sum(r.n_solves for r in refinements.values()))}
    return StudyResult.assemble(system=system, names=names, observations=observations, fits=tuple(fits),
                                separate=tuple(separate), joint=best, refinements=refinements, layout=layout,
                                hierarchical=hier, varying=varying, tree=tree, model=model, diagnostics=diag,
                                solver=solver, dense_points=_DENSE, timings=timings, n_ode_solves=solves)


#: optima whose NLLs differ by less than this are equally good (a symmetry of the model, e.g. ka <-> ke)
_TIE = 1e-6


def _refine_alone(j, e, fits, problems, observations, free, x0s, system, bounds, given_sd, plan) -> JointRefinement:
    """Experiment j refined alone with its known inputs, from its own fit's optimum and from the median of the
    other experiments' (j's fixed values held): the best NLL; among optima within :data:`_TIE` of it
    (a symmetry of the model: pk-oral's curve is the same with ka and ke swapped), the one nearest, in log
    parameters, to the other experiments' median - the branch consistent with the study."""
    own = tuple(p for p in system.parameters if p not in e.fixed)
    lay = JointLayout(tuple(system.parameters), own, (), (e.name,), (dict(e.fixed),), (free[j],),
                      tuple(system.states))
    states = observations[j].states
    jp = JointProblem((problems[j],), lay, states, bounds, None if plan is None else tuple(plan[0][s] for s in states))
    if plan is None:
        sd = None if given_sd is None else np.array([given_sd[s] for s in states])
    else:
        sd = np.array([plan[1][s] for s in states])
    starts = [fits[j].theta]
    others = None
    if len(fits) > 1:
        others = np.median([f.theta for k, f in enumerate(fits) if k != j], axis=0)
        starts.append(others)
    outs = []
    for theta in starts:
        theta = np.array([e.fixed.get(p, v) for p, v in zip(system.parameters, theta)])
        outs.append(refine_joint(jp, lay.pack([theta], [x0s[j]], theta), sd))
    best = min(r.nll for r in outs)
    tied = [r for r in outs if r.nll <= best + _TIE * max(1.0, abs(best))]
    if len(tied) > 1 and others is not None:
        log_others = np.log(np.maximum(others, 1e-300))
        return min(tied, key=lambda r: float(np.sum((np.log(np.maximum(r.thetas[0], 1e-300)) - log_others) ** 2)))
    return tied[0]


def _covariance(best: JointRefinement, layout: JointLayout, hier, centred: bool):
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


def _states_of(e, observations, study) -> tuple[str, ...]:
    return observations[study.names.index(e.name)].states


def _noise_sd(noise_sd, observed: tuple[str, ...]) -> dict[str, float] | None:
    if noise_sd is None:
        return None
    if isinstance(noise_sd, Mapping):
        missing = [s for s in observed if s not in noise_sd]
        if missing or set(noise_sd) - set(observed):
            raise DataError(f"noise_sd must give one sd per observed state {list(observed)}, got {dict(noise_sd)}")
        values = {s: noise_sd[s] for s in observed}
    else:
        values = {s: noise_sd for s in observed}
    out = {}
    for s, v in values.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise DataError(f"noise_sd of {s} must be a positive number, got {v!r}") from None
        if not (np.isfinite(f) and f > 0):
            raise DataError(f"noise_sd of {s} must be a positive number, got {v!r}")
        out[s] = f
    return out


def _step4_solver(posterior: NUTS, solver: Solver, system: ODESystem, observations, best: JointRefinement) -> Solver:
    """Step 4's solver for the joint model: :meth:`NUTS.solver_for`, or its fallback (CVODE) alone where
    DOPRI5 gives up at any experiment's refined point (:meth:`NUTS.solver_at`)."""
    chosen = posterior.solver_for(solver)
    for obs, theta, x0 in zip(observations, best.thetas, best.x0s):
        at = posterior.solver_at(solver, system, obs.times, theta, x0)
        if at != chosen:
            return at
    return chosen


def _positive_x0(system: ODESystem, names: Sequence[str], best: JointRefinement,
                 free: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Per experiment, the free initial values step 4 samples on the log scale
    (:func:`pgpgm.posterior.nuts.positive_initial_values` at the joint optimum)."""
    def refined(name: str) -> tuple[float, float]:
        k = best.names.index(name)
        return float(best.q[k]), float(best.stderr[k])

    return [tuple(system.states.index(s) for s in positive_initial_values(
        system, {system.states[i]: refined(f"x0[{system.states[i]}][{e}]") for i in free[j]}))
        for j, e in enumerate(names)]


def _start(system, layout: JointLayout, best: JointRefinement, hier, varying, shared, joint: JointProblem, free,
           known: Mapping[str, float], n_obs: Mapping[str, int],
           centred: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Step 4's centre and spread by variable name: the joint optimum and its standard errors; hierarchical
    parameters from the refined values: mu, sigma their log mean and sd, z[e] the standardised logs."""
    center, sd = {}, {}

    def se_or(name, value):
        s = best.stderr[best.names.index(name)] if name in best.names else np.nan
        return float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(value), 1e-3)

    for p in shared:
        center[p] = best.value(p)
        sd[p] = se_or(p, center[p])
    for j, e in enumerate(layout.experiments):
        for p in varying:
            if p not in layout.fixed[j]:
                n = varying_name(p, e)
                center[n] = best.value(n)
                sd[n] = se_or(n, center[n])
        for i in free[j]:
            s = system.states[i]
            n = f"x0[{s}][{e}]"
            center[x0_name(s, e)] = best.value(n)
            sd[x0_name(s, e)] = se_or(n, center[x0_name(s, e)])
    K = len(layout.experiments)
    for p in hier:
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
    for slot, model, v in zip(joint.noise_names, joint.models, best.noise_sd):
        if model == "poisson" or slot.split("[", 1)[0] in known:
            continue
        name = noise_variable(slot, model)
        center[name] = float(v)
        sd[name] = float(v) / np.sqrt(2 * n_obs[slot])
    return center, sd


def _noise_plan(noise, observations, observed: tuple[str, ...], given_sd) -> tuple[dict, dict] | None:
    """(model name by observed state, known parameter by state (NaN: estimated)), checked against every
    experiment's measurements (:func:`pgpgm.logscale.measurement_noise`); None when every state is Gaussian
    with no model object given (the plain path)."""
    if noise is None:
        return None
    if isinstance(noise, Mapping):
        bad = [s for s in noise if s not in observed]
        if bad:
            raise DataError(f"noise names {bad}, which are not observed states {list(observed)}")
    names: dict[str, str] = {}
    known: dict[str, float] = {}
    for obs in observations:
        spec = {s: v for s, v in noise.items() if s in obs.states} if isinstance(noise, Mapping) else noise
        sd = None if given_sd is None else [given_sd[s] for s in obs.states]
        plan = measurement_noise(spec, obs, sd, None)
        for m, s in enumerate(obs.states):
            names[s] = "normal" if plan is None else plan.names[m]
            known[s] = given_sd[s] if plan is None and given_sd is not None else (
                np.nan if plan is None else float(plan.known[m]))
    if all(n == "normal" for n in names.values()) and (isinstance(noise, str) or all(
            isinstance(v, str) for v in noise.values())):
        return None
    return {s: names[s] for s in observed}, {s: known[s] for s in observed}


def _check_known_start(study: Study, observations, models: Mapping[str, str]) -> None:
    """A state with a lognormal or count likelihood, measured at its experiment's first time where its known
    initial value is <= 0, has zero likelihood whatever the parameters: a DataError naming it."""
    for e, obs in zip(study.experiments, observations):
        for m, s in enumerate(obs.states):
            if models[s] != "normal" and s in e.x0 and e.x0[s] <= 0 and obs.mask[0, m]:
                raise DataError(f"experiment {e.name!r}: {s} is measured ({obs.values[0, m]:g}) at the first time "
                                f"{obs.times[0]:g}, where its known initial value is {e.x0[s]:g}: under {models[s]} "
                                "noise the prediction must be > 0 where a value is measured; mark that measurement "
                                "missing (NaN) or drop it (a pre-dose sample), or use noise='normal' for this state")


def _per_experiment(value, observed: tuple[str, ...]) -> tuple[str, ...]:
    """The observed states whose noise parameter is one per experiment (``noise_per_experiment``)."""
    if value is True:
        return tuple(observed)
    if value is False or value is None:
        return ()
    states = (value,) if isinstance(value, str) else tuple(value)
    bad = [s for s in states if s not in observed]
    if bad:
        raise DataError(f"noise_per_experiment names {bad}, which are not observed states {list(observed)}; give "
                        "True (every observed state), False, or some of them")
    return states


def _warn_competing(names: Sequence[str], fits: Sequence) -> None:
    """One :class:`CompetingOptimaWarning` for the experiments whose own fit found another optimum as good
    as its refined point (``FitResult.competing_optima``): which experiments, and which parameters appear
    exchanged there."""
    hit = [(n, r.competing_optima) for n, r in zip(names, fits) if not r.competing_optima.empty]
    if not hit:
        return
    swaps = sorted({x for _, table in hit for x in table["exchanged"] if x})
    what = (f"with {' or '.join(swaps)} exchanged" if swaps else "at another point")
    warnings.warn(f"in {len(hit)} of {len(fits)} experiments ({', '.join(n for n, _ in hit)}) the data fit about as "
                  f"well {what} as at the experiment's refined point: each experiment's estimate, the joint fit and "
                  "step 4 describe one of the optima, and experiments may sit on different ones; narrow the prior "
                  "box to the branch you mean (pgpgm.fit on one experiment lists them in result.competing_optima)",
                  CompetingOptimaWarning, stacklevel=3)


"""The problem a fit solves, every input checked before anything is compiled: :func:`prepare` (states measured
directly) and :func:`prepare_observables` (measured functions of the states) return a :class:`Prepared`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..checks import as_float_array, check_instance, noise_levels, per_state
from ..data import Observations, as_observations, initial_value_priors, initial_values, known_observed_x0
from ..errors import DataError, StartTimeWarning
from ..logscale import MeasurementNoise, Problem, Scales, measurement_noise, plan_scales
from ..observables import Observables, ScaledState
from ..petab import PetabProblem, load_petab
from ..posterior.petab_model import check_petab_priors
from ..refinement.multistart import MultiStart
from ..ode.system import ODESystem
from ..priors import Priors
from ..study.design import Study
from ..study.model import check_hierarchical
from .options import NUTS, FitOptions, Laplace


# ----------------------------------------------------------------------------- step results
@dataclass(frozen=True, eq=False)
class Prepared:
    """The problem a fit solves: ``full`` the system as given; ``system``, ``data``, ``obs``, ``x0`` those
    of the likelihood (fixed parameters substituted, lognormal states on the log scale); ``matching``
    the problem of steps 1-2 (the data as given or on the log scale); ``scales`` the log-scale plan
    (None: none); ``fixed`` the fixed parameters' values; ``priors`` and ``init`` without them;
    ``noise`` the measurement noise models of steps 3-4 (None: Gaussian throughout); with observables
    (``observables``, of the fitted system; ``observables_full`` of the full one; ``likelihood_priors``
    the priors of theta and phi) ``matching`` is None when no state is measured directly (steps 1-2
    skipped, :func:`refine_from_box`); ``scaled`` the observables affine in one state whose GP is on
    the measurement in steps 1-2 (:class:`~pgpgm.observables.ScaledState`; ``matching.system`` then
    has the measurement in the state's place, :meth:`~pgpgm.observables.Observables.matching_system`)."""

    full: ODESystem
    system: ODESystem
    data: Any
    obs: Observations
    x0: Any
    matching: Problem
    scales: Scales | None
    fixed: dict[str, float]
    priors: Any
    init: Any
    kernel: Any
    gamma: Any
    true_theta: Any
    noise: MeasurementNoise | None = None
    x0_observed: dict[str, float] | None = None
    observables: Observables | None = None
    observables_full: Observables | None = None
    likelihood_priors: Priors | None = None
    scaled: tuple[ScaledState, ...] = ()
    grid: np.ndarray | None = None

    @property
    def direct(self) -> tuple[str, ...]:
        """The states measured directly (the observed states; with observables, those of the identity
        observables, in the data's order)."""
        if self.observables is None:
            return tuple(self.obs.states)
        ident = self.observables.identity
        return tuple(ident[n] for n in self.obs.states if n in ident)

    @property
    def on_log_for_matching(self) -> bool:
        """Whether steps 1-2 work on another scale than the likelihood (``transform="log"``)."""
        return self.scales is not None and self.matching is not self.scales.likelihood


def prepare(system: ODESystem, data, observed, options: FitOptions, *, x0, noise, transform, fixed,
            true_theta, t0=None, x0_observed=None, observables=None) -> Prepared:
    """The problem :func:`pgpgm.fit` solves, every input checked: the observations on a grid that starts at
    ``t0`` (:func:`start_grid`), the known initial values of observed states split from ``x0``
    (:func:`~pgpgm.data.known_observed_x0`: held in steps 3-4), the log-scale plan, the fixed parameters
    substituted (see :func:`pgpgm.fit`); with ``observables`` (measured functions of the states),
    :func:`prepare_observables`'s. ``x0_observed``: known initial values of observed states as earlier
    releases took them (:func:`pgpgm.fit` warns that it is deprecated)."""
    check_instance(system, ODESystem, "system must be a pgpgm.ODESystem (e.g. pgpgm.load_model(name).system, "
                   "pgpgm.ODESystem.from_equations)")
    if observables is not None:
        return prepare_observables(system, data, observed, options, observables=observables, x0=x0, t0=t0,
                                   noise=noise, transform=transform, fixed=fixed, true_theta=true_theta,
                                   x0_observed=x0_observed)
    kernel, gamma, noise_sd = options.kernel, options.gamma, options.noise_sd
    obs = as_observations(data, observed, system, grid=options.grid)
    grid = start_grid(obs.times, options.grid, t0, x0)
    if grid is not options.grid:
        obs = as_observations(data, observed, system, grid=grid)
    x0, known = known_observed_x0(system, x0, obs.states)
    scales = plan_scales(system, data, observed, x0, noise_sd, noise, transform, grid=grid)  # None: no log scale
    measurement = measurement_noise(noise, obs, noise_sd, scales)  # None: Gaussian in steps 3-4
    _one_value_each(known, x0_observed)
    x0_observed = _known_observed_x0({**known, **(x0_observed or {})}, obs.states, scales) or None
    if scales is not None:  # fit the likelihood problem (lognormal states as log_<state>); scales.back maps back
        system, data, obs, x0 = (scales.likelihood.system, scales.likelihood.data, scales.likelihood.obs,
                                 scales.likelihood.x0)
    # the problem of the GP fit and gradient matching (steps 1-2): the data as given, or on the log scale
    gm = scales.matching if scales is not None else Problem(system, data, obs, x0, noise_sd)
    if scales is not None:  # per-state kernels and gammas by the matching problem's state names
        kernel, gamma = scales.matching_keys(kernel), scales.matching_keys(gamma)
    if measurement is not None and noise_sd is not None and "lognormal" in measurement.names:
        # the GP of steps 1-2 is on the data's scale: a lognormal sd (of log y) as sd * median y there
        sd = np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)).copy()
        for m, n in enumerate(measurement.names):
            if n == "lognormal" and gm.obs.states[m] == obs.states[m]:
                sd[m] *= float(np.nanmedian(np.abs(gm.obs.values[:, m])))
        gm = replace(gm, noise_sd=sd)
    initial_values(system, data, x0, system.index_of_states(obs.states))
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (system.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {system.n_parameters} finite numbers {list(system.parameters)}, "
                            f"got {true_theta!r}")
    full, fixed, priors, init = system, dict(fixed or {}), options.priors, options.init
    if fixed:  # fixed parameters become numbers in the equations: the fit runs on the others
        system = full.fix(fixed)
        gm = replace(gm, system=system if gm.system is full else gm.system.fix(fixed))
        fixed = {k: float(v) for k, v in fixed.items()}
        priors, init = _without_fixed(priors, init, fixed, full.parameters, system.parameters)
    Priors.from_user(system.parameters, priors)
    return _checked(Prepared(full, system, data, obs, x0, gm, scales, fixed, priors, init, kernel, gamma, true_theta,
                                     measurement, x0_observed, grid=grid))


# ----------------------------------------------------------------------------- observables
def prepare_observables(system: ODESystem, data, observed, options: FitOptions, *, observables, x0, noise, transform,
                        fixed, true_theta, t0=None, x0_observed=None) -> Prepared:
    """The problem :func:`fit` solves when the data measure ``observables`` (:mod:`pgpgm.observables`),
    every input checked before anything is compiled.

    Steps 3-4 fit the system extended by the observation parameters (``system``, ``full``) to the
    observables' data (``obs``, columns the observable names). Steps 1-2 (``matching``) fit a GP to each
    observable of :meth:`~pgpgm.observables.Observables.for_matching`: an identity observable (a state
    measured directly, the GP on that state) and an observable y = a * P + c affine in one state P with
    a scale a and an offset c of parameters (``s * P``, ``P / s``, ``s * P + b``: the GP on y; the
    matching system, :meth:`~pgpgm.observables.Observables.matching_system`, has the state y in P's
    place, and the parameters of a and c are sampled with theta, ``scaled``); every other state is
    latent. A sum or any other function of several states, or one not affine in its state, cannot be
    read as one state's values, so it enters at step 3. With no observable matched ``matching`` is
    None: steps 1-2 are skipped (:func:`refine_from_box`), which needs a (lower, upper) box for every
    parameter and unknown initial value and a step 4."""
    if transform is not None:
        raise DataError("transform is not available with observables (it puts states on the log scale, and "
                        "observables are functions of the states on their own scale); leave transform out - "
                        "noise={'<observable>': 'lognormal'} gives lognormal measurement noise on an observable")
    if x0_observed is not None:
        raise DataError("x0_observed is not available with observables; give known initial values of the states "
                        "in x0 (a state measured directly, by an identity observable, is then held there)")
    spec = Observables.parse(observables, system)
    measured = ODESystem.from_equations({n: "0" for n in spec.names}, [], name="the observables")
    if not (isinstance(data, xr.Dataset) or _is_table(data)):
        raise DataError("data must be a Dataset from pgpgm.simulate(..., observables=...), or a DataFrame/dict with "
                        "a 'time' column and one column per observable")
    columns = _data_columns(data)
    states_given = [c for c in columns if c in system.states]
    if states_given:
        raise DataError(f"with observables, data columns name observables; {states_given} are states: add an identity "
                        f"observable for each (e.g. observables={{'y_{states_given[0]}': '{states_given[0]}', ...}}) "
                        "and name the column after it")
    obs = as_observations(data, observed, measured, grid=options.grid)
    grid = start_grid(obs.times, options.grid, t0, x0)
    if grid is not options.grid:
        obs = as_observations(data, observed, measured, grid=grid)
    missing = [n for n in spec.names if n not in obs.states]
    if missing:
        raise DataError(f"observables {missing} have no data (data has {list(obs.states)}); give a column for each "
                        "observable or leave it out of observables")
    spec = Observables.parse({n: observables[n] for n in obs.states}, system)  # in the data's order
    ident = spec.identity
    direct = [n for n in obs.states if n in ident]
    twice = sorted({ident[n] for n in direct if [ident[k] for k in direct].count(ident[n]) > 1})
    if twice:
        raise DataError(f"states {twice} are each measured by several identity observables; give one column per state")
    noise_sd = options.noise_sd
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    measurement = measurement_noise(noise, obs, noise_sd, None)  # None: Gaussian on every observable
    x0, known = known_observed_x0(system, x0, [ident[n] for n in direct])  # held in steps 3-4
    if x0 is None and isinstance(data, xr.Dataset) and "x0" in data.attrs:
        x0 = np.asarray(data.attrs["x0"], float)
    full = spec.extend(system)
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (full.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {full.n_parameters} finite numbers {list(full.parameters)} (the "
                            f"parameters, then the observation parameters), got {true_theta!r}")
    fixed, priors, init = dict(fixed or {}), options.priors, options.init
    fit_system, gm_system, fit_spec = full, system, spec
    if fixed:
        fit_system = full.fix(fixed)  # checks the names (parameters and observation parameters) and values
        fixed = {k: float(v) for k, v in fixed.items()}
        gm_system = system.fix({k: v for k, v in fixed.items() if k in system.parameters})
        fit_spec = spec.fix(fixed)
    # the observables of steps 1-2: the identity ones and those affine in one state (the GP on y)
    matched = fit_spec.for_matching()[0]
    scaled = tuple(v for v in matched.values() if not v.identity)
    if not matched and options.posterior is None:
        raise DataError(f"no state is measured directly or as a * state + c (the observables {dict(spec.texts())} "
                        "are functions of several states, or not affine in their state), so steps 1-2 (a GP per observed state, "
                        "gradient matching) do not run and there are no chains to be the posterior: use "
                        "posterior='nuts' or 'laplace', or add an identity observable such as "
                        f"{{'y_{system.states[0]}': '{system.states[0]}'}} if a state is measured directly")
    cols = [obs.states.index(n) for n in matched]
    gm_names = [v.state if v.identity else v.observable for v in matched.values()]  # the matching system's states
    gm_sd = None
    if noise_sd is not None:  # the GP's sd, in the data's units (a lognormal sd of log y times the median y)
        sd = np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)).copy()
        if measurement is not None:
            for m, n in enumerate(measurement.names):
                if n == "lognormal":
                    sd[m] *= float(np.nanmedian(np.abs(obs.values[:, m])))
        gm_sd = sd[cols]
    if scaled:  # the states measured up to a scale: the measurement y is a state of steps 1-2, in P's place
        gm_system = fit_spec.matching_system(gm_system, scaled)
        names = [*gm_system.parameters, *gm_system.states, *(f"y_{g}" for g in gm_names)]  # step 2's variables
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise DataError(f"in steps 1-2 the observables {[v.observable for v in scaled]} are states beside the "
                            f"likelihood terms y_<state>, and {clash} would name two variables; rename the observable")
    gm_data = {"time": obs.times, **{g: obs.values[:, m] for g, m in zip(gm_names, cols)}}
    gm_obs = as_observations(gm_data, gm_names, gm_system, grid=obs.times) if matched else None
    theta_names = [p for p in fit_system.parameters if p in system.parameters]
    if fixed:
        priors, init = _without_fixed(priors, init, fixed, system.parameters, theta_names)
    likelihood_priors = Priors.from_user(fit_system.parameters, priors)
    if scaled and not isinstance(init, str):  # init gives theta: the sampled observation parameters start mid-box
        values = as_float_array(init, "init")
        if values.shape == (len(theta_names),):
            b = likelihood_priors.bounds
            mid = {p: (float(np.mean(b[k])) if b is not None and np.all(np.isfinite(b[k])) else 1.0)
                   for k, p in enumerate(fit_system.parameters)}
            init = np.concatenate([values, [mid[p] for p in gm_system.parameters[len(theta_names):]]])
    gm_priors = ({k: v for k, v in priors.items() if k in gm_system.parameters} if isinstance(priors, Mapping)
                 else priors)
    gm_x0 = x0
    if scaled and isinstance(x0, Mapping):  # a scaled state's initial value is no part of steps 1-2
        gm_x0 = {k: v for k, v in x0.items() if k not in {v_.state for v_ in scaled}}
    initial_values(gm_system, gm_data, gm_x0, gm_system.index_of_states(gm_obs.states) if matched else [])
    if scaled:  # the scaled states are latent in steps 3-4: a known initial value or a prior there
        initial_values(system, None, x0, system.index_of_states([ident[n] for n in direct]))
    if not matched:  # step 3 from the prior box: every box must be finite
        unbounded = [p for p, sp_ in zip(likelihood_priors.names, likelihood_priors.specs) if callable(sp_)]
        unbounded += [s for s, v in initial_value_priors(system, x0, []).items() if callable(v)]
        if unbounded:
            raise DataError(f"no state is measured directly or as a * state + c, so step 3 starts from points "
                            f"spread over the prior boxes; {unbounded} have no box: give them (lower, upper) priors")
    gm = Problem(gm_system, gm_data, gm_obs, gm_x0, gm_sd) if matched else None
    return _checked(Prepared(full, fit_system, data, obs, x0, gm, None, fixed, gm_priors, init, options.kernel, options.gamma,
                                     true_theta, measurement, known or None, fit_spec, spec, likelihood_priors,
                                     scaled, grid))


def _checked(prepared: Prepared) -> Prepared:
    """``prepared`` once a per-state ``kernel``/``gamma`` mapping names only steps 1-2's states (their values were
    checked where the options were built; the states are known only here)."""
    if prepared.matching is not None:
        for value, what in ((prepared.kernel, "kernel"), (prepared.gamma, "gamma")):
            per_state(value, prepared.matching.obs.states, what)
    return prepared


def _is_table(data) -> bool:
    import pandas as pd

    return isinstance(data, (pd.DataFrame, Mapping))


def _data_columns(data) -> list[str]:
    """The measured names of ``data`` (a simulated Dataset's ``observed``, a long table's ``state``
    values, a wide table's columns but ``time``)."""
    import pandas as pd

    if isinstance(data, xr.Dataset):
        return [str(v) for v in data["observed"].values] if "observed" in data.coords else []
    if isinstance(data, pd.DataFrame) and {"time", "state", "value"} <= set(data.columns):
        return [str(v) for v in pd.unique(data["state"])]
    return [str(k) for k in data if k != "time"]


def _without_fixed(priors, init, fixed: Mapping[str, float], parameters: Sequence[str], kept: Sequence[str]):
    """The user's ``priors`` (a mapping loses the fixed names) and ``init`` (an array over ``parameters``
    keeps the ``kept`` entries) once the ``fixed`` parameters are numbers in the equations."""
    if isinstance(priors, Mapping):
        priors = {k: v for k, v in priors.items() if k not in fixed}
    if not isinstance(init, str):
        values = as_float_array(init, "init")
        if values.shape == (len(parameters),):
            init = values[[list(parameters).index(p) for p in kept]]
    return priors, init


def _one_value_each(known: Mapping, x0_observed) -> None:
    """A state whose initial value ``x0`` and the deprecated ``x0_observed`` both give, differently: a DataError
    (neither would be held over the other without a word)."""
    if not isinstance(x0_observed, Mapping):
        return  # its type is refused by _known_observed_x0
    def same(a, b) -> bool:
        try:
            return bool(np.array_equal(np.asarray(a, float), np.asarray(b, float)))
        except (TypeError, ValueError):
            return False

    both = {s: (known[s], x0_observed[s]) for s in known if s in x0_observed and not same(known[s], x0_observed[s])}
    if both:
        raise DataError("x0 and x0_observed (deprecated) give different initial values of "
                        + ", ".join(f"{s} ({a!r} and {b!r})" for s, (a, b) in both.items())
                        + ": give each state's value once, in x0")


def _known_observed_x0(values, states, scales) -> dict[str, float]:
    """The known initial values of observed states (``x0``'s, and ``x0_observed``'s of earlier releases)
    checked: observed state -> a finite number, none of a state whose likelihood is on the log scale."""
    if not isinstance(values, Mapping):
        raise DataError(f"x0_observed must be a mapping observed state -> its known initial value, got {values!r}")
    unknown = [k for k in values if k not in states]
    if unknown:
        raise DataError(f"x0_observed names {unknown}, which are not observed states {list(states)}; give latent "
                        "states' initial values in x0")
    on_log = [k for k in values if scales is not None and k in scales.likelihood_scale.states]
    if on_log:
        raise DataError(f"x0 gives a known initial value of {on_log}, whose likelihood is on the log scale (lognormal "
                        "noise with transform='log'); give the measurement noise model alone "
                        "(noise={state: 'lognormal'}), or leave the initial value out to estimate it")
    out = {}
    logs = () if scales is None else scales.matching_scale.states
    for k, v in values.items():
        a = as_float_array(v, f"x0[{k}]")
        if a.size != 1 or not np.isfinite(a).all():
            raise DataError(f"x0[{k}] must be one finite number, got {v!r}")
        out[k] = float(a.reshape(-1)[0])
        if k in logs and not out[k] > 0:
            raise DataError(f"x0[{k}] = {out[k]:g} must be positive: state {k} is on the log scale (transform="
                            f"{{{k!r}: 'log'}}); give its positive initial value, or drop the log scale for {k}")
    return out


def start_grid(times: np.ndarray, grid, t0, x0) -> np.ndarray | None:
    """The grid of a fit that starts at ``t0``: ``grid`` (None: the observation grid ``times`` (N,)) with ``t0``
    before its first point, where the initial values apply; ``grid`` itself where ``t0`` is None or the first
    time. ``t0`` None (the default start, the first measured time) with known initial values in ``x0``
    (numbers) and a first time other than 0 gives a :class:`~pgpgm.errors.StartTimeWarning` that says so.

    Raises
    ------
    DataError
        ``t0`` not one finite number, or after the first time.
    """
    first = float(times[0])
    if t0 is None:
        given = x0.values() if isinstance(x0, Mapping) else [] if x0 is None else [0.0]
        if first != 0.0 and any(not (callable(v) or isinstance(v, tuple)) for v in given):
            warnings.warn(f"the known initial values of x0 hold at t0 = {first:g}, the first measured time (the "
                          "default start); give t0 (e.g. t0=0.0) if they hold at another time, such as a dose "
                          "before the first sample", StartTimeWarning, stacklevel=4)
        return grid
    a = as_float_array(t0, "t0")
    if a.size != 1 or not np.isfinite(a).all():
        raise DataError(f"t0 must be one finite number (the time the initial values hold at), got {t0!r}")
    t0 = float(a.reshape(-1)[0])
    if t0 > first:
        raise DataError(f"t0 = {t0:g} is after the first measured time {first:g}: the start must come before every "
                        "measurement (the default start is the first measured time)")
    if t0 == first:
        return grid
    return np.union1d(times if grid is None else np.asarray(grid, float), [t0])


# ----------------------------------------------------------------------------- studies
@dataclass(frozen=True, eq=False)
class StudyDesign:
    """The problem :func:`pgpgm.fit_study` solves, every input checked: ``observations`` (K,) each experiment's
    :class:`~pgpgm.data.Observations`; ``observed`` the observed states of any experiment, in order; ``prior``
    the parameters' priors; ``given_sd`` the known noise sd by observed state (None: estimated); ``plan`` the
    measurement noise models, (model name by state, known parameter by state, NaN where estimated), or None
    (Gaussian throughout); ``noise`` the ``noise`` argument as given (each experiment's steps 1-3 take its own
    states' part); ``per_experiment`` the states with one noise parameter per experiment; ``varying`` and
    ``hierarchical`` (parameter -> population kind) the parameters with a value per experiment;
    ``population_priors`` and ``centred`` the hierarchical parameters' form in step 4."""

    system: ODESystem
    study: Study
    observations: tuple[Observations, ...]
    observed: tuple[str, ...]
    prior: Priors
    given_sd: dict[str, float] | None
    plan: tuple[dict, dict] | None
    noise: Any
    per_experiment: tuple[str, ...]
    varying: tuple[str, ...]
    hierarchical: dict[str, str]
    population_priors: Mapping[str, Any] | None
    centred: bool

    def experiment_noise(self, j: int) -> tuple[Any, list[float] | None]:
        """(``noise``, ``noise_sd``) of experiment ``j``'s own fit: the noise models and known sds of its
        observed states."""
        states = self.observations[j].states
        noise = ({s: v for s, v in self.noise.items() if s in states} if isinstance(self.noise, Mapping)
                 else self.noise)
        return noise, self.given_sd and [self.given_sd[s] for s in states]


def prepare_study(system: ODESystem, study: Study, options: FitOptions, *, varying, hierarchical, population_priors,
                  centred: bool, noise, noise_per_experiment) -> StudyDesign:
    """The problem :func:`pgpgm.fit_study` solves (:class:`StudyDesign`), every input checked before anything
    is compiled (see :func:`pgpgm.fit_study`)."""
    check_instance(system, ODESystem, "system must be a pgpgm.ODESystem (e.g. pgpgm.load_model(name).system)")
    check_instance(study, Study, "study must be a pgpgm.Study (Study.from_tidy / Study.from_mapping)")
    if isinstance(options.posterior, Laplace):
        raise DataError("a study's step 4 is NUTS on the joint model: posterior must be 'nuts', pgpgm.NUTS(...) or None")
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
    prior = Priors.from_user(system.parameters, options.priors)
    given_sd = _study_noise_sd(options.noise_sd, observed)
    plan = _noise_plan(noise, observations, observed, given_sd)  # None: Gaussian throughout (the plain path)
    if plan is not None:
        _check_known_start(study, observations, plan[0])
    return StudyDesign(system, study, tuple(observations), observed, prior, given_sd, plan, noise,
                       _per_experiment(noise_per_experiment, observed), varying, hier, population_priors, bool(centred))


def _study_noise_sd(noise_sd, observed: tuple[str, ...]) -> dict[str, float] | None:
    """A study's known noise sds by observed state (one number for all, or a mapping naming each), checked."""
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
    if all(n == "normal" for n in names.values()) and (isinstance(noise, str) or isinstance(noise, Mapping) and all(
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


# ----------------------------------------------------------------------------- PEtab problems
@dataclass(frozen=True, eq=False)
class PetabDesign:
    """The PEtab problem :func:`pgpgm.fit_petab` solves: ``problem``; ``lower``, ``upper`` (V_e,) its estimated
    parameters' bounds on their scales; ``search`` the settings of step 3's search; ``normal`` whether every
    observable has normal noise (step 3 then fits by least squares, the noise parameters' log terms among the
    residuals)."""

    problem: PetabProblem
    lower: np.ndarray
    upper: np.ndarray
    search: MultiStart
    normal: bool


def prepare_petab(problem, options: FitOptions, search) -> PetabDesign:
    """The PEtab problem of :func:`pgpgm.fit_petab` (a :class:`~pgpgm.petab.PetabProblem` or its YAML file's
    path), checked before anything is solved: a box for the search, priors step 4 can write."""
    if isinstance(problem, str | Path):
        problem = load_petab(problem)
    check_instance(problem, PetabProblem,
                   "problem must be a pgpgm.PetabProblem (pgpgm.load_petab(path)) or the path of its YAML file")
    check_instance(search, MultiStart, "search must be a pgpgm.MultiStart(...)")
    if isinstance(options.posterior, NUTS):
        check_petab_priors(problem)
    lower, upper = problem.bounds()
    open_ = [p.id for p, lo, hi in zip(problem.estimated, lower, upper) if not (np.isfinite(lo) and np.isfinite(hi))]
    if open_:
        raise DataError(f"the search starts from points spread over the estimated parameters' bounds; {open_} have "
                        "no finite lowerBound and upperBound (on their scales): give them in the parameter table")
    if not problem.estimated:
        raise DataError("the problem estimates no parameter (the parameter table's estimate column is 0 everywhere)")
    return PetabDesign(problem, lower, upper, search, all(o.distribution == "normal" for o in problem.observables))

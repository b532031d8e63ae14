"""Measurement noise models and log-scale states in :func:`pgpgm.fit`.

``fit(..., noise={"P": "lognormal"})`` (or ``"poisson"``, ``"negbin"``; ``"normal"`` the default)
names the MEASUREMENT noise model of each observed state (:mod:`pgpgm.noise`): the refinement and
step 4 use its likelihood, the state itself stays on its own scale (it may start at 0 or pass near
0), and the GP and gradient matching (steps 1-2, which only find the basin) run on the data as
given with the GP's Gaussian noise. :func:`measurement_noise` checks it (every measurement of a
state against its model, before any compilation) and says which states leave the Gaussian path.

``fit(..., noise={"P": "lognormal"}, transform={"P": "log"})`` puts the state P itself on the log
scale in every step (the likelihood is the same lognormal one, so the optimum is the same wherever
the state stays positive):
the system is log-transformed
(:func:`pgpgm.ode.transform.log_transform`, state ``log_P``), the GP is fitted to log y,
gradient matching runs on the transformed system, the refinement minimises the Gaussian
negative log likelihood of log y (the lognormal one up to the constant sum(log y)), and
step 4 puts a Normal likelihood on log y (the posterior is the lognormal model's: the
Jacobian of y -> log y does not depend on the unknowns).

``fit(..., transform={"P": "log"})`` keeps the Gaussian noise of P but fits the GP and runs
gradient matching on log P (useful for positive states spanning orders of magnitude);
refinement and step 4 use the Gaussian likelihood of y on the original scale.

This module holds the pre-step (:func:`plan_scales`: validate ``noise`` and ``transform``
and build the two transformed problems) and the post-step (:meth:`Scales.back`: the
result on the original scale). Results: theta is the same on both scales; initial values,
trajectories, data and figures are on the original scale; noise sds of lognormal states
are on the log scale (``result.trajectories["noise_sd"]``; in step 4's posterior they are
``sigma_log_<state>``); the gradient-matching chains and step 4's posterior keep the
transformed state names (``log_P``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from . import noise as noise_models
from .data import Observations, as_observations
from .errors import DataError
from .ode.system import ODESystem
from .ode.transform import LogScale
from .fit_result import FitResult

#: the names of the noise models ``noise=...`` takes (:data:`pgpgm.noise.NOISE_MODELS`)
NOISE_MODELS = tuple(noise_models.NOISE_MODELS)
_NOISE_CLASSES = tuple(noise_models.NOISE_MODELS.values())
TRANSFORMS = ("log", "none")


@dataclass(frozen=True, eq=False)
class Problem:
    """One fitting problem: system, data (as given to fit), observations, initial values, noise sds."""

    system: ODESystem
    data: object
    obs: Observations
    x0: object
    noise_sd: object


@dataclass(frozen=True, eq=False)
class Scales:
    """The likelihood problem (lognormal states on the log scale) and the matching problem
    (lognormal and ``transform="log"`` states on the log scale) of one fit.

    Attributes
    ----------
    noise : observed state -> its noise model's name
    likelihood_scale, matching_scale : LogScale of each problem
    likelihood, matching : the problems (see :class:`Problem`)
    original : the problem as given
    """

    noise: Mapping[str, str]
    likelihood_scale: LogScale
    matching_scale: LogScale
    likelihood: Problem
    matching: Problem
    original: Problem

    def matching_keys(self, value):
        """A per-state setting (mapping state -> value) keyed by the matching problem's state
        names (``log_<state>``); anything else unchanged."""
        if not isinstance(value, Mapping):
            return value
        return {self.matching_scale.name(k) if isinstance(k, str) else k: v for k, v in value.items()}

    def matching_to_likelihood(self, x0, noise_sd) -> tuple[np.ndarray, np.ndarray]:
        """The sampling step's initial values (S,) and noise sds (M,) on the likelihood's scale.

        A state on the log scale for matching only gets x0 = e^u and sd ~ sd_log * median|y|
        (the delta method; only the refinement's start when the sds are estimated)."""
        x = self.matching_scale.to_original(np.asarray(x0, float))
        x = self.likelihood_scale.to_log(x)
        sd = np.array(noise_sd, dtype=float)
        only = [m for m, s in enumerate(self.original.obs.states)
                if s in self.matching_scale.states and s not in self.likelihood_scale.states]
        for m in only:
            sd[m] = sd[m] * float(np.nanmedian(np.abs(self.original.obs.values[:, m])))
        return x, sd

    def back(self, result):
        """The :class:`~pgpgm.FitResult` of the likelihood problem on the original scale.

        Initial values, trajectories and data on the original scale with the original
        state names; ``refinement_nll`` and ``nll_per_start`` become the lognormal negative
        log likelihoods of the data (+ sum of log y over lognormal states); the noise sds
        stay as fitted (log scale for lognormal states, named in the attributes).
        """
        scale, system = self.likelihood_scale, self.original.system
        lognormal = [s for s in self.original.obs.states if s in scale.states]  # lognormal on the log scale
        y = self.original.obs.values
        jac = float(np.sum([np.nansum(np.log(y[:, m])) for m, s in enumerate(self.original.obs.states)
                            if s in lognormal]))
        attrs = {"noise": json.dumps(dict(self.noise)), "log_scale_matching": ", ".join(self.matching_scale.states),
                 "log_scale_likelihood": ", ".join(scale.states)}
        est = result.estimates.copy()
        x0 = scale.to_original(est["x0"].values)
        if "x0_stderr" in est:  # delta method: se(x) = x se(log x) for a state on the log scale
            est["x0_stderr"] = ("state", np.where(np.isin(np.arange(x0.size), scale.index),
                                                  x0 * est["x0_stderr"].values, est["x0_stderr"].values))
        est["x0"] = ("state", x0)
        est = est.assign_coords(state=list(system.states))
        est["nll_per_start"] = est["nll_per_start"] + jac
        est.attrs = {**est.attrs, "refinement_nll": est.attrs["refinement_nll"] + jac, **attrs}
        traj = result.trajectories.copy()
        traj["x"] = traj["x"].copy(data=scale.to_original(traj["x"].values))
        traj = traj.assign_coords(state=list(system.states), observed=list(self.original.obs.states))
        traj["y"] = traj["y"].copy(data=y)
        traj["noise_sd"].attrs["scale"] = "; ".join(f"{s}: {'log' if s in lognormal else 'state units'}"
                                                    for s in self.original.obs.states)
        traj["noise_sd_gp"].attrs["scale"] = "; ".join(
            f"{s}: {'log' if s in self.matching_scale.states else 'state units'}" for s in self.original.obs.states)
        traj.attrs = {**traj.attrs, **attrs}
        return FitResult(system, result.posterior, est, traj, result.timings, result.n_ode_solves,
                         result.gradient_matching, result.diagnostics)


def per_state(value, what: str, allowed: Sequence[str], states: Sequence[str], default: str) -> dict[str, str]:
    """``value`` (None, one mode for every state, or a mapping state -> mode) as a full mapping."""
    if value is None:
        return dict.fromkeys(states, default)
    if what == "noise" and isinstance(value, _NOISE_CLASSES):
        return dict.fromkeys(states, value)
    if isinstance(value, str):
        if value not in allowed:
            raise DataError(f"{what} must be one of {list(allowed)} or a mapping state -> one of them, got {value!r}")
        return dict.fromkeys(states, value)
    if not isinstance(value, Mapping):
        raise DataError(f"{what} must be a mapping state -> one of {list(allowed)}, got {type(value).__name__}")
    unknown = [k for k in value if k not in states]
    if unknown:
        raise DataError(f"{what} names {unknown}, which are not among the states it applies to {list(states)}")
    bad = {k: v for k, v in value.items()
           if not (v in allowed if isinstance(v, str) else what == "noise" and isinstance(v, _NOISE_CLASSES))}
    if bad:
        raise DataError(f"{what} for {list(bad)} must be one of {list(allowed)}, got {list(bad.values())}")
    return {s: value.get(s, default) for s in states}


def plan_scales(system: ODESystem, data, observed, x0, noise_sd, noise, transform, *, grid=None) -> Scales | None:
    """Validate ``noise`` and ``transform`` of :func:`pgpgm.fit` and build the problems on the log scale.

    Parameters
    ----------
    noise : None, a name of :data:`NOISE_MODELS` for every observed state, or a mapping
        observed state -> one of them or a :mod:`pgpgm.noise` object (default ``"normal"``);
        only a lognormal state with ``transform`` ``"log"`` is on the likelihood's log scale
    transform : None or a mapping state (observed or latent) -> ``"log"`` or ``"none"``
    (the other arguments, ``grid`` included, as given to :func:`pgpgm.fit`)

    Returns
    -------
    Scales, or None when every state stays on its own scale (the plain fit).

    Raises
    ------
    DataError : for unknown state names or modes, values <= 0 of a state on the log scale
        (naming the state and rows), and priors for x0 of such a state.
    """
    if noise is None and transform is None:
        return None
    obs = as_observations(data, observed, system, grid=grid)
    noise = {s: model_name(v) for s, v in per_state(noise, "noise", NOISE_MODELS, obs.states, "normal").items()}
    trans = per_state(transform, "transform", TRANSFORMS, system.states, "none")
    # lognormal noise puts a state on the log scale only with transform "log" (the state itself)
    lognormal = tuple(s for s in obs.states if noise[s] == "lognormal" and trans[s] == "log")
    logs = tuple(s for s in system.states if s in lognormal or trans[s] == "log")
    if not logs:
        return None
    original = Problem(system, data, obs, x0, noise_sd)
    lik = LogScale(system, lognormal)
    match = lik if set(logs) == set(lognormal) else LogScale(system, logs)
    likelihood = _problem(lik, original, grid)
    if match is lik:
        matching = likelihood
    else:
        matching = _problem(match, original, grid)
        if noise_sd is not None:  # state units for the "normal" states only on the log scale here: sd / median|y|
            sd = np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)).copy()
            for m, s in enumerate(obs.states):
                if s in match.states and s not in lik.states:
                    sd[m] = sd[m] / float(np.nanmedian(np.abs(obs.values[:, m])))
            matching = replace(matching, noise_sd=sd)
    return Scales(noise, lik, match, likelihood, matching, original)


def _problem(scale: LogScale, original: Problem, grid) -> Problem:
    if not scale.states:
        return original
    data, observed = scale.data_to_log(original.data, list(original.obs.states))
    x0 = scale.x0_to_log(original.x0)
    return Problem(scale.system, data, as_observations(data, observed, scale.system, grid=grid), x0, original.noise_sd)


def model_name(spec) -> str:
    """The name of a noise spec: a name of :data:`NOISE_MODELS` or a :mod:`pgpgm.noise` object."""
    return spec if isinstance(spec, str) else spec.name


@dataclass(frozen=True)
class MeasurementNoise:
    """The measurement noise models of the observed states of the likelihood problem, in ``obs.states``
    order (M,) - a state on the likelihood's log scale (lognormal with ``transform="log"``) counts as
    Gaussian on log y there.

    Attributes
    ----------
    names : (M,) noise model names (:data:`NOISE_MODELS`)
    known : (M,) the noise parameter given by the user (sd for normal/lognormal - lognormal on the log
        scale -, alpha for negbin; NaN where it is to be estimated, and for Poisson, which has none)
    """

    names: tuple[str, ...]
    known: np.ndarray

    @property
    def estimated(self) -> np.ndarray:
        """(M,) bool: which states have a noise parameter to estimate."""
        return np.array([n != "poisson" for n in self.names]) & ~np.isfinite(self.known)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """(M,) the name of each state's noise parameter: ``"sd"``, ``"alpha"`` or ``""`` (Poisson)."""
        return tuple({"poisson": "", "negbin": "alpha"}.get(n, "sd") for n in self.names)

    def models(self, params) -> tuple:
        """(M,) :mod:`pgpgm.noise` objects with the parameters ``params`` (M,) (ignored for Poisson)."""
        return tuple(noise_models.noise_model(n, **({k: float(v)} if k else {}))
                     for n, k, v in zip(self.names, self.parameter_names, np.asarray(params, float)))


def measurement_noise(noise, obs: Observations, noise_sd, scales: Scales | None) -> MeasurementNoise | None:
    """Check the measurement noise models of :func:`pgpgm.fit` against the data, before any compilation.

    Parameters
    ----------
    noise : as :func:`plan_scales` takes it
    obs : the observations as given (original scale)
    noise_sd : the user's ``noise_sd`` (None, a scalar or (M,)): the known sds of the normal and
        lognormal states (lognormal: of log y)
    scales : :func:`plan_scales`'s plan (None: none)

    Returns
    -------
    MeasurementNoise, or None when every observed state has Gaussian noise on the likelihood's scale
    (the plain path, unchanged).

    Raises
    ------
    DataError : for an unknown model name, a measurement its model cannot explain (counts that are
        negative or not whole numbers, values <= 0 under lognormal noise), naming state and index.
    """
    if noise is None:
        return None
    spec = per_state(noise, "noise", NOISE_MODELS, obs.states, "normal")
    on_log = set(scales.likelihood_scale.states) if scales is not None else set()
    names, known = [], np.full(len(obs.states), np.nan)
    given = (None if noise_sd is None else
             np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)))
    for m, s in enumerate(obs.states):
        name = "normal" if s in on_log else model_name(spec[s])
        names.append(name)
        if s not in on_log:
            _probe(name).check(obs.values[:, m], name=f"measurements of {s} (noise {name!r})")
        if name == "negbin" and not isinstance(spec[s], str):
            known[m] = spec[s].alpha
        elif name in ("normal", "lognormal"):
            if not isinstance(spec[s], str):  # a lognormal object's sd is of log y on either path
                known[m] = spec[s].sd
            elif given is not None:
                known[m] = given[m]
    if all(n == "normal" for n in names) and all(isinstance(v, str) for v in spec.values()):
        return None
    return MeasurementNoise(tuple(names), known)


def _probe(name: str):
    """A noise model of this name with a placeholder parameter (its ``check`` does not use it)."""
    param = {"normal": "sd", "lognormal": "sd", "negbin": "alpha"}.get(name)
    return noise_models.noise_model(name, **({param: 1.0} if param else {}))

"""Simulated data sets: true trajectories plus noisy observations of chosen states."""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from .checks import as_float_array, check_times
from .errors import DataError
from .logscale import NOISE_MODELS, model_name, per_state
from .observables import Observables
from .ode.system import ODESystem
from .solve import Integrator, Solver


def simulate(
    system: ODESystem,
    theta,
    x0,
    times,
    *,
    observed: Sequence[str] | None = None,
    noise_sd: float | Sequence[float] | None = None,
    snr: float | None = None,
    seed: int | np.random.Generator | None = None,
    solver: Solver | None = None,
    missing: float = 0.0,
    noise: str | Mapping[str, str] | None = None,
    alpha: float | Sequence[float] | None = None,
    observables: Mapping[str, str] | None = None,
) -> xr.Dataset:
    """Integrate the system and add noise to the observed states: Gaussian (additive) or
    lognormal (multiplicative).

    Parameters
    ----------
    system : ODESystem
    theta : array (P,)
    x0 : array (S,), the state at the first time
    times : array (N,), strictly increasing: every observed state measured at every time; or
        a mapping ``{state: times}`` giving each observed state its own observation times
        (the Dataset's ``time`` is then their union, with NaN in ``y`` where a state is not
        measured; states not in the mapping are measured at every time of the union)
    observed : names of the measured states (default: all)
    noise_sd : noise standard deviation, scalar or one per observed state (state units)
    snr : signal-to-noise ratio instead of ``noise_sd``: per observed state the noise
        variance is mean(signal^2) / snr
    seed : seed or Generator for the noise
    solver : the ODE solver (default :func:`pgpgm.default_solver`)
    missing : fraction in [0, 1) of each observed state's measurements dropped at random
        (set to NaN in ``y``; round(missing * K) of its K values, drawn with ``seed`` after the
        noise, so the kept values equal those of ``missing=0``)
    noise : ``"normal"`` (default: y = x + sd e), ``"lognormal"`` (y = x exp(sd e): ``noise_sd``
        on the log scale, every measured value of the state positive) for every observed
        state, or a mapping observed state -> one of them; e standard normal; ``"poisson"``
        (y ~ Poisson(x)) or ``"negbin"`` (y ~ NB(mu = x, alpha), Var y = x + x^2/alpha: PyMC's
        ``pm.NegativeBinomial``) for counts (drawn after the Gaussian noise of the other states,
        whose values are those of a draw without count states; ``noise_sd`` may be omitted when
        every observed state is a count; the Dataset's ``noise_sd`` is NaN for count states). Fit
        such data with ``pgpgm.fit(..., noise=...)`` and the same names.
    alpha : the dispersion of the ``"negbin"`` states: one number or one per negbin state
    observables : ``{name: expression}`` (:mod:`pgpgm.observables`): measure these functions of the
        states instead of the states; ``observed``, ``times``, ``noise_sd``, ``noise`` then name
        observables, and ``theta`` (P + F,) holds the system's parameters followed by the observation
        parameters (``Observables.parse(observables, system).parameters``). Fit the data with
        ``pgpgm.fit(..., observables=...)`` and the same mapping.

    Returns
    -------
    xarray.Dataset
        ``truth`` (time, state): the noise-free trajectories; ``y`` (time, observed):
        the observations (NaN where not measured); ``noise_sd`` (observed; log scale for
        lognormal states). Attributes record theta, x0, the system, the seed and the noise
        model of each observed state (``noise``, in the order of ``observed``).
    """
    # input checks, before any solve
    meas = None if observables is None else Observables.parse(observables, system)
    names = system.states if meas is None else meas.names
    observed = list(names if observed is None else [observed] if isinstance(observed, str) else observed)
    if not observed or not all(isinstance(s, str) for s in observed):
        raise DataError(f"observed must be a state name or a non-empty list of state names, got {observed!r}")
    if meas is None:
        idx = system.index_of_states(observed)
    else:
        unknown = [o for o in observed if o not in meas.names]
        if unknown or len(set(observed)) != len(observed):
            raise DataError(f"observed must name distinct observables of {list(meas.names)}, got {observed}")
        idx = [meas.names.index(o) for o in observed]
    n_theta = system.n_parameters if meas is None else len(meas.parameters)
    models = {s: model_name(v) for s, v in per_state(noise, "noise", NOISE_MODELS, observed, "normal").items()}
    lognormal = np.array([models[s] == "lognormal" for s in observed])
    counts = np.array([models[s] in ("poisson", "negbin") for s in observed])
    negbin = [s for s in observed if models[s] == "negbin"]
    if negbin:
        alpha_ = as_float_array(1.0 if alpha is None else alpha, "alpha")
        if alpha is None or alpha_.ndim > 1 or alpha_.size not in (1, len(negbin)) or not np.all(
                np.isfinite(alpha_) & (alpha_ > 0)):
            raise DataError(f"negative-binomial noise of {negbin} needs alpha: one positive number or one per "
                            f"negbin state (Var y = mu + mu^2/alpha), got {alpha!r}")
    if counts.all() and noise_sd is None and snr is None:
        noise_sd = 0.0  # counts carry their own noise
    if (noise_sd is None) == (snr is None):
        raise DataError("give exactly one of noise_sd or snr")
    if snr is not None and lognormal.any():
        raise DataError("snr sets additive noise; for lognormal states give noise_sd (the sd of log y), "
                        f"e.g. noise_sd=0.1 for about 10 % error (lognormal: {list(np.array(observed)[lognormal])})")
    theta_ = as_float_array(theta, "theta")
    if theta_.shape != (n_theta,) or not np.all(np.isfinite(theta_)):
        raise DataError(f"theta must be {n_theta} finite numbers "
                        f"{list(system.parameters if meas is None else meas.parameters)}, got shape {theta_.shape}")
    x0_ = as_float_array(x0, "x0")
    if x0_.shape != (system.n_states,) or not np.all(np.isfinite(x0_)):
        raise DataError(f"x0 must be {system.n_states} finite numbers {list(system.states)}, got shape {x0_.shape}")
    own_times = None
    if isinstance(times, Mapping):
        unknown = [k for k in times if k not in observed]
        if unknown:
            raise DataError(f"times given for {unknown}, which are not observed states {observed}")
        own_times = {k: check_times(v, name=f"times of {k}") for k, v in times.items()}
        times = np.unique(np.concatenate(list(own_times.values())))
    times = check_times(times)
    miss = as_float_array(missing, "missing")
    if miss.ndim != 0 or not (0 <= miss < 1):
        raise DataError(f"missing must be a fraction in [0, 1), got {missing!r}")
    if snr is not None:
        snr = as_float_array(snr, "snr")
        if snr.ndim != 0 or not (np.isfinite(snr) and snr > 0):
            raise DataError(f"snr must be one positive, finite number, got {snr.tolist()}")
    if noise_sd is not None:
        nsd = as_float_array(noise_sd, "noise_sd")
        if nsd.ndim > 1 or nsd.size not in (1, len(idx)):
            raise DataError(f"noise_sd must be one number or {len(idx)} (one per observed state), "
                            f"got shape {nsd.shape}")
        if np.any(~np.isfinite(nsd)) or np.any(nsd < 0):
            raise DataError(f"noise_sd must be finite and non-negative, got {nsd.tolist()}")
    if not (seed is None or isinstance(seed, np.random.Generator)
            or (isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)) and seed >= 0)):
        raise DataError(f"seed must be a whole number >= 0, a numpy Generator or None, got {seed!r}")
    truth = Integrator(system, times, solver).solve(theta_[:system.n_parameters], x0)
    signal = truth[:, idx] if meas is None else meas.values(times, truth, theta_)[:, idx]
    if snr is not None:
        if not snr > 0:
            raise DataError(f"snr must be positive, got {snr}")
        sd = np.sqrt(np.mean(signal**2, axis=0) / snr)
    else:
        sd = np.broadcast_to(np.asarray(noise_sd, dtype=float), (len(idx),)).copy()
        if np.any(~np.isfinite(sd)) or np.any(sd < 0):
            raise DataError(f"noise_sd must be finite and non-negative, got {noise_sd}")
    measured = np.ones(signal.shape, bool)
    if own_times is not None:
        for m, s in enumerate(observed):
            if s in own_times:
                measured[:, m] = np.isin(times, own_times[s])
    bad = [s for m, s in enumerate(observed) if lognormal[m] and not np.all(signal[measured[:, m], m] > 0)]
    if bad:
        raise DataError(f"lognormal noise needs a positive signal, but {bad} reach values <= 0 at their measurement "
                        "times; use noise='normal' for them")
    bad = [s for m, s in enumerate(observed) if counts[m] and not np.all(signal[measured[:, m], m] > 0)]
    if bad:
        raise DataError(f"count noise needs a positive mean, but {bad} reach values <= 0 at their measurement "
                        "times; use noise='normal' for them")
    rng = np.random.default_rng(seed)
    e = rng.normal(size=signal.shape) * sd
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.where(lognormal, signal * np.exp(e), signal + e)
    if counts.any():  # drawn after the Gaussian ones: Gaussian and lognormal states keep their values
        alphas = (dict(zip(negbin, np.broadcast_to(as_float_array(alpha, "alpha").reshape(-1), (len(negbin),))))
                  if negbin else {})
        for m, s in enumerate(observed):
            mu = np.where(measured[:, m], signal[:, m], 1.0)
            if models[s] == "poisson":
                y[:, m] = rng.poisson(mu)
            elif models[s] == "negbin":  # PyMC's NB(mu, alpha) = Poisson(Gamma(alpha, scale mu/alpha))
                y[:, m] = rng.poisson(rng.gamma(alphas[s], mu / alphas[s]))
        sd = np.where(counts, np.nan, sd)
    y[~measured] = np.nan
    if miss > 0:
        for m in range(len(idx)):
            have = np.flatnonzero(np.isfinite(y[:, m]))
            y[rng.choice(have, int(round(float(miss) * have.size)), replace=False), m] = np.nan
    return xr.Dataset(
        {
            "truth": (("time", "state"), truth),
            "y": (("time", "observed"), y),
            "noise_sd": (("observed",), sd),
        },
        coords={"time": np.asarray(times, float), "state": list(system.states), "observed": observed},
        attrs={
            "system": system.name,
            "theta": np.asarray(theta, float).tolist(),
            "parameters": list(system.parameters if meas is None else meas.parameters),
            "x0": np.asarray(x0, float).tolist(),
            "seed": seed if isinstance(seed, int) else -1,
            "snr": -1.0 if snr is None else float(snr),
            "missing": float(miss),
            "noise": [models[s] for s in observed],
            **({} if meas is None else {"observables": json.dumps(meas.texts())}),
        },
    )

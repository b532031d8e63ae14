"""Measurement noise models: the likelihood of measured values ``y`` given the model's prediction ``mu``.

A leaf module (numpy, scipy, PyTensor/PyMC and :mod:`pgpgm.errors` only). One small immutable object
per likelihood, each vectorised over the measurements of one observed quantity (arrays of shape (N,)):

=====================  =========================================  ==========================================
model                  distribution of a measured ``y``            parameters
=====================  =========================================  ==========================================
``Normal(sd)``          y ~ N(mu, sd^2)                             sd > 0, in the units of y
``LogNormal(sd)``       log y ~ N(log mu, sd^2)  (y > 0)            sd > 0, on the log scale (~ relative error)
``Poisson()``           y ~ Poisson(mu)          (y = 0, 1, 2, ...)  none
``NegativeBinomial``    y ~ NB(mu, alpha): Var y = mu + mu^2/alpha  alpha > 0 (PyMC's ``pm.NegativeBinomial(mu,
                                                                    alpha)``; scipy's ``nbinom(n=alpha,
                                                                    p=alpha/(alpha+mu))``)
=====================  =========================================  ==========================================

The noise model is about the MEASURED value, not about the state: lognormal noise on a state that
starts at 0 (a concentration after an oral dose) is fine wherever that state is not measured or is
measured positive; ``mu = 0`` is allowed where ``y`` is missing (NaN). Missing values (NaN) are
allowed everywhere and contribute nothing.

Each model offers
- ``check(y, name)``: the measurements as a float array (N,), or a :class:`~pgpgm.errors.DataError`
  naming ``name`` and saying what to do;
- ``nll(y, mu)``: the negative log-likelihood, ``-sum(scipy.stats.<dist>.logpdf/logpmf)`` over the
  measured entries; ``nll_saturated(y)``: its value at ``mu = y`` (its minimum over ``mu``);
- ``residuals(y, mu)`` (N,) with ``0.5 * sum(r**2) == nll(y, mu) - nll_saturated(y)`` (deviance
  residuals for counts) and ``d_residuals_d_mu(y, mu)`` (N,), the diagonal Jacobian dr_i/dmu_i, both
  0 at missing entries;
- ``logp(y, mu, **params)``: the log-likelihood as a PyTensor scalar for a PyTensor ``mu`` (N,)
  (``pm.logp`` of the PyMC distribution, summed over the measured entries); a parameter may be
  given as a PyTensor variable to sample it;
- ``gp_transform(y)``, ``gp_inverse(z)`` and ``gp_noise_sd(z)``: a transform under which the noise is
  roughly Gaussian with a known sd, for the GP of steps 1-2 (log for lognormal, a variance-stabilising
  square-root/asinh transform for counts).

``NOISE_MODELS`` maps the names used in ``noise=...`` to the classes; :func:`noise_model` builds one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy import special

from .errors import DataError

__all__ = ["NOISE_MODELS", "LogNormal", "NegativeBinomial", "NoiseModel", "Normal", "Poisson", "noise_model"]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: Anscombe's shift of the square-root transform of counts.
_ANSCOMBE = 3.0 / 8.0


class NoiseModel(Protocol):
    """What every noise model offers (see the module docstring)."""

    name: ClassVar[str]
    is_count: ClassVar[bool]

    def check(self, y, name: str = "y") -> np.ndarray: ...
    def nll(self, y, mu) -> float: ...
    def nll_saturated(self, y) -> float: ...
    def residuals(self, y, mu) -> np.ndarray: ...
    def d_residuals_d_mu(self, y, mu) -> np.ndarray: ...
    def logp(self, y, mu, **params) -> pt.TensorVariable: ...
    def gp_transform(self, y) -> np.ndarray: ...
    def gp_inverse(self, z) -> np.ndarray: ...
    def gp_noise_sd(self, z) -> np.ndarray: ...


# ------------------------------------------------------------------ shared helpers
def _positive(value: float, what: str) -> float:
    v = float(value)
    if not np.isfinite(v) or v <= 0.0:
        raise DataError(f"{what} must be a positive finite number, got {value!r}")
    return v


def _as_y(y, name: str) -> np.ndarray:
    """``y`` as a float array (N,); NaN allowed (missing), infinities refused."""
    try:
        a = np.asarray(y, dtype=float)
    except (TypeError, ValueError):
        raise DataError(f"{name}: measurements must be numbers (NaN for missing), got {type(y).__name__}") from None
    if a.ndim != 1:
        raise DataError(f"{name}: measurements must be a 1-D array (N,), got shape {a.shape}")
    if np.isinf(a).any():
        i = int(np.flatnonzero(np.isinf(a))[0])
        raise DataError(f"{name}: measurement {i} is {a[i]}; give a finite value, or NaN where it is missing")
    return a


def _bad(name: str, a: np.ndarray, bad: np.ndarray, what: str, todo: str) -> DataError:
    idx = np.flatnonzero(bad)
    return DataError(f"{name}: {idx.size} measurement(s) {what} (first: index {idx[0]}, value {float(a[idx[0]])!r}); {todo}")


def _pair(y, mu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mu, measured mask) as float arrays of one shape (N,)."""
    y = np.asarray(y, dtype=float)
    mu = np.asarray(mu, dtype=float)
    if y.ndim != 1 or mu.shape != y.shape:
        raise DataError(f"y and mu must be 1-D arrays of one shape (N,), got {y.shape} and {mu.shape}")
    return y, mu, np.isfinite(y)


def _measured(y) -> np.ndarray:
    """Indices of the measured (finite) entries of y."""
    return np.flatnonzero(np.isfinite(np.asarray(y, dtype=float)))


# the masking of measured entries, one place for every model: missing values (NaN) contribute nothing
def _measured_values(y) -> np.ndarray:
    """The measured (finite) entries of y as floats."""
    y = np.asarray(y, dtype=float)
    return y[np.isfinite(y)]


def _at_measured(y, mu, f) -> np.ndarray:
    """(N,) ``f(y_m, mu_m)`` at the measured entries m of y (y and mu checked by :func:`_pair`), 0 elsewhere."""
    y, mu, m = _pair(y, mu)
    out = np.zeros_like(y)
    out[m] = f(y[m], mu[m])
    return out


def _measured_logp(y, mu, dist, *, counts: bool = False) -> pt.TensorVariable:
    """sum of ``pm.logp(dist(mu_m), y_m)`` over the measured entries m of y: ``dist`` maps the PyTensor
    prediction at those entries to a PyMC distribution (``pm.Normal.dist(...)``); counts as int64."""
    idx = _measured(y)
    values = np.asarray(y, dtype=float)[idx]
    return pm.logp(dist(pt.as_tensor_variable(mu)[idx]), values.astype("int64") if counts else values).sum()


def _h(z: np.ndarray) -> np.ndarray:
    """(1+z) log(1+z) - z for z >= -1, without cancellation near 0 (a series there)."""
    z = np.asarray(z, dtype=float)
    out = special.xlogy(1.0 + z, 1.0 + z) - z
    small = np.abs(z) < 1e-2
    if small.any():
        zs = z[small]
        # sum_{n>=2} (-1)^n z^n / (n (n-1)), to n = 9: relative error < 1e-13 for |z| < 1e-2
        out[small] = sum((-1.0) ** n * zs**n / (n * (n - 1)) for n in range(2, 10))
    return out


def _deviance_residuals(y, mu, half_deviance) -> np.ndarray:
    """sign(y - mu) sqrt(2 half_deviance(y, mu)) at the measured entries, 0 elsewhere."""
    return _at_measured(y, mu, lambda a, b: np.sign(a - b) * np.sqrt(2.0 * np.maximum(half_deviance(a, b), 0.0)))


# ------------------------------------------------------------------ Gaussian
@dataclass(frozen=True)
class Normal:
    """Additive Gaussian noise: y ~ N(mu, sd^2), sd in the units of y."""

    sd: float
    name: ClassVar[str] = "normal"
    is_count: ClassVar[bool] = False

    def __post_init__(self):
        object.__setattr__(self, "sd", _positive(self.sd, "normal noise: sd"))

    def check(self, y, name: str = "y") -> np.ndarray:
        """The measurements (N,) as floats; NaN = missing."""
        return _as_y(y, name)

    def nll(self, y, mu) -> float:
        """-sum scipy.stats.norm(mu, sd).logpdf(y) over the measured entries."""
        y, mu, m = _pair(y, mu)
        r = (y[m] - mu[m]) / self.sd
        return float(0.5 * np.sum(r * r) + m.sum() * (np.log(self.sd) + 0.5 * _LOG_2PI))

    def nll_saturated(self, y) -> float:
        """nll at mu = y."""
        return float(_measured_values(y).size * (np.log(self.sd) + 0.5 * _LOG_2PI))

    def residuals(self, y, mu) -> np.ndarray:
        """(y - mu) / sd (N,), 0 where y is missing."""
        y, mu, m = _pair(y, mu)
        return np.where(m, (np.where(m, y, 0.0) - mu) / self.sd, 0.0)

    def d_residuals_d_mu(self, y, mu) -> np.ndarray:
        """-1/sd (N,), 0 where y is missing."""
        y, mu, m = _pair(y, mu)
        return np.where(m, -1.0 / self.sd, 0.0)

    def logp(self, y, mu, **params) -> pt.TensorVariable:
        """sum of pm.logp(pm.Normal.dist(mu, sd), y) over the measured entries; ``sd=`` may be a tensor."""
        sd = params.get("sd", self.sd)
        return _measured_logp(y, mu, lambda m: pm.Normal.dist(mu=m, sigma=sd))

    def gp_transform(self, y) -> np.ndarray:
        """Identity."""
        return np.asarray(y, dtype=float)

    def gp_inverse(self, z) -> np.ndarray:
        """Identity."""
        return np.asarray(z, dtype=float)

    def gp_noise_sd(self, z) -> np.ndarray:
        """sd on the transformed (= original) scale, exact."""
        return np.full(np.shape(z), self.sd)


# ------------------------------------------------------------------ lognormal
@dataclass(frozen=True)
class LogNormal:
    """Multiplicative noise on the measured value: log y ~ N(log mu, sd^2); y > 0 where measured.

    ``mu = 0`` is allowed where y is missing (a concentration at t = 0 before the dose is absorbed);
    ``mu <= 0`` at a measured y has zero likelihood: ``nll`` is inf and the residual +inf (a caller's
    optimiser must treat such a point as rejected).
    """

    sd: float
    name: ClassVar[str] = "lognormal"
    is_count: ClassVar[bool] = False

    def __post_init__(self):
        object.__setattr__(self, "sd", _positive(self.sd, "lognormal noise: sd (on the log scale)"))

    def check(self, y, name: str = "y") -> np.ndarray:
        """The measurements (N,); each measured one must be > 0 (NaN = missing)."""
        a = _as_y(y, name)
        bad = np.isfinite(a) & (a <= 0.0)
        if bad.any():
            raise _bad(name, a, bad, "<= 0 under lognormal noise (log y is undefined)",
                       "mark them missing (NaN) - e.g. a pre-dose sample at t = 0 - or drop them, "
                       "or use noise='normal' for this state")
        return a

    def _logmu(self, mu: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(mu > 0.0, np.log(np.where(mu > 0.0, mu, 1.0)), -np.inf)

    def nll(self, y, mu) -> float:
        """-sum scipy.stats.lognorm(s=sd, scale=mu).logpdf(y) over the measured entries."""
        y, mu, m = _pair(y, mu)
        ly = np.log(y[m])
        r = (ly - self._logmu(mu[m])) / self.sd
        return float(0.5 * np.sum(r * r) + np.sum(ly) + m.sum() * (np.log(self.sd) + 0.5 * _LOG_2PI))

    def nll_saturated(self, y) -> float:
        """nll at mu = y."""
        ly = np.log(_measured_values(y))
        return float(np.sum(ly) + ly.size * (np.log(self.sd) + 0.5 * _LOG_2PI))

    def residuals(self, y, mu) -> np.ndarray:
        """(log y - log mu) / sd (N,), 0 where y is missing, +inf where mu <= 0 at a measured y."""
        return _at_measured(y, mu, lambda a, b: (np.log(a) - self._logmu(b)) / self.sd)

    def d_residuals_d_mu(self, y, mu) -> np.ndarray:
        """-1 / (sd mu) (N,), 0 where y is missing."""
        with np.errstate(divide="ignore"):
            return _at_measured(y, mu, lambda _, b: -1.0 / (self.sd * b))

    def logp(self, y, mu, **params) -> pt.TensorVariable:
        """sum of pm.logp(pm.LogNormal.dist(log mu, sd), y) over the measured entries."""
        sd = params.get("sd", self.sd)
        return _measured_logp(y, mu, lambda m: pm.LogNormal.dist(mu=pt.log(m), sigma=sd))

    def gp_transform(self, y) -> np.ndarray:
        """log y (measured y > 0; NaN stays NaN)."""
        return np.log(np.asarray(y, dtype=float))

    def gp_inverse(self, z) -> np.ndarray:
        """exp z: the median of y given z."""
        return np.exp(np.asarray(z, dtype=float))

    def gp_noise_sd(self, z) -> np.ndarray:
        """sd of log y, exact: the model's sd."""
        return np.full(np.shape(z), self.sd)


# ------------------------------------------------------------------ counts
def _check_counts(y, name: str, model: str) -> np.ndarray:
    a = _as_y(y, name)
    m = np.isfinite(a)
    neg = m & (a < 0.0)
    if neg.any():
        raise _bad(name, a, neg, f"negative under {model} noise (counts are >= 0)",
                   "counts cannot be negative: check the column, or use noise='normal'")
    frac = m & (a != np.round(a))
    if frac.any():
        raise _bad(name, a, frac, f"not whole numbers under {model} noise",
                   "give the raw counts (not rates, averages or proportions), or use noise='normal' "
                   "or 'lognormal' for a continuous measurement")
    return a


@dataclass(frozen=True)
class Poisson:
    """Counts: y ~ Poisson(mu); y = 0, 1, 2, ... where measured, mu > 0."""

    name: ClassVar[str] = "poisson"
    is_count: ClassVar[bool] = True

    def check(self, y, name: str = "y") -> np.ndarray:
        """The counts (N,) as floats; whole numbers >= 0 (NaN = missing)."""
        return _check_counts(y, name, "Poisson")

    def nll(self, y, mu) -> float:
        """-sum scipy.stats.poisson(mu).logpmf(y) over the measured entries."""
        y, mu, m = _pair(y, mu)
        y, mu = y[m], mu[m]
        return float(np.sum(mu - special.xlogy(y, mu) + special.gammaln(y + 1.0)))

    def nll_saturated(self, y) -> float:
        """nll at mu = y."""
        y = _measured_values(y)
        return float(np.sum(y - special.xlogy(y, y) + special.gammaln(y + 1.0)))

    def _half_deviance(self, y, mu):
        return mu * _h((y - mu) / mu)

    def residuals(self, y, mu) -> np.ndarray:
        """Deviance residuals sign(y - mu) sqrt(2 (y log(y/mu) - (y - mu))) (N,), 0 where missing."""
        return _deviance_residuals(y, mu, self._half_deviance)

    def d_residuals_d_mu(self, y, mu) -> np.ndarray:
        """dr/dmu = -|z| / sqrt(2 h(z)) / sqrt(mu), z = (y - mu)/mu (limit -1/sqrt(mu) at y = mu)."""
        def d(yy, mm):
            z = (yy - mm) / mm
            h = _h(z)
            with np.errstate(divide="ignore", invalid="ignore"):
                g = np.where(z == 0.0, 1.0, np.abs(z) / np.sqrt(2.0 * h))
            return -g / np.sqrt(mm)

        return _at_measured(y, mu, d)

    def logp(self, y, mu, **params) -> pt.TensorVariable:
        """sum of pm.logp(pm.Poisson.dist(mu), y) over the measured entries."""
        return _measured_logp(y, mu, lambda m: pm.Poisson.dist(mu=m), counts=True)

    def gp_transform(self, y) -> np.ndarray:
        """Anscombe's transform 2 sqrt(y + 3/8): roughly N(2 sqrt(mu + 1/8), 1) for mu >~ 5."""
        return 2.0 * np.sqrt(np.asarray(y, dtype=float) + _ANSCOMBE)

    def gp_inverse(self, z) -> np.ndarray:
        """(z/2)^2 - 3/8, the algebraic inverse (the median of y given z, not its mean; >= 0)."""
        return np.maximum((np.asarray(z, dtype=float) / 2.0) ** 2 - _ANSCOMBE, 0.0)

    def gp_noise_sd(self, z) -> np.ndarray:
        """1 (approximate, good for mu >~ 5; smaller for mu near 0)."""
        return np.ones(np.shape(z))


@dataclass(frozen=True)
class NegativeBinomial:
    """Overdispersed counts: y ~ NB(mu, alpha), mean mu, variance mu + mu^2/alpha.

    The parametrisation is PyMC's ``pm.NegativeBinomial(mu=mu, alpha=alpha)`` (Stan's
    ``neg_binomial_2(mu, phi)`` with phi = alpha); in scipy, ``nbinom(n=alpha, p=alpha/(alpha + mu))``.
    alpha -> inf is Poisson.
    """

    alpha: float
    name: ClassVar[str] = "negbin"
    is_count: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "alpha", _positive(self.alpha, "negative-binomial noise: alpha (dispersion)"))

    def check(self, y, name: str = "y") -> np.ndarray:
        """The counts (N,) as floats; whole numbers >= 0 (NaN = missing)."""
        return _check_counts(y, name, "negative-binomial")

    def _logpmf(self, y, mu):
        a = self.alpha
        return (special.gammaln(y + a) - special.gammaln(a) - special.gammaln(y + 1.0)
                + a * (np.log(a) - np.log(a + mu)) + special.xlogy(y, mu) - special.xlogy(y, a + mu))

    def nll(self, y, mu) -> float:
        """-sum scipy.stats.nbinom(alpha, alpha/(alpha+mu)).logpmf(y) over the measured entries."""
        y, mu, m = _pair(y, mu)
        return float(-np.sum(self._logpmf(y[m], mu[m])))

    def nll_saturated(self, y) -> float:
        """nll at mu = y."""
        y = _measured_values(y)
        return float(-np.sum(self._logpmf(y, y)))

    def _half_deviance(self, y, mu):
        a = self.alpha
        return mu * _h((y - mu) / mu) - (a + mu) * _h((y - mu) / (a + mu))

    def residuals(self, y, mu) -> np.ndarray:
        """Deviance residuals sign(y - mu) sqrt(2 (y log(y/mu) - (y+alpha) log((y+alpha)/(mu+alpha))))."""
        return _deviance_residuals(y, mu, self._half_deviance)

    def d_residuals_d_mu(self, y, mu) -> np.ndarray:
        """dr/dmu = -|y - mu| alpha / (mu (mu + alpha) sqrt(dev)) (limit -1/sqrt(mu + mu^2/alpha) at y = mu)."""
        a = self.alpha

        def d(yy, mm):
            dev = 2.0 * np.maximum(self._half_deviance(yy, mm), 0.0)
            limit = -1.0 / np.sqrt(mm + mm * mm / a)
            with np.errstate(divide="ignore", invalid="ignore"):
                val = -np.abs(yy - mm) * a / (mm * (mm + a) * np.sqrt(dev))
            return np.where((yy == mm) | (dev == 0.0), limit, val)

        return _at_measured(y, mu, d)

    def logp(self, y, mu, **params) -> pt.TensorVariable:
        """sum of pm.logp(pm.NegativeBinomial.dist(mu=mu, alpha=alpha), y); ``alpha=`` may be a tensor."""
        alpha = params.get("alpha", self.alpha)
        return _measured_logp(y, mu, lambda m: pm.NegativeBinomial.dist(mu=m, alpha=alpha), counts=True)

    def gp_transform(self, y) -> np.ndarray:
        """2 sqrt(alpha) asinh(sqrt((y + 3/8)/alpha)): variance-stabilising (sd ~ 1) for NB counts;
        2 sqrt(y + 3/8) (Anscombe) as alpha -> inf."""
        a = self.alpha
        return 2.0 * np.sqrt(a) * np.arcsinh(np.sqrt((np.asarray(y, dtype=float) + _ANSCOMBE) / a))

    def gp_inverse(self, z) -> np.ndarray:
        """alpha sinh(z / (2 sqrt(alpha)))^2 - 3/8 (the algebraic inverse, >= 0)."""
        a = self.alpha
        return np.maximum(a * np.sinh(np.asarray(z, dtype=float) / (2.0 * np.sqrt(a))) ** 2 - _ANSCOMBE, 0.0)

    def gp_noise_sd(self, z) -> np.ndarray:
        """1 (approximate, good for mu >~ 5)."""
        return np.ones(np.shape(z))


#: Noise model classes by the name used in ``noise=...``.
NOISE_MODELS: dict[str, type] = {"normal": Normal, "lognormal": LogNormal, "poisson": Poisson,
                                 "negbin": NegativeBinomial}


def noise_model(name: str, **params: Any) -> NoiseModel:
    """The noise model called ``name`` with its parameters (``sd=`` for normal and lognormal,
    ``alpha=`` for negbin, none for poisson); a DataError for an unknown name or parameter."""
    if name not in NOISE_MODELS:
        hint = difflib.get_close_matches(str(name), list(NOISE_MODELS), n=1)
        raise DataError(f"unknown noise model {name!r}; choose one of {list(NOISE_MODELS)}"
                        + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    cls = NOISE_MODELS[name]
    names = [f.name for f in fields(cls)]  # the ClassVars name and is_count are not fields
    unknown = set(params) - set(names)
    missing = set(names) - set(params)
    if unknown or missing:
        raise DataError(f"noise model {name!r} takes {names or 'no parameters'}; "
                        + (f"unknown: {sorted(unknown)}" if unknown else f"missing: {sorted(missing)}"))
    return cls(**params)

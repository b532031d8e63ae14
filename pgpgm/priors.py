"""Parameter priors: one place for the default and for turning user specs into PyMC variables.

A prior spec is ``(lower, upper)`` for a Uniform prior or a callable ``name -> PyMC
variable`` (called inside the model). :func:`pgpgm.build_model`, :func:`pgpgm.fit` and
the model files all read them through :class:`Priors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.transforms import Transform

from .errors import DataError

PriorSpec = tuple[float, float] | Callable[[str], pt.TensorVariable]

#: The Uniform prior of a parameter without a spec (the published experiments' box).
DEFAULT_BOUNDS: tuple[float, float] = (0.0, 10.0)


@dataclass(frozen=True)
class Priors:
    """One prior spec per parameter, in parameter order.

    Attributes
    ----------
    names : (P,) parameter names
    specs : (P,) ``(lower, upper)`` tuples or callables
    """

    names: tuple[str, ...]
    specs: tuple[PriorSpec, ...]

    @classmethod
    def from_user(cls, parameters: Sequence[str], priors: Mapping[str, PriorSpec] | PriorSpec | None) -> Priors:
        """Read ``priors``: None (every parameter :data:`DEFAULT_BOUNDS`), one spec for every
        parameter, or a mapping by name (missing names get the default)."""
        parameters = tuple(parameters)
        if priors is None or callable(priors) or isinstance(priors, tuple | list):
            priors = {p: priors for p in parameters}
        if not isinstance(priors, Mapping):
            raise DataError(f"priors must be (lower, upper), a callable or a mapping by parameter, got {priors!r}")
        unknown = set(priors) - set(parameters)
        if unknown:
            raise DataError(f"priors given for unknown parameters {sorted(unknown)}; parameters are {list(parameters)}")
        specs = []
        for p in parameters:
            spec = priors.get(p)
            spec = DEFAULT_BOUNDS if spec is None else spec
            if callable(spec):  # tried once in a model of its own: a bad callable is named before any fit
                with pm.Model(model=None):
                    prior_variable(p, spec)
            else:
                try:
                    lo, hi = (float(v) for v in spec)
                except (TypeError, ValueError):
                    raise DataError(f"prior of {p} must be (lower, upper) or a callable, got {spec!r}") from None
                if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                    raise DataError(f"prior bounds of {p} must be finite with lower < upper, got {spec}")
                spec = (lo, hi)
            specs.append(spec)
        return cls(parameters, tuple(specs))

    @property
    def bounds(self) -> np.ndarray | None:
        """(P, 2) lower/upper bounds when every prior is a Uniform box, else None."""
        if any(callable(s) for s in self.specs):
            return None
        return np.array(self.specs, float).reshape(-1, 2)

    @property
    def refinement_bounds(self) -> np.ndarray | None:
        """(P, 2) the bounds least squares holds each parameter in: its Uniform prior's box, (-inf, inf) for a
        parameter with another prior; None when no prior is a box. (:attr:`bounds` is None as soon as one
        prior is not a box: the searches that spread points over the box need every side finite.)"""
        if all(callable(s) for s in self.specs):
            return None
        return np.array([(-np.inf, np.inf) if callable(s) else s for s in self.specs], float).reshape(-1, 2)

    def variables(self, log_scale: Sequence[str] = (), own_scale: Mapping[str, float] | None = None
                  ) -> pt.TensorVariable:
        """Create the prior variables in the current PyMC model; returns theta (P,).

        ``log_scale`` names Uniform(0, upper) parameters whose samplers move in (nearly) log
        theta (:class:`SoftLogTransform`) instead of the log-odds of the box; ``own_scale`` maps
        Uniform(0, upper) parameters to the width of the soft wall at 0 of their own scale
        (:class:`SoftplusTransform`). The prior is the same.
        """
        if not self.names:
            return pt.zeros(0)
        own_scale = dict(own_scale or {})

        def transform(name: str, upper: float) -> dict:
            if name in own_scale:
                return {"default_transform": SoftplusTransform(own_scale[name])}
            return {"default_transform": SoftLogTransform(upper)} if name in log_scale else {}

        return pt.stack([prior_variable(n, s) if callable(s) else
                         pm.Uniform(n, lower=np.float64(s[0]), upper=np.float64(s[1]),  # else float32 terms
                                    **transform(n, s[1]))
                         for n, s in zip(self.names, self.specs)])


def prior_variable(name: str, spec: Callable[[str], pt.TensorVariable]) -> pt.TensorVariable:
    """``spec(name)`` in the current PyMC model, checked: one scalar PyTensor variable.

    Raises
    ------
    DataError : the callable fails, returns something else (None, a number, a vector) or creates no
        variable of that name, naming the parameter.
    """
    example = "e.g. lambda name: pm.LogNormal(name, 0.0, 1.0)"
    try:
        value = spec(name)
    except Exception as exc:
        raise DataError(f"the prior callable of {name} failed ({type(exc).__name__}: {exc}); it is called with the "
                        f"variable's name and must create and return one PyMC variable, {example}") from exc
    if not isinstance(value, pt.TensorVariable) or value.type.ndim != 0:
        got = (f"a variable of shape {value.type.shape}" if isinstance(value, pt.TensorVariable)
               else f"{type(value).__name__} {value!r:.60}")
        raise DataError(f"the prior callable of {name} returned {got}; it must create and return one scalar PyMC "
                        f"variable named by its argument, {example}")
    if name not in pm.modelcontext(None).named_vars:  # the fit looks the parameter up by its name
        raise DataError(f"the prior callable of {name} created no variable named {name!r} (it returned one named "
                        f"{value.name!r}); name the variable by the callable's argument, {example}")
    return value


#: sharpness p of :class:`SoftLogTransform` (p = 1 is the log-odds of the box, p -> inf the
#: plain log with a hard wall at the bound)
SOFT_WALL_SHARPNESS = 8.0


class SoftLogTransform(Transform):
    """The sampling scale of a Uniform(0, upper) parameter that is log theta well below the
    bound and meets the bound smoothly:

        theta = (exp(-p phi) + upper^-p)^(-1/p),   phi = log theta - log(1 - (theta/upper)^p) / p

    a soft minimum of exp(phi) and ``upper`` (p = :data:`SOFT_WALL_SHARPNESS`): d log theta /
    d phi = 1 - (theta/upper)^p (0.996 at upper/2), and every phi is inside the box. PyMC's
    log transform instead makes the bound a hard wall (log density -inf beyond it), which a
    NUTS trajectory along a long ridge that reaches the bound (Lotka-Volterra with one state
    observed) hits: a divergence. Far past the bound theta is ``upper`` itself (the rounding of exp(log
    upper) would put it a hair above, where the prior is 0), and the density's tail is exp(-p phi).
    """

    name = "softlog"
    ndim_supp = 0

    def __init__(self, upper: float, sharpness: float = SOFT_WALL_SHARPNESS):
        self.upper, self.p = float(upper), float(sharpness)

    def forward(self, value, *inputs):
        return pt.log(value) - pt.log1p(-((value / self.upper) ** self.p)) / self.p

    def backward(self, value, *inputs):
        # exp(log upper) rounds to above upper (10.000000000000002 for upper 10) once phi is ~4.3 / p past
        # log upper: without the clip the prior's log density is -inf there, a hard wall in the tail of the
        # soft one, where the posteriors of Lotka-Volterra with large noise reach (a divergence, a stuck chain)
        return pt.minimum(pt.exp(self._log_theta(value)), self.upper)

    def log_jac_det(self, value, *inputs):
        return (1.0 + self.p) * self._log_theta(value) - self.p * value

    def _log_theta(self, phi):
        return -pt.logaddexp(-self.p * phi, -self.p * np.log(self.upper)) / self.p


class SoftplusTransform(Transform):
    """The sampling scale of a positive parameter that is theta itself away from 0 and has a soft
    wall at 0 of width ``width`` (theta units):

        theta = width * log(1 + exp(phi / width)),   phi = theta + width * log(1 - exp(-theta / width))

    d theta / d phi = 1 - exp(-theta / width) (0.95 at 3 widths), so a posterior that is Gaussian in
    theta is Gaussian in phi where it has its mass, and every phi is positive theta: a trajectory that
    runs towards 0 meets a density that falls off smoothly (as exp(phi / width)), not a wall. The
    upper bound of a Uniform prior stays a hard wall (log density -inf beyond it); step 4 puts a
    parameter on this scale only where its refined value is far below that bound
    (:func:`pgpgm.posterior.scales.choose_scales`). ``width`` is a constant of the model's
    graph: models that differ in it compile separately.
    """

    name = "softplus"
    ndim_supp = 0

    def __init__(self, width: float):
        if not (np.isfinite(width) and width > 0):
            raise DataError(f"the soft wall's width must be a positive number, got {width!r}")
        self.width = float(width)

    def forward(self, value, *inputs):
        return value + self.width * pt.log(-pt.expm1(-value / self.width))

    def backward(self, value, *inputs):
        return self.width * pt.softplus(value / self.width)

    def log_jac_det(self, value, *inputs):
        return -pt.softplus(-value / self.width)

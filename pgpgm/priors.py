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
            if not callable(spec):
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

    def variables(self, log_scale: Sequence[str] = ()) -> pt.TensorVariable:
        """Create the prior variables in the current PyMC model; returns theta (P,).

        ``log_scale`` names Uniform(0, upper) parameters whose samplers move in log theta
        (PyMC's log transform) instead of the log-odds of the box; the prior is the same.
        """
        if not self.names:
            return pt.zeros(0)
        from pymc.distributions.transforms import log as log_transform

        return pt.stack([s(n) if callable(s) else
                         pm.Uniform(n, lower=s[0], upper=s[1],
                                    **({"default_transform": log_transform} if n in log_scale else {}))
                         for n, s in zip(self.names, self.specs)])

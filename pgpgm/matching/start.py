"""Where chains start: the prior's initial point, prior draws, the density's mode, or given values."""

from __future__ import annotations

from functools import cache

import numpy as np
from scipy import optimize

from ..errors import DataError
from .target import GradientMatchingTarget

STRATEGIES = ("spread", "prior-median", "prior", "map")


def chain_strategy(init, chain: int):
    """The start of chain number ``chain`` under ``init``: ``"spread"`` starts the first chain at
    the priors' initial point and every further chain at a prior draw (a multi-start)."""
    if isinstance(init, str) and init == "spread":
        return "prior-median" if chain == 0 else "prior"
    return init


class Starts:
    """Start points for one target (the density mode is computed at most once).

    ``theta(init, rng)`` returns sampler coordinates (P,) for ``init`` in
    ``"prior-median"`` (the priors' initial point, e.g. Uniform midpoints), ``"prior"``
    (a random prior draw), ``"map"`` (the density's mode over theta with x_M at the GP
    means, by Powell's method from the prior median, jittered by 2 %) or P values.
    """

    def __init__(self, target: GradientMatchingTarget):
        self.target = target
        self.names = (*target.density.system.parameters, *target.density.x0_priors.names)  # Q coordinates
        self.median = target.parameters.initial_point.copy()
        self._mode = cache(self._density_mode)

    def theta(self, init, rng: np.random.Generator) -> np.ndarray:
        d = self.target.density
        if isinstance(init, str) and init == "prior-median":
            return self.median
        if isinstance(init, str) and init == "prior":
            # pm.draw's numbers from a function compiled once per parameter part (PyTensor's Python
            # backend: it compiles in milliseconds, the numba backend takes seconds on a cold cache)
            return self.target.parameters.draw(rng)
        if isinstance(init, str) and init == "map":
            mode = self._mode()
            jittered = mode * np.exp(0.02 * rng.standard_normal(mode.size))
            b = _bounds(d)
            if b is None:
                return jittered
            return np.clip(jittered, b[:, 0] + 1e-9 * np.ptp(b, 1), b[:, 1] - 1e-9 * np.ptp(b, 1))
        if isinstance(init, str):
            raise DataError(f"init must be one of {STRATEGIES} or {d.system.n_parameters} values, got {init!r}")
        theta = np.asarray(init, float)
        P = d.system.n_parameters
        if theta.shape == (P,) and len(self.names) > P:  # unknown initial values start at their prior's centre
            theta = np.concatenate([theta, self.median[P:]])
        if theta.shape != (len(self.names),):
            raise DataError(f"init must be one of {STRATEGIES} or {d.system.n_parameters} values "
                            f"{list(d.system.parameters)}, got shape {theta.shape}")
        return theta

    def _density_mode(self) -> np.ndarray:
        """Maximise the density over theta with x_M at the GP means (Powell, from the prior median).
        Gradient matching makes this objective smooth, so a local search is a sound start."""
        d, target = self.target.density, self.target
        X = d.gp_states()

        def neg(theta):
            lp = target.evaluate(theta, X)[0]
            return -lp if np.isfinite(lp) else 1e300

        b = _bounds(d)
        res = optimize.minimize(neg, self.median, method="Powell", bounds=None if b is None else [tuple(r) for r in b],
                                options={"xtol": 1e-4, "ftol": 1e-8, "maxfev": 4000})
        return res.x if res.fun < neg(self.median) else self.median


def _bounds(d) -> np.ndarray | None:
    """(Q, 2) Uniform-prior boxes of the coordinates (parameters, unknown initial values), or None."""
    b, b0 = d.priors.bounds, d.x0_priors.bounds
    if b is None or b0 is None:
        return None
    return np.vstack([b, b0]) if b0.size else b

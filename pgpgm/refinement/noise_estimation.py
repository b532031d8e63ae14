"""Maximum likelihood of the noise parameters beside the unknowns q: one alternation for every step-3 problem.

:func:`pgpgm.refine` (one data set) and :func:`pgpgm.study.refine_joint` (many experiments) both
maximise a likelihood over q (parameters, free initial values) and the noise parameters by
alternating two exact partial minimisations: weighted least squares in q for fixed noise parameters
(the caller's ``solve``), then each estimated noise parameter's maximum-likelihood value for fixed q
(the caller's ``update``; :func:`ml_noise_parameter` for one noise model's measurements). Every round
lowers the negative log likelihood; the fixed point is a stationary point of the full likelihood.

- :func:`alternate_noise` - the loop: stops when no estimated parameter changes by more than
  ``noise_rtol`` (relative) in a round, or after ``max_rounds``; an estimate is kept above ``floor``.
- :func:`ml_noise_parameter` - the maximum-likelihood noise parameter of one noise model on its
  measurements (y, mu) (N,): sd in closed form for normal and lognormal, negbin alpha by a grid over
  log alpha then bounded Brent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..noise import noise_model

__all__ = ["ALPHA_RANGE", "Alternation", "alternate_noise", "ml_noise_parameter"]

#: negbin alpha is estimated within this range (1e8: Poisson to ~1e-8 relative)
ALPHA_RANGE = (1e-4, 1e8)


@dataclass(frozen=True, eq=False)
class Alternation:
    """The end of :func:`alternate_noise`.

    Attributes
    ----------
    q : (Q,) the unknowns after the last least-squares solve
    params : (L,) the noise parameters (estimated entries: their last update, kept above the floor)
    result : the last solve's result (scipy's ``OptimizeResult``: ``success``, ``message``, ...)
    rounds : updates of the noise parameters made (0 when none is estimated)
    converged : True when nothing is estimated, or the last update changed no estimate by more than
        ``noise_rtol``
    change : the largest relative change of the last update (NaN when none was made)
    """

    q: np.ndarray
    params: np.ndarray
    result: optimize.OptimizeResult
    rounds: int
    converged: bool
    change: float


def alternate_noise(solve: Callable[[np.ndarray, np.ndarray], optimize.OptimizeResult],
                    update: Callable[[np.ndarray, np.ndarray], np.ndarray], q0: np.ndarray, params0: np.ndarray,
                    estimated: np.ndarray, floor: np.ndarray, *, max_rounds: int, noise_rtol: float) -> Alternation:
    """Alternate ``solve`` (least squares in q for fixed noise parameters) and ``update`` (their maximum-
    likelihood values for fixed q) until the estimated parameters settle.

    Parameters
    ----------
    solve : ``solve(q, params)`` -> scipy ``OptimizeResult`` with ``x`` the new q (Q,)
    update : ``update(q, params)`` -> (L,) the noise parameters' maximum-likelihood values at q (entries
        not estimated are ignored)
    q0 : (Q,) start; params0 : (L,) the noise parameters' start (known entries: their values)
    estimated : (L,) bool, which parameters are estimated (none: one solve)
    floor : (L,) the estimates are kept at or above these values
    max_rounds : most updates; noise_rtol : the relative change that ends the alternation

    Returns
    -------
    Alternation
    """
    q, params = q0, np.array(params0, dtype=float)
    rounds, converged, change = 0, not estimated.any(), np.nan
    while True:
        res = solve(q, params)
        q = res.x
        if not estimated.any():
            break
        rounds += 1
        new = params.copy()
        new[estimated] = np.maximum(np.asarray(update(q, params), float)[estimated], floor[estimated])
        change = float(np.max(np.abs(new / params - 1)))
        params = new
        if change <= noise_rtol:
            converged = True
            break
        if rounds >= max_rounds:
            break
    return Alternation(q, params, res, rounds, converged, change)


def ml_noise_parameter(name: str, y: np.ndarray, mu: np.ndarray, current: float) -> float:
    """The maximum-likelihood noise parameter of the model ``name`` for measurements ``y`` (N,) (NaN:
    missing) given the predictions ``mu`` (N,).

    normal: sd = sqrt(mean (y - mu)^2); lognormal: sd = sqrt(mean (log y - log mu)^2) (``current`` when
    a prediction is <= 0 at a measured value); negbin: alpha minimising the nll over log alpha (a
    57-point grid over :data:`ALPHA_RANGE`, which finds the basin where the nll flattens towards the
    Poisson limit, then bounded Brent about the grid's best point; ``current`` when a prediction is
    <= 0); Poisson (no parameter): ``current``.

    Known limit (negbin): an alternation (q for fixed alpha, then alpha) can stop at the Poisson limit
    alpha -> 1e8 when the data are barely overdispersed, a stationary point in the limit; on Poisson
    counts its nll can lie slightly (~1e-4 nats) above the joint optimum at a finite alpha, which a
    multi-start over q and alpha together finds.
    """
    m = np.isfinite(y)
    if name == "normal":
        return float(np.sqrt(np.mean((y[m] - mu[m]) ** 2)))
    if name == "lognormal":
        with np.errstate(all="ignore"):
            r = np.log(y[m]) - np.log(mu[m])
        return float(np.sqrt(np.mean(r**2))) if np.all(np.isfinite(r)) else float(current)
    if name == "negbin" and np.all(mu[m] > 0):
        def f(la) -> float:
            return noise_model("negbin", alpha=float(np.exp(la))).nll(y, mu)
        # the nll in log alpha is flat towards the Poisson limit: a grid finds the basin, Brent the point
        grid = np.linspace(*np.log(ALPHA_RANGE), 57)
        j = int(np.argmin([f(g) for g in grid]))
        lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
        res = optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
        return float(np.exp(res.x)) if res.fun <= f(grid[j]) else float(np.exp(grid[j]))
    return float(current)

"""Which scale step 4 samples each Uniform(0, upper) parameter on: log theta or theta itself.

NUTS mixes fastest where the posterior is close to Gaussian in the coordinates it moves in. A rate
whose uncertainty is multiplicative (a product or ratio of rates that the data determine, a
posterior spreading over orders of magnitude) is Gaussian in log theta: step 4's default scale
(:class:`pgpgm.priors.SoftLogTransform`). A parameter that the data determine to within an additive
error a good part of its value (the repressilator's leak alpha0 = 0.25 +- 0.08) is Gaussian in
theta itself and skewed in log theta, whose left tail then falls off only as exp(log theta): there
NUTS needed ~5x the gradient evaluations (``benchmarks/RESULTS.md``).

:func:`choose_scales` asks the log likelihood which: it probes it at +- :data:`PROBE_SE` marginal
standard errors from the refined point along the Laplace approximation's regression line of the
parameter (every other unknown moved with it as the refinement's covariance says), once with the
parameter on the log scale and once on its own, and measures how far the two probes' log densities
(the coordinates' Jacobian included) differ: 0 for a posterior symmetric on that scale. The parameter
goes on its own scale (:class:`pgpgm.priors.SoftplusTransform`) where that asymmetry is clearly the
smaller one; four likelihood evaluations per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: the probes' distance from the refined point in marginal standard errors
PROBE_SE = 2.0
#: a parameter goes on its own scale where the log scale's asymmetry is at least this (log-density units:
#: below it both scales are close to Gaussian out to the probes and the log scale stays) ...
MIN_ASYMMETRY = 0.5
#: ... and its own scale's is at most this fraction of the log scale's
OWN_SCALE_GAIN = 0.5
#: ... and the refined value plus this many standard errors is below the prior's upper bound (a hard
#: wall on the own scale)
UPPER_ROOM_SE = 6.0
#: the width of the own scale's soft wall at 0, in standard errors (:class:`pgpgm.priors.SoftplusTransform`),
#: rounded to a power of 4 (:func:`wall_width`)
WALL_WIDTH_SE = 0.5


@dataclass(frozen=True)
class ScaleChoice:
    """The scale :func:`choose_scales` chose for one parameter.

    Attributes
    ----------
    name : the parameter
    log_asymmetry, own_asymmetry : |log density at +PROBE_SE - at -PROBE_SE| on either scale (inf where a
        probe leaves the prior box or the solve fails; NaN where not probed)
    own : True: sampled on its own scale with a soft wall at 0 of width ``width`` (theta units)
    width : the soft wall's width (:func:`wall_width`; NaN on the log scale)
    """

    name: str
    log_asymmetry: float
    own_asymmetry: float
    own: bool
    width: float


def choose_scales(logp: Callable[[np.ndarray], float], q: np.ndarray, covariance: np.ndarray,
                  names: Sequence[str], uppers: Mapping[str, float]) -> tuple[ScaleChoice, ...]:
    """The sampling scale of each parameter in ``uppers`` (Uniform(0, upper) priors).

    Parameters
    ----------
    logp : (Q,) unknowns -> log likelihood (noise parameters held at their refined values; -inf where
        the solve fails)
    q : (Q,) the refined unknowns (parameters, then free initial values)
    covariance : (Q, Q) their covariance (the refinement's Laplace approximation)
    names : (Q,) their names
    uppers : parameter name -> its prior's upper bound, for the parameters to choose for

    Returns
    -------
    One :class:`ScaleChoice` per name of ``uppers`` (in ``names`` order). A parameter whose refined
    value is not inside its box or whose row of ``covariance`` is not finite stays on the log scale.
    """
    q = np.asarray(q, float)
    cov = np.asarray(covariance, float)
    names = list(names)
    logged = np.array([n in uppers and q[j] > 0 for j, n in enumerate(names)])
    upper = np.array([uppers.get(n, np.inf) for n in names], float)
    base = logp(q)
    out = []
    for i, name in enumerate(names):
        if name not in uppers:
            continue
        se = np.sqrt(cov[i, i]) if np.isfinite(cov[i, i]) else np.nan
        if not (logged[i] and np.all(np.isfinite(cov[i])) and se > 0 and np.isfinite(base)):
            out.append(ScaleChoice(name, np.nan, np.nan, False, np.nan))
            continue
        asym = {own: _asymmetry(logp, q, cov, i, logged & ~(np.arange(len(q)) == i) if own else logged, upper)
                for own in (False, True)}
        own = bool(np.isfinite(asym[True]) and asym[False] >= MIN_ASYMMETRY and asym[True] <= OWN_SCALE_GAIN * asym[False]
                   and q[i] + UPPER_ROOM_SE * se < upper[i])
        out.append(ScaleChoice(name, asym[False], asym[True], own, wall_width(se) if own else np.nan))
    return tuple(out)


def wall_width(se: float) -> float:
    """The own scale's soft-wall width of a parameter with standard error ``se``: :data:`WALL_WIDTH_SE` x se
    rounded to the nearest power of 4 (between 0.25 and 1 se). The width is a constant of step 4's
    model graph, whose compiled code is kept and reused per graph (:mod:`pgpgm.posterior.nutpie_engine`):
    rounded, fits of similar data share it instead of compiling anew for every standard error (10-15 s
    a fit on FitzHugh-Nagumo, measured with the unrounded width; rounded to powers of 2, 6 of 20 published
    fits still compiled anew)."""
    return float(4.0 ** np.round(np.log(WALL_WIDTH_SE * se) / np.log(4.0)))


def _asymmetry(logp, q: np.ndarray, cov: np.ndarray, i: int, logged: np.ndarray, upper: np.ndarray) -> float:
    """|log density at w+ - at w-| in the coordinates w (log q where ``logged``, q elsewhere), w+- the
    refined point +- PROBE_SE marginal sds of w_i along the Laplace regression line of w_i."""
    d = np.where(logged, 1.0 / np.where(logged, q, 1.0), 1.0)  # dw/dq at the refined point
    cov_w = d[:, None] * cov * d[None, :]
    line = cov_w[:, i] / np.sqrt(cov_w[i, i])
    w = np.where(logged, np.log(np.where(logged, q, 1.0)), q)
    pos = logged | (upper < np.inf)  # the Uniform(0, upper) parameters
    values = []
    for sign in (1.0, -1.0):
        wp = w + sign * PROBE_SE * line
        qp = np.where(logged, np.exp(wp), wp)
        if np.any(qp[pos] <= 0) or np.any(qp >= upper):
            return np.inf
        v = logp(qp) + float(np.sum(wp[logged]))  # + log |dq/dw| of the log coordinates
        if not np.isfinite(v):
            return np.inf
        values.append(v)
    return abs(values[0] - values[1])

"""Which scale step 4 samples each Uniform(0, upper) parameter on: log theta or theta itself.

NUTS mixes fastest where the posterior is close to Gaussian in the coordinates it moves in. A rate
whose uncertainty is multiplicative (a product or ratio of rates that the data determine, a
posterior spreading over orders of magnitude) is Gaussian in log theta: step 4's default scale
(:class:`pgpgm.priors.SoftLogTransform`). A parameter that the data determine to within an additive
error a good part of its value (the repressilator's leak alpha0 = 0.25 +- 0.08) is Gaussian in
theta itself and skewed in log theta, whose left tail then falls off only as exp(log theta): there
NUTS needs ~5x the gradient evaluations.

:func:`choose_scales` asks the log likelihood which: it probes it at +- :data:`PROBE_SE` marginal
standard errors from the refined point along the Laplace approximation's regression line of the
parameter (every other unknown moved with it as the refinement's covariance says), once with the
parameter on the log scale and once on its own, and measures how far the two probes' log densities
(the coordinates' Jacobian included) differ: 0 for a posterior symmetric on that scale. The parameter
goes on its own scale (:class:`pgpgm.priors.SoftplusTransform`) where that asymmetry is clearly the
smaller one; four likelihood evaluations per parameter.

A posterior can also be close to Gaussian at the mode on the log scale and narrow into a funnel along a
ridge there: Lotka-Volterra with x1 observed and x2(0) unknown, where the data fix theta1 - x2(0) to a
width that stays ~0.02-0.05 in x2(0)'s own units while both run from 1.2 to 7 along the ridge; in log
units that width shrinks 8x, NUTS on the log scale stops (R-hat and ESS pass) without reaching the far
end, and its sds of theta1 and x2(0) come out ~0.8x an independent reference's. The width test
(``conditional_sd``, :func:`width_changes`) measures each unknown's sd given all the others (the Fisher
information's diagonal, one sensitivity solve per probe) at the log scale's two probes: where it changes
by :data:`MIN_WIDTH_CHANGE` or more in log units and by less than half of that (in logs) in the
unknown's own units, the unknown goes on its own scale too. Unknown latent initial values with a
Uniform(0, upper) box are candidates as well (their default scale is the log-odds of the box).
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
#: the width test: an unknown also goes on its own scale (room below its bound given) where its sd given
#: the other unknowns changes by at least this factor between the log scale's probes in log units, and by
#: at most OWN_SCALE_GAIN of that (in logs) in its own units (:func:`width_changes`)
MIN_WIDTH_CHANGE = 1.5
#: the width of the own scale's soft wall at 0, in standard errors (:class:`pgpgm.priors.SoftplusTransform`),
#: rounded to a power of 4 (:func:`wall_width`)
WALL_WIDTH_SE = 0.5


@dataclass(frozen=True)
class ScaleChoice:
    """The scale :func:`choose_scales` chose for one unknown.

    Attributes
    ----------
    name : the parameter
    log_asymmetry, own_asymmetry : |log density at +PROBE_SE - at -PROBE_SE| on either scale (inf where a
        probe leaves the prior box or the solve fails; NaN where not probed)
    own : True: sampled on its own scale with a soft wall at 0 of width ``width`` (theta units)
    width : the soft wall's width (:func:`wall_width`; NaN on the log scale)
    log_width_change, own_width_change : |log ratio| of its sd given the other unknowns at the two probes, in
        log units and in its own (:func:`width_changes`; NaN where not measured)
    """

    name: str
    log_asymmetry: float
    own_asymmetry: float
    own: bool
    width: float
    log_width_change: float = np.nan
    own_width_change: float = np.nan


def choose_scales(logp: Callable[[np.ndarray], float], q: np.ndarray, covariance: np.ndarray,
                  names: Sequence[str], uppers: Mapping[str, float],
                  conditional_sd: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[ScaleChoice, ...]:
    """The sampling scale of each unknown in ``uppers`` (Uniform(0, upper) priors).

    Parameters
    ----------
    logp : (Q,) unknowns -> log likelihood (noise parameters held at their refined values; -inf where
        the solve fails)
    q : (Q,) the refined unknowns (parameters, then free initial values)
    covariance : (Q, Q) their covariance (the refinement's Laplace approximation)
    names : (Q,) their names
    uppers : name -> its prior's upper bound, for the unknowns to choose for
    conditional_sd : (Q,) unknowns -> (Q,) each one's sd given all the others (1 / sqrt of the diagonal of
        the Fisher information; NaN where the solve fails): the width test (:func:`width_changes`); None:
        the asymmetry test alone

    Returns
    -------
    One :class:`ScaleChoice` per name of ``uppers`` (in ``names`` order). An unknown whose refined
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
        log_values, points = _probes(logp, q, cov, i, logged, upper)
        own_values, _ = _probes(logp, q, cov, i, logged & ~(np.arange(len(q)) == i), upper)
        asym = {False: _spread(log_values), True: _spread(own_values)}
        widths = width_changes(conditional_sd, points, i) if conditional_sd is not None else (np.nan, np.nan)
        room = q[i] + UPPER_ROOM_SE * se < upper[i]
        skewed = asym[False] >= MIN_ASYMMETRY and asym[True] <= OWN_SCALE_GAIN * asym[False]
        funnel = widths[0] >= np.log(MIN_WIDTH_CHANGE) and widths[1] <= OWN_SCALE_GAIN * widths[0]
        own = bool(np.isfinite(asym[True]) and room and (skewed or funnel))
        out.append(ScaleChoice(name, asym[False], asym[True], own, wall_width(se) if own else np.nan, *widths))
    return tuple(out)


def width_changes(conditional_sd: Callable[[np.ndarray], np.ndarray], points: np.ndarray | None,
                  i: int) -> tuple[float, float]:
    """How much unknown ``i``'s conditional sd changes between the two log-scale probes ``points`` (2, Q):
    ``(|log ratio| of sd_i / q_i, |log ratio| of sd_i)``, on the log scale and on its own (NaN where a probe
    left the box or a solve failed). Where the data determine theta to within a fixed fraction, the sd
    grows with theta: constant in log units. Where the width stays in theta units as theta changes, the log
    scale narrows as theta grows - a funnel, whose narrow end NUTS under-reaches (Lotka-Volterra with
    x2(0) unknown: x2(0)'s width given the rest shrinks 8x in log units along the ridge, 2.7x in its own)."""
    if points is None:
        return np.nan, np.nan
    sds = np.array([np.asarray(conditional_sd(p), float)[i] for p in points])
    if not (np.all(np.isfinite(sds)) and np.all(sds > 0)):
        return np.nan, np.nan
    own = float(np.log(sds[0] / sds[1]))
    return abs(own - float(np.log(points[0, i] / points[1, i]))), abs(own)


def wall_width(se: float) -> float:
    """The own scale's soft-wall width of a parameter with standard error ``se``: :data:`WALL_WIDTH_SE` x se
    rounded to the nearest power of 4 (between 0.25 and 1 se). The width is a constant of step 4's
    model graph, whose compiled code is kept and reused per graph (:mod:`pgpgm.posterior.nutpie_engine`):
    rounded, fits of similar data share it instead of compiling anew for every standard error (10-15 s
    a fit; rounded to powers of 2, about a third of such fits still compile anew)."""
    return float(4.0 ** np.round(np.log(WALL_WIDTH_SE * se) / np.log(4.0)))


def _probes(logp, q: np.ndarray, cov: np.ndarray, i: int, logged: np.ndarray, upper: np.ndarray
            ) -> tuple[list[float] | None, np.ndarray | None]:
    """The log densities at w+- and the points q+- (2, Q) in the coordinates w (log q where ``logged``, q
    elsewhere), w+- the refined point +- PROBE_SE marginal sds of w_i along the Laplace regression line of
    w_i; None where a probe leaves the box or its solve fails."""
    d = np.where(logged, 1.0 / np.where(logged, q, 1.0), 1.0)  # dw/dq at the refined point
    cov_w = d[:, None] * cov * d[None, :]
    line = cov_w[:, i] / np.sqrt(cov_w[i, i])
    w = np.where(logged, np.log(np.where(logged, q, 1.0)), q)
    pos = logged | (upper < np.inf)  # the Uniform(0, upper) unknowns
    values, points = [], []
    for sign in (1.0, -1.0):
        wp = w + sign * PROBE_SE * line
        with np.errstate(over="ignore"):  # a probe far along a loose direction: inf, which leaves the box
            qp = np.where(logged, np.exp(wp), wp)
        if np.any(qp[pos] <= 0) or np.any(qp >= upper):
            return None, None
        v = logp(qp) + float(np.sum(wp[logged]))  # + log |dq/dw| of the log coordinates
        if not np.isfinite(v):
            return None, None
        values.append(v)
        points.append(qp)
    return values, np.array(points)


def _spread(values: list[float] | None) -> float:
    """|log density at w+ - at w-| (inf where a probe left the box or failed)."""
    return np.inf if values is None else abs(values[0] - values[1])

"""Tuning during burn-in; after burn-in every proposal is fixed.

Element-wise scheme (:func:`update`): every ``window`` iterations each proposal sd is
multiplied by exp(2 (acceptance rate over the window - 0.44)).

Block scheme (:func:`block_update`): the sweep's state sds as above; the block proposal
covariance from the draws of z in doubling windows that restart (Haario et al. 2001's
adaptive Metropolis with Stan-like windows: the first window's draws, taken far from the
bulk, are forgotten): at the end of each window the covariance becomes 2.38^2 / d times
the empirical covariance of this window and the one before, shrunk toward the previous
covariance's diagonal; its multiplier ``scale`` follows a Robbins-Monro recursion
log scale += (t + 1)^-0.6 (acceptance probability - 0.234), restarted at every window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .block import BlockInfo, BlockParams
from .elementwise import StepInfo, StepParams

TARGET_ACCEPT = 0.44
WINDOW = 50
BLOCK_TARGET_ACCEPT = 0.234
#: first covariance window (iterations); each next window is twice as long
FIRST_WINDOW = 50
#: the last part of tuning, with the covariance fixed and only the scale adapting: this
#: fraction of the tuning iterations, at least 50
LAST_BUFFER = 0.1


@dataclass(frozen=True)
class AdaptationState:
    """Acceptance counts since the last adaptation: x (N, M), theta (P,), over n iterations."""

    x: np.ndarray
    theta: np.ndarray
    n: int = 0

    @classmethod
    def empty(cls, params: StepParams) -> AdaptationState:
        return cls(np.zeros_like(params.state_scale), np.zeros_like(params.param_scale), 0)


def update(params: StepParams, counts: AdaptationState, info: StepInfo,
           window: int = WINDOW) -> tuple[StepParams, AdaptationState]:
    """Add one step's acceptances; at the end of a window rescale the proposals and reset."""
    counts = AdaptationState(counts.x + info.accepted_x, counts.theta + info.moved, counts.n + 1)
    if counts.n < window:
        return params, counts
    new = replace(params,
                  state_scale=params.state_scale * np.exp(2.0 * (counts.x / window - TARGET_ACCEPT)),
                  param_scale=params.param_scale * np.exp(2.0 * (counts.theta / window - TARGET_ACCEPT)))
    return new, AdaptationState.empty(new)


def window_ends(tune: int) -> tuple[int, ...]:
    """Iteration counts after which the block covariance is re-estimated: windows of 50,
    100, 200, ... iterations up to ``tune`` minus the last buffer; a remainder shorter
    than the previous window is added to it."""
    stop = tune - max(50, int(LAST_BUFFER * tune))
    ends, length, end = [], FIRST_WINDOW, FIRST_WINDOW
    while end <= stop:
        ends.append(end)
        length *= 2
        end += length
    if ends and stop - ends[-1] >= length // 2:
        ends.append(stop)
    elif len(ends) > 1:
        ends[-1] = stop
    return tuple(ends)


@dataclass(frozen=True)
class Moments:
    """Running count n, mean (d,) and sum of squared deviations m2 (d, d) (Welford)."""

    n: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> Moments:
        return cls(0, np.zeros(dim), np.zeros((dim, dim)))

    def add(self, z: np.ndarray) -> Moments:
        n = self.n + 1
        delta = z - self.mean
        mean = self.mean + delta / n
        return Moments(n, mean, self.m2 + np.outer(delta, z - mean))

    def merge(self, other: Moments) -> Moments:
        n = self.n + other.n
        if n == 0:
            return self
        delta = other.mean - self.mean
        return Moments(n, self.mean + delta * other.n / n,
                       self.m2 + other.m2 + np.outer(delta, delta) * self.n * other.n / n)


@dataclass(frozen=True)
class BlockAdaptation:
    """Tuning state of the block scheme.

    counts_x : (N, M) sweep acceptances over the current state-scale window of n_x
    iterations; t : Robbins-Monro steps since the last covariance update; window : moments
    of z over the current covariance window; previous : those of the window before (None
    during the first window, whose draws are the burn-in and are forgotten); it :
    iterations so far; ends : :func:`window_ends`.
    """

    counts_x: np.ndarray
    n_x: int
    t: int
    window: Moments
    previous: Moments | None
    it: int
    ends: tuple[int, ...]

    @classmethod
    def start(cls, params: BlockParams, tune: int) -> BlockAdaptation:
        return cls(np.zeros_like(params.state_scale), 0, 0, Moments.empty(params.chol.shape[0]), None, 0,
                   window_ends(tune))


def block_update(params: BlockParams, ad: BlockAdaptation, z: np.ndarray,
                 info: BlockInfo) -> tuple[BlockParams, BlockAdaptation]:
    """One tuning iteration of the block scheme, given z (d,) after the step. At the end of a
    window the covariance is estimated from this window and the one before (not the first)."""
    counts, n_x, state_scale = ad.counts_x + info.accepted_x, ad.n_x + 1, params.state_scale
    if n_x == WINDOW:
        state_scale = state_scale * np.exp(2.0 * (counts / WINDOW - TARGET_ACCEPT))
        counts, n_x = np.zeros_like(counts), 0
    log_scale = np.log(params.scale) + (ad.t + 1) ** -0.6 * (float(np.mean(info.accept_prob)) - BLOCK_TARGET_ACCEPT)
    window = ad.window.add(z)
    it = ad.it + 1
    params = replace(params, state_scale=state_scale, scale=float(np.exp(log_scale)))
    if it not in ad.ends:
        return params, replace(ad, counts_x=counts, n_x=n_x, t=ad.t + 1, window=window, it=it)
    dim = z.size
    pooled = window if ad.previous is None else ad.previous.merge(window)
    n = pooled.n
    previous = params.chol @ params.chol.T
    cov = n / (n + 5.0) * pooled.m2 / max(n - 1, 1) + 5.0 / (n + 5.0) * 1e-2 * np.diag(np.diag(previous))
    try:
        chol = np.linalg.cholesky(2.38**2 / max(dim, 1) * cov)  # dim 0: no parameter is sampled
    except np.linalg.LinAlgError:  # keep the previous covariance
        chol = params.chol
    params = replace(params, chol=chol, scale=1.0)
    # the first window is burn-in and forgotten; every later one is pooled with the next
    kept = None if it == ad.ends[0] else window
    return params, BlockAdaptation(counts, n_x, 0, Moments.empty(dim), kept, it, ad.ends)

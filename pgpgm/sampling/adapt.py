"""Proposal-scale adaptation during burn-in: toward an acceptance rate of 0.44.

Every ``window`` iterations each proposal sd is multiplied by
exp(2 (acceptance rate over the window - 0.44)); after burn-in the scales are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .kernel import StepInfo, StepParams

TARGET_ACCEPT = 0.44
WINDOW = 50


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

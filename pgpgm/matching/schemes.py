"""Sampling schemes: a pure step, its tuning and what it records, chosen by name.

A scheme is a small frozen object with

- ``begin(target, state) -> state``: where the chain starts, given the state at its starting
  parameters with the observed states at the GP means,
- ``start(target, state, tune, state_scale, param_scale) -> (params, adaptation)``,
- ``step(rng, state, params, target) -> (state, info)`` (pure),
- ``adapt(params, adaptation, state, info, target) -> (params, adaptation)`` (burn-in only),
- ``stats(info) -> dict`` (per kept draw) and ``tuned(params) -> dict`` (JSON),
- ``anchor(state, target) -> state``: the log density recomputed against round-off (every
  100 iterations).

``"block"`` (:class:`Block`, the default of :func:`pgpgm.sample`) moves the parameters
and the initial values jointly (:mod:`pgpgm.matching.block`); ``"elementwise"``
(:class:`Elementwise`) is the paper's Metropolis-within-Gibbs scheme
(:mod:`pgpgm.matching.elementwise`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import DataError
from . import adapt
from .block import (
    BlockInfo,
    BlockParams,
    Coordinates,
    block_step,
    block_vector,
    settle_states,
)
from .elementwise import ChainState, StepInfo, StepParams, anchor, refresh, step
from .target import GradientMatchingTarget


def initial_params(target: GradientMatchingTarget, state: ChainState, state_scale=None,
                   param_scale=None) -> StepParams:
    """Starting proposal sds of the element-wise scheme: states 1.5 x their conditional sd
    (or ``state_scale``), parameters 5 % of the starting value, at least 0.01 (or
    ``param_scale``, scalar or (P,))."""
    a = target.arrays
    N, M = target.density.obs.values.shape
    P = state.q.size  # parameters and unknown latent initial values
    sx = 1.5 * a.conditional_sd() if state_scale is None else np.full((N, M), float(state_scale))
    sp = np.maximum(0.05 * np.abs(state.q), 0.01) if param_scale is None else param_scale
    return StepParams(sx, np.broadcast_to(np.asarray(sp, float), (P,)).copy(), np.ones(M, bool), np.ones(P, bool))


@dataclass(frozen=True)
class Elementwise:
    """The paper's scheme: a sweep over the observed-state values, then each initial
    value (latent states only) and each parameter proposed alone, each with a solve;
    proposal sds tuned toward 0.44 acceptance (:func:`pgpgm.matching.adapt.update`)."""

    name: ClassVar[str] = "elementwise"

    def begin(self, target: GradientMatchingTarget, state: ChainState) -> ChainState:
        """The paper's start: the observed states at the GP means."""
        return state

    def start(self, target: GradientMatchingTarget, state: ChainState, tune: int, state_scale=None,
              param_scale=None) -> tuple[StepParams, adapt.AdaptationState]:
        params = initial_params(target, state, state_scale, param_scale)
        return params, adapt.AdaptationState.empty(params)

    def step(self, rng, state, params, target):
        return step(rng, state, params, target)

    def adapt(self, params, adaptation, state, info: StepInfo, target):
        return adapt.update(params, adaptation, info)

    def anchor(self, state: ChainState, target: GradientMatchingTarget) -> ChainState:
        """The full density evaluated afresh (one ODE solve with latent states), as recorded
        in the reference draws of this scheme."""
        return anchor(state, target)

    def stats(self, info: StepInfo) -> dict[str, Any]:
        return {"accept_x": float(info.accepted_x.mean()) if info.accepted_x.size else 0.0,
                "accept_theta": info.moved.copy()}

    def tuned(self, params: StepParams) -> dict[str, Any]:
        return {"state": params.state_scale.tolist(), "param": params.param_scale.tolist()}


@dataclass(frozen=True)
class Block:
    """The default scheme: the state sweep, then ``n_moves`` joint moves of the parameters
    (log coordinates where bounded below) and the initial values, with the observed states
    redrawn from their Gaussian given the proposal (:mod:`pgpgm.matching.block`). The
    proposal covariance is learned in restarting windows during tuning, its scale toward
    0.234 acceptance (:func:`pgpgm.matching.adapt.block_update`).

    Parameters
    ----------
    n_moves : block moves per iteration (each one ODE solve)
    """

    n_moves: int = 4
    name: ClassVar[str] = "block"

    def __post_init__(self):
        if int(self.n_moves) != self.n_moves or self.n_moves < 1:
            raise DataError(f"n_moves must be a positive integer, got {self.n_moves!r}")

    def start(self, target: GradientMatchingTarget, state: ChainState, tune: int, state_scale=None,
              param_scale=None) -> tuple[BlockParams, adapt.BlockAdaptation]:
        a, d = target.arrays, target.density
        N, M = a.Y.shape
        coords = Coordinates.of(target)
        sx = 1.5 * a.conditional_sd() if state_scale is None else np.full((N, M), float(state_scale))
        if param_scale is None:
            sp = np.where(coords.log, 0.05, np.maximum(0.05 * np.abs(state.q), 0.01))
        else:  # given in parameter units: in log coordinates relative to the distance from the bound
            sp = np.broadcast_to(np.asarray(param_scale, float), state.q.shape)
            sp = np.where(coords.log, sp / np.maximum(state.q - coords.lower, 1e-12), sp)
        sd = np.concatenate([sp, d.noise_sd]) if d.latent else sp
        params = BlockParams(sx, np.diag(sd), 1.0, int(self.n_moves), coords,
                             d.system.linear_in(list(d.observed_idx)))
        return params, adapt.BlockAdaptation.start(params, tune)

    def begin(self, target: GradientMatchingTarget, state: ChainState) -> ChainState:
        """The observed states at their Gaussian's mean given the starting parameters
        (:func:`pgpgm.matching.block.settle_states`)."""
        return settle_states(target, state)

    def step(self, rng, state, params, target):
        return block_step(rng, state, params, target)

    def adapt(self, params, adaptation, state, info: BlockInfo, target):
        return adapt.block_update(params, adaptation, block_vector(state, params, target), info)

    def anchor(self, state: ChainState, target: GradientMatchingTarget) -> ChainState:
        """The state part recomputed, the parameter part kept: no ODE solve, so every solve
        of this scheme is one block proposal's."""
        return refresh(state, target)

    def stats(self, info: BlockInfo) -> dict[str, Any]:
        return {"accept_x": float(info.accepted_x.mean()) if info.accepted_x.size else 0.0,
                "accept_block": float(info.accepted.mean())}

    def tuned(self, params: BlockParams) -> dict[str, Any]:
        cov = params.scale**2 * params.chol @ params.chol.T
        return {"state": params.state_scale.tolist(), "block_covariance": cov.tolist(),
                "log_coordinates": params.coords.log.tolist(), "lower": params.coords.lower.tolist()}


SCHEMES = {"block": Block, "elementwise": Elementwise}


def get_scheme(scheme: str | Elementwise | Block) -> Elementwise | Block:
    """A scheme by name (``"block"``, ``"elementwise"``) or a scheme object as is."""
    if isinstance(scheme, Elementwise | Block):
        return scheme
    if isinstance(scheme, str) and scheme in SCHEMES:
        return SCHEMES[scheme]()
    raise DataError(f"scheme must be one of {sorted(SCHEMES)} or a scheme object, got {scheme!r}")

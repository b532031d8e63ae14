"""The chain state and one iteration of the paper's element-wise scheme, as a pure step.

``step(rng, state, params, target) -> (state, info)`` (as blackjax writes its kernels):

1. every observed-state value x_k(t_i) in turn gets a Gaussian proposal (sd
   ``params.state_scale[i, k]``) accepted by the density. The change of the density is
   computed in O(N) from the maintained vectors of
   :meth:`pgpgm.matching.density.GradientMatchingDensity.statistics`, in a numba loop;
2. with latent states, the value at ``times[0]`` of each observed state is the initial
   value of the solve: it is proposed like a parameter (re-integrating) and accepted by
   the full model density;
3. every parameter in turn gets a Gaussian proposal (sd ``params.param_scale[j]``); the
   latent states are re-integrated and the move accepted by the full model density.

The state is small and immutable; the step copies what it changes. The state sweep
(:func:`sweep_states`) is shared with the block scheme (:mod:`pgpgm.matching.block`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import PgpgmError
from .compiled import model_sweeps
from .density import SweepStatistics
from .target import GradientMatchingTarget


@dataclass(frozen=True)
class ChainState:
    """Where a chain is.

    q : (P,) the sampler's parameter coordinates; theta : (P,) the parameters;
    X : (N, S) every state (observed: sampled; latent: integrated);
    stats : the maintained vectors at (theta, X); logp : the model log density;
    conditional : the block scheme's Gaussian of the observed states given the current
    parameters, kept where it does not depend on the states (f affine in the observed states:
    :class:`~pgpgm.matching.conditional.ConditionalGaussian`; None until the block scheme
    computes it, and otherwise);
    logp_par : the log density's terms in the parameters alone, with the latent states
    (:meth:`~pgpgm.matching.target.GradientMatchingTarget.parameter_part`; the state sweep
    leaves it unchanged), so that :func:`refresh` needs no ODE solve (NaN where unknown:
    the element-wise step does not keep it).
    """

    q: np.ndarray
    theta: np.ndarray
    X: np.ndarray
    stats: SweepStatistics
    logp: float
    conditional: Any = None
    logp_par: float = np.nan


@dataclass(frozen=True)
class StepParams:
    """Proposal sds: state_scale (N, M) in state units, param_scale (P,) in coordinate units;
    which observed states (M,) and parameters (P,) the step moves."""

    state_scale: np.ndarray
    param_scale: np.ndarray
    move_states: np.ndarray
    move_params: np.ndarray


@dataclass(frozen=True)
class StepInfo:
    """What one step did: accepted_x (N, M) 0/1 per state value, moved (P,) per parameter."""

    accepted_x: np.ndarray
    moved: np.ndarray


def init(target: GradientMatchingTarget, q0, X0=None) -> ChainState:
    """The chain state at coordinates q0 (P,) and observed states X0 (N, M) (GP means if None)."""
    d = target.density
    X = d.gp_states(X0)
    q0 = np.asarray(q0, float)
    logp, theta, lat = target.evaluate(q0, X)
    if not np.isfinite(logp):
        raise PgpgmError(f"the density is not finite at the starting point {q0.tolist()}: "
                         + target.explain(q0, X))
    if lat is not None:
        X[:, list(d.latent_idx)] = lat
    stats = target.statistics(theta, X)
    return ChainState(q0, theta, X, stats, logp, logp_par=logp - target.state_part(X, stats))


def anchor(state: ChainState, target: GradientMatchingTarget) -> ChainState:
    """The same state with its log density evaluated afresh (against round-off of the sweep's
    sums; with latent states one ODE solve: the element-wise scheme's anchor)."""
    return replace(state, logp=target.evaluate(state.q, state.X)[0])


def refresh(state: ChainState, target: GradientMatchingTarget) -> ChainState:
    """The same state with its maintained vectors and log density computed afresh (against
    round-off of the sweep's sums) without an ODE solve: ``logp_par`` plus the state part
    (:func:`anchor` where ``logp_par`` is unknown)."""
    if not np.isfinite(state.logp_par):
        return anchor(state, target)
    stats = target.statistics(state.theta, state.X)
    return replace(state, stats=stats, logp=state.logp_par + target.state_part(state.X, stats))


def sweep_states(rng: np.random.Generator, state: ChainState, state_scale: np.ndarray, move_states: np.ndarray,
                 target: GradientMatchingTarget) -> tuple[ChainState, np.ndarray]:
    """One pass of Gaussian single-value proposals (sds ``state_scale`` (N, M)) over the
    observed-state values of the states ``move_states`` (M,), each accepted in O(N) from the
    maintained vectors; the values at ``times[0]`` are left alone when latent states exist
    (they are the solve's initial values). Returns the new state and acceptances (N, M)."""
    d, a = target.density, target.arrays
    N, M = d.obs.values.shape
    X, st = state.X.copy(), state.stats
    F, w, r, z = st.F.copy(), st.w.copy(), st.r.copy(), st.z.copy()
    accepted = np.zeros((N, M))
    delta = model_sweeps(d.system.compiled).sweep(d.obs.times, X, state.theta, a.obs_idx, move_states,
                                    1 if d.latent else 0, a.Y, a.obs_precision, a.Cinv, a.Dt, a.P, a.PDt, a.dtpd,
                                    w, r, z, F, state_scale, rng.standard_normal((N, M)),
                                    np.log(rng.uniform(size=(N, M))), accepted)
    return replace(state, X=X, stats=SweepStatistics(F, w, r, z), logp=state.logp + delta), accepted


def step(rng: np.random.Generator, state: ChainState, params: StepParams,
         target: GradientMatchingTarget) -> tuple[ChainState, StepInfo]:
    """One Metropolis-within-Gibbs iteration; returns the new state and what moved."""
    d = target.density
    M = d.obs.values.shape[1]
    # 1. state values, O(N) each, compiled
    swept, accepted = sweep_states(rng, state, params.state_scale, params.move_states, target)
    X, q, theta, logp, stats = swept.X, swept.q, swept.theta, swept.logp, swept.stats
    # 2. values at t_0 move the latent states' solve: full density
    for m in range(M if d.latent else 0):
        if not params.move_states[m]:
            continue
        Xp = X.copy()
        Xp[0, d.observed_idx[m]] += params.state_scale[0, m] * rng.standard_normal()
        lp, _, lat = target.evaluate(q, Xp)
        if np.log(rng.uniform()) < lp - logp:
            Xp[:, list(d.latent_idx)] = lat
            X, logp = Xp, lp
            accepted[0, m] = 1
            stats = target.statistics(theta, X)
    # 3. parameters, each with a fresh latent-state solve
    moved = np.zeros(q.size, dtype=bool)  # parameters, then unknown latent initial values
    for j in np.flatnonzero(params.move_params):
        prop = q.copy()
        prop[j] += params.param_scale[j] * rng.standard_normal()
        lp, theta_p, lat = target.evaluate(prop, X)
        if np.log(rng.uniform()) < lp - logp:  # -inf (outside prior, failed solve) rejects
            q, theta, logp = prop, theta_p, lp
            if lat is not None:
                X = X.copy()
                X[:, list(d.latent_idx)] = lat
            stats = target.statistics(theta, X)
            moved[j] = True
    return ChainState(q, theta, X, stats, logp), StepInfo(accepted, moved)

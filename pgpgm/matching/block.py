"""The block scheme: the parameters and the initial values in one adaptive random-walk move.

``block_step(rng, state, params, target) -> (state, info)``, one iteration:

1. the state sweep of the element-wise scheme (:func:`~pgpgm.matching.elementwise.sweep_states`);
2. ``params.n_moves`` times, a joint move of z = (the parameters in log coordinates
   (:class:`Coordinates`), and with latent states the observed states' values at
   ``times[0]``): z' = z + scale L e with e standard normal, L L^T the proposal
   covariance learned during tuning (:mod:`pgpgm.matching.adapt`). One ODE solve at z'
   gives the latent states; the remaining observed-state values are drawn afresh from
   q(X' | z', X), the Gaussian of the observed states given z' (:mod:`pgpgm.matching.conditional`)
   with f linearised about the current states X, and the pair is accepted with

       log r = log p(z', X') - log p(z, X) + log q(X | z, X') - log q(X' | z', X) + log |dtheta'/dz'| - log |dtheta/dz|,

   q(X | z, X') being the reverse move's Gaussian, linearised about X'.

   When f is linear in the observed states the Gaussian is exact (and the same about any
   point), the ratio is that of the marginal density of z, and the move is a random walk on
   the marginal: the states no longer pin the parameters, which is what makes the
   element-wise scheme mix slowly. When f is not (Lotka-Volterra or FitzHugh-Nagumo with
   every state observed), a Gaussian linearised about a fixed point, e.g. the GP means, can
   be far from the states the parameters imply; the current states X were then so unlikely
   under it that no move was accepted in 3500 iterations. Linearised about X it follows the
   chain.

:func:`settle_states` starts a chain's observed states at the Gaussian's mean given the
starting parameters (instead of the GP means), so that the first moves' reverse densities
are not negligible.

Every proposal costs one ODE solve (none without latent states) and two Gaussians (one when f
is affine in the observed states: the current parameters' Gaussian is kept for the reverse
moves).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numba
import numpy as np

from .conditional import conditional_gaussian
from .elementwise import ChainState, refresh, sweep_states
from .target import GradientMatchingTarget


@dataclass(frozen=True)
class Coordinates:
    """The block move's parameter coordinates: phi_j = log(q_j - lower_j) where ``log[j]``
    (parameters bounded below), phi_j = q_j otherwise.

    lower : (P,) lower bounds (ignored where not ``log``); log : (P,) bool.
    """

    lower: np.ndarray
    log: np.ndarray

    @classmethod
    def of(cls, target: GradientMatchingTarget) -> Coordinates:
        """Log coordinates for every parameter bounded below in the constrained space;
        PyMC's value space is unbounded already (identity)."""
        P = len(target.coordinate_names)  # parameters and unknown latent initial values
        if target.space == "value":
            return cls(np.zeros(P), np.zeros(P, bool))
        lower = target.lower_bounds()
        return cls(np.where(np.isfinite(lower), lower, 0.0), np.isfinite(lower))

    def forward(self, q: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.log, np.log(q - self.lower), q)

    def backward(self, phi: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.where(self.log, self.lower + np.exp(phi), phi)

    def log_jacobian(self, phi: np.ndarray) -> float:
        """log |dq/dphi|."""
        return float(np.sum(phi[self.log]))


@dataclass(frozen=True)
class BlockParams:
    """Tuned quantities of the block scheme.

    state_scale : (N, M) sds of the sweep's single-value proposals (state units);
    chol : (d, d) lower Cholesky factor of the block proposal covariance (already scaled
    by 2.38^2 / d); scale : multiplier of ``chol``; n_moves : block moves per iteration;
    coords : the parameter coordinates; affine : f is affine in the observed states
    (:meth:`pgpgm.ODESystem.linear_in`), so the Gaussian at the current parameters serves every
    reverse move and one Gaussian per move suffices.
    """

    state_scale: np.ndarray
    chol: np.ndarray
    scale: float
    n_moves: int
    coords: Coordinates
    affine: bool = False


@dataclass(frozen=True)
class BlockInfo:
    """What one block step did: accepted_x (N, M) sweep acceptances; accept_prob
    (n_moves,) the acceptance probability of each block move; accepted (n_moves,) bool."""

    accepted_x: np.ndarray
    accept_prob: np.ndarray
    accepted: np.ndarray


def block_vector(state: ChainState, params: BlockParams, target: GradientMatchingTarget) -> np.ndarray:
    """z (d,) of a state: the parameter coordinates, then (latent states only) the observed
    states' values at ``times[0]``."""
    phi = params.coords.forward(state.q)
    if not target.arrays.lat_idx.size:
        return phi
    return np.concatenate([phi, state.X[0, target.arrays.obs_idx]])


#: Gauss-Newton iterations of :func:`settle_states` (at most; it stops when the density stops rising)
SETTLE_ITERATIONS = 10
#: the step lengths tried along each Gauss-Newton direction, longest first
SETTLE_STEPS = (1.0, 0.5, 0.25, 0.125)


def settle_states(target: GradientMatchingTarget, state: ChainState,
                  iterations: int = SETTLE_ITERATIONS) -> ChainState:
    """A chain's start with its observed states' free values moved toward the mode of their
    density given the parameters: damped Gauss-Newton from the given states (toward the mean
    of the Gaussian linearised about them, the longest of :data:`SETTLE_STEPS` that raises the
    density; at most ``iterations`` times, until no step does).

    Where the parameters are far from the data's, the GP means are far from the states they
    imply and the block move's reverse density there is negligible: a chain started at them
    does not move. A start is arbitrary, so the stationary distribution is unchanged. No ODE
    solve: the parameters, the initial values and so the latent states stay."""
    obs, best = target.arrays.obs_idx, state
    for _ in range(iterations):
        try:
            g = conditional_gaussian(target, best.theta, best.X)
        except np.linalg.LinAlgError:
            break
        x = g.values(best.X, obs)
        for step in SETTLE_STEPS:
            new = refresh(replace(best, X=g.put(best.X, obs, x + step * (g.mean - x))), target)
            if new.logp > best.logp:  # False when not finite
                best = new
                break
        else:
            break
    return best


@numba.njit(cache=True)
def _proposal(q, x0, lower, log, chol, scale, e):
    """The block proposal from coordinates q (P,) and observed initial values x0 (d - P,):
    z = (phi(q), x0), z' = z + scale chol e for e (d,); returns z' (d,), q' = phi^-1(z'[:P])
    (P,) and log |dq'/dphi'| - log |dq/dphi| (phi_j = log(q_j - lower_j) where ``log[j]``,
    q_j otherwise: :class:`Coordinates`)."""
    P, d = q.size, chol.shape[0]
    z = np.empty(d)
    log_jac = 0.0
    for j in range(P):
        if log[j]:
            z[j] = np.log(q[j] - lower[j])
            log_jac -= z[j]
        else:
            z[j] = q[j]
    for j in range(P, d):
        z[j] = x0[j - P]
    zp = np.empty(d)
    for i in range(d):
        s = 0.0
        for k in range(d):
            s += chol[i, k] * e[k]
        zp[i] = z[i] + scale * s
    qp = np.empty(P)
    for j in range(P):
        if log[j]:
            qp[j] = lower[j] + np.exp(zp[j])
            log_jac += zp[j]
        else:
            qp[j] = zp[j]
    return zp, qp, log_jac


def block_move(rng: np.random.Generator, state: ChainState, params: BlockParams,
               target: GradientMatchingTarget) -> tuple[ChainState, float, bool]:
    """One joint move of (z, the free observed-state values); returns the state, the
    acceptance probability and whether it was accepted.

    The new states are drawn from the Gaussian at z' linearised about the current states
    (X's observed values, the latent states of the solve at z'); the reverse move's density
    is that of the Gaussian at z linearised about the drawn states."""
    a = target.arrays
    P, obs = state.q.size, a.obs_idx  # the coordinates: parameters, then unknown latent initial values
    i0 = 1 if a.lat_idx.size else 0
    d = params.chol.shape[0]
    K = (state.X.shape[0] - i0) * obs.size
    normals = rng.standard_normal(d + K)  # the move of z, then the draw of the states
    log_u = np.log(rng.uniform())
    zp, qp, log_jac = _proposal(state.q, state.X[0, obs], params.coords.lower, params.coords.log, params.chol,
                                params.scale, normals)
    Xp = state.X.copy()
    if a.lat_idx.size:
        Xp[0, obs] = zp[P:]
    lp_par, theta_p, lat = target.parameter_part(qp, Xp)
    if not np.isfinite(lp_par):  # outside the prior, or a failed solve
        return state, 0.0, False
    if lat is not None:
        Xp[:, a.lat_idx] = lat
    try:
        if params.affine and state.conditional is None:
            state = replace(state, conditional=conditional_gaussian(target, state.theta, state.X))
        forward = conditional_gaussian(target, theta_p, Xp)  # about the current observed values
        log_q_new = forward.draw_into(Xp, obs, normals[d:])
        if params.affine:  # the same Gaussian about any point
            log_q_back = state.conditional.logpdf_at(state.X, obs)
        else:
            back = state.X.copy()
            back[i0:, obs] = Xp[i0:, obs]
            log_q_back = conditional_gaussian(target, state.theta, back).logpdf_at(state.X, obs)
    except np.linalg.LinAlgError:
        return state, 0.0, False
    stats, lp_states = target.state_terms(theta_p, Xp)
    lp = lp_par + lp_states
    log_r = lp - state.logp + log_q_back - log_q_new + log_jac
    prob = float(np.exp(min(0.0, log_r))) if np.isfinite(log_r) else 0.0
    if log_u < log_r:
        kept = forward if params.affine else None
        return ChainState(qp, theta_p, Xp, stats, lp, kept, lp_par), prob, True
    return state, prob, False


def block_step(rng: np.random.Generator, state: ChainState, params: BlockParams,
               target: GradientMatchingTarget) -> tuple[ChainState, BlockInfo]:
    """The state sweep, then ``params.n_moves`` block moves."""
    M = target.arrays.Y.shape[1]
    state, accepted_x = sweep_states(rng, state, params.state_scale, np.ones(M, bool), target)
    probs, acc = np.zeros(params.n_moves), np.zeros(params.n_moves, bool)
    for k in range(params.n_moves):
        state, probs[k], acc[k] = block_move(rng, state, params, target)
    return state, BlockInfo(accepted_x, probs, acc)

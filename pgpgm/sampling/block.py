"""The block scheme: the parameters and the initial values in one adaptive random-walk move.

``block_step(rng, state, params, target) -> (state, info)``, one iteration:

1. the state sweep of the element-wise scheme (:func:`~pgpgm.sampling.kernel.sweep_states`);
2. ``params.n_moves`` times, a joint move of z = (the parameters in log coordinates
   (:class:`Coordinates`), and with latent states the observed states' values at
   ``times[0]``): z' = z + scale L e with e standard normal, L L^T the proposal
   covariance learned during tuning (:mod:`pgpgm.sampling.adapt`). One ODE solve at z'
   gives the latent states; the remaining observed-state values are drawn afresh from
   the Gaussian of the observed states given z' (:mod:`pgpgm.sampling.conditional`,
   f linearised about the GP means), and the pair is accepted with

       log r = log p(z', X') - log p(z, X) + log q(X | z) - log q(X' | z') + log |dtheta'/dz'| - log |dtheta/dz|.

   When f is linear in the observed states the Gaussian is exact, the ratio is that of the
   marginal density of z, and the move is a random walk on the marginal: the states no
   longer pin the parameters, which is what makes the element-wise scheme mix slowly.

Every proposal costs one ODE solve (none without latent states).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .conditional import ConditionalGaussian, conditional_gaussian
from .kernel import ChainState, sweep_states
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
    coords : the parameter coordinates.
    """

    state_scale: np.ndarray
    chol: np.ndarray
    scale: float
    n_moves: int
    coords: Coordinates


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


def _linearisation_point(target: GradientMatchingTarget, x0, latent) -> np.ndarray:
    """X_bar (N, S): the GP means, ``x0`` (M,) at times[0] (latent states only), the latent states."""
    a = target.arrays
    X = np.zeros((a.Y.shape[0], a.obs_idx.size + a.lat_idx.size))
    X[:, a.obs_idx] = a.gp_mean
    if a.lat_idx.size:
        X[0, a.obs_idx] = x0
        X[:, a.lat_idx] = latent
    return X


def _conditional_at(target: GradientMatchingTarget, state: ChainState) -> ConditionalGaussian:
    a = target.arrays
    return conditional_gaussian(target, state.theta, _linearisation_point(target, state.X[0, a.obs_idx],
                                                                          state.X[:, a.lat_idx]))


def block_move(rng: np.random.Generator, state: ChainState, params: BlockParams,
               target: GradientMatchingTarget) -> tuple[ChainState, float, bool]:
    """One joint move of (z, the free observed-state values); returns the state, the
    acceptance probability and whether it was accepted."""
    a = target.arrays
    P = state.q.size  # the coordinates: parameters, then unknown latent initial values
    obs, latent = a.obs_idx, a.lat_idx.size > 0
    if state.conditional is None:
        state = replace(state, conditional=_conditional_at(target, state))
    cur = state.conditional
    z = block_vector(state, params, target)
    zp = z + params.scale * (params.chol @ rng.standard_normal(z.size))
    normals = rng.standard_normal(cur.mean.size)
    log_u = np.log(rng.uniform())
    qp = params.coords.backward(zp[:P])
    Xp = state.X.copy()
    if latent:
        Xp[0, obs] = zp[P:]
    lp_par, theta_p, lat = target.parameter_part(qp, Xp)
    if not np.isfinite(lp_par):  # outside the prior, or a failed solve
        return state, 0.0, False
    if latent:
        Xp[:, a.lat_idx] = lat
    try:
        new = conditional_gaussian(target, theta_p, _linearisation_point(target, zp[P:], lat))
    except np.linalg.LinAlgError:
        return state, 0.0, False
    log_q_new = new.draw_into(Xp, obs, normals)
    stats = target.statistics(theta_p, Xp)
    lp = lp_par + target.state_part(Xp, stats)
    log_r = (lp - state.logp + cur.logpdf_at(state.X, obs) - log_q_new
             + params.coords.log_jacobian(zp[:P]) - params.coords.log_jacobian(z[:P]))
    prob = float(np.exp(min(0.0, log_r))) if np.isfinite(log_r) else 0.0
    if log_u < log_r:
        return ChainState(qp, theta_p, Xp, stats, lp, new, lp_par), prob, True
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

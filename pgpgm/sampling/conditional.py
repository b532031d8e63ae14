"""A Gaussian for the observed states given the parameters: the block scheme's state refresh.

Given the parameters theta and the latent states (fixed by one solve), the density is a
function of the observed states x_M alone,

    -1/2 sum_k u_k^T C_k^-1 u_k - 1/2 sum_k |y_k - x_k|^2 / sigma_k^2 - 1/2 sum_k r_k^T P_k r_k,
    u_k = x_k - mu_k,  r_k = f_k(x) - D_k u_k,  P_k = (A_k + gamma I)^-1,

which is Gaussian in x_M once f is linearised in the observed states about a point
X_bar: f_k(x) ~ f_k(X_bar) + sum_l J_kl (x_l - X_bar_l), with J_kl the diagonal (over
time) matrix of df_k/dx_l. The precision is

    Lambda = blockdiag(C_k^-1 + W_k) + sum_k G_k^T P_k G_k,   W_k = diag(1/sigma_k^2 where measured, else 0)
    G_k = [J_k1, ..., J_kM] - (D_k in block k),

and the mean solves Lambda m = b. When f is linear in the observed states given the
latent ones (dx/dt = theta; Lotka-Volterra with one state observed) the Gaussian is the
exact conditional. Rows held fixed (the values at ``times[0]`` when latent states
exist: they are the initial values of the solve) are conditioned on.

Building it costs O(N^2 M^2) for Lambda and O((N M)^3 / 3) for its Cholesky factor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from scipy import linalg

from .target import GradientMatchingTarget


@dataclass(frozen=True)
class ConditionalGaussian:
    """N(mean, Lambda^-1) over the free observed-state values.

    free : (K,) flat indices m * N + i of the free values (state m, time i) of the
    observed-state matrix transposed, X[:, obs].T; mean : (K,); chol : (K, K) lower
    Cholesky factor of the precision Lambda.
    """

    free: np.ndarray
    mean: np.ndarray
    chol: np.ndarray

    def logpdf(self, x: np.ndarray) -> float:
        """log density at x (K,)."""
        v = self.chol.T @ (x - self.mean)
        return float(-0.5 * v @ v + np.log(np.diag(self.chol)).sum() - 0.5 * x.size * np.log(2 * np.pi))

    def draw(self, normals: np.ndarray) -> np.ndarray:
        """The draw mean + L^-T e for standard normals e (K,)."""
        return self.mean + linalg.solve_triangular(self.chol, normals, lower=True, trans="T", check_finite=False)

    def values(self, X: np.ndarray, obs_idx) -> np.ndarray:
        """The free values (K,) of states X (N, S)."""
        return np.ascontiguousarray(X[:, obs_idx].T).ravel()[self.free]

    def put(self, X: np.ndarray, obs_idx, x: np.ndarray) -> np.ndarray:
        """A copy of X (N, S) with the free observed values set to x (K,)."""
        flat = np.ascontiguousarray(X[:, obs_idx].T).ravel()
        flat[self.free] = x
        out = X.copy()
        out[:, obs_idx] = flat.reshape(len(obs_idx), -1).T
        return out


def free_indices(N: int, M: int, first_fixed: bool) -> np.ndarray:
    """Flat indices m * N + i of the free values: all, or all but i = 0."""
    i0 = 1 if first_fixed else 0
    return (np.arange(M)[:, None] * N + np.arange(i0, N)[None, :]).ravel()


def conditional_gaussian(target: GradientMatchingTarget, theta: np.ndarray, Xbar: np.ndarray) -> ConditionalGaussian:
    """The Gaussian of the free observed-state values given theta (P,) and the latent
    states in Xbar (N, S), f linearised about Xbar (whose fixed rows are the conditioned-on
    values). Raises ``numpy.linalg.LinAlgError`` if the precision is not numerically
    positive definite."""
    d, a = target.density, target.arrays
    N, M = a.Y.shape
    obs = a.obs_idx
    F = d.system.rhs_on_grid(d.obs.times, Xbar, theta)
    J = np.empty((N, d.system.n_states, d.system.n_states))
    _jacobian_on_grid(d.system.compiled.jac_x, d.obs.times, np.ascontiguousarray(Xbar, float),
                      np.asarray(theta, float), J)
    j = J[:, obs][:, :, obs]  # (N, M, M): d f_{obs m} / d x_{obs l}
    lam = np.zeros((M, N, M, N))
    b = a.lin.copy()
    for m in range(M):
        lam[m, :, m, :] += a.Cinv[m] + np.diag(a.obs_precision[m])
    xbar = Xbar[:, obs]
    for m in range(M):  # the gradient-matching term of state m
        am = F[:, obs[m]] - np.sum(j[:, m, :] * xbar, axis=1) + a.Dmu[m]
        pa = a.P[m] @ am
        for l1 in range(M):
            for l2 in range(M):
                block = a.P[m] * np.outer(j[:, m, l1], j[:, m, l2])
                if l1 == m:
                    block -= a.PDt[m] * j[None, :, m, l2]
                if l2 == m:
                    block -= a.PDt[m].T * j[:, m, l1, None]
                if l1 == m and l2 == m:
                    block += a.DtPD[m]
                lam[l1, :, l2, :] += block
            b[l1] -= j[:, m, l1] * pa
        b[m] += a.Dt[m] @ pa
    i0 = 1 if a.lat_idx.size else 0  # the values at times[0] are the solve's initial values: fixed
    K = M * (N - i0)
    rhs = b[:, i0:].reshape(K)
    if i0:
        rhs = rhs - lam[:, 1:, :, 0].reshape(K, M) @ xbar[0]
    chol = np.linalg.cholesky(lam[:, i0:, :, i0:].reshape(K, K))
    mean = linalg.cho_solve((chol, True), rhs, check_finite=False)
    free = free_indices(N, M, bool(i0))
    return ConditionalGaussian(free, mean, chol)


@numba.njit(cache=False)
def _jacobian_on_grid(jac_x, t, X, theta, out):
    """out[i] = df/dx (S, S) at (t[i], X[i]) for every time i."""
    for i in range(t.size):
        jac_x(t[i], X[i], theta, out[i])

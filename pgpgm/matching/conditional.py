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
from functools import lru_cache

import numba
import numpy as np
from scipy.linalg import lapack

from .compiled import model_sweeps
from .target import GradientMatchingTarget


@dataclass(frozen=True)
class ConditionalGaussian:
    """N(mean, Lambda^-1) over the free observed-state values.

    free : (K,) flat indices m * N + i of the free values (state m, time i) of the
    observed-state matrix transposed, X[:, obs].T; mean : (K,); chol : (K, K) lower
    Cholesky factor of the precision Lambda; log_norm : its normalising constant,
    sum(log diag(chol)) - K/2 log(2 pi).
    """

    free: np.ndarray
    mean: np.ndarray
    chol: np.ndarray
    log_norm: float

    def logpdf(self, x: np.ndarray) -> float:
        """log density at x (K,)."""
        v = self.chol.T @ (x - self.mean)
        return float(-0.5 * v @ v + self.log_norm)

    def logpdf_at(self, X: np.ndarray, obs_idx: np.ndarray) -> float:
        """log density at the free values of states X (N, S): ``logpdf(values(X, obs_idx))``
        in one compiled call."""
        return _logpdf_at(self.mean, self.chol, self.log_norm, X, obs_idx, X.shape[0] - self.mean.size
                          // len(obs_idx))

    def draw(self, normals: np.ndarray) -> np.ndarray:
        """The draw mean + L^-T e for standard normals e (K,)."""
        # LAPACK directly: scipy.linalg's wrappers cost more than this K x K solve
        return self.mean + lapack.dtrtrs(self.chol, normals, lower=1, trans=1)[0]

    def draw_into(self, X: np.ndarray, obs_idx: np.ndarray, normals: np.ndarray) -> float:
        """Write the draw ``draw(normals)`` into the free values of X (N, S) in place; returns
        its log density, -e.e/2 + log_norm (L^T (x - mean) = e)."""
        _draw_into(self.mean, self.chol, normals, X, obs_idx, X.shape[0] - self.mean.size // len(obs_idx))
        return float(-0.5 * normals @ normals + self.log_norm)

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


@lru_cache(maxsize=64)
def free_indices(N: int, M: int, first_fixed: bool) -> np.ndarray:
    """Flat indices m * N + i of the free values: all, or all but i = 0 (read-only: one
    array per shape, computed once, since every block proposal needs it)."""
    i0 = 1 if first_fixed else 0
    out = (np.arange(M)[:, None] * N + np.arange(i0, N)[None, :]).ravel()
    out.flags.writeable = False
    return out


def conditional_gaussian(target: GradientMatchingTarget, theta: np.ndarray, Xbar: np.ndarray) -> ConditionalGaussian:
    """The Gaussian of the free observed-state values given theta (P,) and the latent
    states in Xbar (N, S), f linearised about Xbar (whose fixed rows are the conditioned-on
    values). Raises ``numpy.linalg.LinAlgError`` if the precision is not numerically
    positive definite."""
    d, a = target.density, target.arrays
    N, M = a.Y.shape
    S = d.system.n_states
    Xbar = np.ascontiguousarray(Xbar, dtype=np.float64)
    theta = np.asarray(theta, dtype=np.float64)
    F = d.system.rhs_on_grid(d.obs.times, Xbar, theta)
    J = np.zeros((N, S, S))  # jac_x writes only the nonzero entries
    model_sweeps(d.system.compiled).jacobian_on_grid(d.obs.times, Xbar, theta, J)
    i0 = 1 if a.lat_idx.size else 0  # the values at times[0] are the solve's initial values: fixed
    mean, chol, log_norm = _gaussian(F, J, Xbar, a.obs_idx, a.Cinv, a.obs_precision, a.P, a.PDt, a.DtPD, a.Dt,
                                     a.lin, a.Dmu, i0)
    return ConditionalGaussian(free_indices(N, M, bool(i0)), mean, chol, log_norm)


@numba.njit(cache=True)
def _gaussian(F, J, Xbar, obs_idx, Cinv, obs_precision, P, PDt, DtPD, Dt, lin, Dmu, i0):
    """mean (K,), lower Cholesky factor (K, K) of the precision and the normalising constant of
    the Gaussian over the free values (rows i >= i0 of every observed state, state-major), the
    fixed rows conditioned on: f linearised about Xbar (N, S), where f is F (N, S) and df/dx
    J (N, S, S); ``obs_idx`` (M,) the observed states' columns (see
    :func:`_precision_and_linear_term` for the other arguments). Raises
    ``numpy.linalg.LinAlgError`` if the precision is not positive definite."""
    M, N = Cinv.shape[0], Cinv.shape[1]
    Fo, xbar, j = np.empty((N, M)), np.empty((N, M)), np.empty((N, M, M))
    for i in range(N):
        for m in range(M):
            Fo[i, m], xbar[i, m] = F[i, obs_idx[m]], Xbar[i, obs_idx[m]]
            for l in range(M):
                j[i, m, l] = J[i, obs_idx[m], obs_idx[l]]
    lam, b = _precision_and_linear_term(Fo, j, xbar, Cinv, obs_precision, P, PDt, DtPD, Dt, lin, Dmu)
    n = N - i0
    K = M * n
    A = np.empty((K, K))
    rhs = np.empty(K)
    for m in range(M):
        for i in range(i0, N):
            p = m * n + i - i0
            s = b[m, i]
            if i0:
                for l in range(M):
                    s -= lam[m, i, l, 0] * xbar[0, l]
            rhs[p] = s
            for l in range(M):
                for k in range(i0, N):
                    A[p, l * n + k - i0] = lam[m, i, l, k]
    L = np.linalg.cholesky(A)
    y = np.empty(K)  # L y = rhs, then L^T mean = y
    for p in range(K):
        s = rhs[p]
        for q in range(p):
            s -= L[p, q] * y[q]
        y[p] = s / L[p, p]
    mean = np.empty(K)
    log_norm = -0.5 * K * np.log(2.0 * np.pi)
    for p in range(K - 1, -1, -1):
        s = y[p]
        for q in range(p + 1, K):
            s -= L[q, p] * mean[q]
        mean[p] = s / L[p, p]
        log_norm += np.log(L[p, p])
    return mean, L, log_norm


@numba.njit(cache=True)
def _draw_into(mean, L, normals, X, obs_idx, i0):
    """X[i, obs_idx[m]] = x[m * (N - i0) + i - i0] for x = mean + L^-T normals (in place)."""
    K = mean.size
    N = X.shape[0]
    n = N - i0
    v = np.empty(K)
    for p in range(K - 1, -1, -1):
        s = normals[p]
        for q in range(p + 1, K):
            s -= L[q, p] * v[q]
        v[p] = s / L[p, p]
    for p in range(K):
        X[i0 + p % n, obs_idx[p // n]] = mean[p] + v[p]


@numba.njit(cache=True)
def _logpdf_at(mean, L, log_norm, X, obs_idx, i0):
    """The log density of N(mean, (L L^T)^-1) at the free values of X (N, S)."""
    K = mean.size
    n = X.shape[0] - i0
    d = np.empty(K)
    for p in range(K):
        d[p] = X[i0 + p % n, obs_idx[p // n]] - mean[p]
    total = 0.0
    for q in range(K):  # v = L^T d
        s = 0.0
        for p in range(q, K):
            s += L[p, q] * d[p]
        total += s * s
    return -0.5 * total + log_norm


@numba.njit(cache=True)
def _precision_and_linear_term(Fo, j, xbar, Cinv, obs_precision, P, PDt, DtPD, Dt, lin, Dmu):
    """Lambda (M, N, M, N) and b (M, N) of the Gaussian over all observed-state values (the
    module docstring): f linearised about xbar (N, M) with f there Fo (N, M) and
    j (N, M, M) = d f_{obs m} / d x_{obs l}; the other inputs are the
    :class:`~pgpgm.matching.target.SweepArrays` of the same names. Loops, not small numpy
    calls: this runs once per block proposal."""
    M, N = Cinv.shape[0], Cinv.shape[1]
    lam = np.zeros((M, N, M, N))
    b = lin.copy()
    for m in range(M):  # GP prior and likelihood
        for i in range(N):
            for k in range(N):
                lam[m, i, m, k] = Cinv[m, i, k]
            lam[m, i, m, i] += obs_precision[m, i]
    am, pa = np.empty(N), np.empty(N)
    for m in range(M):  # the gradient-matching term of state m: r = a + G x, precision P[m]
        for i in range(N):
            s = Fo[i, m] + Dmu[m, i]
            for l in range(M):
                s -= j[i, m, l] * xbar[i, l]
            am[i] = s
        for i in range(N):
            s = 0.0
            for k in range(N):
                s += P[m, i, k] * am[k]
            pa[i] = s
        for l1 in range(M):
            for l2 in range(M):
                for i in range(N):
                    for k in range(N):
                        v = P[m, i, k] * j[i, m, l1] * j[k, m, l2]
                        if l1 == m:
                            v -= PDt[m, i, k] * j[k, m, l2]
                        if l2 == m:
                            v -= PDt[m, k, i] * j[i, m, l1]
                        if l1 == m and l2 == m:
                            v += DtPD[m, i, k]
                        lam[l1, i, l2, k] += v
            for i in range(N):
                b[l1, i] -= j[i, m, l1] * pa[i]
        for i in range(N):
            s = 0.0
            for k in range(N):
                s += Dt[m, i, k] * pa[k]
            b[m, i] += s
    return lam, b

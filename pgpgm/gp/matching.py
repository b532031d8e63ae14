"""The gradient-matching matrices of one fitted GP.

For a GP x ~ GP(mu, k) observed at times t (N,), the derivative given the state is

    xdot | x ~ N(D (x - mu), A),    D = C' C^-1,    A = C'' - C' C^-1 C'^T

with C = k(t, t), C' = dk/da (t, t) and C'' = d2k/(da db) (t, t). Both come from
Cholesky factorisations of C (adaptive jitter, no explicit inverse of C in D or A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import linalg

from ..checks import check_times
from ..errors import DataError
from .linalg import jittered_cholesky, limit_blas_threads

if TYPE_CHECKING:
    from .hyperparameters import GPFit


@dataclass(frozen=True)
class GradientMatching:
    """Matrices of one observed state for the gradient-matching density (times fixed).

    Attributes
    ----------
    mean : mu, the constant GP mean (state units)
    C : (N, N) GP prior covariance of x at the times, with ``jitter`` (state units^2)
    C_precision : (N, N) C^-1 (from the Cholesky factor)
    D : (N, N) C' C^-1, so E[xdot | x] = D (x - mu) (1 / time)
    A : (N, N) C'' - C' C^-1 C'^T, symmetric positive semi-definite (state units^2 / time^2)
    jitter : relative jitter added to C (fraction of its mean diagonal)
    """

    mean: float
    C: np.ndarray
    C_precision: np.ndarray
    D: np.ndarray
    A: np.ndarray
    jitter: float

    def gradient_precision(self, gamma: float, *, blas_threads: int | None = 1) -> np.ndarray:
        """(A + gamma I)^-1, shape (N, N), via Cholesky (adaptive jitter if needed).

        Parameters
        ----------
        gamma : mismatch variance between the ODE gradient and the GP gradient,
            (state units / time)^2, >= 0
        blas_threads : BLAS threads (see :mod:`pgpgm.gp.hyperparameters`); None leaves the process setting unchanged.
        """
        if not gamma >= 0:
            raise DataError(f"gamma must be non-negative, got {gamma}")
        n = self.A.shape[0]
        with limit_blas_threads(blas_threads):
            L, _ = jittered_cholesky(self.A + gamma * np.eye(n))
            P = linalg.cho_solve((L, True), np.eye(n))
        return 0.5 * (P + P.T)


def gradient_matching(fit: GPFit, t, *, min_jitter: float = 1e-6,
                      blas_threads: int | None = 1) -> GradientMatching:
    """D, A and the precisions for a fitted GP at times ``t`` (N,).

    Parameters
    ----------
    fit : the fitted GP of one state (:func:`pgpgm.gp.fit_gp`)
    t : (N,) strictly increasing times (time units)
    min_jitter : smallest jitter (relative to the mean prior variance) added to C;
        smooth kernels on dense grids are otherwise numerically singular.
    blas_threads : BLAS threads (see :mod:`pgpgm.gp.hyperparameters`); None leaves the process setting unchanged.
    """
    t = check_times(t, min_points=3)
    C, dC_da, dC_db, d2C = fit.kernel.cov_grad(t, t, fit.hyper)
    with limit_blas_threads(blas_threads):
        L, jitter = jittered_cholesky(C, min_jitter)
        Cj = C + jitter * float(np.mean(np.diag(C))) * np.eye(t.size)
        # D = C' C^-1  <=>  D^T = C^-1 C'^T (C symmetric)
        D = linalg.cho_solve((L, True), dC_da.T).T
        A = d2C - D @ dC_db
        A = 0.5 * (A + A.T)
        prec = linalg.cho_solve((L, True), np.eye(t.size))
    return GradientMatching(fit.mean, Cj, 0.5 * (prec + prec.T), D, A, jitter)

"""Input checks and the jittered Cholesky factorisation shared by the GP fit and gradient matching."""

from __future__ import annotations

import contextlib
from functools import cache

import numpy as np
from scipy import linalg
from threadpoolctl import ThreadpoolController

from ..checks import check_times
from ..errors import DataError


def check_series(t, y) -> tuple[np.ndarray, np.ndarray]:
    """Times (N,), strictly increasing, N >= 3, and finite observations (N,) as float arrays."""
    t = check_times(t, min_points=3)
    y = np.asarray(y, dtype=float)
    if y.shape != t.shape:
        raise DataError(f"observations have shape {y.shape}, times have shape {t.shape}")
    if not np.all(np.isfinite(y)):
        raise DataError("observations contain NaN or inf")
    return t, y


def jittered_cholesky(M: np.ndarray, min_jitter: float = 0.0) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of M + jitter*mean(diag(M)) I, raising jitter until it succeeds.

    Parameters
    ----------
    M : (N, N) symmetric matrix
    min_jitter : smallest relative jitter tried first (0: try M itself)

    Returns
    -------
    L : (N, N) lower triangular factor
    jitter : the relative jitter used
    """
    scale = float(np.mean(np.diag(M))) or 1.0
    jitter = min_jitter
    for _ in range(12):
        try:
            L = linalg.cholesky(M + (jitter * scale) * np.eye(M.shape[0]), lower=True)
            return L, jitter
        except linalg.LinAlgError:
            jitter = max(jitter * 10.0, 1e-10)
    raise DataError("covariance matrix is not positive definite even with jitter; check times and hyperparameters")


@cache
def _controller() -> ThreadpoolController:
    # Finding the loaded BLAS libraries takes ~6 ms (it reads the process's library list);
    # numpy's and scipy's BLAS are loaded at import, so one look suffices.
    return ThreadpoolController()


def limit_blas_threads(limit: int | None):
    """Context manager: BLAS limited to ``limit`` threads inside, unchanged when None."""
    if limit is None:
        return contextlib.nullcontext()
    return _controller().limit(limits=limit, user_api="blas")

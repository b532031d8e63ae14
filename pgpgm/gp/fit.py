"""Step 1: a Gaussian process per observed state, and the gradient-matching matrices.

For each observed state the kernel hyperparameters and the noise sd are fitted by
maximising the log marginal likelihood of the standardised series (analytic
gradients, L-BFGS-B, several starts). The fitted values are reported in the
state's own units. :func:`gradient_matching` then builds

    D = C' C^-1            A = C'' - C' C^-1 C'^T

with Cholesky factorisations (adaptive jitter, no explicit inverse of C in D or A).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import linalg, optimize

from ..errors import DataError
from .kernels import Kernel, get_kernel


def _check_series(t, y) -> tuple[np.ndarray, np.ndarray]:
    from ..data import check_times

    t = check_times(t, min_points=3)
    y = np.asarray(y, dtype=float)
    if y.shape != t.shape:
        raise DataError(f"observations have shape {y.shape}, times have shape {t.shape}")
    if not np.all(np.isfinite(y)):
        raise DataError("observations contain NaN or inf")
    return t, y


def _cholesky(M: np.ndarray, min_jitter: float = 0.0) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of M + jitter*mean(diag) I, raising jitter until it succeeds."""
    scale = float(np.mean(np.diag(M))) or 1.0
    jitter = min_jitter
    for _ in range(12):
        try:
            L = linalg.cholesky(M + (jitter * scale) * np.eye(M.shape[0]), lower=True)
            return L, jitter
        except linalg.LinAlgError:
            jitter = max(jitter * 10.0, 1e-10)
    raise DataError("covariance matrix is not positive definite even with jitter; check times and hyperparameters")


@dataclass(frozen=True)
class GPFit:
    """The fitted GP of one observed state (values in the state's units).

    Attributes
    ----------
    state : state name
    kernel : the Kernel
    hyper : array (H,), kernel hyperparameters (``hyper[0]`` = variance, state units^2)
    noise_sd : observation noise sd (state units)
    mean : constant prior mean mu (the data mean)
    scale : the data sd used to standardise the series during the fit
    log_marginal_likelihood : at the optimum, in the state's units
    noise_fixed : whether ``noise_sd`` was given rather than fitted
    """

    state: str
    kernel: Kernel
    hyper: np.ndarray
    noise_sd: float
    mean: float
    scale: float
    log_marginal_likelihood: float
    noise_fixed: bool = False

    def as_dict(self) -> dict:
        return {
            "state": self.state, "kernel": self.kernel.name,
            **{f"{n}": float(v) for n, v in zip(self.kernel.hyperparameters, self.hyper)},
            "noise_sd": self.noise_sd, "mean": self.mean, "scale": self.scale,
            "log_marginal_likelihood": self.log_marginal_likelihood, "noise_fixed": self.noise_fixed,
        }

    def posterior_mean(self, t, y, t_new=None) -> np.ndarray:
        """E[x(t_new) | y] under the fitted GP, shape (len(t_new),)."""
        t, y = _check_series(t, y)
        t_new = t if t_new is None else np.asarray(t_new, float)
        K = self.kernel.cov(t, t, self.hyper) + self.noise_sd**2 * np.eye(t.size)
        L, _ = _cholesky(K)
        alpha = linalg.cho_solve((L, True), y - self.mean)
        return self.mean + self.kernel.cov(t_new, t, self.hyper) @ alpha


def _default_bounds(kernel: Kernel, t: np.ndarray) -> np.ndarray:
    span = t[-1] - t[0]
    bounds = []
    for h in kernel.hyperparameters:
        if h == "variance":
            bounds.append((1e-2, 1e2))
        elif h == "lengthscale":
            bounds.append((0.5 * np.min(np.diff(t)), 10 * span))
        else:
            bounds.append((1e-6, 1e4))
    return np.log(np.array(bounds))


def _neg_lml(logp: np.ndarray, kernel: Kernel, t, z, fixed_noise: float | None):
    """Negative log marginal likelihood of standardised data z and its gradient (log scale)."""
    H = len(kernel.hyperparameters)
    hyper = np.exp(logp[:H])
    noise = fixed_noise if fixed_noise is not None else np.exp(logp[H])
    K = kernel.cov(t, t, hyper) + (noise**2 + 1e-8) * np.eye(t.size)
    try:
        L = linalg.cholesky(K, lower=True)
    except linalg.LinAlgError:
        return 1e10, np.zeros_like(logp)
    alpha = linalg.cho_solve((L, True), z)
    nll = 0.5 * z @ alpha + np.log(np.diag(L)).sum() + 0.5 * t.size * np.log(2 * np.pi)
    W = np.outer(alpha, alpha) - linalg.cho_solve((L, True), np.eye(t.size))
    grads = [-0.5 * np.sum(W * dK) * h for dK, h in zip(kernel.cov_hyper_grads(t, hyper), hyper)]
    if fixed_noise is None:
        grads.append(-0.5 * np.trace(W) * 2 * noise**2)
    return nll, np.array(grads)


def fit_gp(
    t,
    y,
    kernel: str | Kernel = "rbf",
    *,
    state: str = "x",
    noise_sd: float | None = None,
    n_starts: int = 5,
    seed: int = 0,
    bounds: np.ndarray | None = None,
) -> GPFit:
    """Fit kernel hyperparameters (and the noise sd unless given) to one observed series.

    Parameters
    ----------
    t : array (N,), strictly increasing, N >= 3
    y : array (N,), the noisy observations of one state
    kernel : kernel name or :class:`~pgpgm.gp.kernels.Kernel`
    noise_sd : known noise sd (state units); fitted when None
    n_starts : optimiser starts (the first from a default guess, the rest random in the bounds)
    seed : seed of the random starts
    bounds : (H[+1], 2) bounds of log-hyperparameters (and log noise) for the
        standardised series; defaults keep the matrices well conditioned.
    """
    kernel = get_kernel(kernel)
    t, y = _check_series(t, y)
    mean, scale = float(np.mean(y)), float(np.std(y))
    if scale == 0:
        raise DataError(f"observations of {state} are constant; a GP cannot be fitted")
    if noise_sd is not None and not (np.isfinite(noise_sd) and noise_sd > 0):
        raise DataError(f"noise_sd must be positive, got {noise_sd}")
    z = (y - mean) / scale
    fixed = None if noise_sd is None else noise_sd / scale
    b = _default_bounds(kernel, t) if bounds is None else np.asarray(bounds, float)
    if fixed is None and b.shape[0] == len(kernel.hyperparameters):
        b = np.vstack([b, np.log([1e-2, 1.0])])  # noise >= 1 % of the data sd: no interpolation of noise
    rng = np.random.default_rng(seed)
    guess = np.clip(np.log([1.0] + [0.1 * (t[-1] - t[0]) if h == "lengthscale" else 1.0
                                    for h in kernel.hyperparameters[1:]] + ([0.1] if fixed is None else [])),
                    b[:, 0], b[:, 1])
    starts = [guess] + [rng.uniform(b[:, 0], b[:, 1]) for _ in range(max(n_starts, 1) - 1)]
    best = None
    for x0 in starts:
        res = optimize.minimize(_neg_lml, x0, args=(kernel, t, z, fixed), jac=True, method="L-BFGS-B", bounds=b)
        if best is None or res.fun < best.fun:
            best = res
    H = len(kernel.hyperparameters)
    hyper = np.exp(best.x[:H])
    hyper[0] *= scale**2
    noise = noise_sd if fixed is not None else float(np.exp(best.x[H])) * scale
    lml = -float(best.fun) - t.size * np.log(scale)
    return GPFit(state, kernel, hyper, float(noise), mean, scale, lml, fixed is not None)


@dataclass(frozen=True)
class GradientMatching:
    """Matrices of one observed state for the gradient-matching density (times fixed).

    Attributes
    ----------
    mean : mu, the constant GP mean
    C : (N, N) GP prior covariance of x at the times (with ``jitter``)
    C_precision : (N, N) C^-1 (from the Cholesky factor)
    D : (N, N) C' C^-1, so E[xdot | x] = D (x - mu)
    A : (N, N) C'' - C' C^-1 C'^T, symmetric
    jitter : relative jitter added to C
    """

    mean: float
    C: np.ndarray
    C_precision: np.ndarray
    D: np.ndarray
    A: np.ndarray
    jitter: float
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def gradient_precision(self, gamma: float) -> np.ndarray:
        """(A + gamma I)^-1, shape (N, N), via Cholesky (adaptive jitter if needed)."""
        if gamma < 0:
            raise DataError(f"gamma must be non-negative, got {gamma}")
        if gamma not in self._cache:
            n = self.A.shape[0]
            L, _ = _cholesky(self.A + gamma * np.eye(n))
            P = linalg.cho_solve((L, True), np.eye(n))
            self._cache[gamma] = 0.5 * (P + P.T)
        return self._cache[gamma]


def gradient_matching(fit: GPFit, t, *, min_jitter: float = 1e-6) -> GradientMatching:
    """D, A and the precisions for a fitted GP at times ``t`` (N,).

    ``min_jitter`` (relative to the mean prior variance) regularises C; smooth kernels
    on dense grids are otherwise numerically singular.
    """
    from ..data import check_times

    t = check_times(t, min_points=3)
    C, dC_da, dC_db, d2C = fit.kernel.cov_grad(t, t, fit.hyper)
    L, jitter = _cholesky(C, min_jitter)
    Cj = C + jitter * float(np.mean(np.diag(C))) * np.eye(t.size)
    # D = C' C^-1  <=>  D^T = C^-1 C'^T (C symmetric)
    D = linalg.cho_solve((L, True), dC_da.T).T
    A = d2C - D @ dC_db
    A = 0.5 * (A + A.T)
    prec = linalg.cho_solve((L, True), np.eye(t.size))
    return GradientMatching(fit.mean, Cj, 0.5 * (prec + prec.T), D, A, jitter)

"""Step 1: a Gaussian process per observed state, hyperparameters by maximum marginal likelihood.

For each observed state the kernel hyperparameters and the noise sd are fitted by
maximising the log marginal likelihood of the standardised series z = (y - mean) / sd
(analytic gradients, L-BFGS-B, several starts) within the bounds each
:class:`~pgpgm.gp.kernels.Hyperparameter` of the kernel declares. The fitted values
are reported in the state's own units.

Cost per likelihood evaluation at N points: one kernel evaluation that returns K and
every dK/dh from shared intermediates (O(H N^2); the N lags only for a stationary
kernel on even times, else the lower triangles in one compiled loop), one
Cholesky factorisation (N^3 / 3 flops), and K^-1 from that factor (LAPACK ``potri``,
2 N^3 / 3 flops, one triangle) for the trace terms tr(K^-1 dK/dh) (O(N^2) each). No
identity solve and no N x N matrix W = alpha alpha^T - K^-1 is formed. At N = 1000
this is 25-35 ms of one core.

For a kernel linear in its only variance v the gradient in v comes from K itself
(v dK/dv = K - noise^2 I), so that matrix is never formed.

The fit runs BLAS on one thread by default (``blas_threads=1``, via threadpoolctl): it
makes hundreds of factorisations of matrices of a few thousand rows at most, where
threads gain little, and where cores are shared (other processes, parallel chains,
Dask workers) spinning BLAS threads can make each call hundreds of times slower (two
OpenBLAS threads on two shared cores turn a fit of a fraction of a second into tens of seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.linalg import blas, lapack

from ..errors import DataError
from .kernels import NOISE, Kernel, TimeGrid, get_kernel
from .linalg import check_series, jittered_cholesky, limit_blas_threads

_DIAG_FLOOR = 1e-8
"""Added to the diagonal of K of the standardised series in the fit (variance units of z)."""

_SIGNAL_NATS = 1.0
"""A fit must beat white noise with the data's own variance by this much (nats) to count as
having found the signal; otherwise :func:`fit_gp` tries more starts (see ``max_starts``)."""

_SAME_NATS = 1e-3
"""Two starts reached the same optimum when their negative log marginal likelihoods differ by
less than this (measured: 1e-10 for the same optimum, >= 0.05 between distinct ones)."""


@dataclass(frozen=True)
class GPFit:
    """The fitted GP of one observed state (values in the state's units).

    Attributes
    ----------
    state : state name
    kernel : the Kernel
    hyper : array (H,), kernel hyperparameters in the order of ``kernel.hyperparameters``
        (variances in state units^2, time scales in time units)
    noise_sd : observation noise sd (state units)
    mean : constant prior mean mu (the data mean, state units)
    scale : the data sd used to standardise the series during the fit (state units)
    log_marginal_likelihood : at the optimum, of the data in the state's units
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
        """The fit as plain JSON-able values, hyperparameters under their names."""
        return {
            "state": self.state, "kernel": self.kernel.name,
            **{n: float(v) for n, v in zip(self.kernel.names, self.hyper)},
            "noise_sd": self.noise_sd, "mean": self.mean, "scale": self.scale,
            "log_marginal_likelihood": self.log_marginal_likelihood, "noise_fixed": self.noise_fixed,
        }

    def posterior_mean(self, t, y, t_new=None) -> np.ndarray:
        """E[x(t_new) | y] under the fitted GP, shape (len(t_new),), state units.

        Parameters
        ----------
        t, y : (N,) the times and observations the GP was fitted to
        t_new : (M,) prediction times; ``t`` when None
        """
        from scipy import linalg

        t, y = check_series(t, y)
        t_new = t if t_new is None else np.asarray(t_new, float)
        K = self.kernel.cov(t, t, self.hyper) + self.noise_sd**2 * np.eye(t.size)
        L, _ = jittered_cholesky(K)
        alpha = linalg.cho_solve((L, True), y - self.mean)
        return self.mean + self.kernel.cov(t_new, t, self.hyper) @ alpha


def negative_log_marginal_likelihood(logp: np.ndarray, kernel: Kernel, t: np.ndarray, z: np.ndarray,
                                     fixed_noise: float | None, workspace: list | None = None
                                     ) -> tuple[float, np.ndarray]:
    """-log p(z | h, noise) of a series and its gradient in the log-parameters.

    Parameters
    ----------
    logp : (H,) log hyperparameters, or (H + 1,) with log noise sd last when ``fixed_noise`` is None
    kernel : the kernel
    t : (N,) times; z : (N,) observations (the fit passes the standardised series)
    fixed_noise : noise sd (units of z), or None when it is ``exp(logp[H])``
    workspace : a list (empty at first) in which the kernel matrices are kept and reused by the
        next call with it (the optimiser's calls: no new N x N matrices per evaluation)

    Returns
    -------
    nll : float; 1e10 when K + (noise^2 + 1e-8) I is not positive definite
    grad : (len(logp),) d nll / d logp; zeros in the failure case
    """
    H = len(kernel.hyperparameters)
    hyper = np.exp(logp[:H])
    noise = fixed_noise if fixed_noise is not None else np.exp(logp[H])
    K, dK = kernel.cov_with_hyper_grads(t, hyper, checked=True, lower=True,  # lower triangles hold the values
                                        workspace=workspace, skip_variance=True)
    if any(g is K for g in dK):
        K = K.copy()
    n = t.size
    s2 = noise**2 + _DIAG_FLOOR
    K.flat[:: n + 1] += s2
    # K.T is K in Fortran order; its upper triangle is K's lower triangle, so U here is L^T
    U, info = lapack.dpotrf(K.T, lower=0, clean=1, overwrite_a=1)
    if info != 0:
        return 1e10, np.zeros_like(logp)
    alpha, _ = lapack.dpotrs(U, z, lower=0)
    nll = 0.5 * z @ alpha + np.log(np.diagonal(U)).sum() + 0.5 * n * np.log(2 * np.pi)
    Kinv_tri, _ = lapack.dpotri(U, lower=0, overwrite_c=1)  # one triangle of K^-1, the other zero
    Kinv_tri = Kinv_tri.T  # C-contiguous view: K^-1 in the lower triangle, zeros above
    Kinv_diag = np.diagonal(Kinv_tri)
    trace_Kinv, alpha2 = Kinv_diag.sum(), alpha @ alpha
    grads = []
    for g, h in zip(dK, hyper):
        if g is None:
            # k linear in the variance v: v dK/dv = K - s2 I, and K alpha = z (Kernel.linear_variance)
            grads.append(-0.5 * ((z @ alpha - s2 * alpha2) - (n - s2 * trace_Kinv)))
            continue
        # tr(K^-1 dK) and alpha^T dK alpha from the lower triangles of the symmetric matrices
        trace = 2.0 * np.vdot(Kinv_tri, g) - Kinv_diag @ np.diagonal(g)
        quad = alpha @ blas.dsymv(1.0, g.T, alpha, lower=0)  # g.T in Fortran order: its upper = g's lower
        grads.append(-0.5 * (quad - trace) * h)
    if fixed_noise is None:
        grads.append(-0.5 * (alpha2 - trace_Kinv) * 2 * noise**2)
    return float(nll), np.array(grads)


#: fit_gp's default ``warm_start_points``: starts on at most this many points of a long series
WARM_START_POINTS = 250


def _multistart(kernel: Kernel, t: np.ndarray, z: np.ndarray, fixed: float | None, b: np.ndarray, starts: list,
                max_starts: int, rng: np.random.Generator, white_noise: float):
    """The best L-BFGS-B optimum of -log p(z | h, noise) from ``starts`` (log parameters, within
    the bounds ``b``), with further uniform starts while it is unconfirmed (see :func:`fit_gp`);
    ``white_noise``: -log N(z | 0, I), the no-signal level. Consumes ``starts``."""
    first = len(starts)
    fits: list = []
    workspace: list = []
    while starts:
        res = optimize.minimize(negative_log_marginal_likelihood, starts.pop(0),
                                args=(kernel, t, z, fixed, workspace), jac=True, method="L-BFGS-B", bounds=b)
        # the lowest of the first starts; an extra start replaces it only with another optimum (so
        # that a start confirming the best optimum leaves the fit bit for bit as it was)
        if not fits or res.fun < best.fun - (_SAME_NATS if len(fits) >= first else 0.0):
            best = res
        fits.append(res)
        confirmed = sum(r.fun <= best.fun + _SAME_NATS for r in fits) >= 2
        if not starts and len(fits) < max_starts and (not confirmed or best.fun > white_noise - _SIGNAL_NATS):
            starts.append(rng.uniform(b[:, 0], b[:, 1]))  # the best optimum is not confirmed yet: one more start
    return best


def fit_gp(
    t,
    y,
    kernel: str | Kernel = "rbf",
    *,
    state: str = "x",
    noise_sd: float | None = None,
    n_starts: int = 5,
    max_starts: int | None = None,
    seed: int = 0,
    bounds: np.ndarray | None = None,
    blas_threads: int | None = 1,
    warm_start_points: int | None = WARM_START_POINTS,
) -> GPFit:
    """Fit kernel hyperparameters (and the noise sd unless given) to one observed series.

    Parameters
    ----------
    t : array (N,), strictly increasing, N >= 3 (time units)
    y : array (N,), the noisy observations of one state (state units)
    kernel : kernel name or :class:`~pgpgm.gp.kernels.Kernel`; its hyperparameters
        declare the bounds and the first starting guess
    state : name of the state (reported in the fit)
    noise_sd : known noise sd (state units); fitted when None (bounds 1 % to 100 % of the data sd)
    n_starts : optimiser starts (the first from the kernel's guess, the rest uniform in the log bounds)
    max_starts : most starts in all, default ``4 * n_starts`` (``n_starts`` are always
        made). The marginal likelihood can have several optima, and the no-signal one
        (kernel variance at its lower bound, noise sd at the data sd) or an over-smoothed one
        can have the larger basin: with the sigmoid kernel on a saturating series the kernel's
        guess and about half of the uniform starts can end there, so that 5 starts may all miss
        the best optimum, by tens of nats. After the
        ``n_starts`` starts, further uniform starts are made, one at a time, while the best
        optimum has been reached by only one start (within 1e-3 nats) or explains the series
        no better than white noise with the data's variance (within 1 nat of
        -log N(z | 0, I)), until ``max_starts``; an extra start replaces the best fit only
        when it reaches another optimum. A fit whose best optimum the first starts reach
        twice, or that the extra starts only confirm, is unchanged.
    seed : seed of the random starts
    bounds : (H[+1], 2) bounds of log-hyperparameters (and log noise) for the
        standardised series, overriding the kernel's.
    blas_threads : BLAS threads during the fit; None leaves the process setting unchanged.
    warm_start_points : when N > 2 x this, the starts above run on the series thinned to this
        many evenly spaced points (each evaluation ~(N / points)^3 cheaper), and one
        optimisation on the whole series starts from their best optimum; None: every start on
        the whole series. A series of at most 2 x this many points is fitted as before.

    Returns
    -------
    GPFit
    """
    kernel = get_kernel(kernel)
    t, y = check_series(t, y)
    if warm_start_points is not None and not (float(warm_start_points).is_integer() and warm_start_points >= 3):
        raise DataError(f"warm_start_points must be a whole number >= 3 or None, got {warm_start_points!r}")
    mean, scale = float(np.mean(y)), float(np.std(y))
    if scale == 0:
        raise DataError(f"observations of {state} are constant; a GP cannot be fitted")
    if noise_sd is not None and not (np.isfinite(noise_sd) and noise_sd > 0):
        raise DataError(f"noise_sd must be positive, got {noise_sd}")
    z = (y - mean) / scale
    fixed = None if noise_sd is None else noise_sd / scale
    H = len(kernel.hyperparameters)
    grid = TimeGrid.from_times(t)
    noise_lo, noise_hi, noise_guess = NOISE.resolve(grid)
    if bounds is None:
        b = np.log(kernel.bounds(grid))
    else:
        b = np.asarray(bounds, float)
        if b.ndim != 2 or b.shape[1] != 2 or b.shape[0] not in (H, H + 1) or not np.all(b[:, 0] < b[:, 1]):
            raise DataError(f"bounds must be ({H} or {H + 1}, 2) log lower/upper bounds for "
                            f"{list(kernel.names)} (+ noise), got {b.tolist()}")
    if fixed is None and b.shape[0] == H:
        b = np.vstack([b, np.log([noise_lo, noise_hi])])
    elif fixed is not None:
        b = b[:H]
    rng = np.random.default_rng(seed)
    guess = np.clip(np.log(list(kernel.guess(grid)) + ([noise_guess] if fixed is None else [])), b[:, 0], b[:, 1])
    starts = [guess] + [rng.uniform(b[:, 0], b[:, 1]) for _ in range(max(n_starts, 1) - 1)]
    max_starts = 4 * len(starts) if max_starts is None else max_starts
    with limit_blas_threads(blas_threads):
        if warm_start_points is None or t.size <= 2 * warm_start_points:
            # -log N(z | 0, I) (z standardised, so z @ z = N): a fit no better than this has found no signal
            best = _multistart(kernel, t, z, fixed, b, starts, max_starts, rng, 0.5 * t.size * (1.0 + np.log(2 * np.pi)))
        else:
            keep = np.unique(np.round(np.linspace(0, t.size - 1, int(warm_start_points))).astype(int))
            zk = z[keep]
            coarse = _multistart(kernel, t[keep], zk, fixed, b, starts, max_starts, rng,
                                 0.5 * (zk @ zk + keep.size * np.log(2 * np.pi)))
            best = optimize.minimize(negative_log_marginal_likelihood, coarse.x, args=(kernel, t, z, fixed, []),
                                     jac=True, method="L-BFGS-B", bounds=b)
    hyper = np.exp(best.x[:H])
    for i, h in enumerate(kernel.hyperparameters):
        if h.kind == "variance":
            hyper[i] *= scale**2
    noise = noise_sd if fixed is not None else float(np.exp(best.x[H])) * scale
    lml = -float(best.fun) - t.size * float(np.log(scale))
    return GPFit(state, kernel, hyper, float(noise), mean, scale, lml, fixed is not None)

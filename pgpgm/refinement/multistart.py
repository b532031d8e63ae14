"""A search that needs no GP: local fits from starts spread over a box, until enough of them agree.

:func:`multistart` minimises a negative log-likelihood given with its gradient (and, where the likelihood is a
sum of squares, its weighted residuals and their Jacobian) from scrambled Sobol points of the parameters' box:
least squares (``scipy.optimize.least_squares``, trust-region reflective) where residuals are given, else
L-BFGS-B. It stops once ``agree`` starts have reached the best value found (within ``tol`` nats) and at least
``min_starts`` ran, or when its budget (``max_starts``, ``seconds``) is spent. A start whose solve or fit fails
is discarded and counted; it never ends the search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.stats import qmc

from ..errors import DataError, ODESolveError

#: what a local fit may raise at a bad point: the start is discarded (and counted), the search goes on
FAILURES = (ODESolveError, ValueError, ArithmeticError, np.linalg.LinAlgError)
#: the value a failed evaluation reports inside a local fit (a cliff the line search backs away from)
FAILED_NLL = 1e100


@dataclass(frozen=True)
class MultiStart:
    """The settings of :func:`multistart`.

    Attributes
    ----------
    agree : how many starts must reach the best value (within ``tol``) before the search stops (default 3)
    tol : nats within which two optima are the same (default 0.1)
    min_starts, max_starts : fewest and most starts (defaults 10 and 200)
    seconds : the search's time budget (default 600; None: no limit); a start still running when it runs out
        stops at its next evaluation and its best point so far stands for it
    max_evaluations : a local fit's most evaluations (default 2000)
    """

    agree: int = 3
    tol: float = 0.1
    min_starts: int = 10
    max_starts: int = 200
    seconds: float | None = 600.0
    max_evaluations: int = 2000

    def __post_init__(self):
        counts = (self.agree, self.min_starts, self.max_starts, self.max_evaluations)
        if not all(isinstance(c, int | np.integer) and c >= 1 for c in counts) or self.max_starts < self.min_starts:
            raise DataError(f"MultiStart: agree, min_starts <= max_starts and max_evaluations must be whole numbers "
                            f">= 1, got {counts}")
        if not (np.isfinite(self.tol) and self.tol > 0):
            raise DataError(f"MultiStart: tol must be a positive number of nats, got {self.tol!r}")
        if self.seconds is not None and not (np.isfinite(self.seconds) and self.seconds > 0):
            raise DataError(f"MultiStart: seconds must be positive or None, got {self.seconds!r}")


@dataclass(frozen=True)
class SearchResult:
    """What :func:`multistart` found.

    Attributes
    ----------
    best : (V,) the best optimum; nll : its negative log-likelihood
    starts : (K, V) every start, in the order run; optima : (K, V) each start's optimum (NaN where it failed);
    nlls : (K,) each optimum's negative log-likelihood (inf where it failed)
    failed : how many starts failed; reason : why it stopped (``"agreed"``, ``"max_starts"``, ``"seconds"``);
    agreeing : how many starts reached the best value (within the search's ``tol``); seconds : its time;
    evaluations : the objective's evaluations in all
    """

    best: np.ndarray
    nll: float
    starts: np.ndarray
    optima: np.ndarray
    nlls: np.ndarray
    failed: int
    reason: str
    agreeing: int
    seconds: float
    evaluations: int

    def describe(self) -> str:
        return (f"multi-start least squares from {len(self.nlls)} starts spread over the bounds ({self.failed} failed), "
                f"stopped: {self.reason}; {self.agreeing} reached the best")


def multistart(nll_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]], lower: np.ndarray,
               upper: np.ndarray, search: MultiStart, *, seed: int = 0,
               residuals: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
               progress: Callable[[int, float], None] | None = None) -> SearchResult:
    """Minimise ``nll_and_gradient`` (z (V,) -> (nll, gradient (V,))) from starts spread over the box
    [``lower``, ``upper``] (V,) (finite bounds; a scrambled Sobol sequence seeded by ``seed``), each by least
    squares on ``residuals`` (z -> (r (D,), J (D, V)), half the sum of squares being the nll up to a constant)
    where given, else by L-BFGS-B. ``progress(k, best)`` is called after each start. See :class:`MultiStart`.

    Raises
    ------
    DataError
        for bounds that are not finite (starts need a box).
    ODESolveError
        when every start failed.
    """
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)) and np.all(lower < upper)):
        raise DataError("a multi-start search needs finite bounds lower < upper for every estimated parameter, got "
                        f"{lower.tolist()} and {upper.tolist()}")
    started, count = time.perf_counter(), [0]

    def safe(z):
        count[0] += 1
        try:
            f, g = nll_and_gradient(z)
        except FAILURES:
            return FAILED_NLL, np.zeros_like(z)
        return (float(f), np.asarray(g, float)) if np.isfinite(f) and np.all(np.isfinite(g)) else \
            (FAILED_NLL, np.zeros_like(z))

    sobol = qmc.Sobol(d=lower.size, scramble=True, seed=seed)
    deadline = None if search.seconds is None else started + search.seconds
    starts, optima, nlls, failed, reason = [], [], [], 0, "max_starts"
    while len(starts) < search.max_starts:
        if deadline is not None and time.perf_counter() > deadline:
            reason = "seconds"
            break
        z0 = lower + (upper - lower) * sobol.random(1)[0]
        starts.append(z0)
        cut = False
        try:
            z = _local_fit(safe, residuals, z0, lower, upper, search.max_evaluations, count, deadline)
        except _Spent as spent:  # the budget ran out inside this start: its best point so far stands for it
            cut, z = True, spent.best if spent.best is not None else np.full_like(z0, np.nan)
        except FAILURES:
            z = np.full_like(z0, np.nan)
        f = safe(z)[0] if np.all(np.isfinite(z)) else FAILED_NLL
        if not f < FAILED_NLL:
            failed, z, f = failed + (not cut), np.full_like(z0, np.nan), np.inf
        optima.append(z)
        nlls.append(f)
        best = min(nlls)
        if progress is not None:
            progress(len(starts), best)
        if cut:
            reason = "seconds"
            break
        if len(starts) >= search.min_starts and np.isfinite(best) and \
                sum(v <= best + search.tol for v in nlls) >= search.agree:
            reason = "agreed"
            break
    nlls_a = np.array(nlls)
    if not np.any(np.isfinite(nlls_a)):
        raise ODESolveError(f"every one of the {len(nlls)} starts of the multi-start search failed")
    k = int(np.argmin(nlls_a))
    return SearchResult(np.array(optima[k]), float(nlls_a[k]), np.array(starts), np.array(optima), nlls_a, failed,
                        reason, int(np.sum(nlls_a <= nlls_a[k] + search.tol)), time.perf_counter() - started, count[0])


class _Spent(Exception):
    """The search's time budget ran out inside a start; ``best``: the start's best point evaluated so far (or
    None)."""

    def __init__(self, best: np.ndarray | None):
        super().__init__("the multi-start search's time budget ran out")
        self.best = best


def _local_fit(safe, residuals, z0: np.ndarray, lower: np.ndarray, upper: np.ndarray, max_evaluations: int,
               count: list, deadline: float | None = None) -> np.ndarray:
    """One start's optimum: trust-region reflective least squares on ``residuals`` where given, else L-BFGS-B
    on ``safe`` (the nll with its gradient, failures as :data:`FAILED_NLL`). Raises :class:`_Spent` at the
    first evaluation after ``deadline`` (a ``time.perf_counter()`` value; None: none), so that one long start
    cannot overrun the search's budget."""
    seen = {"z": None, "value": np.inf}  # the start's best point so far: what a cut start returns

    def watch(z, value: float) -> None:
        if value < seen["value"]:
            seen.update(z=np.array(z, float), value=value)

    def on_time() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise _Spent(seen["z"])

    if residuals is None:
        def nll(z):
            on_time()
            value, gradient = safe(z)
            if value < FAILED_NLL:
                watch(z, value)
            return value, gradient

        return optimize.minimize(nll, z0, jac=True, method="L-BFGS-B", bounds=list(zip(lower, upper)),
                                 options={"maxfun": max_evaluations, "maxiter": max_evaluations, "ftol": 1e-12,
                                          "gtol": 1e-8}).x
    last = {}

    def r_and_j(z):
        key = z.tobytes()
        if key not in last:
            on_time()
            count[0] += 1
            last.clear()
            try:
                r, jac = residuals(z)
                ok = np.all(np.isfinite(r)) and np.all(np.isfinite(jac))
            except FAILURES:
                ok = False
            if ok:
                watch(z, float(np.dot(r, r)))
            last[key] = (r, jac) if ok else (np.full(1, 1e50), np.zeros((1, z.size)))
        return last[key]

    first = r_and_j(z0)[0]
    size = first.size
    pad = lambda r: r if r.size == size else np.full(size, 1e50)  # noqa: E731
    padj = lambda j: j if j.shape[0] == size else np.zeros((size, z0.size))  # noqa: E731
    fit = optimize.least_squares(lambda z: pad(r_and_j(z)[0]), z0, jac=lambda z: padj(r_and_j(z)[1]),
                                 bounds=(lower, upper), method="trf", x_scale="jac", max_nfev=max_evaluations,
                                 xtol=1e-12, ftol=1e-12, gtol=1e-10)
    return fit.x


def hessian(nll_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]], z: np.ndarray,
            step: float = 1e-5) -> np.ndarray:
    """(V, V) the Hessian of the nll at ``z`` by central differences of its gradient (symmetrised): the
    curvature whose inverse is the optimum's covariance (NaN where a gradient failed)."""
    z = np.asarray(z, float)
    H = np.full((z.size, z.size), np.nan)
    for i in range(z.size):
        h = step * max(1.0, abs(z[i]))
        try:
            up, down = nll_and_gradient(z + h * np.eye(z.size)[i])[1], nll_and_gradient(z - h * np.eye(z.size)[i])[1]
        except FAILURES:
            continue
        H[i] = (np.asarray(up) - np.asarray(down)) / (2 * h)
    return 0.5 * (H + H.T)

"""Step 3 of a study: one least-squares refinement of every experiment together.

The model: experiment j's observed state k at time t_n is y_jk(t_n) = x(t_n; theta_j, x0_j)_k + e,
e ~ N(0, sd_k^2), the noise sd of a state shared by the experiments (one assay). theta_j takes the
shared parameters from one vector, the varying ones from experiment j's own, and experiment j's
fixed (known) values; x0_j holds j's known initial values and, as unknowns, those of observed
states it does not know. The residuals are the stacked residuals of one
:class:`~pgpgm.refinement.LeastSquaresProblem` per experiment (their Jacobians' columns mapped to
the joint unknowns), so each experiment keeps its own time grid and solver.

Unknown sds are estimated as :func:`pgpgm.refine` does: alternating weighted least squares in q
with sd_k^2 = sum_j RSS_jk / sum_j N_jk (each step an exact partial minimisation of the NLL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..errors import DataError, ODESolveError
from ..refinement import LeastSquaresProblem


@dataclass(frozen=True)
class JointLayout:
    """The joint unknowns q (Q,): shared parameters, then each varying parameter per experiment
    (experiment by experiment), then each experiment's free initial values.

    parameters : (P,) the system's parameters; shared, varying : their split (fixed ones are in
    neither for an experiment that fixes them); experiments : (K,) names; fixed : (K,) dicts of
    known values; free_x0 : (K,) tuples of state indices whose initial values are unknowns;
    states : (S,) state names.
    """

    parameters: tuple[str, ...]
    shared: tuple[str, ...]
    varying: tuple[str, ...]
    experiments: tuple[str, ...]
    fixed: tuple[dict, ...]
    free_x0: tuple[tuple[int, ...], ...]
    states: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Names of q: ``p`` (shared), ``p[e]`` (varying), ``x0[s][e]`` (free initial values)."""
        out = list(self.shared)
        for j, e in enumerate(self.experiments):
            out += [f"{p}[{e}]" for p in self.varying if p not in self.fixed[j]]
        for j, e in enumerate(self.experiments):
            out += [f"x0[{self.states[i]}][{e}]" for i in self.free_x0[j]]
        return tuple(out)

    def columns(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """For experiment j: (rows of its own unknowns (theta (P,), free x0) that are joint unknowns, their
        positions in q)."""
        names = {n: i for i, n in enumerate(self.names)}
        e = self.experiments[j]
        own, pos = [], []
        for a, p in enumerate(self.parameters):
            key = p if p in self.shared else f"{p}[{e}]"
            if p not in self.fixed[j] and key in names:
                own.append(a)
                pos.append(names[key])
        for b, i in enumerate(self.free_x0[j]):
            own.append(len(self.parameters) + b)
            pos.append(names[f"x0[{self.states[i]}][{e}]"])
        return np.array(own, int), np.array(pos, int)

    def theta(self, q, j: int) -> np.ndarray:
        """Experiment j's full parameter vector (P,) and free initial values: its own unknowns (Q_j,)."""
        own, pos = self.columns(j)
        P = len(self.parameters)
        vec = np.full(P + len(self.free_x0[j]), np.nan)
        for a, p in enumerate(self.parameters):
            if p in self.fixed[j]:
                vec[a] = self.fixed[j][p]
        vec[own] = np.asarray(q, float)[pos]
        return vec

    def pack(self, thetas: Sequence[np.ndarray], x0s: Sequence[np.ndarray], shared_from: np.ndarray) -> np.ndarray:
        """q from per-experiment parameter vectors ``thetas`` (K, P) (their varying entries), initial states
        ``x0s`` (K, S) (their free entries), and the shared parameters' values ``shared_from`` (P,)."""
        q = np.full(len(self.names), np.nan)
        names = {n: i for i, n in enumerate(self.names)}
        for a, p in enumerate(self.parameters):
            if p in self.shared:
                q[names[p]] = shared_from[a]
        for j, e in enumerate(self.experiments):
            for a, p in enumerate(self.parameters):
                if p in self.varying and p not in self.fixed[j]:
                    q[names[f"{p}[{e}]"]] = thetas[j][a]
            for i in self.free_x0[j]:
                q[names[f"x0[{self.states[i]}][{e}]"]] = x0s[j][i]
        return q


@dataclass(frozen=True, eq=False)
class JointRefinement:
    """A joint refinement: q (Q,) and its names, standard errors (Q,) (inverse Fisher information,
    ``inf`` where the data do not determine a direction), the noise sds (M,) by ``observed`` state
    (estimated or given), the NLL (constants included), per-experiment parameters ``thetas`` (K, P)
    and initial states ``x0s`` (K, S), the ODE solves, scipy's status, and the covariance of q (Q, Q) (NaN in
    the rows and columns of undetermined unknowns)."""

    q: np.ndarray
    names: tuple[str, ...]
    stderr: np.ndarray
    noise_sd: np.ndarray
    observed: tuple[str, ...]
    nll: float
    thetas: np.ndarray
    x0s: np.ndarray
    n_solves: int
    success: bool
    message: str
    covariance: np.ndarray | None = None

    def value(self, name: str) -> float:
        return float(self.q[self.names.index(name)])


@dataclass(frozen=True, eq=False)
class JointProblem:
    """The stacked problem: one :class:`LeastSquaresProblem` per experiment (full system, its known
    initial values, ``free_x0`` its unknown ones), ``layout`` the joint unknowns, ``observed`` (M,) the
    states whose noise sds are shared, ``bounds`` (P, 2) or None, the parameters' box."""

    problems: tuple[LeastSquaresProblem, ...]
    layout: JointLayout
    observed: tuple[str, ...]
    bounds: np.ndarray | None = None

    def _sd_of(self, j: int, sd: np.ndarray) -> np.ndarray:
        pr = self.problems[j]
        states = self.layout.states
        return np.array([sd[self.observed.index(states[i])] for i in pr.observed_idx])

    def residuals(self, q, sd) -> np.ndarray:
        """Scaled residuals of every experiment, stacked (sum_j K_j,)."""
        out = []
        for j, pr in enumerate(self.problems):
            try:
                out.append(pr.with_noise_sd(self._sd_of(j, sd)).residuals(self.layout.theta(q, j)))
            except ODESolveError:
                out.append(np.full(int(pr.n_obs.sum()), 1e6))
        return np.concatenate(out)

    def jacobian(self, q, sd) -> np.ndarray:
        """(sum_j K_j, Q) Jacobian of :meth:`residuals` (forward sensitivities per experiment)."""
        Q = len(self.layout.names)
        blocks = []
        for j, pr in enumerate(self.problems):
            own, pos = self.layout.columns(j)
            Jj = pr.with_noise_sd(self._sd_of(j, sd)).jacobian(self.layout.theta(q, j))
            B = np.zeros((Jj.shape[0], Q))
            B[:, pos] = Jj[:, own]
            blocks.append(B)
        return np.vstack(blocks)

    def rss(self, q) -> tuple[np.ndarray, np.ndarray]:
        """Residual sums of squares and counts by observed state (M,), summed over experiments."""
        rss, n = np.zeros(len(self.observed)), np.zeros(len(self.observed))
        for j, pr in enumerate(self.problems):
            r = pr.rss(self.layout.theta(q, j))
            for k, i in enumerate(pr.observed_idx):
                m = self.observed.index(self.layout.states[i])
                rss[m] += r[k]
                n[m] += pr.n_obs[k]
        return rss, n

    def nll(self, q, sd) -> float:
        """Gaussian NLL of every experiment's data (constants included); inf when a solve fails."""
        try:
            rss, n = self.rss(q)
        except ODESolveError:
            return np.inf
        return float(np.sum(n * np.log(sd) + rss / (2 * sd**2)) + 0.5 * n.sum() * np.log(2 * np.pi))

    def n_solves(self) -> int:
        return sum(pr.integrator.n_solves for pr in self.problems)

    def lower_upper(self) -> tuple[np.ndarray, np.ndarray]:
        """Bounds of q: the parameters' box for every parameter entry, none for initial values."""
        Q = len(self.layout.names)
        lo, hi = np.full(Q, -np.inf), np.full(Q, np.inf)
        if self.bounds is not None:
            for j in range(len(self.problems)):
                own, pos = self.layout.columns(j)
                P = len(self.layout.parameters)
                for a, b in zip(own, pos):
                    if a < P:
                        lo[b], hi[b] = self.bounds[a]
        return lo, hi


def refine_joint(problem: JointProblem, q0, noise_sd=None, *, max_nfev: int = 400, max_rounds: int = 50,
                 noise_rtol: float = 1e-7) -> JointRefinement:
    """Maximum likelihood of every experiment together from ``q0`` (Q,).

    ``noise_sd`` : (M,) known sds by ``problem.observed``, or None to estimate them (alternating with
    weighted least squares, from the sd of the residuals at ``q0``). Trust-region reflective least
    squares (scipy) within the parameters' box. Standard errors from the SVD of the scaled Jacobian at
    the optimum (singular values below 1e-8 of the largest count as zero: infinite standard errors).

    Raises
    ------
    DataError : ``q0`` of the wrong length or not finite.
    """
    names = problem.layout.names
    q = np.asarray(q0, float).copy()
    if q.shape != (len(names),) or not np.all(np.isfinite(q)):
        raise DataError(f"q0 must hold {len(names)} finite values {list(names)}, got {q0!r}")
    lo, hi = problem.lower_upper()
    q = np.clip(q, np.where(np.isfinite(lo), lo + 1e-12 * np.abs(lo) + 1e-300, lo),
                np.where(np.isfinite(hi), hi - 1e-12 * np.abs(hi), hi))
    n0 = problem.n_solves()
    estimate = noise_sd is None
    try:
        rss, n = problem.rss(q)
    except ODESolveError as err:
        return _failed(problem, q, n0, f"the ODE solve failed at the start ({err})")
    sd = np.sqrt(np.maximum(rss / n, 1e-300)) if estimate else np.broadcast_to(np.asarray(noise_sd, float),
                                                                               (len(problem.observed),)).copy()
    floor = 1e-6 * sd
    rounds, converged, message = 0, not estimate, ""
    while True:
        res = optimize.least_squares(problem.residuals, q, jac=problem.jacobian, bounds=(lo, hi), method="trf",
                                     x_scale="jac", max_nfev=max_nfev, args=(sd,))
        q, message = res.x, str(res.message)
        if not estimate:
            break
        rounds += 1
        rss, n = problem.rss(q)
        new = np.maximum(np.sqrt(rss / n), floor)
        change = float(np.max(np.abs(new / sd - 1)))
        sd = new
        if change <= noise_rtol:
            converged = True
            break
        if rounds >= max_rounds:
            break
    try:
        J = problem.jacobian(q, sd)
    except ODESolveError as err:
        return _failed(problem, q, n0, f"the sensitivity solve failed at the end point ({err})")
    c = np.linalg.norm(J, axis=0)
    c = np.where(c > 0, c, 1.0)
    _, s, vt = np.linalg.svd(J / c, full_matrices=False)
    keep = s > 1e-8 * s[0]
    cov = (vt[keep].T / s[keep] ** 2) @ vt[keep] / np.outer(c, c)
    se = np.sqrt(np.abs(np.diag(cov)))
    if not keep.all():
        null = vt[~keep]
        bad = np.linalg.norm(null, axis=0) > 1e-6
        se[bad] = np.inf
        cov[bad, :] = np.nan
        cov[:, bad] = np.nan
    K = len(problem.problems)
    thetas = np.array([problem.layout.theta(q, j)[: len(problem.layout.parameters)] for j in range(K)])
    x0s = np.array([problem.problems[j].split(problem.layout.theta(q, j))[1] for j in range(K)])
    return JointRefinement(q, names, se, sd, problem.observed, problem.nll(q, sd), thetas, x0s,
                           problem.n_solves() - n0, bool(res.success) and converged,
                           message + (f"; noise sds converged in {rounds} rounds" if estimate and converged else
                                      "; noise sds not converged" if estimate else ""), cov)


def _failed(problem: JointProblem, q, n0: int, message: str) -> JointRefinement:
    K, P = len(problem.problems), len(problem.layout.parameters)
    S = len(problem.layout.states)
    return JointRefinement(q, problem.layout.names, np.full(q.size, np.nan), np.full(len(problem.observed), np.nan),
                           problem.observed, np.inf, np.full((K, P), np.nan), np.full((K, S), np.nan),
                           problem.n_solves() - n0, False, message)

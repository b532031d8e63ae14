"""Step 3 of a study: one least-squares refinement of every experiment together.

The model: experiment j's observed state k at time t_n is y_jk(t_n) = x(t_n; theta_j, x0_j)_k + e,
e ~ N(0, sd_k^2), the noise sd of a state shared by the experiments (one assay) - or, with
``JointProblem(..., noise=...)``, each observed state's :mod:`pgpgm.noise` model (lognormal, Poisson,
negative binomial: their residuals, as :class:`~pgpgm.refinement.LeastSquaresProblem` builds them);
with ``per_experiment`` states, one noise parameter per experiment for those (labs differ). theta_j takes the
shared parameters from one vector, the varying ones from experiment j's own, and experiment j's
fixed (known) values; x0_j holds j's known initial values and, as unknowns, those of observed
states it does not know. The residuals are the stacked residuals of one
:class:`~pgpgm.refinement.LeastSquaresProblem` per experiment (their Jacobians' columns mapped to
the joint unknowns), so each experiment keeps its own time grid and solver.

Unknown noise parameters are estimated as :func:`pgpgm.refine` does, by the same loop
(:func:`pgpgm.refinement.noise_estimation.alternate_noise`): weighted least squares in q, then each
noise parameter's maximum-likelihood value on the measurements it covers - Gaussian: sd_k^2 =
sum_j RSS_jk / sum_j N_jk; other models:
:func:`~pgpgm.refinement.noise_estimation.ml_noise_parameter` on the pooled measurements (each step
an exact partial minimisation of the NLL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..errors import DataError, ODESolveError
from ..refinement import LeastSquaresProblem
from ..refinement.least_squares import SEARCH_FAILURES
from ..refinement.noise_estimation import alternate_noise, ml_noise_parameter


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
    ``inf`` where the data do not determine a direction), the noise parameters (L,) named
    ``noise_names`` (an observed state's name when shared by the experiments, ``<state>[<experiment>]``
    per experiment; sd, of log y for lognormal; alpha for negbin; 1 for Poisson; estimated or given),
    ``observed`` (M,) the observed states, the NLL (constants included), per-experiment parameters
    ``thetas`` (K, P) and initial states ``x0s`` (K, S), the ODE solves, scipy's status, the covariance of
    q (Q, Q) (NaN in the rows and columns of undetermined unknowns), and the noise models by observed
    state (None: Gaussian)."""

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
    noise_names: tuple[str, ...] | None = None
    noise: tuple[str, ...] | None = None

    def value(self, name: str) -> float:
        return float(self.q[self.names.index(name)])

    def noise_of(self, state: str, experiment: str) -> float:
        """The noise parameter of ``state`` in ``experiment`` (its own or the shared one)."""
        names = self.noise_names or self.observed
        key = f"{state}[{experiment}]"
        key = key if key in names else state
        return float(self.noise_sd[names.index(key)]) if key in names else np.nan


@dataclass(frozen=True, eq=False)
class JointProblem:
    """The stacked problem: one :class:`LeastSquaresProblem` per experiment (full system, its known
    initial values, ``free_x0`` its unknown ones; built with the same ``noise`` models), ``layout`` the
    joint unknowns, ``observed`` (M,) the observed states, ``bounds`` (P, 2) or None, the parameters'
    box; ``noise`` (M,) the :mod:`pgpgm.noise` model names by observed state (None: Gaussian throughout);
    ``per_experiment`` the observed states whose noise parameter is one per experiment (the others are
    shared by the experiments).

    The noise parameters (L,) are named :attr:`noise_names`: by observed state, the state's name when
    shared, ``<state>[<experiment>]`` for each experiment that measures it when per experiment.
    """

    problems: tuple[LeastSquaresProblem, ...]
    layout: JointLayout
    observed: tuple[str, ...]
    bounds: np.ndarray | None = None
    noise: tuple[str, ...] | None = None
    per_experiment: tuple[str, ...] = ()

    def __post_init__(self):
        bad = [s for s in self.per_experiment if s not in self.observed]
        if bad:
            raise DataError(f"per-experiment noise names {bad}, which are not observed states {list(self.observed)}")
        if self.noise is not None and len(self.noise) != len(self.observed):
            raise DataError(f"noise must name one model per observed state {list(self.observed)}, got {self.noise!r}")
        for pr in self.problems:
            own = None if self.noise is None else tuple(self.noise[self.observed.index(self.layout.states[i])]
                                                        for i in pr.observed_idx)
            if pr.noise != own and not (self.noise is None and pr.noise is None):
                raise DataError(f"an experiment's problem has noise models {pr.noise}, the study {own}")

    @property
    def noise_names(self) -> tuple[str, ...]:
        """(L,) the noise parameters' names (see the class docstring)."""
        out = []
        for s in self.observed:
            if s not in self.per_experiment:
                out.append(s)
                continue
            for j, pr in enumerate(self.problems):
                if s in self._states(j):
                    out.append(f"{s}[{self.layout.experiments[j]}]")
        return tuple(out)

    @property
    def models(self) -> tuple[str, ...]:
        """(L,) the noise model name of each noise parameter."""
        names = self.noise or ("normal",) * len(self.observed)
        return tuple(names[self.observed.index(n.split("[", 1)[0])] for n in self.noise_names)

    def _states(self, j: int) -> tuple[str, ...]:
        return tuple(self.layout.states[i] for i in self.problems[j].observed_idx)

    def slots(self, j: int) -> list[int]:
        """(M_j,) the index in the noise parameters (L,) of each of experiment j's observed states."""
        names = {n: i for i, n in enumerate(self.noise_names)}
        e = self.layout.experiments[j]
        return [names[f"{s}[{e}]" if s in self.per_experiment else s] for s in self._states(j)]

    def _sd_of(self, j: int, sd: np.ndarray) -> np.ndarray:
        return np.asarray(sd)[self.slots(j)]

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
        """Residual sums of squares and counts by noise parameter (L,), summed over its experiments."""
        L = len(self.noise_names)
        rss, n = np.zeros(L), np.zeros(L)
        for j, pr in enumerate(self.problems):
            r = pr.rss(self.layout.theta(q, j))
            for k, m in enumerate(self.slots(j)):
                rss[m] += r[k]
                n[m] += pr.n_obs[k]
        return rss, n

    def n_obs(self) -> np.ndarray:
        """(L,) the number of measurements each noise parameter covers."""
        n = np.zeros(len(self.noise_names), int)
        for j, pr in enumerate(self.problems):
            for k, m in enumerate(self.slots(j)):
                n[m] += pr.n_obs[k]
        return n

    def pooled(self, q) -> list[tuple[np.ndarray, np.ndarray]]:
        """(L,) the measurements and predictions (y, mu) each noise parameter covers, concatenated over
        its experiments; raises :class:`ODESolveError` when a solve fails."""
        parts: list[list] = [[] for _ in self.noise_names]
        for j, pr in enumerate(self.problems):
            mu = pr.predictions(self.layout.theta(q, j))
            for k, m in enumerate(self.slots(j)):
                parts[m].append((pr.y[:, k], mu[:, k]))
        return [(np.concatenate([y for y, _ in p]), np.concatenate([m for _, m in p])) for p in parts]

    def ml_noise(self, q, params: np.ndarray) -> np.ndarray:
        """(L,) each noise parameter's maximum-likelihood value at q (``params`` where a model has none or a
        solve fails)."""
        if self.noise is None:
            rss, n = self.rss(q)
            return np.sqrt(rss / n)
        out = np.array(params, dtype=float)
        try:
            pooled = self.pooled(q)
        except ODESolveError:
            return out
        return np.array([ml_noise_parameter(name, y, mu, v)
                         for name, (y, mu), v in zip(self.models, pooled, out)])

    def nll(self, q, sd) -> float:
        """NLL of every experiment's data (constants included) with the noise parameters ``sd`` (L,);
        inf when a solve fails."""
        if self.noise is not None:
            total = 0.0
            for j, pr in enumerate(self.problems):
                total += pr.nll(self.layout.theta(q, j), self._sd_of(j, sd))
            return float(total)
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

    ``noise_sd`` : None to estimate every noise parameter, or (L,) by ``problem.noise_names``: known
    values, NaN for those to estimate (a Poisson state's entry is unused). Estimated ones start at their
    maximum-likelihood values for ``q0`` (for the Gaussian path the sd of the residuals) and alternate
    with weighted least squares (:func:`~pgpgm.refinement.noise_estimation.alternate_noise`, the loop of
    :func:`pgpgm.refine`). Trust-region reflective least squares (scipy) within the parameters' box.
    Standard errors from the SVD of the scaled Jacobian at the optimum (singular values below 1e-8 of the
    largest count as zero: infinite standard errors).

    Raises
    ------
    DataError : ``q0`` of the wrong length or not finite, ``noise_sd`` of the wrong length.
    """
    names = problem.layout.names
    q = np.asarray(q0, float).copy()
    if q.shape != (len(names),) or not np.all(np.isfinite(q)):
        raise DataError(f"q0 must hold {len(names)} finite values {list(names)}, got {q0!r}")
    L = len(problem.noise_names)
    if noise_sd is not None and np.size(noise_sd) not in (1, L):
        raise DataError(f"noise_sd must hold {L} values {list(problem.noise_names)} (NaN: estimated), got {noise_sd!r}")
    lo, hi = problem.lower_upper()
    q = np.clip(q, np.where(np.isfinite(lo), lo + 1e-12 * np.abs(lo) + 1e-300, lo),
                np.where(np.isfinite(hi), hi - 1e-12 * np.abs(hi), hi))
    n0 = problem.n_solves()
    known = np.full(L, np.nan) if noise_sd is None else np.broadcast_to(np.asarray(noise_sd, float), (L,)).copy()
    estimated = ~np.isfinite(known) & np.array([m != "poisson" for m in problem.models])
    try:
        rss, n = problem.rss(q)
    except ODESolveError as err:
        return _failed(problem, q, n0, f"the ODE solve failed at the start ({err})")
    if problem.noise is None:
        sd = np.sqrt(np.maximum(rss / n, 1e-300)) if noise_sd is None else known
    else:  # known values; the others at their ML values for q0 (1 where a model cannot give one there)
        sd = np.where(np.isfinite(known), known, 1.0)
        sd = np.where(estimated, problem.ml_noise(q, sd), sd)
        sd = np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)
    estimate = bool(estimated.any())
    floor = 1e-6 * sd

    def solve(q, sd):
        return optimize.least_squares(problem.residuals, q, jac=problem.jacobian, bounds=(lo, hi), method="trf",
                                      x_scale="jac", max_nfev=max_nfev, args=(sd,))

    try:
        alt = alternate_noise(solve, problem.ml_noise, q, sd, estimated, floor, max_rounds=max_rounds,
                              noise_rtol=noise_rtol)
    except SEARCH_FAILURES as err:  # a solve failing on the way: a failed refinement, the other starts go on
        return _failed(problem, q, n0, f"a solve failed during the refinement ({err})")
    q, sd, res, rounds, converged = alt.q, alt.params, alt.result, alt.rounds, alt.converged
    message = str(res.message)
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
                                      "; noise sds not converged" if estimate else ""), cov,
                           problem.noise_names, problem.noise)


def _failed(problem: JointProblem, q, n0: int, message: str) -> JointRefinement:
    K, P = len(problem.problems), len(problem.layout.parameters)
    S = len(problem.layout.states)
    return JointRefinement(q, problem.layout.names, np.full(q.size, np.nan), np.full(len(problem.noise_names), np.nan),
                           problem.observed, np.inf, np.full((K, P), np.nan), np.full((K, S), np.nan),
                           problem.n_solves() - n0, False, message, None, problem.noise_names, problem.noise)

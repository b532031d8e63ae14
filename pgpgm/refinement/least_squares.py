"""Step 3: maximum-likelihood refinement of the parameters, initial values and noise.

The model: y[n, k] = x_M(t_n; theta, x0)[observed_idx[k]] + e[n, k], with independent
Gaussian errors e[n, k] ~ N(0, sd_k^2), one sd per observed state. x_M integrates the
full ODE from the initial values (latent states: known; observed states: started at the
sampling step's estimate and, by default, refined jointly with theta since they are
measured with noise too).

- With known sds this is weighted least squares,
  min over q = (theta, x0[free_x0]) of 1/2 sum_k RSS_k(q) / sd_k^2, with RSS_k the
  residual sum of squares of observed state k.
- With unknown sds (``refine(..., estimate_noise=True)``) the negative log likelihood
  sum_k [N_k log sd_k + RSS_k / (2 sd_k^2)] + (N_total / 2) log(2 pi)
  is minimised over (q, sd). For fixed q its minimiser is sd_k^2 = RSS_k(q) / N_k, so
  the profile NLL is sum_k N_k / 2 log RSS_k(q) + const. :func:`refine` alternates the
  two exact partial minimisations (weighted least squares in q for fixed sds, then
  sd_k = sqrt(RSS_k / N_k)); every round lowers the NLL, and the fixed point is a
  stationary point of the full likelihood (the weighted-least-squares gradient
  sum_k J_k^T r_k / sd_k^2 equals the profile gradient there).

Other measurement noise models (``LeastSquaresProblem(..., noise=("lognormal", "poisson", ...))``,
one :mod:`pgpgm.noise` name per observed state): the residuals are the model's (lognormal: (log y -
log mu)/sd; counts: deviance residuals), so that 1/2 sum r^2 = nll - nll_saturated and weighted least
squares in q for fixed noise parameters is maximum likelihood; the Jacobian is the chain rule
d_residuals_d_mu * dmu/dq; ``noise_sd`` holds each state's noise parameter (normal and lognormal: the
sd, lognormal of log y; negbin: alpha; Poisson: 1, unused). :func:`refine` estimates the parameters
in the same alternation: sd in closed form (sqrt of the mean squared residual on the model's scale),
negbin alpha by a 1-D minimisation of the nll in log alpha (a grid over 1e-4..1e8, then Brent); ``Refinement.nll`` is the model's
negative log likelihood (:meth:`pgpgm.noise.NoiseModel.nll`, constants included). The covariance is
(J^T J)^-1 of those residuals: the Gauss-Newton approximation of the observed information (for
counts, the expected (Fisher) information at y = mu).

The Jacobian comes from the forward sensitivities (one augmented solve). The covariance of
q is the inverse Fisher information computed on unit-norm columns with a rank-revealing
SVD (see :func:`refine`), so a direction the data do not determine gets an infinite
standard error and an :class:`~pgpgm.errors.IdentifiabilityWarning`, not a tiny one.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import optimize

from ..errors import DataError, IdentifiabilityWarning, ODESolveError

#: what a solve or a fit may raise at a bad point inside a search: the candidate is discarded (a failed
#: refinement), the search goes on
SEARCH_FAILURES = (ODESolveError, ArithmeticError, np.linalg.LinAlgError)
from ..noise import NOISE_MODELS, noise_model
from ..solve import Integrator
from .noise_estimation import alternate_noise, ml_noise_parameter

_FAILED = 1e6  # scaled residual reported for a failed solve (keeps the optimiser away)
_NULL_COMPONENT = 1e-6  # a unit null-space direction "involves" an unknown above this component
_SD_FLOOR = 1e-6  # an estimated sd stays above this fraction of its starting value
#: the name of each noise model's parameter held in ``noise_sd`` ("" for none)
_PARAMETER = {"normal": "sd", "lognormal": "sd", "negbin": "alpha", "poisson": ""}


@dataclass(frozen=True, eq=False)
class Refinement:
    """Result of the refinement step.

    Attributes
    ----------
    theta : (P,) estimate.
    stderr : (P,) standard errors (``inf`` for a parameter the data do not determine, NaN
        when the refinement failed).
    covariance : (P, P) covariance of theta, the theta block of ``q_covariance``.
    x0 : (S,) initial state used (refined entries included), state units.
    cost : 1/2 sum of squared residuals scaled by ``noise_sd``. With estimated noise it is
        N_total / 2 at the optimum whatever the fit: compare refinements by ``nll``.
    n_solves : ODE solves used (plain and sensitivity solves).
    success, message : whether the refinement converged, and why it stopped.
    noise_sd : (M,) observation noise sds used at the optimum (the maximum-likelihood
        estimates for estimated states, the given values for the others), state units.
    noise_estimated : (M,) bool, which entries of ``noise_sd`` were estimated.
    nll : negative Gaussian log likelihood of the data at (q, noise_sd), constants
        included (``inf`` when the refinement failed at its start).
    q : (Q,) all unknowns, theta followed by the free initial values.
    q_names : (Q,) their names: parameter names, then ``"x0[state]"``.
    q_covariance : (Q, Q) covariance of q. Entries of an undetermined unknown: ``inf`` on
        the diagonal, NaN elsewhere in its row and column.
    rank : numerical rank of the column-scaled Jacobian (0 when the refinement failed).
    singular_values : (Q,) singular values of the Jacobian with unit-norm columns,
        decreasing (zero-padded when there are fewer residuals than unknowns).
    null_space : (Q, Q - rank) unit directions in q (q units) that the data do not
        determine; moving q along them leaves the residuals unchanged to first order.
    undetermined : names of the unknowns with a component above 1e-6 in ``null_space``.
    noise : (M,) the noise model names of the problem, None for Gaussian noise throughout (then
        ``noise_sd`` are sds in state units; otherwise each state's noise parameter, see the module).
    """

    theta: np.ndarray
    stderr: np.ndarray
    covariance: np.ndarray
    x0: np.ndarray
    cost: float
    n_solves: int
    success: bool
    message: str
    noise_sd: np.ndarray
    noise_estimated: np.ndarray
    nll: float
    q: np.ndarray
    q_names: tuple[str, ...]
    q_covariance: np.ndarray
    rank: int
    singular_values: np.ndarray
    null_space: np.ndarray
    undetermined: tuple[str, ...]
    noise: tuple[str, ...] | None = None

    @property
    def q_stderr(self) -> dict[str, float]:
        """Standard errors of the unknowns by name (``theta`` names, ``x0[<state>]``)."""
        return dict(zip(self.q_names, np.sqrt(np.diag(self.q_covariance))))


@dataclass(frozen=True, eq=False)
class LeastSquaresProblem:
    """Scaled residuals of the observed states and their sensitivity Jacobian.

    The unknowns are q = (theta, x0[free_x0]): the parameters (P,) followed by the
    initial values of the states listed in ``free_x0``.

    Parameters
    ----------
    integrator : Integrator, the system solved at the observation times (N,) (the grid)
    y : (N, M) observations of the states ``observed_idx`` (state units), NaN where a state
        is not measured (residuals only where measured); (N,) when M = 1
    observed_idx : the M distinct state indices that ``y`` measures
    noise_sd : (M,) or scalar, observation noise sds (state units): the residual scales,
        and the starting values when :func:`refine` estimates them
    x0 : (S,) initial state at ``times[0]``; entries in ``free_x0`` are starting values
    free_x0 : distinct state indices whose initial values are unknowns too
    noise : None (Gaussian noise, the sds ``noise_sd``) or (M,) :mod:`pgpgm.noise` model names; then
        ``noise_sd`` holds each state's noise parameter (see the module docstring)

    Raises
    ------
    DataError : for inputs of the wrong shape, non-finite values or non-positive sds.
    """

    integrator: Integrator
    y: np.ndarray
    observed_idx: tuple[int, ...]
    noise_sd: np.ndarray
    x0: np.ndarray
    free_x0: tuple[int, ...] = field(default=(), kw_only=True)
    noise: tuple[str, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self):
        if not isinstance(self.integrator, Integrator):
            raise DataError(f"integrator must be a pgpgm.Integrator, got {type(self.integrator).__name__}")
        system = self.integrator.system
        S, N = system.n_states, self.integrator.times.size
        idx, labels, what = self.measured_columns()
        M = len(idx)
        y = np.asarray(self.y, dtype=float)
        if y.ndim == 1 and M == 1:
            y = y[:, None]
        if y.shape != (N, M):
            raise DataError(f"y must have shape (N, M) = ({N}, {M}) (times x {what} {list(labels)}), got {y.shape}")
        if np.any(np.isinf(y)):
            raise DataError("y contains inf: give finite values (NaN where a value is not measured)")
        if np.any(np.isfinite(y).sum(axis=0) == 0):
            raise DataError(f"y has a column without any measurement (all NaN): each of the {what} needs one")
        sd = np.asarray(self.noise_sd, dtype=float)
        if sd.ndim > 1 or sd.size not in (1, M):
            raise DataError(f"noise_sd must be a scalar or have one value per column of y ({what}, {M}), got {sd.shape}")
        sd = np.broadcast_to(sd.reshape(-1), (M,)).copy()
        if not np.all(np.isfinite(sd) & (sd > 0)):
            raise DataError(f"noise_sd must be positive and finite, got {sd}")
        x0 = np.asarray(self.x0, dtype=float).reshape(-1)
        if x0.shape != (S,) or not np.all(np.isfinite(x0)):
            raise DataError(f"x0 must hold {S} finite values {list(system.states)}, got {self.x0!r}")
        free = _indices(self.free_x0, S, "free_x0", system.states)
        if self.noise is not None:
            noise = tuple(self.noise)
            if len(noise) != M or any(n not in NOISE_MODELS for n in noise):
                raise DataError(f"noise must name one noise model of {list(NOISE_MODELS)} per column of y ({what}, "
                                f"{M}), got {self.noise!r}")
            object.__setattr__(self, "noise", noise)
            for k, n in enumerate(noise):  # what each model cannot explain, before any solve
                self.models(sd)[k].check(y[:, k], f"y of {labels[k]} (noise {n!r})")
        for name, value in (("y", y), ("observed_idx", idx), ("noise_sd", sd), ("x0", x0), ("free_x0", free)):
            if isinstance(value, np.ndarray):
                value.setflags(write=False)
            object.__setattr__(self, name, value)

    def measured_columns(self) -> tuple[tuple[int, ...], tuple[str, ...], str]:
        """What the M columns of ``y`` measure: ``observed_idx`` checked (M distinct state indices),
        their labels (M,) for messages and what they are ("observed states"). A subclass whose
        columns measure something else (:class:`~pgpgm.refinement.observed.ObservablesProblem`)
        overrides this; the checks of ``y``, ``noise_sd``, ``x0``, ``free_x0`` and ``noise`` are shared."""
        system = self.integrator.system
        idx = _indices(self.observed_idx, system.n_states, "observed_idx", system.states)
        if not idx:
            raise DataError("observed_idx is empty: give the index of at least one observed state")
        return idx, tuple(system.states[i] for i in idx), "observed states"

    # ------------------------------------------------------------------ unknowns
    @property
    def n_theta(self) -> int:
        """Number of parameters P."""
        return self.integrator.system.n_parameters

    @property
    def q0(self) -> np.ndarray:
        """The free initial values' starting values (len(free_x0),), to append to a theta."""
        return self.x0[list(self.free_x0)]

    @property
    def q_names(self) -> tuple[str, ...]:
        """Names of the unknowns q: the parameters, then ``"x0[state]"`` for each free initial value."""
        system = self.integrator.system
        return tuple(system.parameters) + tuple(f"x0[{system.states[j]}]" for j in self.free_x0)

    @property
    def observed_names(self) -> tuple[str, ...]:
        """(M,) names of the measured quantities (the observed states)."""
        return tuple(self.integrator.system.states[i] for i in self.observed_idx)

    @property
    def mask(self) -> np.ndarray:
        """(N, M) bool, True where ``y`` holds a measurement."""
        return np.isfinite(self.y)

    @property
    def n_obs(self) -> np.ndarray:
        """Number of observations N_k of each observed state (M,)."""
        return self.mask.sum(axis=0)

    def split(self, q) -> tuple[np.ndarray, np.ndarray]:
        """(theta (P,), full x0 (S,)) from the unknowns q (Q,)."""
        q = np.asarray(q, float)
        x0 = self.x0.copy()
        x0[list(self.free_x0)] = q[self.n_theta:]
        return q[: self.n_theta], x0

    def with_noise_sd(self, noise_sd) -> LeastSquaresProblem:
        """The same problem with other residual scales ``noise_sd`` (M,) (shares the integrator)."""
        if self.noise is None:
            return LeastSquaresProblem(self.integrator, self.y, self.observed_idx, noise_sd, self.x0,
                                       free_x0=self.free_x0)
        return LeastSquaresProblem(self.integrator, self.y, self.observed_idx, noise_sd, self.x0,
                                   free_x0=self.free_x0, noise=self.noise)

    def models(self, params=None) -> tuple:
        """(M,) the :mod:`pgpgm.noise` objects with the parameters ``params`` (M,) (default ``noise_sd``);
        Gaussian ones when ``noise`` is None."""
        params = self.noise_sd if params is None else np.asarray(params, float)
        names = self.noise or ("normal",) * len(self.observed_idx)
        return tuple(noise_model(n, **({_PARAMETER[n]: float(v)} if _PARAMETER[n] else {}))
                     for n, v in zip(names, params))

    def predictions(self, q) -> np.ndarray:
        """The model's prediction mu = x_M(t; q) (N, M) of the observations; raises
        :class:`ODESolveError` if the solve fails."""
        return self.integrator.solve(*self.split(q))[:, list(self.observed_idx)]

    def _noise_residuals(self, mu: np.ndarray) -> np.ndarray:
        """(N, M) the noise models' residuals at the prediction mu (0 where y is missing; a residual
        the model cannot give - mu <= 0 at a measured lognormal or count value - is 1e6)."""
        with np.errstate(all="ignore"):
            r = np.column_stack([m.residuals(self.y[:, k], mu[:, k]) for k, m in enumerate(self.models())])
        return np.where(np.isfinite(r), r, _FAILED)

    # ------------------------------------------------------------------ residuals
    def raw_residuals(self, q) -> np.ndarray:
        """Unscaled residuals x_M - y (N, M) at q (NaN where not measured); raises
        :class:`ODESolveError` if the solve fails."""
        x = self.integrator.solve(*self.split(q))
        return x[:, list(self.observed_idx)] - self.y

    def rss(self, q) -> np.ndarray:
        """Residual sum of squares of each observed state (M,) at q (state units squared)."""
        return self.rss_of(self.raw_residuals(q))

    def rss_of(self, r: np.ndarray) -> np.ndarray:
        """(M,) each observed state's residual sum of squares of :meth:`raw_residuals` ``r`` (N, M)."""
        if self.n_obs.sum() < self.y.size:
            r = np.where(self.mask, r, 0.0)
        return np.einsum("nk,nk->k", r, r)

    def gaussian_nll(self, rss: np.ndarray, sd: np.ndarray) -> float:
        """The Gaussian negative log likelihood of :meth:`nll` from each state's residual sum of squares
        ``rss`` (M,) and sd ``sd`` (M,)."""
        n = self.n_obs
        return float(np.sum(n * np.log(sd) + rss / (2 * sd**2)) + 0.5 * n.sum() * np.log(2 * np.pi))

    def residuals(self, q) -> np.ndarray:
        """Scaled residuals (x_M - y) / noise_sd where measured, row by row (K,) (K = N*M
        without missing values), at q.

        A failed solve gives a constant vector of 1e6 (keeps the optimiser away).
        """
        K = int(self.n_obs.sum())
        try:
            r = self.raw_residuals(q)
        except ODESolveError:
            return np.full(K, _FAILED)
        if self.noise is None:
            r = r / self.noise_sd
        else:  # the noise models' residuals (their sign: y - mu, the Jacobian's too)
            r = self._noise_residuals(r + self.y)
        return r.ravel() if K == self.y.size else r[self.mask]

    def jacobian(self, q, *, strict: bool = False) -> np.ndarray:
        """d residuals / d q, shape (K, Q) (rows of :meth:`residuals`), from forward sensitivities.

        A failed sensitivity solve raises :class:`ODESolveError` if ``strict``, and gives
        zeros otherwise (what the optimiser is given).
        """
        try:
            x, dth, dx0 = self.integrator.solve_sensitivities(*self.split(q))
        except ODESolveError:
            if strict:
                raise
            return np.zeros((int(self.n_obs.sum()), np.size(q)))
        d = np.concatenate([dth, dx0[:, :, list(self.free_x0)]], axis=2)
        if self.noise is None:
            d = d[:, list(self.observed_idx), :] / self.noise_sd[None, :, None]
        else:  # chain rule: dr/dq = dr/dmu * dmu/dq, dr/dmu of each model (diagonal)
            mu = x[:, list(self.observed_idx)]
            with np.errstate(all="ignore"):
                g = np.column_stack([m.d_residuals_d_mu(self.y[:, k], mu[:, k]) for k, m in enumerate(self.models())])
            g = np.where(np.isfinite(g), g, 0.0)
            d = d[:, list(self.observed_idx), :] * g[:, :, None]
        return d.reshape(self.y.size, -1) if self.n_obs.sum() == self.y.size else d[self.mask]

    def cost(self, q) -> float:
        """1/2 sum of squared scaled residuals at q = (theta, free initial values)."""
        r = self.residuals(q)
        return 0.5 * float(r @ r)

    def nll(self, q, noise_sd=None) -> float:
        """Gaussian negative log likelihood of y at q with sds ``noise_sd`` (M,) (default: the
        problem's), constants included: sum_k [N_k log sd_k + RSS_k / (2 sd_k^2)] + N/2 log(2 pi);
        with ``noise`` models, the sum of their ``nll`` with the parameters ``noise_sd``.
        ``inf`` if the solve fails."""
        sd = self.noise_sd if noise_sd is None else np.broadcast_to(np.asarray(noise_sd, float), self.noise_sd.shape)
        if self.noise is not None:
            try:
                mu = self.predictions(q)
            except ODESolveError:
                return np.inf
            with np.errstate(all="ignore"):
                v = float(sum(m.nll(self.y[:, k], mu[:, k]) for k, m in enumerate(self.models(sd))))
            return v if np.isfinite(v) else np.inf
        try:
            rss = self.rss(q)
        except ODESolveError:
            return np.inf
        return self.gaussian_nll(rss, sd)


#: residual evaluations of a short refinement (two noise rounds at most): a screen of a start before a full
#: refinement (the stop rule's box points, step 3's loose parameters held at a bound)
SHORT_NFEV = 40


def refine(
    problem: LeastSquaresProblem,
    q0,
    bounds=None,
    *,
    max_nfev: int = 200,
    estimate_noise: bool | Sequence[bool] = False,
    max_rounds: int = 50,
    noise_rtol: float = 1e-7,
    rcond: float | None = None,
    warn: bool = True,
) -> Refinement:
    """Maximise the Gaussian likelihood of the observations from ``q0`` within ``bounds``.

    Parameters
    ----------
    problem : LeastSquaresProblem
    q0 : (Q,) all unknowns (theta, free initial values), or theta (P,) alone, in which
        case the free initial values start at ``problem.x0``.
    bounds : (P, 2) lower and upper bounds of theta, or (Q, 2) of every unknown (theta, then the free
        initial values; -inf and inf where one has none), or None; with (P, 2) the free initial values
        are unbounded, and the sds always are.
    max_nfev : most residual evaluations of each weighted least-squares solve (a quarter more
        when it ends short of convergence within bounds: see :func:`_least_squares`).
    estimate_noise : False (default): the sds ``problem.noise_sd`` are known and fixed,
        and the refinement is weighted least squares. True: every observed state's sd
        is estimated jointly with q by maximum likelihood, ``problem.noise_sd`` being
        only the start. A sequence of M bools estimates the marked states' sds and keeps
        the others (known, user-given sds) fixed. With Gaussian noise the refinement ends no
        higher than its start: where the rounds from ``problem.noise_sd`` end above the start's
        likelihood (its sds at their maximum-likelihood values there), they run again from those
        sds (the message says so).
    max_rounds : most alternations between the least-squares solve and the sd update.
    noise_rtol : the alternation stops when no estimated sd changes by more than this
        relative amount in a round.
    rcond : singular values of the unit-column Jacobian below ``rcond`` times the
        largest count as zero. Default ``max(sqrt(eps), 10 * solver.rtol)``: along a
        right singular direction with singular value s the cost changes by s^2 d^2 / 2
        for a step d, so below sqrt(eps) * s_max the change is below the rounding of
        the cost along the best-determined direction; and the sensitivities carry
        relative errors of the order of the solver's tolerance, which by Weyl's
        inequality move each singular value by up to that times s_max.
    warn : emit the IdentifiabilityWarnings described below (the same facts are in the
        result's ``undetermined``, ``success`` and ``message`` either way; a multi-start
        caller may switch them off and warn once for the refinement it keeps).

    Returns
    -------
    Refinement
        With estimated noise the sds are the maximum-likelihood estimates
        sd_k = sqrt(RSS_k / N_k) at the optimum, with no degrees-of-freedom correction:
        they are biased low, E[sd_k^2] ~ sd_k,true^2 (1 - p_k / N_k) with p_k the
        number of unknowns that state k's fit effectively uses. An estimate is kept above
        1e-6 times its start; reaching that floor means the state's data are fitted
        exactly and the likelihood is unbounded: ``success`` is then False and an
        IdentifiabilityWarning names the state.

        The covariance of q is the inverse Fisher information (J^T J)^-1 of the residuals
        scaled by the final ``noise_sd`` (the given sds when known, the ML estimates
        when estimated; no s^2 factor; the uncertainty of estimated sds is not
        propagated, the Fisher information being block-diagonal between q and the sds).
        It is computed from the SVD of J with columns scaled to unit norm and inverted on
        the singular values above ``rcond`` * s_max only. Every unknown with a
        component above 1e-6 in the remaining null space gets an infinite standard error,
        and an IdentifiabilityWarning names them.

        If the ODE solve fails at the start, the start is returned with
        ``success=False``, a message saying so, ``nll = cost = inf`` and NaN standard
        errors (no exception, so that a multi-start refinement can go on with the other
        starts). The same holds, with the end point, if the sensitivity solve fails at
        the optimum.

    Raises
    ------
    DataError : for ``q0``, ``bounds`` or ``estimate_noise`` of the wrong shape, or
        non-positive ``max_rounds``, ``max_nfev`` or ``noise_rtol``.
    """
    P, names = problem.n_theta, problem.q_names
    Q, M = len(names), len(problem.observed_idx)
    q = np.asarray(q0, float).reshape(-1)
    if q.size == P and Q > P:
        q = np.concatenate([q, problem.q0])
    if q.size != Q or not np.all(np.isfinite(q)):
        raise DataError(f"q0 must hold {Q} finite values {list(names)} (or the {P} parameters alone), got {q0!r}")
    lo, hi = np.full(Q, -np.inf), np.full(Q, np.inf)
    if bounds is not None:
        b = np.asarray(bounds, float)
        if b.ndim != 2 or b.shape[0] not in (P, Q) or b.shape[1] != 2 or not np.all(b[:, 0] < b[:, 1]):
            raise DataError(f"bounds must be (P, 2) = ({P}, 2) or (Q, 2) = ({Q}, 2) rows (lower, upper) with lower "
                            f"< upper, got {bounds!r}")
        n = b.shape[0]
        lo[:n], hi[:n] = b[:, 0], b[:, 1]
        margin = lambda v: 1e-12 * np.abs(np.where(np.isfinite(v), v, 0.0))  # noqa: E731
        q[:n] = np.clip(q[:n], lo[:n] + margin(lo[:n]), hi[:n] - margin(hi[:n]))
    estimated = np.broadcast_to(np.asarray(estimate_noise, dtype=bool), (M,)).copy() \
        if np.ndim(estimate_noise) == 0 or np.size(estimate_noise) == M else None
    if estimated is None:
        raise DataError(f"estimate_noise must be a bool or {M} bools (one per observed state), got {estimate_noise!r}")
    if not (max_rounds >= 1 and noise_rtol > 0 and max_nfev >= 1):
        raise DataError(f"max_rounds, max_nfev and noise_rtol must be positive, got {max_rounds}, {max_nfev}, "
                        f"{noise_rtol}")
    if rcond is None:
        rcond = max(float(np.sqrt(np.finfo(float).eps)), 10 * problem.integrator.solver.rtol)

    n0 = problem.integrator.n_solves
    sd = problem.noise_sd.copy()
    floor = _SD_FLOOR * sd
    try:
        start_residuals = problem.raw_residuals(q)
    except ODESolveError as err:
        return _failed(problem, q, sd, estimated, n0,
                       f"the ODE solve failed at the start q0 = {dict(zip(names, q.round(6).tolist()))} "
                       f"({err}); start from other values")

    def solve(q, sd):
        return _least_squares(problem.with_noise_sd(sd), q, lo, hi, max_nfev)

    def update(q, sd):
        if problem.noise is None:
            return np.sqrt(problem.rss(q) / problem.n_obs)
        return _ml_noise(problem, q, sd)

    def finish(q, sd) -> tuple[Refinement, list[str]]:
        """The alternation from (q, sd), then the end point's Jacobian; the IdentifiabilityWarnings' texts."""
        notes: list[str] = []
        alt = alternate_noise(solve, update, q, sd, estimated, floor, max_rounds=max_rounds, noise_rtol=noise_rtol)
        q, sd, res, rounds, converged, change = alt.q, alt.params, alt.result, alt.rounds, alt.converged, alt.change
        success = bool(res.success) and converged
        message = str(res.message)
        if estimated.any():
            message += (f"; noise sds converged in {rounds} rounds" if converged else
                        f"; noise sds not converged after {rounds} rounds (last relative change {change:.2g})")
            at_floor = estimated & (sd <= floor)
            if at_floor.any():
                states = [problem.observed_names[k] for k in np.flatnonzero(at_floor)]
                success = False
                message += f"; the noise sd of {', '.join(states)} reached its floor (the likelihood is unbounded)"
                notes.append(f"pgpgm.refine: the model fits the data of {', '.join(states)} exactly, so their "
                             f"noise sd is not determined (the likelihood is unbounded; held at {_SD_FLOOR:g} x "
                             "the start); give noise_sd for these states")

        final = problem.with_noise_sd(sd)
        try:
            J = final.jacobian(q, strict=True)
        except ODESolveError as err:
            return _failed(problem, q, sd, estimated, n0, f"the sensitivity solve failed at the end point ({err})",
                           nll=final.nll(q, sd), cost=final.cost(q)), notes
        cov, s, rank, null, undetermined = _covariance(J, names, rcond)
        if undetermined:
            notes.append(f"pgpgm.refine: the data do not determine {', '.join(undetermined)}: the scaled Jacobian has "
                         f"rank {rank} for {Q} unknowns, so their standard errors are infinite; fix or reparametrise "
                         "them, or give more data")
        theta, x0 = problem.split(q)
        return Refinement(
            theta=theta, stderr=np.sqrt(np.diag(cov)[:P]), covariance=cov[:P, :P], x0=x0, cost=final.cost(q),
            n_solves=problem.integrator.n_solves - n0, success=success, message=message, noise_sd=sd,
            noise_estimated=estimated, nll=final.nll(q, sd), q=q, q_names=names, q_covariance=cov, rank=rank,
            singular_values=s, null_space=null, undetermined=undetermined, noise=problem.noise,
        ), notes

    try:
        out, notes = finish(q, sd)
    except SEARCH_FAILURES as err:  # a solve that fails on the way (a noise-sd round's point): a failed refinement
        return _failed(problem, q, sd, estimated, n0, f"a solve failed during the refinement ({err})")
    if estimated.any() and problem.noise is None:
        # the first rounds are weighted by the given sds (e.g. a GP's): far from the start's own sds they can lead
        # least squares away from an optimum it starts at, uphill in the likelihood (a GP's sd far below the
        # residuals' gives that state's residuals far too much weight against the others'). A refinement ends no
        # higher than its start: else it runs again from the sds that maximise the likelihood at the start
        rss = problem.rss_of(start_residuals)
        start_sd = np.where(estimated, np.maximum(np.sqrt(rss / problem.n_obs), floor), sd)
        start_nll = problem.gaussian_nll(rss, start_sd)
        if not out.nll <= start_nll + 1e-9 * max(1.0, abs(start_nll)):
            try:
                again, again_notes = finish(q, start_sd)
            except SEARCH_FAILURES:  # the rerun failed: the first refinement stands
                again, again_notes = out, notes
            if again.nll < out.nll or not np.isfinite(out.nll):
                out, notes = replace(again, n_solves=problem.integrator.n_solves - n0, message=again.message + (
                    f"; rerun from the start's own noise sds (the given sds' rounds ended at {out.nll:.6g}, above the "
                    f"start's {start_nll:.6g})")), again_notes
    for note in notes if warn else ():  # the kept refinement's only
        warnings.warn(note, IdentifiabilityWarning, stacklevel=2)
    return out


def _ml_noise(problem: LeastSquaresProblem, q, params: np.ndarray) -> np.ndarray:
    """(M,) the maximum-likelihood noise parameter of each state at q for a problem with ``noise`` models
    (:func:`~pgpgm.refinement.noise_estimation.ml_noise_parameter`, its known limit for negbin included);
    ``params`` where the model has none (Poisson) or the solve fails."""
    out = np.array(params, dtype=float)
    try:
        mu = problem.predictions(q)
    except ODESolveError:
        return out
    for k, name in enumerate(problem.noise):
        out[k] = ml_noise_parameter(name, problem.y[:, k], mu[:, k], out[k])
    return out


def _least_squares(problem: LeastSquaresProblem, q: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   max_nfev: int) -> optimize.OptimizeResult:
    """One weighted least-squares solve from q within [lo, hi]: scipy's trust-region-reflective
    method ("trf"), and when it spends ``max_nfev`` evaluations without converging (status 0)
    inside finite bounds, a second solve from its end point by the dogleg method with
    rectangular trust regions ("dogbox", at most ``max_nfev // 4`` evaluations more), kept if
    it lowers the cost.

    trf keeps its iterates strictly inside the bounds and its steps toward an active bound
    shrink geometrically, so an optimum on a bound is reached by a crawl: hundreds of
    evaluations, more than a ``max_nfev`` of 200, where dogbox, which fixes active bounds,
    takes tens from the same starts. dogbox is not the first method because it fails on
    ill-conditioned problems: from prior-box starts it can miss the optimum from a third of
    the starts that trf refines to it, at many times trf's cost. Solves that converge under
    trf are unchanged; the second solve's budget is short because where many starts' solves
    run out, a full second budget adds ~40 % to the cost and a quarter of it under 10 %."""
    res = optimize.least_squares(problem.residuals, q, jac=problem.jacobian, bounds=(lo, hi), method="trf",
                                 x_scale="jac", max_nfev=max_nfev)
    if res.status != 0 or not np.any(np.isfinite(lo) | np.isfinite(hi)):
        return res
    polish = optimize.least_squares(problem.residuals, res.x, jac=problem.jacobian, bounds=(lo, hi),
                                    method="dogbox", x_scale="jac", max_nfev=max(1, max_nfev // 4))
    return polish if polish.cost < res.cost else res


def _covariance(J: np.ndarray, names: tuple[str, ...], rcond: float):
    """(J^T J)^-1 by a rank-revealing SVD on unit-norm columns.

    Returns covariance (Q, Q) (inf/NaN for undetermined unknowns), singular values (Q,) of
    the scaled J, the rank, a null-space basis in q units (Q, Q - rank) and the names of
    the undetermined unknowns.
    """
    Q = J.shape[1]
    c = np.linalg.norm(J, axis=0)
    live = c > 0
    if live.any():
        Js = J[:, live] / c[live]
        if Js.shape[0] < Js.shape[1]:  # zero rows: a square V without the (n, n) U of full_matrices
            Js = np.vstack([Js, np.zeros((Js.shape[1] - Js.shape[0], Js.shape[1]))])
        _, s_live, vt = np.linalg.svd(Js, full_matrices=False)
    else:
        s_live, vt = np.zeros(0), np.zeros((0, 0))
    s = np.zeros(Q)
    s[: s_live.size] = s_live
    rank = int(np.sum(s_live > rcond * s_live[0])) if s_live.size else 0
    V = np.zeros((Q, Q))  # right singular vectors in scaled coordinates z = c * q
    V[np.ix_(live, np.arange(live.sum()))] = vt.T
    V[~live, live.sum():] = np.eye(Q)[~live][:, ~live]
    kept, null_z = V[:, :rank], V[:, rank:]
    cs = np.where(live, c, 1.0)
    cov = (kept / s[:rank] ** 2) @ kept.T / np.outer(cs, cs)
    involved = np.linalg.norm(null_z, axis=1) > _NULL_COMPONENT
    cov[involved, :] = np.nan
    cov[:, involved] = np.nan
    cov[involved, involved] = np.inf
    null = null_z / cs[:, None]
    null /= np.maximum(np.linalg.norm(null, axis=0), np.finfo(float).tiny)
    return cov, s, rank, null, tuple(n for n, bad in zip(names, involved) if bad)


def failed_refinement(problem: LeastSquaresProblem, q, message: str) -> Refinement:
    """A refinement of ``problem`` that failed at ``q`` (Q,) for the reason ``message``: infinite nll, NaN
    standard errors (a search discards it and goes on)."""
    estimated = np.zeros(len(problem.observed_idx), bool)
    return _failed(problem, np.asarray(q, float), problem.noise_sd.copy(), estimated, problem.integrator.n_solves, message)


def _failed(problem: LeastSquaresProblem, q, sd, estimated, n0: int, message: str, *,
            nll: float = np.inf, cost: float = np.inf) -> Refinement:
    """A failed refinement at q: NaN standard errors and covariance, rank 0."""
    P, Q = problem.n_theta, len(problem.q_names)
    theta, x0 = problem.split(q)
    return Refinement(
        theta=theta, stderr=np.full(P, np.nan), covariance=np.full((P, P), np.nan), x0=x0, cost=cost,
        n_solves=problem.integrator.n_solves - n0, success=False, message=message, noise_sd=sd,
        noise_estimated=estimated, nll=nll, q=np.asarray(q, float), q_names=problem.q_names,
        q_covariance=np.full((Q, Q), np.nan), rank=0, singular_values=np.full(Q, np.nan),
        null_space=np.zeros((Q, 0)), undetermined=(), noise=problem.noise,
    )


def _indices(values, size: int, name: str, states: Sequence[str]) -> tuple[int, ...]:
    """Distinct state indices in range, as a tuple of int; DataError otherwise."""
    arr = np.asarray(values).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{name} must hold state indices (integers 0..{size - 1} for {list(states)}), got {values!r}")
    out = tuple(int(i) for i in arr)
    if any(not 0 <= i < size for i in out) or len(set(out)) != len(out):
        raise DataError(f"{name} must hold distinct state indices 0..{size - 1} ({list(states)}), got {list(out)}")
    return out

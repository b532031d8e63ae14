"""Step 3: least-squares refinement  min_theta || (x_M(theta) - y) / sigma ||^2.

x_M(theta) integrates the full ODE from the initial values (latent states: known;
observed states: started at the sampling step's estimate and, by default, refined
jointly with theta since they are measured with noise too). The Jacobian comes from the
forward sensitivities, and the approximate covariance of the estimate is
s^2 (J^T J)^-1 with s^2 the reduced chi-square of the scaled residuals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize

from .errors import ODESolveError
from .solve import Integrator

_FAILED = 1e6  # scaled residual reported for a failed solve (keeps the optimiser away)


@dataclass(frozen=True)
class Refinement:
    """Result of the least-squares step.

    theta : (P,) estimate; stderr : (P,) approximate standard errors;
    covariance : (P, P); x0 : (S,) initial state used (refined entries included);
    cost : 1/2 sum of squared scaled residuals at the optimum;
    n_solves : ODE solves used; success, message : from scipy.optimize.least_squares.
    """

    theta: np.ndarray
    stderr: np.ndarray
    covariance: np.ndarray
    x0: np.ndarray
    cost: float
    n_solves: int
    success: bool
    message: str


class LeastSquaresProblem:
    """Scaled residuals of the observed states and their sensitivity Jacobian.

    The unknowns are q = (theta, x0[free_x0]): the parameters (P,) followed by the
    initial values of the states listed in ``free_x0``.

    Parameters
    ----------
    integrator : Integrator, the system solved at the observation times (N,)
    y : (N, M) observations of the states ``observed_idx``
    observed_idx : the M state indices that ``y`` measures
    noise_sd : (M,) residual scales (state units)
    x0 : (S,) initial state at ``times[0]``; entries in ``free_x0`` are starting values
    free_x0 : state indices whose initial values are unknowns too
    """

    def __init__(self, integrator: Integrator, y, observed_idx, noise_sd, x0, *, free_x0=()):
        self.integrator = integrator
        self.y = np.asarray(y, float)
        self.idx = list(observed_idx)
        self.sd = np.asarray(noise_sd, float)
        self.x0 = np.asarray(x0, float)
        self.free_x0 = list(free_x0)
        self.n_theta = integrator.system.n_parameters

    @property
    def q0(self) -> np.ndarray:
        """The free initial values' starting values (len(free_x0),), to append to a theta."""
        return self.x0[self.free_x0]

    def split(self, q) -> tuple[np.ndarray, np.ndarray]:
        """(theta (P,), full x0 (S,)) from the unknowns q."""
        q = np.asarray(q, float)
        x0 = self.x0.copy()
        x0[self.free_x0] = q[self.n_theta:]
        return q[: self.n_theta], x0

    def residuals(self, q) -> np.ndarray:
        """Scaled residuals, flattened (N*M,), at q = (theta, free initial values)."""
        try:
            x = self.integrator.solve(*self.split(q))
        except ODESolveError:
            return np.full(self.y.size, _FAILED)
        return ((x[:, self.idx] - self.y) / self.sd).ravel()

    def jacobian(self, q) -> np.ndarray:
        """d residuals / d q, shape (N*M, P + len(free_x0)), from forward sensitivities."""
        try:
            _, dth, dx0 = self.integrator.solve_sensitivities(*self.split(q))
        except ODESolveError:
            return np.zeros((self.y.size, np.size(q)))
        d = np.concatenate([dth, dx0[:, :, self.free_x0]], axis=2)
        return (d[:, self.idx, :] / self.sd[None, :, None]).reshape(self.y.size, -1)

    def cost(self, q) -> float:
        """1/2 sum of squared scaled residuals at q = (theta, free initial values)."""
        r = self.residuals(q)
        return 0.5 * float(r @ r)


def refine(problem: LeastSquaresProblem, q0, bounds=None, *, max_nfev: int = 200) -> Refinement:
    """Minimise the scaled squared error from ``q0`` within ``bounds``.

    ``q0`` is either the full vector of unknowns (theta, free initial values) or theta
    (P,) alone, in which case the free initial values start at ``problem.x0``. ``bounds``
    ((P, 2) or None) bound theta; free initial values are unbounded.
    """
    P = problem.n_theta
    q0 = np.asarray(q0, float)
    q0 = np.concatenate([q0, problem.q0]) if q0.size == P else q0.copy()
    lo, hi = np.full(q0.size, -np.inf), np.full(q0.size, np.inf)
    if bounds is not None:
        lo[:P], hi[:P] = np.asarray(bounds)[:, 0], np.asarray(bounds)[:, 1]
        q0[:P] = np.clip(q0[:P], lo[:P] + 1e-12 * np.abs(lo[:P]), hi[:P] - 1e-12 * np.abs(hi[:P]))
    n0 = problem.integrator.n_solves
    res = optimize.least_squares(problem.residuals, q0, jac=problem.jacobian, bounds=(lo, hi),
                                 method="trf", x_scale="jac", max_nfev=max_nfev)
    J = res.jac
    dof = max(res.fun.size - q0.size, 1)
    s2 = float(res.fun @ res.fun) / dof
    try:
        cov = s2 * linalg.pinvh(J.T @ J)
    except linalg.LinAlgError:
        cov = np.full((q0.size, q0.size), np.nan)
    theta, x0 = problem.split(res.x)
    return Refinement(theta, np.sqrt(np.clip(np.diag(cov)[:P], 0, None)), cov[:P, :P], x0, float(res.cost),
                      problem.integrator.n_solves - n0, bool(res.success), str(res.message))

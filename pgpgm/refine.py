"""Step 3: least-squares refinement  min_theta || (x_M(theta) - y) / sigma ||^2.

x_M(theta) integrates the full ODE from the initial values (latent states: known;
observed states: fixed at the sampling step's estimate). The Jacobian comes from the
forward sensitivities, and the approximate covariance of the estimate is
s^2 (J^T J)^-1 with s^2 the reduced chi-square of the scaled residuals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize

from .errors import ODESolveError
from .ode import ODESolver, SolverOptions
from .system import ODESystem

_FAILED = 1e6  # scaled residual reported for a failed solve (keeps the optimiser away)


@dataclass(frozen=True)
class Refinement:
    """Result of the least-squares step.

    theta : (P,) estimate; stderr : (P,) approximate standard errors;
    covariance : (P, P); cost : 1/2 sum of squared scaled residuals at the optimum;
    n_solves : ODE solves used; success, message : from scipy.optimize.least_squares.
    """

    theta: np.ndarray
    stderr: np.ndarray
    covariance: np.ndarray
    cost: float
    n_solves: int
    success: bool
    message: str


class LeastSquaresProblem:
    """Scaled residuals of the observed states and their sensitivity Jacobian.

    Parameters
    ----------
    system : ODESystem
    times : (N,) observation times
    y : (N, M) observations of the states ``observed_idx``
    noise_sd : (M,) residual scales
    x0 : (S,) initial state at ``times[0]``
    """

    def __init__(self, system: ODESystem, times, y, observed_idx, noise_sd, x0, *,
                 backend: str = "auto", options: SolverOptions | None = None):
        self.solver = ODESolver(system, times, backend=backend, options=options)
        self.y = np.asarray(y, float)
        self.idx = list(observed_idx)
        self.sd = np.asarray(noise_sd, float)
        self.x0 = np.asarray(x0, float)

    def residuals(self, theta) -> np.ndarray:
        """Scaled residuals, flattened (N*M,)."""
        try:
            x = self.solver.solve(theta, self.x0)
        except ODESolveError:
            return np.full(self.y.size, _FAILED)
        return ((x[:, self.idx] - self.y) / self.sd).ravel()

    def jacobian(self, theta) -> np.ndarray:
        """d residuals / d theta, shape (N*M, P), from forward sensitivities."""
        try:
            _, dth, _ = self.solver.solve_sensitivities(theta, self.x0)
        except ODESolveError:
            return np.zeros((self.y.size, np.size(theta)))
        return (dth[:, self.idx, :] / self.sd[None, :, None]).reshape(self.y.size, -1)

    def cost(self, theta) -> float:
        r = self.residuals(theta)
        return 0.5 * float(r @ r)


def refine(problem: LeastSquaresProblem, theta0, bounds=None, *, max_nfev: int = 200) -> Refinement:
    """Minimise the scaled squared error from ``theta0`` within ``bounds`` ((P, 2) or None)."""
    theta0 = np.asarray(theta0, float)
    lo, hi = (-np.inf, np.inf) if bounds is None else (np.asarray(bounds)[:, 0], np.asarray(bounds)[:, 1])
    theta0 = np.clip(theta0, lo + 1e-12 * np.abs(lo), hi - 1e-12 * np.abs(hi)) if bounds is not None else theta0
    n0 = problem.solver.n_solves
    res = optimize.least_squares(problem.residuals, theta0, jac=problem.jacobian, bounds=(lo, hi),
                                 method="trf", x_scale="jac", max_nfev=max_nfev)
    J = res.jac
    dof = max(res.fun.size - theta0.size, 1)
    s2 = float(res.fun @ res.fun) / dof
    try:
        cov = s2 * linalg.pinvh(J.T @ J)
    except linalg.LinAlgError:
        cov = np.full((theta0.size, theta0.size), np.nan)
    return Refinement(res.x, np.sqrt(np.clip(np.diag(cov), 0, None)), cov, float(res.cost),
                      problem.solver.n_solves - n0, bool(res.success), str(res.message))

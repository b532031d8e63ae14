"""Sensitivity index S_ij = ||dx_i/dtheta_j||_L2(T1,T2) / ||x_i||_L2(T1,T2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import xarray as xr
from scipy.integrate import trapezoid

from .ode.system import ODESystem
from .solve import Integrator, Solver, default_solver


def sensitivity_index(
    system: ODESystem,
    theta,
    x0,
    t_span: tuple[float, float],
    *,
    n_points: int = 2001,
    method: str = "sensitivity",
    solver: Solver | None = None,
) -> xr.DataArray:
    """Which parameters can the data of each state pin down?

    Parameters
    ----------
    system : ODESystem
    theta : array (P,), the parameter set theta_0 at which derivatives are taken
    x0 : array (S,), the state at ``t_span[0]``
    t_span : (T1, T2), the interval of the L2 norms
    n_points : grid points for the trapezoidal L2 norms
    method : ``"sensitivity"`` (forward sensitivity equations) or
        ``"finite-difference"`` (central differences of two solves per parameter,
        step 1e-6 relative); the two are independent routes to the same table.
    solver : the ODE solver (default: :func:`pgpgm.default_solver` at rtol = atol = 1e-10)

    Returns
    -------
    xarray.DataArray, dims (parameter, state)
        S_ij = ||dx_i/dtheta_j|| / ||x_i|| (unscaled by theta_j); NaN where ||x_i|| = 0.
    """
    t = np.linspace(float(t_span[0]), float(t_span[1]), n_points)
    solver = Integrator(system, t, solver or replace(default_solver(), rtol=1e-10, atol=1e-10))
    theta = np.asarray(theta, float)
    if method == "sensitivity":
        x, dx_dtheta, _ = solver.solve_sensitivities(theta, x0)
    elif method == "finite-difference":
        x = solver.solve(theta, x0)
        dx_dtheta = np.empty(x.shape + (theta.size,))
        for j in range(theta.size):
            h = 1e-6 * max(abs(theta[j]), 1e-3)
            tp, tm = theta.copy(), theta.copy()
            tp[j] += h
            tm[j] -= h
            dx_dtheta[:, :, j] = (solver.solve(tp, x0) - solver.solve(tm, x0)) / (2 * h)
    else:
        raise ValueError(f"method must be 'sensitivity' or 'finite-difference', got {method!r}")
    norm_x = np.sqrt(trapezoid(x**2, t, axis=0))  # (S,)
    norm_d = np.sqrt(trapezoid(dx_dtheta**2, t, axis=0))  # (S, P)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(norm_x[:, None] > 0, norm_d / norm_x[:, None], np.nan)
    return xr.DataArray(
        s.T,
        dims=("parameter", "state"),
        coords={"parameter": list(system.parameters), "state": list(system.states)},
        name="sensitivity_index",
        attrs={"t_span": [float(t[0]), float(t[-1])], "theta": theta.tolist()},
    )

""":func:`scipy.integrate.solve_ivp` with LSODA: the reference backend, always available."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from scipy.integrate import solve_ivp

from ..errors import ODESolveError
from .base import Solver, piecewise

if TYPE_CHECKING:
    from ..ode.system import ODESystem


@dataclass(frozen=True)
class LSODA(Solver):
    """scipy's LSODA (``solve_ivp``) with the compiled right-hand side behind a Python callback."""

    name: ClassVar[str] = "lsoda"

    def engine(self, system: ODESystem, size: int, augmented: bool) -> LsodaEngine:
        return LsodaEngine(system, augmented, self)


class LsodaEngine:
    """One right-hand side (plain or augmented) integrated by ``solve_ivp(method="LSODA")``."""

    def __init__(self, system: ODESystem, aug: bool, solver: LSODA):
        k = system.compiled
        self._f = k.aug_rhs if aug else k.rhs
        self._p = np.zeros(max(system.n_parameters, 1))
        self._solver = solver

    def solve(self, times, theta, y0, breaks=None) -> np.ndarray:
        """States (N, n) at ``times``; one ``solve_ivp`` per piece between the ``breaks``
        (:func:`~pgpgm.solve.base.piecewise`), which never steps past its end."""
        opts, f, p = self._solver, self._f, self._p
        p[: theta.size] = theta
        budget = [opts.max_steps * 10 * times.size]  # LSODA can crawl forever towards a blow-up

        def fun(t, y):
            budget[0] -= 1
            if budget[0] < 0:
                raise ODESolveError(f"solve_ivp exceeded its right-hand-side budget (10 x max_steps={opts.max_steps} "
                                    f"evaluations per output time) near t = {t:.6g}: raise the solver's max_steps, "
                                    "or the model is stiff or blows up at these values")
            out = np.empty_like(y)
            f(t, y, p, out)
            return out

        def integrate(grid, y):
            sol = solve_ivp(fun, (grid[0], grid[-1]), y, method="LSODA", t_eval=grid, rtol=opts.rtol,
                            atol=opts.atol)
            if sol.status != 0 or sol.y.shape[1] != grid.size:
                raise ODESolveError(f"solve_ivp failed: {sol.message}")
            return sol.y.T

        return piecewise(integrate, times, y0, breaks)

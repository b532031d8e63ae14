"""scikit-sundae's own CVODE wrapper, calling the compiled right-hand side from Python.

Slower than :class:`pgpgm.CVODE` (a Python call per right-hand-side evaluation); a fallback
where the SUNDIALS libraries cannot be bound directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import ODESolveError
from .base import Solver, piecewise

if TYPE_CHECKING:
    from ..ode.system import ODESystem


@dataclass(frozen=True)
class SksundaeCVODE(Solver):
    """CVODE (BDF) through scikit-sundae's wrapper with a Python callback."""

    name: ClassVar[str] = "sksundae"

    @classmethod
    def available(cls) -> bool:
        try:
            import sksundae
        except ImportError:
            return False
        return True

    def engine(self, system: ODESystem, size: int, augmented: bool) -> SksundaeEngine:
        return SksundaeEngine(system, augmented, self)


class SksundaeEngine:
    """scikit-sundae's CVODE object around the compiled (plain or augmented) right-hand side."""

    def __init__(self, system: ODESystem, aug: bool, solver: SksundaeCVODE):
        from sksundae.cvode import CVODE as _CVODE

        k = system.compiled
        self._p = np.zeros(max(system.n_parameters, 1))
        f = k.aug_rhs if aug else k.rhs
        p = self._p

        def rhsfn(t, y, yp):
            f(t, y, p, yp)

        self._solver = _CVODE(rhsfn, rtol=solver.rtol, atol=solver.atol, max_num_steps=solver.max_steps,
                              method="BDF")
        self._max_steps = solver.max_steps

    def solve(self, times, theta, y0, breaks=None) -> np.ndarray:
        """States (N, n) at ``times``; one solve per piece between the ``breaks``
        (:func:`~pgpgm.solve.base.piecewise`; scikit-sundae stops exactly at a grid's end)."""
        self._p[: theta.size] = theta

        def integrate(grid, y):
            sol = self._solver.solve(grid, y)
            if not sol.success or sol.y.shape[0] != grid.size:
                hint = (f" (more than max_steps={self._max_steps} internal steps between two output times: raise "
                        "the solver's max_steps, or the model is stiff or blows up at these values)"
                        if "max_num_steps" in str(sol.message) else "")
                raise ODESolveError(f"scikit-sundae CVODE failed: {sol.message}{hint}")
            return np.asarray(sol.y)

        return piecewise(integrate, times, y0, breaks)

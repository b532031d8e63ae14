"""The solver protocol: a :class:`Solver` configures, an :class:`Integrator` solves.

A solver object is small and immutable (tolerances and a step budget) and is passed in
wherever an ODE is solved, as diffrax passes its solver objects: ``pgpgm.CVODE()``,
``pgpgm.SksundaeCVODE()``, ``pgpgm.LSODA()``. Each backend lives in its own module and
implements one method, :meth:`Solver.engine`, which returns the backend's native
integrator for one system and state size; :mod:`pgpgm.solve.integrator` binds a solver to a
system and an output grid. Where the right-hand side switches at fixed times
(:meth:`ODESystem.breakpoints <pgpgm.ode.system.ODESystem.breakpoints>`), every backend
integrates piecewise: it stops exactly at each such time inside the span and restarts there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from ..errors import DataError

if TYPE_CHECKING:
    from ..ode.system import ODESystem


class Engine(Protocol):
    """A backend's native integrator for one system and one state size (owns solver memory)."""

    def solve(self, times: np.ndarray, theta: np.ndarray, y0: np.ndarray, breaks: np.ndarray | None = None
              ) -> np.ndarray:
        """States (N, n) at ``times`` from ``y0`` (n,) at ``times[0]``, integrating piecewise between
        the ``breaks`` (B,), sorted and strictly inside the span (no step may cross one); raises
        ODESolveError."""


def piecewise(integrate: Callable[[np.ndarray, np.ndarray], np.ndarray], times: np.ndarray, y0: np.ndarray,
              breaks: np.ndarray | None) -> np.ndarray:
    """States at ``times`` from a solve restarted at every break, for backends that solve a whole
    grid per call (scikit-sundae, scipy).

    Parameters
    ----------
    integrate : ``integrate(grid (M,), y (n,)) -> states (M, n)``, one fresh solve from ``y`` at
        ``grid[0]`` that must not step past ``grid[-1]`` (M >= 3, strictly increasing)
    times : (N,) output times; y0 : (n,) state at ``times[0]``
    breaks : (B,) sorted, strictly inside the span, or None/empty (then one call over ``times``)

    Returns
    -------
    array (N, n). Each piece ends at the float just below a break (so that ``t < b`` still
    reads its side at every right-hand-side evaluation) and the next starts from the state
    there, at the float just above it (so that ``t <= b`` reads the new side); an output time
    that equals a break gets the state at the end of the piece before it.
    """
    if breaks is None or breaks.size == 0:
        return integrate(times, y0)
    eps = np.finfo(float).eps
    out = np.empty((times.size, y0.size))
    out[0] = y0
    y = np.asarray(y0, dtype=float)
    start = previous = float(times[0])
    for end in [*map(float, breaks), float(times[-1])]:
        idx = np.flatnonzero((times > previous) & (times <= end))
        close = times[idx] - start <= 4 * eps * np.maximum(abs(start), np.abs(times[idx]))
        out[idx[close]] = y  # within rounding of the restart: the state moves by rounding only
        idx = idx[~close]
        # the piece ends at the float below the break: the solver evaluates the right-hand side at a
        # step's end, and at the break itself it would read the next side (where(t < b, ...))
        last = float(np.nextafter(end, -np.inf)) if end < times[-1] else end
        grid = np.concatenate([[start], np.minimum(times[idx], last),
                               [last] if not idx.size or times[idx[-1]] < last else []])
        if grid.size >= 2 and grid[-1] - start > 4 * eps * max(abs(start), abs(end)):
            # a two-point grid is a time span to some backends (scikit-sundae then returns every
            # internal step): one more output time in the middle, dropped again
            ys = integrate(grid, y) if grid.size > 2 else integrate(np.array([start, (start + grid[1]) / 2,
                                                                              grid[1]]), y)[[0, 2]]
            out[idx] = ys[1:1 + idx.size]
            y = ys[-1]
        previous, start = end, float(np.nextafter(end, np.inf))
    return out


@dataclass(frozen=True)
class Solver(ABC):
    """Integration settings shared by every backend.

    Parameters
    ----------
    rtol, atol : relative and absolute tolerances (applied to states and sensitivities).
    max_steps : most internal steps between two output times before the solve is
        declared failed (this bounds the work of a diverging solve).
    """

    rtol: float = 1e-8
    atol: float = 1e-8
    max_steps: int = 20_000
    name: ClassVar[str] = "solver"

    def __post_init__(self):
        if not (self.rtol > 0 and self.atol > 0 and self.max_steps > 0):
            raise DataError(f"tolerances and max_steps must be positive: {self}")

    @classmethod
    def available(cls) -> bool:
        """Whether this backend can run on this machine."""
        return True

    @abstractmethod
    def engine(self, system: ODESystem, size: int, augmented: bool) -> Engine:
        """A native integrator of ``system`` (``augmented``: with sensitivities; ``size`` states)."""

"""The solver protocol: a :class:`Solver` configures, an :class:`Integrator` solves.

A solver object is small and immutable (tolerances and a step budget) and is passed in
wherever an ODE is solved, as diffrax passes its solver objects: ``pgpgm.CVODE()``,
``pgpgm.SksundaeCVODE()``, ``pgpgm.LSODA()``. Each backend lives in its own module and
implements one method, :meth:`Solver.engine`, which returns the backend's native
integrator for one system and state size. :meth:`Solver.integrator` binds a solver to a
system and an output grid; the :class:`Integrator` does the solves, counts them and
returns states and, when asked, forward sensitivities with respect to q = (theta, x0),
obtained by integrating the augmented system ``[x, dx/dq_1, ..., dx/dq_K]``
(see :mod:`pgpgm.ode.codegen`). Where the right-hand side switches at fixed times
(:meth:`ODESystem.breakpoints <pgpgm.ode.system.ODESystem.breakpoints>`), every backend
integrates piecewise: it stops exactly at each such time inside the span and restarts there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from ..data import check_times
from ..errors import DataError, ODESolveError

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

    def integrator(self, system: ODESystem, times) -> Integrator:
        """This solver bound to ``system`` and the output ``times`` (N,)."""
        return Integrator(system, times, self)


class Integrator:
    """Solve one system at fixed output times with one solver; x0 is the state at ``times[0]``.

    Parameters
    ----------
    system : ODESystem
    times : array (N,), strictly increasing output times; the solve starts at ``times[0]``
    solver : Solver (default :func:`pgpgm.default_solver`)

    Attributes
    ----------
    breakpoints : array (B,)
        The times strictly inside the span at which the right-hand side switches
        (:meth:`ODESystem.breakpoints <pgpgm.ode.system.ODESystem.breakpoints>`): every solve
        stops exactly at each and restarts there (empty for a smooth model).
    n_solves : int
        Solves done so far (with or without sensitivities), from Python and from compiled
        code; a repeated plain solve at the same (theta, x0) through :meth:`solve` is served
        from the previous result and not counted.
    compiled_solves : array (1,) of int64
        The solves done by compiled code since this integrator's Ops were compiled (the
        numba implementation of :class:`~pgpgm.solve.op.ODEOp` counts atomically, in one
        counter per compiled function, which equal Ops share: see :meth:`track_counter`).
    """

    def __init__(self, system: ODESystem, times, solver: Solver | None = None):
        from . import default_solver

        self.system = system
        self.times = check_times(times)
        self.breakpoints = system.breakpoints(self.times[0], self.times[-1])
        self.solver = default_solver() if solver is None else solver
        if not isinstance(self.solver, Solver):
            raise DataError(f"solver must be a pgpgm Solver such as pgpgm.CVODE(), got {self.solver!r}")
        if not self.solver.available():
            raise DataError(f"the {self.solver.name} solver is not available here; use pgpgm.default_solver()")
        self._python_solves = 0
        self._counters: dict[str, tuple[np.ndarray, int]] = {}
        S, P = system.n_states, system.n_parameters
        self._sizes = {False: S, True: S * (1 + P + S)}
        self._engines: dict[bool, Engine] = {}
        self._last: tuple[bytes, np.ndarray] | None = None

    def __reduce__(self):  # native memory is not picklable: rebuild it in the other process
        return (Integrator, (self.system, self.times, self.solver))

    def track_counter(self, key: str, counter: np.ndarray) -> None:
        """Count the solves of compiled code that adds to ``counter`` (array (1,) int64), from
        now on. Compiled Ops of equal integrators (same system, times, tolerances) share one
        counter in a process, so two such integrators used at the same time count each
        other's compiled solves too."""
        if key not in self._counters:
            self._counters[key] = (counter, int(counter[0]))

    @property
    def compiled_solves(self) -> np.ndarray:
        return np.array([sum(int(c[0]) - base for c, base in self._counters.values())], dtype=np.int64)

    @property
    def n_solves(self) -> int:
        return self._python_solves + int(self.compiled_solves[0])

    def solve(self, theta, x0) -> np.ndarray:
        """States at ``times``: array (N, S). Raises :class:`ODESolveError` on failure."""
        theta, x0 = self._check(theta, x0)
        key = theta.tobytes() + x0.tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1].copy()
        out = self._run(False, theta, x0)
        self._last = (key, out.copy())
        return out

    def solve_sensitivities(self, theta, x0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """States and forward sensitivities at ``times``, from one solve.

        Returns
        -------
        x : (N, S)
        dx_dtheta : (N, S, P)   d x_i(t_n) / d theta_k
        dx_dx0 : (N, S, S)      d x_i(t_n) / d x0_j
        """
        theta, x0 = self._check(theta, x0)
        S, P = self.system.n_states, self.system.n_parameters
        y0 = np.zeros(self._sizes[True])
        y0[:S] = x0
        for j in range(S):  # d x(t0) / d x0_j = e_j
            y0[S + (P + j) * S + j] = 1.0
        out = self._run(True, theta, y0)
        N = out.shape[0]
        sens = out[:, S:].reshape(N, P + S, S).transpose(0, 2, 1)
        return out[:, :S], sens[:, :, :P], sens[:, :, P:]

    def _check(self, theta, x0):
        S, P = self.system.n_states, self.system.n_parameters
        theta = np.asarray(theta, dtype=float).reshape(-1)
        x0 = np.asarray(x0, dtype=float).reshape(-1)
        if theta.shape != (P,):
            raise DataError(f"theta must have {P} values {list(self.system.parameters)}, got {theta.shape[0]}")
        if x0.shape != (S,):
            raise DataError(f"x0 must have {S} values {list(self.system.states)}, got {x0.shape[0]}")
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(x0))):
            raise ODESolveError(f"non-finite theta {theta} or x0 {x0}")
        return theta, x0

    def _run(self, aug: bool, theta, y0) -> np.ndarray:
        self._python_solves += 1
        engine = self._engines.get(aug)
        if engine is None:
            engine = self._engines[aug] = self.solver.engine(self.system, self._sizes[aug], aug)
        out = engine.solve(self.times, theta, y0, self.breakpoints)
        if not np.all(np.isfinite(out)):
            raise ODESolveError("the ODE solution became non-finite")
        return out

    def __repr__(self) -> str:
        return f"Integrator({self.system.name}, {self.times.size} times, {self.solver})"

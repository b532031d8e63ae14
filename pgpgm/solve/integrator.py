"""The :class:`Integrator`: one system, fixed output times, one solver; and the default solver.

The integrator does the solves, counts them and returns states and, when asked, forward
sensitivities with respect to q = (theta, x0), obtained by integrating the augmented system
``[x, dx/dq_1, ..., dx/dq_K]`` (see :mod:`pgpgm.ode.functions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..checks import check_times
from ..errors import DataError, ODESolveError
from . import sundials
from .base import Engine, Solver
from .cvode import CVODE
from .lsoda import LSODA
from .sksundae import SksundaeCVODE

if TYPE_CHECKING:
    from ..ode.system import ODESystem

#: Every backend, fastest first.
SOLVERS: tuple[type[Solver], ...] = (CVODE, SksundaeCVODE, LSODA)


def available_solvers() -> list[type[Solver]]:
    """The solver classes usable on this machine, fastest first."""
    return [cls for cls in SOLVERS if cls.available()]


def default_solver() -> Solver:
    """The fastest available solver with default tolerances (:class:`CVODE` where SUNDIALS loads;
    otherwise a :class:`~pgpgm.errors.BackendWarning`, once per process, names the fallback and why)."""
    solver = available_solvers()[0]()
    sundials.warn_fallback(solver.name)  # nothing when CVODE is usable
    return solver


class Integrator:
    """Solve one system at fixed output times with one solver; x0 is the state at ``times[0]``.

    Parameters
    ----------
    system : ODESystem
    times : array (N,), strictly increasing output times; the solve starts at ``times[0]``
    solver : Solver (default :func:`pgpgm.default_solver`)
    breakpoints : array (B,), optional
        More times at which the right-hand side switches, for the parameter values these solves
        use (a switch at a parameter's value, ``t < tau``, which the system cannot place itself);
        those outside the open span are ignored.

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

    def __init__(self, system: ODESystem, times, solver: Solver | None = None, breakpoints=()):
        self.system = system
        self.times = check_times(times)
        extra = np.asarray(breakpoints, float).reshape(-1)
        extra = extra[(extra > self.times[0]) & (extra < self.times[-1])]
        self.breakpoints = np.union1d(system.breakpoints(self.times[0], self.times[-1]), extra)
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
        return (Integrator, (self.system, self.times, self.solver, self.breakpoints))

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

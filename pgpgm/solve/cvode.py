"""SUNDIALS CVODE with compiled callbacks: no Python between the solver and the model.

CVODE (BDF, dense Newton) is driven through ctypes (:mod:`pgpgm.solve.sundials`); the
right-hand side and its Jacobian are numba C callbacks (:mod:`pgpgm.ode.codegen`) and the
loop over output times is a numba function. Uses the SUNDIALS 7 libraries of the
``scikit-sundae`` wheel or of a conda ``sundials`` package.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import ODESolveError
from . import sundials
from .base import Solver

if TYPE_CHECKING:
    from ..ode.system import ODESystem


@dataclass(frozen=True)
class CVODE(Solver):
    """SUNDIALS CVODE, BDF with a dense Newton solver and compiled callbacks (the default)."""

    name: ClassVar[str] = "cvode"

    @classmethod
    def available(cls) -> bool:
        return sundials.library() is not None

    def engine(self, system: ODESystem, size: int, augmented: bool) -> CompiledCvodeEngine:
        return CompiledCvodeEngine(system, size, augmented, self)


class CompiledCvodeEngine:
    """CVODE memory for one system and one state size; callbacks compiled by numba."""

    def __init__(self, system: ODESystem, n: int, aug: bool, solver: CVODE):
        lib = self._lib = sundials.library()
        cb = system.compiled.cvode
        self._ctx = ctypes.c_void_p()
        if lib.SUNContext_Create(0, ctypes.byref(self._ctx)) != 0:
            raise ODESolveError("could not create a SUNDIALS context")
        lib.SUNContext_ClearErrHandlers(self._ctx)  # errors come back as flags; we raise
        self._y = lib.N_VNew_Serial(n, self._ctx)
        self._yv = np.ctypeslib.as_array(lib.N_VGetArrayPointer(self._y), (n,))
        self._p = np.zeros(max(system.n_parameters, 1))
        self._mem = ctypes.c_void_p(lib.CVodeCreate(sundials.CV_BDF, self._ctx))
        self._A = lib.SUNDenseMatrix(n, n, self._ctx)
        self._LS = lib.SUNLinSol_Dense(self._y, self._A, self._ctx)
        rhs, jac = (cb.aug_rhs, cb.aug_jac) if aug else (cb.rhs, cb.jac)
        flags = [
            lib.CVodeInit(self._mem, rhs, 0.0, self._y),
            lib.CVodeSStolerances(self._mem, solver.rtol, solver.atol),
            lib.CVodeSetUserData(self._mem, self._p.ctypes.data),
            lib.CVodeSetLinearSolver(self._mem, self._LS, self._A),
            lib.CVodeSetJacFn(self._mem, jac),
            lib.CVodeSetMaxNumSteps(self._mem, solver.max_steps),
            lib.CVodeSetMaxHnilWarns(self._mem, -1),  # no "t + h = t" chatter on stderr
        ]
        if any(flags):
            raise ODESolveError(f"CVODE set-up failed with flags {flags}")
        self._tret = np.zeros(1)
        self._keep = cb  # the callbacks must outlive the solver

    def solve(self, times, theta, y0) -> np.ndarray:
        lib = self._lib
        self._p[: theta.size] = theta
        self._yv[:] = y0
        lib.CVodeReInit(self._mem, times[0], self._y)
        lib.CVodeSetStopTime(self._mem, times[-1])
        out = np.empty((times.size, y0.size))
        out[0] = y0
        flag, i = lib.drive(self._mem.value, self._y, times, out, self._tret)
        if flag < 0:
            name = lib.CVodeGetReturnFlagName(flag).decode()
            raise ODESolveError(
                f"CVODE failed with {name} at t = {self._tret[0]:.6g} "
                f"(target t = {times[i]:.6g}, theta = {theta.tolist()})"
            )
        return out

    def __del__(self):
        lib = getattr(self, "_lib", None)
        if lib is None or not getattr(self, "_ctx", None):
            return
        lib.CVodeFree(ctypes.byref(self._mem))
        lib.SUNLinSolFree(self._LS)
        lib.SUNMatDestroy(self._A)
        lib.N_VDestroy(self._y)
        lib.SUNContext_Free(ctypes.byref(self._ctx))

"""SUNDIALS CVODE with compiled callbacks: no Python between the solver and the model.

CVODE (BDF, dense Newton) is driven through ctypes (:mod:`pgpgm.solve.sundials`); the
right-hand side and its Jacobian are numba C callbacks (:mod:`pgpgm.ode.codegen`). One
numba function, :func:`cvode_kernel`, does a whole solve - create the CVODE memory, set
the parameters, tolerances and callbacks, step through the output times, free the
memory - so it can be called from Python (:class:`CompiledCvodeEngine`) and from other
compiled code alike (the numba implementation of :class:`~pgpgm.solve.op.ODEOp`, which
PyMC's NUTS and nutpie call with no Python in between). Each call owns its memory, so
concurrent calls (nutpie's chains run in threads) are safe; creating it costs a few
microseconds, against 0.1-1 ms for a solve. Uses the SUNDIALS 7 libraries of the
``scikit-sundae`` wheel or of a conda ``sundials`` package.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import ODESolveError
from . import sundials
from .base import Solver

if TYPE_CHECKING:
    from ..ode.system import ODESystem

#: Flags of :func:`cvode_kernel` besides CVODE's own (which are > -100).
SETUP_FAILED = -1001  # a SUNDIALS object could not be created or configured
NON_FINITE = -1002  # a state or sensitivity became non-finite

_FLAG_NAMES = {SETUP_FAILED: "SETUP_FAILED (SUNDIALS set-up)", NON_FINITE: "NON_FINITE (state became NaN/inf)"}


@dataclass(frozen=True)
class CVODE(Solver):
    """SUNDIALS CVODE, BDF with a dense Newton solver and compiled callbacks (the default)."""

    name: ClassVar[str] = "cvode"

    @classmethod
    def available(cls) -> bool:
        return sundials.library() is not None

    def engine(self, system: ODESystem, size: int, augmented: bool) -> CompiledCvodeEngine:
        return CompiledCvodeEngine.for_system(system, size, augmented, self)


@dataclass(frozen=True)
class CompiledCvodeEngine:
    """The compiled CVODE solve of one system (plain or augmented with sensitivities).

    Attributes
    ----------
    rhs, jac : addresses of the C callbacks (CVRhsFn, CVLsJacFn) of the solved system
    n : states of the solved system (S, or S (1 + P + S) when augmented)
    solver : the tolerances and step budget
    callbacks : the object owning the callbacks (kept alive with the engine)
    """

    rhs: int
    jac: int
    n: int
    solver: CVODE
    callbacks: object

    @classmethod
    def for_system(cls, system: ODESystem, n: int, aug: bool, solver: CVODE) -> CompiledCvodeEngine:
        """The engine of ``system`` (``aug``: the sensitivity system with ``n`` states)."""
        cb = system.compiled.cvode
        if cb is None:
            raise ODESolveError("the compiled CVODE callbacks are unavailable (SUNDIALS did not load)")
        return cls(cb.aug_rhs if aug else cb.rhs, cb.aug_jac if aug else cb.jac, int(n), solver, cb)

    def solve(self, times, theta, y0) -> np.ndarray:
        """States (N, n) at ``times`` (N,) from ``y0`` (n,) at ``times[0]``; raises ODESolveError."""
        out = np.empty((times.size, self.n))
        s = self.solver
        flag, i, t = cvode_kernel()(self.rhs, self.jac, s.rtol, s.atol, s.max_steps, times, theta, y0, out)
        if flag < 0:
            raise ODESolveError(f"CVODE failed with {flag_name(flag)} at t = {t:.6g} "
                                f"(target t = {times[i]:.6g}, theta = {theta.tolist()})")
        return out


def flag_name(flag: int) -> str:
    """The name of a :func:`cvode_kernel` flag (CVODE's own, e.g. ``CV_TOO_MUCH_WORK``, or pgpgm's)."""
    if flag in _FLAG_NAMES:
        return _FLAG_NAMES[flag]
    return sundials.library().CVodeGetReturnFlagName(flag).decode()


def _address_prototypes(lib) -> SimpleNamespace:
    """The SUNDIALS functions with every pointer typed as a 64-bit integer (an address),
    so compiled code passes SUNDIALS objects and numpy buffers as plain integers. Same
    calling convention as pointers on x86-64 and AArch64 (see :mod:`.sundials`)."""
    a, i32, f64, none = ctypes.c_int64, ctypes.c_int, ctypes.c_double, None
    table = {
        "SUNContext_Create": (i32, i32, a),
        "SUNContext_ClearErrHandlers": (i32, a),
        "SUNContext_Free": (i32, a),
        "N_VNew_Serial": (a, a, a),
        "N_VGetArrayPointer": (ctypes.POINTER(f64), a),
        "N_VDestroy": (none, a),
        "SUNDenseMatrix": (a, a, a, a),
        "SUNMatDestroy": (none, a),
        "SUNLinSol_Dense": (a, a, a, a),
        "SUNLinSolFree": (i32, a),
        "CVodeCreate": (a, i32, a),
        "CVodeInit": (i32, a, a, f64, a),
        "CVodeSStolerances": (i32, a, f64, f64),
        "CVodeSetUserData": (i32, a, a),
        "CVodeSetLinearSolver": (i32, a, a, a),
        "CVodeSetJacFn": (i32, a, a),
        "CVodeSetMaxNumSteps": (i32, a, ctypes.c_long),
        "CVodeSetMaxHnilWarns": (i32, a, i32),
        "CVodeSetStopTime": (i32, a, f64),
        "CVodeSetMinStep": (i32, a, f64),
        "CVode": (i32, a, f64, a, a, i32),
        "CVodeFree": (none, a),
    }
    protos = {}
    for name, (res, *args) in table.items():
        address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        protos[name] = ctypes.CFUNCTYPE(res, *args)(address)
    return SimpleNamespace(**protos)


@cache
def cvode_kernel():
    """The compiled solve, built once per process (it embeds the library's addresses).

    ``cvode_kernel()(rhs, jac, rtol, atol, max_steps, times, theta, y0, out)`` integrates
    the system whose callbacks are at addresses ``rhs``, ``jac`` from ``y0`` (n,) at
    ``times[0]`` with parameters ``theta`` (P,), writes the states at ``times`` (N,) into
    ``out`` (N, n) and returns ``(flag, index, t)``: flag >= 0 on success, else CVODE's
    negative flag, :data:`SETUP_FAILED` or :data:`NON_FINITE`; ``index`` the output time
    being computed when it stopped; ``t`` the time reached. Callable from numba code.
    """
    import numba

    lib = sundials.library()
    if lib is None:
        raise ODESolveError("SUNDIALS CVODE is not available here; use pgpgm.default_solver()")
    f = _address_prototypes(lib)
    ctx_create, ctx_clear, ctx_free = f.SUNContext_Create, f.SUNContext_ClearErrHandlers, f.SUNContext_Free
    nv_new, nv_data, nv_free = f.N_VNew_Serial, f.N_VGetArrayPointer, f.N_VDestroy
    mat_new, mat_free, ls_new, ls_free = f.SUNDenseMatrix, f.SUNMatDestroy, f.SUNLinSol_Dense, f.SUNLinSolFree
    cv_create, cv_init, cv_tol, cv_data = f.CVodeCreate, f.CVodeInit, f.CVodeSStolerances, f.CVodeSetUserData
    cv_ls, cv_jac, cv_steps, cv_hnil = f.CVodeSetLinearSolver, f.CVodeSetJacFn, f.CVodeSetMaxNumSteps, f.CVodeSetMaxHnilWarns
    cv_stop, cv_step, cv_free, cv_hmin = f.CVodeSetStopTime, f.CVode, f.CVodeFree, f.CVodeSetMinStep
    bdf, normal = sundials.CV_BDF, sundials.CV_NORMAL

    @numba.njit(cache=False)
    def solve(rhs, jac, rtol, atol, max_steps, times, theta, y0, out):
        n, N, P = y0.shape[0], times.shape[0], theta.shape[0]
        # scratch: the parameters (CVODE's user data, read by the callbacks) and, last, the
        # time reached; it is read at the end, which keeps it alive while CVODE uses it.
        scratch = np.empty(P + 1)
        scratch[P] = times[0]
        for k in range(P):
            scratch[k] = theta[k]
        handles = np.zeros(2, np.int64)  # SUNContext, CVODE memory (freed through their addresses)
        if ctx_create(0, handles.ctypes.data) != 0:
            return SETUP_FAILED, 0, times[0]
        ctx = handles[0]
        ctx_clear(ctx)  # errors come back as flags, not as text on stderr
        y = nv_new(n, ctx)
        mem = cv_create(bdf, ctx)
        A = mat_new(n, n, ctx)
        LS = ls_new(y, A, ctx) if (y != 0 and A != 0) else 0
        handles[1] = mem
        flag = SETUP_FAILED
        index = 0
        if y != 0 and mem != 0 and A != 0 and LS != 0:
            yv = numba.carray(nv_data(y), (n,))
            for j in range(n):
                yv[j] = y0[j]
                out[0, j] = y0[j]
            # a step too small to move t (t + h = t) is a failure, not a crawl that ends in wrong
            # numbers: e.g. a state creeping towards the edge of the right-hand side's domain
            hmin = 16.0 * 2.220446049250313e-16 * max(abs(times[0]), abs(times[N - 1]))
            bad = (cv_init(mem, rhs, times[0], y) | cv_tol(mem, rtol, atol) | cv_data(mem, scratch.ctypes.data)
                   | cv_ls(mem, LS, A) | cv_jac(mem, jac) | cv_steps(mem, max_steps) | cv_hnil(mem, -1)
                   | cv_stop(mem, times[N - 1]) | cv_hmin(mem, hmin))
            flag = SETUP_FAILED if bad != 0 else 0
            index = 1
            while flag >= 0 and index < N:
                flag = cv_step(mem, times[index], y, scratch.ctypes.data + 8 * P, normal)
                if flag >= 0:
                    for j in range(n):
                        if not np.isfinite(yv[j]):
                            flag = NON_FINITE
                        out[index, j] = yv[j]
                    if flag >= 0:
                        index += 1
            index = min(index, N - 1)
        t_reached = scratch[P]
        if mem != 0:
            cv_free(handles.ctypes.data + 8)
        if LS != 0:
            ls_free(LS)
        if A != 0:
            mat_free(A)
        if y != 0:
            nv_free(y)
        ctx_free(handles.ctypes.data)
        return flag, index, t_reached

    return solve

"""SUNDIALS CVODE with compiled callbacks: no Python between the solver and the model.

CVODE (BDF, Newton with a dense matrix, or a band one for the sensitivity system) is driven
through ctypes (:mod:`pgpgm.solve.sundials`); the right-hand side and its Jacobian are numba C callbacks (:func:`cvode_callbacks`, built on the
model's kernels of :mod:`pgpgm.ode.functions` and cached on disk beside them). One
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

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

import numba
import numpy as np

from ..codegen import cache as kernel_cache
from ..errors import ODESolveError
from . import native, sundials
from . import native as nat
from .base import Solver

if TYPE_CHECKING:
    from ..ode.functions import ModelKernels
    from ..ode.system import ODESystem

#: Flags of :func:`cvode_kernel` besides CVODE's own (which are > -100).
SETUP_FAILED = -1001  # a SUNDIALS object could not be created or configured
NON_FINITE = -1002  # a state or sensitivity became non-finite

_BDF, _NORMAL = sundials.CV_BDF, sundials.CV_NORMAL
_EPS = 2.220446049250313e-16
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


def aug_half_band(n_states: int) -> int:
    """The half-bandwidth of the sensitivity system's Newton matrix (S (1 + K) states): its Jacobian is
    block diagonal, K + 1 copies of the S x S state Jacobian (the simultaneous corrector's approximation,
    which drops the sensitivities' coupling to the states), so S - 1."""
    return n_states - 1


@dataclass(frozen=True)
class CompiledCvodeEngine:
    """The compiled CVODE solve of one system (plain or augmented with sensitivities).

    Attributes
    ----------
    rhs, jac : addresses of the C callbacks (CVRhsFn, CVLsJacFn) of the solved system
    n : states of the solved system (S, or S (1 + P + S) when augmented)
    solver : the tolerances and step budget
    callbacks : the object owning the callbacks (kept alive with the engine)
    half_band : -1 for a dense Newton matrix (the plain system), S - 1 for the augmented system's
        block-diagonal band (:func:`cvode_kernel`)
    """

    rhs: int
    jac: int
    n: int
    solver: CVODE
    callbacks: object
    half_band: int = -1

    @classmethod
    def for_system(cls, system: ODESystem, n: int, aug: bool, solver: CVODE) -> CompiledCvodeEngine:
        """The engine of ``system`` (``aug``: the sensitivity system with ``n`` states)."""
        cb = cvode_callbacks(system.compiled)
        if cb is None:
            raise ODESolveError("the compiled CVODE callbacks are unavailable (SUNDIALS did not load)")
        return cls(cb.aug_rhs if aug else cb.rhs, cb.aug_jac if aug else cb.jac, int(n), solver, cb,
                   aug_half_band(system.n_states) if aug else -1)

    def solve(self, times, theta, y0, breaks=None) -> np.ndarray:
        """States (N, n) at ``times`` (N,) from ``y0`` (n,) at ``times[0]``, stopping and restarting
        at the ``breaks`` (B,) (sorted, strictly inside the span); raises ODESolveError."""
        out = np.empty((times.size, self.n))
        s = self.solver
        kernel = cvode_kernel()
        if breaks is None or breaks.size == 0:  # one array fewer to unbox: a smooth model's solve as before
            flag, i, t = _solve_smooth(self.rhs, self.jac, s.rtol, s.atol, s.max_steps, times, theta, y0, out,
                                       self.half_band)
        else:
            flag, i, t = kernel(self.rhs, self.jac, s.rtol, s.atol, s.max_steps, times, theta, y0, out, breaks,
                                self.half_band)
        if flag < 0:
            hint = ""
            if flag == sundials.CV_TOO_MUCH_WORK:
                hint = (f"; it took more than max_steps={s.max_steps} internal steps between two output times: raise "
                        f"the solver's max_steps (e.g. pgpgm.CVODE(max_steps={max(10 * s.max_steps, 20_000)})), or the "
                        "model is stiff or blows up at these values")
            raise ODESolveError(f"CVODE failed with {flag_name(flag)} at t = {t:.6g} "
                                f"(target t = {times[i]:.6g}, theta = {theta.tolist()}){hint}")
        return out


def flag_name(flag: int) -> str:
    """The name of a :func:`cvode_kernel` flag (CVODE's own, e.g. ``CV_TOO_MUCH_WORK``, or pgpgm's)."""
    if flag in _FLAG_NAMES:
        return _FLAG_NAMES[flag]
    return sundials.library().CVodeGetReturnFlagName(flag).decode()


def cvode_kernel():
    """The compiled solve (cached on disk by numba; SUNDIALS is linked into the process first).

    ``cvode_kernel()(rhs, jac, rtol, atol, max_steps, times, theta, y0, out, breaks, half_band)``
    integrates the system whose callbacks are at addresses ``rhs``, ``jac`` from ``y0`` (n,)
    at ``times[0]`` with parameters ``theta`` (P,), writes the states at ``times`` (N,) into
    ``out`` (N, n) and returns ``(flag, index, t)``: flag >= 0 on success, else CVODE's
    negative flag, :data:`SETUP_FAILED` or :data:`NON_FINITE`; ``index`` the output time
    being computed when it stopped; ``t`` the time reached. Callable from numba code.

    ``breaks`` (B,), sorted and strictly inside (times[0], times[-1]), are the times at which
    the right-hand side switches (:meth:`pgpgm.ode.system.ODESystem.breakpoints`): CVODE
    stops at the float just below each (a stop time: no step, and so no right-hand-side
    evaluation, reaches the break, where ``t < b`` would already read the next side; an
    output time equal to a break gets the state there) and is re-initialised at the float
    just above it (so that ``t <= b`` reads the new side) from the state reached, forgetting
    its step history. Forward sensitivities, integrated in the same (augmented) state vector,
    restart with it: a switch at a fixed time makes them continuous. With no breaks the
    solve is the one without this feature, call for call.

    ``half_band`` < 0: the Newton matrix is dense (n x n, the plain system's ``jac``); >= 0: a band
    matrix of that lower and upper half-bandwidth (the sensitivity system's ``aug_jac`` writes its
    block diagonal, S - 1 wide: :func:`aug_half_band`), factored in O(n S^2) rather than O(n^3).
    """
    if not native.link_sundials():
        raise ODESolveError("SUNDIALS CVODE is not available here; use pgpgm.default_solver()")
    return _solve


@numba.njit(cache=True)
def _solve_smooth(rhs, jac, rtol, atol, max_steps, times, theta, y0, out, half_band):
    """:func:`_solve` without breaks (SUNDIALS must be linked: call :func:`cvode_kernel` first)."""
    return _solve(rhs, jac, rtol, atol, max_steps, times, theta, y0, out, np.empty(0), half_band)


@numba.njit(cache=True)
def _solve(rhs, jac, rtol, atol, max_steps, times, theta, y0, out, breaks, half_band):
    """See :func:`cvode_kernel` (SUNDIALS must be linked: call that first)."""
    n, N, P = y0.shape[0], times.shape[0], theta.shape[0]
    # scratch: the parameters (CVODE's user data, read by the callbacks) and, last, the
    # time reached; it is read at the end, which keeps it alive while CVODE uses it.
    scratch = np.empty(P + 1)
    scratch[P] = times[0]
    for k in range(P):
        scratch[k] = theta[k]
    handles = np.zeros(2, np.int64)  # SUNContext, CVODE memory (freed through their addresses)
    if nat.SUNContext_Create(0, handles.ctypes.data) != 0:
        return SETUP_FAILED, 0, times[0]
    ctx = handles[0]
    nat.SUNContext_ClearErrHandlers(ctx)  # errors come back as flags, not as text on stderr
    y = nat.N_VNew_Serial(n, ctx)
    mem = nat.CVodeCreate(_BDF, ctx)
    if half_band < 0:
        A = nat.SUNDenseMatrix(n, n, ctx)
        LS = nat.SUNLinSol_Dense(y, A, ctx) if (y != 0 and A != 0) else 0
    else:
        A = nat.SUNBandMatrix(n, half_band, half_band, ctx)
        LS = nat.SUNLinSol_Band(y, A, ctx) if (y != 0 and A != 0) else 0
    handles[1] = mem
    flag = SETUP_FAILED
    index = 0
    if y != 0 and mem != 0 and A != 0 and LS != 0:
        yv = numba.carray(nat.N_VGetArrayPointer(y), (n,))
        for j in range(n):
            yv[j] = y0[j]
            out[0, j] = y0[j]
        # a step too small to move t (t + h = t) is a failure, not a crawl that ends in wrong
        # numbers: e.g. a state creeping towards the edge of the right-hand side's domain
        hmin = 16.0 * _EPS * max(abs(times[0]), abs(times[N - 1]))
        B = breaks.shape[0]
        # no step reaches a break (the right-hand side is evaluated at a step's end too: at the break
        # itself it would read the next piece's side, e.g. where(t < 13, ...) off at 13) or passes the last time
        stop = np.nextafter(breaks[0], -np.inf) if B > 0 else times[N - 1]
        bad = (nat.CVodeInit(mem, rhs, times[0], y) | nat.CVodeSStolerances(mem, rtol, atol) | nat.CVodeSetUserData(mem, scratch.ctypes.data)
               | nat.CVodeSetLinearSolver(mem, LS, A) | nat.CVodeSetJacFn(mem, jac) | nat.CVodeSetMaxNumSteps(mem, max_steps) | nat.CVodeSetMaxHnilWarns(mem, -1)
               | nat.CVodeSetStopTime(mem, stop) | nat.CVodeSetMinStep(mem, hmin))
        flag = SETUP_FAILED if bad != 0 else 0
        index = 1
        b = 0  # the next break
        while flag >= 0 and index < N:
            at_break = b < B and times[index] > breaks[b]
            target = np.nextafter(breaks[b], -np.inf) if at_break else times[index]  # (beyond the stop time
            # for an output time equal to a break: CVODE returns at the stop time, the state there)
            t_now = scratch[P]
            reach = min(target, stop)  # CVODE does not pass its stop time
            if reach - t_now <= max(hmin, 4.0 * _EPS * max(abs(t_now), abs(reach))):
                pass  # CVODE refuses a step this short; the state moves by rounding only
            elif t_now < target:  # (an output time equal to a break was reached already)
                flag = nat.CVode(mem, target, y, scratch.ctypes.data + 8 * P, _NORMAL)
            if flag >= 0:
                for j in range(n):
                    if not np.isfinite(yv[j]):
                        flag = NON_FINITE
            if flag < 0:
                break
            if at_break:  # restart just after the break, with the next break as stop time
                scratch[P] = np.nextafter(breaks[b], np.inf)
                b += 1
                stop = np.nextafter(breaks[b], -np.inf) if b < B else times[N - 1]
                flag = nat.CVodeReInit(mem, scratch[P], y)
                if flag >= 0:
                    flag = nat.CVodeSetStopTime(mem, stop)
            else:
                for j in range(n):
                    out[index, j] = yv[j]
                index += 1
        index = min(index, N - 1)
    t_reached = scratch[P]
    if mem != 0:
        nat.CVodeFree(handles.ctypes.data + 8)
    if LS != 0:
        nat.SUNLinSolFree(LS)
    if A != 0:
        nat.SUNMatDestroy(A)
    if y != 0:
        nat.N_VDestroy(y)
    nat.SUNContext_Free(handles.ctypes.data)
    return flag, index, t_reached


@dataclass(frozen=True)
class CvodeCallbacks:
    """Addresses of C callbacks (CVRhsFn and CVLsJacFn) for plain and augmented systems; each is
    also the link-time symbol ``pgpgm_<key>_<field>`` (:func:`pgpgm.solve.native.symbol_address`),
    ``key`` that of the model's kernels (:attr:`pgpgm.ode.functions.ModelKernels.key`)."""

    rhs: int
    jac: int
    aug_rhs: int
    aug_jac: int
    keepalive: tuple


# The C callbacks of one model, generated as a module that imports the model's kernels by name.
# An exception inside a C callback could not reach CVODE (numba would only print it and return
# garbage): the callbacks check their output and return CVODE's recoverable error flag (1) for a
# non-finite right-hand side or Jacobian, so a failing model makes the solve fail.
_CALLBACKS = '''"""CVODE's C callbacks of one ODE system, generated by pgpgm.solve.cvode (do not edit)."""
import numba
import numpy as np
from numba import types

from pgpgm.solve import native as _nat
from {module} import aug_rhs, jac_x, rhs

S, P = {S}, {P}
PP = max(P, 1)
_JIT = dict(cache=True, error_model="numpy")

CVODE = _nat.link_sundials()
if CVODE:
    _dp = types.CPointer(types.float64)
    _RHS_SIG = types.int32(types.float64, types.int64, types.int64, _dp)
    _JAC_SIG = types.int32(types.float64, types.int64, types.int64, types.int64, _dp, types.int64, types.int64,
                           types.int64)

    @numba.cfunc(_RHS_SIG, **_JIT)
    def cvode_rhs(t, y_, ydot_, p_):
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (S,))
        ydot = numba.carray(_nat.N_VGetArrayPointer(ydot_), (S,))
        rhs(t, y, numba.carray(p_, (PP,)), ydot)
        for i in range(S):
            if not np.isfinite(ydot[i]):
                return 1  # recoverable error: CVODE retries with a smaller step
        return 0

    @numba.cfunc(_RHS_SIG, **_JIT)
    def cvode_aug_rhs(t, y_, ydot_, p_):
        n = _nat.N_VGetLength(y_)  # S (1 + P + F): F <= S initial values' sensitivities
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (n,))
        ydot = numba.carray(_nat.N_VGetArrayPointer(ydot_), (n,))
        aug_rhs(t, y, numba.carray(p_, (PP,)), ydot)
        for i in range(n):
            if not np.isfinite(ydot[i]):
                return 1
        return 0

    @numba.cfunc(_JAC_SIG, **_JIT)
    def cvode_jac(t, y_, fy_, m_, p_, t1, t2, t3):
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (S,))
        m = numba.carray(_nat.SUNDenseMatrix_Data(m_), (S, S))
        jx_ = np.zeros((S, S))
        jac_x(t, y, numba.carray(p_, (PP,)), jx_)
        for i in range(S):
            for j in range(S):
                if not np.isfinite(jx_[i, j]):
                    return 1  # recoverable: CVODE retries with a smaller step, then gives up with a flag
                m[j, i] = jx_[i, j]
        return 0

    @numba.cfunc(_JAC_SIG, **_JIT)
    def cvode_aug_jac(t, y_, fy_, m_, p_, t1, t2, t3):
        # a band matrix of half-bandwidth S - 1 (zeroed by CVODE): entry (r, c) of column c lies at
        # data[c * ldim + smu + r - c]; n / S copies of the state Jacobian on the block diagonal
        n = _nat.N_VGetLength(y_)
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (S,))
        ldim = _nat.SUNBandMatrix_LDim(m_)
        smu = _nat.SUNBandMatrix_StoredUpperBandwidth(m_)
        data = numba.carray(_nat.SUNBandMatrix_Data(m_), (n * ldim,))
        jx_ = np.zeros((S, S))
        jac_x(t, y, numba.carray(p_, (PP,)), jx_)
        for i in range(S):
            for j in range(S):
                if not np.isfinite(jx_[i, j]):
                    return 1
        for blk in range(n // S):
            base = blk * S
            for j in range(S):
                col = (base + j) * ldim + smu
                for i in range(S):
                    data[col + i - j] = jx_[i, j]
        return 0
'''


def callbacks_source(kernels: ModelKernels) -> str:
    """The Python source of the module of CVODE callbacks on the model's ``kernels``."""
    return _CALLBACKS.format(module=kernels.module, S=kernels.n_states, P=kernels.n_parameters)


@cache
def cvode_callbacks(kernels: ModelKernels) -> CvodeCallbacks | None:
    """The C callbacks of the model whose kernels are ``kernels`` (compiled once, then loaded from
    the disk cache, :mod:`pgpgm.codegen.cache`), registered as the link-time symbols
    ``pgpgm_<kernels.key>_<name>`` for compiled code cached on disk (the ODE Op); None when SUNDIALS
    cannot be loaded."""
    source = callbacks_source(kernels)
    mod = kernel_cache.load_module(source, kernel_cache.source_key(source))
    if not mod.CVODE:
        return None
    cbs = {"rhs": mod.cvode_rhs, "jac": mod.cvode_jac, "aug_rhs": mod.cvode_aug_rhs, "aug_jac": mod.cvode_aug_jac}
    for name, cb in cbs.items():
        native.register_symbol(f"pgpgm_{kernels.key}_{name}", cb.address)
    return CvodeCallbacks(*(cb.address for cb in cbs.values()), (mod,))

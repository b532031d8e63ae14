"""The numba implementation of :class:`~pgpgm.solve.op.ODEOp` for PyTensor's numba backend.

PyTensor compiles a graph for its NUMBA linker (PyMC's default, and nutpie's) by asking
``numba_funcify`` for a numba function per Op. For an :class:`ODEOp` whose integrator
uses :class:`~pgpgm.solve.cvode.CVODE` or :class:`~pgpgm.solve.dopri5.DOPRI5`,
:func:`numba_ode_function` returns an njit function ``(theta (P,), x0 (S,)) -> x (N, S)`` - or
``(x, dx/dtheta (N, S, P), dx/dx0 (N, S, S))`` for the sensitivity Op - that seeds the initial
state (and the identity seeds of the x0 sensitivities), and runs the whole solve
(:func:`~pgpgm.solve.cvode.cvode_kernel`, :func:`~pgpgm.solve.dopri5.dopri5_kernel`) inside
compiled code: the sampler's logp and gradient reach the solver without Python in between. The
output times, the breakpoints at which the right-hand side switches in time (the solver restarts
at each), the tolerances and step budget are compile-time constants; the callbacks and the solve
counter are reached through link-time symbols (:mod:`.native`), so the function is the same in
every process and PyTensor caches it on disk under :func:`cache_key` (with the graphs that use it).

A failed solve (a negative solver flag, a non-finite state, non-finite inputs) gives NaN
outputs with ``on_failure="nan"`` and raises :class:`~pgpgm.errors.ODESolveError` with
``on_failure="raise"``, as the Python ``perform`` does. Each solve adds one (atomically) to
the counter of its compiled function, which the integrator tracks
(:meth:`Integrator.track_counter`), so :attr:`Integrator.n_solves` counts compiled and
Python solves together.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..errors import DataError, ODESolveError
from . import native
from .cvode import CVODE, NON_FINITE, aug_half_band, cvode_callbacks, cvode_kernel
from .dopri5 import DOPRI5, STEP_TOO_SMALL, STIFF, STIFF_STEPS, TOO_MUCH_WORK, dopri5_callbacks, dopri5_kernel

if TYPE_CHECKING:
    from .op import ODEOp


@intrinsic
def _atomic_increment(typingctx, address):
    """Add 1 to the int64 at ``address`` atomically; returns the previous value."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        pointer = builder.inttoptr(args[0], i64.as_pointer())
        return builder.atomic_rmw("add", pointer, ir.Constant(i64, 1), "monotonic")

    return types.int64(address), codegen


def compiles(op: ODEOp) -> bool:
    """Whether ``op`` gets a numba implementation (its integrator uses compiled CVODE, or DOPRI5)."""
    it = op.integrator
    if isinstance(it.solver, DOPRI5) and it.solver.fallback is None:
        return True
    cvode = it.solver.fallback if isinstance(it.solver, DOPRI5) else it.solver
    return isinstance(cvode, CVODE) and cvode.available() and cvode_callbacks(it.system.compiled) is not None


#: One solve counter per compiled function (by symbol name), for the life of the process: the
#: compiled code of equal Ops is shared (numba and PyTensor reuse it), so is its counter.
_COUNTERS: dict[str, np.ndarray] = {}


def _solve_counter(symbol: str) -> np.ndarray:
    """The counter (1,) int64 registered under ``symbol``, created on first use."""
    if symbol not in _COUNTERS:
        _COUNTERS[symbol] = np.zeros(1, dtype=np.int64)
        native.register_symbol(symbol, _COUNTERS[symbol].ctypes.data)
    return _COUNTERS[symbol]


#: the version of the compiled solve's code, part of :func:`cache_key`: raise it when the code that
#: :func:`numba_ode_function` compiles changes (PyTensor would otherwise load the former code from its cache)
CODE_VERSION = 9


def cache_key(op: ODEOp) -> str:
    """What identifies the compiled function of ``op`` across processes: the system's kernel
    key (:mod:`pgpgm.codegen.cache`), the output times, the breakpoints, the solver (its name, tolerances
    and step budget), flags and initial values solved for, and :data:`CODE_VERSION`."""
    it = op.integrator
    s = it.solver
    h = hashlib.sha256(np.ascontiguousarray(it.times, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(it.breakpoints, dtype=np.float64).tobytes())
    h.update(repr((it.system.compiled.key, repr(s), float(s.rtol), float(s.atol), int(s.max_steps), op.sensitivities,
                   op.on_failure, op.x0_free, CODE_VERSION)).encode())
    return h.hexdigest()[:24]


def track_solves(op: ODEOp, integrator) -> str:
    """Count the solves of ``op``'s compiled function in ``integrator`` (an
    :class:`~pgpgm.solve.integrator.Integrator` of the same system, times and solver) from now on:
    the compiled code of equal Ops is one, shared by every graph that holds such an Op, so a
    graph compiled for one integrator can serve another. Returns the counter's symbol name."""
    key = cache_key(op)
    symbol = f"pgpgm_solves_{key}"
    integrator.track_counter(key, _solve_counter(symbol))
    return symbol


def numba_ode_function(op: ODEOp):
    """The njit implementation of ``op``, or None when its solver has none (see :func:`compiles`).

    The function reaches the system's C callbacks and the integrator's solve counter through
    link-time symbols named by :func:`cache_key` (registered here, see
    :mod:`pgpgm.solve.native`), so numba and PyTensor can cache it on disk.

    Returns
    -------
    function (theta (P,), x0 (S,)) -> x (N, S), or -> (x (N, S), dx_dtheta (N, S, P),
    dx_dx0 (N, S, S)) when ``op.sensitivities``; callable from numba code and from Python. Only the
    columns ``op.x0_free`` of dx_dx0 are solved for (the others are 0): S (1 + P + F) equations
    for F of them instead of S (1 + P + S).
    """
    if not compiles(op):
        return None
    it = op.integrator
    S, P, N = it.system.n_states, it.system.n_parameters, it.times.size
    free = np.arange(S) if op.x0_free is None else np.asarray(op.x0_free, dtype=np.int64)
    F = free.size
    K = P + F
    n = S * (1 + K) if op.sensitivities else S
    aug = "aug_" if op.sensitivities else ""
    counter_symbol = track_solves(op, it)
    rtol, atol, max_steps = it.solver.rtol, it.solver.atol, it.solver.max_steps
    times = np.ascontiguousarray(it.times, dtype=np.float64)
    breaks = np.ascontiguousarray(it.breakpoints, dtype=np.float64)
    raise_on_failure = op.on_failure == "raise"
    sensitivities = op.sensitivities
    failed = f"{it.solver.name.upper()} failed in ODEOp (flag, time reached):"
    key = it.system.compiled.key
    cvode = it.solver.fallback if isinstance(it.solver, DOPRI5) else it.solver  # None: DOPRI5 alone
    if cvode is not None:
        kernel = cvode_kernel()  # links SUNDIALS
        cvode_callbacks(it.system.compiled)  # registers the callbacks' symbols
        c_rtol, c_atol, c_steps = cvode.rtol, cvode.atol, cvode.max_steps
        c_rhs, c_jac = f"pgpgm_{key}_{aug}rhs", f"pgpgm_{key}_{aug}jac"
        half_band = aug_half_band(S) if sensitivities else -1

        @numba.njit
        def run_cvode(theta, y0, out):
            return kernel(native.symbol_address(c_rhs), native.symbol_address(c_jac), c_rtol, c_atol, c_steps,
                          times, theta, y0, out, breaks, half_band)
    if not isinstance(it.solver, DOPRI5):
        run = run_cvode
    else:
        dopri5_callbacks(it.system.compiled)  # registers the callbacks' symbols
        dp_rhs = f"pgpgm_{key}_dp_{aug}rhs"
        stiff_steps = STIFF_STEPS if it.solver.stiffness else 0

        @numba.njit
        def run_dopri5(theta, y0, out):
            return dopri5_kernel(native.symbol_address(dp_rhs), rtol, atol, max_steps, stiff_steps, times, theta, y0,
                                 out, breaks)

        if cvode is None:
            run = run_dopri5
        else:
            @numba.njit
            def run(theta, y0, out):
                flag, index, t = run_dopri5(theta, y0, out)
                if flag == TOO_MUCH_WORK or flag == STEP_TOO_SMALL or flag == STIFF:  # CVODE redoes the solve
                    return run_cvode(theta, y0, out)
                return flag, index, t

    @numba.njit
    def augmented_solve(theta, x0):
        if theta.shape[0] != P or x0.shape[0] != S:
            raise DataError("ODEOp: theta and x0 must have the system's numbers of parameters and states")
        y0 = np.zeros(n)
        for j in range(S):
            y0[j] = x0[j]
        if sensitivities:
            for f in range(F):  # d x(t0) / d x0_j = e_j for the j = free[f] solved for
                y0[S + (P + f) * S + free[f]] = 1.0
        out = np.empty((N, n))
        flag = NON_FINITE
        t_reached = times[0]
        if np.all(np.isfinite(theta)) and np.all(np.isfinite(y0)):
            _atomic_increment(native.symbol_address(counter_symbol))
            flag, _, t_reached = run(np.ascontiguousarray(theta), y0, out)
        if flag < 0:
            if raise_on_failure:
                raise ODESolveError(failed, flag, t_reached)
            out[:] = np.nan
        return out

    if not sensitivities:
        return augmented_solve

    @numba.njit
    def solve_with_sensitivities(theta, x0):
        y = augmented_solve(theta, x0)
        x = np.ascontiguousarray(y[:, :S])
        dx_dtheta = np.empty((N, S, P))
        dx_dx0 = np.zeros((N, S, S))
        for t in range(N):
            for i in range(S):
                for k in range(P):
                    dx_dtheta[t, i, k] = y[t, S + k * S + i]
                for f in range(F):
                    dx_dx0[t, i, free[f]] = y[t, S + (P + f) * S + i]
        return x, dx_dtheta, dx_dx0

    return solve_with_sensitivities

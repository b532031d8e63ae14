"""The numba implementation of :class:`~pgpgm.solve.op.ODEOp` for PyTensor's numba backend.

PyTensor compiles a graph for its NUMBA linker (PyMC's default, and nutpie's) by asking
``numba_funcify`` for a numba function per Op. For an :class:`ODEOp` whose integrator
uses :class:`~pgpgm.solve.cvode.CVODE` or :class:`~pgpgm.solve.dopri5.DOPRI5`,
:func:`numba_ode_function` returns an njit function ``(theta (P,), x0 (S,)) -> x (N, S)`` - or
``(x, dx/dtheta (N, S, P), dx/dx0 (N, S, S))`` for the sensitivity Op - that seeds the initial
state (and the identity seeds of the x0 sensitivities), and runs the whole solve
(:func:`~pgpgm.solve.cvode.cvode_kernel`, :func:`~pgpgm.solve.dopri5.dopri5_kernel`) inside
compiled code: the sampler's logp and gradient reach the solver without Python in between. The
solve itself is compiled once per system, solver and sensitivities (:func:`generic_source`: the
tolerances, step budget and sizes are constants in its text) and takes the output times and the
breakpoints at which the right-hand side switches in time (the solver restarts at each) as
arguments, so a new time grid compiles only the Op's small function that passes them; the callbacks
and the solve counter are reached through link-time symbols (:mod:`.native`), so both functions are
the same in every process and cached on disk (the Op's under :func:`cache_key`, by PyTensor, with
the graphs that use it).

A failed solve (a negative solver flag, a non-finite state, non-finite inputs) gives NaN
outputs with ``on_failure="nan"`` and raises :class:`~pgpgm.errors.ODESolveError` with
``on_failure="raise"``, as the Python ``perform`` does. Each solve adds one (atomically) to
the counter of its compiled function, which the integrator tracks
(:meth:`Integrator.track_counter`), so :attr:`Integrator.n_solves` counts compiled and
Python solves together.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
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


def _cvode_of(solver) -> CVODE | None:
    """The CVODE that ``solver`` runs: itself, a DOPRI5's fallback, or None (DOPRI5 alone)."""
    return solver.fallback if isinstance(solver, DOPRI5) else solver


def compiles(op: ODEOp) -> bool:
    """Whether ``op`` gets a numba implementation (its integrator uses compiled CVODE, or DOPRI5)."""
    it = op.integrator
    if isinstance(it.solver, DOPRI5) and it.solver.fallback is None:
        return True
    cvode = _cvode_of(it.solver)
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
#: :func:`numba_ode_function` compiles changes (PyTensor would otherwise load the former code from its cache);
#: 12: DOPRI5's loops fail a solve whose first step overflows instead of dividing by zero
CODE_VERSION = 12


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


#: the compiled solve of one system, solver and set of sensitivities, whatever the times: ``solve(theta (P,),
#: x0 (S,), times (N,), breaks (B,), counter)`` - the integration, its initial state and, with sensitivities,
#: their split - written out with that Op's constants (sizes, callback symbols, tolerances, what a failure does)
#: and compiled once, then cached on disk under a key of its text. Each Op's own function only passes its
#: times, breakpoints and solve counter, so a new time grid (new data, another subject of a study) compiles
#: a call and not a solver (a solver compiled per grid costs seconds of numba's work, 5-9 s for a system
#: of Lotka-Volterra's size).
_GENERIC_SOURCE = """
def ode_solve(theta, x0, times, breaks, counter):
    if theta.shape[0] != {P} or x0.shape[0] != {S}:
        raise DataError("ODEOp: theta and x0 must have the system's numbers of parameters and states")
    y0 = np.zeros({n})
    for j in range({S}):
        y0[j] = x0[j]
{seed}
    out = np.empty((times.shape[0], {n}))
    flag = NON_FINITE
    t_reached = times[0]
    if np.all(np.isfinite(theta)) and np.all(np.isfinite(y0)):
        atomic_increment(counter)
        theta = np.ascontiguousarray(theta)
{integrate}
    if flag < 0:
{failure}
{result}
"""

_SEED = """    for f in range({F}):  # d x(t0) / d x0_j = e_j for the j = {free}[f] solved for
        y0[{S} + ({P} + f) * {S} + {free}[f]] = 1.0"""

_DOPRI5 = """        flag, _, t_reached = dopri5_kernel(symbol_address("{dp_rhs}"), {rtol!r}, {atol!r}, {max_steps}, {stiff_steps},
                                           {n_err}, {dense}, times, theta, y0, out, breaks)"""

_CVODE = """        flag, _, t_reached = cvode_solve(symbol_address("{c_rhs}"), symbol_address("{c_jac}"), {c_rtol!r}, {c_atol!r},
                                         {c_steps}, times, theta, y0, out, breaks, {half_band})"""

_FALLBACK = """        if flag == TOO_MUCH_WORK or flag == STEP_TOO_SMALL or flag == STIFF:  # CVODE redoes the solve
    """

_SPLIT = """    N = times.shape[0]
    x = np.ascontiguousarray(out[:, :{S}])
    dx_dtheta = np.empty((N, {S}, {P}))
    dx_dx0 = np.zeros((N, {S}, {S}))
    for t in range(N):
        for i in range({S}):
            for k in range({P}):
                dx_dtheta[t, i, k] = out[t, {S} + k * {S} + i]
{split_x0}
    return x, dx_dtheta, dx_dx0"""

_SPLIT_X0 = """            for f in range({F}):
                dx_dx0[t, i, {free}[f]] = out[t, {S} + ({P} + f) * {S} + i]"""


def generic_source(op: ODEOp) -> str | None:
    """The text of ``op``'s compiled solve for any times (:data:`_GENERIC_SOURCE`), or None when its solver
    has none (:func:`compiles`)."""
    if not compiles(op):
        return None
    it = op.integrator
    S, P = it.system.n_states, it.system.n_parameters
    free = tuple(range(S)) if op.x0_free is None else tuple(int(j) for j in op.x0_free)
    F = len(free)
    n = S * (1 + P + F) if op.sensitivities else S
    aug = "aug_" if op.sensitivities else ""
    key = it.system.compiled.key
    cvode = _cvode_of(it.solver)
    sizes = dict(S=S, P=P, F=F, n=n, free=repr(free))
    if cvode is not None:
        run_cvode = _CVODE.format(c_rhs=f"pgpgm_{key}_{aug}rhs", c_jac=f"pgpgm_{key}_{aug}jac", c_rtol=float(cvode.rtol),
                                  c_atol=float(cvode.atol), c_steps=int(cvode.max_steps),
                                  half_band=aug_half_band(S) if op.sensitivities else -1)
    if not isinstance(it.solver, DOPRI5):
        integrate = run_cvode
    else:
        s = it.solver
        integrate = _DOPRI5.format(dp_rhs=f"pgpgm_{key}_dp_{aug}rhs", rtol=float(s.rtol), atol=float(s.atol),
                                   max_steps=int(s.max_steps), stiff_steps=STIFF_STEPS if s.stiffness else 0,
                                   n_err=s.error_components(S, n, op.sensitivities), dense=bool(s.dense_output))
        if cvode is not None:
            integrate += "\n" + _FALLBACK + run_cvode.replace("\n", "\n    ")
    failed = f"{it.solver.name.upper()} failed in ODEOp (flag, time reached):"
    failure = (f"        raise ODESolveError({failed!r}, flag, t_reached)" if op.on_failure == "raise"
               else "        out[:] = np.nan")
    seed, split_x0 = (_SEED.format(**sizes), _SPLIT_X0.format(**sizes)) if F else ("", "")  # loops over free x0 only
    result = _SPLIT.format(split_x0=split_x0, **sizes) if op.sensitivities else "    return out"
    text = _GENERIC_SOURCE.format(seed=seed if op.sensitivities else "", integrate=integrate, failure=failure,
                                  result=result, **sizes)
    return f"# pgpgm ODEOp solve, version {CODE_VERSION}; free = {free!r}\n" + text


@lru_cache(maxsize=None)
def _generic(text: str, cvode: bool):
    """The compiled function of :func:`generic_source`'s ``text`` in this process (loaded from the disk cache
    where an earlier process compiled it); ``cvode``: it calls CVODE (linked first)."""
    from pytensor.link.numba.cache import compile_numba_function_src

    names = {"__name__": __name__, "np": np, "DataError": DataError, "ODESolveError": ODESolveError,
             "NON_FINITE": NON_FINITE, "TOO_MUCH_WORK": TOO_MUCH_WORK, "STEP_TOO_SMALL": STEP_TOO_SMALL,
             "STIFF": STIFF, "atomic_increment": _atomic_increment, "symbol_address": native.symbol_address,
             "dopri5_kernel": dopri5_kernel}
    if cvode:
        names["cvode_solve"] = cvode_kernel()  # links SUNDIALS
    key = hashlib.sha256(text.encode()).hexdigest()
    return numba.njit(cache=True)(compile_numba_function_src(text, "ode_solve", names, cache_key=key))


def numba_ode_function(op: ODEOp):
    """The njit implementation of ``op``, or None when its solver has none (see :func:`compiles`).

    It calls the solve compiled for ``op``'s system, solver and sensitivities whatever the times
    (:func:`generic_source`, cached on disk by numba) with ``op``'s times, breakpoints and solve counter;
    the solve reaches the system's C callbacks and the counter through link-time symbols (registered
    here, see :mod:`pgpgm.solve.native`), so numba and PyTensor can cache both on disk.

    Returns
    -------
    function (theta (P,), x0 (S,)) -> x (N, S), or -> (x (N, S), dx_dtheta (N, S, P),
    dx_dx0 (N, S, S)) when ``op.sensitivities``; callable from numba code and from Python. Only the
    columns ``op.x0_free`` of dx_dx0 are solved for (the others are 0): S (1 + P + F) equations
    for F of them instead of S (1 + P + S).
    """
    text = generic_source(op)
    if text is None:
        return None
    it = op.integrator
    cvode = _cvode_of(it.solver)
    if cvode is not None:
        cvode_callbacks(it.system.compiled)  # registers the callbacks' symbols
    if isinstance(it.solver, DOPRI5):
        dopri5_callbacks(it.system.compiled)
    solve = _generic(text, cvode is not None)
    counter_symbol = track_solves(op, it)
    times = np.ascontiguousarray(it.times, dtype=np.float64)
    breaks = np.ascontiguousarray(it.breakpoints, dtype=np.float64)

    @numba.njit
    def ode_op_solve(theta, x0):
        return solve(theta, x0, times, breaks, native.symbol_address(counter_symbol))

    return ode_op_solve

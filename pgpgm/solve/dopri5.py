"""Dormand-Prince 5(4): an explicit Runge-Kutta solver for non-stiff systems, compiled by numba.

CVODE (:mod:`.cvode`, the default) is a multistep method with a Newton solver: robust on stiff
systems, but each of its steps costs ~1.2 us of its own work on a system of a dozen equations
(Lotka-Volterra with sensitivities), far more than the right-hand side. On a non-stiff system
this explicit pair (Dormand and Prince 1980, the ``RK45`` of scipy and ``Dopri5`` of diffrax:
seven stages, the last reused as the next step's first, error from the embedded 4th-order
solution, step size h (0.9 / err)^(1/5)) takes fewer steps at the same tolerances, each a few
right-hand-side calls: at the draws of a Lotka-Volterra posterior, about 2x faster than CVODE
and about 10x closer to a 1e-12 solve. On a stiff system its step
is bounded by stability, not accuracy: it crawls (55x CVODE's time on x' = -3000 (x - cos t) with
sensitivities, never reaching ``max_steps``). With ``stiffness=True`` it tests for that with Hairer
and Wanner's estimate: after each accepted step, h times the Jacobian's largest eigenvalue is about
``h |f(y1) - f(y6)| / |y1 - y6|`` (y1 the new solution, y6 the last stage's argument). On a stiff
component the steps keep it at 1.5-3 (x' = -lam (x - cos t), rtol 1e-6: a median 1.57 at lam = 100,
where the error estimate bounds the step, and 3.0 at lam = 1000, just inside the stability boundary
3.3); steps bounded by the accuracy of a smooth solution keep it far below ((h lambda)^5 ~ rtol).
After :data:`STIFF_STEPS` accepted steps above :data:`STIFF_H_LAMBDA` in one solve - about the work of
one CVODE solve - the solve ends with the flag :data:`STIFF`: at lam >= 100 above, and at none of 400
draws of each Lotka-Volterra large-noise posterior nor of 200 of FitzHugh-Nagumo's, protein
transduction's and the repressilator's (step 4's solves with sensitivities, rtol 1e-6).

The whole solve is one numba function (:func:`dopri5_kernel`) that reaches the model's
right-hand side through a C callback (plain, or augmented with forward sensitivities) by its
address, so that it can be called from Python (:class:`Dopri5Engine`) and from the compiled ODE
Op (:mod:`.numba_op`, which finds the callbacks by their link-time symbols
``pgpgm_<key>_dp_rhs`` and ``pgpgm_<key>_dp_aug_rhs``, :func:`dopri5_callbacks`).

The steps follow the error test alone; the states at output times between two steps come from the
continuous extension of the step that spans them (:func:`_dense`, order 4, from the step's seven stages at
no extra right-hand-side call), so output times cost no steps: at rtol 1e-6 with sensitivities, 1.26x
faster on Lotka-Volterra's 20 times and 1.33x on FitzHugh-Nagumo's 100, 9x on a 400-point trajectory,
and still closer to a 1e-12 solve than CVODE at the same tolerance. ``DOPRI5(dense_output=False)`` ends
a (cut) step at each output time instead.

Where the right-hand side switches at fixed times (breakpoints) the solve stops at the float
just below each, where an output time equal to the break gets its state, and restarts at the
float just above it with a new first stage, as CVODE does (:mod:`.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..codegen import cache as kernel_cache
from ..errors import DataError, ODESolveError
from . import native
from .base import Solver

if TYPE_CHECKING:
    from ..ode.system import ODESystem

#: Flags of :func:`dopri5_kernel` (0: success)
TOO_MUCH_WORK = -1  # more than max_steps steps between two output times (as CVODE's CV_TOO_MUCH_WORK)
STEP_TOO_SMALL = -3  # the step fell below rounding of t (the solution blows up, or the right-hand side fails)
STIFF = -4  # the steps are bounded by stability (DOPRI5(stiffness=True); as Hairer and Wanner's IDID = -4)
NON_FINITE = -1002  # a state or sensitivity became non-finite
#: the flags after which a :attr:`DOPRI5.fallback` redoes the solve
GIVES_UP = (TOO_MUCH_WORK, STEP_TOO_SMALL, STIFF)
#: accepted steps bounded by stability (h lambda > :data:`STIFF_H_LAMBDA`) after which
#: ``DOPRI5(stiffness=True)`` ends a solve as :data:`STIFF`: a CVODE solve with sensitivities costs about
#: 100-200 DOPRI5 steps (x' = -3000 (x - cos t) on [0, 10] with sensitivities: 0.34 ms against 18.8 ms
#: for DOPRI5's ~10000 steps), so a solve is handed over before it costs much more than CVODE's
STIFF_STEPS = 100
#: the estimate of h times the largest eigenvalue above which a step counts as bounded by stability (see
#: the module's notes)
STIFF_H_LAMBDA = 1.0
FLAG_NAMES = {TOO_MUCH_WORK: "TOO_MUCH_WORK (max_steps between two output times)",
              STEP_TOO_SMALL: "STEP_TOO_SMALL (the step size fell to rounding)",
              STIFF: f"STIFF ({STIFF_STEPS} steps bounded by stability: the system is stiff here)",
              NON_FINITE: "NON_FINITE (state became NaN/inf)"}

_EPS = 2.220446049250313e-16


@dataclass(frozen=True)
class DOPRI5(Solver):
    """Dormand-Prince 5(4), explicit, compiled by numba: for non-stiff systems (see the module's notes).

    Parameters
    ----------
    rtol, atol, max_steps : as :class:`~pgpgm.solve.base.Solver` (max_steps: most steps between two
        output times; a stiff system exhausts it)
    fallback : a :class:`~pgpgm.solve.cvode.CVODE` that redoes a solve which DOPRI5 gives up
        (``TOO_MUCH_WORK``, ``STEP_TOO_SMALL`` or ``STIFF``: a stiff stretch, or a step fallen to
        rounding), or None (the failure is the solve's). Step 4's default (:class:`pgpgm.NUTS`
        ``solver="auto"``) is ``DOPRI5(max_steps=1000, fallback=CVODE(...), stiffness=True)``: explicit
        steps where they are cheap, CVODE where the posterior reaches stiff values.
    stiffness : end a solve whose steps are bounded by stability with the flag ``STIFF`` (see the
        module's notes); False (default): crawl on to ``max_steps``
    control_sensitivities : whether a solve with sensitivities counts them in each step's error (True,
        default). False: the states only (as CVODES's default ``errconS``): the solve takes the plain solve's
        steps and its sensitivities are Runge-Kutta's derivative of that computed solution at those steps -
        step 4's gradients ~20 % cheaper, but on hard posteriors (heavy tails, a narrowing ridge) more
        divergences and sds 14-19 % off an independent reference, so not step 4's default
    dense_output : how the states at output times are found. True (default): the steps follow the error test
        alone and the states between them come from Dormand and Prince's continuous extension (order 4, the
        interpolant of scipy's ``RK45``; CVODE interpolates its own way), so 20-100 output times cost no extra
        steps; False: each output time ends a step (the 5th-order solution there, a cut step for each)
    """

    fallback: Solver | None = None
    stiffness: bool = False
    control_sensitivities: bool = True
    dense_output: bool = True
    name: ClassVar[str] = "dopri5"

    def __post_init__(self):
        super().__post_init__()
        if self.fallback is not None and self.fallback.name != "cvode":
            raise DataError(f"DOPRI5's fallback must be a pgpgm.CVODE() (or None), got {self.fallback!r}")

    def error_components(self, n_states: int, size: int, augmented: bool) -> int:
        """How many leading components of a solve of ``size`` equations count in each step's error: all, or
        the ``n_states`` states of a solve with sensitivities when :attr:`control_sensitivities` is False."""
        return int(n_states) if augmented and not self.control_sensitivities else int(size)

    def engine(self, system: ODESystem, size: int, augmented: bool) -> Dopri5Engine:
        return Dopri5Engine.for_system(system, size, augmented, self)


@dataclass(frozen=True)
class Dopri5Engine:
    """The compiled Dormand-Prince solve of one system (plain or augmented with sensitivities).

    Attributes
    ----------
    rhs : address of the right-hand side's C callback (:func:`dopri5_callbacks`)
    n : states of the solved system (S, or S (1 + P + F) when augmented)
    n_err : the leading components in each step's error norm (n, or S: :attr:`DOPRI5.control_sensitivities`)
    solver : the tolerances and step budget
    callbacks : the module owning the callbacks (kept alive with the engine)
    fallback : the fallback solver's engine of the same system, or None
    """

    rhs: int
    n: int
    n_err: int
    solver: DOPRI5
    callbacks: object
    fallback: object = None

    @classmethod
    def for_system(cls, system: ODESystem, n: int, aug: bool, solver: DOPRI5) -> Dopri5Engine:
        """The engine of ``system`` (``aug``: the sensitivity system with ``n`` states)."""
        addresses, module = dopri5_callbacks(system.compiled)
        fallback = None if solver.fallback is None else solver.fallback.engine(system, n, aug)
        return cls(addresses["aug_rhs" if aug else "rhs"], int(n), solver.error_components(system.n_states, n, aug),
                   solver, module, fallback)

    def solve(self, times, theta, y0, breaks=None) -> np.ndarray:
        """States (N, n) at ``times`` (N,) from ``y0`` (n,) at ``times[0]``, stopping and restarting
        at the ``breaks`` (B,) (sorted, strictly inside the span); raises ODESolveError."""
        out = np.empty((times.size, self.n))
        s = self.solver
        breaks = np.empty(0) if breaks is None else np.ascontiguousarray(breaks, dtype=np.float64)
        flag, i, t = dopri5_kernel(self.rhs, s.rtol, s.atol, s.max_steps, STIFF_STEPS if s.stiffness else 0,
                                   self.n_err, s.dense_output, np.ascontiguousarray(times, np.float64),
                                   np.ascontiguousarray(theta, np.float64), np.ascontiguousarray(y0, np.float64),
                                   out, breaks)
        if flag in GIVES_UP and self.fallback is not None:
            return self.fallback.solve(times, theta, y0, breaks)
        if flag < 0:
            hint = ""
            if flag == TOO_MUCH_WORK:
                hint = (f"; it took more than max_steps={s.max_steps} steps between two output times: the system "
                        "may be stiff at these values (pgpgm.CVODE() solves stiff systems), or raise max_steps")
            elif flag == STIFF:
                hint = "; pgpgm.CVODE() solves stiff systems (or DOPRI5(stiffness=False) crawls on)"
            raise ODESolveError(f"DOPRI5 failed with {FLAG_NAMES[flag]} at t = {t:.6g} (target t = {times[i]:.6g}, "
                                f"theta = {np.asarray(theta).tolist()}){hint}")
        return out


# The C callbacks of one model, generated as a module that imports the model's kernels by name: the
# right-hand side on plain pointers (no SUNDIALS vectors), non-zero for a non-finite value.
_CALLBACKS = '''"""Dormand-Prince's C callbacks of one ODE system, generated by pgpgm.solve.dopri5 (do not edit)."""
import numba
import numpy as np
from numba import types

from {module} import aug_rhs, rhs

S, P = {S}, {P}
PP = max(P, 1)
_dp = types.CPointer(types.float64)
_SIG = types.int32(types.float64, _dp, _dp, _dp, types.int64)


@numba.cfunc(_SIG, cache=True, error_model="numpy")
def dp_rhs(t, y_, ydot_, p_, n):
    ydot = numba.carray(ydot_, (S,))
    rhs(t, numba.carray(y_, (S,)), numba.carray(p_, (PP,)), ydot)
    for i in range(S):
        if not np.isfinite(ydot[i]):
            return 1
    return 0


@numba.cfunc(_SIG, cache=True, error_model="numpy")
def dp_aug_rhs(t, y_, ydot_, p_, n):
    ydot = numba.carray(ydot_, (n,))
    aug_rhs(t, numba.carray(y_, (n,)), numba.carray(p_, (PP,)), ydot)
    for i in range(n):
        if not np.isfinite(ydot[i]):
            return 1
    return 0
'''


@cache
def dopri5_callbacks(kernels) -> tuple[dict[str, int], object]:
    """The addresses of the model's right-hand-side callbacks (``"rhs"``, ``"aug_rhs"``) and the module
    holding them (compiled once, then loaded from the disk cache, :mod:`pgpgm.codegen.cache`), each
    registered as the link-time symbol ``pgpgm_<kernels.key>_dp_<name>`` for the compiled ODE Op."""
    source = _CALLBACKS.format(module=kernels.module, S=kernels.n_states, P=kernels.n_parameters)
    mod = kernel_cache.load_module(source, kernel_cache.source_key(source))
    addresses = {"rhs": mod.dp_rhs.address, "aug_rhs": mod.dp_aug_rhs.address}
    for name, address in addresses.items():
        native.register_symbol(f"pgpgm_{kernels.key}_dp_{name}", address)
    return addresses, mod


@intrinsic
def _call_rhs(typingctx, address, t, y, ydot, p, n):
    """Call the callback at ``address`` (int64) as ``int32 f(double t, double* y, double* ydot, double* p,
    int64 n)``, the pointers given as int64 addresses."""
    if not all(isinstance(a, types.Integer) for a in (address, y, ydot, p, n)):
        return None

    def codegen(context, builder, signature, args):
        f64p = ir.DoubleType().as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ir.DoubleType(), f64p, f64p, f64p, ir.IntType(64)])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        tv = context.cast(builder, args[1], signature.args[1], types.float64)
        ptrs = [builder.inttoptr(a, f64p) for a in args[2:5]]
        return builder.call(fn, [tv, *ptrs, args[5]])

    return types.int32(address, t, y, ydot, p, n), codegen


# The solve's loops: a float division by zero (or an overflow) in them is inf or NaN, which the loop
# turns into a failed solve (a flag), as the model's callbacks do - never a Python exception from
# compiled code, which would end a sampler (PyMC's NUTS) instead of rejecting one proposal.
_JIT = dict(cache=True, error_model="numpy")

# The Dormand-Prince tableau: stage nodes C, coefficients A (row s: stage s), the 5th-order weights B
# (= A's last row: the 7th stage is f at the step's end), and E = B - the 4th-order weights (7 stages).
_C2, _C3, _C4, _C5 = 1 / 5, 3 / 10, 4 / 5, 8 / 9
_A21 = 1 / 5
_A31, _A32 = 3 / 40, 9 / 40
_A41, _A42, _A43 = 44 / 45, -56 / 15, 32 / 9
_A51, _A52, _A53, _A54 = 19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729
_A61, _A62, _A63, _A64, _A65 = 9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656
_B1, _B3, _B4, _B5, _B6 = 35 / 384, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84
_E1, _E3, _E4, _E5, _E6, _E7 = 71 / 57600, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40
# The continuous extension's weights (:func:`_dense`): stage i's weight at the fraction s of a step is
# s [i == 0] + D_i1 s^2 + D_i2 s^3 + D_i3 s^4 (stage 2's is 0); at s = 1 they sum to B, their derivative there is
# 1 on the last stage (f at the step's end) and 0 elsewhere.
_D01, _D02, _D03 = -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432
_D21, _D22, _D23 = 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799
_D31, _D32, _D33 = -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072
_D41, _D42, _D43 = 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632
_D51, _D52, _D53 = -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844
_D61, _D62, _D63 = 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423


@numba.njit(**_JIT)
def _step(rhs, t, h, y, k, ytmp, ysti, p, rtol, atol, n_err):
    """One trial step of size h from (t, y) with k[0] = f(t, y): the 5th-order solution goes to ytmp,
    f at it to k[6], the last stage's argument to ysti (k[5] = f there); returns (the error's RMS norm
    over the first ``n_err`` components, relative to atol + rtol |y|, or inf where a stage's right-hand
    side failed)."""
    n = y.shape[0]
    pa = p.ctypes.data
    ta = ytmp.ctypes.data
    for j in range(n):
        ytmp[j] = y[j] + h * _A21 * k[0, j]
    if _call_rhs(rhs, t + _C2 * h, ta, k[1].ctypes.data, pa, n) != 0:
        return np.inf
    for j in range(n):
        ytmp[j] = y[j] + h * (_A31 * k[0, j] + _A32 * k[1, j])
    if _call_rhs(rhs, t + _C3 * h, ta, k[2].ctypes.data, pa, n) != 0:
        return np.inf
    for j in range(n):
        ytmp[j] = y[j] + h * (_A41 * k[0, j] + _A42 * k[1, j] + _A43 * k[2, j])
    if _call_rhs(rhs, t + _C4 * h, ta, k[3].ctypes.data, pa, n) != 0:
        return np.inf
    for j in range(n):
        ytmp[j] = y[j] + h * (_A51 * k[0, j] + _A52 * k[1, j] + _A53 * k[2, j] + _A54 * k[3, j])
    if _call_rhs(rhs, t + _C5 * h, ta, k[4].ctypes.data, pa, n) != 0:
        return np.inf
    for j in range(n):
        ytmp[j] = y[j] + h * (_A61 * k[0, j] + _A62 * k[1, j] + _A63 * k[2, j] + _A64 * k[3, j] + _A65 * k[4, j])
        ysti[j] = ytmp[j]
    if _call_rhs(rhs, t + h, ta, k[5].ctypes.data, pa, n) != 0:
        return np.inf
    for j in range(n):
        ytmp[j] = y[j] + h * (_B1 * k[0, j] + _B3 * k[2, j] + _B4 * k[3, j] + _B5 * k[4, j] + _B6 * k[5, j])
    if _call_rhs(rhs, t + h, ta, k[6].ctypes.data, pa, n) != 0:
        return np.inf
    err = 0.0
    for j in range(n_err):
        e = h * (_E1 * k[0, j] + _E3 * k[2, j] + _E4 * k[3, j] + _E5 * k[4, j] + _E6 * k[5, j] + _E7 * k[6, j])
        scale = atol + rtol * max(abs(y[j]), abs(ytmp[j]))
        err += (e / scale) ** 2
    err = np.sqrt(err / n_err)
    return err if np.isfinite(err) else np.inf


@numba.njit(**_JIT)
def _first_step(rhs, t, y, f0, ytmp, f1, p, rtol, atol, span, n_err):
    """An initial step size (Hairer, Norsett and Wanner's rule for order 5) within ``span``, from the first
    ``n_err`` components; 0 where the right-hand side is too large for a representable step (its scaled
    norm overflows), which :func:`_advance` reports as :data:`STEP_TOO_SMALL`."""
    n = y.shape[0]
    d0 = 0.0
    d1 = 0.0
    for j in range(n_err):
        scale = atol + rtol * abs(y[j])
        d0 += (y[j] / scale) ** 2
        d1 += (f0[j] / scale) ** 2
    d0, d1 = np.sqrt(d0 / n_err), np.sqrt(d1 / n_err)
    h0 = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / d1
    if not h0 > 0.0:  # |f| / scale beyond ~1e154 squares to inf (d1 = inf): no step fits, the caller's STEP_TOO_SMALL
        return 0.0
    h0 = min(h0, span)
    for j in range(n):
        ytmp[j] = y[j] + h0 * f0[j]
    if _call_rhs(rhs, t + h0, ytmp.ctypes.data, f1.ctypes.data, p.ctypes.data, n) != 0:
        return h0 * 0.01
    d2 = 0.0
    for j in range(n_err):
        scale = atol + rtol * abs(y[j])
        d2 += ((f1[j] - f0[j]) / scale) ** 2
    d2 = np.sqrt(d2 / n_err) / h0
    big = max(d1, d2)
    h1 = max(1e-6, h0 * 1e-3) if big <= 1e-15 else (0.01 / big) ** 0.2
    return min(100.0 * h0, h1, span)


@numba.njit(**_JIT)
def _dense(y, k, h, theta, row):
    """Dormand and Prince's continuous extension (order 4, as scipy's ``RK45`` and Hairer and Wanner's ``CONTD5``) of
    the accepted step of size h from y with stages k (k[6]: f at its end) at the fraction ``theta`` of it, into
    ``row``: y + h sum_i k[i] (D[i] . (theta, theta^2, theta^3, theta^4)). Linear in the stages, so on a solve with
    sensitivities the interpolated sensitivities are the derivative of the interpolated states at these steps."""
    t2 = theta * theta
    t3 = t2 * theta
    t4 = t3 * theta
    w0 = theta + _D01 * t2 + _D02 * t3 + _D03 * t4
    w2 = _D21 * t2 + _D22 * t3 + _D23 * t4
    w3 = _D31 * t2 + _D32 * t3 + _D33 * t4
    w4 = _D41 * t2 + _D42 * t3 + _D43 * t4
    w5 = _D51 * t2 + _D52 * t3 + _D53 * t4
    w6 = _D61 * t2 + _D62 * t3 + _D63 * t4
    for j in range(y.shape[0]):
        row[j] = y[j] + h * (w0 * k[0, j] + w2 * k[2, j] + w3 * k[3, j] + w4 * k[4, j] + w5 * k[5, j] + w6 * k[6, j])


@numba.njit(**_JIT)
def _advance(rhs, t, target, h, end, y, k, ytmp, ysti, p, rtol, atol, max_steps, stiff_steps, stiff,
             n_err, times, index, last, out):
    """Steps from (t, y) with k[0] = f(t, y) to ``target`` (<= ``end``, the piece's end), the last
    step cut to land on it; ``h`` is the proposed step (negative: choose a first one). On the way it writes
    the states at ``times[index:last]`` (those within the steps taken; ``last = index``: none) into ``out``
    by the continuous extension (:func:`_dense`), or the step's own solution at a time it ends on.
    ``stiff_steps`` is the stiffness test's limit (0: no test; :data:`STIFF_STEPS`), ``stiff`` the
    solve's count of steps bounded by stability so far; ``n_err`` as :func:`_step`. Returns
    ``(flag, t, h, stiff, index)``: flag 0 (t == target; a gap within rounding counts as reached),
    :data:`TOO_MUCH_WORK` after ``max_steps`` trial steps without an output time, :data:`STEP_TOO_SMALL`,
    :data:`STIFF` or :data:`NON_FINITE` (an interpolated state); ``stiff`` the count after; ``index`` the next
    output time not written."""
    n = y.shape[0]
    steps = 0
    while t < target:
        if target - t <= 16.0 * _EPS * max(abs(t), abs(target)):
            return 0, target, h, stiff, index  # within rounding: the state moves by rounding only
        if h < 0.0:
            h = _first_step(rhs, t, y, k[0], ytmp, k[1], p, rtol, atol, end - t, n_err)
        hit = t + h >= target
        hh = target - t if hit else h
        if hh <= 16.0 * _EPS * max(abs(t), abs(target)):
            return STEP_TOO_SMALL, t, h, stiff, index
        err = _step(rhs, t, hh, y, k, ytmp, ysti, p, rtol, atol, n_err)
        steps += 1
        if steps > max_steps:
            return TOO_MUCH_WORK, t, h, stiff, index
        if err <= 1.0:
            if stiff_steps > 0:  # h times the largest eigenvalue, estimated from the last two stages
                num = 0.0
                den = 0.0
                for j in range(n):
                    num += (k[6, j] - k[5, j]) ** 2
                    den += (ytmp[j] - ysti[j]) ** 2
                if den > 0.0 and hh * np.sqrt(num / den) > STIFF_H_LAMBDA:
                    stiff += 1
                    if stiff >= stiff_steps:
                        return STIFF, t, h, stiff, index
            t1 = target if hit else t + hh
            while index < last and times[index] <= t1:  # output times within this step
                if times[index] < t1:
                    _dense(y, k, hh, (times[index] - t) / hh, out[index])
                else:
                    for j in range(n):
                        out[index, j] = ytmp[j]
                for j in range(n):
                    if not np.isfinite(out[index, j]):
                        return NON_FINITE, t, h, stiff, index
                index += 1
                steps = 0
            t = t1
            for j in range(n):
                y[j] = ytmp[j]
                k[0, j] = k[6, j]
            grow = 10.0 if err == 0.0 else min(10.0, max(0.2, 0.9 * err ** -0.2))
            h = max(h, hh * grow) if hit else hh * grow  # a step cut to hit the target keeps h
        else:
            h = hh * (0.25 if not np.isfinite(err) else max(0.2, 0.9 * err ** -0.2))
    return 0, t, h, stiff, index


@numba.njit(**_JIT)
def _hold(y, t, times, index, last, out):
    """Writes the state ``y`` at the output times from ``index`` up to ``last`` that are <= ``t`` (reached within
    rounding); returns the next index, or -1 - index where a component of ``y`` is not finite."""
    n = y.shape[0]
    while index < last and times[index] <= t:
        for j in range(n):
            if not np.isfinite(y[j]):
                return -1 - index
            out[index, j] = y[j]
        index += 1
    return index


@numba.njit(**_JIT)
def dopri5_kernel(rhs, rtol, atol, max_steps, stiff_steps, n_err, dense, times, theta, y0, out, breaks):
    """The compiled Dormand-Prince solve (cached on disk by numba; callable from numba code).

    ``dopri5_kernel(rhs, rtol, atol, max_steps, stiff_steps, n_err, dense, times, theta, y0, out, breaks)``
    integrates the system whose right-hand-side callback (:func:`dopri5_callbacks`) is at address ``rhs`` from
    ``y0`` (n,) at ``times[0]`` with parameters ``theta`` (P,), writes the states at ``times`` (N,) into ``out``
    (N, n) and returns ``(flag, index, t)``: flag 0 on success, else :data:`TOO_MUCH_WORK`,
    :data:`STEP_TOO_SMALL`, :data:`STIFF` (after ``stiff_steps`` steps at the stability boundary; 0: no
    test) or :data:`NON_FINITE`; each step's error is measured on the first ``n_err`` components (the
    states of a solve with sensitivities: :attr:`DOPRI5.control_sensitivities`); ``dense`` true: the steps run
    on to the end of each piece and the output times between steps are interpolated (:func:`_dense`); false:
    each output time ends a step (:attr:`DOPRI5.dense_output`); ``index`` the output time being computed when it
    stopped; ``t`` the time reached. ``breaks`` (B,), sorted and strictly inside the span: see the module's notes.
    A step whose right-hand side fails (a non-finite value) is retried at a quarter of its size.
    """
    n, N, P = y0.shape[0], times.shape[0], theta.shape[0]
    p = np.empty(max(P, 1))
    for i in range(P):
        p[i] = theta[i]
    k = np.empty((7, n))
    y = y0.copy()
    ytmp = np.empty(n)
    ysti = np.empty(n)
    stiff = 0
    for j in range(n):
        out[0, j] = y0[j]
    B = breaks.shape[0]
    t = times[0]
    index = 1
    for piece in range(B + 1):
        # the piece ends at the float below the next break (the right-hand side is evaluated at a step's end)
        end = np.nextafter(breaks[piece], -np.inf) if piece < B else times[N - 1]
        if _call_rhs(rhs, t, y.ctypes.data, k[0].ctypes.data, p.ctypes.data, n) != 0:
            return NON_FINITE, index, t
        h = -1.0
        last = index  # the output times of this piece: index .. last - 1
        while last < N and times[last] <= end:
            last += 1
        # dense: on to the piece's end, writing its output times on the way; else: on to each output time
        while index < last or (dense and t < end):
            flag, t, h, stiff, index = _advance(rhs, t, end if dense else times[index], h, end, y, k, ytmp, ysti, p,
                                                rtol, atol, max_steps, stiff_steps, stiff, n_err, times, index, last,
                                                out)
            if flag != 0:
                return flag, index, t
            index = _hold(y, t, times, index, last, out)
            if index < 0:
                return NON_FINITE, -1 - index, t
        if piece < B:
            flag, t, h, stiff, index = _advance(rhs, t, end, h, end, y, k, ytmp, ysti, p, rtol, atol, max_steps,
                                                stiff_steps, stiff, n_err, times, index, index, out)
            if flag != 0:  # on to the end of the piece (no output time there)
                return flag, index, t
            index = _hold(y, breaks[piece], times, index, N, out)  # an output time equal to the break
            if index < 0:
                return NON_FINITE, -1 - index, t
            t = np.nextafter(breaks[piece], np.inf)  # restart just after the break: a new first stage
    return 0, N - 1, t

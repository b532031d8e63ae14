"""Compile an :class:`~pgpgm.ode.system.ODESystem` into numba kernels.

The sympy expressions (f, df/dx, df/dtheta) are common-subexpression-eliminated,
printed as Python source and compiled with numba. From those, C-callable functions
with the signatures SUNDIALS CVODE expects are built (``numba.cfunc``), so the
latent-state solve runs without Python between CVODE and the right-hand side.

Everything is generated as the source of one Python module (:func:`kernel_source`): the
model's rhs and Jacobians, the kernels built on them, the samplers' state sweep and Jacobian
on a grid specialised to them, and the C callbacks. The module is stored in the disk cache
(:mod:`pgpgm.ode.kernel_cache`) under a hash of its source and imported from there; its
functions use numba's ``cache=True``, so a later process loads the machine code instead of
compiling. The C callbacks call SUNDIALS through link-time symbols
(:mod:`pgpgm.solve.native`), and are themselves registered as symbols
``pgpgm_<key>_<name>`` for the compiled ODE Op.

Forward sensitivities are obtained by integrating the augmented system
``[x, s_1, ..., s_K]`` with ``ds_k/dt = J s_k + df/dq_k`` where q = (theta, x0)
(K = P + S; the x0 columns have no inhomogeneous term). Its Newton matrix uses the
exact block-diagonal part of the augmented Jacobian (J on every block); CVODE's
error test on all components keeps the sensitivities at the requested tolerance.

The kernels never raise: they are compiled with numba's ``error_model="numpy"``
(a division by zero gives inf, a square root of a negative number nan) and printed
so that no numba operation raises either (see :class:`_KernelPrinter`). An
exception inside a C callback could not reach CVODE (numba would only print it and
return garbage); instead the callbacks check their output and return CVODE's
recoverable error flag (1) for a non-finite right-hand side or Jacobian, so a
failing model makes the solve fail rather than produce numbers. Differentiating
``abs``, ``min``, ``max`` and ``where`` gives ``sign``, ``Heaviside`` and
``Piecewise`` terms, printed as conditional expressions; ``DiracDelta`` terms (zero
almost everywhere) are dropped.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

if TYPE_CHECKING:
    from .system import ODESystem


@dataclass(frozen=True)
class CompiledKernels:
    """numba-jitted kernels of one system (all take float64 arrays).

    rhs(t, x (S,), theta (P,), out (S,)); jac_x(t, x, theta, out (S, S));
    jac_p(t, x, theta, out (S, P)) (the Jacobians write only their nonzero entries: pass
    ``out`` zeroed); rhs_grid(t (N,), x (N, S), theta, out (N, S));
    aug_rhs(t, y (S*(1+K),), theta, out) for the sensitivity system.
    ``cvode`` holds the C callbacks for CVODE (None if SUNDIALS is not loadable).
    sweep(...) is :func:`pgpgm.sampling.kernel._sweep` with this rhs;
    jacobian_on_grid(t (N,), X (N, S), theta, out (N, S, S)) jac_x at every time;
    ``key`` names the cached module (:mod:`pgpgm.ode.kernel_cache`) and the callbacks' symbols.
    """

    n_states: int
    n_parameters: int
    rhs: Any
    jac_x: Any
    jac_p: Any
    rhs_grid: Any
    aug_rhs: Any
    cvode: CvodeCallbacks | None
    sweep: Any = None
    jacobian_on_grid: Any = None
    key: str = ""


@dataclass(frozen=True)
class CvodeCallbacks:
    """Addresses of C callbacks (CVRhsFn and CVLsJacFn) for plain and augmented systems; each is
    also the link-time symbol ``pgpgm_<key>_<field>`` (:func:`pgpgm.solve.native.symbol_address`)."""

    rhs: int
    jac: int
    aug_rhs: int
    aug_jac: int
    _keepalive: tuple


class _KernelPrinter(PythonCodePrinter):
    """sympy's Python printer, adjusted so that the generated numba code never raises.

    * ``x**(-n)`` for an integer n >= 2 is printed ``1/(x**n)``: numba raises
      ZeroDivisionError for ``0.0**(-n)`` whatever its error model, while the division
      gives inf (the same bits as numba's own power otherwise: x**n, then 1/that).
    * Integers and fractions too large for a 64-bit integer are printed as the float
      nearest to them (numba cannot type such integer literals).
    * A float constant is printed with every digit it needs (``repr``): sympy's printer
      writes 15 significant digits, so ``2.000000000000001`` would compile as ``2.0`` while
      the PyTensor density, the saved file and every other part of a fit use the exact value.
    """

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Pow(self, expr, rational=False):
        if expr.exp.is_Integer and expr.exp < -1:
            return f"1/({self._print(sp.Pow(expr.base, -expr.exp))})"
        return super()._print_Pow(expr, rational=rational)

    def _print_Integer(self, expr):
        return super()._print_Integer(expr) if abs(expr.p) <= _EXACT else repr(float(expr.p))

    def _print_Rational(self, expr):
        if abs(expr.p) <= _EXACT and expr.q <= _EXACT:
            return super()._print_Rational(expr)
        return repr(expr.p / expr.q)


_EXACT = 2**53
_PRINTER = _KernelPrinter({"fully_qualified_modules": True})


def _kernel_expr(expr: sp.Expr) -> sp.Expr:
    """An expression ready for printing: distributions (DiracDelta, from differentiating
    steps) are 0 almost everywhere and so are dropped."""
    return expr.replace(sp.DiracDelta, lambda *args: sp.S.Zero) if expr.has(sp.DiracDelta) else expr


def _assignments(targets: list[tuple[str, sp.Expr]], mapping: dict) -> list[str]:
    exprs = [_kernel_expr(sp.sympify(e)).xreplace(mapping) for _, e in targets]
    repl, reduced = sp.cse(exprs, symbols=sp.numbered_symbols("_c"))
    lines = [f"{s} = {_PRINTER.doprint(v)}" for s, v in repl]
    lines += [f"{t} = {_PRINTER.doprint(e)}" for (t, _), e in zip(targets, reduced)]
    return lines


def _source(name: str, args: str, lines: list[str]) -> str:
    body = "\n".join("    " + ln for ln in lines) or "    pass"
    return f"@numba.njit(**_JIT)\ndef {name}({args}):\n{body}\n    return 0\n"


_HEADER = '''"""Compiled kernels of one ODE system, generated by pgpgm.ode.codegen (do not edit)."""
import math

import numba
import numpy as np
from numba import types

from pgpgm.solve import native as _nat

S, P = {S}, {P}
K = P + S
N_AUG = S * (1 + K)
PP = max(P, 1)
_JIT = dict(cache=True, error_model="numpy")

'''

# Model-independent code of the module: the kernels built on rhs, jac_x and jac_p, and the
# C callbacks of CVODE (compiled only when SUNDIALS is linked).
_BODY = '''

@numba.njit(**_JIT)
def rhs_grid(tt, x, p, out):
    for n in range(tt.shape[0]):
        rhs(tt[n], x[n], p, out[n])


@numba.njit(**_JIT)
def aug_rhs(tt, y, p, out):
    x = y[:S]
    rhs(tt, x, p, out[:S])
    jx_ = np.zeros((S, S))
    jp_ = np.zeros((S, P))
    jac_x(tt, x, p, jx_)
    jac_p(tt, x, p, jp_)
    for k in range(K):
        base = S + k * S
        for i in range(S):
            acc = jp_[i, k] if k < P else 0.0
            for j in range(S):
                acc += jx_[i, j] * y[base + j]
            out[base + i] = acc


@numba.njit(**_JIT)
def aug_jac_colmajor(tt, y, p, m):
    # m is the (n, n) dense matrix viewed column-major: m[j, i] = dF_i/dy_j.
    jx_ = np.zeros((S, S))
    jac_x(tt, y[:S], p, jx_)
    for blk in range(K + 1):
        base = blk * S
        for i in range(S):
            for j in range(S):
                m[base + j, base + i] = jx_[i, j]


{specialised}

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
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (N_AUG,))
        ydot = numba.carray(_nat.N_VGetArrayPointer(ydot_), (N_AUG,))
        aug_rhs(t, y, numba.carray(p_, (PP,)), ydot)
        for i in range(N_AUG):
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
        y = numba.carray(_nat.N_VGetArrayPointer(y_), (N_AUG,))
        m = numba.carray(_nat.SUNDenseMatrix_Data(m_), (N_AUG, N_AUG))
        aug_jac_colmajor(t, y, numba.carray(p_, (PP,)), m)
        for j in range(S):  # the first block holds every distinct entry
            for i in range(S):
                if not np.isfinite(m[j, i]):
                    return 1
        return 0
'''


def kernel_source(system: ODESystem) -> str:
    """The Python source of the kernel module of ``system`` (see :func:`compile_kernels`)."""
    t, xs, ps = system._symbols
    S, P = system.n_states, system.n_parameters
    mapping = {t: sp.Symbol("t")}
    mapping.update({x: sp.Symbol(f"x[{i}]") for i, x in enumerate(xs)})
    mapping.update({p: sp.Symbol(f"p[{k}]") for k, p in enumerate(ps)})
    jx, jp = system.state_jacobian, system.parameter_jacobian
    src = {
        "rhs": _assignments([(f"out[{i}]", e) for i, e in enumerate(system.expressions)], mapping),
        # Jacobians: only the entries that are not identically zero (``out`` arrives zeroed).
        "jac_x": _assignments([(f"out[{i}, {j}]", jx[i, j]) for i in range(S) for j in range(S) if jx[i, j] != 0],
                              mapping),
        "jac_p": _assignments([(f"out[{i}, {k}]", jp[i, k]) for i in range(S) for k in range(P) if jp[i, k] != 0],
                              mapping),
    }
    parts = [_HEADER.format(S=S, P=P)] + [_source(name, "t, x, p, out", lines) + "\n" for name, lines in src.items()]
    return "\n".join(parts) + _BODY.replace("{specialised}", _specialised())


def _specialised() -> str:
    """The source of the samplers' model-generic kernels (the state sweep, the Jacobian on a
    grid) with the model function they take as first argument turned into this module's
    global: numba cannot cache code that receives a jitted function as an argument."""
    from ..sampling.conditional import _jacobian_on_grid
    from ..sampling.kernel import _sweep

    out = []
    for func, arg, name in ((_sweep, "rhs", "sweep"), (_jacobian_on_grid, "jac_x", "jacobian_on_grid")):
        src = inspect.getsource(func.py_func)
        head = f"@numba.njit(cache=False)\ndef {func.__name__}({arg}, "
        if not src.startswith(head):
            raise RuntimeError(f"pgpgm: unexpected source of {func.__name__}")  # a change in pgpgm itself
        out.append(f"@numba.njit(cache=True)\ndef {name}(" + src[len(head):])
    return "\n\n".join(out)


def compile_kernels(system: ODESystem) -> CompiledKernels:
    """Generate and compile every numeric kernel of ``system``, or load them from the disk
    cache (:mod:`pgpgm.ode.kernel_cache`) when an earlier process compiled the same system."""
    from . import kernel_cache

    source = kernel_source(system)
    key = kernel_cache.source_key(source)
    mod = kernel_cache.load_module(source, key)
    kernels = CompiledKernels(system.n_states, system.n_parameters, mod.rhs, mod.jac_x, mod.jac_p, mod.rhs_grid,
                              mod.aug_rhs, None, mod.sweep, mod.jacobian_on_grid, key)
    return replace(kernels, cvode=_cvode_callbacks(mod, key) if mod.CVODE else None)


def _cvode_callbacks(mod, key: str) -> CvodeCallbacks:
    """The module's C callbacks, also registered as link-time symbols ``pgpgm_<key>_<name>``
    (:func:`pgpgm.solve.native.symbol_address`) for compiled code that is cached on disk."""
    from ..solve import native

    cbs = {"rhs": mod.cvode_rhs, "jac": mod.cvode_jac, "aug_rhs": mod.cvode_aug_rhs, "aug_jac": mod.cvode_aug_jac}
    for name, cb in cbs.items():
        native.register_symbol(f"pgpgm_{key}_{name}", cb.address)
    return CvodeCallbacks(*(cb.address for cb in cbs.values()), (mod,))

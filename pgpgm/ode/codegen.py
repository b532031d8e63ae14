"""Compile an :class:`~pgpgm.ode.system.ODESystem` into numba kernels.

The sympy expressions (f, df/dx, df/dtheta) are common-subexpression-eliminated,
printed as Python source and compiled with numba. From those, C-callable functions
with the signatures SUNDIALS CVODE expects are built (``numba.cfunc``), so the
latent-state solve runs without Python between CVODE and the right-hand side.

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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import sympy as sp
from numba import types
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
    """

    n_states: int
    n_parameters: int
    rhs: Any
    jac_x: Any
    jac_p: Any
    rhs_grid: Any
    aug_rhs: Any
    cvode: CvodeCallbacks | None


@dataclass(frozen=True)
class CvodeCallbacks:
    """Addresses of C callbacks (CVRhsFn and CVLsJacFn) for plain and augmented systems."""

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
    """

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
    return f"def {name}({args}):\n{body}\n    return 0\n"


def compile_kernels(system: ODESystem) -> CompiledKernels:
    """Generate and compile every numeric kernel of ``system``."""
    import math  # noqa: F401  (used by generated code)

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
    namespace: dict[str, Any] = {"math": __import__("math")}
    funcs = {}
    for name, lines in src.items():
        exec(_source(name, "t, x, p, out", lines), namespace)  # noqa: S102 (our own generated code)
        funcs[name] = numba.njit(cache=False, fastmath=False, error_model="numpy")(namespace[name])
    rhs, jac_x, jac_p = funcs["rhs"], funcs["jac_x"], funcs["jac_p"]
    K = P + S

    @numba.njit(error_model="numpy")
    def rhs_grid(tt, x, p, out):
        for n in range(tt.shape[0]):
            rhs(tt[n], x[n], p, out[n])

    @numba.njit(error_model="numpy")
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

    @numba.njit(error_model="numpy")
    def aug_jac_colmajor(tt, y, p, m):
        # m is the (n, n) dense matrix viewed column-major: m[j, i] = dF_i/dy_j.
        jx_ = np.zeros((S, S))
        jac_x(tt, y[:S], p, jx_)
        for blk in range(K + 1):
            base = blk * S
            for i in range(S):
                for j in range(S):
                    m[base + j, base + i] = jx_[i, j]

    kernels = CompiledKernels(S, P, rhs, jac_x, jac_p, rhs_grid, aug_rhs, None)
    return replace(kernels, cvode=_cvode_callbacks(kernels, aug_jac_colmajor))


def _cvode_callbacks(k: CompiledKernels, aug_jac_colmajor) -> CvodeCallbacks | None:
    from ..solve import sundials as _sundials

    lib = _sundials.library()
    if lib is None:
        return None
    get_data = lib.N_VGetArrayPointer
    mat_data = lib.SUNDenseMatrix_Data
    S, P = k.n_states, k.n_parameters
    n_aug = S * (1 + P + S)
    rhs, jac_x, aug_rhs = k.rhs, k.jac_x, k.aug_rhs
    dp = types.CPointer(types.float64)
    rhs_sig = types.int32(types.float64, types.voidptr, types.voidptr, dp)
    jac_sig = types.int32(
        types.float64, types.voidptr, types.voidptr, types.voidptr, dp,
        types.voidptr, types.voidptr, types.voidptr,
    )

    def make_rhs(n, inner):
        @numba.cfunc(rhs_sig, error_model="numpy")
        def cb(t, y_, ydot_, p_):
            y = numba.carray(get_data(y_), (n,))
            ydot = numba.carray(get_data(ydot_), (n,))
            p = numba.carray(p_, (max(P, 1),))
            inner(t, y, p, ydot)
            for i in range(n):
                if not np.isfinite(ydot[i]):
                    return 1  # recoverable error: CVODE retries with a smaller step
            return 0

        return cb

    @numba.cfunc(jac_sig, error_model="numpy")
    def jac_cb(t, y_, fy_, m_, p_, t1, t2, t3):
        y = numba.carray(get_data(y_), (S,))
        p = numba.carray(p_, (max(P, 1),))
        m = numba.carray(mat_data(m_), (S, S))
        jx_ = np.zeros((S, S))
        jac_x(t, y, p, jx_)
        for i in range(S):
            for j in range(S):
                if not np.isfinite(jx_[i, j]):
                    return 1  # recoverable: CVODE retries with a smaller step, then gives up with a flag
                m[j, i] = jx_[i, j]
        return 0

    @numba.cfunc(jac_sig, error_model="numpy")
    def aug_jac_cb(t, y_, fy_, m_, p_, t1, t2, t3):
        y = numba.carray(get_data(y_), (n_aug,))
        p = numba.carray(p_, (max(P, 1),))
        m = numba.carray(mat_data(m_), (n_aug, n_aug))
        aug_jac_colmajor(t, y, p, m)
        for j in range(S):  # the first block holds every distinct entry
            for i in range(S):
                if not np.isfinite(m[j, i]):
                    return 1
        return 0

    rhs_cb, aug_cb = make_rhs(S, rhs), make_rhs(n_aug, aug_rhs)
    keep = (rhs_cb, aug_cb, jac_cb, aug_jac_cb)
    return CvodeCallbacks(rhs_cb.address, jac_cb.address, aug_cb.address, aug_jac_cb.address, keep)

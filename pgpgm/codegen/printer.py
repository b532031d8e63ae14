"""sympy expressions to numba source that never raises.

The generated kernels (:mod:`pgpgm.ode.functions`, :mod:`pgpgm.gp.kernels`) are compiled with numba's
``error_model="numpy"`` (a division by zero gives inf, a square root of a negative number nan), and
printed so that no numba operation raises either (:class:`KernelPrinter`). Differentiating ``abs``,
``min``, ``max`` and ``where`` gives ``sign``, ``Heaviside`` and ``Piecewise`` terms, printed as
conditional expressions; ``DiracDelta`` terms (zero almost everywhere) are dropped
(:func:`kernel_expr`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

#: Largest integer printed as an integer literal (numba cannot type larger ones).
EXACT = 2**53


class KernelPrinter(PythonCodePrinter):
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
        return super()._print_Integer(expr) if abs(expr.p) <= EXACT else repr(float(expr.p))

    def _print_Rational(self, expr):
        if abs(expr.p) <= EXACT and expr.q <= EXACT:
            return super()._print_Rational(expr)
        return repr(expr.p / expr.q)


#: The printer of every generated kernel (module names written out: ``math.exp``).
PRINTER = KernelPrinter({"fully_qualified_modules": True})


def kernel_expr(expr: sp.Expr) -> sp.Expr:
    """An expression ready for printing: distributions (DiracDelta, from differentiating
    steps) are 0 almost everywhere and so are dropped."""
    return expr.replace(sp.DiracDelta, lambda *args: sp.S.Zero) if expr.has(sp.DiracDelta) else expr


def assignments(targets: Sequence[tuple[str, sp.Expr]], mapping: Mapping) -> list[str]:
    """Lines ``target = value`` for ``targets`` (name, expression), with their common subexpressions
    assigned once before them (``_c0 = ...``); ``mapping`` renames symbols (e.g. x -> ``x[0]``)."""
    exprs = [kernel_expr(sp.sympify(e)).xreplace(mapping) for _, e in targets]
    repl, reduced = sp.cse(exprs, symbols=sp.numbered_symbols("_c"))
    lines = [f"{s} = {PRINTER.doprint(v)}" for s, v in repl]
    lines += [f"{t} = {PRINTER.doprint(e)}" for (t, _), e in zip(targets, reduced)]
    return lines


def njit_function(name: str, args: str, lines: Sequence[str]) -> str:
    """The source of ``@numba.njit(**_JIT) def name(args): lines; return 0`` (the module defines
    ``_JIT``)."""
    body = "\n".join("    " + ln for ln in lines) or "    pass"
    return f"@numba.njit(**_JIT)\ndef {name}({args}):\n{body}\n    return 0\n"

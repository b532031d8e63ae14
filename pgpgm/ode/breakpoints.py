"""Breakpoints: the times at which a right-hand side switches, found symbolically.

A right-hand side such as ``where(t < 1, 100, 12 <= t < 13, 100, 0)/V - CL/V*C`` jumps at
t = 1, 12 and 13; ``min(t, 5)`` or ``abs(t - 2)`` have a kink. An integrator that steps
straight over such a time gives a solution that depends on where its steps happen to fall
(noisy in the unknowns at the level of the tolerance, with sensitivities that disagree with
finite differences). The solvers (:mod:`pgpgm.solve`) therefore stop exactly at every
breakpoint inside the output span, restart there and go on.

What counts as a switch of time: every comparison (a condition of ``where``), every pair of
arguments of ``min``/``max`` and every argument of ``abs`` whose difference (for
comparisons, ``lhs - rhs``) involves the time ``t`` and numbers only - no state and no
parameter. Its zeros in t are the breakpoints: solved by sympy (finite sets, and periodic
families such as the zeros of ``sin(2*pi*t)``, enumerated over the span); where sympy finds no
closed form, the sign changes of the function on a fine grid of the span are refined by
Brent's method.

Not handled (documented limits): switches that depend on a parameter (``t < tau`` with
``tau`` estimated) or on a state (``where(x > 1, ...)``) are not located; the solver steps
over them as before, and the sensitivity with respect to a switching-time parameter lacks
the jump term. Fix such a parameter (:meth:`ODESystem.fix`) to make its switch a breakpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sympy as sp
from scipy.optimize import brentq

from ..errors import ModelDefinitionError

#: Most breakpoints one span may hold (a periodic switch over a long span): beyond it the
#: solve would be dominated by restarts; :func:`breakpoints_between` raises instead.
MAX_BREAKPOINTS = 100_000
#: Grid points per span for the numeric search of zeros sympy cannot solve.
SCAN_POINTS = 2_001
_TOO_MANY = ("the right-hand side switches more than {} times in [{:g}, {:g}] (at the zeros of {}); "
             "shorten the span of the output times or smooth the switch")


@dataclass(frozen=True)
class TimeSwitch:
    """One switching function g(t) of a right-hand side and its zeros.

    Attributes
    ----------
    function : sympy expression in ``t`` and numbers only; the right-hand side switches
        (or has a kink) where it changes sign
    zeros : the zeros of ``function`` over the reals as sympy returns them (a FiniteSet, a
        Union of periodic ImageSets, ...), or None where sympy has no closed form (they are
        then found numerically on each span)
    """

    function: sp.Expr
    zeros: sp.Set | None


def _switching_functions(expressions: Sequence[sp.Expr], t: sp.Symbol) -> list[sp.Expr]:
    """The functions g(t) whose sign changes switch the expressions (see the module text)."""
    found: list[sp.Expr] = []

    def add(g: sp.Expr) -> None:
        g = sp.expand(g)
        if g.free_symbols == {t} and g not in found and -g not in found:
            found.append(g)

    for expr in expressions:
        for node in sp.preorder_traversal(expr):
            if isinstance(node, sp.core.relational.Relational):
                add(node.lhs - node.rhs)
            elif isinstance(node, sp.Min | sp.Max):
                for i, a in enumerate(node.args):
                    for b in node.args[i + 1:]:
                        add(a - b)
            elif isinstance(node, sp.Abs):
                add(node.args[0])
    return found


def find_time_switches(expressions: Sequence[sp.Expr], t: sp.Symbol) -> tuple[TimeSwitch, ...]:
    """The time switches of ``expressions`` (right-hand sides in the time symbol ``t``)."""
    out = []
    for g in _switching_functions(expressions, t):
        try:
            zeros = sp.solveset(g, t, domain=sp.S.Reals)
        except (NotImplementedError, ValueError, TypeError):
            zeros = None
        if zeros is not None and _values(zeros, -1.0, 1.0, dry=True) is None:
            zeros = None  # a form that cannot be enumerated: scan numerically
        out.append(TimeSwitch(g, zeros))
    return tuple(out)


def _values(zeros: sp.Set, start: float, stop: float, dry: bool = False) -> list[float] | None:
    """The zeros in [start, stop] as floats, or None for a set form not handled (``dry``:
    only check the form)."""
    if zeros is sp.S.EmptySet:
        return []
    if isinstance(zeros, sp.FiniteSet):
        vals = [complex(sp.N(z, 20)) for z in zeros.args]
        return [] if dry else [v.real for v in vals if v.imag == 0 and start <= v.real <= stop]
    if isinstance(zeros, sp.Union):
        out: list[float] = []
        for part in zeros.args:
            v = _values(part, start, stop, dry)
            if v is None:
                return None
            out += v
        return out
    if isinstance(zeros, sp.Interval):  # g = 0 on an interval (a kink at each finite end)
        ends = [e for e in (zeros.start, zeros.end) if e.is_finite]
        return [] if dry else [float(e) for e in ends if start <= float(e) <= stop]
    if zeros is sp.S.Integers:
        return [] if dry else [float(k) for k in range(math.ceil(start), math.floor(stop) + 1)]
    if isinstance(zeros, sp.ImageSet) and zeros.base_sets == (sp.S.Integers,) and len(zeros.lamda.variables) == 1:
        n = zeros.lamda.variables[0]
        image = sp.expand(zeros.lamda.expr)
        slope, offset = image.coeff(n, 1), image.coeff(n, 0)
        if sp.expand(slope * n + offset - image) != 0 or not (slope.is_number and offset.is_number) or slope == 0:
            return None
        if dry:
            return []
        a, c = float(slope), float(offset)
        lo, hi = sorted(((start - c) / a, (stop - c) / a))
        k0, k1 = math.ceil(lo), math.floor(hi)
        if k1 - k0 + 1 > MAX_BREAKPOINTS:
            raise ModelDefinitionError(_TOO_MANY.format(MAX_BREAKPOINTS, start, stop, zeros))
        return [a * k + c for k in range(k0, k1 + 1)]
    return None


def _scan(g: sp.Expr, t: sp.Symbol, start: float, stop: float) -> list[float]:
    """Zeros of ``g`` in (start, stop) where it changes sign between points of a fine grid."""
    f = sp.lambdify(t, g, "math")
    grid = np.linspace(start, stop, SCAN_POINTS)

    def value(x: float) -> float:
        try:
            return float(f(x))
        except (ValueError, ZeroDivisionError, OverflowError):
            return math.nan

    vals = [value(x) for x in grid]
    out = []
    for a, b, fa, fb in zip(grid[:-1], grid[1:], vals[:-1], vals[1:]):
        if fa == 0.0:
            out.append(float(a))
        elif math.isfinite(fa) and math.isfinite(fb) and fa * fb < 0:
            out.append(brentq(value, a, b, xtol=1e-15, rtol=4 * np.finfo(float).eps))
    return out


def breakpoints_between(switches: Sequence[TimeSwitch], t: sp.Symbol, start: float, stop: float) -> np.ndarray:
    """The breakpoints strictly inside (start, stop), sorted, without repeats.

    Parameters
    ----------
    switches : the system's time switches (:func:`find_time_switches`)
    t : the time symbol of their functions
    start, stop : the span of a solve (its first and last output time)

    Returns
    -------
    array (B,) of float; empty when nothing switches inside the span.

    Raises
    ------
    ModelDefinitionError
        When more than :data:`MAX_BREAKPOINTS` fall inside the span.
    """
    values: list[float] = []
    for sw in switches:
        values += _scan(sw.function, t, start, stop) if sw.zeros is None else _values(sw.zeros, start, stop)
        if len(values) > MAX_BREAKPOINTS:
            raise ModelDefinitionError(_TOO_MANY.format(MAX_BREAKPOINTS, start, stop, sw.function))
    return np.unique(np.array([v for v in values if start < v < stop], dtype=float))

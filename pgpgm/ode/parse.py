"""Safe parsing of right-hand-side equation strings into sympy expressions, and back.

The equation language
---------------------
Values
    numbers, declared names (states, parameters, the time ``t``), the constants
    ``pi`` and ``E``, arithmetic ``+ - * / **`` and unary minus, and the functions
    ``exp log sqrt sin cos tan sinh cosh tanh asin acos atan abs`` (one argument),
    ``min(a, b, ...)`` and ``max(a, b, ...)`` (two or more arguments).
Conditionals
    ``where(cond, a, b)`` is ``a`` where ``cond`` holds and ``b`` elsewhere;
    ``where(c1, a1, c2, a2, ..., otherwise)`` takes the first value whose condition
    holds. A condition is a comparison ``< <= > >=`` (chains such as ``0 <= t < 2``
    allowed), combined with ``and``/``or``/``not`` or ``&``/``|`` (parenthesise
    the comparisons: ``(t > 1) & (t < 2)``). Comparisons appear only in conditions.
    A condition on the time alone (``t < 1``) makes a breakpoint at which the solvers
    stop and restart (:mod:`pgpgm.ode.breakpoints`).

The string is parsed with :mod:`ast` and translated node by node; nothing is ever
evaluated by Python. Limits keep every input cheap: at most :data:`MAX_LENGTH`
characters, nesting depth :data:`MAX_DEPTH` (a long sum or product counts as one
level), numeric exponents at most :data:`MAX_EXPONENT` in magnitude, and every
constant subexpression a finite real 64-bit number.

Numbers
-------
A decimal literal with at most 17 significant digits (enough to name every
64-bit float) is the float nearest to it, as in Python. A longer literal is kept
exactly, as the decimal fraction it spells. :func:`format_expression` writes an
expression back in this language so that :func:`parse_expression` returns an
identical sympy expression.
"""

from __future__ import annotations

import ast
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import sympy as sp
from sympy.printing.str import StrPrinter

from ..errors import ModelDefinitionError

#: Longest accepted expression string, in characters.
MAX_LENGTH = 10_000
#: Deepest accepted nesting of operations and calls (a chain ``a + b - c + ...`` or
#: ``a * b / c * ...`` is one level however long it is).
MAX_DEPTH = 50
#: Largest magnitude of a numeric exponent (``x**1000`` is accepted, ``2**1001`` is not).
MAX_EXPONENT = 1000
#: Significant digits up to which a decimal literal is read as a 64-bit float.
FLOAT_DIGITS = 17

#: One-argument functions an equation string may call, by name.
UNARY_FUNCTIONS: Mapping[str, Callable[[sp.Expr], sp.Expr]] = {
    "exp": sp.exp,
    "log": sp.log,
    "sqrt": sp.sqrt,
    "sin": sp.sin,
    "cos": sp.cos,
    "tan": sp.tan,
    "sinh": sp.sinh,
    "cosh": sp.cosh,
    "tanh": sp.tanh,
    "asin": sp.asin,
    "acos": sp.acos,
    "atan": sp.atan,
    "abs": sp.Abs,
}
#: Functions of two or more arguments.
VARIADIC_FUNCTIONS: Mapping[str, type[sp.Expr]] = {"min": sp.Min, "max": sp.Max}
#: Every function name an equation string may call.
ALLOWED_FUNCTIONS: tuple[str, ...] = (*UNARY_FUNCTIONS, *VARIADIC_FUNCTIONS, "where")
#: Named constants an equation string may use.
ALLOWED_CONSTANTS: Mapping[str, sp.Expr] = {"pi": sp.pi, "E": sp.E}

# Float versions of the functions, used only to check constant subexpressions.
_FLOAT_FUNCTIONS: Mapping[str, Callable[[float], float]] = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "sin": math.sin, "cos": math.cos,
    "tan": math.tan, "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh, "asin": math.asin,
    "acos": math.acos, "atan": math.atan, "abs": abs,
}
_COMPARISONS = {
    ast.Lt: sp.StrictLessThan, ast.LtE: sp.LessThan, ast.Gt: sp.StrictGreaterThan, ast.GtE: sp.GreaterThan,
}
_NON_FINITE_NAMES = {"inf", "infinity", "nan", "oo", "zoo"}
_NOT_FINITE = (sp.zoo, sp.oo, sp.S.NegativeInfinity, sp.nan, sp.I)


class _Term(NamedTuple):
    """A translated value: the sympy expression and, for a constant, its float value."""

    expr: sp.Expr
    value: float | None


def _chain(op: ast.operator) -> str | None:
    if isinstance(op, ast.Add | ast.Sub):
        return "add"
    if isinstance(op, ast.Mult | ast.Div):
        return "mul"
    return None


# Operator and context nodes (``+``, ``Load``, ...) are not levels of their own.
_MARKERS = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def nesting_depth(tree: ast.AST, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed expression (iterative; stops counting past ``limit``).

    The left operand of ``+ -`` (or ``* /``) inside the same kind of operation stays
    on its parent's level, so a long sum or product is one level deep.
    """
    deepest = 0
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _MARKERS):
                continue
            same_chain = (
                isinstance(node, ast.BinOp) and child is node.left and isinstance(child, ast.BinOp)
                and _chain(node.op) is not None and _chain(child.op) == _chain(node.op)
            )
            stack.append((child, depth if same_chain else depth + 1))
    return deepest


def _excerpt(text: str, limit: int = 200) -> str:
    """``repr`` of ``text``, shortened to ``limit`` characters for error messages."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f" ... ({len(text)} characters)"


def _significant_digits(literal: str) -> int:
    mantissa = literal.lower().replace("_", "").split("e")[0].replace(".", "").lstrip("0")
    return max(len(mantissa), 1)


@dataclass(frozen=True)
class _Translator:
    """Turns one parsed expression into sympy: the text, its names and the error label."""

    text: str
    symbols: Mapping[str, sp.Symbol]
    label: str
    lines: tuple[bytes, ...]  # the text's lines as UTF-8 (ast offsets count bytes)

    # -- helpers
    def error(self, message: str) -> ModelDefinitionError:
        return ModelDefinitionError(f"{message}{self.label}: {_excerpt(self.text)}")

    def source(self, node: ast.AST, limit: int = 100) -> str:
        """The text of ``node`` (shortened to ``limit`` characters)."""
        if node.lineno == node.end_lineno and node.lineno <= len(self.lines):  # the common case, O(length)
            text = self.lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode(errors="replace")
        else:
            text = ast.get_source_segment(self.text, node) or ast.unparse(node)
        return text if len(text) <= limit else text[:limit] + "..."

    def finite(self, node: ast.AST, compute: Callable[[], float]) -> float:
        """Float value of a constant subexpression; a ModelDefinitionError if it is not finite and real."""
        try:
            value = float(compute())
        except (OverflowError, ValueError, ZeroDivisionError, TypeError):
            value = math.nan
        if not math.isfinite(value):
            raise self.error(
                f"the constant {self.source(node)!r} is not a finite real number (overflow, division by "
                "zero or outside the function's domain)"
            )
        return value

    def sympy(self, node: ast.AST, build: Callable[[], sp.Basic]) -> sp.Basic:
        try:
            return build()
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise self.error(f"{self.source(node)!r} is not a valid real expression ({exc})") from None

    # -- values
    def value(self, node: ast.AST) -> _Term:
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BinOp) and _chain(node.op) is not None:
            return self.chain(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return self.power(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self.value(node.operand)
            if isinstance(node.op, ast.UAdd):
                return operand
            neg = None if operand.value is None else -operand.value
            return _Term(self.sympy(node, lambda: -operand.expr), neg)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Compare | ast.BoolOp) or (
            isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
        ):
            raise self.error(
                f"the condition {self.source(node)!r} is used as a value; comparisons may appear only "
                "as conditions of where(), e.g. 'where(t < 2, dose, 0)'"
            )
        raise self.error(
            f"{type(node).__name__} {self.source(node)!r} is not allowed; only numbers, declared names, "
            "+ - * / **, where(), min(), max() and the whitelisted functions may appear"
        )

    def constant(self, node: ast.Constant) -> _Term:
        v = node.value
        if isinstance(v, complex):
            raise self.error(f"the complex constant {self.source(node)!r} is not allowed; equations are real")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(f"only numeric constants are allowed, not {self.source(node)!r}")
        value = self.finite(node, lambda: v)
        if isinstance(v, int):
            return _Term(sp.Integer(v), value)
        literal = self.source(node, limit=MAX_LENGTH)
        if value == 0.0 and any(c in "123456789" for c in literal.lower().split("e")[0]):
            raise self.error(f"the constant {literal!r} is too small for a 64-bit float (it would be 0)")
        if _significant_digits(literal) <= FLOAT_DIGITS:
            return _Term(sp.Float(v), value)
        return _Term(sp.Rational(literal.replace("_", "")), value)

    def name(self, node: ast.Name) -> _Term:
        if node.id in self.symbols:
            return _Term(self.symbols[node.id], None)
        if node.id in ALLOWED_CONSTANTS:
            c = ALLOWED_CONSTANTS[node.id]
            return _Term(c, float(c))
        if node.id.lower() in _NON_FINITE_NAMES:
            raise self.error(f"{node.id!r} is not a finite number; equations may use only finite constants")
        raise ModelDefinitionError(f"unknown name {node.id!r}{self.label}; declared names are {sorted(self.symbols)}")

    def chain(self, node: ast.BinOp) -> _Term:
        top, kind = node, _chain(node.op)
        pairs = []
        while isinstance(node, ast.BinOp) and _chain(node.op) == kind:
            pairs.append((node.op, node.right))
            node = node.left
        first = self.value(node)
        parts = [first.expr]
        value = first.value
        for op, right_node in reversed(pairs):
            right = self.value(right_node)
            if kind == "add":
                inverse = isinstance(op, ast.Sub)
                parts.append(self.sympy(right_node, lambda r=right.expr, i=inverse: -r if i else r))
                if value is not None and right.value is not None:
                    a, b = value, right.value
                    value = self.finite(top, lambda a=a, b=b, i=inverse: a - b if i else a + b)
                else:
                    value = None
            else:
                inverse = isinstance(op, ast.Div)
                parts.append(self.sympy(right_node, lambda r=right.expr, i=inverse: sp.Pow(r, -1) if i else r))
                if value is not None and right.value is not None:
                    a, b = value, right.value
                    value = self.finite(top, lambda a=a, b=b, i=inverse: a / b if i else a * b)
                else:
                    value = None
        combine = sp.Add if kind == "add" else sp.Mul
        expr = self.sympy(top, lambda: combine(*parts))
        return _Term(expr, value)

    def power(self, node: ast.BinOp) -> _Term:
        base, exponent = self.value(node.left), self.value(node.right)
        if exponent.value is not None and abs(exponent.value) > MAX_EXPONENT:
            raise self.error(
                f"the exponent in {self.source(node)!r} is {exponent.value:.6g}; exponents are limited to "
                f"{MAX_EXPONENT} in magnitude"
            )
        value = None
        if base.value is not None and exponent.value is not None:
            b, e = base.value, exponent.value
            value = self.finite(node, lambda: math.pow(b, e))
        return _Term(self.sympy(node, lambda: sp.Pow(base.expr, exponent.expr)), value)

    def call(self, node: ast.Call) -> _Term:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in ALLOWED_FUNCTIONS:
            raise ModelDefinitionError(
                f"call of {ast.unparse(node.func)!r} is not allowed{self.label}; "
                f"allowed functions are {sorted(ALLOWED_FUNCTIONS)}"
            )
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.error(f"{name}() takes positional arguments only")
        n = len(node.args)
        if name == "where":
            return self.where(node)
        if name in VARIADIC_FUNCTIONS:
            if n < 2:
                raise self.error(f"{name}() takes two or more arguments, got {n}")
            args = [self.value(a) for a in node.args]
            values = [a.value for a in args]
            f = VARIADIC_FUNCTIONS[name]
            value = None if None in values else (min if name == "min" else max)(values)
            return _Term(self.sympy(node, lambda: f(*(a.expr for a in args))), value)
        if n != 1:
            raise self.error(f"{name}() takes exactly one argument, got {n}")
        arg = self.value(node.args[0])
        value = None
        if arg.value is not None:
            v = arg.value
            value = self.finite(node, lambda: _FLOAT_FUNCTIONS[name](v))
        return _Term(self.sympy(node, lambda: UNARY_FUNCTIONS[name](arg.expr)), value)

    def where(self, node: ast.Call) -> _Term:
        n = len(node.args)
        if n < 3 or n % 2 == 0:
            raise self.error(
                f"where() takes (condition, value, otherwise) or (condition1, value1, condition2, value2, "
                f"..., otherwise): an odd number of at least 3 arguments, got {n}"
            )
        pieces = []
        for c_node, v_node in zip(node.args[0:-1:2], node.args[1:-1:2]):
            pieces.append((self.value(v_node), self.condition(c_node)))
        pieces.append((self.value(node.args[-1]), sp.true))
        value = None  # a constant only if the first condition that is not False is True
        for val, cond in pieces:
            if cond is not sp.false:
                value = val.value if cond is sp.true else None
                break
        pieces = [(val.expr, cond) for val, cond in pieces]
        return _Term(self.sympy(node, lambda: sp.Piecewise(*pieces)), value)

    # -- conditions
    def condition(self, node: ast.AST) -> sp.Basic:
        if isinstance(node, ast.Compare):
            operands = [self.value(node.left), *(self.value(c) for c in node.comparators)]
            parts = []
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if type(op) not in _COMPARISONS:
                    raise self.error(
                        f"the comparison {self.source(node)!r} is not allowed; use < <= > >="
                    )
                parts.append(self.sympy(node, lambda r=_COMPARISONS[type(op)], a=a, b=b: r(a.expr, b.expr)))
            return self.sympy(node, lambda: sp.And(*parts))
        if isinstance(node, ast.BoolOp):
            parts = [self.condition(v) for v in node.values]
            f = sp.And if isinstance(node.op, ast.And) else sp.Or
            return self.sympy(node, lambda: f(*parts))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd | ast.BitOr):
            a, b = self.condition(node.left), self.condition(node.right)
            f = sp.And if isinstance(node.op, ast.BitAnd) else sp.Or
            return self.sympy(node, lambda: f(a, b))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            c = self.condition(node.operand)
            return self.sympy(node, lambda: sp.Not(c))
        raise self.error(
            f"the condition {self.source(node)!r} of where() must be a comparison (< <= > >=), possibly "
            "combined with and/or/not or &/|, e.g. 'where(t < 2, dose, 0)'"
        )


def parse_expression(text: str, symbols: Mapping[str, sp.Symbol], *, where: str = "") -> sp.Expr:
    """Translate one equation string into a sympy expression.

    Parameters
    ----------
    text
        The right-hand side, e.g. ``"theta1*x1 - theta2*x1*x2"`` (see the module
        docstring for the language).
    symbols
        Every name the string may use (states, parameters, ``t``) mapped to its symbol.
    where
        Context for error messages (e.g. ``"equation for x1"``).

    Raises
    ------
    ModelDefinitionError
        If the string is not a single expression of the language, is longer than
        :data:`MAX_LENGTH`, nests deeper than :data:`MAX_DEPTH`, has an exponent
        beyond :data:`MAX_EXPONENT` or a constant that is not a finite real number.
    """
    label = f" in the {where}" if where else ""
    if not isinstance(text, str) or not text.strip():
        raise ModelDefinitionError(f"empty or non-string expression{label}: {text!r:.200}")
    if len(text) > MAX_LENGTH:
        raise ModelDefinitionError(
            f"the expression{label} has {len(text)} characters; at most {MAX_LENGTH} are accepted "
            f"(it starts {text[:60]!r})"
        )
    if "^" in text:
        raise ModelDefinitionError(f"'^' is not a power{label}: {_excerpt(text)}; write '**' instead")
    text = text.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ModelDefinitionError(
            f"not an arithmetic expression{label}: {_excerpt(text)} ({exc.msg}); an equation's "
            "right-hand side must be a single expression such as 'a*x - b*x*y'"
        ) from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise ModelDefinitionError(f"the expression{label} cannot be parsed ({type(exc).__name__}): {_excerpt(text, 60)}") from None
    if nesting_depth(tree) > MAX_DEPTH:
        raise ModelDefinitionError(
            f"the expression{label} nests deeper than {MAX_DEPTH} levels; split it or simplify it: {_excerpt(text, 60)}"
        )
    translator = _Translator(text, symbols, label, tuple(text.encode().split(b"\n")))
    try:
        expr = translator.value(tree.body).expr
        _check_finite(expr, label, text)
    except RecursionError:
        raise ModelDefinitionError(f"the expression{label} is too deeply nested: {_excerpt(text, 60)}") from None
    return expr


def _check_finite(expr: sp.Basic, label: str, text: str | None = None) -> None:
    """Every constant in ``expr`` - also those sympy forms, e.g. 1e308*(x - pi) -> 1e308*x - 1e308*pi -
    must be a finite real 64-bit number, or the compiled code would compute inf or nan; and every float
    constant one that a 64-bit float holds exactly, or the kernels and the density would compute with it
    rounded while the system (and a saved model) kept another number (sympy forms floats below the 64-bit
    range from numbers within it: 1e-300*1e-10 -> 1.0e-310 with 53 bits, 1e-300*1e-300 -> 1.0e-600)."""
    source = f": {_excerpt(text)}" if text is not None else f": {expr}"
    if expr.has(*_NOT_FINITE):
        raise ModelDefinitionError(
            f"the expression{label} is not finite and real everywhere (a division by zero, an infinite "
            f"or complex constant){source}"
        )
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Expr) and not node.is_Symbol and node.is_number:
            try:
                value = float(node)
            except (TypeError, ValueError, OverflowError):
                value = math.nan
            if not math.isfinite(value):
                raise ModelDefinitionError(
                    f"the constant {node}{label} is not a finite 64-bit number{source}"
                )
            if isinstance(node, sp.Float) and sp.Float(value)._mpf_ != node._mpf_:
                raise ModelDefinitionError(
                    f"the constant {node}{label} is below the range of 64-bit floats (smallest normal "
                    f"{sys.float_info.min!r}), where it would be rounded to {value!r}: write the constant as one "
                    f"number or rescale the model (other units){source}"
                )


# ---------------------------------------------------------------------------------- writing back
_SUPPORTED_CLASSES: tuple[type, ...] = (
    sp.Symbol, sp.Integer, sp.Rational, sp.Float, type(sp.pi), type(sp.E), sp.Add, sp.Mul, sp.Pow,
    sp.exp, sp.log, sp.sin, sp.cos, sp.tan, sp.sinh, sp.cosh, sp.tanh, sp.asin, sp.acos, sp.atan, sp.Abs,
    sp.Min, sp.Max, sp.Piecewise, sp.functions.elementary.piecewise.ExprCondPair,
    sp.StrictLessThan, sp.LessThan, sp.StrictGreaterThan, sp.GreaterThan,
    sp.And, sp.Or, sp.Not, type(sp.true), type(sp.false),
)


def check_expression(expr: sp.Basic, *, where: str = "") -> None:
    """Raise ModelDefinitionError unless ``expr`` stays inside the equation language.

    Used for systems built from sympy expressions (``ODESystem.from_function``), so that
    every system compiles, translates to PyTensor and writes back as strings.
    """
    label = f" in the {where}" if where else ""
    if _sympy_depth(expr) > 4 * MAX_DEPTH:
        raise ModelDefinitionError(f"the expression{label} nests deeper than {4 * MAX_DEPTH} levels")
    for node in sp.preorder_traversal(expr):
        if not isinstance(node, _SUPPORTED_CLASSES):
            name = getattr(node, "func", type(node)).__name__
            raise ModelDefinitionError(
                f"{name} is not part of the equation language{label} (in {node}); allowed functions are "
                f"{sorted(ALLOWED_FUNCTIONS)}, with comparisons only in conditions"
            )
        if isinstance(node, sp.Float) and node._prec != 53:
            raise ModelDefinitionError(
                f"the constant {node} has {node._prec} bits of precision{label}; pgpgm computes in 64-bit floats "
                "(53 bits), so the compiled kernels, the density and a saved result could not all use it: write "
                "a Python float (e.g. 2.000000000000001) or an exact fraction (sympy.Rational('2.0000000000000000001'))"
            )
        if isinstance(node, sp.Piecewise) and node.args[-1].cond is not sp.true:
            raise ModelDefinitionError(
                f"a Piecewise without an 'otherwise' piece (condition True){label} is not supported: {node}"
            )
    _check_finite(expr, label)


def _sympy_depth(expr: sp.Basic) -> int:
    """Depth of a sympy expression tree (iterative)."""
    deepest, stack = 0, [(expr, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((a, d + 1) for a in node.args)
    return deepest


class _EquationPrinter(StrPrinter):
    """Prints sympy expressions in the equation language (the inverse of the parser)."""

    def _print_Float(self, expr: sp.Float) -> str:
        if expr._prec != 53 or not math.isfinite(float(expr)):
            raise ModelDefinitionError(
                f"the constant {expr} (precision {expr._prec} bits) cannot be written exactly; use 64-bit "
                "floats or exact fractions (sympy.Rational)"
            )
        return repr(float(expr))

    def _print_Abs(self, expr: sp.Abs) -> str:
        return f"abs({self._print(expr.args[0])})"

    def _print_Min(self, expr: sp.Min) -> str:
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_Max(self, expr: sp.Max) -> str:
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        *pieces, (otherwise, last) = expr.args
        if last is not sp.true:
            raise ModelDefinitionError(f"a Piecewise without an 'otherwise' piece cannot be written: {expr}")
        parts = [f"{self._print(c)}, {self._print(e)}" for e, c in pieces]
        return f"where({', '.join(parts)}, {self._print(otherwise)})"

    def _print_Not(self, expr: sp.Not) -> str:
        return f"(not ({self._print(expr.args[0])}))"

    def emptyPrinter(self, expr) -> str:
        raise ModelDefinitionError(f"{expr!r} cannot be written in the equation language")

    def _print_Function(self, expr) -> str:
        if type(expr) not in _SUPPORTED_CLASSES:
            raise ModelDefinitionError(f"{expr.func.__name__} is not part of the equation language: {expr}")
        return super()._print_Function(expr)


def format_expression(expr: sp.Expr) -> str:
    """Write ``expr`` in the equation language, so that parsing the string gives ``expr`` back.

    Raises
    ------
    ModelDefinitionError
        If ``expr`` uses something the language cannot spell (see :func:`check_expression`).
    """
    check_expression(expr)
    return _EquationPrinter({"full_prec": True}).doprint(expr)


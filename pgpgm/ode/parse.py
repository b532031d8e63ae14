"""Safe parsing of right-hand-side equation strings into sympy expressions.

Only numbers, declared names, the time ``t``, arithmetic (``+ - * / **``, unary
minus) and a whitelist of math functions are accepted. The string is parsed with
:mod:`ast` and translated node by node; nothing is ever evaluated by Python.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

import sympy as sp

from ..errors import ModelDefinitionError

#: Functions an equation string may call, by name.
ALLOWED_FUNCTIONS: Mapping[str, sp.Function] = {
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
#: Named constants an equation string may use.
ALLOWED_CONSTANTS: Mapping[str, sp.Expr] = {"pi": sp.pi, "E": sp.E}

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}


def parse_expression(text: str, symbols: Mapping[str, sp.Symbol], *, where: str = "") -> sp.Expr:
    """Translate one equation string into a sympy expression.

    Parameters
    ----------
    text
        The right-hand side, e.g. ``"theta1*x1 - theta2*x1*x2"``.
    symbols
        Every name the string may use (states, parameters, ``t``) mapped to its symbol.
    where
        Context for error messages (e.g. ``"equation for x1"``).

    Raises
    ------
    ModelDefinitionError
        If the string is not a single arithmetic expression of declared names.
    """
    label = f" in the {where}" if where else ""
    if not isinstance(text, str) or not text.strip():
        raise ModelDefinitionError(f"empty or non-string expression{label}: {text!r}")
    if "^" in text:
        raise ModelDefinitionError(f"'^' is not a power{label}: {text!r}; write '**' instead")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ModelDefinitionError(
            f"not an arithmetic expression{label}: {text!r} ({exc.msg}); an equation's "
            "right-hand side must be a single expression such as 'a*x - b*x*y'"
        ) from None

    def visit(node: ast.AST) -> sp.Expr:
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise ModelDefinitionError(f"only numeric constants are allowed{label}: {node.value!r}")
            return sp.Float(node.value) if isinstance(node.value, float) else sp.Integer(node.value)
        if isinstance(node, ast.Name):
            if node.id in symbols:
                return symbols[node.id]
            if node.id in ALLOWED_CONSTANTS:
                return ALLOWED_CONSTANTS[node.id]
            raise ModelDefinitionError(
                f"unknown name {node.id!r}{label}; declared names are {sorted(symbols)}"
            )
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](visit(node.left), visit(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = visit(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in ALLOWED_FUNCTIONS:
                raise ModelDefinitionError(
                    f"call of {ast.unparse(node.func)!r} is not allowed{label}; "
                    f"allowed functions are {sorted(ALLOWED_FUNCTIONS)}"
                )
            if node.keywords or len(node.args) != 1:
                raise ModelDefinitionError(f"{name}() takes exactly one positional argument{label}")
            return ALLOWED_FUNCTIONS[name](visit(node.args[0]))
        raise ModelDefinitionError(
            f"{type(node).__name__} is not allowed{label}: {ast.unparse(node)!r}; only numbers, "
            "declared names, + - * / ** and whitelisted functions may appear"
        )

    return visit(tree)

"""Model definition: one symbolic ODE system that feeds every backend.

An :class:`ODESystem` holds named states, named parameters and one sympy
expression per state (dx/dt = f(t, x, theta)). From that single definition it
derives exact state and parameter Jacobians, numba-compiled numeric kernels (used
by the CVODE backends and by the sampler), and PyTensor expressions (used by the
PyMC density).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import numpy as np
import sympy as sp

from .parse import ALLOWED_CONSTANTS, ALLOWED_FUNCTIONS, parse_expression
from ..errors import ModelDefinitionError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = {"t"} | set(ALLOWED_FUNCTIONS) | set(ALLOWED_CONSTANTS)


def _check_names(states: Sequence[str], parameters: Sequence[str]) -> None:
    if not states:
        raise ModelDefinitionError("an ODE system needs at least one state")
    for kind, names in (("state", states), ("parameter", parameters)):
        for n in names:
            if not isinstance(n, str) or not _NAME.match(n) or keyword.iskeyword(n):
                raise ModelDefinitionError(f"{kind} name {n!r} is not a valid identifier")
            if n in _RESERVED:
                raise ModelDefinitionError(f"{kind} name {n!r} is reserved (time or a function name)")
    all_names = list(states) + list(parameters)
    dupes = sorted({n for n in all_names if all_names.count(n) > 1})
    if dupes:
        raise ModelDefinitionError(f"names used more than once among states and parameters: {dupes}")


class _Names(SimpleNamespace):
    """Attribute (``y.x1``) and index (``y[0]``) access to symbols, for ``rhs(t, y, p)``."""

    def __init__(self, names: Sequence[str], symbols: Sequence[sp.Symbol]):
        super().__init__(**dict(zip(names, symbols)))
        self._order = list(symbols)

    def __getitem__(self, i: int) -> sp.Symbol:
        return self._order[i]

    def __len__(self) -> int:
        return len(self._order)


@dataclass(frozen=True, eq=False)
class ODESystem:
    """An ODE system dx/dt = f(t, x, theta) with named states and parameters.

    Build it with :meth:`from_equations` (strings) or :meth:`from_function` (a Python
    function of sympy symbols). Instances are immutable; derived kernels are cached.

    Attributes
    ----------
    states : tuple of str
        State names, in the order of the state vector (length S).
    parameters : tuple of str
        Parameter names, in the order of the parameter vector theta (length P).
    expressions : tuple of sympy.Expr
        f_i(t, x, theta) for each state, in state order.
    name : str
        A label used in outputs.
    """

    states: tuple[str, ...]
    parameters: tuple[str, ...]
    expressions: tuple[sp.Expr, ...]
    name: str = "ode"

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_equations(
        cls, equations: Mapping[str, str], parameters: Sequence[str], *, name: str = "ode"
    ) -> ODESystem:
        """Define a system from equation strings, one per state.

        Parameters
        ----------
        equations
            ``{state: rhs}``, e.g. ``{"x1": "theta1*x1 - theta2*x1*x2", ...}``; the
            dict order is the state order. Allowed: numbers, declared names, ``t``,
            ``+ - * / **``, and ``exp log sqrt sin cos tan sinh cosh tanh asin acos
            atan abs``. Anything else raises :class:`ModelDefinitionError`.
        parameters
            Parameter names, in the order of theta.
        """
        if not isinstance(equations, Mapping) or not equations:
            raise ModelDefinitionError("equations must be a non-empty mapping {state: expression}")
        states = tuple(equations)
        parameters = tuple(parameters)
        _check_names(states, parameters)
        symbols = {n: sp.Symbol(n, real=True) for n in (*states, *parameters, "t")}
        exprs = tuple(
            parse_expression(equations[s], symbols, where=f"equation for {s}") for s in states
        )
        return cls(states, parameters, exprs, name)

    @classmethod
    def from_function(
        cls,
        rhs: Callable[[Any, Any, Any], Sequence[Any] | Mapping[str, Any]],
        states: Sequence[str],
        parameters: Sequence[str],
        *,
        name: str = "ode",
    ) -> ODESystem:
        """Define a system from a Python function ``rhs(t, y, p)``.

        ``y`` and ``p`` give the states and parameters as sympy symbols, by attribute
        (``y.x1``, ``p.theta1``) or index; ``rhs`` returns one expression per state
        (a sequence in state order, or a dict by state name). Use operators and sympy
        functions (``sympy.exp``), not numpy ones.
        """
        states, parameters = tuple(states), tuple(parameters)
        _check_names(states, parameters)
        sym = {n: sp.Symbol(n, real=True) for n in (*states, *parameters, "t")}
        y = _Names(states, [sym[s] for s in states])
        p = _Names(parameters, [sym[q] for q in parameters])
        out = rhs(sym["t"], y, p)
        if isinstance(out, Mapping):
            missing = set(states) - set(out)
            extra = set(out) - set(states)
            if missing or extra:
                raise ModelDefinitionError(f"rhs returned keys {sorted(out)}; expected states {list(states)}")
            out = [out[s] for s in states]
        out = list(out)
        if len(out) != len(states):
            raise ModelDefinitionError(f"rhs returned {len(out)} expressions for {len(states)} states")
        exprs = []
        allowed = set(sym.values())
        for s, e in zip(states, out):
            try:
                e = sp.sympify(e, strict=True)
            except (sp.SympifyError, TypeError) as exc:
                raise ModelDefinitionError(f"rhs for {s} is not a symbolic expression: {e!r}") from exc
            unknown = e.free_symbols - allowed
            if unknown:
                raise ModelDefinitionError(f"rhs for {s} uses undeclared symbols {sorted(map(str, unknown))}")
            exprs.append(e)
        return cls(states, parameters, tuple(exprs), name)

    # ----------------------------------------------------------------- symbols
    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_parameters(self) -> int:
        return len(self.parameters)

    @cached_property
    def _symbols(self) -> tuple[sp.Symbol, tuple[sp.Symbol, ...], tuple[sp.Symbol, ...]]:
        free = set().union(*(e.free_symbols for e in self.expressions))
        by_name = {s.name: s for s in free}
        get = lambda n: by_name.get(n, sp.Symbol(n, real=True))  # noqa: E731
        return get("t"), tuple(map(get, self.states)), tuple(map(get, self.parameters))

    @cached_property
    def state_jacobian(self) -> sp.Matrix:
        """Exact df_i/dx_j, shape (S, S)."""
        _, x, _ = self._symbols
        return sp.Matrix(self.expressions).jacobian(x)

    @cached_property
    def parameter_jacobian(self) -> sp.Matrix:
        """Exact df_i/dtheta_k, shape (S, P)."""
        _, _, p = self._symbols
        if not p:
            return sp.zeros(self.n_states, 0)
        return sp.Matrix(self.expressions).jacobian(p)

    def index_of_states(self, names: Sequence[str]) -> list[int]:
        """Positions of ``names`` in the state vector; unknown names raise a clear error."""
        if isinstance(names, str):
            names = [names]
        unknown = [n for n in names if n not in self.states]
        if unknown:
            raise ModelDefinitionError(f"unknown state name(s) {unknown}; the states are {list(self.states)}")
        if len(set(names)) != len(names):
            raise ModelDefinitionError(f"state names repeated in {list(names)}")
        return [self.states.index(n) for n in names]

    # ----------------------------------------------------------------- numeric kernels
    @cached_property
    def compiled(self):
        """Numba-compiled kernels (see :mod:`pgpgm.ode.codegen`), built on first use."""
        from .codegen import compile_kernels

        return compile_kernels(self)

    def rhs(self, t: float, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """f(t, x, theta) as a float array of shape (S,)."""
        out = np.empty(self.n_states)
        self.compiled.rhs(float(t), np.asarray(x, float), np.asarray(theta, float), out)
        return out

    def jacobian(self, t: float, x: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact (df/dx of shape (S, S), df/dtheta of shape (S, P)) at one point."""
        jx = np.zeros((self.n_states, self.n_states))
        jp = np.zeros((self.n_states, self.n_parameters))
        x = np.asarray(x, float)
        theta = np.asarray(theta, float)
        self.compiled.jac_x(float(t), x, theta, jx)
        self.compiled.jac_p(float(t), x, theta, jp)
        return jx, jp

    def rhs_on_grid(self, t: np.ndarray, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """f evaluated at many time points: ``x`` has shape (N, S); returns (N, S)."""
        x = np.ascontiguousarray(x, float)
        out = np.empty_like(x)
        self.compiled.rhs_grid(np.asarray(t, float), x, np.asarray(theta, float), out)
        return out

    def pytensor_rhs(self, t, states: Mapping[str, Any], theta) -> list:
        """f as PyTensor expressions, element-wise over time points.

        Parameters
        ----------
        t : tensor of shape (N,)
        states : mapping state name -> tensor of shape (N,)
        theta : tensor of shape (P,)

        Returns
        -------
        list of S tensors of shape (N,), in state order.
        """
        import pytensor.tensor as pt

        ts, xs, ps = self._symbols
        subs = {ts: t, **{s: states[s.name] for s in xs}}
        subs.update({p: theta[i] for i, p in enumerate(ps)})
        return [_to_pytensor(e, subs, pt) for e in self.expressions]

    def __reduce__(self):  # derived kernels (compiled code) are rebuilt, not pickled
        return (type(self), (self.states, self.parameters, self.expressions, self.name))

    def __repr__(self) -> str:
        eqs = ", ".join(f"d{s}/dt = {e}" for s, e in zip(self.states, self.expressions))
        return f"ODESystem({self.name!r}: {eqs}; parameters {list(self.parameters)})"


_PT_FUNCS = {
    sp.exp: "exp", sp.log: "log", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan",
    sp.sinh: "sinh", sp.cosh: "cosh", sp.tanh: "tanh", sp.asin: "arcsin",
    sp.acos: "arccos", sp.atan: "arctan", sp.Abs: "abs",
}


def _to_pytensor(expr: sp.Expr, subs: Mapping[sp.Symbol, Any], pt) -> Any:
    """Translate a sympy expression tree into PyTensor operations."""
    if expr in subs:
        return subs[expr]
    if expr.is_Number or expr in (sp.pi, sp.E):
        return pt.constant(float(expr))
    args = [_to_pytensor(a, subs, pt) for a in expr.args]
    if expr.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if expr.is_Pow:
        base, exp_ = expr.args
        if exp_ == sp.Rational(1, 2):
            return pt.sqrt(args[0])
        if exp_.is_Integer and abs(int(exp_)) <= 4:
            return args[0] ** int(exp_)
        return args[0] ** args[1]
    if expr.func in _PT_FUNCS:
        return getattr(pt, _PT_FUNCS[expr.func])(*args)
    raise ModelDefinitionError(f"cannot translate {expr.func} to PyTensor")

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import numpy as np
import sympy as sp

from ..checks import as_float_array
from ..errors import DataError, ModelDefinitionError
from .breakpoints import TimeSwitch, breakpoints_between, find_time_switches
from .functions import ModelKernels, compile_kernels
from .parse import (
    ALLOWED_CONSTANTS,
    ALLOWED_FUNCTIONS,
    check_expression,
    format_expression,
    parse_expression,
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = {"t"} | set(ALLOWED_FUNCTIONS) | set(ALLOWED_CONSTANTS)


def _names(kind: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of strings; a plain string or a non-sequence is a ModelDefinitionError."""
    if isinstance(names, str | bytes):
        raise ModelDefinitionError(
            f"{kind} must be a list of names, not the string {names!r:.100}; write [{names!r:.100}] for a "
            "single name, or list each name separately"
        )
    if isinstance(names, Mapping) or not isinstance(names, Iterable):
        raise ModelDefinitionError(f"{kind} must be a list of names, got {type(names).__name__} {names!r:.100}")
    return tuple(names)


def _check_names(states: Sequence[str], parameters: Sequence[str]) -> None:
    if not states:
        raise ModelDefinitionError("an ODE system needs at least one state")
    for kind, names in (("state", states), ("parameter", parameters)):
        for n in names:
            if not isinstance(n, str) or not _NAME.match(n) or keyword.iskeyword(n):
                raise ModelDefinitionError(f"{kind} name {n!r:.100} is not a valid identifier")
            if n in _RESERVED:
                raise ModelDefinitionError(f"{kind} name {n!r} is reserved (time, a function or a constant)")
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
            dict order is the state order. Allowed: numbers, declared names, the time
            ``t``, ``pi``, ``E``, ``+ - * / **``, the functions ``exp log sqrt sin cos
            tan sinh cosh tanh asin acos atan abs``, ``min(a, b, ...)``,
            ``max(a, b, ...)`` and conditionals ``where(t < 2, dose, 0)`` (see
            :mod:`pgpgm.ode.parse`). Anything else raises :class:`ModelDefinitionError`.
        parameters
            Parameter names, in the order of theta (a list, not one string).
        """
        if not isinstance(equations, Mapping) or not equations:
            raise ModelDefinitionError("equations must be a non-empty mapping {state: expression}")
        states = tuple(equations)
        parameters = _names("parameters", parameters)
        _check_names(states, parameters)
        symbols = {n: sp.Symbol(n, real=True) for n in (*states, *parameters, "t")}
        exprs = tuple(
            parse_expression(equations[s], symbols, where=f"equation for {s}") for s in states
        )
        return cls(states, parameters, exprs, _label(name))

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
        states, parameters = _names("states", states), _names("parameters", parameters)
        _check_names(states, parameters)
        sym = {n: sp.Symbol(n, real=True) for n in (*states, *parameters, "t")}
        y = _Names(states, [sym[s] for s in states])
        p = _Names(parameters, [sym[q] for q in parameters])
        try:
            out = rhs(sym["t"], y, p)
        except (TypeError, AttributeError, ValueError, ArithmeticError) as exc:
            hint = ("use sympy functions (sympy.exp, sympy.sin, ...) and operators on y and p, not math or numpy "
                    "ones: the arguments are sympy symbols, not numbers") if isinstance(exc, TypeError) else \
                (f"y has the states {list(states)}, p the parameters {list(parameters)} (by name or index)"
                 if isinstance(exc, AttributeError | IndexError) else "the arguments are sympy symbols")
            raise ModelDefinitionError(f"rhs(t, y, p) failed with {type(exc).__name__}: {exc}; {hint}") from exc
        if out is None:
            raise ModelDefinitionError(
                f"rhs(t, y, p) returned None; it must return a list of {len(states)} expressions, one per state "
                f"{list(states)} (or a dict by state name): is a 'return' missing?")
        if isinstance(out, sp.Basic) or not isinstance(out, Mapping | Iterable):
            raise ModelDefinitionError(
                f"rhs(t, y, p) returned {type(out).__name__} {str(out)[:80]!r}; it must return a list of "
                f"{len(states)} expressions, one per state {list(states)} (or a dict by state name), e.g. [-p.k * y.x]")
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
                raise ModelDefinitionError(f"rhs for {s} is not a symbolic expression: {e!r:.100}; return sympy "
                                           "expressions of y and p (sympy functions, not math or numpy ones)") from exc
            unknown = e.free_symbols - allowed
            if unknown:
                raise ModelDefinitionError(f"rhs for {s} uses undeclared symbols {sorted(map(str, unknown))}")
            check_expression(e, where=f"rhs for {s}")
            exprs.append(e)
        return cls(states, parameters, tuple(exprs), _label(name))

    # ----------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """The system as plain data that :meth:`from_dict` reads back to an identical system.

        Returns
        -------
        dict
            ``{"name": str, "states": [str], "parameters": [str], "equations": {state: str}}``;
            each equation string parses (with the safe parser, nothing evaluated) to the
            very same sympy expression: exact fractions stay fractions, 64-bit floats are
            written with every digit they need, ``where``/``min``/``max``/``abs`` keep
            their form.

        Raises
        ------
        ModelDefinitionError
            If an expression cannot be written exactly (only possible for systems built
            by :meth:`from_function` with sympy Floats of other than 64-bit precision).
        """
        equations = {s: format_expression(e) for s, e in zip(self.states, self.expressions)}
        back = ODESystem.from_equations(equations, self.parameters, name=self.name)
        lost = [s for s, a, b in zip(self.states, self.expressions, back.expressions) if a != b]
        if lost:
            raise ModelDefinitionError(f"the equations for {lost} do not read back identically from {equations}")
        return {"name": self.name, "states": list(self.states), "parameters": list(self.parameters),
                "equations": equations}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ODESystem:
        """The system written by :meth:`to_dict` (equations parsed safely, nothing evaluated)."""
        if not isinstance(data, Mapping):
            raise ModelDefinitionError(f"a system is stored as a mapping, got {type(data).__name__}")
        known = {"name", "states", "parameters", "equations"}
        unknown = sorted(set(data) - known)
        missing = sorted({"parameters", "equations"} - set(data))
        if unknown or missing:
            raise ModelDefinitionError(
                f"a stored system has the keys {sorted(known)}; unknown {unknown}, missing {missing}"
            )
        equations = data["equations"]
        if not isinstance(equations, Mapping):
            raise ModelDefinitionError(f"'equations' must map state names to strings, got {type(equations).__name__}")
        if "states" in data and list(_names("states", data["states"])) != list(equations):
            raise ModelDefinitionError(
                f"'states' {list(data['states'])} do not match the equations' states {list(equations)}"
            )
        return cls.from_equations(equations, data["parameters"], name=data.get("name", "ode"))

    # ----------------------------------------------------------------- symbols
    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_parameters(self) -> int:
        return len(self.parameters)

    @cached_property
    def symbols(self) -> tuple[sp.Symbol, tuple[sp.Symbol, ...], tuple[sp.Symbol, ...]]:
        """The sympy symbols of the equations: (time, the states (S,), the parameters (P,))."""
        free = set().union(*(e.free_symbols for e in self.expressions))
        by_name = {s.name: s for s in free}
        get = lambda n: by_name.get(n, sp.Symbol(n, real=True))
        return get("t"), tuple(map(get, self.states)), tuple(map(get, self.parameters))

    @cached_property
    def state_jacobian(self) -> sp.Matrix:
        """Exact df_i/dx_j, shape (S, S)."""
        _, x, _ = self.symbols
        return sp.Matrix(self.expressions).jacobian(x)

    @cached_property
    def parameter_jacobian(self) -> sp.Matrix:
        """Exact df_i/dtheta_k, shape (S, P)."""
        _, _, p = self.symbols
        if not p:
            return sp.zeros(self.n_states, 0)
        return sp.Matrix(self.expressions).jacobian(p)

    def linear_in(self, indices: Sequence[int]) -> bool:
        """Whether f is affine in the states at ``indices`` (positions in the state vector):
        no df_i/dx_j, j in ``indices``, depends on those states (the block scheme's Gaussian of
        the observed states is then exact, wherever f is linearised)."""
        _, x, _ = self.symbols
        chosen = [x[j] for j in indices]
        for e in self.expressions:
            if not e.free_symbols & set(chosen):
                continue
            try:  # a polynomial in the chosen states (any coefficients) of degree <= 1
                if sp.Poly(e, *chosen).total_degree() > 1:
                    return False
            except sp.PolynomialError:  # exp(x), x**0.5, a where() (Piecewise) of x, ...
                return False
        return True

    def keeps_sign(self, index: int) -> bool:
        """Whether the equations keep the sign of the state at ``index``: its right-hand side vanishes
        identically where that state is 0 (a population, an infection, a species made only from
        itself: dI/dt = beta S I / N - gamma I). Its axis is then invariant, so a solution that
        starts with the state positive keeps it positive, and a negative initial value describes a
        solution negative throughout."""
        _, x, _ = self.symbols
        at_zero = self.expressions[index].subs(x[index], 0)
        return bool(at_zero == 0 or sp.simplify(at_zero) == 0)

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

    def fix(self, values: Mapping[str, float]) -> ODESystem:
        """The system with some parameters replaced by numbers (they are no longer parameters).

        Parameters
        ----------
        values : ``{parameter: value}``; each value a finite real number, substituted as an
            exact 64-bit float

        Raises
        ------
        DataError : for a name that is not a parameter, or a value that is not a finite number.
        """

        if not isinstance(values, Mapping):
            raise DataError(f"fixed must be a mapping {{parameter: value}}, got {type(values).__name__}")
        unknown = [k for k in values if k not in self.parameters]
        if unknown:
            raise DataError(f"fixed names {unknown}, which are not parameters of {self.name} {list(self.parameters)}")
        subs = {}
        _, _, syms = self.symbols
        for k, v in values.items():
            x = as_float_array(v, f"fixed[{k}]")
            if x.ndim != 0 or not np.isfinite(x):
                raise DataError(f"fixed[{k}] must be one finite number, got {v!r}")
            subs[syms[self.parameters.index(k)]] = sp.Float(float(x), precision=53)
        exprs = tuple(e.xreplace(subs) for e in self.expressions)
        return ODESystem(self.states, tuple(p for p in self.parameters if p not in values), exprs, self.name)

    # ----------------------------------------------------------------- time switches
    @cached_property
    def time_switches(self) -> tuple[TimeSwitch, ...]:
        """The functions of time alone whose sign changes switch the right-hand side (conditions
        of ``where``, ``min``/``max``/``abs`` of t), with their zeros: see
        :mod:`pgpgm.ode.breakpoints` (switches that involve a state or a parameter are not listed)."""
        return find_time_switches(self.expressions, self.symbols[0])

    def breakpoints(self, start: float, stop: float) -> np.ndarray:
        """The times strictly inside (start, stop) at which the right-hand side switches in time:
        array (B,), sorted (empty for most models). The solvers stop and restart at each."""
        return breakpoints_between(self.time_switches, self.symbols[0], float(start), float(stop))

    # ----------------------------------------------------------------- numeric kernels
    @cached_property
    def compiled(self) -> ModelKernels:
        """Numba-compiled kernels (see :mod:`pgpgm.ode.functions`), built on first use."""
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

        Notes
        -----
        The translation is done by ``sympytensor`` (every function of the equation
        language: ``where`` becomes ``pt.switch``, ``min``/``max`` ``pt.minimum``/
        ``pt.maximum``, comparisons and ``&``/``|`` their element-wise counterparts).
        """
        import pytensor.tensor as pt

        ts, xs, ps = self.symbols
        given = {ts: pt.as_tensor_variable(t)}
        given.update({x: pt.as_tensor_variable(states[x.name]) for x in xs})
        given.update({q: pt.as_tensor_variable(theta)[k] for k, q in enumerate(ps)})
        dtypes = {sym: v.dtype for sym, v in given.items()}
        shapes = {sym: v.type.shape for sym, v in given.items()}
        outs = []
        for e in self.expressions:
            # One printer per equation (no node shared between equations, as the graph was always
            # built), its cache primed with the given tensors under the keys sympytensor documents
            # for symbols: (name, type, args, dtype, shape, dummy_index).
            cache = {(sym.name, type(sym), sym.args, dtypes[sym], shapes[sym], None): v for sym, v in given.items()}
            printer = _pytensor_printer(cache)
            outs.append(pt.as_tensor_variable(printer.doprint(e, dtypes=dtypes, broadcastables=shapes)))
            if len(cache) != len(given):
                raise ModelDefinitionError(f"sympytensor made variables {list(cache)[len(given):]} for {e}")
        dtype = given[ts].dtype
        n = given[ts].shape[0]
        outs = [o if o.dtype == dtype else pt.cast(o, dtype) for o in outs]
        return [o if o.type.ndim == 1 else pt.broadcast_to(o, (n,)) for o in outs]

    def __reduce__(self):  # derived kernels (compiled code) are rebuilt, not pickled
        return (type(self), (self.states, self.parameters, self.expressions, self.name))

    def __repr__(self) -> str:
        eqs = ", ".join(f"d{s}/dt = {e}" for s, e in zip(self.states, self.expressions))
        return f"ODESystem({self.name!r}: {eqs}; parameters {list(self.parameters)})"


def _label(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ModelDefinitionError(f"a system's name must be a non-empty string, got {name!r:.100}")
    return name


def _pytensor_printer(cache: dict):
    """A sympytensor printer with its own ``cache``, building sums, products and powers as
    pgpgm always has (left-to-right binary operations, ``sqrt`` for ``**(1/2)``), so the
    density's graph and its gradient stay bit-for-bit what they were."""
    from functools import reduce

    import pytensor.tensor as pt
    from sympytensor.pytensor import PytensorPrinter

    class Printer(PytensorPrinter):
        def _print_Add(self, expr, **kwargs):
            return reduce(lambda a, b: a + b, [self._print(a, **kwargs) for a in expr.args])

        def _print_Mul(self, expr, **kwargs):
            return reduce(lambda a, b: a * b, [self._print(a, **kwargs) for a in expr.args])

        def _print_Pow(self, expr, **kwargs):
            base = pt.as_tensor_variable(self._print(expr.base, **kwargs))
            if expr.exp == sp.S.Half:
                return pt.sqrt(base)
            if expr.exp.is_Integer and abs(int(expr.exp)) <= 4:
                return base ** int(expr.exp)
            if expr.exp.is_number:
                return base ** pt.constant(float(expr.exp))
            return base ** pt.as_tensor_variable(self._print(expr.exp, **kwargs))

    return Printer(cache=cache)

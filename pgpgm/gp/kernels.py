"""GP kernels that own their hyperparameters, with the derivative covariances gradient matching needs.

A kernel is one sympy expression k(a, b; h) in two time points a, b and its
hyperparameters h (all positive), plus one :class:`Hyperparameter` per entry of h
that says what the entry is (signal variance, time scale, other), its bounds and its
starting guess for the fit. Bounds and guesses may scale with the data's time grid
(:class:`Scaled`, a multiple of the span or of the smallest spacing), so a kernel
carries sensible defaults for any time unit.

Every derivative - dk/da, dk/db, d2k/(da db) and dk/dh - is derived symbolically and
compiled to numpy with :func:`sympy.lambdify` (common subexpressions shared). A
stationary kernel (k a function of tau = a - b only) is evaluated from time
differences (only the N lags on evenly spaced times); large matrices are filled in
cache-sized blocks of rows. The matrices of the marginal-likelihood fit, K and every
dK/dh, are otherwise (N >= 200) written by one numba loop over the pairs of times generated from
the expressions (:func:`_pairs_source`; cached on disk like the ODE kernels), with no
temporaries (sigmoid at N = 1000: 3-4x faster than numpy). A user adds a kernel by writing only k
(:meth:`Kernel.from_expression`); kernels add and multiply (``k1 + k2``, ``k1 * k2``).
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
import sympy as sp

from ..codegen import cache as kernel_cache
from ..codegen.printer import PRINTER, kernel_expr
from ..errors import DataError, ModelDefinitionError
from ..ode.parse import parse_expression

_a, _b = sp.symbols("a b", real=True)
_tau = sp.Symbol("tau", real=True)

Kind = Literal["variance", "lengthscale", "other"]


@dataclass(frozen=True)
class TimeGrid:
    """What default bounds and guesses of time-like hyperparameters scale with.

    Attributes
    ----------
    span : t[-1] - t[0] (time units)
    min_spacing : smallest distance between consecutive times (time units)
    """

    span: float
    min_spacing: float

    @classmethod
    def from_times(cls, t) -> TimeGrid:
        """The grid of sorted times ``t`` (N,), N >= 2."""
        t = np.asarray(t, dtype=float)
        return cls(float(t[-1] - t[0]), float(np.min(np.diff(t))))


@dataclass(frozen=True)
class Scaled:
    """A bound or guess that is a multiple of a power of a property of the time grid.

    ``Scaled("span", 10.0)`` is 10 (t[-1] - t[0]); ``Scaled("min_spacing", 0.5)`` is half
    the smallest spacing of the times; ``Scaled("span", 10.0, power=-2)`` is 10 / span^2
    (for a hyperparameter in 1 / time^2). Picklable, unlike a lambda.

    Attributes
    ----------
    quantity : ``"span"`` or ``"min_spacing"``
    factor : positive multiplier (units: time^-power times those of the hyperparameter)
    power : real exponent of the quantity (1: a time scale; -2: an inverse squared time)
    """

    quantity: Literal["span", "min_spacing"]
    factor: float
    power: float = 1.0

    def __post_init__(self) -> None:
        if self.quantity not in ("span", "min_spacing"):
            raise ModelDefinitionError(f"Scaled quantity must be 'span' or 'min_spacing', got {self.quantity!r}")
        if not (np.isfinite(self.factor) and self.factor > 0):
            raise ModelDefinitionError(f"Scaled factor must be positive and finite, got {self.factor!r}")
        if not (isinstance(self.power, int | float) and np.isfinite(self.power)):
            raise ModelDefinitionError(f"Scaled power must be a finite number, got {self.power!r}")

    def __call__(self, grid: TimeGrid) -> float:
        return self.factor * getattr(grid, self.quantity) ** self.power

    def __repr__(self) -> str:
        return f"{self.factor:g}*{self.quantity}" + ("" if self.power == 1 else f"^{self.power:g}")


Bound = float | Scaled | Callable[[TimeGrid], float]


def _value(spec: Bound, grid: TimeGrid) -> float:
    return float(spec(grid)) if callable(spec) else float(spec)


@dataclass(frozen=True)
class Hyperparameter:
    """One kernel hyperparameter: its name, what it is, its fit bounds and starting guess.

    Bounds and guess apply to the fit of the *standardised* series ((y - mean) / sd):
    a variance is relative to the data variance (dimensionless), a time scale is in
    the time units of the data. Each may be a number or a function of the
    :class:`TimeGrid` (e.g. :class:`Scaled`).

    Attributes
    ----------
    name : symbol name in the kernel expression (a Python identifier, not ``a``/``b``)
    bounds : (lower, upper), 0 < lower < upper
    guess : first starting value of the optimiser (clipped into the bounds)
    kind : ``"variance"`` (multiplies k; reported times the data variance),
        ``"lengthscale"`` (a time scale) or ``"other"``
    """

    name: str
    bounds: tuple[Bound, Bound]
    guess: Bound = 1.0
    kind: Kind = "other"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier() or keyword.iskeyword(self.name) \
                or self.name in ("a", "b", "tau"):
            raise ModelDefinitionError(f"hyperparameter name {self.name!r} must be a Python identifier other than "
                                       "'a', 'b' and 'tau' (the time points and their difference)")
        if self.kind not in ("variance", "lengthscale", "other"):
            raise ModelDefinitionError(f"hyperparameter {self.name}: kind must be 'variance', 'lengthscale' or "
                                       f"'other', got {self.kind!r}")
        if isinstance(self.bounds, list):
            object.__setattr__(self, "bounds", tuple(self.bounds))
        if not isinstance(self.bounds, tuple) or len(self.bounds) != 2:
            raise ModelDefinitionError(f"hyperparameter {self.name}: bounds must be a tuple (lower, upper), "
                                       f"got {self.bounds!r}")
        for spec in (*self.bounds, self.guess):
            if not callable(spec) and not (isinstance(spec, int | float) and np.isfinite(spec) and spec > 0):
                raise ModelDefinitionError(f"hyperparameter {self.name}: bounds and guess must be positive numbers "
                                           f"or functions of the time grid, got {spec!r}")
        lo, hi = self.bounds
        if not callable(lo) and not callable(hi) and not lo < hi:
            raise ModelDefinitionError(f"hyperparameter {self.name}: lower bound {lo} must be below upper bound {hi}")

    @classmethod
    def variance(cls, name: str = "variance") -> Hyperparameter:
        """A signal variance: bounds (1e-2, 1e2) x data variance, guess the data variance."""
        return cls(name, (1e-2, 1e2), 1.0, "variance")

    @classmethod
    def lengthscale(cls, name: str = "lengthscale") -> Hyperparameter:
        """A time scale: bounds (0.5 x smallest spacing, 10 x span), guess 0.1 x span."""
        return cls(name, (Scaled("min_spacing", 0.5), Scaled("span", 10.0)), Scaled("span", 0.1), "lengthscale")

    def resolve(self, grid: TimeGrid) -> tuple[float, float, float]:
        """(lower, upper, guess) on the time grid ``grid``; the guess is not yet clipped."""
        lo, hi = (_value(s, grid) for s in self.bounds)
        guess = _value(self.guess, grid)
        if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi) or not (np.isfinite(guess) and guess > 0):
            raise DataError(f"hyperparameter {self.name}: bounds ({lo}, {hi}) and guess {guess} on this time grid "
                            f"(span {grid.span}, smallest spacing {grid.min_spacing}) must be positive with "
                            "lower < upper; give the kernel numeric bounds")
        return lo, hi, guess

    def renamed(self, name: str) -> Hyperparameter:
        return Hyperparameter(name, self.bounds, self.guess, self.kind)


NOISE = Hyperparameter("noise_sd", (1e-2, 1.0), 0.1)
"""Bounds and guess of the noise sd relative to the data sd (>= 1 %: noise is not interpolated)."""


def _clean(expr: sp.Expr) -> sp.Expr:
    """Drop distributional terms of |a-b| derivatives (valid for kernels smooth at a=b)."""
    expr = expr.replace(sp.DiracDelta, lambda *args: sp.S.Zero)
    if not expr.has(sp.sign):
        return expr
    expr = sp.expand(expr)
    return expr.replace(
        lambda e: e.is_Pow and e.base.func == sp.sign and e.exp.is_Integer,
        lambda e: sp.S.One if e.exp.is_even else e.base,
    )


def _as_hyperparameters(name: str, specs: Sequence[Hyperparameter | str]) -> tuple[Hyperparameter, ...]:
    out = []
    for i, s in enumerate(specs):
        if isinstance(s, Hyperparameter):
            out.append(s)
        elif isinstance(s, str) and i == 0:
            out.append(Hyperparameter.variance(s))
        elif isinstance(s, str):
            raise ModelDefinitionError(
                f"kernel {name}: hyperparameter {s!r} is a bare name, so its fit bounds are unknown. Say what it is: "
                f"Hyperparameter.lengthscale({s!r}) for a time scale, or Hyperparameter({s!r}, bounds=(lower, upper), "
                "guess=value) (numbers or pgpgm.gp.Scaled multiples of the time span / spacing)")
        else:
            raise ModelDefinitionError(f"kernel {name}: hyperparameters must be Hyperparameter objects or names, "
                                       f"got {s!r}")
    return tuple(out)


def _rename_apart(hyper: tuple[Hyperparameter, ...], expr: sp.Expr,
                  taken: set[str]) -> tuple[tuple[Hyperparameter, ...], sp.Expr]:
    """Rename hyperparameters whose names are in ``taken`` (suffix _2, _3, ...), in ``expr`` too."""
    by_name = {s.name: s for s in expr.free_symbols}
    own = {h.name for h in hyper}
    out, repl = [], {}
    for h in hyper:
        new, i = h.name, 2
        if new in taken:
            while new in taken or new in own:
                new, i = f"{h.name}_{i}", i + 1
        taken = taken | {new}
        out.append(h.renamed(new))
        if new != h.name:
            repl[by_name[h.name]] = sp.Symbol(new, positive=True)
    return tuple(out), expr.xreplace(repl)


_PAIRS_MIN_POINTS = 200
"""Fewest times for which :meth:`Kernel.cov_with_hyper_grads` uses the compiled pair loop. Below, the
numpy expressions cost at most ~1 ms per likelihood evaluation (sigmoid, N = 200), and a fit needs
no compilation (about 1 s the first time, then ~0.2 s per process to load): small series, like
every published case, are fitted by the numpy expressions alone."""

_PAIRS_HEADER = '''"""Kernel matrices of one GP kernel, generated by pgpgm.gp.kernels (do not edit)."""
import math

import numba
import numpy


@numba.njit(cache=True, error_model="numpy")
def pairs(ta, tb, h, lower, {outs}):
'''


def _pairs_source(exprs: Sequence[sp.Expr], stationary: bool, hyper: Sequence[sp.Symbol]) -> str:
    """Python source of a numba function ``pairs(ta, tb, h, lower, out0, ..., out<M-1>)`` that writes
    ``out_m[i, j] = exprs[m](ta[i], tb[j]; h)`` for every column j (j <= i when ``lower``) in one pass.

    ``exprs`` are in ``tau`` (``stationary``) or ``a``, ``b``, and the symbols ``hyper`` (values h[0], ...;
    ``ta`` (NA,), ``tb`` (NB,), ``h`` (H,) and every ``out_m`` (NA, NB) float64, C-contiguous).
    Their common subexpressions are computed once (:func:`sympy.cse`), each where it first can be:
    those of h alone once, those of a alone once per row, those of b alone once per column (kept in an
    array), the rest per pair. Printed as the ODE kernels are (:mod:`pgpgm.ode.functions`: numba
    never raises; 1/0 gives inf). Raises ``PrintMethodNotImplementedError`` for a function numba
    code cannot express.
    """
    mapping = {h: sp.Symbol(f"h_{k}") for k, h in enumerate(hyper)}
    mapping.update({_a: sp.Symbol("a_"), _b: sp.Symbol("b_"), _tau: sp.Symbol("tau_")})
    level = {_tau: 3} if stationary else {_a: 1, _b: 2}  # bit 1: depends on a, bit 2: on b
    lines: dict[int, list[str]] = {0: [], 1: [], 2: [], 3: []}
    hoisted = sp.numbered_symbols("_r")

    def level_of(e: sp.Expr) -> int:
        lv = 0
        for f in e.free_symbols:
            lv |= level.get(f, 0)
        return lv

    def assign(sym: sp.Symbol, value: sp.Expr, lv: int) -> sp.Symbol:
        level[sym] = lv
        lines[lv].append(f"{sym} = {PRINTER.doprint(value.xreplace(mapping))}")
        return sym

    def hoist(e: sp.Expr) -> sp.Expr:
        """``e`` of a pair with its largest parts of fewer variables assigned outside the pair loop
        (e.g. a power of a row's term: a call of pow per row, not per pair)."""
        if e.is_Atom or not e.args:
            return e
        lv = level_of(e)
        if lv != 3:
            return assign(next(hoisted), e, lv)
        return e.func(*(hoist(x) for x in e.args))

    repl, reduced = sp.cse([kernel_expr(e) for e in exprs], symbols=sp.numbered_symbols("_c"))
    for sym, value in repl:
        lv = level_of(value)
        assign(sym, hoist(value) if lv == 3 else value, lv)
    reduced = [hoist(e) for e in reduced]
    cols = [sym for sym, lv in level.items() if lv == 2 and sym is not _b]
    outs = [f"out{m}" for m in range(len(exprs))]
    body = [*(f"h_{k} = h[{k}]" for k in range(len(hyper))), *lines[0], "nb = tb.shape[0]"]
    body += [f"col{sym} = numpy.empty(nb)" for sym in cols]
    if cols:
        body += ["for j_ in range(nb):", "    b_ = tb[j_]", *("    " + ln for ln in lines[2]),
                 *(f"    col{sym}[j_] = {sym}" for sym in cols)]
    body += ["for i_ in range(ta.shape[0]):", "    a_ = ta[i_]", *("    " + ln for ln in lines[1]),
             "    for j_ in range(i_ + 1 if lower else nb):", "        b_ = tb[j_]"]
    body += [f"        {sym} = col{sym}[j_]" for sym in cols]
    body += ["        tau_ = a_ - b_"] if stationary else []
    body += ["        " + ln for ln in lines[3]]
    body += [f"        {o}[i_, j_] = {PRINTER.doprint(e.xreplace(mapping))}" for o, e in zip(outs, reduced)]
    return _PAIRS_HEADER.format(outs=", ".join(outs)) + "".join(f"    {ln}\n" for ln in body)


def _compile_pairs(exprs: Sequence[sp.Expr], stationary: bool, hyper: Sequence[sp.Symbol]):
    """The compiled ``pairs`` function of :func:`_pairs_source`, or None when an expression has no
    numba form (then the numpy path serves).

    The source is stored and imported like the ODE kernels (:mod:`pgpgm.codegen.cache`, under a
    hash of the source), and numba keeps its machine code beside it (``cache=True``): it is
    compiled once per kernel expression, here on the spot, and loaded by later processes.
    """
    from numba.core.errors import NumbaError
    from sympy.printing.codeprinter import PrintMethodNotImplementedError

    try:
        source = _pairs_source(exprs, stationary, hyper)
    except PrintMethodNotImplementedError:
        return None
    f = kernel_cache.load_module(source, kernel_cache.source_key(source)).pairs
    t = np.zeros(1)
    try:
        f(t, t, np.ones(len(hyper)), True, *(np.zeros((1, 1)) for _ in exprs))  # compile or load now
    except NumbaError:
        return None
    return f


@dataclass(frozen=True, eq=False)
class Kernel:
    """A covariance function k(a, b; h) whose hyperparameters carry their bounds and guesses.

    Attributes
    ----------
    name : str
    hyperparameters : tuple of :class:`Hyperparameter`, one per entry of h. The
        ``"variance"`` ones scale k jointly: k(a, b; s*v) = s*k(a, b; v), which the fit's
        standardisation relies on (checked at construction).
    expr : sympy.Expr
        k in the symbols ``a``, ``b`` (time, real) and the hyperparameter symbols (positive).
    """

    name: str
    hyperparameters: tuple[Hyperparameter, ...]
    expr: sp.Expr

    def __post_init__(self) -> None:
        hp = self.hyperparameters
        if not isinstance(hp, tuple) or not all(isinstance(h, Hyperparameter) for h in hp) or not hp:
            raise ModelDefinitionError(f"kernel {self.name}: hyperparameters must be a non-empty tuple of "
                                       "Hyperparameter (use Kernel.from_expression to pass names)")
        names = [h.name for h in hp]
        if len(set(names)) != len(names):
            raise ModelDefinitionError(f"kernel {self.name}: hyperparameter names repeat: {names}")
        free = {s.name for s in self.expr.free_symbols}
        unknown = free - set(names) - {"a", "b"}
        if unknown:
            raise ModelDefinitionError(f"kernel {self.name}: expression uses {sorted(unknown)}, which are neither "
                                       f"a, b nor hyperparameters {names}")
        unused = [n for n in names if n not in free]
        if unused:
            raise ModelDefinitionError(f"kernel {self.name}: hyperparameters {unused} do not appear in {self.expr}")
        if not any(h.kind == "variance" for h in hp):
            raise ModelDefinitionError(f"kernel {self.name}: no hyperparameter of kind 'variance'; the first "
                                       "hyperparameter (or one declared Hyperparameter.variance) must multiply k")
        self._check_variance_scaling()

    def _check_variance_scaling(self) -> None:
        """k(s * variances) == s * k at two points (exact rationals, 30 digits)."""
        sym = dict(zip(self.names, self._h))
        for a, b, base in ((sp.Rational(3, 10), sp.Rational(11, 10), sp.Rational(7, 10)),
                           (sp.Rational(-2, 1), sp.Rational(1, 3), sp.Rational(13, 10))):
            vals = {_a: a, _b: b, **{s: base + sp.Rational(i, 7) for i, s in enumerate(self._h)}}
            scaled = dict(vals)
            for h in self.hyperparameters:
                if h.kind == "variance":
                    scaled[sym[h.name]] = 3 * vals[sym[h.name]]
            k0 = sp.N(self.expr.subs(vals), 30)
            k1 = sp.N(self.expr.subs(scaled), 30)
            if not (k0.is_finite and k1.is_finite):
                continue
            if abs(k1 - 3 * k0) > 1e-20 * (1 + abs(k0)):
                raise ModelDefinitionError(
                    f"kernel {self.name}: the variance hyperparameters "
                    f"{[h.name for h in self.hyperparameters if h.kind == 'variance']} do not scale k "
                    f"(k(3 v) != 3 k(v)); the variance must multiply the whole kernel")

    @classmethod
    def from_expression(cls, name: str, expression: str | sp.Expr,
                        hyperparameters: Sequence[Hyperparameter | str]) -> Kernel:
        """A kernel from k(a, b) written as a string or sympy expression.

        Parameters
        ----------
        name : kernel name (reported in results)
        expression : k in ``a``, ``b`` and the hyperparameter names, e.g.
            ``"var*(1 + (a-b)**2/(2*al*l**2))**(-al)"``
        hyperparameters : one entry per hyperparameter. A :class:`Hyperparameter`
            gives the bounds and guess; a bare name is accepted only first, and then
            means a signal variance (:meth:`Hyperparameter.variance`). Any other bare
            name raises ``ModelDefinitionError``: say which hyperparameter is a time scale
            (:meth:`Hyperparameter.lengthscale`) or give bounds.

        Examples
        --------
        >>> from pgpgm.gp import Hyperparameter, Kernel
        >>> rq = Kernel.from_expression("rq", "var*(1 + (a-b)**2/(2*al*l**2))**(-al)",
        ...     ["var", Hyperparameter.lengthscale("l"), Hyperparameter("al", bounds=(0.1, 100.0))])
        """
        hyper = _as_hyperparameters(name, hyperparameters)
        if isinstance(expression, str):
            syms = {"a": _a, "b": _b, **{h.name: sp.Symbol(h.name, positive=True) for h in hyper}}
            expr = parse_expression(expression, syms, where=f"kernel {name}")
        elif isinstance(expression, sp.Expr):
            # unify user symbols (any assumptions) with ours
            by_name = {s.name: s for s in expression.free_symbols}
            repl = {by_name[n]: s for n, s in (("a", _a), ("b", _b)) if n in by_name}
            repl.update({by_name[h.name]: sp.Symbol(h.name, positive=True) for h in hyper if h.name in by_name})
            expr = expression.xreplace(repl)
        else:
            raise ModelDefinitionError(f"kernel {name}: expression must be a string or sympy expression, "
                                       f"got {type(expression).__name__}")
        return cls(name, hyper, expr)

    # -- composition ---------------------------------------------------------------

    def __add__(self, other: Kernel) -> Kernel:
        """k1 + k2; clashing hyperparameter names of k2 get a suffix ``_2``."""
        if not isinstance(other, Kernel):
            return NotImplemented
        hp2, expr2 = _rename_apart(other.hyperparameters, other.expr, set(self.names))
        return Kernel(f"{self.name}+{other.name}", self.hyperparameters + hp2, self.expr + expr2)

    def __mul__(self, other: Kernel) -> Kernel:
        """k1 * k2 with the variance of k2 fixed to 1 (k1's variance scales the product)."""
        if not isinstance(other, Kernel):
            return NotImplemented
        variances = [h for h in other.hyperparameters if h.kind == "variance"]
        if len(variances) != 1:
            raise ModelDefinitionError(f"kernel {self.name}*{other.name}: the second factor must have exactly one "
                                       f"variance hyperparameter, has {[h.name for h in variances]}")
        v = dict(zip(other.names, other._h))[variances[0].name]
        rest = tuple(h for h in other.hyperparameters if h.kind != "variance")
        hp2, expr2 = _rename_apart(rest, other.expr.xreplace({v: sp.S.One}), set(self.names))
        return Kernel(f"{self.name}*{other.name}", self.hyperparameters + hp2, self.expr * expr2)

    # -- evaluation ----------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """Hyperparameter names, in the order of h."""
        return tuple(h.name for h in self.hyperparameters)

    @cached_property
    def _h(self) -> tuple[sp.Symbol, ...]:
        by_name = {s.name: s for s in self.expr.free_symbols}
        return tuple(by_name.get(h.name, sp.Symbol(h.name, positive=True)) for h in self.hyperparameters)

    @cached_property
    def stationary(self) -> bool:
        """Whether k depends on a and b only through tau = a - b."""
        return not self._in_tau.has(_b)

    @cached_property
    def _in_tau(self) -> sp.Expr:
        e = self.expr.xreplace({_a: _b + _tau})
        if e.has(_b):
            e = sp.expand(e)
        return e

    def _compile(self, exprs: Sequence[sp.Expr]):
        """One numpy function (inputs..., h...) -> list of arrays, common subexpressions shared."""
        args = ((_tau,) if self.stationary else (_a, _b)) + self._h
        return sp.lambdify(args, list(exprs), "numpy", cse=True)

    @cached_property
    def _f_cov(self):
        return self._compile([self._in_tau if self.stationary else self.expr])

    def _hyper_exprs(self, skip_variance: bool) -> list[sp.Expr]:
        """[k, dk/dh_0, ...] in tau (stationary) or a, b; without dk/dv when ``skip_variance`` and
        k is linear in its only variance v (:attr:`linear_variance`)."""
        k = self._in_tau if self.stationary else self.expr
        iv = self.linear_variance if skip_variance else None
        return [k] + [_clean(sp.diff(k, h)) for i, h in enumerate(self._h) if i != iv]

    @cached_property
    def _f_hyper(self):
        return self._compile(self._hyper_exprs(False))

    @cached_property
    def linear_variance(self) -> int | None:
        """Index of the kernel's only ``"variance"`` hyperparameter v when k is linear in it, else None.

        Then dk/dv = k / v, so a fit needs no matrix dK/dv (:meth:`cov_with_hyper_grads` with
        ``skip_variance=True``). None when several hyperparameters are variances (a sum of kernels).
        """
        idx = [i for i, h in enumerate(self.hyperparameters) if h.kind == "variance"]
        if len(idx) != 1 or sp.diff(self.expr, self._h[idx[0]], 2) != 0:
            return None
        return idx[0]

    @cached_property
    def _f_hyper_no_variance(self):
        return self._compile(self._hyper_exprs(True))

    @cached_property
    def _pairs_hyper(self):
        return _compile_pairs(self._hyper_exprs(False), self.stationary, self._h)

    @cached_property
    def _pairs_hyper_no_variance(self):
        return _compile_pairs(self._hyper_exprs(True), self.stationary, self._h)

    @staticmethod
    def _run_pairs(f, t, hyper, n_out: int, *, lower: bool, out: list[np.ndarray] | None) -> list[np.ndarray]:
        """The ``n_out`` matrices (N, N) of a compiled pair loop ``f`` (:func:`_compile_pairs`) on times
        ``t`` (N,); ``lower`` and ``out`` as in :meth:`_run` (entries above the diagonal stay zero)."""
        n = t.size
        reuse = out is not None and len(out) == n_out and all(o.shape == (n, n) for o in out)
        res = out if reuse else [np.zeros((n, n)) for _ in range(n_out)]
        f(t, t, np.ascontiguousarray(hyper, dtype=np.float64), lower, *res)
        if out is not None and not reuse:
            out[:] = res
        return res

    @cached_property
    def _f_time(self):
        if self.stationary:
            f = self._in_tau
            d1 = _clean(sp.diff(f, _tau))
            d2 = _clean(sp.diff(f, _tau, 2))
            return self._compile([f, d1, -d1, -d2])
        k = self.expr
        return self._compile([k] + [_clean(e) for e in (sp.diff(k, _a), sp.diff(k, _b), sp.diff(k, _a, _b))])

    def _run(self, f, ta, tb, hyper, *, lower: bool = False, block: int | None = None,
             out: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Every output of ``f`` at all pairs (ta_i, tb_j), each a float array (len(ta), len(tb)).

        Large matrices are filled in blocks of rows (temporaries of ~128 KiB stay in cache:
        2-4x faster than one pass over the whole matrix at N = 1000). ``lower=True`` (with
        ta = tb) evaluates block rows [i0, i1) against columns [0, i1) only: the lower
        triangle and diagonal are exact, above the diagonal blocks the outputs are zero.
        ``out``: a list to fill with the matrices of a multi-block evaluation and to reuse
        at the next call with the same shapes (new matrices cost page faults: at N = 1000
        about a third of the evaluation); every entry that a call writes is rewritten by the
        next, the others stay zero (callers may overwrite only what this writes).
        """
        ta = np.asarray(ta, dtype=float).reshape(-1)
        tb = np.asarray(tb, dtype=float).reshape(-1)
        na, nb = ta.size, tb.size
        hv = [float(h) for h in hyper]
        if block is None:
            block = max(8, 16384 // max(nb, 1))
        outs: list[np.ndarray] = []
        with np.errstate(invalid="ignore", divide="ignore"):
            for i0 in range(0, max(na, 1), block):
                i1 = min(i0 + block, na)
                cols = i1 if lower else nb
                a, b = ta[i0:i1, None], tb[None, :cols]
                vals = f(a - b, *hv) if self.stationary else f(a, b, *hv)
                if na <= block:  # one block: keep f's arrays, no copy
                    return [np.asarray(v, dtype=np.float64) if np.shape(v) == (na, nb)
                            else np.broadcast_to(np.asarray(v, dtype=np.float64), (na, nb)).copy() for v in vals]
                if not outs:
                    if out is not None and len(out) == len(vals) and all(o.shape == (na, nb) for o in out):
                        outs = out
                    else:
                        outs = [np.zeros((na, nb)) for _ in vals]
                        if out is not None:
                            out[:] = outs
                for o, v in zip(outs, vals):
                    o[i0:i1, :cols] = v
        return outs

    def _run_uniform(self, f, t, hyper, out: list[np.ndarray] | None = None) -> list[np.ndarray] | None:
        """Stationary k on an evenly spaced grid: evaluate at the N lags, fill (N, N) Toeplitz matrices.

        Returns None when the kernel is not stationary or the grid not uniform to 64 ulp of max|t|.
        ``out``: as in :meth:`_run`, matrices to fill (every entry) and reuse at the next call.
        """
        n = t.size
        if not self.stationary or n < 3:
            return None
        lags = t - t[0]
        step = lags[-1] / (n - 1)
        if np.max(np.abs(lags - step * np.arange(n))) > 64 * np.finfo(float).eps * np.max(np.abs(t)):
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            outs = f(lags, *(float(h) for h in hyper))
        reuse = out is not None and len(out) == len(outs) and all(o.shape == (n, n) for o in out)
        res = out if reuse else [np.empty((n, n)) for _ in outs]
        for r, o in zip(res, outs):
            v = np.broadcast_to(np.asarray(o, dtype=np.float64), (n,))
            w = np.concatenate([v[:0:-1], v])  # v[n-1], ..., v[1], v[0], v[1], ..., v[n-1]
            np.copyto(r, np.lib.stride_tricks.sliding_window_view(w, n)[::-1])
        if out is not None and not reuse:
            out[:] = res
        return res

    def check_hyper(self, hyper) -> np.ndarray:
        """``hyper`` as a float array (H,), or DataError if its length or sign is wrong."""
        h = np.asarray(hyper, dtype=float).reshape(-1)
        if h.size != len(self.hyperparameters):
            raise DataError(f"kernel {self.name} takes hyperparameters {list(self.names)}, got {h.size} values")
        if not np.all(np.isfinite(h)) or np.any(h <= 0):
            raise DataError(f"kernel {self.name} hyperparameters must be positive and finite, got {h.tolist()}")
        return h

    def cov(self, ta, tb, hyper) -> np.ndarray:
        """C(i, j) = k(ta_i, tb_j), shape (len(ta), len(tb)), units of ``hyper`` variance."""
        return self._run(self._f_cov, ta, tb, self.check_hyper(hyper))[0]

    def cov_grad(self, ta, tb, hyper) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(C, C', C'_b, C''), each (len(ta), len(tb)): k, dk/da, dk/db, d2k/(da db) at (ta_i, tb_j).

        Units: variance, variance / time, variance / time, variance / time^2.
        """
        return tuple(self._run(self._f_time, ta, tb, self.check_hyper(hyper)))

    def cov_with_hyper_grads(self, t, hyper, *, checked: bool = False, lower: bool = False,
                             workspace: list | None = None, skip_variance: bool = False
                             ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """(K, [dK/dh_k]) on times ``t`` (N,): K (N, N) and one (N, N) matrix per hyperparameter.

        All from one evaluation (time differences and shared subexpressions computed once). A
        stationary kernel on evenly spaced times is evaluated at the N lags only (Toeplitz
        matrices; the lags differ from the pairwise differences t_i - t_j by rounding); other
        kernels and grids from :data:`_PAIRS_MIN_POINTS` times on by the compiled pair loop
        (:func:`_compile_pairs`; equal to the numpy expressions to rounding), else (and when an
        expression has no numba form) in numpy row blocks.
        ``checked=True`` skips the validation of ``hyper`` (for the optimiser's inner loop).
        ``lower=True`` guarantees only the lower triangle and diagonal of every matrix (the
        strict upper triangle holds zeros or the symmetric values): half the work on
        uneven grids, for consumers that read one triangle (LAPACK ``potrf``, BLAS ``symv``).
        ``workspace`` (with ``lower=True``): a list, empty at first, whose matrices are
        reused by later calls with it (the returned matrices are then overwritten by the
        next call; a caller may change their lower triangles, e.g. factorise K in place).
        ``skip_variance=True``: when :attr:`linear_variance` is not None, that entry of the list
        is None instead of the matrix K / v (one matrix fewer to evaluate and to read).
        """
        h = hyper if checked else self.check_hyper(hyper)
        t = np.ascontiguousarray(np.asarray(t, dtype=float).reshape(-1))
        iv = self.linear_variance if skip_variance else None
        ws = workspace if lower else None
        out = self._run_uniform(self._f_hyper if iv is None else self._f_hyper_no_variance, t, h, out=ws) \
            if self.stationary else None
        if out is None:
            pairs = None
            if t.size >= _PAIRS_MIN_POINTS:
                pairs = self._pairs_hyper if iv is None else self._pairs_hyper_no_variance
            if pairs is not None:
                out = self._run_pairs(pairs, t, h, len(self._h) + 1 - (iv is not None), lower=lower, out=ws)
            else:
                out = self._run(self._f_hyper if iv is None else self._f_hyper_no_variance, t, t, h, lower=lower,
                                out=ws)
        K, *grads = out
        if iv is not None:
            grads.insert(iv, None)
        return K, grads

    def cov_hyper_grads(self, t, hyper) -> list[np.ndarray]:
        """dC/dh_k for every hyperparameter, each (N, N)."""
        return self.cov_with_hyper_grads(t, hyper)[1]

    def bounds(self, grid: TimeGrid) -> np.ndarray:
        """(H, 2) lower/upper bounds of the hyperparameters on ``grid`` (standardised series)."""
        return np.array([h.resolve(grid)[:2] for h in self.hyperparameters])

    def guess(self, grid: TimeGrid) -> np.ndarray:
        """(H,) starting values on ``grid`` (standardised series), not clipped."""
        return np.array([h.resolve(grid)[2] for h in self.hyperparameters])

    def __reduce__(self):
        # pickle the definition only (compiled functions are rebuilt on first use)
        return (Kernel, (self.name, self.hyperparameters, self.expr))

    def __repr__(self) -> str:
        return f"Kernel({self.name}: {self.expr}; {', '.join(self.names)})"


def _builtin() -> Mapping[str, Kernel]:
    v, l, c, d = (sp.Symbol(n, positive=True) for n in ("variance", "lengthscale", "c", "d"))
    r = sp.Abs(_a - _b)
    s5 = sp.sqrt(5)
    var, ls = Hyperparameter.variance(), Hyperparameter.lengthscale()
    return {
        "rbf": Kernel("rbf", (var, ls), v * sp.exp(-((_a - _b) ** 2) / (2 * l**2))),
        "matern52": Kernel(
            "matern52", (var, ls),
            v * (1 + s5 * r / l + 5 * r**2 / (3 * l**2)) * sp.exp(-s5 * r / l),
        ),
        "sigmoid": Kernel(
            # d (1 / time^2) starts at 10 / span^2, the time scale of the data: a guess blind to the span
            # (d = 1) costs 1.5-2.5x the likelihood evaluations and, on long spans, ends in a worse local
            # optimum
            "sigmoid", (var, Hyperparameter("c", (1e-6, 1e4), 1.0),
                        Hyperparameter("d", (1e-6, 1e4), Scaled("span", 10.0, power=-2))),
            v * sp.asin((c + d * _a * _b) / sp.sqrt((c + d * _a**2 + 1) * (c + d * _b**2 + 1))),
        ),
    }


KERNELS: Mapping[str, Kernel] = _builtin()


def get_kernel(kernel: str | Kernel) -> Kernel:
    """A built-in kernel by name (``"rbf"``, ``"matern52"``, ``"sigmoid"``) or a Kernel as is."""
    if isinstance(kernel, Kernel):
        return kernel
    try:
        return KERNELS[kernel]
    except (KeyError, TypeError):
        raise ModelDefinitionError(f"unknown kernel {kernel!r}; built-in kernels are {sorted(KERNELS)}, or pass a "
                                   "pgpgm.gp.Kernel (Kernel.from_expression)") from None

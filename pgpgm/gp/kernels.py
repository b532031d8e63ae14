"""GP kernels with the derivative covariances gradient matching needs.

A kernel is one sympy expression k(a, b; h) in two time points and its
hyperparameters h (all positive; the first is always the signal variance). Every
derivative - dk/da, dk/db, d2k/(da db) and dk/dh - is derived symbolically and
compiled to numpy with :func:`sympy.lambdify`, so a user adds a kernel by writing
only k (:meth:`Kernel.from_expression`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import sympy as sp

from ..ode.parse import parse_expression
from ..errors import DataError

_a, _b = sp.symbols("a b", real=True)


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


@dataclass(frozen=True, eq=False)
class Kernel:
    """A covariance function k(a, b; h) with derived derivative covariances.

    Attributes
    ----------
    name : str
    hyperparameters : tuple of str
        Names of h; ``hyperparameters[0]`` is the signal variance (units state^2).
    expr : sympy.Expr
        k in the symbols ``a``, ``b`` and the hyperparameter symbols.
    """

    name: str
    hyperparameters: tuple[str, ...]
    expr: sp.Expr

    @classmethod
    def from_expression(cls, name: str, expression: str | sp.Expr, hyperparameters: Sequence[str]) -> Kernel:
        """A kernel from k(a, b) written as a string or sympy expression.

        The first hyperparameter must be a multiplicative signal variance, e.g.
        ``Kernel.from_expression("rq", "var*(1 + (a-b)**2/(2*al*l**2))**(-al)", ["var", "l", "al"])``.
        """
        hyper = tuple(hyperparameters)
        syms = {"a": _a, "b": _b, **{h: sp.Symbol(h, positive=True) for h in hyper}}
        expr = parse_expression(expression, syms, where=f"kernel {name}") if isinstance(expression, str) else expression
        return cls(name, hyper, expr)

    @cached_property
    def _h(self) -> tuple[sp.Symbol, ...]:
        by_name = {s.name: s for s in self.expr.free_symbols}
        return tuple(by_name.get(h, sp.Symbol(h, positive=True)) for h in self.hyperparameters)

    @cached_property
    def _funcs(self):
        k = self.expr
        parts = {
            "k": k,
            "dk_da": _clean(sp.diff(k, _a)),
            "dk_db": _clean(sp.diff(k, _b)),
            "d2k_dadb": _clean(sp.diff(k, _a, _b)),
        }
        parts.update({f"dk_d{h.name}": _clean(sp.diff(k, h)) for h in self._h})
        args = (_a, _b, *self._h)
        return {n: sp.lambdify(args, e, "numpy") for n, e in parts.items()}

    def _eval(self, what: str, ta, tb, hyper) -> np.ndarray:
        A, B = np.meshgrid(np.asarray(ta, float), np.asarray(tb, float), indexing="ij")
        out = self._funcs[what](A, B, *hyper)
        return np.broadcast_to(out, A.shape).astype(float, copy=True)

    def check_hyper(self, hyper) -> np.ndarray:
        h = np.asarray(hyper, dtype=float).reshape(-1)
        if h.size != len(self.hyperparameters):
            raise DataError(f"kernel {self.name} takes hyperparameters {list(self.hyperparameters)}, got {h.size} values")
        if not np.all(np.isfinite(h)) or np.any(h <= 0):
            raise DataError(f"kernel {self.name} hyperparameters must be positive and finite, got {h.tolist()}")
        return h

    def cov(self, ta, tb, hyper) -> np.ndarray:
        """C(i, j) = k(ta_i, tb_j), shape (len(ta), len(tb))."""
        return self._eval("k", ta, tb, self.check_hyper(hyper))

    def cov_grad(self, ta, tb, hyper) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(C, C', C'_b, C'') with C'(i,j) = dk/da, C'_b(i,j) = dk/db, C''(i,j) = d2k/dadb."""
        h = self.check_hyper(hyper)
        return tuple(self._eval(w, ta, tb, h) for w in ("k", "dk_da", "dk_db", "d2k_dadb"))

    def cov_hyper_grads(self, t, hyper) -> list[np.ndarray]:
        """dC/dh_k for every hyperparameter, each (N, N)."""
        h = self.check_hyper(hyper)
        return [self._eval(f"dk_d{s.name}", t, t, h) for s in self._h]

    def __reduce__(self):  # the lambdified functions are rebuilt on first use, not pickled
        return (type(self), (self.name, self.hyperparameters, self.expr))

    def __repr__(self) -> str:
        return f"Kernel({self.name}: {self.expr})"


def _builtin() -> Mapping[str, Kernel]:
    v, l, c, d = (sp.Symbol(n, positive=True) for n in ("variance", "lengthscale", "c", "d"))
    r = sp.Abs(_a - _b)
    s5 = sp.sqrt(5)
    return {
        "rbf": Kernel("rbf", ("variance", "lengthscale"), v * sp.exp(-((_a - _b) ** 2) / (2 * l**2))),
        "matern52": Kernel(
            "matern52", ("variance", "lengthscale"),
            v * (1 + s5 * r / l + 5 * r**2 / (3 * l**2)) * sp.exp(-s5 * r / l),
        ),
        "sigmoid": Kernel(
            "sigmoid", ("variance", "c", "d"),
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
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; built-in kernels are {sorted(KERNELS)}") from None

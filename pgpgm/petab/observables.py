"""The observable table: each observable's formula and noise formula, compiled for whole columns.

A formula may use the model's species, parameters, compartments and assignment-rule targets,
the parameter table's parameters, the time (``time``), and the placeholders
``observableParameter{n}_{id}`` and ``noiseParameter{n}_{id}`` that each measurement fills;
a noise formula may also use the observable's own id (its value). Formulas are parsed by the
petab library (:func:`petab.v1.math.sympify_petab`) and evaluated by numpy functions that
sympy writes (``lambdify``), with their exact derivatives with respect to every input, one call
per observable for all of its measurements.

The likelihood of one measurement m with simulated value h and noise parameter sigma, on the
transformed scale T (lin, log or log10) as PEtab defines it::

    normal:   0.5 log(2 pi sigma^2) + 0.5 r^2 + log|T'(m)|,  r = (T(h) - T(m)) / sigma
    laplace:  log(2 sigma) + |r| + log|T'(m)|
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import sympy as sp

from .sbml import TIME, SbmlModel, symbol
from .tables import DISTRIBUTIONS, TRANSFORMATIONS, Table, cell_error

#: Input kinds of a formula: the time, a state, a model constant, a parameter of the parameter
#: table, an observable placeholder, a noise placeholder.
KINDS = ("t", "x", "c", "v", "o", "n")


@dataclass(frozen=True, eq=False)
class Observable:
    """One observable, compiled.

    Attributes
    ----------
    id, transformation, distribution : as in the observable table
    inputs : the formulas' inputs, each (kind, index) with kind one of :data:`KINDS` and index
        into the states, the constants, the parameter table or the placeholders (from 0)
    formula, noise : the observable's value h and its noise parameter sigma, in the symbols
        ``symbols`` (one per input)
    n_observable, n_noise : how many placeholders each measurement fills
    """

    id: str
    transformation: str
    distribution: str
    inputs: tuple[tuple[str, int], ...]
    symbols: tuple[sp.Symbol, ...]
    formula: sp.Expr
    noise: sp.Expr
    n_observable: int
    n_noise: int

    @cached_property
    def _functions(self) -> tuple[Callable, Callable]:
        values = [self.formula, self.noise]
        grads = [sp.diff(e, s) for e in values for s in self.symbols]
        return (sp.lambdify(self.symbols, values, modules="numpy", cse=True, dummify=True),
                sp.lambdify(self.symbols, grads, modules="numpy", cse=True, dummify=True))

    def __getstate__(self):  # the compiled functions are rebuilt, not pickled
        return {k: v for k, v in self.__dict__.items() if k != "_functions"}

    def evaluate(self, columns: list[np.ndarray], derivatives: bool = False):
        """h and sigma for D measurements, from one column (D,) per input.

        Returns
        -------
        h, sigma : (D,)
        dh, dsigma : (D, I), their derivatives with respect to the inputs (with ``derivatives``)
        """
        D = columns[0].shape[0] if columns else 0
        f, g = self._functions
        with np.errstate(all="ignore"):
            h, s = (np.broadcast_to(np.asarray(a, float), (D,)) for a in f(*columns))
            if not derivatives:
                return h, s
            I = len(self.symbols)
            d = [np.broadcast_to(np.asarray(a, float), (D,)) for a in g(*columns)]
        return h, s, np.stack(d[:I], 1) if I else np.zeros((D, 0)), np.stack(d[I:], 1) if I else np.zeros((D, 0))


def read_observables(tables: list[Table], model: SbmlModel, parameters: Mapping[str, int]) -> tuple[Observable, ...]:
    """The observable tables, compiled; an unknown symbol or an unreadable formula is a
    :class:`DataError` naming the file, line and column."""
    out: list[Observable] = []
    for t in tables:
        ids = t.ids("observableId", unique=True)
        trans = t.choice("observableTransformation", TRANSFORMATIONS, "lin")
        dist = t.choice("noiseDistribution", DISTRIBUTIONS, "normal")
        for i, line in enumerate(t.lines()):
            if ids[i] in {o.id for o in out}:
                raise cell_error(t.path, line, "observableId", f"the observable {ids[i]!r} is defined twice")
            if ids[i] in model.states or ids[i] in model.constants or ids[i] in parameters:
                raise cell_error(t.path, line, "observableId", f"{ids[i]!r} is also a model entity or a parameter")
            out.append(_compile(t, line, ids[i], trans[i], dist[i], model, parameters))
    return tuple(out)


def _parse(t: Table, line: int, column: str, text: str) -> sp.Expr:
    from petab.v1.math import sympify_petab

    if text == "":
        raise cell_error(t.path, line, column, "the formula is empty")
    try:
        expr = sympify_petab(text)
    except (ValueError, TypeError) as exc:
        raise cell_error(t.path, line, column, f"{text!r} is not a PEtab formula: {exc}") from None
    if not isinstance(expr, sp.Expr) or expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
        raise cell_error(t.path, line, column, f"{text!r} is not a finite number-valued formula")
    return expr


def _compile(t: Table, line: int, oid: str, transformation: str, distribution: str, model: SbmlModel,
             parameters: Mapping[str, int]) -> Observable:
    columns = {"observableFormula": _parse(t, line, "observableFormula", t.text("observableFormula")[line - 2]),
               "noiseFormula": _parse(t, line, "noiseFormula", t.text("noiseFormula")[line - 2] or "1")}
    pattern = re.compile(rf"^(observable|noise)Parameter([1-9][0-9]*)_{re.escape(oid)}$")
    counts = {"observable": 0, "noise": 0}
    swap: dict[str, dict[sp.Symbol, sp.Expr]] = {c: {} for c in columns}
    for column, expr in columns.items():
        for s in sorted(expr.free_symbols, key=str):
            name = s.name
            hit = pattern.match(name)
            if hit and not (hit[1] == "noise" and column == "observableFormula"):
                counts[hit[1]] = max(counts[hit[1]], int(hit[2]))
                swap[column][s] = sp.Symbol(f"{hit[1][0]}:{int(hit[2]) - 1}", real=True)
            elif (value := model.expression(name)) is not None:
                swap[column][s] = value
            elif name in parameters:
                swap[column][s] = sp.Symbol(f"v:{parameters[name]}", real=True)
            elif name == "time":
                swap[column][s] = TIME
            elif name == oid and column == "noiseFormula":
                swap[column][s] = sp.Symbol("self", real=True)
            else:
                raise cell_error(t.path, line, column, f"the symbol {name!r} is no model entity, no parameter of the "
                                                       f"parameter table and no placeholder of observable {oid!r}")
    formula = columns["observableFormula"].xreplace(swap["observableFormula"])
    noise = columns["noiseFormula"].xreplace(swap["noiseFormula"])
    noise = noise.xreplace({sp.Symbol("self", real=True): formula})
    if noise.is_number and not float(noise) > 0:  # a noise sd (or Laplace scale) is positive
        raise cell_error(t.path, line, "noiseFormula", f"the noise formula is the constant {float(noise):g}; it is the "
                                                       "noise sd (or Laplace scale) of the observable: give a "
                                                       "positive number or formula")
    names = {symbol(s): ("x", j) for j, s in enumerate(model.states)}
    names.update({symbol(c): ("c", k) for k, c in enumerate(model.constants)})
    names[TIME] = ("t", 0)
    inputs, symbols = [], []
    for s in sorted(formula.free_symbols | noise.free_symbols, key=str):
        if s in names:
            inputs.append(names[s])
        else:
            kind, index = s.name.split(":")
            inputs.append((kind, int(index)))
        symbols.append(s)
    return Observable(oid, transformation, distribution, tuple(inputs), tuple(symbols), formula, noise,
                      counts["observable"], counts["noise"])


# ------------------------------------------------------------------------------------ likelihood
@dataclass(frozen=True)
class Terms:
    """Per measurement: the negative log-likelihood, the residual (T(h) - T(m)) / sigma, and the
    derivatives of the negative log-likelihood with respect to h and sigma (all (D,))."""

    nll: np.ndarray
    residual: np.ndarray
    d_h: np.ndarray
    d_sigma: np.ndarray
    d_residual_h: np.ndarray
    d_residual_sigma: np.ndarray


def likelihood_terms(m: np.ndarray, h: np.ndarray, sigma: np.ndarray, transformation: str,
                     distribution: str) -> Terms:
    """The likelihood terms of measurements ``m`` given simulated ``h`` and noise ``sigma`` (all (D,))."""
    with np.errstate(all="ignore"):
        if transformation == "lin":
            tm, th, dth, jac = m, h, np.ones_like(h), np.zeros_like(m)
        elif transformation == "log":
            tm, th, dth, jac = np.log(m), np.log(h), 1.0 / h, np.log(m)
        else:
            tm, th, dth, jac = np.log10(m), np.log10(h), 1.0 / (h * math.log(10.0)), np.log(m * math.log(10.0))
        r = (th - tm) / sigma
        if distribution == "normal":
            nll = 0.5 * np.log(2 * math.pi * sigma ** 2) + 0.5 * r ** 2 + jac
            d_r = r
            d_sigma_direct = 1.0 / sigma
        else:
            nll = np.log(2 * sigma) + np.abs(r) + jac
            d_r = np.sign(r)
            d_sigma_direct = 1.0 / sigma
        dr_h, dr_s = dth / sigma, -r / sigma
    return Terms(nll, r, d_r * dr_h, d_sigma_direct + d_r * dr_s, dr_h, dr_s)

"""From the PEtab tables to arrays: the parameters, the conditions' overrides, the experiments.

Every value the simulation uses is either a number or one of the parameter table's parameters
(``v``, on the linear scale, in the table's order). A source is stored as two arrays: a number
and an index into ``v`` (-1 where the number is used), so that the values for a whole table
are one ``np.where`` (:func:`take`), and their derivatives one selection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from .sbml import SbmlModel
from .tables import PRIOR_TYPES, SCALES, Table, cell_error, concat


@dataclass(frozen=True)
class PetabParameter:
    """One row of the parameter table.

    Attributes
    ----------
    id : parameterId
    scale : 'lin', 'log' or 'log10' (the scale a fitter works on)
    lower, upper : bounds on the linear scale
    nominal : nominalValue on the linear scale (the value used where not estimated)
    estimate : whether the parameter is estimated
    prior : objectivePriorType ('parameterScaleUniform' within the bounds where none is given)
    prior_parameters : objectivePriorParameters (empty for the default prior)
    """

    id: str
    scale: str
    lower: float
    upper: float
    nominal: float
    estimate: bool
    prior: str = "parameterScaleUniform"
    prior_parameters: tuple[float, ...] = ()

    def to_scale(self, value):
        """``value`` (linear scale, any shape) on this parameter's scale."""
        return {"lin": lambda x: x, "log": np.log, "log10": np.log10}[self.scale](value)

    def from_scale(self, value):
        """``value`` on this parameter's scale back on the linear scale."""
        return {"lin": lambda x: x, "log": np.exp, "log10": lambda x: 10.0 ** x}[self.scale](value)

    def derivative(self, linear):
        """d(linear value) / d(value on the scale) at the linear value ``linear``."""
        return {"lin": 1.0, "log": linear, "log10": linear * math.log(10.0)}[self.scale]


def read_parameters(table: Table) -> tuple[PetabParameter, ...]:
    """The parameter table's rows, checked (bounds ordered and positive on log scales)."""
    ids = table.ids("parameterId", unique=True)
    scales = table.choice("parameterScale", SCALES, "lin")
    estimate = table.numbers("estimate")
    lower = table.numbers("lowerBound", default=-math.inf, finite=False)
    upper = table.numbers("upperBound", default=math.inf, finite=False)
    nominal = table.numbers("nominalValue", default=math.nan, finite=False)
    priors = table.choice("objectivePriorType", PRIOR_TYPES, "parameterScaleUniform")
    prior_text = table.text("objectivePriorParameters")
    out = []
    for i, line in enumerate(table.lines()):
        if estimate[i] not in (0, 1):
            raise cell_error(table.path, line, "estimate", f"{estimate[i]:g} is neither 0 nor 1")
        if estimate[i] and not lower[i] <= upper[i]:
            raise cell_error(table.path, line, "upperBound", f"the upper bound {upper[i]:g} is below the lower bound "
                                                             f"{lower[i]:g} (column 'lowerBound'); swap or fix them")
        if estimate[i] and scales[i] != "lin" and not lower[i] > 0:
            raise cell_error(table.path, line, "lowerBound", f"a parameter on the {scales[i]} scale needs a positive "
                                                             f"lower bound, got {lower[i]:g}")
        if not estimate[i] and not math.isfinite(nominal[i]):
            raise cell_error(table.path, line, "nominalValue", "a parameter that is not estimated needs a finite "
                                                               "nominal value")
        try:
            params = tuple(float(x) for x in prior_text[i].split(";")) if prior_text[i] else ()
        except ValueError:
            raise cell_error(table.path, line, "objectivePriorParameters",
                             f"{prior_text[i]!r} is not a ';'-separated list of numbers") from None
        if priors[i] != "parameterScaleUniform" and len(params) != 2 or \
                prior_text[i] and priors[i] == "parameterScaleUniform" and len(params) != 2:
            raise cell_error(table.path, line, "objectivePriorParameters",
                             f"the {priors[i]} prior takes two numbers separated by ';', got {prior_text[i]!r}")
        out.append(PetabParameter(ids[i], scales[i], float(lower[i]), float(upper[i]), float(nominal[i]),
                                  bool(estimate[i]), priors[i], params))
    return tuple(out)


@dataclass(frozen=True)
class Source:
    """Values that are numbers or parameters: ``value[i]`` where ``index[i] < 0``, else ``v[index[i]]``."""

    value: np.ndarray
    index: np.ndarray

    def take(self, v: np.ndarray) -> np.ndarray:
        """The values for the parameter vector ``v`` (linear scale), shape of :attr:`value`."""
        return np.where(self.index >= 0, v[np.maximum(self.index, 0)], self.value)

    def jacobian(self, column: np.ndarray) -> np.ndarray:
        """d(values) / d(estimated parameters): shape (*value.shape, V_e), from ``column`` (V,), the
        position of each parameter among the estimated ones (-1 for those held fixed)."""
        n = int(column.max(initial=-1)) + 1
        col = np.where(self.index >= 0, column[np.maximum(self.index, 0)], -1)
        return (col[..., None] == np.arange(n)).astype(float)


def parse_value(text: str, parameters: Mapping[str, int], table: Table | None, line: int, column: str,
                *, allow_nan: bool = False) -> tuple[float, int]:
    """A cell that is a number or a parameter table id: (number, -1) or (nan, index)."""
    try:
        value = float(text)
    except ValueError:
        if text in parameters:
            return math.nan, parameters[text]
        raise cell_error(table.path if table else "", line, column,
                         f"{text!r} is neither a number nor a parameter of the parameter table") from None
    if math.isnan(value) and not allow_nan or math.isinf(value):
        raise cell_error(table.path if table else "", line, column, f"{text!r} is not a finite number")
    return value, -1


@dataclass(frozen=True)
class Conditions:
    """Every condition's constants and initial values.

    Attributes
    ----------
    ids : the condition ids, length C
    constants : Source (C, M): each model constant's value (condition table, else parameter table,
        else the SBML file)
    initial : Source (C, S): the states set by the condition table
    reset : bool (C, S): where the condition table sets a state (NaN there does not)
    """

    ids: tuple[str, ...]
    constants: Source
    initial: Source
    reset: np.ndarray


def read_conditions(tables: list[Table], model: SbmlModel, parameters: Mapping[str, int]) -> Conditions:
    """The condition tables; a column that is no model entity, a cell that is neither a number nor a
    parameter id, are :class:`DataError`."""
    ids: list[str] = []
    for t in tables:
        for line, cid in zip(t.lines(), t.ids("conditionId", unique=True)):
            if cid in ids:
                raise cell_error(t.path, line, "conditionId", f"the condition {cid!r} is defined twice")
            ids.append(cid)
    M, S = len(model.constants), len(model.states)
    base_value = np.array(model.values)
    base_index = np.full(M, -1)
    for k, c in enumerate(model.constants):
        if c in parameters:
            base_value[k], base_index[k] = math.nan, parameters[c]
    cv, ci = np.tile(base_value, (len(ids), 1)), np.tile(base_index, (len(ids), 1))
    xv, xi = np.full((len(ids), S), math.nan), np.full((len(ids), S), -1)
    reset = np.zeros((len(ids), S), bool)
    row = 0
    for t in tables:
        for column in t.frame.columns:
            if column in ("conditionId", "conditionName"):
                continue
            if column in model.states:
                kind, j = "state", model.states.index(column)
            elif column in model.constants:
                kind, j = "constant", model.constants.index(column)
            else:
                raise cell_error(t.path, 1, column, f"{column!r} is no species, parameter or compartment of the "
                                                    f"model {model.path.name} (an assignment-rule target cannot be set)")
            for r, (line, cell) in enumerate(zip(t.lines(), t.text(column))):
                # an empty cell, like NaN (petab reads both as NaN), leaves the model's value
                value, index = parse_value(cell or "nan", parameters, t, line, column, allow_nan=True)
                if index < 0 and math.isnan(value):
                    continue
                if kind == "constant":
                    cv[row + r, j], ci[row + r, j] = value, index
                else:
                    xv[row + r, j], xi[row + r, j], reset[row + r, j] = value, index, True
        row += len(t.frame)
    return Conditions(tuple(ids), Source(cv, ci), Source(xv, xi), reset)


@dataclass(frozen=True)
class Experiments:
    """The simulations the measurements need: one per (preequilibration, simulation) condition pair.

    Attributes
    ----------
    pairs : (preequilibration condition index or -1, simulation condition index), length E
    times : per experiment, its output times (from 0, sorted, finite), array (N_e,)
    steady : per experiment, whether a measurement is at steady state (time inf)
    offset : per experiment, the row of its first time in the stacked simulation points; the
        steady state, where measured, is the row after its times
    """

    pairs: tuple[tuple[int, int], ...]
    times: tuple[np.ndarray, ...]
    steady: tuple[bool, ...]
    offset: tuple[int, ...]

    @property
    def n_points(self) -> int:
        return self.offset[-1] + self.times[-1].size + self.steady[-1] if self.pairs else 0


@dataclass(frozen=True)
class Measurements:
    """The measurement tables as arrays (length D, the rows of the tables in order).

    Attributes
    ----------
    frame : the measurement tables' text (the simulation table is a copy with 'simulation')
    observable : index into the observables
    experiment : index into :class:`Experiments`
    point : row of the stacked simulation points
    value : the measurement
    time : the time (inf at steady state)
    observable_parameters, noise_parameters : Source (D, K) of the placeholders' values
        (K the most placeholders of any observable; unused entries NaN)
    """

    frame: object
    observable: np.ndarray
    experiment: np.ndarray
    point: np.ndarray
    value: np.ndarray
    time: np.ndarray
    observable_parameters: Source
    noise_parameters: Source


def read_measurements(tables: list[Table], observables: Mapping[str, tuple[int, int]],
                      conditions: Conditions, parameters: Mapping[str, int]) -> tuple[Measurements, Experiments]:
    """The measurement tables and the experiments they need.

    ``observables`` maps each observable id to the number of its observable and noise placeholders.
    An unknown observable or condition, a bad number, a placeholder list of the wrong length are
    :class:`DataError` naming the file, line and column."""
    frame, where = concat(tables)
    D = len(frame)
    if D == 0:
        raise DataError(f"the measurement tables {[str(t.path) for t in tables]} have no rows")
    obs_ids = list(observables)
    cond = {c: i for i, c in enumerate(conditions.ids)}

    def column(name: str) -> list[str]:
        return list(frame[name]) if name in frame.columns else [""] * D

    values = [t.numbers("measurement") for t in tables]
    times = [t.numbers("time", finite=False) for t in tables]
    value, time = np.concatenate(values), np.concatenate(times)
    observable = np.empty(D, int)
    pair_of = []
    K = max([max(n) for n in observables.values()] + [1])
    sources = {k: (np.full((D, K), math.nan), np.full((D, K), -1)) for k in ("observableParameters", "noiseParameters")}
    for i, (oid, pre, sim) in enumerate(zip(column("observableId"), column("preequilibrationConditionId"),
                                            column("simulationConditionId"))):
        path, line = where[i]
        if oid not in observables:
            raise cell_error(path, line, "observableId", f"{oid!r} is not in the observable table")
        observable[i] = obs_ids.index(oid)
        for col, cid in (("simulationConditionId", sim), ("preequilibrationConditionId", pre)):
            if (cid or col[0] == "s") and cid not in cond:
                raise cell_error(path, line, col, f"{cid!r} is not in the condition table")
        if math.isnan(time[i]) or time[i] < 0:
            raise cell_error(path, line, "time", f"{time[i]:g} is not a time >= 0 (or inf for a steady state)")
        pair_of.append((cond[pre] if pre else -1, cond[sim]))
        for n, col in enumerate(("observableParameters", "noiseParameters")):
            text = column(col)[i]
            cells = text.split(";") if text else []
            want = observables[oid][n]
            if len(cells) != want:
                raise cell_error(path, line, col, f"the observable {oid} has {want} {col[:-10]} placeholder(s), "
                                                  f"the cell gives {len(cells)} value(s): {text!r}")
            for k, cell in enumerate(cells):
                sources[col][0][i, k], sources[col][1][i, k] = parse_value(cell.strip(), parameters, None, line, col)
    pairs = list(dict.fromkeys(pair_of))
    experiment = np.array([pairs.index(p) for p in pair_of])
    exp_times, steady, offset, point = [], [], [], np.empty(D, int)
    row = 0
    for e in range(len(pairs)):
        mine = experiment == e
        finite = np.unique(time[mine & np.isfinite(time)])
        grid = np.unique(np.concatenate([[0.0], finite]))
        exp_times.append(grid)
        steady.append(bool(np.any(mine & np.isinf(time))))
        offset.append(row)
        idx = np.flatnonzero(mine)
        point[idx] = np.where(np.isinf(time[idx]), row + grid.size, row + np.searchsorted(grid, time[idx]))
        row += grid.size + steady[-1]
    m = Measurements(frame, observable, experiment, point, value, time,
                     *(Source(*sources[c]) for c in ("observableParameters", "noiseParameters")))
    return m, Experiments(tuple(pairs), tuple(exp_times), tuple(steady), tuple(offset))

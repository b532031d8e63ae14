"""Measurements: validation of time grids, observed series, initial values and noise levels.

Every data input of pgpgm passes through this module before any compiled code runs; a bad
input raises :class:`~pgpgm.errors.DataError` naming the input (state, column, row) and
saying what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from .checks import SHOW, as_float_array, check_magnitude, check_times, rows
from .errors import DataError, ModelDefinitionError

if TYPE_CHECKING:
    from .ode.system import ODESystem

@dataclass(frozen=True)
class Observations:
    """Measured series on one time grid, with missing values.

    Attributes
    ----------
    times : (N,) the grid (time units): the union of the observation times of the observed
        states, or a user grid that contains them
    values : (N, M) the measurements (state units), NaN where a state is not measured
    states : the M observed state names
    mask : (N, M) bool, True where ``values`` holds a measurement (default: where it is finite)

    Every observed state has at least 3 measurements (checked by :func:`as_observations`).
    """

    times: np.ndarray
    values: np.ndarray
    states: tuple[str, ...]
    mask: np.ndarray | None = None

    def __post_init__(self):
        if self.mask is None:
            object.__setattr__(self, "mask", np.isfinite(self.values))

    @property
    def complete(self) -> bool:
        """Whether every state is measured at every grid time (no missing value)."""
        return bool(self.mask.all())

    @property
    def n_obs(self) -> np.ndarray:
        """(M,) number of measurements of each observed state."""
        return self.mask.sum(axis=0)

    def rows(self, state: int | str) -> np.ndarray:
        """Grid rows (K,) where state ``state`` (index m or name) is measured."""
        m = self.states.index(state) if isinstance(state, str) else state
        return np.flatnonzero(self.mask[:, m])

    def state_times(self, state: int | str) -> np.ndarray:
        """(K,) observation times of one observed state."""
        return self.times[self.rows(state)]

    def state_values(self, state: int | str) -> np.ndarray:
        """(K,) measurements of one observed state, at :meth:`state_times`."""
        m = self.states.index(state) if isinstance(state, str) else state
        return self.values[self.rows(m), m]

    def filled(self, fill: float = 0.0) -> np.ndarray:
        """(N, M) ``values`` with ``fill`` where not measured."""
        return np.where(self.mask, self.values, fill)

    def difference_noise_sd(self) -> np.ndarray:
        """(M,) a model-free estimate of each state's noise sd (state units) from its measurements
        alone: the rms deviation of every inner measurement from the straight line through its two
        neighbours, scaled so that white noise of sd s gives s (an uneven grid weighted exactly).
        The signal's curvature between neighbours adds to it, so it errs high on sparse or fast
        series; it cannot err low as a GP that mistakes noise for signal can."""
        out = np.zeros(len(self.states))
        for m in range(len(self.states)):
            t, v = self.state_times(m), self.state_values(m)
            h1, h2 = np.diff(t)[:-1], np.diff(t)[1:]
            line = (h2 * v[:-2] + h1 * v[2:]) / (h1 + h2)  # the neighbours' line at the middle time
            var = 1 + (h1**2 + h2**2) / (h1 + h2) ** 2  # variance of v - line in units of s^2
            out[m] = np.sqrt(np.mean((v[1:-1] - line) ** 2 / var))
        return out


_LONG = ("time", "state", "value")


def _long_to_wide(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """A tidy long table (columns time, state, value; one row per measurement) as
    ``{"time": union of times, state: values with NaN where not measured}``."""
    extra = [c for c in table.columns if c not in _LONG]
    if extra:
        raise DataError(f"a long table has the columns time, state, value only; it also has {extra}")
    t = as_float_array(table["time"], "the 'time' column")
    bad = ~np.isfinite(t)
    if bad.any():
        raise DataError(f"the 'time' column contains NaN or inf (rows {rows(bad)}); remove those rows")
    v = as_float_array(table["value"].to_numpy(dtype=object), "the 'value' column") \
        if table["value"].dtype == object else as_float_array(table["value"], "the 'value' column")
    states = table["state"].to_numpy()
    not_text = [x for x in states if not isinstance(x, str)]
    if not_text:
        raise DataError(f"the 'state' column must hold state names (text), got {not_text[:3]}")
    keep = ~np.isnan(v)  # a NaN value is a measurement not taken
    t, v, states = t[keep], v[keep], states[keep]
    times = np.unique(t)
    out: dict[str, np.ndarray] = {"time": times}
    for s in dict.fromkeys(states.tolist()):
        sel = states == s
        ts = t[sel]
        uniq, counts = np.unique(ts, return_counts=True)
        if np.any(counts > 1):
            raise DataError(f"state {s} has several values at time(s) {uniq[counts > 1][:SHOW].tolist()}; give one "
                            "value per time and state (e.g. their mean), or fit replicate series as experiments of "
                            "one study (pgpgm.fit_study)")
        col = np.full(times.size, np.nan)
        col[np.searchsorted(times, ts)] = v[sel]
        out[s] = col
    return out


def _is_long(data) -> bool:
    return isinstance(data, pd.DataFrame) and {"state", "value"} <= set(map(str, data.columns))


def _columns(data) -> tuple[object, dict[str, object]]:
    """The raw time column and the per-state columns of ``data``."""
    if isinstance(data, xr.Dataset):
        if "y" not in data.data_vars:
            raise DataError("the Dataset has no variable 'y' (time, observed); pass the Dataset returned by "
                            f"pgpgm.simulate, or a DataFrame/dict with a 'time' column (it has {list(data.data_vars)})")
        y = data["y"]
        if set(y.dims) != {"time", "observed"} or "observed" not in y.coords or "time" not in y.coords:
            raise DataError(f"the Dataset's 'y' must have dimensions (time, observed) with coordinates, got {y.dims}")
        y = y.transpose("time", "observed")
        return y["time"].values, {str(s): y.sel(observed=s).values for s in y["observed"].values.tolist()}
    if _is_long(data):
        if "time" not in data.columns:
            raise DataError("the long table has no 'time' column; give columns time, state, value")
        data = _long_to_wide(data)
    if isinstance(data, pd.DataFrame):
        if data.columns.has_duplicates:
            dup = data.columns[data.columns.duplicated()].tolist()
            raise DataError(f"the table has repeated columns {dup}; give one column per state")
        data = {c: data[c] for c in data.columns}
    if not isinstance(data, Mapping):
        raise DataError(f"data must be a Dataset from pgpgm.simulate, or a DataFrame/dict with a 'time' column and "
                        f"one column per state, got {type(data).__name__}")
    if "time" not in data:
        raise DataError(f"data have no 'time' column (columns: {[str(k) for k in data][:10]}); add the measurement "
                        "times as a column named 'time'")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise DataError(f"data column names must be state names (text), got {bad_keys[:5]}")
    return data["time"], {k: v for k, v in data.items() if k != "time"}


def _observed_names(observed, available: Sequence[str], system: ODESystem) -> tuple[str, ...]:
    if observed is None:
        names = tuple(available)
    elif isinstance(observed, str):
        names = (observed,)
    else:
        try:
            names = tuple(observed)
        except TypeError:
            raise DataError(f"observed must be a state name or a list of state names, got {observed!r}") from None
    not_text = [n for n in names if not isinstance(n, str)]
    if not_text:
        raise DataError(f"observed must be state names (text), got {not_text[:5]}")
    if not names:
        raise DataError(f"no observed state: give observed=[...] with some of {list(system.states)} and data for them")
    unknown = [n for n in names if n not in system.states]
    if unknown:
        raise ModelDefinitionError(f"unknown state(s) {unknown} in observed; the states of {system.name} are "
                                   f"{list(system.states)}")
    if len(set(names)) != len(names):
        raise DataError(f"observed states are repeated in {list(names)}; name each once")
    return names


def as_observations(data, observed: Sequence[str] | str | None, system: ODESystem, *, grid=None) -> Observations:
    """Validate measurements and keep the states in ``observed``.

    Parameters
    ----------
    data : the measurements, in one of these forms:

        - a tidy long pandas DataFrame with columns ``time, state, value`` (one row per
          measurement; each state on its own times; a NaN value is a measurement not taken);
        - a wide DataFrame or dict ``{"time": t, state: values, ...}`` (every column 1-D of N
          real numbers; NaN where a state is not measured at that time);
        - the xarray Dataset of :func:`pgpgm.simulate` (variable ``y`` (time, observed),
          NaN where not measured).
    observed : the measured states (a name or a list; default every state in ``data``)
    system : the ODE system
    grid : optional (G,) strictly increasing time grid of the density (e.g. denser than the
        data); it must span every observation time. The result's grid is the union of
        ``grid`` and the observation times (an observation within 1e-9 of the grid's span of a
        grid point is put on that point). Default: the union of the observed states'
        observation times, starting at the data's first time (a wide table's or Dataset's first
        row is kept even when nothing is measured there). The initial values x0 refer to the
        grid's first time.

    Returns
    -------
    Observations
        times (N,), values (N, M) with NaN where not measured, and the mask (N, M).

    Raises
    ------
    ModelDefinitionError
        for an observed name that is not a state of ``system``.
    DataError
        naming the state, column or row of any unusable input: missing states,
        text/booleans/datetimes/complex/object values, columns that are not 1-D, lengths
        that differ from the times, inf, times not strictly increasing, a state with fewer
        than 3 measurements, a ``grid`` that does not cover the observations.
    """
    raw_t, columns = _columns(data)
    unknown = [k for k in columns if k not in system.states]
    if unknown:
        raise DataError(f"data columns {unknown} are not states of {system.name} {list(system.states)}; "
                        "rename or drop them")
    names = _observed_names(observed, list(columns), system)
    missing = [s for s in names if s not in columns]
    if missing:
        raise DataError(f"observed states {missing} have no data; data has {list(columns)}")
    t = check_times(raw_t, min_points=1, name="the 'time' column")
    cols = []
    for s in names:
        what = f"values of observed state {s}"
        v = as_float_array(columns[s], what)
        if v.ndim != 1:
            raise DataError(f"{what} must be 1-D (one value per time), got shape {v.shape}; give each state its own "
                            "column of N values")
        if v.size != t.size:
            raise DataError(f"{what} have {v.size} rows but there are {t.size} times; give one value per time "
                            "(NaN where the state is not measured), or a long table time, state, value")
        bad = np.isinf(v)
        if bad.any():
            raise DataError(f"{what} contain inf at rows {rows(bad)} (t = {t[bad][:SHOW].tolist()}); "
                            "remove those values or mark them as not measured (NaN)")
        n = int(np.isfinite(v).sum())
        if n < 3:
            raise DataError(f"observed state {s} has {n} measurement(s); each observed state needs at least 3 "
                            "(measure it more often, or leave it out of observed)")
        check_magnitude(v, what)
        cols.append(v)
    values = np.column_stack(cols)
    # times where no observed state is measured are dropped, except the table's first time: the
    # initial values (x0, a simulated Dataset's attrs["x0"]) refer to it
    measured = np.isfinite(values).any(axis=1)
    measured[0] = True
    t, values = t[measured], values[measured]
    if grid is not None:
        g = check_times(grid, min_points=3, name="grid")
        span = float(g[-1] - g[0])
        outside = (t < g[0] - 1e-9 * span) | (t > g[-1] + 1e-9 * span)
        if outside.any():
            m = np.isfinite(values[outside]).any(axis=0)
            who = [s for s, hit in zip(names, m) if hit]
            raise DataError(f"grid [{g[0]:g}, {g[-1]:g}] does not cover the observations of {who} at t = "
                            f"{t[outside][:SHOW].tolist()}; extend the grid to span every observation time")
        pos = np.clip(np.searchsorted(g, t), 1, g.size - 1)
        near = np.where(np.abs(g[pos - 1] - t) <= np.abs(g[pos] - t), pos - 1, pos)
        t_on = np.where(np.abs(g[near] - t) <= 1e-9 * span, g[near], t)
        if np.unique(t_on).size < t_on.size:
            raise DataError("two observation times fall on one grid point (within 1e-9 of the grid's span); "
                            "give a grid without points that close to the observations, or merge those times")
        full = np.union1d(g, t_on)
        out = np.full((full.size, len(names)), np.nan)
        out[np.searchsorted(full, t_on)] = values
        t, values = full, out
    if t.size < 3:
        raise DataError(f"the time grid has {t.size} points; at least 3 are needed")
    return Observations(t, values, names, np.isfinite(values))


def _is_prior(value) -> bool:
    """Whether an x0 entry is a prior spec: a tuple ``(lower, upper)`` or a callable (a list is a
    vector of values, refused as such)."""
    return callable(value) or (isinstance(value, tuple) and len(value) == 2)


def initial_value_priors(system: ODESystem, x0, observed_idx: Sequence[int]) -> dict[str, object]:
    """The unknown initial values of ``x0``: ``{state: prior spec}`` for every entry given as
    ``(lower, upper)`` (a Uniform prior) or a callable ``name -> PyMC variable``.

    Raises
    ------
    DataError
        for a prior on a name that is not a state, or on an observed state (its initial value
        is estimated from its measurements already).
    """
    if not isinstance(x0, Mapping):
        return {}
    priors = {k: v for k, v in x0.items() if _is_prior(v)}
    unknown = [k for k in priors if k not in system.states]
    if unknown:
        raise DataError(f"x0 gives a prior for {unknown}, which are not states of {system.name} {list(system.states)}")
    observed = [k for k in priors if system.states.index(k) in set(observed_idx)]
    if observed:
        raise DataError(f"x0 gives a prior for the observed state(s) {observed}: an observed state's initial value is "
                        "estimated from its measurements already; give priors for latent states only")
    return priors


def known_observed_x0(system: ODESystem, x0, observed: Sequence[str]):
    """``x0`` split into the known initial values of the ``observed`` states and the rest: ``(rest, known)``,
    ``known`` a mapping observed state -> its number (held where given: at the start time), ``rest`` ``x0``
    without them (a mapping without those keys; a vector (S,) with NaN at every observed state's entry; None
    as None). A NaN in a vector leaves that observed state's initial value to be estimated; a prior for an
    observed state is refused by :func:`initial_value_priors`.

    Raises
    ------
    DataError
        for a mapping entry of an observed state that is not one finite number or a prior, or a vector of the
        wrong length.
    """
    if x0 is None:
        return None, {}
    if isinstance(x0, Mapping):
        known = {}
        for k, v in x0.items():
            if k in observed and not _is_prior(v):
                a = as_float_array(v, f"x0[{k}]")
                if a.size != 1 or not np.isfinite(a).all():
                    raise DataError(f"x0[{k}] must be one finite number (its known initial value), a prior "
                                    f"(lower, upper) for a latent state, or left out to estimate it; got {v!r}")
                known[k] = float(a.reshape(-1)[0])
        return {k: v for k, v in x0.items() if k not in known}, known
    v = as_float_array(x0, "x0")
    if v.shape != (system.n_states,):
        raise DataError(f"x0 must have {system.n_states} values, one per state {list(system.states)} (NaN: estimate "
                        f"an observed state's), got shape {v.shape}; or give a mapping {{state: value}}")
    idx = system.index_of_states(observed)
    known = {s: float(v[i]) for s, i in zip(observed, idx) if np.isfinite(v[i])}
    rest = v.copy()
    rest[idx] = np.nan
    return rest, known


def initial_values(system: ODESystem, data, x0, observed_idx: Sequence[int]) -> np.ndarray:
    """(S,) initial values of the solve; entries of observed states, and of latent states whose
    initial value is unknown (given a prior, see :func:`initial_value_priors`), are NaN.

    Parameters
    ----------
    x0 : mapping ``{state: value}`` (latent states at least; a value may be a prior
        ``(lower, upper)`` or a callable for an unknown initial value), a full (S,) vector
        whose observed entries are ignored, or None (then ``data.attrs["x0"]`` of a simulated
        Dataset)

    Raises
    ------
    DataError
        for unknown state names, a vector of the wrong length, values that are not real
        numbers, and a latent state without a finite initial value or a prior.
    """
    S = system.n_states
    x0_full = np.full(S, np.nan)
    if x0 is None and isinstance(data, xr.Dataset) and "x0" in data.attrs:
        x0 = list(np.atleast_1d(data.attrs["x0"]))
    priors = initial_value_priors(system, x0, observed_idx)
    if isinstance(x0, Mapping):
        unknown = [k for k in x0 if k not in system.states]
        if unknown:
            raise DataError(f"x0 names unknown states {unknown}; the states are {list(system.states)}")
        for k, v in x0.items():
            if k in priors:
                continue
            value = as_float_array(v, f"x0[{k}]")
            if value.size != 1:
                raise DataError(f"x0[{k}] must be one number or a prior (lower, upper) or a callable, got shape "
                                f"{value.shape}")
            x0_full[system.states.index(k)] = value.item()
    elif x0 is not None:
        v = as_float_array(x0, "x0")
        if v.shape != (S,):
            raise DataError(f"x0 must have {S} values, one per state {list(system.states)}, got shape {v.shape}; "
                            "or give a mapping {state: value} for the latent states")
        x0_full[:] = v
    x0_full[list(observed_idx)] = np.nan
    latent = [i for i in range(S) if i not in set(observed_idx)]
    missing = [system.states[i] for i in latent if not np.isfinite(x0_full[i]) and system.states[i] not in priors]
    if missing:
        raise DataError(f"initial values of the latent states {missing} are required and must be finite "
                        "(x0={state: value, ...}), or give a prior when unknown (x0={state: (lower, upper)})")
    return x0_full

"""Measurements: validation of time grids and observed series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from .errors import DataError

if TYPE_CHECKING:
    from .ode.system import ODESystem


def check_times(times, *, min_points: int = 2, name: str = "times") -> np.ndarray:
    """Validate a time grid: 1-D, finite, strictly increasing. Returns float array (N,)."""
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size < min_points:
        raise DataError(f"{name} must be a 1-D array of at least {min_points} points, got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise DataError(f"{name} contain NaN or inf")
    d = np.diff(t)
    if np.any(d == 0):
        raise DataError(f"{name} contain duplicates (at t = {t[1:][d == 0][:3].tolist()})")
    if np.any(d < 0):
        raise DataError(f"{name} must be sorted in increasing order")
    return t


@dataclass(frozen=True)
class Observations:
    """Measured series on one time grid.

    times : (N,); values : (N, M); states : the M observed state names.
    """

    times: np.ndarray
    values: np.ndarray
    states: tuple[str, ...]


def as_observations(data, observed: Sequence[str] | None, system: ODESystem) -> Observations:
    """Accept an xarray Dataset from :func:`pgpgm.simulate` (variable ``y``), a pandas
    DataFrame with a ``time`` column and one column per state, or a dict of arrays
    ``{"time": t, state: values, ...}``; keep the states in ``observed``."""
    if isinstance(data, xr.Dataset):
        t = data["time"].values
        avail = {s: data["y"].sel(observed=s).values for s in data["observed"].values.tolist()}
    else:
        if hasattr(data, "to_dict") and hasattr(data, "columns"):
            data = {c: data[c].to_numpy() for c in data.columns}
        if not isinstance(data, Mapping) or "time" not in data:
            raise DataError("data must be a Dataset from pgpgm.simulate, or a table/dict with a 'time' column")
        t = np.asarray(data["time"], float)
        avail = {k: np.asarray(v, float) for k, v in data.items() if k != "time"}
    unknown = [k for k in avail if k not in system.states]
    if unknown:
        raise DataError(f"data columns {unknown} are not states of {system.name} {list(system.states)}")
    observed = tuple(avail) if observed is None else tuple([observed] if isinstance(observed, str) else observed)
    system.index_of_states(observed)
    missing = [s for s in observed if s not in avail]
    if missing:
        raise DataError(f"observed states {missing} have no data; data has {list(avail)}")
    t = check_times(t, min_points=3)
    Y = np.column_stack([avail[s] for s in observed])
    if Y.shape[0] != t.size:
        raise DataError(f"data have {Y.shape[0]} rows but {t.size} times")
    if not np.all(np.isfinite(Y)):
        raise DataError("observations contain NaN or inf")
    return Observations(t, Y, observed)

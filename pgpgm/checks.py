"""Checks of plain inputs: arrays of real numbers, time grids, counts, noise levels, gamma, per-state mappings.

The leaf every layer validates its arguments with, before any compiled code runs: a bad input
raises :class:`~pgpgm.errors.DataError` naming the input (and its row) and saying what to do.
"""

from __future__ import annotations

import datetime
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .errors import DataError

SHOW = 5  # rows quoted in a message

#: The magnitudes of times, measurements and noise sds that pgpgm's 64-bit arithmetic handles:
#: it squares them (variances, kernel distances), and the squares of numbers outside this range
#: overflow (beyond about 1e154) or lose every digit (below about 1e-154).
MAGNITUDES = (1e-100, 1e100)


def power_of_ten(x: float) -> str:
    return f"1e{int(np.round(np.log10(x))):+d}"


def check_magnitude(values: np.ndarray, name: str, *, spread: bool = True) -> None:
    """Raise :class:`DataError` unless the finite ``values`` lie within :data:`MAGNITUDES`: their
    largest magnitude at most 1e100 and, with ``spread``, their range (max - min) at least 1e-100
    when it is not 0 (a constant series is refused elsewhere, with its own message).

    Parameters
    ----------
    values : any shape (NaN ignored); name : how the input is named in the message
    """
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return
    low, high = MAGNITUDES
    top = float(np.max(np.abs(v)))
    if top > high:
        raise DataError(f"{name} reach {top:.3g}; pgpgm computes with their squares in 64-bit floats, which overflow "
                        f"beyond about 1e154: rescale them (e.g. divide by {power_of_ten(top)}, i.e. use other units) "
                        f"so that they lie within {high:g} in magnitude, and the model's parameters with them")
    width = float(np.max(v) - np.min(v))
    if spread and 0.0 < width < low:
        raise DataError(f"{name} vary by only {width:.3g}; pgpgm computes with squares of their differences in 64-bit "
                        f"floats, which lose every digit below about 1e-154: rescale them (e.g. multiply by "
                        f"{power_of_ten(1.0 / width)}, i.e. use other units) so that they vary by at least {low:g}, "
                        "and the model's parameters with them")


def rows(mask: np.ndarray) -> str:
    """The first few positions where ``mask`` is True, as text."""
    idx = np.flatnonzero(mask)
    more = f" and {idx.size - SHOW} more" if idx.size > SHOW else ""
    return ", ".join(str(i) for i in idx[:SHOW]) + more


def as_float_array(values, name: str) -> np.ndarray:
    """``values`` as a float64 array, refusing what is not real numbers.

    Parameters
    ----------
    values : array-like of real numbers (any shape)
    name : how the input is named in the error message (e.g. ``"values of state x1"``)

    Returns
    -------
    numpy.ndarray, float64, same shape as ``values``

    Raises
    ------
    DataError
        for text, bytes, booleans, datetimes/timedeltas, complex numbers, structured or
        ragged data and objects that are not numbers (the message names the first bad row).
        NaN and inf are left to the caller.
    """
    if isinstance(values, (str, bytes)):
        raise DataError(f"{name} must be numbers, got the text {values[:40]!r}")
    if isinstance(values, (Mapping, set)):
        raise DataError(f"{name} must be numbers, got a {type(values).__name__}")
    if isinstance(values, (pd.Series, pd.Index)):
        values = (values.to_numpy(dtype=object) if isinstance(values.dtype, pd.api.extensions.ExtensionDtype)
                  else values.to_numpy())
    try:
        a = np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged nested sequences
        raise DataError(f"{name} must be a rectangular array of numbers ({exc})") from None
    kind = a.dtype.kind
    if kind == "b":
        raise DataError(f"{name} are booleans; give numbers (e.g. 0.0/1.0 as floats) instead")
    if kind in "mM":
        raise DataError(f"{name} are datetimes or timedeltas; convert them to numbers first "
                        "(e.g. hours since the first measurement)")
    if kind == "c":
        raise DataError(f"{name} are complex numbers; pgpgm fits real-valued data only")
    if kind in "US":  # text: numbers written as text are read, anything else names its row below
        a = a.astype(object)
    if kind == "V":
        raise DataError(f"{name} are a structured array; pass one numeric column")
    if kind in "iuf":
        return a.astype(np.float64)
    # object and text arrays: convert element by element and name the first bad row
    out = np.empty(a.shape, dtype=np.float64)
    for pos, v in np.ndenumerate(a):
        row = pos[0] if pos else 0
        if isinstance(v, (bool, np.bool_)):
            raise DataError(f"{name}: row {row} is a boolean ({v}); give numbers")
        if isinstance(v, (str, bytes)):
            try:
                out[pos] = float(v)
                continue
            except ValueError:
                raise DataError(f"{name}: row {row} is the text {v!r}, not a number; fix or remove that row") from None
        if isinstance(v, (complex, np.complexfloating)):
            raise DataError(f"{name}: row {row} is the complex number {v}; pgpgm fits real-valued data only")
        if isinstance(v, (datetime.date, datetime.timedelta, np.datetime64, np.timedelta64)):
            raise DataError(f"{name}: row {row} is a date/time ({v}); convert the column to numbers first "
                            "(e.g. hours since the first measurement)")
        if v is None or v is pd.NA or v is pd.NaT:
            raise DataError(f"{name}: row {row} is missing ({v}); fill it or remove that row")
        if not isinstance(v, numbers.Real):
            raise DataError(f"{name}: row {row} is {type(v).__name__} {str(v)[:40]!r}, not a number")
        out[pos] = float(v)
    return out


def check_times(times, *, min_points: int = 2, name: str = "times") -> np.ndarray:
    """Validate a time grid: 1-D, real, finite, strictly increasing.

    Returns
    -------
    numpy.ndarray (N,), float64 (the data's time unit)
    """
    t = as_float_array(times, name)
    if t.ndim != 1 or t.size < min_points:
        raise DataError(f"{name} must be a 1-D array of at least {min_points} points, got shape {t.shape}")
    bad = ~np.isfinite(t)
    if bad.any():
        raise DataError(f"{name} contain NaN or inf (rows {rows(bad)}); remove those rows")
    check_magnitude(t, name)
    d = np.diff(t)
    if np.any(d == 0):
        raise DataError(f"{name} contain duplicates (at t = {t[1:][d == 0][:3].tolist()}); "
                        "give one value per time (average repeated measurements, or fit replicate series as "
                        "experiments of one study: pgpgm.fit_study)")
    if np.any(d < 0):
        raise DataError(f"{name} must be sorted in increasing order (row {int(np.argmax(d < 0)) + 1} "
                        "is earlier than the row before); sort the data by time")
    return t


def noise_levels(noise_sd, M: int) -> np.ndarray:
    """(M,) positive, finite noise sds from a scalar or one value per observed state (state units)."""
    v = as_float_array(noise_sd, "noise_sd")
    if v.ndim > 1 or v.size not in (1, M):
        raise DataError(f"noise_sd must be one number or {M} (one per observed state), got shape {v.shape}")
    nsd = np.broadcast_to(v.reshape(-1), (M,)).copy()
    if np.any(~np.isfinite(nsd)) or np.any(nsd <= 0):
        raise DataError(f"noise_sd must be positive and finite, got {np.asarray(noise_sd).tolist()}; "
                        "omit it to estimate the noise")
    low, high = MAGNITUDES
    if np.any(nsd > high) or np.any(nsd < low):
        raise DataError(f"noise_sd {np.asarray(noise_sd, float).tolist()} is outside [{low:g}, {high:g}]; pgpgm computes with noise variances in "
                        "64-bit floats, which overflow or lose every digit there: rescale the data and noise_sd "
                        "together (other units), or omit noise_sd to estimate the noise")
    return nsd


def check_gamma(gamma) -> float:
    """The gradient-matching mismatch variance as a finite, non-negative float (state-derivative units^2)."""
    g = as_float_array(gamma, "gamma")
    if g.ndim != 0 or not np.isfinite(g) or g < 0:
        raise DataError(f"gamma must be one finite, non-negative number, got {gamma!r}; the default is 0.3")
    return float(g)


def check_count(value, name: str, *, minimum: int = 0) -> int:
    """``value`` as a Python int >= ``minimum`` (iterations, chains, seeds); booleans and
    non-integral numbers are refused with a DataError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise DataError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if value < minimum:
        raise DataError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def per_state(value, states: Sequence[str], name: str) -> list:
    """``value`` for each of ``states``: one value for all, or a mapping state -> value (every
    state given). Raises DataError naming unknown or missing states."""
    if not isinstance(value, Mapping):
        return [value] * len(states)
    unknown = [k for k in value if k not in states]
    if unknown:
        raise DataError(f"{name} given for {unknown}, which are not observed states {list(states)}")
    missing = [s for s in states if s not in value]
    if missing:
        raise DataError(f"{name} is a mapping but has no entry for the observed state(s) {missing}; give one per "
                        "observed state")
    return [value[s] for s in states]


def check_instance(value, kind, what: str) -> None:
    """Raise :class:`DataError` ``"<what>, got <value's type>"`` unless ``value`` is a ``kind`` (``what`` names the
    argument and how to make one)."""
    if not isinstance(value, kind):
        raise DataError(f"{what}, got {type(value).__name__}")

"""The command line's inputs: a tidy CSV of measurements read with every line checked, and the two kinds of
failure the command reports (a usage or input error, exit 2; a failed fit, exit 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class UsageError(Exception):
    """A command-line or input problem found before the fit (exit code 2)."""


class FitFailed(Exception):
    """The fit itself failed (exit code 1); the cause is chained."""


def read_tidy_csv(path: Path, states, *, experiment: str | None = None) -> dict:
    """A tidy CSV (columns ``time,state,value``, one row per measurement) as ``{"time": t, state: values}``;
    with ``experiment`` (a column name), one such dict per experiment, ``{name: {"time": t, ...}}`` in
    order of first appearance.

    Every row is checked, and an error names the CSV line: a time or value that is empty,
    ``nan``, infinite or not a number, a state the model does not have (``states``), two
    different values for one (time, state) (both lines are named; identical repeats are
    kept once). Each state may have its own times: a state's values are NaN at the times
    of the union where it is not measured (at least 3 per state are checked by the fit).

    Raises
    ------
    UsageError
        for an unreadable, empty or binary file and for every problem above.
    """
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text CSV file (binary content); give a CSV with columns time,state,value")
    except csv.Error as exc:
        raise UsageError(f"{path}: not a readable CSV file ({exc})") from None
    if any("\0" in c for row in rows for c in row):
        raise UsageError(f"{path}: not a text CSV file (binary content); give a CSV with columns time,state,value")
    lines = [(n, [c.strip() for c in row]) for n, row in enumerate(rows, start=1) if any(c.strip() for c in row)]
    if not lines:
        raise UsageError(f"{path}: the file is empty; give a CSV with the header time,state,value and one row per "
                         "measurement")
    header_line, header = lines[0]
    needed = ("time", "state", "value") + ((experiment,) if experiment else ())
    missing = [c for c in needed if c not in header]
    if missing:
        raise UsageError(f"{path}: missing columns {missing} in the header (line {header_line}: {header}); expected "
                         f"a tidy CSV {','.join(needed)}")
    col = {c: header.index(c) for c in needed}
    seen: dict[tuple, tuple[int, float]] = {}
    for n, row in lines[1:]:
        if len(row) != len(header):
            raise UsageError(f"{path} line {n}: {len(row)} fields, the header has {len(header)}")
        group = row[col[experiment]] if experiment else ""
        if experiment and not group:
            raise UsageError(f"{path} line {n}: the {experiment} is empty")
        state = row[col["state"]]
        if not state:
            raise UsageError(f"{path} line {n}: the state is empty")
        if state not in states:
            raise UsageError(f"{path} line {n}: state {state!r} is not a state of the model {list(states)}; "
                             "fix the name or remove its rows")
        number = {}
        for c in ("time", "value"):
            text = row[col[c]]
            try:
                number[c] = float(text)
            except ValueError:
                number[c] = None
            if number[c] is None or not np.isfinite(number[c]):
                what = ("missing" if text.lower() in ("", "nan", "na", "none", "null")
                        else f"not a finite number ({text!r})")
                raise UsageError(f"{path} line {n}: the {c} of state {state} is {what}; every row needs a finite "
                                 f"{c} (remove the row, and that time for every observed state)")
        key = (group, number["time"], state)
        if key in seen and seen[key][1] != number["value"]:
            raise UsageError(f"{path} lines {seen[key][0]} and {n}: two different values ({seen[key][1]} and "
                             f"{number['value']}) for state {state} at time {key[1]}"
                             + (f" in {experiment} {group}" if experiment else "")
                             + "; keep one (e.g. their mean), or give replicate series an experiment column (fitted "
                             "together as a study)")
        seen.setdefault(key, (n, number["value"]))
    if not seen:
        raise UsageError(f"{path}: no data rows after the header")
    out = {}
    for g in dict.fromkeys(k[0] for k in seen):
        times = np.array(sorted({t for e, t, _ in seen if e == g}))
        data = {"time": times}
        for state in dict.fromkeys(s for e, _, s in seen if e == g):
            data[state] = np.array([seen[(g, t, state)][1] if (g, t, state) in seen else np.nan for t in times])
        out[g] = data
    return out if experiment else out[""]

"""Comparisons with simulations made elsewhere: a simulation table (another tool's, or a benchmark
problem's ``simulatedData`` file) matched to a problem's measurements, and the petab library's
log-likelihood of it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError

#: The columns that identify a measurement (as the petab library matches simulations to measurements).
KEYS = ("observableId", "preequilibrationConditionId", "simulationConditionId", "time", "observableParameters",
        "noiseParameters")


def _keyed(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = pd.DataFrame({k: frame[k].astype(float) if k == "time" else
                        frame[k].astype(object).where(frame[k].notna(), "").astype(str) for k in keys})
    out["repeat"] = out.groupby(keys).cumcount()  # replicates match in order
    return out


def align_simulation(measurements: pd.DataFrame, table: pd.DataFrame, path: str | Path = "the table") -> np.ndarray:
    """The 'simulation' column of ``table`` in the order of the ``measurements`` rows (D,).

    Rows are matched on :data:`KEYS` (those both tables have, replicates in order). Where that
    leaves a measurement unmatched - tables that name conditions or overrides differently - the
    table must have the measurements' rows in order, with the same times, and is taken row by row.
    """
    if "simulation" not in table.columns:
        raise DataError(f"{path} has no 'simulation' column")
    keys = [k for k in KEYS if k in measurements.columns and k in table.columns]
    left, right = _keyed(measurements, keys), _keyed(table, keys)
    right["simulation"] = table["simulation"].to_numpy(float)
    merged = left.merge(right, on=[*keys, "repeat"], how="left")
    values = merged["simulation"].to_numpy(float)
    if not np.isnan(values).any():
        return values
    if len(table) == len(measurements) and np.allclose(table["time"].astype(float), measurements["time"].astype(float)):
        return table["simulation"].to_numpy(float)
    raise DataError(f"{path}: {int(np.isnan(values).sum())} measurements have no simulation, matched on {keys} "
                    "or row by row")


def petab_llh(files_yaml: Path, simulation: np.ndarray, parameters: Mapping[str, float] | None = None) -> float:
    """The petab library's log-likelihood (:func:`petab.v1.calculate_llh`) of the simulated values
    ``simulation`` (D,), in the order of the problem's measurement rows, its noise parameters at the parameter
    table's nominal values or at ``parameters`` (parameterId -> linear value) where given.

    The petab library evaluates noise formulas with numbers and the observable's own id only: a
    noise formula that holds its observable's formula (``a + b * (scale * x)``) gets the observable
    id in its place first (the same value); one that still names a state is an error."""
    import petab.v1 as petab
    import sympy as sp
    from petab.v1.math import sympify_petab

    problem = petab.Problem.from_yaml(files_yaml)
    observables = problem.observable_df.copy()
    for oid, row in observables.iterrows():
        noise = sympify_petab(str(row["noiseFormula"]))
        observables.loc[oid, "noiseFormula"] = str(noise.subs(sympify_petab(row["observableFormula"]),
                                                              sp.Symbol(oid, real=True)))
    sim = problem.measurement_df.drop(columns="measurement").assign(simulation=np.asarray(simulation, float))
    table = problem.parameter_df.copy()
    for pid, value in (parameters or {}).items():
        table.loc[pid, "nominalValue"] = float(value)
    return float(petab.calculate_llh(problem.measurement_df, sim, observables, table))

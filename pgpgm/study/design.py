"""A study: many experiments (subjects, conditions, replicates) of one ODE system, each with its own
measurements and known inputs (initial values such as a dose, constants of the equations).

:class:`Study` is a small immutable description; :meth:`Study.from_tidy` builds one from a tidy table
with an ``experiment`` column and a table of inputs, :meth:`Study.from_mapping` from mappings by
experiment name. :meth:`Study.check` validates it against a system before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..data import Observations, as_observations
from ..errors import DataError
from ..ode.system import ODESystem


@dataclass(frozen=True)
class StudyExperiment:
    """One experiment of a :class:`Study`.

    Attributes
    ----------
    name : the experiment's name (a subject, a condition, a replicate), a non-empty string
    data : its measurements, in any form :func:`pgpgm.fit` takes (tidy ``time, state, value``, wide,
        Dataset)
    x0 : known initial values by state name (at ``t0``), e.g. ``{"A": dose}``; an observed state's value is held
        as a latent state's is (leave it out to estimate it)
    fixed : known parameter values by name (constants of the equations in this experiment)
    t0 : the time the initial values hold at, at or before the experiment's first measurement (e.g. the dose
        time); None: its first measured time
    """

    name: str
    data: Any
    x0: Mapping[str, float] = field(default_factory=dict)
    fixed: Mapping[str, float] = field(default_factory=dict)
    t0: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise DataError(f"an experiment's name must be a non-empty string, got {self.name!r}")
        for what in ("x0", "fixed"):
            values = getattr(self, what)
            if not isinstance(values, Mapping):
                raise DataError(f"experiment {self.name!r}: {what} must be a mapping name -> number, got {values!r}")
            clean = {}
            for k, v in values.items():
                try:
                    f = float(v)
                except (TypeError, ValueError):
                    raise DataError(f"experiment {self.name!r}: {what}[{k!r}] must be a number, got {v!r}") from None
                if not np.isfinite(f):
                    raise DataError(f"experiment {self.name!r}: {what}[{k!r}] must be finite, got {v!r}")
                clean[str(k)] = f
            object.__setattr__(self, what, clean)
        if self.t0 is not None:
            try:
                t0 = float(self.t0)
            except (TypeError, ValueError):
                raise DataError(f"experiment {self.name!r}: t0 must be a number, got {self.t0!r}") from None
            if not np.isfinite(t0):
                raise DataError(f"experiment {self.name!r}: t0 must be finite, got {self.t0!r}")
            object.__setattr__(self, "t0", t0)
        if self.data is None or (isinstance(self.data, pd.DataFrame) and self.data.empty):
            raise DataError(f"experiment {self.name!r} has no data: give its measurements or leave it out of the "
                            "study")


@dataclass(frozen=True)
class Study:
    """Experiments of one system fitted together (:func:`pgpgm.fit_study`).

    Attributes
    ----------
    experiments : (K,) :class:`StudyExperiment`, distinct names
    observed : the measured states (default: every state in each experiment's data)
    """

    experiments: tuple[StudyExperiment, ...]
    observed: tuple[str, ...] | None = None

    def __post_init__(self):
        exps = tuple(self.experiments)
        if not exps:
            raise DataError("a study needs at least one experiment")
        if not all(isinstance(e, StudyExperiment) for e in exps):
            raise DataError("a study's experiments must be pgpgm.StudyExperiment objects")
        names = [e.name for e in exps]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DataError(f"experiment names must be distinct; repeated: {dup}")
        object.__setattr__(self, "experiments", exps)
        if self.observed is not None:
            obs = (self.observed,) if isinstance(self.observed, str) else tuple(self.observed)
            object.__setattr__(self, "observed", obs)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tidy(cls, data: pd.DataFrame, inputs: pd.DataFrame | None = None, *, experiment: str = "experiment",
                  x0: Mapping[str, str | float] | None = None, fixed: Mapping[str, str | float] | None = None,
                  observed: Sequence[str] | None = None, t0: str | float | None = None) -> Study:
        """A study from a tidy long table ``experiment, time, state, value`` and a table of inputs.

        Parameters
        ----------
        data : DataFrame with an ``experiment`` column (name given by ``experiment``) and the columns
            :func:`pgpgm.fit` takes in tidy form (``time, state, value``); experiments in order of
            first appearance
        inputs : DataFrame with one row per experiment (the same ``experiment`` column) and columns
            of known inputs, or None
        x0 : known initial values: state -> a column of ``inputs`` or a number for every experiment
            (e.g. ``{"A": "dose_mg_per_kg", "C": 0.0}``)
        fixed : known parameter values: parameter -> a column of ``inputs`` or a number
        observed : the measured states (default: those in ``data``)
        t0 : the time the initial values hold at: a column of ``inputs`` (e.g. the dose time), a number for
            every experiment, or None (each experiment's first measured time)

        Raises
        ------
        DataError : no ``experiment`` column; an experiment in ``inputs`` that has no data (unknown
            experiment), or one in ``data`` without a row of ``inputs`` when columns are asked for;
            a column that ``inputs`` lacks.
        """
        if not isinstance(data, pd.DataFrame) or experiment not in data.columns:
            raise DataError(f"data must be a tidy DataFrame with an {experiment!r} column (and time, state, value), "
                            f"got {type(data).__name__}" + (f" with columns {list(data.columns)}"
                                                            if isinstance(data, pd.DataFrame) else ""))
        key = data[experiment].astype(str)
        names = list(dict.fromkeys(key))
        x0, fixed = dict(x0 or {}), dict(fixed or {})
        columns = [c for c in (*x0.values(), *fixed.values(), t0) if isinstance(c, str)]
        rows: dict[str, pd.Series] = {}
        if inputs is not None:
            if not isinstance(inputs, pd.DataFrame) or experiment not in inputs.columns:
                raise DataError(f"inputs must be a DataFrame with an {experiment!r} column, one row per experiment")
            ikey = inputs[experiment].astype(str)
            unknown = [n for n in ikey if n not in names]
            if unknown:
                raise DataError(f"inputs name experiment(s) {unknown} that have no data (the data's experiments are "
                                f"{names}); remove them from the inputs or add their data")
            dup = sorted({n for n in ikey if list(ikey).count(n) > 1})
            if dup:
                raise DataError(f"inputs must have one row per experiment; repeated: {dup}")
            missing = [c for c in columns if c not in inputs.columns]
            if missing:
                raise DataError(f"inputs lack the column(s) {missing}; its columns are {list(inputs.columns)}")
            rows = {n: r for n, (_, r) in zip(ikey, inputs.iterrows())}
        elif columns:
            raise DataError(f"x0 / fixed / t0 name input columns {columns} but no inputs table was given")
        if columns:
            lacking = [n for n in names if n not in rows]
            if lacking:
                raise DataError(f"experiment(s) {lacking} have no row in the inputs (columns {columns} are needed)")

        def value(spec, name):
            return rows[name][spec] if isinstance(spec, str) else spec

        exps = []
        for n in names:
            part = data[key == n].drop(columns=[experiment]).reset_index(drop=True)
            exps.append(StudyExperiment(n, part, {s: value(v, n) for s, v in x0.items()},
                                        {p: value(v, n) for p, v in fixed.items()}, None if t0 is None else value(t0, n)))
        return cls(tuple(exps), observed)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, x0: Mapping[str, Mapping[str, float]] | None = None,
                     fixed: Mapping[str, Mapping[str, float]] | None = None,
                     observed: Sequence[str] | None = None, t0: float | Mapping[str, float] | None = None) -> Study:
        """A study from ``{experiment: data}`` and, by experiment, ``x0`` and ``fixed`` mappings; ``t0`` one start
        time for every experiment or a mapping by experiment (None: each experiment's first measured time).

        Raises
        ------
        DataError : ``x0`` or ``fixed`` name an experiment that ``data`` lacks.
        """
        if not isinstance(data, Mapping) or not data:
            raise DataError("data must be a non-empty mapping experiment name -> measurements")
        names = [str(k) for k in data]
        for what, given in (("x0", x0), ("fixed", fixed), ("t0", t0 if isinstance(t0, Mapping) else None)):
            unknown = [k for k in (given or {}) if str(k) not in names]
            if unknown:
                raise DataError(f"{what} names experiment(s) {unknown} that have no data (experiments: {names})")
        x0 = {str(k): v for k, v in (x0 or {}).items()}
        fixed = {str(k): v for k, v in (fixed or {}).items()}
        starts = {str(k): v for k, v in t0.items()} if isinstance(t0, Mapping) else {str(k): t0 for k in data}
        return cls(tuple(StudyExperiment(str(k), v, x0.get(str(k), {}), fixed.get(str(k), {}), starts.get(str(k)))
                         for k, v in data.items()), observed)

    # ------------------------------------------------------------------ access
    @property
    def names(self) -> tuple[str, ...]:
        """The experiments' names (K,)."""
        return tuple(e.name for e in self.experiments)

    def __len__(self) -> int:
        return len(self.experiments)

    def __getitem__(self, name: str) -> StudyExperiment:
        for e in self.experiments:
            if e.name == name:
                return e
        raise DataError(f"no experiment {name!r} in the study; its experiments are {list(self.names)}")

    def subset(self, names: Sequence[str]) -> Study:
        """The study of the experiments ``names`` only (in that order)."""
        return Study(tuple(self[n] for n in names), self.observed)

    def check(self, system: ODESystem) -> tuple[Observations, ...]:
        """Validate every experiment against ``system``; returns their observations (K,).

        Raises
        ------
        DataError : unusable data (see :func:`pgpgm.data.as_observations`); an ``x0`` naming a state or a
            ``fixed`` naming a parameter that the system lacks; a latent state without a known
            initial value; a ``t0`` after the first measurement. Each experiment's grid starts at its ``t0``.
        """
        out = []
        for e in self.experiments:
            bad = [s for s in e.x0 if s not in system.states]
            if bad:
                raise DataError(f"experiment {e.name!r}: x0 names unknown state(s) {bad}; the states are "
                                f"{list(system.states)}")
            bad = [p for p in e.fixed if p not in system.parameters]
            if bad:
                raise DataError(f"experiment {e.name!r}: fixed names unknown parameter(s) {bad}; the parameters are "
                                f"{list(system.parameters)}")
            try:
                obs = as_observations(e.data, self.observed, system)
                if e.t0 is not None and e.t0 != obs.times[0]:
                    if e.t0 > obs.times[0]:
                        raise DataError(f"t0 = {e.t0:g} is after the first measured time {obs.times[0]:g}: the start "
                                        "must come before every measurement")
                    obs = as_observations(e.data, self.observed, system, grid=np.union1d(obs.times, [e.t0]))
            except DataError as exc:
                raise DataError(f"experiment {e.name!r}: {exc}") from None
            latent = [s for s in system.states if s not in obs.states and s not in e.x0]
            if latent:
                raise DataError(f"experiment {e.name!r}: the latent state(s) {latent} need a known initial value "
                                "(x0 in the study's inputs)")
            out.append(obs)
        return tuple(out)

"""Log scale for positive states: a symbolic transform of an ODE system and its data.

For a positive state x the substitution u = log x turns dx/dt = f(t, x, theta) into

    du/dt = f(t, x, theta) / x   evaluated at x = e^u,

derived here by sympy, so the transformed system is an ordinary :class:`ODESystem` with
exact Jacobians, compiled kernels and PyTensor expressions like any other. A transformed
state is named ``"log_<state>"`` (``"P"`` becomes ``"log_P"``); the other states keep their
names and every state keeps its position, so state indices are the same in both systems.

:class:`LogScale` bundles the original system, the transformed one and the maps between
them (values, initial values, data); :mod:`pgpgm.pipeline` uses it to run the method on the
log scale (``fit(noise={"P": "lognormal"})`` or ``fit(transform={"P": "log"})``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import sympy as sp

from ..errors import DataError, ModelDefinitionError
from .parse import check_expression
from .system import ODESystem

PREFIX = "log_"


def log_name(state: str) -> str:
    """Name of the log-transformed state ``state`` (``"P"`` -> ``"log_P"``)."""
    return PREFIX + state


def log_transform(system: ODESystem, states: Sequence[str]) -> ODESystem:
    """The system with ``states`` replaced by their logarithms, u = log x.

    Parameters
    ----------
    system : ODESystem, dx/dt = f(t, x, theta) with S states
    states : names of the states to transform (each must stay positive along every
        solution of interest; e.g. populations, concentrations)

    Returns
    -------
    ODESystem
        Same parameters, same state order; state ``s`` in ``states`` becomes ``"log_s"``
        with du/dt = f(t, x, theta)/x at x_s = e^u (sympy's ``expand`` then ``powsimp``
        cancel the e^u factors where they cancel exactly). Name ``"<name>-log"``.

    Raises
    ------
    ModelDefinitionError
        for an unknown or repeated state name, or a new name that clashes with an existing
        state or parameter.
    """
    idx = system.index_of_states(list(states))
    if not idx:
        return system
    t, xs, ps = system.symbols
    new_names = [log_name(s) if i in idx else s for i, s in enumerate(system.states)]
    taken = set(system.states) | set(system.parameters)
    clash = [n for i, n in enumerate(new_names) if i in idx and n in taken]
    if clash:
        raise ModelDefinitionError(f"the log-transformed state names {clash} are already used in {system.name}; "
                                   "rename that state or parameter")
    us = {i: sp.Symbol(new_names[i], real=True) for i in idx}
    sub = {xs[i]: sp.exp(us[i]) for i in idx}
    exprs = []
    for i, e in enumerate(system.expressions):
        e = e.subs(sub)
        if i in idx:
            e = sp.powsimp(sp.expand(e * sp.exp(-us[i])))
        check_expression(e, where=f"log transform of the equation for {system.states[i]}")
        exprs.append(e)
    return ODESystem(tuple(new_names), system.parameters, tuple(exprs), f"{system.name}-log")


@dataclass(frozen=True, eq=False)
class LogScale:
    """A system with some states on the log scale, and the maps to and from it.

    Attributes
    ----------
    original : ODESystem (S states)
    states : names (original) of the states on the log scale
    """

    original: ODESystem
    states: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "states", tuple(self.states))
        self.original.index_of_states(list(self.states))  # unknown or repeated names raise

    @cached_property
    def system(self) -> ODESystem:
        """The transformed system (see :func:`log_transform`)."""
        return log_transform(self.original, self.states)

    @property
    def index(self) -> list[int]:
        """Positions of the transformed states (the same in both systems)."""
        return self.original.index_of_states(list(self.states))

    def name(self, state: str) -> str:
        """The transformed system's name of an original state."""
        return log_name(state) if state in self.states else state

    def original_name(self, name: str) -> str:
        """The original state name of a transformed system's state name."""
        for s in self.states:
            if name == log_name(s):
                return s
        return name

    # ------------------------------------------------------------------ values
    def to_log(self, x, states: Sequence[str] | None = None) -> np.ndarray:
        """Values on the transformed scale: log of the columns of transformed states.

        Parameters
        ----------
        x : (..., K) values of ``states`` (default: every state, K = S), original units
        states : the original names of the K columns

        Raises
        ------
        DataError : for a value <= 0 of a transformed state (its log is undefined).
        """
        x = np.array(x, dtype=float)
        states = self.original.states if states is None else tuple(states)
        for k, s in enumerate(states):
            if s in self.states:
                col = x[..., k]
                bad = np.isfinite(col) & (col <= 0)
                if bad.any():
                    raise DataError(f"state {s} is on the log scale but has values <= 0 ({col[bad][:5].tolist()}); "
                                    "give positive values or drop the log scale/lognormal noise for it")
                x[..., k] = np.log(col)
        return x

    def to_original(self, u, states: Sequence[str] | None = None) -> np.ndarray:
        """Inverse of :meth:`to_log`: exp of the columns of transformed states, (..., K)."""
        u = np.array(u, dtype=float)
        states = self.original.states if states is None else tuple(states)
        for k, s in enumerate(states):
            if s in self.states:
                u[..., k] = np.exp(u[..., k])
        return u

    def x0_to_log(self, x0):
        """Initial values for the transformed system, in the form given (None, mapping or (S,))."""
        if x0 is None:
            return None
        if isinstance(x0, Mapping):
            out = {}
            for k, v in x0.items():
                if k in self.states:
                    if callable(v) or isinstance(v, tuple | list):
                        raise DataError(f"x0[{k}]: a prior for the initial value of a state on the log scale is "
                                        f"not supported; give a positive number, or drop the log scale for {k}")
                    value = float(np.asarray(v, float))
                    if not value > 0:
                        raise DataError(f"x0[{k}] = {value} must be positive: state {k} is on the log scale")
                    out[log_name(k)] = np.log(value)
                else:
                    out[k] = v
            return out
        v = np.array(x0, dtype=float).reshape(-1)
        if v.size != self.original.n_states:
            return x0  # the data module names the problem
        u = v.copy()
        for i in self.index:
            if np.isfinite(v[i]):
                if not v[i] > 0:
                    raise DataError(f"x0 of state {self.original.states[i]} is {v[i]}; it must be positive on "
                                    "the log scale")
                u[i] = np.log(v[i])
        return u

    def data_to_log(self, data, observed: Sequence[str] | None):
        """The data with the transformed states' values logged and their names changed.

        Accepts what :func:`pgpgm.fit` accepts: a Dataset from :func:`pgpgm.simulate`
        (``y`` (time, observed); ``attrs["x0"]`` logged too), a DataFrame or dict in wide
        form (``time`` and one column per state) or a DataFrame in long form (``time``,
        ``state``, ``value``). Returns the same kind of object and the transformed
        ``observed``. Missing values (NaN) stay missing.

        Raises
        ------
        DataError : naming the state and the rows of values <= 0 of a transformed state.
        """
        import pandas as pd
        import xarray as xr

        obs_t = None if observed is None else ([self.name(observed)] if isinstance(observed, str)
                                                 else [self.name(s) for s in observed])
        if isinstance(data, xr.Dataset) and "y" in data.data_vars and "observed" in data["y"].coords:
            names = [str(s) for s in data["y"]["observed"].values.tolist()]
            y = data["y"].transpose(..., "observed")
            for s, col in zip(names, np.moveaxis(np.asarray(y.values, float), -1, 0)):
                self._check_positive(s, col)
            new_y = y.copy(data=self.to_log(y.values, names)).assign_coords(observed=[self.name(s) for s in names])
            out = xr.Dataset({"y": new_y}, attrs=dict(data.attrs))
            if "x0" in data.attrs:
                out.attrs["x0"] = self.x0_to_log(np.atleast_1d(data.attrs["x0"])).tolist()
            return out, obs_t
        if isinstance(data, pd.DataFrame) and {"state", "value"} <= set(data.columns):
            out = data.copy()
            values = out["value"].to_numpy(dtype=float, copy=True)
            for s in self.states:
                rows = (out["state"] == s).to_numpy()
                self._check_positive(s, values[rows], np.flatnonzero(rows))
                values[rows] = np.log(values[rows])
            out["value"] = values
            out["state"] = [self.name(s) if isinstance(s, str) else s for s in out["state"]]
            return out, obs_t
        if isinstance(data, pd.DataFrame | Mapping):
            out = {}
            for k, v in (data.items() if isinstance(data, Mapping) else ((c, data[c]) for c in data.columns)):
                if k in self.states:
                    col = np.asarray(v, dtype=float)
                    self._check_positive(k, col)
                    out[log_name(k)] = np.log(col)
                else:
                    out[k] = v
            return (pd.DataFrame(out) if isinstance(data, pd.DataFrame) else out), obs_t
        return data, obs_t  # anything else: the data module names the problem

    def _check_positive(self, state: str, values, rows=None) -> None:
        if state not in self.states:
            return
        v = np.asarray(values, dtype=float)
        bad = np.isfinite(v) & (v <= 0)
        if bad.any():
            where = np.flatnonzero(bad) if rows is None else np.asarray(rows)[bad]
            raise DataError(f"observed state {state} has values <= 0 at rows {where[:5].tolist()} "
                            f"({v[bad][:5].tolist()}), but lognormal noise or the log scale needs positive "
                            f"values; remove those rows or use noise='normal' for {state}")

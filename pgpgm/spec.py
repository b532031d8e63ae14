"""Model files: an ODE system and its experiment set-ups, read from TOML.

A model file has ``name``, ``parameters``, an ``[equations]`` table (state ->
right-hand side string), an optional ``[experiment]`` table of defaults and
``[cases.NAME]`` tables that override it. The published systems ship in
``models/`` and load by name: ``pgpgm.load_model("lotka-volterra")``.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MissingFileError, ModelDefinitionError, UnknownNameError
from .ode.system import ODESystem
from .priors import DEFAULT_BOUNDS
from .simulate import simulate


@dataclass(frozen=True)
class Experiment:
    """One experiment set-up: what is simulated, observed and assumed.

    Attributes
    ----------
    name : case name, e.g. ``"x2-observed"``.
    observed : names of the measured states.
    theta : true parameters (P,), or None for real data.
    x0 : initial state (S,) at ``times[0]``.
    times : observation times (N,).
    noise_sd : noise standard deviation (scalar) or None.
    snr : signal-to-noise ratio (per observed state, mean(signal^2)/noise variance) or None.
    kernel : GP kernel name.
    gamma : gradient-matching mismatch variance.
    iterations : published MCMC iterations (burn-in + draws).
    prior_bounds : (P, 2) lower/upper bounds of the uniform parameter priors.
    extra : the file's keys that are not fields here (those of :data:`EXPERIMENT_KEYS`
        such as ``least_squares_bad_start``).
    """

    name: str
    observed: tuple[str, ...]
    theta: np.ndarray | None
    x0: np.ndarray
    times: np.ndarray
    noise_sd: float | None = None
    snr: float | None = None
    kernel: str = "rbf"
    gamma: float = 0.3
    iterations: int = 3500
    prior_bounds: np.ndarray | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """An ODE system with its named experiment cases."""

    system: ODESystem
    cases: Mapping[str, Experiment]
    description: str = ""

    def priors(self, case: str | None = None) -> dict[str, tuple[float, float]]:
        """The case's uniform prior bounds by parameter name (for :func:`pgpgm.build_model`)."""
        c = self.case(case)
        return {p: (float(lo), float(hi)) for p, (lo, hi) in zip(self.system.parameters, c.prior_bounds)}

    def simulate(self, case: str | None = None, *, seed=None, observed=None):
        """The case's simulated data set (:func:`pgpgm.simulate` with its theta, x0, times and noise)."""
        c = self.case(case)
        return simulate(self.system, c.theta, c.x0, c.times, observed=observed or c.observed,
                        noise_sd=c.noise_sd, snr=c.snr, seed=seed)

    def case(self, name: str | None = None) -> Experiment:
        """The case called ``name`` (the first one when None)."""
        if name is None:
            return next(iter(self.cases.values()))
        if name not in self.cases:
            raise UnknownNameError(f"{self.system.name} has no case {name!r}; cases: {list(self.cases)}")
        return self.cases[name]


def available_models() -> list[str]:
    """Names of the models shipped with pgpgm."""
    files = resources.files("pgpgm.models").iterdir()
    return sorted(f.name[:-5].replace("_", "-") for f in files if f.name.endswith(".toml"))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """Load a shipped model by name (``"lotka-volterra"``) or a TOML model file by path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise MissingFileError(f"no model file {p}; give the path of a TOML model file, or the name of a shipped "
                                   f"model: {available_models()}")
        text = p.read_text()
    else:
        fname = str(name_or_path).replace("-", "_") + ".toml"
        res = resources.files("pgpgm.models") / fname
        if not res.is_file():
            raise UnknownNameError(f"unknown model {name_or_path!r}; shipped models: {available_models()} (or the "
                                   "path of a model file)")
        text = res.read_text()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelDefinitionError(f"{name_or_path}: not valid TOML ({exc})") from None
    return spec_from_dict(doc)


#: Keys of a model file's top level, with what each holds.
TOP_KEYS: Mapping[str, str] = {
    "name": "the model's name",
    "description": "one line describing the model and where it comes from",
    "parameters": "list of parameter names",
    "equations": "table state -> right-hand side string",
    "experiment": "table of defaults shared by every case",
    "cases": "tables [cases.NAME] overriding the experiment",
}
#: Keys of ``[experiment]`` and ``[cases.NAME]``.
EXPERIMENT_KEYS: Mapping[str, str] = {
    "observed": "list of measured states",
    "theta": "true parameters (simulated data)",
    "x0": "initial state at the first time",
    "times": "list of times, or {start, stop, num}",
    "noise_sd": "noise standard deviation",
    "snr": "signal-to-noise ratio",
    "kernel": "GP kernel name",
    "gamma": "gradient-matching mismatch variance",
    "iterations": "MCMC iterations (burn-in + draws)",
    "priors": "{lower, upper}: uniform prior bounds (scalars or one per parameter)",
    # Extra keys kept in Experiment.extra for the code that uses them:
    "least_squares_bad_start": "a start from which least squares alone falls into a local minimum",
}
#: Keys of Experiment fields; the other EXPERIMENT_KEYS go to Experiment.extra.
_FIELD_KEYS = {"observed", "theta", "x0", "times", "noise_sd", "snr", "kernel", "gamma", "iterations", "priors"}
PRIOR_KEYS: Mapping[str, str] = {"lower": "lower bounds", "upper": "upper bounds"}
TIMES_KEYS: Mapping[str, str] = {"start": "first time", "stop": "last time", "num": "number of times"}


def _hint(key: str, known: Mapping[str, str]) -> str:
    """'did you mean ...' for a misspelt key: a close key of the same table, else of another."""
    if m := difflib.get_close_matches(key, list(known), n=1):
        return f"did you mean {m[0]!r}?"
    tables = {"the top level": TOP_KEYS, "[experiment] and [cases.NAME]": EXPERIMENT_KEYS,
              "priors": PRIOR_KEYS, "times": TIMES_KEYS}
    for table, keys in tables.items():
        if m := difflib.get_close_matches(key, list(keys), n=1):
            return f"did you mean {m[0]!r}, a key of {table}?"
    return ""


def _check_keys(table: Any, known: Mapping[str, str], where: str) -> Mapping[str, Any]:
    """``table`` as a mapping whose keys are all in ``known``; else a ModelDefinitionError naming them."""
    if not isinstance(table, Mapping):
        raise ModelDefinitionError(f"{where} must be a table, got {type(table).__name__} {table!r:.100}")
    unknown = [k for k in table if k not in known]
    if unknown:
        hints = [_hint(str(k), known) for k in unknown]
        hints = [h for h in hints if h]
        raise ModelDefinitionError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in {where}"
            f"{' (' + '; '.join(hints) + ')' if hints else ''}; the known keys are: {', '.join(known)}"
        )
    return table


def _floats(v: Any, shape: tuple[int, ...], what: str, *, broadcast: bool = False) -> np.ndarray:
    """``v`` as a float array of ``shape`` (a scalar broadcast when allowed)."""
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        raise ModelDefinitionError(f"{what} must be numbers, got {v!r:.100}") from None
    if broadcast and a.ndim == 0:
        a = np.broadcast_to(a, shape)
    if a.shape != shape:
        raise ModelDefinitionError(f"{what} must have shape {shape} ({'a number or ' if broadcast else ''}"
                                   f"{shape[0]} values), got {a.shape}")
    return np.array(a)


def _scalar(v: Any, kind: type, what: str):
    if v is None:
        return None
    if kind is str:
        if not isinstance(v, str):
            raise ModelDefinitionError(f"{what} must be a string, got {v!r:.100}")
        return v
    if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not float(v).is_integer()):
        raise ModelDefinitionError(f"{what} must be {'an integer' if kind is int else 'a number'}, got {v!r:.100}")
    return kind(v)


def _times(v, where: str) -> np.ndarray:
    if isinstance(v, Mapping):
        _check_keys(v, TIMES_KEYS, f"{where} times")
        missing = [k for k in TIMES_KEYS if k not in v]
        if missing:
            raise ModelDefinitionError(f"{where} times lacks {missing}; write {{start = 0, stop = 10, num = 50}}")
        return np.linspace(_scalar(v["start"], float, f"{where} times.start"),
                           _scalar(v["stop"], float, f"{where} times.stop"),
                           _scalar(v["num"], int, f"{where} times.num"))
    t = _floats(v, (len(v),) if isinstance(v, list) else (), f"{where} times")
    if t.ndim != 1:
        raise ModelDefinitionError(f"{where} times must be a list of numbers or {{start, stop, num}}")
    return t


def spec_from_dict(doc: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from the parsed TOML document.

    Every key is checked: an unknown key (a typo such as ``prior`` for ``priors``) is a
    :class:`ModelDefinitionError` naming it and listing the known ones (:data:`TOP_KEYS`,
    :data:`EXPERIMENT_KEYS`, :data:`PRIOR_KEYS`, :data:`TIMES_KEYS`).
    """
    _check_keys(doc, TOP_KEYS, "the model file")
    for key in ("parameters", "equations"):
        if key not in doc:
            raise ModelDefinitionError(f"model file lacks the required key {key!r}")
    system = ODESystem.from_equations(doc["equations"], doc["parameters"], name=doc.get("name", "ode"))
    base = dict(_check_keys(doc.get("experiment", {}), EXPERIMENT_KEYS, "[experiment]"))
    cases_doc = doc.get("cases") or {"default": {}}
    if not isinstance(cases_doc, Mapping):
        raise ModelDefinitionError(f"[cases] must be tables [cases.NAME], got {type(cases_doc).__name__}")
    cases = {}
    for cname, over in cases_doc.items():
        where = f"[cases.{cname}]"
        d = {**base, **_check_keys(over, EXPERIMENT_KEYS, where)}
        default = {"lower": DEFAULT_BOUNDS[0], "upper": DEFAULT_BOUNDS[1]}
        pri = _check_keys(d.get("priors", default), PRIOR_KEYS, f"{where} priors")
        if set(pri) != set(PRIOR_KEYS):
            raise ModelDefinitionError(f"{where} priors needs both 'lower' and 'upper', got {sorted(pri)}")
        P, S = system.n_parameters, system.n_states
        bounds = np.column_stack([_floats(pri["lower"], (P,), f"{where} priors.lower", broadcast=True),
                                  _floats(pri["upper"], (P,), f"{where} priors.upper", broadcast=True)])
        observed = d.get("observed", system.states)
        observed = tuple([observed] if isinstance(observed, str) else observed)
        system.index_of_states(observed)
        cases[cname] = Experiment(
            name=cname,
            observed=observed,
            theta=_floats(d["theta"], (P,), f"{where} theta") if "theta" in d else None,
            x0=_floats(d["x0"], (S,), f"{where} x0") if "x0" in d else np.full(S, np.nan),
            times=_times(d["times"], where) if "times" in d else np.array([]),
            noise_sd=_scalar(d.get("noise_sd"), float, f"{where} noise_sd"),
            snr=_scalar(d.get("snr"), float, f"{where} snr"),
            kernel=_scalar(d.get("kernel", "rbf"), str, f"{where} kernel"),
            gamma=_scalar(d.get("gamma", 0.3), float, f"{where} gamma"),
            iterations=_scalar(d.get("iterations", 3500), int, f"{where} iterations"),
            prior_bounds=bounds,
            extra={k: v for k, v in d.items() if k not in _FIELD_KEYS},
        )
    return ModelSpec(system, cases, doc.get("description", ""))

"""Model files: an ODE system and its experiment set-ups, read from TOML.

A model file has ``name``, ``parameters``, an ``[equations]`` table (state ->
right-hand side string), an optional ``[experiment]`` table of defaults and
``[cases.NAME]`` tables that override it. The published systems ship in
``models/`` and load by name: ``pgpgm.load_model("lotka-volterra")``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelDefinitionError
from .system import ODESystem


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
    extra : any further keys of the file (e.g. ``least_squares_bad_start``).
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
        from ..simulate import simulate

        c = self.case(case)
        return simulate(self.system, c.theta, c.x0, c.times, observed=observed or c.observed,
                        noise_sd=c.noise_sd, snr=c.snr, seed=seed)

    def case(self, name: str | None = None) -> Experiment:
        """The case called ``name`` (the first one when None)."""
        if name is None:
            return next(iter(self.cases.values()))
        if name not in self.cases:
            raise KeyError(f"{self.system.name} has no case {name!r}; cases: {list(self.cases)}")
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
            raise FileNotFoundError(f"no model file {p}")
        text = p.read_text()
    else:
        fname = str(name_or_path).replace("-", "_") + ".toml"
        res = resources.files("pgpgm.models") / fname
        if not res.is_file():
            raise KeyError(f"unknown model {name_or_path!r}; shipped models: {available_models()}")
        text = res.read_text()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelDefinitionError(f"{name_or_path}: not valid TOML ({exc})") from None
    return spec_from_dict(doc)


def _times(v) -> np.ndarray:
    if isinstance(v, Mapping):
        return np.linspace(float(v["start"]), float(v["stop"]), int(v["num"]))
    return np.asarray(v, dtype=float)


def spec_from_dict(doc: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from the parsed TOML document."""
    for key in ("parameters", "equations"):
        if key not in doc:
            raise ModelDefinitionError(f"model file lacks the required key {key!r}")
    system = ODESystem.from_equations(doc["equations"], doc["parameters"], name=doc.get("name", "ode"))
    base = dict(doc.get("experiment", {}))
    cases = {}
    for cname, over in (doc.get("cases") or {"default": {}}).items():
        d = {**base, **over}
        known = {"observed", "theta", "x0", "times", "noise_sd", "snr", "kernel", "gamma", "iterations", "priors"}
        pri = d.get("priors", {"lower": 0.0, "upper": 10.0})
        bounds = np.column_stack([
            np.broadcast_to(np.asarray(pri["lower"], float), (system.n_parameters,)),
            np.broadcast_to(np.asarray(pri["upper"], float), (system.n_parameters,)),
        ])
        observed = tuple(d.get("observed", system.states))
        system.index_of_states(observed)
        cases[cname] = Experiment(
            name=cname,
            observed=observed,
            theta=np.asarray(d["theta"], float) if "theta" in d else None,
            x0=np.asarray(d["x0"], float) if "x0" in d else np.full(system.n_states, np.nan),
            times=_times(d["times"]) if "times" in d else np.array([]),
            noise_sd=d.get("noise_sd"),
            snr=d.get("snr"),
            kernel=d.get("kernel", "rbf"),
            gamma=float(d.get("gamma", 0.3)),
            iterations=int(d.get("iterations", 3500)),
            prior_bounds=bounds,
            extra={k: v for k, v in d.items() if k not in known},
        )
    return ModelSpec(system, cases, doc.get("description", ""))

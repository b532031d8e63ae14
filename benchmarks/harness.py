"""The shared harness of pgpgm's standing benchmarks (``benchmarks/*.py``).

Every benchmark is a script run from the repository root, ``./run.sh bench NAME`` or
``python benchmarks/NAME.py`` (Python puts ``benchmarks/`` on ``sys.path``, so ``import harness``
needs no path tricks). A benchmark uses pgpgm's public API only (``pgpgm.<name in
pgpgm.__all__>``, ``pgpgm.gp.*``, ``pgpgm.solve.*``, ``pgpgm.datasets``); what it truly needs
from inside pgpgm goes through :func:`private`, the one place that reaches past the public API
(``tests/test_benchmarks.py`` checks both).

What the harness gives:

- :func:`parser`: the argument conventions (``--out NAME`` for the result files);
- :func:`environment`: the machine, versions (``pgpgm.show_versions``), git commit, load average
  and date, written into every result;
- :func:`timed`, :func:`median_time`, :func:`side_by_side`: timings, the comparisons interleaved
  (round-robin, rotating order) so that a shared machine's load hits every side alike, reported
  as medians and ratios;
- :func:`write`: ``benchmarks/results/NAME.json`` (environment, command, rows) and ``NAME.md``
  (a Markdown table under the environment line). ``results/`` is git-ignored and stays out of the
  repository: ``RESULTS.md`` summarises a run's figures with its command, commit and date;
- :data:`REFERENCES`: ``benchmarks/references/``, the committed inputs that are expensive to
  recompute (the multi-start reference optima, the studies' references);
- :data:`PUBLISHED` and :func:`published`: the published cases (Chen et al. 2019) as shipped
  by ``pgpgm.load_model``, their data and the default fit's options;
- :func:`source_tree`: another commit's ``pgpgm`` package in a folder, for before/after runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pgpgm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where the benchmarks write their result files (git-ignored).
RESULTS = HERE / "results"
#: The committed inputs of benchmarks and tests that are expensive to recompute.
REFERENCES = HERE / "references"

#: The published cases: short key -> (model, case) of ``pgpgm.load_model``.
PUBLISHED: dict[str, tuple[str, str]] = {
    "lv-x1": ("lotka-volterra", "x1-observed"),
    "lv-x1-ln": ("lotka-volterra", "x1-observed-large-noise"),
    "lv-x2": ("lotka-volterra", "x2-observed"),
    "lv-x2-ln": ("lotka-volterra", "x2-observed-large-noise"),
    "fhn-V": ("fitzhugh-nagumo", "V-observed"),
    "fhn-R": ("fitzhugh-nagumo", "R-observed"),
    "pt-R": ("protein-transduction", "R-latent"),
    "pt-SR": ("protein-transduction", "S-R-latent"),
}
#: The main job: FitzHugh-Nagumo, R observed (the published experiment).
MAIN_JOB = "fhn-R"


# ------------------------------------------------------------------------------------------
# arguments, environment
# ------------------------------------------------------------------------------------------
def parser(doc: str | None, out: str) -> argparse.ArgumentParser:
    """The argument parser of a benchmark: its docstring as help, ``--out`` for the result files.

    Parameters
    ----------
    doc : the script's ``__doc__`` (first line: the description; the rest: the epilog)
    out : default name of the result files in ``benchmarks/results/``
    """
    first, _, rest = (doc or "").strip().partition("\n")
    ap = argparse.ArgumentParser(description=first, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out, help=f"name of the result files in benchmarks/results/ (default {out})")
    return ap


def command() -> str:
    """The command line that ran this benchmark, as RESULTS.md cites it."""
    script = Path(sys.argv[0])
    name = script.stem if script.suffix == ".py" else script.name
    return " ".join(["./run.sh bench", name, *sys.argv[1:]])


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "pgpgm"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (pgpgm/ modified)" if dirty else "")


def environment() -> dict[str, Any]:
    """Machine, versions, commit, load average and date of this run (a JSON-ready dict)."""
    buf = io.StringIO()
    pgpgm.show_versions(file=buf)
    versions = {}
    for line in buf.getvalue().splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            versions[key.strip()] = value.strip()
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, {platform.system()}",
            "load_average": [round(x, 2) for x in os.getloadavg()], "commit": _git_commit(),
            "python": platform.python_version(), "versions": versions}


def environment_line(env: dict[str, Any]) -> str:
    """One Markdown line: date, machine, load, commit and the main versions."""
    v = env["versions"]
    keys = [k for k in ("pgpgm", "pymc", "pytensor", "arviz", "numba", "nutpie", "SUNDIALS", "ODE backend") if k in v]
    return (f"{env['date']}; {env['machine']}; load average {env['load_average'][0]:.1f}; commit {env['commit']}; "
            f"Python {env['python']}" + "".join(f", {k} {v[k].split(' (')[0]}" for k in keys))


# ------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process)``."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def median_time(fn: Callable[[], Any], *, repeat: int = 50, warmup: int = 3) -> float:
    """Median wall seconds of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


@dataclass(frozen=True)
class SideBySide:
    """Interleaved timings of several callables.

    Attributes
    ----------
    seconds : label -> wall seconds of each round (rounds,)
    baseline : the label the ratios divide by (the first one given)
    """

    seconds: dict[str, tuple[float, ...]]
    baseline: str

    def median(self, label: str) -> float:
        return float(statistics.median(self.seconds[label]))

    def ratio(self, label: str) -> float:
        """Median of ``label`` over the baseline's median."""
        return self.median(label) / self.median(self.baseline)

    def rows(self) -> list[dict[str, Any]]:
        return [{"side": k, "median_s": self.median(k), f"ratio_to_{self.baseline}": self.ratio(k),
                 "each_s": " ".join(f"{s:.4g}" for s in v)} for k, v in self.seconds.items()]


def side_by_side(fns: dict[str, Callable[[], Any]], *, rounds: int = 5, repeat: int = 1,
                 warmup: int = 1) -> SideBySide:
    """Time every callable in ``fns`` round-robin, ``rounds`` times, the order rotated each round.

    Parameters
    ----------
    fns : label -> callable; the first label is the baseline of the ratios
    rounds : timed rounds; each round times every callable once (``repeat`` calls, median)
    repeat : calls per callable and round (the round's figure is their median)
    warmup : untimed calls of each callable first (compilation, caches)
    """
    labels = list(fns)
    for label in labels:
        for _ in range(warmup):
            fns[label]()
    seconds: dict[str, list[float]] = {k: [] for k in labels}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            seconds[label].append(median_time(fns[label], repeat=repeat, warmup=0))
    return SideBySide({k: tuple(v) for k, v in seconds.items()}, labels[0])


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """Rows (dicts with the same keys) as a Markdown table."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _jsonable(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, float) and v != v:
        return None
    return v


def write(name: str, rows: list[dict[str, Any]], title: str, *, notes: str = "",
          env: dict[str, Any] | None = None, sections: dict[str, list[dict[str, Any]]] | None = None) -> Path:
    """Print and save a benchmark's result: ``results/NAME.md`` and ``results/NAME.json``.

    Parameters
    ----------
    name : file name (no suffix)
    rows : the main table
    title : the table's heading (one line)
    notes : Markdown under the environment line (what the columns mean)
    env : :func:`environment` taken at the start of the run (taken now when None)
    sections : further tables, heading -> rows

    Returns
    -------
    the path of the Markdown file
    """
    env = env if env is not None else environment()
    sections = sections or {}
    text = "\n\n".join([f"## {title}", f"`{command()}`; {environment_line(env)}; load average at the end "
                        f"{os.getloadavg()[0]:.1f}.", *([notes] if notes else []), table(rows),
                        *(f"### {h}\n\n{table(r)}" for h, r in sections.items())]) + "\n"
    print(text, flush=True)
    RESULTS.mkdir(exist_ok=True)
    clean = lambda rs: [{k: _jsonable(v) for k, v in r.items()} for r in rs]  # noqa: E731
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {"title": title, "command": command(), "environment": env, "rows": clean(rows),
         "sections": {h: clean(r) for h, r in sections.items()}}, indent=1, default=str))
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    return path


def append_partial(name: str, row: dict[str, Any]) -> None:
    """Append one row to ``results/NAME.partial.jsonl`` (what a long run has done so far)."""
    RESULTS.mkdir(exist_ok=True)
    with (RESULTS / f"{name}.partial.jsonl").open("a") as f:
        f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str) + "\n")


# ------------------------------------------------------------------------------------------
# problems
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    """A published case ready to fit.

    Attributes
    ----------
    key : short name (a key of :data:`PUBLISHED`)
    spec : the shipped model (``pgpgm.load_model``)
    case : the case (``spec.case(name)``)
    data : its simulated data (``spec.simulate(name, seed=seed)``)
    options : keyword arguments of ``pgpgm.fit`` for the published settings (kernel, gamma,
        prior box, no progress bar) plus ``extra``
    """

    key: str
    spec: Any
    case: Any
    data: Any
    options: dict[str, Any]

    def fit(self, **kw: Any) -> Any:
        """``pgpgm.fit`` on this case's data with its options (``kw`` overrides)."""
        return pgpgm.fit(self.spec.system, self.data, self.case.observed, **{**self.options, **kw})


def published(key: str, seed: int = 0, **extra: Any) -> Published:
    """A published case, its data of noise seed ``seed`` and the default fit's options.

    Parameters
    ----------
    key : a key of :data:`PUBLISHED` or ``"model:case"``
    seed : the data's noise seed
    extra : further ``pgpgm.fit`` options (e.g. ``posterior=None`` for steps 1-3)
    """
    name, case_name = PUBLISHED[key] if key in PUBLISHED else key.split(":")
    spec = pgpgm.load_model(name)
    case = spec.case(case_name)
    options = {"kernel": case.kernel, "gamma": case.gamma, "priors": spec.priors(case_name), "progressbar": False,
               **extra}
    return Published(key, spec, case, spec.simulate(case_name, seed=seed), options)


#: the rates of the linear chain of 10 states (issue 30's runaway case; ``runaways.py``, ``ode_solve.py``)
CHAIN_RATES = (1.0, 0.5, 2.0, 0.8, 1.5, 0.6, 1.2, 0.9, 1.8, 0.7)
#: the chain's measured states (its runaway case, ``runaways.py``)
CHAIN_OBSERVED = ("x2", "x4", "x6", "x8", "x10")


def chain_system() -> pgpgm.ODESystem:
    """The linear chain of 10 states, x1 -> x2 -> ... -> x10, rates k1..k10 (:data:`CHAIN_RATES`)."""
    eqs = {"x1": "-k1*x1", **{f"x{i}": f"k{i - 1}*x{i - 1} - k{i}*x{i}" for i in range(2, 11)}}
    return pgpgm.ODESystem.from_equations(eqs, [f"k{i}" for i in range(1, 11)], name="chain10")


def case_keys(text: str | None, default: list[str] | None = None) -> list[str]:
    """Comma-separated case keys (``lv-x1,fhn-R`` or ``model:case``); ``all``: every published case."""
    if not text:
        return list(default if default is not None else PUBLISHED)
    if text == "all":
        return list(PUBLISHED)
    keys = text.split(",")
    bad = [k for k in keys if k not in PUBLISHED and ":" not in k]
    if bad:
        raise SystemExit(f"unknown case(s) {bad}: use one of {sorted(PUBLISHED)} or 'model:case'")
    return keys


def source_tree(ref: str) -> Path:
    """A folder holding the ``pgpgm`` package of ``ref``: a folder that holds ``pgpgm/`` as it is,
    or a git commit (``git archive REF pgpgm`` unpacked into a temporary folder)."""
    path = Path(ref)
    if (path / "pgpgm" / "__init__.py").exists():
        return path
    out = Path(tempfile.mkdtemp(prefix="pgpgm_before_"))
    archive = subprocess.run(["git", "archive", ref, "pgpgm"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


# ------------------------------------------------------------------------------------------
# the one way past the public API
# ------------------------------------------------------------------------------------------
#: Every non-public pgpgm name a benchmark uses (module, name): the coordinator's list of what
#: still needs a public way. :func:`private` refuses anything not listed here.
PRIVATE_NAMES: dict[tuple[str, str | None], str] = {
    ("pgpgm.steps.refine", None): "robustness.py sidebyside: the module whose refine it wraps (step 3's refinements "
                                  "counted)",
    ("pgpgm.steps.posterior", None): "posterior.py: the module whose run_nuts it patches for one fit, to capture "
                                     "step 4's inputs (model, centre, spreads, options) and time the engines on exactly "
                                     "the fit's model; posterior_reference.py: the same, to read the numbers of the "
                                     "fit's step-4 model (data, prior centres) for the independent numpyro model",
    ("pgpgm.fitting", None): "runaways.py: fit's refine_step wrapped for one fit, so that step 4 starts from issue "
                             "29's wrong optimum (refined on the fit's own problem)",
    ("pgpgm.matching.agreement", None): "robustness.py sidebyside: the module whose refine (step 3's) it wraps while a fit "
                              "runs, to count the stop rule's refinements and their noise-sd rounds (where the "
                              "fits' time goes)",
    ("pgpgm.posterior.calibration", "RANK_DRAWS"): "calibration.py: how many draws a rank needs, so that a posterior "
                                                   "the budget left shorter is counted as such, not as a failed fit",
    ("pgpgm.posterior.space", "ValueSpace"): "posterior.py: the centre as a point of the model's value space (to time "
                                       "one log density + gradient there)",
    ("pgpgm.posterior.nutpie_engine", None): "posterior.py --compile: the whitened step-4 model and its compilation "
                                             "for nutpie, timed three ways",
    ("pgpgm.posterior.space", "seed_metric"): "posterior.py --compile: the Laplace approximation that whitens the model",
    ("pgpgm.posterior", "diagnose"): "posterior.py: step 4's convergence checks on an engine's trace",
    ("pgpgm.posterior", "problems"): "posterior.py: whether a trace passes step 4's checks",
    ("pgpgm.steps.options", "STUDY_BUDGET"): "studies.py theoph: fit_study's default step-4 budget, kept while the "
                                               "benchmark sets the draws in pgpgm.NUTS",
    ("pgpgm.batch", "fit_and_save"): "batch.py: what a fit_many worker runs per job, for the serial side",
    ("pgpgm.batch", "_cluster_client"): "batch.py: the LocalCluster fit_many makes, to warm its workers",
    ("pgpgm.batch", "result_path"): "batch.py: where fit_many saves a job's result",
}


def private(module: str, name: str | None = None) -> Any:
    """A non-public pgpgm object (``name`` of ``module``; the module itself when ``name`` is None):
    the only access past the public API, limited to :data:`PRIVATE_NAMES`, which says which
    benchmark needs it and why."""
    if (module, name) not in PRIVATE_NAMES:
        raise KeyError(f"{module}.{name} is not in harness.PRIVATE_NAMES: use the public API or list it there")
    mod = importlib.import_module(module)
    return mod if name is None else getattr(mod, name)

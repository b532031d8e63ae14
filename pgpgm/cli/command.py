"""Command line: ``pgpgm run | fit | sensitivity | list | info``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

import pgpgm

from ..errors import DataError, ModelDefinitionError, PgpgmError
from .inputs import FitFailed, UsageError, read_tidy_csv

EXIT_OK, EXIT_FIT_FAILED, EXIT_USAGE = 0, 1, 2  # exit codes: success, a failed fit, a usage or input error


class _Parser(argparse.ArgumentParser):
    """argparse, but an argument error raises :class:`UsageError` (main prints one line, exit 2)
    instead of printing the usage and exiting."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def _number_or_none(noun: str, valid: Callable[[float], bool], rule: str) -> Callable[[str], tuple[float | None]]:
    """An argparse type: a number that ``valid`` accepts, or ``none``, as a 1-tuple (so that a given
    ``none``, (None,), differs from an option not given, None); ``noun`` and ``rule`` word its errors."""
    def parse(text: str) -> tuple[float | None]:
        if text.strip().lower() == "none":
            return (None,)
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is neither {noun} nor 'none'") from None
        if not (np.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"{text} must be {rule}, or 'none'")
        return (value,)

    parse.__name__ = f"{noun} or 'none'"
    return parse


#: ``--posterior-budget``: seconds > 0, or ``none`` (no limit)
_budget = _number_or_none("a number of seconds", lambda v: v > 0, "a positive number of seconds")
#: ``--posterior-sd-error``: a fraction in (0, 1), or ``none`` (stop once R-hat and ESS pass)
_sd_error = _number_or_none("a fraction", lambda v: 0 < v < 1, "a fraction in (0, 1), e.g. 0.05 for 5 %")


def _real(*, positive: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not np.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"{text} must be finite and {'> 0' if positive else '>= 0'}")
        return value

    parse.__name__ = "positive number" if positive else "non-negative number"
    return parse


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not np.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} must be finite")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pgpgm", description="Parameter inference for partially observed ODE systems "
                "(GP gradient matching + CVODE latent states + least-squares refinement). Exit codes: 0 success, "
                "1 the fit failed, 2 a usage or input error.")
    p.add_argument("--debug", action="store_true", help="print tracebacks of errors (also: PGPGM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    debug = _Parser(add_help=False)  # lets every subcommand take --debug after its name too
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print tracebacks of errors (also: PGPGM_DEBUG=1)")

    def sampling_options(q):
        q.add_argument("--draws", type=_count(1), default=None, help="kept MCMC iterations per chain (default: "
                       "published "
                       "iterations minus burn-in)")
        q.add_argument("--tune", type=_count(0), default=1500, help="burn-in iterations per chain (default 1500)")
        q.add_argument("--chains", type=_count(1), default=2, help="independent chains; the first starts at the prior "
                       "midpoint, the others at prior draws, and refinement starts from each (default 2)")
        q.add_argument("--seed", type=_count(0), default=0, help="seed of the noise and of the sampler (default 0)")
        q.add_argument("--out", type=Path, default=None, help="output folder (default results/<name>)")
        q.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        q.add_argument("--posterior", choices=("nuts", "laplace", "none"), default="nuts",
                       help="step 4: NUTS on the ODE model from the refined optimum (default), its Laplace "
                       "approximation, or none")
        q.add_argument("--posterior-draws", type=_count(1), default=500, help="NUTS draws per chain (default 500)")
        q.add_argument("--posterior-tune", type=_count(0), default=500,
                       help="NUTS tuning steps per chain (default 500)")
        q.add_argument("--posterior-chains", type=_count(1), default=4, help="NUTS chains (default 4)")
        q.add_argument("--posterior-rounds", type=_count(1), default=None,
                       help="most NUTS rounds while R-hat, ESS or divergences fail (default: pgpgm.posterior.rounds.MAX_ROUNDS)")
        q.add_argument("--posterior-budget", type=_budget, default=None, metavar="SECONDS",
                       help="step 4's budget in seconds for all NUTS rounds, or 'none' for no limit (default: "
                       "pgpgm.PosteriorBudget(), 60 s and 3000000 gradient evaluations); once spent, the fit returns "
                       "the draws it has with a warning")
        q.add_argument("--posterior-sd-error", type=_sd_error, default=None, metavar="FRACTION",
                       help="once R-hat and ESS pass, step 4 goes on while some sd's Monte Carlo error is above this "
                       "fraction of the sd, within 3/4 of its budget (default: pgpgm.NUTS()'s, 0.05), or 'none' to "
                       "stop where R-hat and ESS pass")
        q.add_argument("--stop", choices=("agree", "never"), default="agree",
                       help="end the gradient-matching chains once the optima refined from their means agree "
                       "(default), or never (the whole published budget)")

    r = sub.add_parser("run", parents=[debug],
                       help="reproduce a published experiment: simulate, fit, write figures and table")
    r.add_argument("model", help="model name (see `pgpgm list`) or a TOML model file")
    r.add_argument("--case", default=None, help="experiment case, e.g. x2-observed (default: the first)")
    r.add_argument("--observe", nargs="+", default=None, help="override the observed states")
    r.add_argument("--noise-sd", type=_real(positive=True), default=None, help="override the noise sd")
    sampling_options(r)

    f = sub.add_parser("fit", parents=[debug], help="fit a model file to a tidy CSV (columns time,state,value; with "
                       "an experiment column, every experiment together: pgpgm.fit_study)")
    f.add_argument("--model", type=Path, default=None, help="TOML model file ([equations], parameters, ...)")
    f.add_argument("--data", type=Path, default=None, help="CSV with columns time,state,value, or "
                   "experiment,time,state,value for a study (many experiments, shared parameters)")
    f.add_argument("--petab", type=Path, default=None, metavar="YAML",
                   help="a PEtab problem's YAML file (SBML model and tables) instead of --model and --data: "
                        "pgpgm.fit_petab")
    f.add_argument("--observe", nargs="+", default=None, help="observed states (default: all in the CSV)")
    f.add_argument("--x0", nargs="+", default=[], metavar="STATE=VALUE",
                   help="known initial values, held at --t0 (an observed state's too: leave it out to estimate it); "
                        "STATE=LOW:HIGH for an unknown latent one (a uniform prior)")
    f.add_argument("--t0", default=None, metavar="TIME",
                   help="the time the initial values hold at, at or before the first measurement (default: the first "
                        "measured time); in a study also a column of --inputs (each experiment's dose time)")
    f.add_argument("--fixed", nargs="+", default=[], metavar="PARAMETER=VALUE",
                   help="parameters held at known values (not estimated)")
    f.add_argument("--lognormal", nargs="+", default=[], metavar="STATE",
                   help="observed states with multiplicative (log-normal) measurement noise (the likelihood of log y; the "
                   "state stays on its own scale and may start at 0)")
    f.add_argument("--grid", nargs=3, default=None, metavar=("START", "STOP", "N"),
                   help="the gradient-matching grid: N equally spaced times from START to STOP (they must span the "
                        "data; the observation times are added); default: the observation times")
    f.add_argument("--kernel", default=None, help="rbf, matern52 or sigmoid (default: the file's or rbf)")
    f.add_argument("--gamma", type=_real(), default=None, help="gradient-matching mismatch variance (default 0.3)")
    f.add_argument("--bounds", nargs=2, type=_finite, default=None, metavar=("LOWER", "UPPER"),
                   help="uniform prior bounds for every parameter (default: the file's or 0 10)")
    f.add_argument("--noise", nargs="+", default=[], metavar="STATE=MODEL",
                   help="measurement noise model of observed states: normal (default), lognormal, poisson or negbin")
    g = f.add_argument_group("studies (a --data CSV with an experiment column)")
    g.add_argument("--inputs", type=Path, default=None,
                   help="CSV with an experiment column and one row per experiment: known inputs; an --x0 or --fixed "
                   "VALUE that names one of its columns takes the experiment's value (e.g. --x0 A=dose)")
    g.add_argument("--varying", nargs="+", default=[], metavar="PARAMETER",
                   help="parameters with an unknown value per experiment (the others are shared)")
    g.add_argument("--hierarchical", nargs="+", default=[], metavar="PARAMETER=lognormal",
                   help="parameters that vary by experiment around an unknown population (log-normal)")
    g.add_argument("--noise-per-experiment", nargs="*", default=None, metavar="STATE",
                   help="one noise parameter per experiment (for the STATEs given, or every observed state)")
    sampling_options(f)

    b = sub.add_parser("batch", parents=[debug], help="fit a model to many data sets on a dask cluster (a folder of CSVs or one tidy "
                       "CSV with a dataset column); needs pgpgm[dask]")
    b.add_argument("--model", required=True, help="model name or TOML model file (its first case gives the defaults)")
    b.add_argument("--data", required=True, type=Path, help="a folder of CSVs (one fit per file, columns "
                   "time,state,value or time + one column per state) or one CSV with columns dataset,time,state,value")
    b.add_argument("--observe", nargs="+", default=None, help="observed states (default: all in each data set)")
    b.add_argument("--scheduler", default=None, help="address of a running dask scheduler, e.g. tcp://host:8786 "
                   "(default: a LocalCluster on this machine)")
    b.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    b.add_argument("--save-on-workers", action="store_true", help="with --scheduler: the workers write the result "
                   "files themselves (they must see --out at the same absolute path); the LocalCluster's always do")
    b.add_argument("--x0", nargs="+", default=[], metavar="STATE=VALUE", help="initial values of latent states")
    b.add_argument("--kernel", default=None, help="rbf, matern52 or sigmoid (default: the file's or rbf)")
    b.add_argument("--gamma", type=float, default=None, help="gradient-matching mismatch variance (default 0.3)")
    b.add_argument("--bounds", nargs=2, type=float, default=None, metavar=("LOWER", "UPPER"),
                   help="uniform prior bounds for every parameter (default: the file's or 0 10)")
    sampling_options(b)

    s = sub.add_parser("sensitivity", parents=[debug], help="print and write the sensitivity-index table of a model")
    s.add_argument("model", help="model name or TOML file")
    s.add_argument("--case", default=None, help="case whose theta and x0 are used")
    s.add_argument("--t-span", nargs=2, type=_finite, default=None, help="interval (default: the case's times)")
    s.add_argument("--out", type=Path, default=None, help="write the table as CSV here")

    sub.add_parser("list", parents=[debug], help="list the shipped models and their cases")
    sub.add_parser("info", parents=[debug], help="print versions, the SUNDIALS library, the ODE backend a fit will use "
                   "and the "
                   "cache folders (paste into bug reports)")
    return p


_ROLE = {"gradient_matching": " (step 2's chains: they look for the basin and stop once their refined means agree, "
                              "so their R-hat and ESS are reported, not required to pass)"}


def _write_outputs(result, out: Path, title: str, extra: list[str] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    result.plot_states().savefig(out / "states.png", dpi=120)
    result.plot_parameters().savefig(out / "parameters.png", dpi=120)
    table = result.parameter_table()
    table.to_csv(out / "parameters.csv")
    result.save(out / "result.nc")
    diag = result.diagnostics.to_dataframe().round(4) if result.diagnostics is not None else None
    checks = [f"- {k}{_ROLE.get(k, '')}: " + ("; ".join(v) if v else "converged (R-hat <= 1.01, ESS >= 400, no divergences)")
              for k, v in result.convergence_problems().items()]
    bounds = [f"- {m}" for m in result.at_bounds.values()]
    starts = ", ".join(f"{k} {v:.6g}" for k, v in result.nll_per_start.items())
    fit_line = (f"negative log likelihood at the refined point: {result.nll:.6g} (refinement starts: {starts}; "
                "lower is better, comparable between fits of the same data)")
    competing = result.competing_optima
    rivals = (["## Other optima as good (the estimates describe the refined point's only)", "",
               _table(competing.set_index("origin")), ""] if not competing.empty else [])
    lines = [f"# {title}", "", _table(table), "", fit_line, "", *rivals,
             *(["## At a prior bound", "", *bounds, ""] if bounds else []),
             "timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()),
             "ODE solves: " + ", ".join(f"{k} {v}" for k, v in result.n_ode_solves.items()), *extra]
    if diag is not None:
        lines += ["", "## Convergence", "", *checks, "", _table(diag)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {out}/states.png, parameters.png, parameters.csv, summary.md, result.nc")


def _table(df) -> str:
    return df.to_markdown(floatfmt=".4g") if _has_tabulate() else df.to_string()


def _has_tabulate() -> bool:
    try:
        import tabulate

        return True
    except ImportError:
        return False


def _run(a) -> int:

    spec = pgpgm.load_model(a.model)
    case = spec.case(a.case)
    observed = a.observe or list(case.observed)
    out = _check_out_folder(a.out or Path("results") / f"{spec.system.name}_{case.name}")
    if a.noise_sd is not None:
        data = pgpgm.simulate(spec.system, case.theta, case.x0, case.times, observed=observed, noise_sd=a.noise_sd,
                              seed=a.seed)
    else:
        data = spec.simulate(case.name, seed=a.seed, observed=observed)
    draws = a.draws if a.draws is not None else max(case.iterations - a.tune, 100)
    result = _fit_or_fail(spec.system, data, observed, kernel=case.kernel, gamma=case.gamma,
                          priors=spec.priors(case.name), draws=draws, tune=a.tune, chains=a.chains, seed=a.seed,
                          progressbar=not a.no_progress, **_posterior_options(a))
    extra = []
    if "least_squares_bad_start" in case.extra:  # the published local-minimum example

        idx = spec.system.index_of_states(observed)
        problem = pgpgm.LeastSquaresProblem(pgpgm.Integrator(spec.system, case.times), data.y.values, idx,
                                      data.noise_sd.values, case.x0)
        start = np.asarray(case.extra["least_squares_bad_start"], float)
        lsq = pgpgm.refine(problem, start, case.prior_bounds)
        extra = [f"least squares alone from {start.tolist()}: theta = {np.round(lsq.theta, 4).tolist()}, "
                 f"cost {lsq.cost:.1f}; pgpgm: cost {problem.cost(result.theta):.1f}"]
    _write_outputs(result, out, f"{spec.system.name}, case {case.name} (observed {', '.join(observed)})", extra)
    return EXIT_OK


def _fit_or_fail(*args, **kwargs):
    """:func:`pgpgm.fit`; an input error it finds stays an input error (exit 2), any other
    failure inside the fit becomes :class:`FitFailed` (exit 1)."""

    try:
        return pgpgm.fit(*args, **kwargs)
    except (DataError, ModelDefinitionError):
        raise
    except Exception as exc:
        raise FitFailed(f"the fit failed: {type(exc).__name__}: {exc}") from exc


def _check_out_folder(out: Path) -> Path:
    """An output folder that exists as a writable folder, or can be created; checked
    before the fit so that a bad ``--out`` costs nothing."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder; give a folder for the outputs")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out {out} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out} is not writable ({parent} does not allow writing); choose another folder")
    return out


def _check_out_file(out: Path) -> Path:
    """An output file path whose folder exists or can be created (checked before any work)."""
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name such as {out / 'sensitivity.csv'}")
    _check_out_folder(out.parent)
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"--out {out} is not writable")
    return out


def _time_argument(value: str | None, option: str) -> float | None:
    """``value`` of ``option`` as one finite number (None stays None)."""
    if value is None:
        return None
    try:
        out = float(value)
    except ValueError:
        raise UsageError(f"{option} {value!r}: not a number") from None
    if not np.isfinite(out):
        raise UsageError(f"{option} {value!r}: must be finite")
    return out


def _x0_arguments(items: list[str], states) -> dict[str, float]:
    x0 = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--x0 {item!r}: expected STATE=VALUE, e.g. --x0 {states[0]}=1.5")
        if name not in states:
            raise UsageError(f"--x0 {item!r}: {name!r} is not a state of the model {list(states)}")
        if name in x0:
            raise UsageError(f"--x0 gives {name} twice")
        try:
            x0[name] = tuple(float(v) for v in value.split(":")) if ":" in value else float(value)
        except ValueError:
            raise UsageError(f"--x0 {item!r}: {value!r} is not a number (or LOW:HIGH)") from None
        if not np.all(np.isfinite(x0[name])) or (isinstance(x0[name], tuple) and not (
                len(x0[name]) == 2 and x0[name][0] < x0[name][1])):
            raise UsageError(f"--x0 {item!r}: the initial value must be finite, or LOW:HIGH with LOW < HIGH")
    return x0


def _grid_argument(items: list[str] | None) -> np.ndarray | None:
    """``--grid START STOP N`` as N equally spaced times, or None."""
    if items is None:
        return None
    try:
        start, stop, n = float(items[0]), float(items[1]), int(items[2])
    except ValueError:
        raise UsageError(f"--grid {' '.join(items)}: expected START STOP N, e.g. --grid 0 10 101") from None
    if not (np.isfinite(start) and np.isfinite(stop) and start < stop and n >= 3):
        raise UsageError(f"--grid {' '.join(items)}: START < STOP (finite) and N >= 3 are required")
    return np.linspace(start, stop, n)


def _fit(a) -> int:
    if a.petab is not None:
        if a.model is not None or a.data is not None:
            raise UsageError("--petab holds the model and the data: give it without --model and --data")
        return _fit_petab(a)
    missing = [o for o, v in (("--model", a.model), ("--data", a.data)) if v is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or a PEtab problem instead: "
                         "--petab problem.yaml)")
    spec = pgpgm.load_model(a.model)
    case = spec.case()
    states = spec.system.states
    out = _check_out_folder(a.out or Path("results") / f"{spec.system.name}_fit")
    if a.bounds and not a.bounds[0] < a.bounds[1]:
        raise UsageError(f"--bounds {a.bounds[0]} {a.bounds[1]}: LOWER must be less than UPPER")
    if not a.data.is_file():
        raise UsageError(f"--data {a.data}: no such file")
    unknown = [n for n in a.lognormal if n not in states]
    if unknown:
        raise UsageError(f"--lognormal {' '.join(unknown)}: not a state of the model {list(states)}")
    noise = _noise_arguments(a.noise, states)
    for n in a.lognormal:
        noise.setdefault(n, "lognormal")
    if _has_column(a.data, "experiment"):
        return _fit_study(a, spec, case, out, noise)
    x0 = _x0_arguments(a.x0, states)
    fixed = _name_values(a.fixed, spec.system.parameters, "--fixed", "PARAMETER")
    if a.inputs or a.varying or a.hierarchical or a.noise_per_experiment is not None:
        raise UsageError("--inputs, --varying, --hierarchical and --noise-per-experiment need a study: a --data CSV "
                         "with an experiment column (experiment,time,state,value)")
    grid = _grid_argument(a.grid)
    data = read_tidy_csv(a.data, states)
    obs = pgpgm.data.as_observations(data, a.observe, spec.system, grid=grid)  # >= 3 points per state, before the fit
    if not x0 and np.isfinite(case.x0).any():  # the file's latent initial values (its observed ones are estimated)
        x0 = {s: v for s, v in zip(states, case.x0) if np.isfinite(v) and s not in obs.states}
    priors = tuple(a.bounds) if a.bounds else spec.priors(case.name)
    draws = a.draws if a.draws is not None else max(case.iterations - a.tune, 100)
    result = _fit_or_fail(spec.system, data, a.observe, x0=x0, kernel=a.kernel or case.kernel,
                          gamma=a.gamma if a.gamma is not None else case.gamma, priors=priors, draws=draws,
                          tune=a.tune, chains=a.chains, seed=a.seed, true_theta=case.theta,
                          progressbar=not a.no_progress, fixed=fixed or None, grid=grid,
                          noise=noise or None, t0=_time_argument(a.t0, "--t0"), **_posterior_options(a))
    _write_outputs(result, out, f"{spec.system.name} fitted to {a.data}")
    return EXIT_OK


def _has_column(path: Path, name: str) -> bool:
    """Whether the CSV's header (its first non-empty line) has the column ``name``."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                if any(c.strip() for c in row):
                    return name in [c.strip() for c in row]
    except (UnicodeDecodeError, csv.Error):
        return False  # read_tidy_csv says what is wrong
    return False


def _noise_arguments(items: list[str], states) -> dict[str, str]:
    noise = {}
    models = ("normal", "lognormal", "poisson", "negbin")
    for item in items:
        name, eq, model = item.partition("=")
        if not eq or name not in states or model not in models:
            raise UsageError(f"--noise {item!r}: expected STATE=MODEL with a state of the model {list(states)} and a "
                             f"model of {list(models)}")
        noise[name] = model
    return noise


def _fit_study(a, spec, case, out: Path, noise: dict[str, str]) -> int:
    """``pgpgm fit`` on a CSV with an experiment column: :func:`pgpgm.fit_study` of every experiment; writes
    experiments.png (a panel per experiment), parameters.csv (separate, joint and posterior estimates by
    experiment), summary.md and result.nc (:func:`pgpgm.load_study`)."""
    import pandas as pd

    states, parameters = spec.system.states, spec.system.parameters
    if a.posterior == "laplace":
        raise UsageError("--posterior laplace is not available for a study; use nuts or none")
    if a.grid:
        raise UsageError("--grid is not available for a study (each experiment fits on its own times)")
    data = read_tidy_csv(a.data, states, experiment="experiment")
    inputs = None
    if a.inputs is not None:
        if not a.inputs.is_file():
            raise UsageError(f"--inputs {a.inputs}: no such file")
        inputs = pd.read_csv(a.inputs, dtype={"experiment": str})
        if "experiment" not in inputs.columns:
            raise UsageError(f"--inputs {a.inputs}: no experiment column (its columns: {list(inputs.columns)})")
    columns = [] if inputs is None else [c for c in inputs.columns if c != "experiment"]
    x0 = _name_values(a.x0, states, "--x0", "STATE", columns)
    fixed = _name_values(a.fixed, parameters, "--fixed", "PARAMETER", columns)
    if not x0 and np.isfinite(case.x0).any():  # the file's latent initial values (its observed ones are estimated)
        measured = set(a.observe or (s for d in data.values() for s in d if s != "time"))
        x0 = {s: float(v) for s, v in zip(states, case.x0) if np.isfinite(v) and s not in measured}
    t0 = a.t0 if a.t0 is None or a.t0 in columns else _time_argument(a.t0, "--t0")
    unknown = [p for p in a.varying if p not in parameters]
    if unknown:
        raise UsageError(f"--varying {' '.join(unknown)}: not a parameter of the model {list(parameters)}")
    hierarchical = {}
    for item in a.hierarchical:
        name, _, kind = item.partition("=")
        if name not in parameters or kind not in ("", "lognormal"):
            raise UsageError(f"--hierarchical {item!r}: expected PARAMETER=lognormal with a parameter of the model "
                             f"{list(parameters)}")
        hierarchical[name] = "lognormal"
    tidy = pd.DataFrame([{"experiment": e, "time": t, "state": s, "value": v}
                         for e, d in data.items() for s in d if s != "time" for t, v in zip(d["time"], d[s])
                         if np.isfinite(v)])
    study = pgpgm.Study.from_tidy(tidy, inputs, x0=x0, fixed=fixed, observed=a.observe, t0=t0)
    priors = tuple(a.bounds) if a.bounds else spec.priors(case.name)
    draws = a.draws if a.draws is not None else max(case.iterations - a.tune, 100)
    per = a.noise_per_experiment
    try:
        result = pgpgm.fit_study(spec.system, study, varying=a.varying, hierarchical=hierarchical or None,
                                 priors=priors, noise=noise or None, seed=a.seed, progressbar=not a.no_progress,
                                 noise_per_experiment=False if per is None else (per or True), draws=draws,
                                 tune=a.tune, chains=a.chains, kernel=a.kernel or case.kernel,
                                 gamma=a.gamma if a.gamma is not None else case.gamma,
                                 **_posterior_options(a, pgpgm.NUTS(budget=pgpgm.steps.options.STUDY_BUDGET)))
    except (DataError, ModelDefinitionError):
        raise
    except Exception as exc:
        raise FitFailed(f"the study fit failed: {type(exc).__name__}: {exc}") from exc
    _write_study_outputs(result, out, f"{spec.system.name} fitted to {a.data} ({len(study)} experiments)")
    return EXIT_OK


def _name_values(items: list[str], names, option: str, what: str, columns: list[str] = ()) -> dict:
    """``NAME=VALUE`` items of ``option`` (NAME one of ``names``, VALUE a finite number); with
    ``columns`` (of an --inputs table), a VALUE that is one of them stays its name (per experiment)."""
    out = {}
    alternative = f" (or {what}=COLUMN of --inputs)" if columns else ""
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in names:
            raise UsageError(f"{option} {item!r}: expected {what}=VALUE{alternative} with a {what.lower()} of the "
                             f"model {list(names)}")
        if value in columns:
            out[name] = value
            continue
        try:
            out[name] = float(value)
        except ValueError:
            raise UsageError(f"{option} {item!r}: {value!r} is not a number"
                             + (f" nor a column of --inputs {list(columns)}" if columns else "")) from None
        if not np.isfinite(out[name]):
            raise UsageError(f"{option} {item!r}: the value must be finite")
    return out


def _write_study_outputs(result, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    result.plot().savefig(out / "experiments.png", dpi=120)
    table = result.estimates["theta"].to_dataframe().unstack("parameter")["theta"]
    table.to_csv(out / "parameters.csv")
    result.save(out / "result.nc")
    pop = result.population
    lines = [f"# {title}", "", "## Parameters by estimate and experiment", "", _table(table), "",
             f"joint negative log likelihood: {result.nll:.6g}",
             *(["", "## Population (log scale)", "", _table(pop)] if not pop.empty else []), "",
             "timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())]
    if result.diagnostics is not None:
        checks = result.convergence_problems()
        lines += ["", "## Convergence", "", "; ".join(checks) if checks else
                  "converged (R-hat <= 1.01, ESS >= 400, no divergences)"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {out}/experiments.png, parameters.csv, summary.md, result.nc")


def _batch(a) -> int:
    """Fit every data set of ``--data``; write one result file per fit and summary.csv to
    ``--out``. Exit status 0 when every fit succeeded (or was done before), 1 otherwise."""

    spec = pgpgm.load_model(a.model)
    case = spec.case()
    opts = {"tune": a.tune, "chains": a.chains, "seed": a.seed, **_posterior_options(a),
            "draws": a.draws if a.draws is not None else max(case.iterations - a.tune, 100)}
    if a.x0:
        opts["x0"] = {}
        for item in a.x0:
            name, _, value = item.partition("=")
            try:
                opts["x0"][name] = float(value)
            except ValueError:
                raise UsageError(f"--x0 {item!r}: expected STATE=VALUE with a number, e.g. x2=3.0") from None
    if a.kernel:
        opts["kernel"] = a.kernel
    if a.gamma is not None:
        opts["gamma"] = a.gamma
    if a.bounds:
        opts["priors"] = tuple(a.bounds)
    out = _check_out_folder(a.out or Path("results") / f"{spec.system.name}_batch")
    build = pgpgm.jobs_from_folder if a.data.is_dir() else pgpgm.jobs_from_tidy_csv
    jobs = build(a.data, spec, observed=a.observe)
    table = pgpgm.fit_many(jobs, out, scheduler=a.scheduler, n_workers=a.workers, progressbar=not a.no_progress,
                           save_on_workers=True if a.save_on_workers else None, **opts)
    shown = table[[c for c in ("name", "status", "seconds", "nll", "max_rhat", "error") if c in table]]
    print(shown.to_string(index=False))
    counts = table["status"].value_counts()
    print(f"\n{len(table)} jobs: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + f"; wrote {out}/")
    return 0 if not (table["status"] == "failed").any() else 1


def _fit_petab(a) -> int:
    """``pgpgm fit --petab problem.yaml``: :func:`pgpgm.fit_petab`; writes the PEtab tables of the estimates
    (simulation.tsv, parameters.tsv), parameters.csv, fit.png and summary.md to ``--out``."""
    import matplotlib

    matplotlib.use("Agg")
    if not a.petab.is_file():
        raise UsageError(f"--petab {a.petab}: no such file")
    out = _check_out_folder(a.out or Path("results") / a.petab.stem)
    problem = pgpgm.load_petab(a.petab)
    try:
        result = pgpgm.fit_petab(problem, posterior=_posterior(a), seed=a.seed, progressbar=not a.no_progress)
    except (DataError, ModelDefinitionError):
        raise
    except Exception as exc:
        raise FitFailed(f"the PEtab fit failed: {type(exc).__name__}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    result.to_petab(out)
    table = result.parameter_table()
    table.to_csv(out / "parameters.csv")
    result.plot().savefig(out / "fit.png", dpi=120)
    nominal = problem.nll(problem.nominal_parameters())
    lines = [f"# {problem!r}", "", result.summary(), f"nll at the table's nominal parameters: {nominal:.6g}", "",
             _table(table), "", "timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {out}/simulation.tsv, parameters.tsv, parameters.csv, fit.png, summary.md")
    return EXIT_OK


def _posterior_options(a, default: object = None) -> dict:
    """``--posterior`` and ``--posterior-*`` as :func:`pgpgm.fit`'s ``posterior`` (and ``--stop``, step 2's budget,
    set with the other sampling options)."""
    return {"posterior": _posterior(a, default), "stop": a.stop}


def _posterior(a: argparse.Namespace, default: object = None) -> object:
    """``--posterior`` as :func:`pgpgm.fit` takes it: None, a :class:`pgpgm.Laplace` of ``--posterior-draws`` x
    ``--posterior-chains`` draws, or a :class:`pgpgm.NUTS` of the ``--posterior-*`` options given, the others
    ``default``'s (a :class:`pgpgm.NUTS`; ``pgpgm.NUTS()`` when None)."""
    if a.posterior_sd_error is not None and a.posterior != "nuts":
        raise UsageError(f"--posterior-sd-error is a goal of NUTS's draws; it needs --posterior nuts, not "
                         f"{a.posterior}")
    if a.posterior == "none":
        return None
    if a.posterior == "laplace":
        return pgpgm.Laplace(a.posterior_draws * a.posterior_chains)
    given = {"draws": a.posterior_draws, "tune": a.posterior_tune, "chains": a.posterior_chains}
    if a.posterior_rounds:
        given["rounds"] = a.posterior_rounds
    if a.posterior_budget is not None:
        given["budget"] = a.posterior_budget[0]
    if a.posterior_sd_error is not None:
        given["sd_error"] = a.posterior_sd_error[0]
    return dataclasses.replace(default or pgpgm.NUTS(), **given)


def _sensitivity(a) -> int:

    spec = pgpgm.load_model(a.model)
    case = spec.case(a.case)
    if a.out:
        _check_out_file(a.out)
    if a.t_span and not a.t_span[0] < a.t_span[1]:
        raise UsageError(f"--t-span {a.t_span[0]} {a.t_span[1]}: the start must be before the end")
    span = tuple(a.t_span) if a.t_span else (float(case.times[0]), float(case.times[-1]))
    table = pgpgm.sensitivity_index(spec.system, case.theta, case.x0, span).to_pandas()
    print(f"Sensitivity index S_ij = ||dx_i/dtheta_j|| / ||x_i|| on {span}, theta = {case.theta.tolist()}")
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(a.out)
    return 0


def _list(a) -> int:

    for name in pgpgm.available_models():
        spec = pgpgm.load_model(name)
        print(f"{name}: {spec.description}")
        for c in spec.cases.values():
            print(f"    --case {c.name}: observed {', '.join(c.observed)}")
    return 0


def _info(a) -> int:
    pgpgm.show_versions()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code: 0 success, 1 the fit failed, 2 a usage
    or input error. Errors are one line on stderr; ``--debug`` or ``PGPGM_DEBUG=1`` adds the
    traceback. Output cut short by a closed pipe (``pgpgm list | head -1``) ends quietly with 0."""
    import tomllib


    debug = os.environ.get("PGPGM_DEBUG", "") not in ("", "0")
    commands = {"run": _run, "fit": _fit, "batch": _batch, "sensitivity": _sensitivity, "list": _list, "info": _info}
    try:
        a = _parser().parse_args(argv)
        debug = debug or getattr(a, "debug", False)
        return commands[a.command](a)
    except UsageError as exc:
        return _report(exc, EXIT_USAGE, debug)
    except FitFailed as exc:
        return _report(exc, EXIT_FIT_FAILED, debug)
    except BrokenPipeError:  # the reader went away (`pgpgm list | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyError as exc:  # unknown model or case names
        return _report(exc.args[0] if exc.args else exc, EXIT_USAGE, debug, exc)
    except (PgpgmError, OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return _report(exc, EXIT_USAGE, debug)
    except KeyboardInterrupt as exc:
        return _report("interrupted", 130, debug, exc)
    except Exception as exc:  # a bug: still one line, and the traceback with --debug
        return _report(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug and report it)",
                       EXIT_FIT_FAILED, debug, exc)


def _report(message, code: int, debug: bool, exc: BaseException | None = None) -> int:
    """Print ``pgpgm: error: <message>`` as one line on stderr (the traceback first when debugging)."""
    exc = exc if exc is not None else message if isinstance(message, BaseException) else None
    if debug and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    text = " ".join(str(message).split())  # one line
    print(f"pgpgm: error: {text}", file=sys.stderr)
    return code


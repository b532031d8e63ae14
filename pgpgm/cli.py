"""Command line: ``pgpgm run | fit | sensitivity | list | info``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pgpgm", description="Parameter inference for partially observed ODE systems "
                                "(GP gradient matching + CVODE latent states + least-squares refinement).")
    sub = p.add_subparsers(dest="command", required=True)

    def sampling_options(q):
        q.add_argument("--draws", type=int, default=None, help="kept MCMC iterations per chain (default: published "
                       "iterations minus burn-in)")
        q.add_argument("--tune", type=int, default=1500, help="burn-in iterations per chain (default 1500)")
        q.add_argument("--chains", type=int, default=2, help="independent chains; the first starts at the prior "
                       "midpoint, the others at prior draws, and refinement starts from each (default 2)")
        q.add_argument("--seed", type=int, default=0, help="seed of the noise and of the sampler (default 0)")
        q.add_argument("--out", type=Path, default=None, help="output folder (default results/<name>)")
        q.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        q.add_argument("--posterior", choices=("nuts", "laplace", "none"), default="nuts",
                       help="step 4: NUTS on the ODE model from the refined optimum (default), its Laplace "
                       "approximation, or none")
        q.add_argument("--posterior-draws", type=int, default=500, help="NUTS draws per chain (default 500)")
        q.add_argument("--posterior-tune", type=int, default=500, help="NUTS tuning steps per chain (default 500)")
        q.add_argument("--posterior-chains", type=int, default=4, help="NUTS chains (default 4)")

    r = sub.add_parser("run", help="reproduce a published experiment: simulate, fit, write figures and table")
    r.add_argument("model", help="model name (see `pgpgm list`) or a TOML model file")
    r.add_argument("--case", default=None, help="experiment case, e.g. x2-observed (default: the first)")
    r.add_argument("--observe", nargs="+", default=None, help="override the observed states")
    r.add_argument("--noise-sd", type=float, default=None, help="override the noise sd")
    sampling_options(r)

    f = sub.add_parser("fit", help="fit a model file to a tidy CSV (columns time,state,value)")
    f.add_argument("--model", required=True, type=Path, help="TOML model file ([equations], parameters, ...)")
    f.add_argument("--data", required=True, type=Path, help="CSV with columns time,state,value")
    f.add_argument("--observe", nargs="+", default=None, help="observed states (default: all in the CSV)")
    f.add_argument("--x0", nargs="+", default=[], metavar="STATE=VALUE", help="initial values of latent states")
    f.add_argument("--kernel", default=None, help="rbf, matern52 or sigmoid (default: the file's or rbf)")
    f.add_argument("--gamma", type=float, default=None, help="gradient-matching mismatch variance (default 0.3)")
    f.add_argument("--bounds", nargs=2, type=float, default=None, metavar=("LOWER", "UPPER"),
                   help="uniform prior bounds for every parameter (default: the file's or 0 10)")
    sampling_options(f)

    b = sub.add_parser("batch", help="fit a model to many data sets on a dask cluster (a folder of CSVs or one tidy "
                       "CSV with a dataset column); needs pgpgm[dask]")
    b.add_argument("--model", required=True, help="model name or TOML model file (its first case gives the defaults)")
    b.add_argument("--data", required=True, type=Path, help="a folder of CSVs (one fit per file, columns "
                   "time,state,value or time + one column per state) or one CSV with columns dataset,time,state,value")
    b.add_argument("--observe", nargs="+", default=None, help="observed states (default: all in each data set)")
    b.add_argument("--scheduler", default=None, help="address of a running dask scheduler, e.g. tcp://host:8786 "
                   "(default: a LocalCluster on this machine)")
    b.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    b.add_argument("--x0", nargs="+", default=[], metavar="STATE=VALUE", help="initial values of latent states")
    b.add_argument("--kernel", default=None, help="rbf, matern52 or sigmoid (default: the file's or rbf)")
    b.add_argument("--gamma", type=float, default=None, help="gradient-matching mismatch variance (default 0.3)")
    b.add_argument("--bounds", nargs=2, type=float, default=None, metavar=("LOWER", "UPPER"),
                   help="uniform prior bounds for every parameter (default: the file's or 0 10)")
    sampling_options(b)

    s = sub.add_parser("sensitivity", help="print and write the sensitivity-index table of a model")
    s.add_argument("model", help="model name or TOML file")
    s.add_argument("--case", default=None, help="case whose theta and x0 are used")
    s.add_argument("--t-span", nargs=2, type=float, default=None, help="interval (default: the case's times)")
    s.add_argument("--out", type=Path, default=None, help="write the table as CSV here")

    sub.add_parser("list", help="list the shipped models and their cases")
    sub.add_parser("info", help="print versions, the SUNDIALS library, the ODE backend a fit will use and the "
                   "cache folders (paste into bug reports)")
    return p


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
    checks = [f"- {k}: " + ("; ".join(v) if v else "converged (R-hat <= 1.01, ESS >= 400, no divergences)")
              for k, v in result.convergence_problems().items()]
    lines = [f"# {title}", "", _table(table), "",
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
        import tabulate  # noqa: F401

        return True
    except ImportError:
        return False


def _run(a) -> int:
    import pgpgm

    spec = pgpgm.load_model(a.model)
    case = spec.case(a.case)
    observed = a.observe or list(case.observed)
    if a.noise_sd is not None:
        data = pgpgm.simulate(spec.system, case.theta, case.x0, case.times, observed=observed, noise_sd=a.noise_sd,
                              seed=a.seed)
    else:
        data = spec.simulate(case.name, seed=a.seed, observed=observed)
    draws = a.draws if a.draws is not None else max(case.iterations - a.tune, 100)
    result = pgpgm.fit(spec.system, data, observed, kernel=case.kernel, gamma=case.gamma, priors=spec.priors(case.name),
                       draws=draws, tune=a.tune, chains=a.chains, seed=a.seed, progressbar=not a.no_progress,
                       **_posterior_options(a))
    out = a.out or Path("results") / f"{spec.system.name}_{case.name}"
    extra = []
    if "least_squares_bad_start" in case.extra:  # the published local-minimum example
        from .refine import LeastSquaresProblem, refine

        idx = spec.system.index_of_states(observed)
        problem = LeastSquaresProblem(pgpgm.Integrator(spec.system, case.times), data.y.values, idx,
                                      data.noise_sd.values, case.x0)
        start = np.asarray(case.extra["least_squares_bad_start"], float)
        lsq = refine(problem, start, case.prior_bounds)
        extra = [f"least squares alone from {start.tolist()}: theta = {np.round(lsq.theta, 4).tolist()}, "
                 f"cost {lsq.cost:.1f}; pgpgm: cost {problem.cost(result.theta):.1f}"]
    _write_outputs(result, out, f"{spec.system.name}, case {case.name} (observed {', '.join(observed)})", extra)
    return 0


def _fit(a) -> int:
    import pandas as pd

    import pgpgm

    spec = pgpgm.load_model(a.model)
    case = spec.case()
    df = pd.read_csv(a.data)
    missing = {"time", "state", "value"} - set(df.columns)
    if missing:
        raise SystemExit(f"{a.data}: missing columns {sorted(missing)}; expected a tidy CSV time,state,value")
    wide = df.pivot_table(index="time", columns="state", values="value", aggfunc="first").sort_index()
    if wide.isna().any().any():
        raise SystemExit(f"{a.data}: every observed state needs a value at every time (found gaps)")
    data = {"time": wide.index.to_numpy(), **{c: wide[c].to_numpy() for c in wide.columns}}
    x0 = {}
    for item in a.x0:
        name, _, value = item.partition("=")
        x0[name] = float(value)
    if not x0 and np.isfinite(case.x0).any():
        x0 = {s: v for s, v in zip(spec.system.states, case.x0) if np.isfinite(v)}
    bounds = tuple(a.bounds) if a.bounds else None
    priors = bounds or spec.priors(case.name)
    draws = a.draws if a.draws is not None else max(case.iterations - a.tune, 100)
    result = pgpgm.fit(spec.system, data, a.observe, x0=x0, kernel=a.kernel or case.kernel,
                       gamma=a.gamma if a.gamma is not None else case.gamma, priors=priors, draws=draws,
                       tune=a.tune, chains=a.chains, seed=a.seed, true_theta=case.theta,
                       progressbar=not a.no_progress, **_posterior_options(a))
    out = a.out or Path("results") / f"{spec.system.name}_fit"
    _write_outputs(result, out, f"{spec.system.name} fitted to {a.data}")
    return 0


def _batch(a) -> int:
    """Fit every data set of ``--data``; write one result file per fit and summary.csv to
    ``--out``. Exit status 0 when every fit succeeded (or was done before), 1 otherwise."""
    import pgpgm
    from .batch import jobs_from_folder, jobs_from_tidy_csv

    spec = pgpgm.load_model(a.model)
    case = spec.case()
    opts = {"tune": a.tune, "chains": a.chains, "seed": a.seed, **_posterior_options(a),
            "draws": a.draws if a.draws is not None else max(case.iterations - a.tune, 100)}
    if a.x0:
        from .errors import DataError

        opts["x0"] = {}
        for item in a.x0:
            name, _, value = item.partition("=")
            try:
                opts["x0"][name] = float(value)
            except ValueError:
                raise DataError(f"--x0 {item!r}: expected STATE=VALUE with a number, e.g. x2=3.0") from None
    if a.kernel:
        opts["kernel"] = a.kernel
    if a.gamma is not None:
        opts["gamma"] = a.gamma
    if a.bounds:
        opts["priors"] = tuple(a.bounds)
    build = jobs_from_folder if a.data.is_dir() else jobs_from_tidy_csv
    jobs = build(a.data, spec, observed=a.observe)
    out = a.out or Path("results") / f"{spec.system.name}_batch"
    table = pgpgm.fit_many(jobs, out, scheduler=a.scheduler, n_workers=a.workers, progressbar=not a.no_progress,
                           **opts)
    shown = table[[c for c in ("name", "status", "seconds", "refinement_cost", "max_rhat", "error") if c in table]]
    print(shown.to_string(index=False))
    counts = table["status"].value_counts()
    print(f"\n{len(table)} jobs: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + f"; wrote {out}/")
    return 0 if not (table["status"] == "failed").any() else 1


def _posterior_options(a) -> dict:
    return {"posterior": None if a.posterior == "none" else a.posterior, "posterior_draws": a.posterior_draws,
            "posterior_tune": a.posterior_tune, "posterior_chains": a.posterior_chains}


def _sensitivity(a) -> int:
    import pgpgm

    spec = pgpgm.load_model(a.model)
    case = spec.case(a.case)
    span = tuple(a.t_span) if a.t_span else (float(case.times[0]), float(case.times[-1]))
    table = pgpgm.sensitivity_index(spec.system, case.theta, case.x0, span).to_pandas()
    print(f"Sensitivity index S_ij = ||dx_i/dtheta_j|| / ||x_i|| on {span}, theta = {case.theta.tolist()}")
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(a.out)
    return 0


def _list(a) -> int:
    import pgpgm

    for name in pgpgm.available_models():
        spec = pgpgm.load_model(name)
        print(f"{name}: {spec.description}")
        for c in spec.cases.values():
            print(f"    --case {c.name}: observed {', '.join(c.observed)}")
    return 0


def _info(a) -> int:
    from .versions import show_versions

    show_versions()
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    from .errors import PgpgmError

    try:
        return {"run": _run, "fit": _fit, "batch": _batch, "sensitivity": _sensitivity, "list": _list, "info": _info}[a.command](a)
    except (PgpgmError, KeyError, FileNotFoundError) as exc:
        print(f"pgpgm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

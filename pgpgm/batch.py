"""Many fits at once: a list of :class:`FitJob` run on ``dask.distributed``.

A study fits one model (or several) to many data sets - subjects, wells, replicates, the
seeds of a simulation study. :func:`fit_many` sends every job to a dask cluster (a
``LocalCluster`` with one single-threaded worker process per core unless told otherwise),
writes each finished fit at once to ``out_dir/<name>.nc`` (atomically, with a checksum:
:meth:`pgpgm.FitResult.save`; on the worker that ran it when the cluster is the LocalCluster
started here, else in the calling process unless ``save_on_workers=True``), records a failed
fit's error in ``out_dir/<name>.error.json`` without stopping the others, skips jobs whose
result file already exists and verifies on a rerun, and returns (and writes to
``out_dir/summary.csv``) one summary row per job. :func:`fit_and_save` does one job's work
in the calling process.

Jobs come from :func:`jobs_from_folder` (a folder of tidy CSVs), :func:`jobs_from_tidy_csv`
(one tidy CSV with a ``dataset`` column), :func:`product_jobs` (data sets x models x
settings) or are built by hand. dask is an optional dependency: ``pip install pgpgm[dask]``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import os
import re
import time
import traceback
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import DataError, PgpgmError, ResultFileError
from .ode.system import ODESystem
from .fitting import fit
from .steps.options import LEGACY_POSTERIOR, NUTS, posterior_option
from .processes import main_module_hidden
from .fit_result import check_replaceable, load_result
from .spec import ModelSpec, load_model

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]*$")
_TIDY = ("time", "state", "value")
SUMMARY_FILE = "summary.csv"

#: fit() options that fit_many sets itself on every worker (one process per fit, no progress bar per fit)
_SET_BY_FIT_MANY = frozenset({"cores", "progressbar"})
#: fit() options a job may set: every keyword of :func:`pgpgm.fit` but the data's and :data:`_SET_BY_FIT_MANY`;
#: anything else is a typo caught before the cluster starts
_FIT_OPTIONS = ((frozenset(inspect.signature(fit).parameters) | frozenset(LEGACY_POSTERIOR))
                - {"system", "data", "observed", "legacy"} - _SET_BY_FIT_MANY)


def _check_fit_options(options: Mapping[str, Any], who: str) -> None:
    """A :class:`~pgpgm.errors.DataError` naming ``who`` for every key of ``options`` that is no option of
    :func:`pgpgm.fit` a job may set (those fit_many sets itself named as such)."""
    own = sorted(set(options) & _SET_BY_FIT_MANY)
    if own:
        raise DataError(f"{who}: {own} are set by fit_many on every worker (cores=1, no progress bar per fit); "
                        "leave them out")
    unknown = sorted(set(options) - _FIT_OPTIONS)
    if unknown:
        raise DataError(f"{who}: unknown fit options {unknown}; a job may set {sorted(_FIT_OPTIONS)}")


@dataclass(frozen=True)
class FitJob:
    """One fit of :func:`fit_many`: a model, a data set and the options of :func:`pgpgm.fit`.

    Attributes
    ----------
    name : str
        Unique within a batch; names the files ``<name>.nc`` / ``<name>.error.json``, so it
        may hold letters, digits and ``_ . + = -`` (not starting with ``.`` or ``-``).
    model : ODESystem, ModelSpec, or str / Path
        The system; a :class:`~pgpgm.ModelSpec` (or a shipped model's name or a TOML file,
        loaded on the worker) also supplies the defaults of its case ``case``: kernel, gamma,
        uniform prior bounds and the latent states' initial values.
    data : xarray.Dataset, pandas.DataFrame, Mapping or Path
        What :func:`pgpgm.fit` accepts (a Dataset from :func:`pgpgm.simulate`, a wide table or
        dict with a ``time`` column), a tidy table with columns ``time,state,value``, or a
        CSV file of either kind (read where the job runs).
    observed : tuple of str or None
        Observed states (None: every state in the data).
    options : Mapping
        Keyword arguments of :func:`pgpgm.fit` for this job; they override ``fit_many``'s
        ``**fit_defaults``, which override the model case's defaults.
    case : str or None
        The case of a ModelSpec whose defaults apply (None: the first).
    """

    name: str
    model: ODESystem | ModelSpec | str | Path
    data: Any
    observed: tuple[str, ...] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    case: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise DataError(f"job name {self.name!r} cannot name a file: use letters, digits and _ . + = - "
                            "(not starting with '.' or '-')")
        if isinstance(self.observed, str):
            object.__setattr__(self, "observed", (self.observed,))
        elif self.observed is not None:
            object.__setattr__(self, "observed", tuple(self.observed))
        _check_fit_options(self.options, f"job {self.name!r}")


# ---------------------------------------------------------------------------------- building jobs


def tidy_to_wide(table: pd.DataFrame, source: str = "data") -> pd.DataFrame:
    """A tidy table (columns ``time, state, value``, one row per measurement) as a wide one:
    a ``time`` column and one column per state, rows sorted by time. A state not measured
    at some time gets NaN there (which :func:`pgpgm.fit` rejects with a DataError).

    Raises
    ------
    DataError : a column is missing, a time is missing, or a state has two values at one time.
    """
    missing = [c for c in _TIDY if c not in table.columns]
    if missing:
        raise DataError(f"{source}: missing columns {missing}; expected a tidy table with columns time,state,value")
    times = pd.to_numeric(table["time"], errors="coerce")
    if times.isna().any():
        raise DataError(f"{source}: the time column has missing or non-numeric entries (rows "
                        f"{times.index[times.isna()].tolist()[:5]})")
    dup = table.duplicated(["time", "state"])
    if dup.any():
        first = table.loc[dup, ["time", "state"]].iloc[0]
        raise DataError(f"{source}: state {first['state']!r} has more than one value at time {first['time']}; "
                        "give one value per state and time")
    wide = table.pivot(index="time", columns="state", values="value").sort_index()
    wide.columns = [str(c) for c in wide.columns]
    return wide.reset_index()


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise DataError(f"no data file {path}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not a readable CSV file ({exc})") from None


def _as_fit_data(data, name: str):
    """The job's data in a form :func:`pgpgm.fit` accepts (tidy tables and CSV files converted)."""
    if isinstance(data, (str, Path)):
        table = _read_csv(Path(data))
        return tidy_to_wide(table, str(data)) if set(_TIDY) <= set(table.columns) else table
    if isinstance(data, pd.DataFrame) and set(_TIDY) <= set(data.columns) and "time" not in data.index.names:
        return tidy_to_wide(data, f"job {name!r}")
    return data


def jobs_from_folder(folder: str | Path, model, *, observed: Sequence[str] | None = None,
                     options: Mapping[str, Any] | None = None, case: str | None = None,
                     pattern: str = "*.csv") -> list[FitJob]:
    """One job per CSV file in ``folder`` (named by the file's stem), each a tidy
    (``time,state,value``) or wide (``time`` + one column per state) table, all fitted with
    ``model`` and ``options``. Files are read where the jobs run.

    Raises
    ------
    DataError : ``folder`` is not a folder or holds no file matching ``pattern``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder of CSV files")
    files = sorted(folder.glob(pattern))
    if not files:
        raise DataError(f"{folder} holds no files matching {pattern!r}")
    return [FitJob(f.stem, model, f, observed, dict(options or {}), case) for f in files]


def jobs_from_tidy_csv(path_or_table, model, *, observed: Sequence[str] | None = None,
                       options: Mapping[str, Any] | None = None, case: str | None = None,
                       dataset_column: str = "dataset") -> list[FitJob]:
    """One job per value of ``dataset_column`` in a tidy table (a CSV path or a DataFrame with
    columns ``dataset_column, time, state, value``), named by that value, in order of
    first appearance.

    Raises
    ------
    DataError : the file cannot be read or lacks a column.
    """
    source = str(path_or_table) if isinstance(path_or_table, (str, Path)) else "the table"
    table = _read_csv(Path(path_or_table)) if isinstance(path_or_table, (str, Path)) else path_or_table
    missing = [c for c in (dataset_column, *_TIDY) if c not in table.columns]
    if missing:
        raise DataError(f"{source}: missing columns {missing}; expected a tidy table with columns "
                        f"{dataset_column},time,state,value")
    groups = table.groupby(dataset_column, sort=False)
    return [FitJob(str(key), model, part[list(_TIDY)].reset_index(drop=True), observed, dict(options or {}), case)
            for key, part in groups]


def product_jobs(datasets: Mapping[str, Any], models: Mapping[str, Any],
                 settings: Mapping[str, Mapping[str, Any]] | None = None, *,
                 observed: Sequence[str] | None = None) -> list[FitJob]:
    """Every data set x model x setting, named ``<dataset>__<model>__<setting>`` (the setting
    part left out when ``settings`` is None). ``models`` values are what :class:`FitJob`
    accepts; ``settings`` values are fit options."""
    settings = settings or {"": {}}
    jobs = []
    for (dn, data), (mn, model), (sn, opts) in itertools.product(datasets.items(), models.items(), settings.items()):
        name = "__".join(p for p in (dn, mn, sn) if p)
        jobs.append(FitJob(name, model, data, observed, dict(opts)))
    return jobs


# ---------------------------------------------------------------------------------- running one job


def model_defaults(spec: ModelSpec, case: str | None = None) -> dict[str, Any]:
    """The fit options a model file's case implies: kernel, gamma, its uniform prior bounds
    and the known initial values (for the latent states)."""
    c = spec.case(case)
    opts: dict[str, Any] = {"kernel": c.kernel, "gamma": c.gamma, "priors": spec.priors(c.name)}
    x0 = {s: float(v) for s, v in zip(spec.system.states, c.x0) if np.isfinite(v)}
    if x0:
        opts["x0"] = x0
    return opts


def resolve_job(job: FitJob, fit_defaults: Mapping[str, Any] | None = None) -> tuple[ODESystem, Any, dict]:
    """The system, the fit-ready data and the keyword arguments of :func:`pgpgm.fit` for
    ``job``: model case defaults < ``fit_defaults`` < ``job.options``."""
    model = job.model
    if isinstance(model, (str, Path)):
        model = load_model(model)
    base = model_defaults(model, job.case) if isinstance(model, ModelSpec) else {}
    system = model.system if isinstance(model, ModelSpec) else model
    if not isinstance(system, ODESystem):
        raise DataError(f"job {job.name!r}: model must be an ODESystem, a ModelSpec, a model name or a TOML file, "
                        f"got {type(job.model).__name__}")
    kwargs = {**base, **dict(fit_defaults or {}), **dict(job.options)}
    return system, _as_fit_data(job.data, job.name), kwargs


def one_core(options: Mapping[str, Any]) -> dict[str, Any]:
    """A job's :func:`pgpgm.fit` options with step 4 on one process (``NUTS(cores=1)``: PyMC's chains one after the
    other, nutpie's threads sharing the worker's core); the flat step-4 keywords of earlier releases folded into
    its :class:`~pgpgm.steps.options.NUTS` (with their DeprecationWarning)."""
    options = dict(options)
    legacy = {k: options.pop(k) for k in LEGACY_POSTERIOR if k in options}
    posterior = posterior_option(options.pop("posterior", "nuts"), legacy, who="fit_many's job")
    options["posterior"] = replace(posterior, cores=1) if isinstance(posterior, NUTS) else posterior
    return options


def run_job(job: FitJob, fit_defaults: Mapping[str, Any] | None = None):
    """Fit one job in this process as a worker of :func:`fit_many` does: ``cores=1`` (PyMC's NUTS
    chains one after the other; nutpie's chains, threads, share the worker's core), no progress bar,
    warnings collected. (The workers' BLAS runs one
    thread: dask's nanny sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` to 1 before it starts a worker process; this function changes
    nothing in the calling process.)

    Returns
    -------
    (FitResult, list of str) : the result and the messages of the warnings the fit raised.
    """
    system, data, kwargs = resolve_job(job, fit_defaults)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(system, data, job.observed, **one_core(kwargs), progressbar=False)
    messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    return result, messages


def _worker_task(job: FitJob, fit_defaults: Mapping[str, Any], out_dir: str | None = None) -> dict[str, Any]:
    """What runs on a dask worker: the fit, or its error as plain data (never raises for a
    failed fit, so dask need not pickle arbitrary exceptions). With ``out_dir`` (a folder
    this process shares with the caller) the outcome is written there by :func:`_write_outcome`
    and only the summary row comes back (``{"row": ...}``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result, messages = run_job(job, fit_defaults)
    except Exception as exc:  # a failed fit is recorded, not raised: the other jobs go on
        outcome = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc(), "seconds": time.perf_counter() - t0}
    else:
        outcome = {"ok": True, "result": result, "warnings": messages, "seconds": time.perf_counter() - t0,
                   "cpu_seconds": time.process_time() - c0}
    if out_dir is None:
        return outcome
    return {"row": _write_outcome(Path(out_dir), job.name, outcome)}


def fit_and_save(job: FitJob, out_dir: str | Path, fit_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Fit one job in this process and write its outcome to ``out_dir`` exactly as a worker
    of :func:`fit_many` does (``<name>.nc`` by :meth:`pgpgm.FitResult.save`, or
    ``<name>.error.json``); the job's summary row (:func:`summary_row`). A failed fit is
    recorded, not raised. ``out_dir`` is created if missing."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return _worker_task(job, dict(fit_defaults or {}), str(out))["row"]


# ---------------------------------------------------------------------------------- files


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, flush it to disk and rename it
    over ``path`` (readers see the old file or the whole new one); anything there but a regular
    file is refused (:func:`pgpgm.fit_result.check_replaceable`)."""
    check_replaceable(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        check_replaceable(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def result_path(out_dir: str | Path, name: str) -> Path:
    """Where :func:`fit_many` writes job ``name``'s result."""
    return Path(out_dir) / f"{name}.nc"


def error_path(out_dir: str | Path, name: str) -> Path:
    """Where :func:`fit_many` records job ``name``'s failure."""
    return Path(out_dir) / f"{name}.error.json"


# ---------------------------------------------------------------------------------- summary


def summary_row(name: str, result, *, status: str = "ok", seconds: float | None = None,
                cpu_seconds: float | None = None, warnings_: Sequence[str] = ()) -> dict[str, Any]:
    """One row of the summary table for a finished fit.

    Columns: ``name, status, posterior`` (``nuts``, ``laplace`` or ``gradient_matching``:
    where the means and intervals come from), ``seconds`` (the fit's wall time),
    ``cpu_seconds`` (the CPU time of the worker process during the fit, NaN for a skipped
    job; far below ``seconds`` means the machine has fewer free cores than workers),
    ``nll`` (negative log likelihood at the refined point), ``competing_optima`` (how many other
    optima fit about as well: ``FitResult.competing_optima``), ``refinement_cost`` (NaN when the
    noise sds were estimated), ``max_rhat``, ``min_ess`` (smallest bulk or tail ESS) and
    ``divergences`` (of NUTS when it ran, else of the gradient-matching chains), then per
    parameter P: ``P_refined``, ``P_mean`` (posterior mean), ``P_hdi_3%``, ``P_hdi_97%``
    (the 94 % central interval), and ``error``, ``warnings``.
    """
    est = result.estimates
    diag = result.diagnostics
    samplers = [] if diag is None else [str(s) for s in diag["sampler"].values]
    if "posterior" in samplers:
        kind, sampler = "nuts", "posterior"
    elif "posterior" in est["estimate"].values:
        kind, sampler = "laplace", "gradient_matching"
    else:
        kind, sampler = "gradient_matching", "gradient_matching"
    row: dict[str, Any] = {"name": name, "status": status, "posterior": kind,
                           "seconds": float(result.timings.get("total", np.nan)) if seconds is None else seconds,
                           "cpu_seconds": np.nan if cpu_seconds is None else cpu_seconds,
                           "nll": float(est.attrs.get("refinement_nll", np.nan)),
                           "competing_optima": len(result.competing_optima),
                           "refinement_cost": float(est.attrs.get("refinement_cost", np.nan))}
    if sampler in samplers:
        d = diag.sel(sampler=sampler)
        row["max_rhat"] = float(d["rhat"].max())
        row["min_ess"] = float(min(d["ess_bulk"].min(), d["ess_tail"].min()))
        row["divergences"] = int(d["divergences"])
    post = result.posterior.posterior
    refined = est["theta"].sel(estimate="refined").values
    for p, r in zip(result.system.parameters, refined):
        row[f"{p}_refined"] = float(r)
        row[f"{p}_mean"] = float(post[p].mean())
        row[f"{p}_hdi_3%"] = float(post[p].quantile(0.03))
        row[f"{p}_hdi_97%"] = float(post[p].quantile(0.97))
    row["error"] = ""
    row["warnings"] = " | ".join(warnings_)
    return row


def _failed_row(name: str, kind: str, message: str, seconds: float) -> dict[str, Any]:
    return {"name": name, "status": "failed", "seconds": seconds, "error": f"{kind}: {message}"}


_LEADING = ["name", "status", "posterior", "seconds", "cpu_seconds", "nll", "competing_optima", "refinement_cost",
            "max_rhat", "min_ess", "divergences"]


def _table(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    table = pd.DataFrame(list(rows), columns=None if rows else ["name", "status"])
    cols = [c for c in _LEADING if c in table.columns]
    rest = [c for c in table.columns if c not in cols and c not in ("error", "warnings")]
    return table[cols + rest + [c for c in ("error", "warnings") if c in table.columns]]


# ---------------------------------------------------------------------------------- the batch


def _import_distributed():
    try:
        from dask import distributed
    except ImportError as exc:
        raise PgpgmError("fit_many needs dask.distributed, which is not installed; install the extra with "
                         "`pip install pgpgm[dask]`") from exc
    return distributed


def _finished(path: Path):
    """The result at ``path`` if it exists and verifies, else None."""
    if not path.is_file():
        return None
    try:
        return load_result(path)
    except ResultFileError:
        return None


def fit_many(jobs: Iterable[FitJob], out_dir: str | Path, *, client=None, scheduler: str | None = None,
             n_workers: int | None = None, save_on_workers: bool | None = None, progressbar: bool = True,
             **fit_defaults) -> pd.DataFrame:
    """Run many fits on a dask cluster, writing each result as soon as it is done.

    Parameters
    ----------
    jobs : iterable of FitJob
        Names must be unique.
    out_dir : str or Path
        Created if missing. Gets ``<name>.nc`` per finished fit (:meth:`pgpgm.FitResult.save`:
        atomic and checksummed), ``<name>.error.json`` per failed fit (``name``, ``type``,
        ``message``, ``traceback``; written atomically) and ``summary.csv``.
    client : distributed.Client, optional
        Run on this client's cluster (left open).
    scheduler : str, optional
        Address of a running scheduler, e.g. ``"tcp://10.0.0.5:8786"`` (a client is opened and
        closed here). The workers need pgpgm installed; results come back to this process,
        so no shared file system is needed.
    n_workers : int, optional
        Workers of the default ``LocalCluster`` (default: one per CPU core), each a process
        with one thread; started and closed here.
    save_on_workers : bool, optional
        Where the result and error files are written. True: by the worker that ran the fit,
        into ``out_dir`` resolved to an absolute path here, and only the summary row comes
        back - every worker must see ``out_dir`` at that path (a shared file system). False:
        in this process, the whole result sent back by the worker. Default (None): True for
        the LocalCluster started here, False for ``client=`` or ``scheduler=`` (pass True when
        those workers share this machine's file system, e.g. your own LocalCluster).
    progressbar : bool
        A tqdm bar over the jobs.
    **fit_defaults
        Options of :func:`pgpgm.fit` for every job (a job's ``options`` override them).

    Returns
    -------
    pandas.DataFrame : one row per job in the order given (columns of :func:`summary_row`),
        ``status`` ``ok`` (fitted now), ``skipped`` (a verified result file was already
        there: a rerun fits only the jobs not yet done, failed ones included) or ``failed``
        (``error`` holds ``Type: message``). Also written to ``out_dir/summary.csv``.

    Notes
    -----
    Each worker is a process with one thread whose BLAS runs one thread (the default
    LocalCluster's nanny sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` to 1 before starting it, as dask's nannies do by default; start
    workers of your own cluster with a nanny, the ``dask worker`` default) and fits with ``cores=1``
    (PyMC's NUTS chains one after the other; nutpie's threads share the core): the parallelism is
    across fits. A fit on a
    worker gives the same numbers as :func:`pgpgm.fit` in this process with the same
    options and seed. A worker that dies (e.g. out of memory) fails
    its job only (after dask's retries on other workers). Files are written by the workers
    or by this process (``save_on_workers``); either way with the same function, atomically,
    so a file at ``<name>.nc`` is always a whole verified result. Saving a fit of the default
    budget with a Laplace posterior costs 0.7-1 s of CPU, which is why the
    LocalCluster's workers save their own results rather than this process competing with
    them for the cores.

    A rerun recognises a finished job by its verified file alone, not by its options: delete
    ``<name>.nc`` (or use another ``out_dir``) to refit a job with new options.

    Raises
    ------
    DataError : duplicate job names, or a fit option of fit_many that :func:`pgpgm.fit` does
        not take (checked before anything starts).
    PgpgmError : dask.distributed is not installed.
    """
    jobs = list(jobs)
    names = [j.name for j in jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DataError(f"job names must be unique (they name the result files); repeated: {dupes}")
    _check_fit_options(fit_defaults, "fit_many")
    if sum(x is not None for x in (client, scheduler)) > 1:
        raise DataError("give at most one of client= and scheduler=")
    if n_workers is not None and (client is not None or scheduler is not None):
        raise DataError("n_workers= sizes the default LocalCluster; it cannot be combined with client= or scheduler=")
    if save_on_workers not in (None, True, False):
        raise DataError(f"save_on_workers must be True, False or None (the default), got {save_on_workers!r}")
    if save_on_workers is None:
        save_on_workers = client is None and scheduler is None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    rows: dict[str, dict[str, Any]] = {}
    todo = []
    for job in jobs:
        done = _finished(result_path(out, job.name))
        if done is not None:
            rows[job.name] = summary_row(job.name, done, status="skipped")
        else:
            todo.append(job)
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="fits", unit="fit", disable=not progressbar)
    try:
        if todo:
            distributed = _import_distributed()
            with _cluster_client(distributed, client, scheduler, n_workers) as c:
                where = str(out.resolve()) if save_on_workers else None
                futures = {c.submit(_worker_task, job, dict(fit_defaults), where, key=f"pgpgm-fit-{job.name}-"
                                    f"{uuid.uuid4().hex[:8]}", pure=False): job for job in todo}
                for future in distributed.as_completed(futures):
                    job = futures[future]
                    rows[job.name] = _record(out, job, future)
                    future.release()
                    bar.update(1)
                    if rows[job.name]["status"] == "failed":
                        bar.set_postfix(failed=sum(r["status"] == "failed" for r in rows.values()))
    finally:
        bar.close()
        table = _table([rows[n] for n in names if n in rows])
        _atomic_write_text(out / SUMMARY_FILE, table.to_csv(index=False))
    return table


def _record(out: Path, job: FitJob, future) -> dict[str, Any]:
    """The summary row of one finished future, its outcome written here (result file or error
    file) unless the worker wrote it."""
    try:
        outcome = future.result()
    except Exception as exc:  # the worker died or the task could not run at all
        outcome = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                   "traceback": "".join(traceback.format_exception(exc)), "seconds": float("nan")}
    if "row" in outcome:
        return outcome["row"]
    return _write_outcome(out, job.name, outcome)


def _write_outcome(out: Path, name: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """Write one job's outcome (:func:`_worker_task`'s dict) to ``out``: its result file
    (removing an error file of an earlier run) or its error file, both atomically; its summary
    row. A result that cannot be saved fails the job (its error file says why)."""
    err = error_path(out, name)
    if outcome["ok"]:
        try:
            outcome["result"].save(result_path(out, name))
        except Exception as exc:  # e.g. a full disk: this job fails, the others go on
            outcome = {"ok": False, "type": type(exc).__name__, "message": f"the fit succeeded but saving it "
                       f"failed: {exc}", "traceback": traceback.format_exc(), "seconds": outcome["seconds"]}
        else:
            err.unlink(missing_ok=True)
            return summary_row(name, outcome["result"], seconds=outcome["seconds"],
                               cpu_seconds=outcome["cpu_seconds"], warnings_=outcome["warnings"])
    record = {k: outcome[k] for k in ("type", "message", "traceback", "seconds")}
    _atomic_write_text(err, json.dumps({"name": name, **record}, indent=1, default=float) + "\n")
    return _failed_row(name, outcome["type"], outcome["message"], outcome["seconds"])


@contextlib.contextmanager
def _cluster_client(distributed, client, scheduler: str | None, n_workers: int | None):
    """The given client (left open), a client of ``scheduler`` (closed after), or a client of
    a new LocalCluster with ``n_workers`` (default: one per core) single-threaded worker
    processes (both closed after), without dashboards and with dask's monitoring slowed to
    what a batch of fits needs (:data:`_QUIET`): the workers' statistical profiler off, and
    the event-loop health check, the system monitor and the memory monitor every 1-2 s
    instead of every 20, 500 and 100 ms. An idle 2-worker cluster then takes 0.55 s of CPU per
    30 s instead of 4.1 s with dask's defaults (parent 0.31 instead of 1.70, each worker 0.12
    instead of 1.2): CPU that the fits need on a machine with as many cores as workers."""
    if client is not None:
        yield client
    elif scheduler is not None:
        with distributed.Client(scheduler) as c:
            yield c
    else:
        import dask

        n = n_workers or os.cpu_count() or 1
        settings = {f"distributed.nanny.pre-spawn-environ.{v}": 1 for v in _BLAS_THREADS} | _QUIET
        with main_module_hidden(), dask.config.set(settings), distributed.LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                distributed.Client(cluster) as c:
            yield c


_BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_QUIET = {  # dask settings of fit_many's own LocalCluster (see _cluster_client)
    "distributed.worker.multiprocessing-method": "spawn",  # never fork a threaded process (pgpgm.processes)
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "1s",
}

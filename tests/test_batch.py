"""Many fits on dask: a real LocalCluster (2 worker processes), results equal to serial fits,
failures recorded, reruns skip finished jobs, the summary table, the `pgpgm batch` CLI."""

from __future__ import annotations

import inspect
import json
import sys

import numpy as np
import pandas as pd
import pytest

import pgpgm
from pgpgm.batch import (
    FitJob,
    error_path,
    jobs_from_folder,
    jobs_from_tidy_csv,
    result_path,
)
from pgpgm.errors import DataError, PgpgmError
from tests.conftest import dask_cluster

distributed = pytest.importorskip("distributed")

CASE = "x1-observed"
FAST = {"draws": 50, "tune": 50, "posterior": None}


def _tidy(ds) -> pd.DataFrame:
    """A simulated Dataset as a tidy table time,state,value."""
    y = ds["y"].to_pandas()
    return (y.reset_index().melt(id_vars="time", var_name="state", value_name="value")
            .sort_values(["time", "state"]).reset_index(drop=True))


@pytest.fixture(scope="module")
def spec():
    return pgpgm.load_model("lotka-volterra")


@pytest.fixture(scope="module")
def datasets(spec):
    return {f"seed{k}": _tidy(spec.simulate(CASE, seed=k)) for k in (1, 2)}


@pytest.fixture(scope="module")
def client():
    """A 2-worker cluster made as fit_many makes its default one."""
    from pgpgm.batch import _cluster_client

    with _cluster_client(distributed, None, None, 2) as c:
        yield c


@pytest.fixture(scope="module")
def batch(spec, datasets, client, tmp_path_factory):
    """Two good jobs (one with a Laplace posterior), one with an inf in its data (a NaN is a value not
    measured)."""
    out = tmp_path_factory.mktemp("batch")
    bad = datasets["seed1"].copy()
    bad.loc[5, "value"] = np.inf
    jobs = [FitJob("seed1", spec, datasets["seed1"], ["x1"], case=CASE),
            FitJob("seed2", spec, datasets["seed2"], ["x1"], {"posterior": "laplace", "seed": 3}, case=CASE),
            FitJob("bad", spec, bad, ["x1"], case=CASE)]
    table = pgpgm.fit_many(jobs, out, client=client, progressbar=False, **FAST)
    return jobs, out, table


def test_summary_rows_statuses_and_error_file(batch, spec):
    jobs, out, table = batch
    assert table["name"].tolist() == ["seed1", "seed2", "bad"]
    assert table["status"].tolist() == ["ok", "ok", "failed"]
    assert table["posterior"].tolist()[:2] == ["gradient_matching", "laplace"]
    assert "DataError" in table.loc[2, "error"] and "contain inf" in table.loc[2, "error"]
    assert table.loc[:1, "error"].tolist() == ["", ""]
    on_disk = pd.read_csv(out / "summary.csv", keep_default_na=False, na_values=[""])
    assert on_disk["name"].tolist() == ["seed1", "seed2", "bad"]
    np.testing.assert_allclose(on_disk["theta1_refined"].to_numpy()[:2], table["theta1_refined"].to_numpy()[:2],
                               rtol=1e-12)
    record = json.loads(error_path(out, "bad").read_text())
    assert record["type"] == "DataError" and "inf" in record["message"] and "Traceback" in record["traceback"]
    assert not result_path(out, "bad").exists() and not error_path(out, "seed1").exists()
    # the row's numbers are the saved result's: refined estimate, posterior mean and 94 % interval, diagnostics
    for name in ("seed1", "seed2"):
        res = pgpgm.load_result(result_path(out, name))
        row = table.set_index("name").loc[name]
        post = res.posterior.posterior
        for p, r in zip(spec.system.parameters, res.theta):
            assert row[f"{p}_refined"] == r
            assert row[f"{p}_mean"] == pytest.approx(float(post[p].mean()), rel=1e-12)
            lo, hi = np.quantile(post[p].values.ravel(), [0.03, 0.97])
            assert row[f"{p}_hdi_3%"] == pytest.approx(lo, rel=1e-12)
            assert row[f"{p}_hdi_97%"] == pytest.approx(hi, rel=1e-12)
        gm = res.diagnostics.sel(sampler="gradient_matching")
        assert row["max_rhat"] == pytest.approx(float(gm["rhat"].max()))
        assert row["nll"] == pytest.approx(res.nll) and np.isnan(row["refinement_cost"])  # noise estimated
        assert row["competing_optima"] == len(res.competing_optima) == 0
        assert row["seconds"] > 0 and 0 < row["cpu_seconds"] <= row["seconds"] * 1.05 + 0.5


def test_workers_run_blas_on_one_thread_without_profiler(client):
    """Checked inside the worker processes with threadpoolctl (the fixture's cluster is made as
    fit_many makes its own)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    numpy_blas = {w: [i["num_threads"] for i in info if i["user_api"] == "blas"]
                  for w, info in client.run(lambda: (__import__("numpy"), threadpoolctl.threadpool_info())[1]).items()}
    assert len(numpy_blas) == 2 and all(threads and set(threads) == {1} for threads in numpy_blas.values()), numpy_blas
    # and without the statistical profiler (for the dashboard): no periodic stack-sampling callback;
    # the event-loop health check runs every second, not every 20 ms
    callbacks = client.run(lambda dask_worker: {k: c.callback_time for k, c in dask_worker.periodic_callbacks.items()})
    assert len(callbacks) == 2 and all("heartbeat" in c and "profile" not in c for c in callbacks.values()), callbacks
    assert all(c["tick"] == 1000 for c in callbacks.values()), callbacks


def test_workers_fit_without_importing_plotting_libraries(batch, client):
    """After the batch's fits on them (one with a Laplace posterior), the worker processes have
    not imported matplotlib nor arviz-plots: pgpgm's fit path imports arviz-base / arviz-stats,
    not the arviz meta-package, so each worker's start-up is ~0.8 s of CPU shorter."""
    _, _, table = batch
    assert sorted(table.loc[table["status"] == "ok", "name"]) == ["seed1", "seed2"]
    loaded = client.run(lambda: sorted(m for m in ("matplotlib", "arviz_plots", "pgpgm.fitting")
                                       if m in __import__("sys").modules))
    assert any("pgpgm.fitting" in v for v in loaded.values()), loaded  # a worker did fit
    assert all(not {"matplotlib", "arviz_plots"} & set(v) for v in loaded.values()), loaded


def test_worker_fit_equals_serial_fit(batch, spec, datasets):
    """The Laplace job, fitted in this process with pgpgm.fit and the same options and seed."""
    jobs, out, _ = batch
    wide = datasets["seed2"].pivot(index="time", columns="state", values="value").reset_index()
    serial = pgpgm.fit(spec.system, wide, ["x1"], x0={"x1": 5.0, "x2": 3.0}, priors=spec.priors(CASE),
                       kernel="rbf", gamma=0.3, draws=50, tune=50, seed=3, posterior="laplace", progressbar=False)
    remote = pgpgm.load_result(result_path(out, "seed2"))
    np.testing.assert_array_equal(remote.estimates["theta"].values, serial.estimates["theta"].values)
    np.testing.assert_array_equal(remote.estimates["x0"].values, serial.estimates["x0"].values)
    assert list(remote.estimates["estimate"].values) == ["sampled", "refined", "posterior"]
    np.testing.assert_array_equal(remote.posterior.posterior["theta1"].values,
                                  serial.posterior.posterior["theta1"].values)


def test_rerun_skips_finished_jobs_and_refits_damaged_or_failed(batch, client):
    jobs, out, first = batch
    stamps = {j.name: result_path(out, j.name).stat().st_mtime_ns for j in jobs[:2]}
    # all done: no cluster is contacted at all (an unreachable scheduler would fail)
    again = pgpgm.fit_many(jobs[:2], out, scheduler="tcp://127.0.0.1:9", progressbar=False, **FAST)
    assert again["status"].tolist() == ["skipped", "skipped"]
    assert {n: result_path(out, n).stat().st_mtime_ns for n in stamps} == stamps
    pd.testing.assert_series_equal(again["theta1_refined"], first["theta1_refined"][:2])
    # a damaged file is refitted (to the same numbers); the failed job is tried again
    path = result_path(out, "seed1")
    path.write_bytes(path.read_bytes()[:5000])
    third = pgpgm.fit_many(jobs, out, client=client, progressbar=False, **FAST)
    assert third["status"].tolist() == ["ok", "skipped", "failed"]
    assert result_path(out, "seed2").stat().st_mtime_ns == stamps["seed2"]
    assert third.loc[0, "theta1_refined"] == first.loc[0, "theta1_refined"]
    assert pgpgm.load_result(path).theta[0] == first.loc[0, "theta1_refined"]


def _parent_must_not_save(monkeypatch):
    """FitResult.save raises in this (the parent) process only: the workers are other processes."""
    def refuse(self, path):
        raise AssertionError(f"saved in the parent process: {path}")

    monkeypatch.setattr(pgpgm.FitResult, "save", refuse)


def _same_fit(a, b) -> None:
    """Two loaded results hold the same numbers (every variable of every group; attributes such
    as ArviZ's creation time aside)."""
    xr = pytest.importorskip("xarray")
    for part in ("estimates", "trajectories", "diagnostics"):
        xr.testing.assert_equal(getattr(a, part), getattr(b, part))
    xr.testing.assert_equal(a.posterior, b.posterior)
    xr.testing.assert_equal(a.gradient_matching, b.gradient_matching)
    assert a.nll == b.nll and a.estimates.attrs["refinement_nll"] == b.estimates.attrs["refinement_nll"]


def test_workers_save_results_equal_to_a_serial_fit_and_record_failures(spec, datasets, client, tmp_path,
                                                                        monkeypatch):
    """save_on_workers=True on the 2-worker LocalCluster: the parent saves nothing, the files the
    workers wrote load back equal to fit_and_save's in this process, a failed fit and a result
    that cannot be saved (a folder in its place) are recorded without stopping the others, and a
    rerun skips the finished jobs."""
    from pgpgm.batch import fit_and_save

    bad = datasets["seed1"].copy()
    bad.loc[5, "value"] = np.inf
    jobs = [FitJob("seed2", spec, datasets["seed2"], ["x1"], {"posterior": "laplace", "seed": 3}, case=CASE),
            FitJob("bad", spec, bad, ["x1"], case=CASE),
            FitJob("blocked", spec, datasets["seed1"], ["x1"], case=CASE)]
    serial_row = fit_and_save(jobs[0], tmp_path / "serial", FAST)  # in this process, before save is patched
    out = tmp_path / "workers"
    out.mkdir()
    result_path(out, "blocked").mkdir()  # a folder where the result file should go: saving it fails
    with monkeypatch.context() as m:
        _parent_must_not_save(m)
        table = pgpgm.fit_many(jobs, out, client=client, save_on_workers=True, progressbar=False, **FAST)
    assert table["status"].tolist() == ["ok", "failed", "failed"], table[["name", "status", "error"]]
    assert "DataError" in table.loc[1, "error"] and "contain inf" in table.loc[1, "error"]
    assert "ResultFileError" in table.loc[2, "error"] and "saving it failed" in table.loc[2, "error"]
    assert json.loads(error_path(out, "bad").read_text())["type"] == "DataError"
    assert json.loads(error_path(out, "blocked").read_text())["type"] == "ResultFileError"
    assert not error_path(out, "seed2").exists()
    remote, serial = pgpgm.load_result(result_path(out, "seed2")), pgpgm.load_result(result_path(tmp_path / "serial",
                                                                                                  "seed2"))
    _same_fit(remote, serial)
    assert list(remote.estimates["estimate"].values) == ["sampled", "refined", "posterior"]
    row = table.iloc[0]
    for p in spec.system.parameters:  # the worker's summary row is the serial one
        for col in (f"{p}_refined", f"{p}_mean", f"{p}_hdi_3%", f"{p}_hdi_97%"):
            assert row[col] == serial_row[col]
    assert row["max_rhat"] == serial_row["max_rhat"] and row["posterior"] == "laplace"
    # rerun: the finished job is skipped (file untouched), the failed ones are tried again
    stamp = result_path(out, "seed2").stat().st_mtime_ns
    result_path(out, "blocked").rmdir()
    with monkeypatch.context() as m:
        _parent_must_not_save(m)
        again = pgpgm.fit_many(jobs, out, client=client, save_on_workers=True, progressbar=False, **FAST)
    assert again["status"].tolist() == ["skipped", "failed", "ok"]
    assert result_path(out, "seed2").stat().st_mtime_ns == stamp
    assert not error_path(out, "blocked").exists() and pgpgm.load_result(result_path(out, "blocked")).theta.shape == (4,)
    assert again.loc[0, "theta1_refined"] == table.loc[0, "theta1_refined"]


def test_own_local_cluster_saves_on_its_workers_by_default(spec, datasets, tmp_path, monkeypatch):
    """fit_many's own LocalCluster (2 workers): the workers write the files (saving in this
    process would raise), equal to fit_and_save's in this process."""
    job = FitJob("seed1", spec, datasets["seed1"], ["x1"], case=CASE)
    with monkeypatch.context() as m:
        _parent_must_not_save(m)
        table = pgpgm.fit_many([job], tmp_path, n_workers=2, progressbar=False, **FAST)
        with pytest.raises(DataError, match="save_on_workers"):
            pgpgm.fit_many([job], tmp_path, n_workers=2, save_on_workers="yes", progressbar=False)
    assert table["status"].tolist() == ["ok"]
    from pgpgm.batch import fit_and_save

    assert fit_and_save(job, tmp_path / "serial", FAST)["status"] == "ok"
    serial = pgpgm.load_result(result_path(tmp_path / "serial", "seed1"))
    _same_fit(pgpgm.load_result(result_path(tmp_path, "seed1")), serial)


def test_cli_batch_on_tidy_csv_with_dataset_column(batch, datasets, client, tmp_path, capsys):
    from pgpgm.cli import main

    _, out_api, api = batch
    csv = tmp_path / "all.csv"
    pd.concat([d.assign(dataset=k) for k, d in datasets.items()])[["dataset", "time", "state", "value"]].to_csv(
        csv, index=False)
    out = tmp_path / "out"
    code = main(["batch", "--model", "lotka-volterra", "--data", str(csv), "--out", str(out), "--observe", "x1",
                 "--scheduler", client.scheduler.address, "--draws", "50", "--tune", "50", "--posterior", "none",
                 "--no-progress"])
    assert code == 0
    table = pd.read_csv(out / "summary.csv")
    assert table["name"].tolist() == ["seed1", "seed2"] and table["status"].tolist() == ["ok", "ok"]
    assert "2 jobs: 2 ok" in capsys.readouterr().out
    # same data, model case and options as the API's job seed1: the same estimates
    cli_res = pgpgm.load_result(result_path(out, "seed1"))
    np.testing.assert_array_equal(cli_res.estimates["theta"].values,
                                  pgpgm.load_result(result_path(out_api, "seed1")).estimates["theta"].values)


def test_cli_batch_reports_a_failed_fit_with_exit_status_1(tmp_path, client, datasets):
    from pgpgm.cli import main

    folder = tmp_path / "csvs"
    folder.mkdir()
    bad = datasets["seed1"].copy()
    bad.loc[3, "time"] = np.nan
    bad.to_csv(folder / "broken.csv", index=False)
    code = main(["batch", "--model", "lotka-volterra", "--data", str(folder), "--out", str(tmp_path / "o"),
                 "--scheduler", client.scheduler.address, "--draws", "50", "--tune", "50", "--no-progress"])
    assert code == 1
    assert json.loads((tmp_path / "o" / "broken.error.json").read_text())["type"] == "DataError"


def test_cli_batch_passes_the_step4_options_on(tmp_path, datasets, capture_call):
    """``pgpgm batch --posterior-budget 30 --posterior-sd-error 0.03`` reaches fit_many as fit options (before, the
    budget was refused as an unknown option)."""
    from pgpgm.cli import main

    folder = tmp_path / "csvs"
    folder.mkdir()
    datasets["seed1"].to_csv(folder / "one.csv", index=False)
    own = set(inspect.signature(pgpgm.fit_many).parameters)  # fit_many's own keywords; the rest are fit options
    seen = capture_call(pgpgm, "fit_many")
    with pytest.raises(capture_call.stop):
        main(["batch", "--model", "lotka-volterra", "--data", str(folder), "--out", str(tmp_path / "o"),
              "--posterior-budget", "30", "--posterior-sd-error", "0.03", "--no-progress"])
    assert "posterior_budget" not in seen  # one way to set step 4: the NUTS object
    spec = seen["posterior"]
    assert isinstance(spec, pgpgm.NUTS) and spec.sd_error == 0.03 and spec.budget == pgpgm.PosteriorBudget(30.0, None)
    pgpgm.FitJob("one", "lotka-volterra", datasets["seed1"], options={k: v for k, v in seen.items() if k not in own})


# -------------------------------------------------------------------- input checks (no cluster)


def test_bad_jobs_are_rejected_before_anything_runs(spec, datasets, tmp_path):
    with pytest.raises(DataError, match="cannot name a file"):
        FitJob("../x", spec, datasets["seed1"])
    with pytest.raises(DataError, match="unknown fit options.*'draw'"):
        FitJob("a", spec, datasets["seed1"], options={"draw": 5})
    job = FitJob("a", spec, datasets["seed1"])
    with pytest.raises(DataError, match="unique.*'a'"):
        pgpgm.fit_many([job, job], tmp_path, progressbar=False)
    with pytest.raises(DataError, match="unknown fit options.*'iterations'"):
        pgpgm.fit_many([job], tmp_path, progressbar=False, iterations=5)
    with pytest.raises(DataError, match=r"\['cores'\] are set by fit_many"):
        FitJob("a", spec, datasets["seed1"], options={"cores": 2})
    assert not (tmp_path / "a.nc").exists()


def test_a_job_may_set_every_option_of_fit_but_the_data_and_what_fit_many_sets():
    """Every keyword of pgpgm.fit is a job option (posterior_budget, noise, observables, ... too; the set is read
    from fit's signature) but the data's and cores / progressbar, which fit_many sets on every worker."""
    from pgpgm.batch import _FIT_OPTIONS
    from pgpgm.steps.options import LEGACY_POSTERIOR

    keywords = set(inspect.signature(pgpgm.fit).parameters) | set(LEGACY_POSTERIOR)  # the flat ones: deprecated
    assert _FIT_OPTIONS == keywords - {"system", "data", "observed", "legacy", "cores", "progressbar"}
    assert {"posterior_budget", "noise", "observables", "transform", "x0_observed", "scheme", "t0"} <= _FIT_OPTIONS


def test_job_builders(spec, datasets, tmp_path):
    with pytest.raises(DataError, match="missing columns \\['dataset'\\]"):
        jobs_from_tidy_csv(datasets["seed1"], spec)
    with pytest.raises(DataError, match="no files"):
        jobs_from_folder(tmp_path, spec)
    for k, d in datasets.items():
        d.to_csv(tmp_path / f"{k}.csv", index=False)
    jobs = jobs_from_folder(tmp_path, spec, observed=["x1"], options={"seed": 4})
    assert [j.name for j in jobs] == ["seed1", "seed2"] and jobs[0].observed == ("x1",)
    from pgpgm.batch import resolve_job

    system, data, kwargs = resolve_job(jobs[1], {"draws": 7, "seed": 1})
    assert kwargs["seed"] == 4 and kwargs["draws"] == 7 and kwargs["x0"] == {"x1": 5.0, "x2": 3.0}
    assert kwargs["priors"] == spec.priors(CASE)
    np.testing.assert_array_equal(data["x1"].to_numpy(), datasets["seed2"]["value"].to_numpy())
    assert data["time"].is_monotonic_increasing
    grid = pgpgm.product_jobs({"d1": 1, "d2": 2}, {"lv": spec}, {"short": {"draws": 10}, "long": {"draws": 20}})
    assert [j.name for j in grid] == ["d1__lv__short", "d1__lv__long", "d2__lv__short", "d2__lv__long"]


def test_missing_dask_names_the_extra(spec, datasets, tmp_path, monkeypatch):
    import dask

    for module in ("distributed", "dask.distributed"):  # as if not installed: importing them fails
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delattr(dask, "distributed", raising=False)
    with pytest.raises(PgpgmError, match=r"pgpgm\[dask\]"):
        pgpgm.fit_many([FitJob("a", spec, datasets["seed1"])], tmp_path, progressbar=False)


# -------------------------------------------------------------------- a cluster started by hand


@pytest.mark.slow  # CI runs this set-up as docs/many-fits.md's example (tests/test_docs_examples.py)
def test_scheduler_address_of_a_separately_started_scheduler_and_worker(spec, datasets, tmp_path):
    """``fit_many(scheduler=...)`` on a scheduler and a worker started as their own processes with
    dask's command line (``dask scheduler``, ``dask worker``), as on a real cluster: the results come
    back to this process (no shared file system assumed) and equal a fit in this process."""
    from pgpgm.batch import fit_and_save

    with dask_cluster(tmp_path, "scheduler.json") as address:
        with distributed.Client(address, timeout=120) as c:
            c.wait_for_workers(1, timeout=120)
        jobs = [FitJob(n, spec, datasets[n], ["x1"], case=CASE) for n in ("seed1", "seed2")]
        table = pgpgm.fit_many(jobs, tmp_path / "out", scheduler=address, progressbar=False, **FAST)
        assert table["status"].tolist() == ["ok", "ok"]
        assert fit_and_save(jobs[0], tmp_path / "serial", FAST)["status"] == "ok"
        _same_fit(pgpgm.load_result(result_path(tmp_path / "out", "seed1")),
                  pgpgm.load_result(result_path(tmp_path / "serial", "seed1")))

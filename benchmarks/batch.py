"""Many fits: serial in one process against ``pgpgm.fit_many`` on a LocalCluster.

FitzHugh-Nagumo, R observed, data simulated with seeds 0..n-1; every fit has pgpgm.fit's
default budget (2 chains of at most 1500 + 2000 gradient-matching iterations, stopped early when
they agree) and, unless told
otherwise, the Laplace posterior (step 4 by NUTS would dominate and is not what this
measures). Both sides do the same work per fit: BLAS limited to one thread, ``cores=1``, the
fit and the writing of its result file (:func:`pgpgm.batch.fit_and_save`, what a worker of
``fit_many``'s own LocalCluster runs; threadpoolctl on the serial side), and the serial side
runs after one warm-up fit (its numba / PyTensor compilation is reported apart), while the
cluster's time includes starting the cluster and each worker's compilation. The cluster's
estimates are checked to equal the serial ones. A second run on a cluster made as fit_many
makes its own, whose workers each did one warm-up fit first (as the serial side did), gives the
steady-state throughput; its start-up and warm-up are reported apart, and its CPU accounting
(the workers' whole process CPU - fits, saves, dask - and the parent's) gives the speed-up the
CPU times allow, the fairer figure on a shared machine. Third, without dask: as many fresh Python
processes as workers, started at once, each fitting and saving its share of the jobs one after
the other (interpreter start, imports and compilation included, as for fit_many's own cluster):
the speed-up any scheduler of whole fits could reach on this machine, and the fits' CPU time when
two run side by side.

Overhead of the cluster: start-up and shutdown of a LocalCluster with no work, and the
wall time per trivial task (n no-op tasks through the scheduler). A cold cluster's fixed
costs, measured apart: the workers importing pgpgm (all at once), the shutdown of workers that
hold it, and with the warm-up fits above the wall time they predict for the cold cluster
(fixed costs + warm workers' wall) and the speed-up they allow.

Targets (issue 34): a fit on one worker at most 1.1x the same fit in-process; on this 2-core
machine >= 1.8x with 2 workers on fits >= 5 s (16 workers on a 16-core machine: >= 11x).

    ./run.sh bench batch                # 32 fits, 2 workers
    ./run.sh bench batch --n 6          # a quick check
    ./run.sh bench batch --scale 1,2    # and warm clusters of 1 and 2 workers (1,2,4,8,16 on 16 cores)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import harness
import pgpgm


def _noop(i: int) -> int:
    return i


def _import_pgpgm() -> None:
    """What a worker does for its first job: import pgpgm and load its batch layer (runs on the
    workers: imports here, not the script's module-level pgpgm, which cloudpickle cannot send)."""
    import pgpgm as loaded

    loaded.fit_many  # noqa: B018


def _jobs(n: int, draws: int, tune: int, posterior: str):
    """The benchmark's jobs (FitzHugh-Nagumo R observed, seeds 0..n-1) and fit options."""
    spec = pgpgm.load_model("fitzhugh-nagumo")
    case = "R-observed"
    opts = {"draws": draws, "tune": tune, "posterior": None if posterior == "none" else posterior}
    return [pgpgm.FitJob(f"fhn_R_seed{k}", spec, spec.simulate(case, seed=k), ["R"], case=case) for k in range(n)], opts


def _share(k: int, workers: int, n: int, draws: int, tune: int, posterior: str, out: str) -> None:
    """One of ``workers`` independent processes (no dask): jobs k, k + workers, ... fitted and
    saved one after the other as the serial side does; prints the fits' CPU seconds (JSON)."""
    import json

    from threadpoolctl import threadpool_limits

    fit_and_save = harness.private("pgpgm.batch", "fit_and_save")
    jobs, opts = _jobs(n, draws, tune, posterior)
    with threadpool_limits(limits=1):
        rows = [fit_and_save(job, out, opts) for job in jobs[k::workers]]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    print(json.dumps([r["cpu_seconds"] for r in rows]))


def independent_processes(a, out: Path) -> tuple[float, float, float]:
    """``a.workers`` fresh Python processes started at once, each fitting and saving its share
    of the jobs (no dask): the wall time (interpreter start, imports and compilation included),
    their whole CPU time and their fits' CPU time - what any scheduler of whole fits could at
    best reach on this machine."""
    import json
    import resource
    import subprocess

    code = ("import sys, batch; batch._share(int(sys.argv[1]), *map(int, sys.argv[2:6]), sys.argv[6], sys.argv[7])")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k), str(a.workers), str(a.n), str(a.draws), str(a.tune),
                               a.posterior, str(out)], stdout=subprocess.PIPE,
                              env={**os.environ, **_ONE_THREAD,
                                   "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.HERE),
                                                                               os.environ.get("PYTHONPATH")]))})
             for k in range(a.workers)]
    outputs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    fit_cpu = sum(sum(json.loads(o.decode().strip().splitlines()[-1])) for o in outputs)
    return wall, cpu, fit_cpu


# as a dask nanny sets them for its worker process (fit_many's own cluster)
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def main(argv=None) -> int:
    ap = harness.parser(__doc__, "batch")
    ap.add_argument("--n", type=int, default=32, help="fits (seeds 0..n-1)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scale", default=None,
                    help="comma-separated worker counts (e.g. 1,2 here; 1,2,4,8,16 on a 16-core machine): warm "
                         "clusters of each size on the same fits, speed-up and a fit's CPU on a worker vs in-process")
    ap.add_argument("--posterior", choices=("laplace", "nuts", "none"), default="laplace")
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--tune", type=int, default=1500)
    a = ap.parse_args(argv)

    import distributed
    from threadpoolctl import threadpool_limits

    FitJob = pgpgm.FitJob
    fit_and_save = harness.private("pgpgm.batch", "fit_and_save")
    _cluster_client = harness.private("pgpgm.batch", "_cluster_client")
    result_path = harness.private("pgpgm.batch", "result_path")

    env = harness.environment()
    jobs, opts = _jobs(a.n, a.draws, a.tune, a.posterior)
    spec, case = jobs[0].model, jobs[0].case

    out = Path(tempfile.mkdtemp(prefix="pgpgm_batch_bench_"))
    try:
        t = time.perf_counter()
        fit_and_save(FitJob("warmup", spec, spec.simulate(case, seed=10_000), ["R"], case=case),
                     out / "warmup_serial", {**opts, "draws": 50, "tune": 50})
        warmup = time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        with threadpool_limits(limits=1):  # as on the workers, whose nanny sets OMP/OPENBLAS/MKL_NUM_THREADS=1
            serial_rows = [fit_and_save(job, out / "serial", opts) for job in jobs]
        t_serial, cpu_serial = time.perf_counter() - t, time.process_time() - c
        assert all(r["status"] == "ok" for r in serial_rows), [r["error"] for r in serial_rows]
        serial_fit_cpu = sum(r["cpu_seconds"] for r in serial_rows)
        print(f"serial: {t_serial:.1f} s for {a.n} fits and saves ({t_serial / a.n:.2f} s per fit; "
              f"warm-up {warmup:.1f} s)")

        def thetas(folder: Path) -> list[np.ndarray]:
            return [pgpgm.load_result(result_path(folder, j.name)).estimates["theta"].values for j in jobs]

        serial = thetas(out / "serial")
        # 1. the default: fit_many starts its own LocalCluster (start-up and each worker's first
        #    imports and compiled-code loading included)
        t, c = time.perf_counter(), time.process_time()
        table = pgpgm.fit_many(jobs, out / "default", n_workers=a.workers, progressbar=False, **opts)
        t_cluster, cpu_parent = time.perf_counter() - t, time.process_time() - c
        same = all(np.array_equal(x, y) for x, y in zip(thetas(out / "default"), serial))
        # 2. the same on a cluster whose workers are warm (each did one warm-up fit, as the
        #    serial side did before its clock started): the steady-state throughput

        def warm_cluster(workers: int, folder: Path):
            """(start-up s, warm-up s, wall s, parent CPU s, workers' CPU s, table) of fit_many on a
            cluster as fit_many makes its own, whose ``workers`` did one short fit first."""
            t = time.perf_counter()
            with _cluster_client(distributed, None, None, workers) as client:
                t_up = time.perf_counter() - t
                t = time.perf_counter()
                warm_jobs = [FitJob(f"warmup{w}", spec, spec.simulate(case, seed=10_000 + w), ["R"], case=case)
                             for w in range(workers)]
                pgpgm.fit_many(warm_jobs, folder / "warmup", client=client, save_on_workers=True, progressbar=False,
                               **{**opts, "draws": 50, "tune": 50})
                t_warm = time.perf_counter() - t
                t, c, cpu_w = time.perf_counter(), time.process_time(), client.run(time.process_time)
                done = pgpgm.fit_many(jobs, folder / "fits", client=client, save_on_workers=True, progressbar=False,
                                      **opts)
                wall, cpu_parent = time.perf_counter() - t, time.process_time() - c
                cpu_workers = sum(client.run(time.process_time).values()) - sum(cpu_w.values())
            return t_up, t_warm, wall, cpu_parent, cpu_workers, done

        t_up_warm, t_warm_workers, t_steady, cpu_parent_steady, cpu_workers_steady, steady = warm_cluster(
            a.workers, out / "steady")
        same = same and all(np.array_equal(x, y) for x, y in zip(thetas(out / "steady" / "fits"), serial))
        # 4. scale: warm clusters of each size in --scale (steady state), the same fits
        scale_rows = []
        for k in [int(w) for w in a.scale.split(",")] if a.scale else []:
            _, _, wall, _, cpu_k, done = warm_cluster(k, out / f"scale{k}")
            assert (done["status"] == "ok").all(), done[["name", "status", "error"]]
            scale_rows.append({"workers": k, "wall_s": wall, "speed_up_vs_serial": t_serial / wall,
                               "efficiency": t_serial / wall / k,
                               "fit_cpu_per_fit_on_workers_s": float(done["cpu_seconds"].mean()),
                               "worker_fit_cpu_over_in_process": float(done["cpu_seconds"].mean())
                               / (serial_fit_cpu / a.n),
                               "workers_whole_cpu_per_fit_s": cpu_k / a.n,
                               "worker_whole_cpu_over_in_process_fit_and_save": cpu_k / cpu_serial})
            print(scale_rows[-1], flush=True)
        # 3. no dask: the same number of fresh processes, each fitting its share one after the other
        t_indep, cpu_indep, fit_cpu_indep = independent_processes(a, out / "independent")
        same = same and all(np.array_equal(x, y) for x, y in zip(thetas(out / "independent"), serial))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert (table["status"] == "ok").all() and (steady["status"] == "ok").all(), table[["name", "status", "error"]]
    print(f"cluster ({a.workers} workers): {t_cluster:.1f} s; speed-up {t_serial / t_cluster:.2f}x; "
          f"estimates equal to serial: {same}; warm workers: {t_steady:.1f} s, speed-up {t_serial / t_steady:.2f}x "
          f"(start-up {t_up_warm:.1f} s, workers' warm-up fits {t_warm_workers:.1f} s)")

    t = time.perf_counter()
    with distributed.LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        t_up = time.perf_counter() - t
        c.gather([c.submit(_noop, i, pure=False) for i in range(a.workers)])  # workers have imported the function
        t = time.perf_counter()
        c.gather([c.submit(_noop, i, pure=False) for i in range(a.n)])
        t_tasks = time.perf_counter() - t
        t = time.perf_counter()
    t_down = time.perf_counter() - t
    # a cold worker's fixed costs, measured apart: importing pgpgm (what a worker does when the
    # first job arrives; all workers at once) and the shutdown of workers that hold pgpgm (an
    # interpreter holding pymc, arviz and sympy takes ~0.8 s to tear down)
    t = time.perf_counter()
    with distributed.LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        t = time.perf_counter()
        c.run(_import_pgpgm)
        t_import = time.perf_counter() - t
        t = time.perf_counter()
    t_down_loaded = time.perf_counter() - t
    fit_seconds = table["seconds"].to_numpy()
    ideal = t_serial / a.workers
    rows = [
        ("fits", a.n), ("workers", a.workers), ("posterior", a.posterior), ("draws + tune per chain", a.draws + a.tune),
        ("serial wall, fits and saves (s)", t_serial), ("serial per fit (s)", t_serial / a.n),
        ("serial warm-up fit (s)", warmup),
        ("cluster wall incl. start-up and compilation (s)", t_cluster), ("speed-up", t_serial / t_cluster),
        ("serial CPU time, fits and saves (s)", cpu_serial),
        ("serial CPU time of the fits alone, per fit (s)", serial_fit_cpu / a.n),
        ("serial CPU time of a save, per fit (s)", (cpu_serial - serial_fit_cpu) / a.n),
        ("median fit time on a worker (s)", float(np.median(fit_seconds))),
        ("workers' CPU time in fits, total (s)", float(table["cpu_seconds"].sum())),
        ("workers' CPU time in fits, per fit (s)", float(table["cpu_seconds"].mean())),
        ("speed-up the CPU times allow (serial fit CPU / (worker fit CPU / workers))",
         serial_fit_cpu / (float(table["cpu_seconds"].sum()) / a.workers)),
        ("cluster wall minus serial/workers, per fit (s)", (t_cluster - ideal) / a.n),
        ("parent's CPU time during fit_many, per fit (s)", cpu_parent / a.n),
        ("warm workers: cluster start-up (s)", t_up_warm),
        ("warm workers: one warm-up fit per worker (s)", t_warm_workers),
        ("warm workers: wall for the fits (s)", t_steady),
        ("warm workers: median fit time on a worker (s)", float(steady["seconds"].median())),
        ("warm workers: CPU time in fits, per fit (s)", float(steady["cpu_seconds"].mean())),
        ("warm workers: wall minus serial/workers, per fit (s)", (t_steady - ideal) / a.n),
        ("warm workers: workers' whole CPU time (fits, saves, dask), per fit (s)", cpu_workers_steady / a.n),
        ("warm workers: parent's CPU time, per fit (s)", cpu_parent_steady / a.n),
        ("warm workers: speed-up the CPU times allow (serial CPU / (all CPU / workers))",
         cpu_serial / ((cpu_workers_steady + cpu_parent_steady) / a.workers)),
        ("steady-state speed-up (serial wall / warm workers' wall)", t_serial / t_steady),
        ("independent processes (no dask), wall incl. interpreter start, imports, compilation (s)", t_indep),
        ("independent processes: speed-up (the bound for any scheduler of whole fits)", t_serial / t_indep),
        ("independent processes: CPU time of the fits, per fit (s)", fit_cpu_indep / a.n),
        ("independent processes: whole CPU time (imports, fits, saves), per fit (s)", cpu_indep / a.n),
        ("fit_many's wall / independent processes' wall", t_cluster / t_indep),
        ("LocalCluster start-up (s)", t_up), ("LocalCluster shutdown (s)", t_down),
        ("workers importing pgpgm, all at once (s)", t_import),
        ("LocalCluster shutdown, workers holding pgpgm (s)", t_down_loaded),
        ("cold cluster's fixed costs: start-up + workers' import and first short fit (warm-up) + shutdown (s)",
         t_up_warm + t_warm_workers + t_down_loaded),
        ("cold cluster predicted from them: fixed costs + warm workers' wall (s)",
         t_up_warm + t_warm_workers + t_down_loaded + t_steady),
        ("speed-up at most, with these fixed costs (serial wall / predicted cold wall)",
         t_serial / (t_up_warm + t_warm_workers + t_down_loaded + t_steady)),
        (f"trivial task through the scheduler, per task ({a.n} tasks) (ms)", 1000 * t_tasks / a.n),
        ("estimates equal to serial (both clusters, independent processes)", same),
    ]
    harness.write(a.out, [{"quantity": k, "value": v} for k, v in rows],
                  f"Many fits: serial vs LocalCluster, FitzHugh-Nagumo R observed, seeds 0-{a.n - 1}", env=env,
                  sections={"Scale: warm clusters of each size, the same fits": scale_rows} if scale_rows else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GP fit at N = 1000 (issue 12, item 3): the current code against the code before, side by side.

"before" is pgpgm/gp (kernels.py, fit.py, linalg.py) as of commit BEFORE, read with ``git show``
into a private package in one process (imports of the rest of pgpgm point at the current tree);
"now" is the working tree. Same data as gp_fit.py (noisy sine, sd 0.1, on [0, 10], 2 starts, seed
0), BLAS on one thread, three alternating rounds. CPU seconds (process time) per fit, likelihood
evaluations per fit (counted in a separate untimed fit), the maximised log marginal likelihood of
both, and where one evaluation's time goes (kernel matrices, potrf, potri).

    ./run.sh bench gp_n1000            (or: cd benchmarks && python gp_n1000.py)
    cd benchmarks && python gp_n1000.py --n 5000 --rounds 1 --now-only    (time at N = 5000)
    cd benchmarks && python gp_n1000.py --cold      (one sigmoid fit in new processes, empty caches first)
    cd benchmarks && python gp_n1000.py --matrices  (K and dK/dh on uneven times: numpy vs compiled loop)

``--cold``: for "before" and "now", one sigmoid fit (2 starts) in a new process with empty caches
(PGPGM_CACHE_DIR, NUMBA_CACHE_DIR in a temporary folder), then in another new process with the caches
the first filled: the process's wall time (imports included), the CPU time of compiling (or loading)
the kernel's pair loop ("now" only), the fit's wall and CPU time including it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

from _common import write
from pgpgm.gp import KERNELS, fit_gp
from pgpgm.gp import fit as gpfit

BEFORE = "3078f7d"  # main before the warm start on thinned points (01c5e49 before branch gpsig: sigmoid 4.9-5.4 s)


def load_before(commit: str):
    """pgpgm.gp.fit of ``commit`` as a module of a private package (relative imports of pgpgm made absolute)."""
    root = Path(__file__).resolve().parents[1]
    pkg = Path(tempfile.mkdtemp()) / "gp_before"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("kernels", "fit", "linalg"):
        src = subprocess.run(["git", "-C", str(root), "show", f"{commit}:pgpgm/gp/{name}.py"], check=True,
                             capture_output=True, text=True).stdout
        (pkg / f"{name}.py").write_text(re.sub(r"from \.\.(\w)", r"from pgpgm.\1", src))
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("gp_before.fit")


def same_starts(label: str) -> dict:
    """The current fit makes extra starts while its best optimum is unconfirmed (``max_starts``);
    pinned to the 2 starts the code before makes, so both fit the same starts."""
    return {} if label == "before" else {"max_starts": 2}


def count_evaluations(module, *args, **kw) -> int:
    """Likelihood evaluations of one fit with ``module`` (its negative_log_marginal_likelihood wrapped)."""
    original, n = module.negative_log_marginal_likelihood, [0]

    def counted(*a):
        n[0] += 1
        return original(*a)

    module.negative_log_marginal_likelihood = counted
    try:
        module.fit_gp(*args, **kw)
    finally:
        module.negative_log_marginal_likelihood = original
    return n[0]


def cpu(fn, repeat=10):
    fn()
    c = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - c) / repeat


def series(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's data: a noisy sine (sd 0.1) at n even times on [0, 10], seed 0."""
    rng = np.random.default_rng(0)
    t = np.linspace(0, 10, n)
    return t, np.sin(t) + 0.1 * rng.standard_normal(n)


def cold_child(label: str, n: int) -> None:
    """One sigmoid fit with the code ``label`` in this (new) process; prints its wall and CPU seconds."""
    m = load_before(BEFORE) if label == "before" else gpfit
    t, y = series(n)
    kernel = m.get_kernel("sigmoid")
    w0, c0 = time.perf_counter(), time.process_time()
    # the compiled pair loop of the kernel's matrices, where the code has one: compiled or loaded here
    getattr(kernel, "_pairs_hyper_no_variance", None)
    c1 = time.process_time()
    m.fit_gp(t, y, kernel, n_starts=2, seed=0, **same_starts(label))
    print(f"{c1 - c0} {time.perf_counter() - w0} {time.process_time() - c0}")


def cold(n: int) -> None:
    """--cold: see the module docstring."""
    rows = []
    for label in ("before", "now"):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PGPGM_CACHE_DIR": f"{tmp}/pgpgm", "NUMBA_CACHE_DIR": f"{tmp}/numba"}
            for cache in ("empty", "filled by the first"):
                w0 = time.perf_counter()
                out = subprocess.run([sys.executable, __file__, "--cold-child", label, "--n", str(n)], env=env,
                                     check=True, capture_output=True, text=True).stdout.split()
                wall = time.perf_counter() - w0
                rows.append({"code": label, "caches": cache, "process wall s": wall,
                             "pair loop compile/load CPU s": float(out[-3]), "fit wall s": float(out[-2]),
                             "fit CPU s (incl. compile/load)": float(out[-1])})
                print(rows[-1], flush=True)
    write(f"gp_n{n}_cold", rows, f"## One sigmoid fit at N = {n} in a new process (1-min load average "
                                 f"{os.getloadavg()[0]:.1f} at the end)")


def matrices(n: int) -> None:
    """--matrices: K and every dK/dh (the fit's form: lower triangles, no dK/dv) at n uneven times, by the
    numpy expressions in row blocks (as before branch gpsig) and by the compiled pair loop; ms CPU."""
    from pgpgm.gp import Hyperparameter, Kernel

    rq = Kernel.from_expression("rq (user)", "variance*(1 + (a-b)**2/(2*al*l**2))**(-al)",
                                ["variance", Hyperparameter.lengthscale("l"),
                                 Hyperparameter("al", bounds=(0.1, 100.0))])
    kernels = {**KERNELS, "rq (user)": rq, "rbf+matern52": KERNELS["rbf"] + KERNELS["matern52"]}
    hyper = {"rbf": [1.3, 0.7], "matern52": [0.8, 1.1], "sigmoid": [1.5, 50.0, 0.2], "rq (user)": [1.1, 0.6, 2.0],
             "rbf+matern52": [1.3, 0.7, 0.8, 1.1]}
    t = np.sort(np.random.default_rng(0).uniform(0, 10, n))
    rows = []
    with threadpool_limits(1):
        for name, k in kernels.items():
            h = np.array(hyper[name], float)
            f = k._f_hyper if k.linear_variance is None else k._f_hyper_no_variance
            ws_numpy, ws_loop = [], []
            numpy_ms = 1e3 * cpu(lambda: k._run(f, t, t, h, lower=True, out=ws_numpy))
            loop_ms = 1e3 * cpu(lambda: k.cov_with_hyper_grads(t, h, checked=True, lower=True, workspace=ws_loop,
                                                               skip_variance=True))
            rows.append({"kernel": name, "numpy row blocks ms": numpy_ms, "compiled pair loop ms": loop_ms,
                         "ratio": loop_ms / numpy_ms})
    write(f"gp_n{n}_matrices", rows, f"## Kernel matrices at N = {n} uneven times (CPU ms; 1-min load average "
                                     f"{os.getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--now-only", action="store_true", help="time the current code only (no 'before')")
    ap.add_argument("--kernels", nargs="+", default=["sigmoid", "matern52", "rbf"])
    ap.add_argument("--cold", action="store_true", help="one sigmoid fit in new processes, empty caches first")
    ap.add_argument("--cold-child", choices=["before", "now"], help=argparse.SUPPRESS)
    ap.add_argument("--matrices", action="store_true", help="kernel matrices on uneven times: numpy vs compiled")
    args = ap.parse_args()
    N = args.n
    if args.cold_child:
        return cold_child(args.cold_child, N)
    if args.cold:
        return cold(N)
    if args.matrices:
        return matrices(N)
    t, y = series(N)
    modules = {"now": gpfit} if args.now_only else {"before": load_before(BEFORE), "now": gpfit}
    load0 = os.getloadavg()[0]
    rows = []
    for name in args.kernels:
        kernels = {label: m.get_kernel(name) for label, m in modules.items()}
        for label, m in modules.items():
            m.fit_gp(t[:30], y[:30], kernels[label], n_starts=1, **same_starts(label))  # compile/warm up
        times = {label: [] for label in modules}
        fits = {}
        for _ in range(args.rounds):
            for label, m in modules.items():
                c0 = time.process_time()
                fits[label] = m.fit_gp(t, y, kernels[label], n_starts=2, seed=0, **same_starts(label))
                times[label].append(time.process_time() - c0)
        evals = {label: count_evaluations(m, t, y, kernels[label], n_starts=2, seed=0, **same_starts(label))
                 if N <= 2000 else None
                 for label, m in modules.items()}
        now = fits["now"]
        row = {"kernel": name}
        for label in modules:
            row[f"{label} CPU s"] = " ".join(f"{v:.2f}" for v in times[label])
        if "before" in modules:
            old = fits["before"]
            row["ratio (median)"] = float(np.median(times["now"]) / np.median(times["before"]))
            row["evaluations before / now"] = f"{evals['before']} / {evals['now']}"
            row["lml now - before"] = f"{now.log_marginal_likelihood - old.log_marginal_likelihood:.2e}"
            row["max rel diff hyper, noise"] = f"{max(np.max(np.abs(now.hyper / old.hyper - 1)), abs(now.noise_sd / old.noise_sd - 1)):.1e}"
        else:
            row["evaluations"] = evals["now"] if evals["now"] is not None else "-"
            row["lml"] = f"{now.log_marginal_likelihood:.6f}"
        k = KERNELS[name]
        h = now.hyper / np.array([now.scale**2 if hp.kind == "variance" else 1.0 for hp in k.hyperparameters])
        reps = 10 if N <= 2000 else 1
        with threadpool_limits(1):
            ws: list = []
            row["kernel matrices ms"] = 1e3 * cpu(lambda: k.cov_with_hyper_grads(
                t, h, checked=True, lower=True, workspace=ws, skip_variance=True), reps)
            K = k.cov(t, t, h) + (now.noise_sd / now.scale) ** 2 * np.eye(N)
            row["potrf ms"] = 1e3 * cpu(lambda: lapack.dpotrf(K.T, lower=0, clean=1), reps)
            U, _ = lapack.dpotrf(K.T, lower=0, clean=1)
            row["potri ms"] = 1e3 * cpu(lambda: lapack.dpotri(U, lower=0), reps)
        rows.append(row)
        print(row, flush=True)
    load1 = os.getloadavg()[0]
    write(f"gp_n{N}", rows, f"## GP fit at N = {N} (CPU seconds; 1-min load average {load0:.1f} at the start, "
                            f"{load1:.1f} at the end)")


if __name__ == "__main__":
    main()

"""GP fit at N = 1000 (issue 12, item 3): the kernel matrices kept in a workspace across the
optimiser's evaluations against fresh matrices per evaluation (the code before), side by side in
one process, three alternating rounds; same data as gp_fit.py (noisy sine, sd 0.1, on [0, 10],
2 starts, seed 0), BLAS on one thread. CPU seconds (process time) per fit, and where one
evaluation's time goes.

    ./run.sh bench gp_n1000            (or: .venv/bin/python benchmarks/gp_n1000.py)
"""

from __future__ import annotations

import time

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

from _common import write
from pgpgm.gp import KERNELS, fit_gp
from pgpgm.gp import fit as gpfit

N = 1000
rng = np.random.default_rng(0)
t = np.linspace(0, 10, N)
y = np.sin(t) + 0.1 * rng.standard_normal(N)
original = gpfit.negative_log_marginal_likelihood


def fresh_matrices(logp, kernel, t, z, fixed, workspace=None):  # the code before: no workspace
    return original(logp, kernel, t, z, fixed)


def cpu(fn, repeat=20):
    fn()
    c = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - c) / repeat


rows = []
for name in ("sigmoid", "matern52", "rbf"):
    fit_gp(t[:30], y[:30], name, n_starts=1)  # compile/warm up outside the timings
    times = {"fresh": [], "workspace": []}
    fits = {}
    for _ in range(3):
        for label in ("fresh", "workspace"):
            gpfit.negative_log_marginal_likelihood = fresh_matrices if label == "fresh" else original
            c0 = time.process_time()
            fits[label] = fit_gp(t, y, name, n_starts=2, max_starts=2, seed=0)
            times[label].append(time.process_time() - c0)
    gpfit.negative_log_marginal_likelihood = original
    a, b = fits["fresh"], fits["workspace"]
    diff = max(np.max(np.abs(a.hyper / b.hyper - 1)), abs(a.noise_sd / b.noise_sd - 1))
    k = KERNELS[name]
    h = b.hyper / np.array([b.scale**2 if hp.kind == "variance" else 1.0 for hp in k.hyperparameters])
    with threadpool_limits(1):
        ws: list = []
        t_kernel_fresh = cpu(lambda: k.cov_with_hyper_grads(t, h, checked=True, lower=True))
        t_kernel_ws = cpu(lambda: k.cov_with_hyper_grads(t, h, checked=True, lower=True, workspace=ws))
        K = k.cov(t, t, h) + 0.01 * np.eye(N)
        t_potrf = cpu(lambda: lapack.dpotrf(K.T, lower=0, clean=1))
        U, _ = lapack.dpotrf(K.T, lower=0, clean=1)
        t_potri = cpu(lambda: lapack.dpotri(U, lower=0))
    rows.append({"kernel": name, "fresh_cpu_s (3 rounds)": " ".join(f"{v:.2f}" for v in times["fresh"]),
                 "workspace_cpu_s (3 rounds)": " ".join(f"{v:.2f}" for v in times["workspace"]),
                 "ratio_median": float(np.median(times["workspace"]) / np.median(times["fresh"])),
                 "max_rel_diff_hyper_noise": float(diff),
                 "kernel_eval_ms fresh/workspace": f"{1e3 * t_kernel_fresh:.1f} / {1e3 * t_kernel_ws:.1f}",
                 "potrf_ms": 1e3 * t_potrf, "potri_ms": 1e3 * t_potri})
    print(rows[-1], flush=True)
write("gp_n1000", rows, "## GP fit at N = 1000: kernel matrices reused across evaluations (CPU seconds)")

"""Time of the GP hyperparameter fit (5 starts) and of building D, A for N = 20, 100, 1000
points of a noisy sine, per kernel.

    ./run.sh bench gp_fit
"""

import time

import numpy as np

from _common import write
from pgpgm.gp import fit_gp, gradient_matching

rows = []
for n in (20, 100, 1000):
    t = np.linspace(0, 10, n)
    y = np.sin(t) + np.random.default_rng(0).normal(0, 0.1, n)
    for kernel in ("rbf", "matern52", "sigmoid"):
        starts = 5 if n < 1000 else 2
        t0 = time.perf_counter()
        fit = fit_gp(t, y, kernel, n_starts=starts)
        t1 = time.perf_counter()
        gradient_matching(fit, t).gradient_precision(0.3)
        t2 = time.perf_counter()
        rows.append({"N": n, "kernel": kernel, "starts": starts, "fit_s": t1 - t0, "D_A_precision_s": t2 - t1,
                     "noise_sd_fitted": fit.noise_sd})
write("gp_fit", rows, "## GP fit and gradient-matching matrices (noisy sine, true noise sd 0.1)")

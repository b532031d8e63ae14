"""Step 1, the GP hyperparameter fit: seconds per fit at N = 20, 100 and 1000 points for every
kernel, and on every observed state of every published case.

Table 1: a noisy sine (sd 0.1) on [0, 10]; 5 optimiser starts (2 at N >= 1000), seed 0; wall and
CPU seconds of ``pgpgm.gp.fit_gp`` (median of ``--rounds``, the kernels interleaved), and of the
gradient-matching matrices (D, A and (A + 0.3 I)^-1) from the fit; the fitted noise sd (truth 0.1)
and log marginal likelihood. Target (issue 12): the sigmoid kernel at N = 1000 in about a second.
Table 2: every observed state of the published cases (their data, seed 0; the pipeline's
settings: 5 starts, seed = state index). BLAS on one thread (``fit_gp``'s own default).
Compilation of the kernels is outside the timings (a first untimed fit of each).

    ./run.sh bench gp_fit [--sizes 20,100,1000] [--rounds 3]
"""

from __future__ import annotations

import numpy as np

import harness
import pgpgm
from pgpgm.gp import KERNELS, fit_gp, gradient_matching


def timing_rows(sizes: list[int], rounds: int) -> list[dict]:
    rows = []
    for n in sizes:
        t = np.linspace(0, 10, n)
        y = np.sin(t) + np.random.default_rng(0).normal(0, 0.1, n)
        starts = 5 if n < 1000 else 2
        fits = {k: (lambda k=k: fit_gp(t, y, k, n_starts=starts, max_starts=starts)) for k in KERNELS}
        times = harness.side_by_side(fits, rounds=rounds, warmup=1)
        for kernel in KERNELS:
            fit, _, cpu = harness.timed(fits[kernel])
            gm_wall = harness.median_time(lambda: gradient_matching(fit, t).gradient_precision(0.3), repeat=3, warmup=1)
            rows.append({"N": n, "kernel": kernel, "starts": starts, "fit_s": times.median(kernel), "fit_cpu_s": cpu,
                         "matching_matrices_s": gm_wall, "noise_sd": fit.noise_sd,
                         "log_marginal_likelihood": fit.log_marginal_likelihood,
                         "each_s": " ".join(f"{s:.3g}" for s in times.seconds[kernel])})
            print(rows[-1], flush=True)
    return rows


def published_rows() -> list[dict]:
    rows = []
    for key in harness.PUBLISHED:
        case = harness.published(key)
        t = np.asarray(case.data["time"].values, float)
        for m, s in enumerate(case.case.observed):
            y = np.asarray(case.data["y"].sel(observed=s).values, float)
            fit, wall, cpu = harness.timed(lambda: fit_gp(t, y, case.case.kernel, state=s, n_starts=5, seed=m))
            rows.append({"case": key, "state": s, "kernel": case.case.kernel, "N": t.size, "fit_s": wall, "cpu_s": cpu,
                         "hyper": " ".join(f"{v:.6g}" for v in fit.hyper), "noise_sd": fit.noise_sd})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = harness.parser(__doc__, "gp_fit")
    ap.add_argument("--sizes", default="20,100,1000", help="comma-separated numbers of points")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size (median)")
    ap.add_argument("--no-published", action="store_true", help="skip table 2")
    a = ap.parse_args()
    env = harness.environment()
    rows = timing_rows([int(n) for n in a.sizes.split(",")], a.rounds)
    sections = {} if a.no_published else {"Published cases (5 starts, seed = state index, data seed 0)":
                                          published_rows()}
    harness.write(a.out, rows, "GP fit (step 1): noisy sine on [0, 10], seconds per fit", env=env, sections=sections,
                  notes=f"pgpgm.gp.fit_gp; fit_s: median wall seconds of {a.rounds} interleaved "
                        "rounds; fit_cpu_s: one more fit's CPU seconds; matching_matrices_s: D, A and "
                        "(A + 0.3 I)^-1 from the fit.")


if __name__ == "__main__":
    main()

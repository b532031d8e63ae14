"""The main job end to end: the published experiment (FitzHugh-Nagumo, R observed, data seed 0,
the default fit with step 4), twice in one new process: the first fit pays numba/PyTensor
compilation (or loads it from the disk caches), the second is warm.

Reported per fit: wall seconds of the whole fit, of steps 1-3 and of step 4, step 4's convergence
(max R-hat, min bulk/tail ESS, divergences) and whether both fits refined to the same point.

    ./run.sh bench main_job [--seed 0]
"""

from __future__ import annotations

import warnings

import numpy as np

import harness


def main() -> None:
    ap = harness.parser(__doc__, "main_job")
    ap.add_argument("--seed", type=int, default=0, help="data and fit seed")
    a = ap.parse_args()
    env = harness.environment()
    case = harness.published(harness.MAIN_JOB, seed=a.seed)
    rows, refined = [], []
    for label in ("first fit in a new process", "second fit (warm)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r, wall, cpu = harness.timed(lambda: case.fit(seed=a.seed))
        d = r.diagnostics.sel(sampler="posterior")
        refined.append(r.estimates["theta"].sel(estimate="refined").values)
        rows.append({"run": label, "whole_fit_s": wall, "cpu_s": cpu,
                     "steps_1_3_s": r.timings["gp"] + r.timings["sampling"] + r.timings["refinement"],
                     "step_4_s": r.timings["posterior"], "max_rhat": float(d["rhat"].max()),
                     "min_ess_bulk": float(d["ess_bulk"].min()), "min_ess_tail": float(d["ess_tail"].min()),
                     "divergences": int(d["divergences"]),
                     "refined_theta": " ".join(f"{v:.6g}" for v in refined[-1])})
        print(rows[-1], flush=True)
    print(r.parameter_table().to_string())
    harness.write(a.out, rows, f"Main job: FitzHugh-Nagumo R observed, seed {a.seed}, default fit (steps 1-4)", env=env,
                  notes=f"Both fits refined to the same point: {bool(np.array_equal(*refined))}.")


if __name__ == "__main__":
    main()

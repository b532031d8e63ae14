"""Same numbers, no slower: steps 1-3 (``--posterior nuts``: 1-4) of the default fit on the published cases, this tree against
an older commit, fit by fit: the negative log likelihood at step 3's optimum, step 2's iterations
per chain and the CPU seconds, each tree in its own fresh process, the trees alternated case by
case (side by side). The tool of a refactoring (issue 32: "same seeds, same numbers, no benchmark
slower") and of a change that should find the same optima (or better ones) at no more cost.

``--before REF``: a git commit (its ``pgpgm/`` is unpacked into a temporary folder) or a folder
holding the other ``pgpgm`` package. Target (issue 29): steps 1-3 median CPU time <= 1.5x of the
baseline's on every published case, the same optimum.

    ./run.sh bench before_after --before 381d5bf [--cases lv-x2,fhn-V|all] [--seeds 5] [--repeats 3]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import harness

CASES = {**harness.PUBLISHED, "goodwin": ("goodwin", "X-Z-observed")}
DEFAULT_CASES = "lv-x1,lv-x2,fhn-V,fhn-R,pt-R,pt-SR"

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import pgpgm
name, case_name, seeds, step4 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "nuts"
spec = pgpgm.load_model(name)
case = spec.case(case_name)
opts = {"kernel": case.kernel, "gamma": case.gamma, "priors": spec.priors(case_name),
        "posterior": "nuts" if step4 else None, "progressbar": False}
warm = spec.simulate(case_name, seed=0)
pgpgm.fit(spec.system, warm, case.observed, draws=20, tune=20, stop="never", **opts)  # compile (not timed)
for seed in range(seeds):
    data = spec.simulate(case_name, seed=seed)
    c0 = time.process_time()
    r = pgpgm.fit(spec.system, data, case.observed, seed=seed, **opts)
    print(json.dumps({"seed": seed, "cpu": time.process_time() - c0,
                      "nll": float(r.estimates.attrs["refinement_nll"]),
                      "iterations": [int(i) for i in r.estimates.attrs["sampling_iterations"]],
                      "file": pgpgm.__file__}))
"""


def run(src: Path, name: str, case_name: str, seeds: int, posterior: str = "none") -> list[dict]:
    out = subprocess.run([sys.executable, "-c", CHILD, name, case_name, str(seeds), posterior], capture_output=True,
                         text=True,
                         env={**os.environ, "PYTHONPATH": str(src)}, cwd="/", check=True, timeout=3600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert all(Path(r["file"]).resolve().is_relative_to(src.resolve()) for r in rows), (rows[:1], src)
    return rows


def fastest(repeats: list[list[dict]]) -> list[dict]:
    """Seed by seed, the first repeat's record with the least CPU over all repeats (``cpu_all``: each one's).

    Raises if a repeat found another optimum: the fits are deterministic, so the repeats must agree."""
    rows = []
    for recs in zip(*repeats):
        assert len({(r["nll"], tuple(r["iterations"])) for r in recs}) == 1, recs
        rows.append({**recs[0], "cpu": min(r["cpu"] for r in recs), "cpu_all": [round(r["cpu"], 2) for r in recs]})
    return rows


def main() -> None:
    ap = harness.parser(__doc__, "before_after")
    ap.add_argument("--before", required=True, help="a git commit, or a folder holding the pgpgm package")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {sorted(CASES)}, or all")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each tree's fits this many times, alternating which tree goes first; a fit's CPU "
                         "is its least over the repeats (the same fit each time: the least is the one the "
                         "machine's other work disturbed least)")
    ap.add_argument("--posterior", choices=("none", "nuts"), default="none",
                    help="step 4 too (the default NUTS within its default budget): steps 1-4 side by side")
    a = ap.parse_args()
    env = harness.environment()
    before_src, here = harness.source_tree(a.before), harness.ROOT
    rows = []
    keys = list(CASES) if a.cases == "all" else a.cases.split(",")
    unknown = sorted(set(keys) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {sorted(CASES)} or all")
    for key in keys:
        name, case_name = CASES[key]
        runs = {"before": [], "after": []}
        for rep in range(a.repeats):  # the trees alternate first and second, so a load change hits both alike
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            for tree in order:
                runs[tree].append(run(before_src if tree == "before" else here, name, case_name, a.seeds,
                                      a.posterior))
        before, after = (fastest(runs["before"]), fastest(runs["after"]))
        for b, n in zip(before, after):
            rows.append({"case": key, "seed": b["seed"], "nll_before": round(b["nll"], 4),
                         "nll_after": round(n["nll"], 4), "after_minus_before": round(n["nll"] - b["nll"], 4),
                         "iterations_before": max(b["iterations"]), "iterations_after": max(n["iterations"]),
                         "cpu_before": round(b["cpu"], 2), "cpu_after": round(n["cpu"], 2),
                         "cpu_before_all": b["cpu_all"], "cpu_after_all": n["cpu_all"],
                         "bit_identical": b["nll"] == n["nll"] and b["iterations"] == n["iterations"]})
        print(key, "done", flush=True)
    summary = []
    for key in keys:
        rs = [r for r in rows if r["case"] == key]
        summary.append({"case": key, "cpu_after_over_before_median": statistics.median(r["cpu_after"] for r in rs)
                        / statistics.median(r["cpu_before"] for r in rs),
                        "same_optimum": f"{sum(abs(r['after_minus_before']) <= 1e-3 for r in rs)}/{len(rs)}",
                        "better_after": sum(r["after_minus_before"] < -1e-3 for r in rs),
                        "bit_identical": f"{sum(r['bit_identical'] for r in rs)}/{len(rs)}",
                        "iterations_changed": sum(r["iterations_before"] != r["iterations_after"] for r in rs)})
    harness.write(a.out, summary, f"Steps 1-{4 if a.posterior == 'nuts' else 3}, this tree against {a.before}", env=env, sections={"Fit by fit": rows},
                  notes="nll: the negative log likelihood at step 3's optimum (lower is better; same optimum: within "
                        "1e-3; bit_identical: the same NLL to the last bit and the same iterations, what a "
                        "refactoring must keep); iterations: step 2's, the longer chain; CPU seconds of the fit, "
                        "each tree in a fresh process after one compiling warm-up fit; with --repeats, the least over the "
                        "repeats (cpu_*_all: each repeat's).")


if __name__ == "__main__":
    main()

"""Steps 1-3 of the default fit on the published cases, this tree against another pgpgm tree,
fit by fit: the negative log likelihood at step 3's optimum, step 2's iterations per chain and the CPU
seconds, each tree in its own fresh process, the trees alternated case by case (side by side).

For a change that should find the same optima (or better ones) at no more cost: ``--before SRC``
is a folder holding the other ``pgpgm`` package (e.g. ``git worktree add /tmp/before HEAD``).

    python benchmarks/before_after.py --before /tmp/before [--cases lv-x2,fhn-V] [--seeds 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import write  # noqa: E402
from stop_rule import CASES as STOP_RULE_CASES  # noqa: E402
from stop_rule import DEFAULT_CASES  # noqa: E402

CASES = {**STOP_RULE_CASES, "goodwin": ("goodwin", "X-Z-observed")}

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import pgpgm
name, case_name, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = pgpgm.load_model(name)
case = spec.case(case_name)
opts = {"kernel": case.kernel, "gamma": case.gamma, "priors": spec.priors(case_name), "posterior": None,
        "progressbar": False}
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


def run(src: Path, name: str, case_name: str, seeds: int) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", CHILD, name, case_name, str(seeds)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(src)}, cwd="/", check=True, timeout=3600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert all(Path(r["file"]).resolve().is_relative_to(src.resolve()) for r in rows), (rows[:1], src)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a folder holding the pgpgm package to compare with")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {sorted(CASES)}")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="before_after")
    a = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    load0 = os.getloadavg()[0]
    rows = []
    for key in a.cases.split(","):
        name, case_name = CASES[key]
        before, after = run(a.before, name, case_name, a.seeds), run(here, name, case_name, a.seeds)
        for b, n in zip(before, after):
            rows.append({"case": key, "seed": b["seed"], "nll_before": round(b["nll"], 4),
                         "nll_after": round(n["nll"], 4), "after_minus_before": round(n["nll"] - b["nll"], 4),
                         "iterations_before": max(b["iterations"]), "iterations_after": max(n["iterations"]),
                         "cpu_before": round(b["cpu"], 2), "cpu_after": round(n["cpu"], 2)})
        print(key, "done", flush=True)
    write(a.out, rows, f"## Steps 1-3, this tree against {a.before}\n\n`python benchmarks/before_after.py --before "
          f"{a.before} --cases {a.cases} --seeds {a.seeds}`, {datetime.date.today().isoformat()}, load average "
          f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after; nll: the negative log likelihood at step 3's "
          "optimum (lower is better); iterations: step 2's, the longer chain; CPU seconds of the fit")


if __name__ == "__main__":
    main()

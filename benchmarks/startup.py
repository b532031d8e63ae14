"""Start-up costs: what ``import pgpgm`` costs a fresh process, and the main job in new processes
with empty and with filled compile caches (compilation paid once per model).

1. ``import``: CPU and wall seconds of ``--statement`` (default ``import pgpgm``: what a notebook or
   ``pgpgm --help`` pays, and ``"import pgpgm; pgpgm.fit_many"``: a fit_many worker's cost) in new
   Python processes, and whether matplotlib / arviz-plots were imported; with ``--before REF`` (a
   commit or a folder holding another ``pgpgm``) alternated with that tree, one process each per
   round. Target: ``import pgpgm`` loads no heavy library (tests/test_layout.py) and takes well
   under a second.
2. ``cold``: the main job (FitzHugh-Nagumo R observed, data seed 0, fit seed 0), steps 1-3
   (``posterior=None``; ``--step4`` adds the default fit with NUTS), in a new process with empty
   caches (cold), in a new process with the caches the first filled, and in one more on other data
   (seed 1); each process fits twice (the second fit: warm in-process). Caches isolated in a
   temporary folder: PGPGM_CACHE_DIR, NUMBA_CACHE_DIR and PyTensor's base_compiledir. CPU seconds
   count the fitting process only (step 4's chains run in worker processes).

    ./run.sh bench startup [--parts import,cold] [--rounds 6] [--statement "import pgpgm"]
                           [--before REF] [--step4] [--budget TUNE,DRAWS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import harness

IMPORT_CHILD = ("import sys, time, json; t, c = time.perf_counter(), time.process_time(); {statement}; "
                "import pgpgm; print(json.dumps({'cpu': time.process_time() - c, 'wall': time.perf_counter() - t, "
                "'file': pgpgm.__file__, 'plotting': [m for m in ('matplotlib', 'arviz_plots') if m in sys.modules]}))")

COLD_CHILD = textwrap.dedent('''
    import json, sys, time, warnings
    t0 = time.perf_counter()
    import pgpgm
    t_import = time.perf_counter() - t0
    from numba.core import event
    spec = pgpgm.load_model("fitzhugh-nagumo")
    case = spec.case("R-observed")
    data = spec.simulate("R-observed", seed=int(sys.argv[2]))
    out = {"import_s": t_import}
    budget = {} if sys.argv[3] == "-" else dict(zip(("tune", "draws"), map(int, sys.argv[3].split(","))))
    for label in ("first", "second"):
        t1, c1 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings(), event.install_recorder("numba:compile") as rec:
            warnings.simplefilter("ignore")
            r = pgpgm.fit(spec.system, data, case.observed, kernel=case.kernel, gamma=case.gamma,
                          priors=spec.priors("R-observed"), seed=0, progressbar=False,
                          posterior=None if sys.argv[1] == "none" else "nuts", **budget)
        out[label] = {"fit_s": time.perf_counter() - t1, "cpu_s": time.process_time() - c1,
                      "steps_1_3_s": r.timings["gp"] + r.timings["sampling"] + r.timings["refinement"],
                      "step_4_s": r.timings["posterior"], "numba_compiles": sum(1 for _, e in rec.buffer if e.is_start),
                      "refined": r.estimates["theta"].sel(estimate="refined").values.tolist()}
    print(json.dumps(out))
''')


def import_once(src: Path, statement: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", IMPORT_CHILD.replace("{statement}", statement)], capture_output=True,
                         text=True, env=env, cwd="/", check=True, timeout=300)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(row["file"]).resolve().is_relative_to(src.resolve()), (row["file"], src)
    return row


def import_rows(rounds: int, statement: str, before: str | None) -> list[dict]:
    trees = {"this tree": harness.ROOT}
    if before:
        trees = {f"before ({before})": harness.source_tree(before), **trees}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(rounds):
        for label, src in trees.items():
            runs[label].append(import_once(src, statement))
    return [{"statement": statement, "tree": label, "median_cpu_s": statistics.median(r["cpu"] for r in rs),
             "median_wall_s": statistics.median(r["wall"] for r in rs),
             "each_cpu_s": " ".join(f"{r['cpu']:.2f}" for r in rs),
             "imports_plotting": sorted({m for r in rs for m in r["plotting"]})} for label, rs in runs.items()]


def cold_rows(step4: bool, budget: str) -> list[dict]:
    rows = []
    for kind in ["none", "nuts"] if step4 else ["none"]:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PGPGM_CACHE_DIR": f"{tmp}/pgpgm", "NUMBA_CACHE_DIR": f"{tmp}/numba",
                   "PYTENSOR_FLAGS": f"base_compiledir={tmp}/pytensor"}
            for process, seed in (("new process, empty caches (cold)", 0), ("new process, warm caches", 0),
                                  ("new process, warm caches, other data (seed 1)", 1)):
                res = subprocess.run([sys.executable, "-c", COLD_CHILD, kind, str(seed), budget], env=env,
                                     capture_output=True, text=True, timeout=3000)
                if res.returncode != 0:
                    raise RuntimeError(res.stderr[-3000:])
                out = json.loads(res.stdout.strip().splitlines()[-1])
                for label, fit_label in (("first", "first fit"), ("second", "second fit (warm in-process)")):
                    f = out[label]
                    rows.append({"steps": "1-3" if kind == "none" else "1-4", "process": process, "fit": fit_label,
                                 "import_s": out["import_s"], "fit_s": f["fit_s"], "cpu_s": f["cpu_s"],
                                 "steps_1_3_s": f["steps_1_3_s"], "step_4_s": f["step_4_s"],
                                 "numba_compiles": f["numba_compiles"],
                                 "refined_theta": " ".join(f"{v:.12g}" for v in f["refined"])})
                    print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = harness.parser(__doc__, "startup")
    ap.add_argument("--parts", default="import,cold", help="comma-separated: import, cold")
    ap.add_argument("--rounds", type=int, default=6, help="import: fresh processes per tree")
    ap.add_argument("--statement", action="append", help="import: a Python statement to time (repeatable; default "
                    "'import pgpgm' and 'import pgpgm; pgpgm.fit_many', a worker's cost before its first job)")
    ap.add_argument("--before", help="import: a commit or a folder holding the pgpgm package to compare with")
    ap.add_argument("--step4", action="store_true", help="cold: also the default fit with step 4")
    ap.add_argument("--budget", default="-", help="cold: TUNE,DRAWS of the gradient-matching chains (shorter)")
    a = ap.parse_args()
    env = harness.environment()
    parts = a.parts.split(",")
    statements = a.statement or ["import pgpgm", "import pgpgm; pgpgm.fit_many"]
    rows = [r for s in statements for r in import_rows(a.rounds, s, a.before)] if "import" in parts else []
    sections = {"The main job in new processes, empty vs filled caches": cold_rows(a.step4, a.budget)} \
        if "cold" in parts else {}
    harness.write(a.out, rows, "Start-up: import time in fresh processes", env=env, sections=sections)


if __name__ == "__main__":
    main()

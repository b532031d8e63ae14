"""Compilation paid once (issue 12): the main job (FitzHugh-Nagumo R observed, data seed 0, fit seed 0)
in new processes with empty caches (cold), then in new processes with the caches an earlier process
filled (warm cache), each fitting twice (the second fit: warm in-process); steps 1-3 only
(``posterior=None``) and with step 4 (NUTS). A third data set (seed 1) in a warm-cache process shows
that compiled graphs serve other data of the same model.

Caches are isolated in a temporary folder: PGPGM_CACHE_DIR (model kernels), NUMBA_CACHE_DIR (numba's
cache of pgpgm's generic kernels) and PyTensor's base_compiledir.

    ./run.sh bench cold_start            (or: .venv/bin/python benchmarks/cold_start.py [--no-step4]
                                          [--budget TUNE DRAWS])

``--budget`` shortens the gradient-matching chains (the compile overhead is the same; on a loaded
machine it then stands out of the sampling time). CPU seconds (``cpu_s``) count this process only
(steps 1-3 run in it; step 4's chains run in worker processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import write

CHILD = textwrap.dedent('''
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
        out[label] = {"fit_s": time.perf_counter() - t1, "cpu_s": time.process_time() - c1, "steps_1_3_s": r.timings["gp"] + r.timings["sampling"]
                      + r.timings["refinement"], "step_4_s": r.timings["posterior"],
                      "numba_compiles": sum(1 for _, e in rec.buffer if e.is_start),
                      "refined": r.estimates["theta"].sel(estimate="refined").values.tolist()}
    print(json.dumps(out))
''')


def run(kind: str, data_seed: int, env: dict, budget: str) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, kind, str(data_seed), budget], env=env, capture_output=True,
                         text=True, timeout=3000)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    kinds = ["none"] if "--no-step4" in sys.argv else ["none", "nuts"]
    budget = ",".join(sys.argv[sys.argv.index("--budget") + 1:][:2]) if "--budget" in sys.argv else "-"
    rows = []
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PGPGM_CACHE_DIR": f"{tmp}/pgpgm", "NUMBA_CACHE_DIR": f"{tmp}/numba",
                   "PYTENSOR_FLAGS": f"base_compiledir={tmp}/pytensor"}
            for process, seed in (("new process, empty caches (cold)", 0), ("new process, warm caches", 0),
                                  ("new process, warm caches, other data (seed 1)", 1)):
                out = run(kind, seed, env, budget)
                for label, fit_label in (("first", "first fit"), ("second", "second fit (warm in-process)")):
                    f = out[label]
                    rows.append({"steps": "1-3" if kind == "none" else "1-4", "process": process, "fit": fit_label,
                                 "import_s": round(out["import_s"], 2), "fit_s": round(f["fit_s"], 2), "cpu_s": round(f["cpu_s"], 2),
                                 "steps_1_3_s": round(f["steps_1_3_s"], 2), "step_4_s": round(f["step_4_s"], 2),
                                 "numba_compiles": f["numba_compiles"],
                                 "refined_theta": " ".join(f"{v:.12g}" for v in f["refined"])})
                    print(rows[-1], flush=True)
    name = "cold_start" if budget == "-" else "cold_start_short"
    write(name, rows, "## Cold start: the main job in new processes, empty vs warm caches"
          + ("" if budget == "-" else f" (tune, draws = {budget})"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()

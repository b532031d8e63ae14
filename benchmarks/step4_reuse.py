"""Step 4 for a second data set of the same model (issue 12 item 2, applied to step 4): one process
fits FitzHugh-Nagumo R observed on data seed 0, then on data seed 1, with step 4 (NUTS, a small
budget), and reports for each fit the seconds and numba compilations of building the step-4 model
and of sampling it. Two variants side by side, each in its own new process, both with private empty
caches made for this run (so that nothing an earlier run compiled is reused):

- ``main``: step 4 as on ``main`` (``git show main:pgpgm/posterior.py``, loaded as a module next to
  pgpgm and put in place of the pipeline's ``build_ode_model`` / ``sample_posterior``);
- ``this``: step 4 of this worktree; and once more fitting only data seed 1 (compiled afresh), whose
  draws the second fit of the ``this`` process must reproduce bit for bit.

The draws of every posterior variable are compared with the reference's for the same data.

    .venv/bin/python benchmarks/step4_reuse.py [--cores N] [--budget TUNE DRAWS] [--ref REV]

Compilations are counted in the fitting process (``--cores 1`` runs the NUTS chains in it too;
with more cores the chains run in worker processes, whose compilations are in the seconds only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from _common import write

CHILD = textwrap.dedent('''
    import importlib.util, json, sys, time, warnings
    import numpy as np
    import pgpgm
    import pgpgm.pipeline as pipeline
    from numba.core import event
    variant, cores, tune, draws, source, save = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                                 sys.argv[5], sys.argv[6])
    seeds = [int(v) for v in sys.argv[7].split(",")]
    if variant == "main":  # the reference's posterior.py as pgpgm._posterior_ref (its relative imports resolve)
        spec_ = importlib.util.spec_from_file_location("pgpgm._posterior_ref", source)
        ref = importlib.util.module_from_spec(spec_)
        sys.modules["pgpgm._posterior_ref"] = ref
        spec_.loader.exec_module(ref)
        pipeline.build_ode_model, pipeline.sample_posterior = ref.build_ode_model, ref.sample_posterior
    timed = {}
    def wrap(name, fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            with event.install_recorder("numba:compile") as rec:
                out = fn(*a, **k)
            timed[name] = (time.perf_counter() - t0, sum(1 for _, e in rec.buffer if e.is_start))
            return out
        return inner
    pipeline.build_ode_model = wrap("build", pipeline.build_ode_model)
    pipeline.sample_posterior = wrap("sample", pipeline.sample_posterior)
    spec = pgpgm.load_model("fitzhugh-nagumo")
    case = spec.case("R-observed")
    out, draws_of = [], {}
    for seed in seeds:
        data = spec.simulate("R-observed", seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pgpgm.fit(spec.system, data, case.observed, kernel=case.kernel, gamma=case.gamma,
                          priors=spec.priors("R-observed"), seed=0, progressbar=False, posterior_tune=tune,
                          posterior_draws=draws, cores=cores)
        post = r.posterior.posterior
        draws_of.update({f"{seed}/{v}": post[v].values for v in post.data_vars})
        out.append({"data_seed": seed, "step_4_s": r.timings["posterior"], "build_s": timed["build"][0],
                    "build_compiles": timed["build"][1], "sample_s": timed["sample"][0],
                    "sample_compiles": timed["sample"][1]})
    np.savez(save, **draws_of)
    print(json.dumps(out))
''')


def main() -> None:
    args = sys.argv[1:]
    cores = args[args.index("--cores") + 1] if "--cores" in args else "2"
    tune, draws = args[args.index("--budget") + 1:][:2] if "--budget" in args else ("100", "100")
    rev = args[args.index("--ref") + 1] if "--ref" in args else "main"
    root = Path(__file__).resolve().parent.parent
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "posterior_ref.py"
        source.write_text(subprocess.run(["git", "show", f"{rev}:pgpgm/posterior.py"], cwd=root, check=True,
                                         capture_output=True, text=True).stdout)
        # each run: a new process with its own empty caches; "this" fits data seed 1 alone too, compiling it afresh
        for variant, seeds in (("main", "0,1"), ("this", "0,1"), ("this", "1")):
            cache = Path(tmp) / f"{variant}{seeds}"
            env = {**os.environ, "PGPGM_CACHE_DIR": f"{cache}/pgpgm", "NUMBA_CACHE_DIR": f"{cache}/numba",
                   "PYTENSOR_FLAGS": f"base_compiledir={cache}/pytensor"}
            res = subprocess.run([sys.executable, "-c", CHILD, variant, cores, tune, draws, str(source),
                                  f"{cache}.npz", seeds], env=env, capture_output=True, text=True, timeout=3000)
            if res.returncode != 0:
                raise RuntimeError(res.stderr[-3000:])
            for r in json.loads(res.stdout.strip().splitlines()[-1]):
                rows.append({"step 4": "this" if variant == "this" else f"{rev} (git show)", "fits in process": seeds,
                             "cores": int(cores),
                             **{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()},
                             "_draws": f"{cache}.npz"})
                print(rows[-1], flush=True)
        # the draws of every posterior variable (parameters, initial values, noise sd, states on the dense grid)
        # against the reference's for the same data, and (this) the second fit's against a fresh process's
        ref, fresh = np.load(rows[0]["_draws"]), np.load(rows[-1]["_draws"])

        def compare(a, b, seed):
            keys = sorted(k for k in a.files if k.startswith(f"{seed}/"))
            if keys != sorted(k for k in b.files if k.startswith(f"{seed}/")):
                return "other variables"
            if all(np.array_equal(a[k], b[k], equal_nan=True) for k in keys):
                return "bit-identical"
            return f"max abs diff {max(float(np.nanmax(np.abs(a[k] - b[k]))) for k in keys):.2g}"

        for r in rows:
            mine = np.load(r.pop("_draws"))
            r["draws vs reference"] = compare(mine, ref, r["data_seed"])
            r["draws vs fresh process (this)"] = compare(mine, fresh, 1) if r["data_seed"] == 1 else ""
    write(f"step4_reuse_cores{cores}", rows, f"## Step 4 on a second data set (tune, draws = {tune}, {draws}; "
          f"cores = {cores})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()

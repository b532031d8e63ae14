"""The main job (FitzHugh-Nagumo R observed, seed 0, the default fit with step 4), twice in one new
process: the first fit pays numba/PyTensor compilation, the second is warm.

    ./run.sh bench main_job
"""

import time
import warnings

import pgpgm
from _common import write

spec = pgpgm.load_model("fitzhugh-nagumo")
case = spec.case("R-observed")
data = spec.simulate("R-observed", seed=0)
rows = []
for label in ("first fit in a new process", "warm"):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(spec.system, data, case.observed, kernel=case.kernel, gamma=case.gamma,
                      priors=spec.priors("R-observed"), draws=2000, tune=1500, seed=0, progressbar=False)
    d = r.diagnostics.sel(sampler="posterior")
    rows.append({"run": label, "whole_fit_s": time.perf_counter() - t0,
                 "steps_1_3_s": r.timings["gp"] + r.timings["sampling"] + r.timings["refinement"],
                 "step_4_s": r.timings["posterior"], "max_rhat": float(d["rhat"].max()),
                 "min_ess_bulk": float(d["ess_bulk"].min()), "min_ess_tail": float(d["ess_tail"].min()),
                 "divergences": int(d["divergences"])})
    print(rows[-1], flush=True)
print(r.parameter_table().to_string())
write("main_job", rows, "## Main job: FitzHugh-Nagumo R observed, seed 0, default fit")

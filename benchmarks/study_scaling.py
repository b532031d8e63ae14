"""Issue 31 target: a joint fit of K experiments costs at most ~K times one fit in steps 1-3.

pgpgm.fit_study(posterior=None) on the first K theophylline subjects (pk-oral, ka, ke, CL shared), K = 1, 3,
12, in one process after a warm-up fit (the compiled kernels cached), side by side with each of those K
subjects fitted alone (one fit each; subjects differ: subject 1 alone takes half the mean); the ratio
seconds(joint of K) / sum of seconds(each alone), and seconds(joint of K) / (K x seconds(subject 1 alone)).

``python benchmarks/study_scaling.py [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import pgpgm
from pgpgm import datasets


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--ks", default="1,3,12")
    args = ap.parse_args(argv)
    spec = pgpgm.load_model("pk-oral")
    study = pgpgm.Study.from_tidy(datasets.theophylline(), datasets.theophylline_inputs(),
                                  x0={"A": "dose_mg_per_kg", "C": 0.0})
    warnings.simplefilter("ignore")
    pgpgm.fit_study(spec.system, study.subset(study.names[:1]), priors=spec.priors(), posterior=None)  # warm-up
    alone = {}
    for name in study.names:
        t0 = time.perf_counter()
        pgpgm.fit_study(spec.system, study.subset([name]), priors=spec.priors(), posterior=None)
        alone[name] = time.perf_counter() - t0
    rows = {}
    for k in map(int, args.ks.split(",")):
        t0 = time.perf_counter()
        res = pgpgm.fit_study(spec.system, study.subset(study.names[:k]), priors=spec.priors(), posterior=None)
        rows[k] = {"seconds": time.perf_counter() - t0, **{f"{n} s": v for n, v in res.timings.items()}}
        rows[k]["sum_alone_s"] = sum(alone[n] for n in study.names[:k])
        rows[k]["ratio_to_sum_alone"] = rows[k]["seconds"] / rows[k]["sum_alone_s"]
        rows[k]["ratio_to_K_x_first"] = rows[k]["seconds"] / (k * alone[study.names[0]])
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "alone_s": alone, "rows": rows}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

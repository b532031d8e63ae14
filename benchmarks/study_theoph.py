"""Issue 31 targets on the theophylline study (R's Theoph, 12 subjects), pgpgm.fit_study:

- per-subject refined points (each subject alone, C(0) = 0 and A(0) = dose held) against the independent
  200-start optimum of benchmarks/studies_reference.py (results/studies_reference_theoph.json);
- the hierarchical fit (ka and CL log-normal across subjects, ke shared: the structure of nlme's
  fm3Theo / agq_diag2) with step 4's R-hat, ESS, time, and the population estimates beside the published
  and the independent AGQ maximum-likelihood ones.

``python benchmarks/study_theoph.py [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

import pgpgm
from pgpgm import datasets

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--centred", action="store_true")
    args = ap.parse_args(argv)
    ref_path = ROOT / "benchmarks" / "results" / "studies_reference_theoph.json"
    ref = json.loads(ref_path.read_text()) if ref_path.exists() else None
    spec = pgpgm.load_model("pk-oral")
    study = pgpgm.Study.from_tidy(datasets.theophylline(), datasets.theophylline_inputs(),
                                  x0={"A": "dose_mg_per_kg", "C": 0.0})
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pgpgm.fit_study(spec.system, study, hierarchical={"ka": "lognormal", "CL": "lognormal"},
                              priors=spec.priors(), posterior_draws=args.draws, posterior_tune=args.draws,
                              centred=args.centred)
    seconds = time.perf_counter() - t0
    out = {"centred": args.centred, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": seconds,
           "timings": res.timings, "warnings": [str(w.message)[:300] for w in caught]}
    sep = res.theta("separate")
    if ref is not None:
        rel = {s: {p: float(sep.loc[s, p] / ref["per_subject"]["normal"][s][p] - 1) for p in ("ka", "ke", "CL")}
               for s in study.names}
        out["separate_max_rel_diff"] = max(abs(v) for d in rel.values() for v in d.values())
        out["separate_nll_max_diff"] = float(max(abs(res.estimates["nll"].sel(estimate="separate", experiment=s).item()
                                                     - ref["per_subject"]["normal"][s]["nll"]) for s in study.names))
    d = res.diagnostics
    out["rhat_max"] = float(d["rhat"].max())
    out["ess_bulk_min"] = float(d["ess_bulk"].min())
    out["ess_tail_min"] = float(d["ess_tail"].min())
    out["divergences"] = int(d.attrs.get("divergences", 0))
    out["rounds"] = res.posterior.attrs.get("pgpgm_rounds")
    post = res.posterior.posterior
    out["population_posterior"] = {
        "lKa": float(post["mu_ka"].mean()), "lCl": float(post["mu_CL"].mean()), "lKe": float(np.log(post["ke"]).mean()),
        "sd_lKa": float(post["sigma_ka"].mean()), "sd_lCl": float(post["sigma_CL"].mean()),
        "sd_residual": float(post["sigma_C"].mean())}
    if ref is not None:
        out["agq_diag2"] = {k: ref["population"]["agq_diag2"][k] for k in ("lKa", "lCl", "lKe", "sd_lKa", "sd_lCl",
                                                                           "sd_residual")}
        out["published"] = {k: v for k, v in ref["published"].items()}
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()

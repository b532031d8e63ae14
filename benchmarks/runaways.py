"""The runaway cases of step 4 (issue 30) against the main job, side by side in one run: each fit
in a fresh process, the main job between every two cases, so that a shared machine's load hits
both sides alike.

Target (issue 30): each runaway case's fit finishes within 4x the main job's wall time, converged
(max R-hat <= 1.01, min bulk/tail ESS >= 400) or with the ConvergenceWarning.

Cases (each a plain default ``pgpgm.fit`` with step 4, seed 0 unless said):

- ``main``: the main job, FitzHugh-Nagumo R observed, data seed 0 (as ``main_job.py``);
- ``repr``: the issue's 6-state model with 3 states observed on 40 points: the shipped
  repressilator, proteins observed, 40 times over [0, 15] (``robustness.py``'s span), snr 100,
  the model's prior box, kernel and gamma;
- ``chain10``: a linear chain of 10 states, x1' = -k1 x1, x_i' = k_{i-1} x_{i-1} - k_i x_i,
  x(0) = (10, 0, ..., 0), x2, x4, x6, x8, x10 observed on 50 times over [0, 20], snr 100,
  pgpgm's default prior box (0, 10);
- ``lv-x2-ln``: the published Lotka-Volterra x2 observed with large noise, data and fit seed 3
  (``paper.py``'s case);
- ``fhn-wrong``: the main job's fit with step 3's optimum replaced by the refinement from issue
  29's wrong optimum theta = (1.518, 2.421, 1.643) (``pgpgm.refine`` on the fit's own
  least-squares problem, noise estimated, as step 3 does): step 4 starts there (its centre,
  spreads and mass matrix are that optimum's), as the issue's runaway did.

Reported per fit: the fit's wall seconds (``pgpgm.fit`` alone) and the process's (start-up and
imports included), steps 1-3 and step 4 seconds, rounds, gradient evaluations, what ran out of
the budget, convergence, the warning's text, and the fit's wall over the median main job's (and
over the mean of the main jobs just before and after it).

    ./run.sh bench runaways [--rounds 2] [--cases repr,chain10,lv-x2-ln,fhn-wrong] [--timeout 900] [--no-warmup]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import harness
import pgpgm

CASES = ("repr", "chain10", "lv-x2-ln", "fhn-wrong")
#: issue 29's wrong optimum of FitzHugh-Nagumo R observed (data seed 0)
WRONG_THETA = (1.518, 2.421, 1.643)


def fit_case(name: str, **kw):
    """The fit of case ``name`` (warnings left to the caller); ``kw``: further ``pgpgm.fit`` options."""
    if name == "main":
        return harness.published(harness.MAIN_JOB, seed=0).fit(seed=0, **kw)
    if name == "lv-x2-ln":
        return harness.published("lv-x2-ln", seed=3).fit(seed=3, **kw)
    if name == "repr":
        spec = pgpgm.load_model("repressilator")
        c = spec.case("proteins-observed")
        data = pgpgm.simulate(spec.system, c.theta, c.x0, np.linspace(0.0, 15.0, 40), observed=c.observed,
                              snr=c.snr, seed=0)
        return pgpgm.fit(spec.system, data, c.observed, kernel=c.kernel, gamma=c.gamma,
                         priors=spec.priors("proteins-observed"), seed=0, progressbar=False, **kw)
    if name == "chain10":
        system = harness.chain_system()
        x0 = np.zeros(10)
        x0[0] = 10.0
        data = pgpgm.simulate(system, np.array(harness.CHAIN_RATES), x0, np.linspace(0.0, 20.0, 50),
                              observed=list(harness.CHAIN_OBSERVED), snr=100.0, seed=0)
        return pgpgm.fit(system, data, list(harness.CHAIN_OBSERVED), seed=0, progressbar=False, **kw)
    if name == "fhn-wrong":
        case = harness.published(harness.MAIN_JOB, seed=0)
        module = harness.private("pgpgm.fitting")
        real = module.refine_step
        bounds = np.array([case.options["priors"][p] for p in case.spec.system.parameters], float)

        def from_wrong_optimum(prepared, matched, options, timings):
            refined = real(prepared, matched, options, timings)
            wrong = pgpgm.refine(refined.problem, np.array(WRONG_THETA), bounds, estimate_noise=True, warn=False)
            return dataclasses.replace(refined, best=wrong)

        module.refine_step = from_wrong_optimum
        try:
            return case.fit(seed=0, **kw)
        finally:
            module.refine_step = real
    raise SystemExit(f"unknown case {name!r}: use main or one of {CASES}")


def one(name: str, warm: bool = False) -> dict:
    """Fit case ``name`` in this process; its row. ``warm``: step 4 stopped after its first draws (a
    budget of 200 gradient evaluations), to fill the compile caches before the timed fits."""
    kw = {"posterior": pgpgm.NUTS(budget=pgpgm.PosteriorBudget(None, 200))} if warm else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r, wall, cpu = harness.timed(lambda: fit_case(name, **kw))
    conv = [str(w.message) for w in caught if issubclass(w.category, pgpgm.ConvergenceWarning)]
    d = r.diagnostics.sel(sampler="posterior")
    attrs = r.posterior.attrs
    budget = json.loads(attrs.get("pgpgm_budget", "{}"))
    max_rhat = float(d["rhat"].max())
    min_ess = float(min(d["ess_bulk"].min(), d["ess_tail"].min()))
    t = r.timings
    refined = r.estimates["theta"].sel(estimate="refined").values
    return {"case": name, "fit_s": wall, "fit_cpu_s": cpu, "steps_1_3_s": t["gp"] + t["sampling"] + t["refinement"],
            "step_4_s": t["posterior"], "budget_used_s": float(budget.get("used_seconds", float("nan"))),
            "sampling_time_s": float(attrs.get("sampling_time", float("nan"))),
            "rounds": int(attrs.get("pgpgm_rounds", 1)), "round_draws": attrs.get("pgpgm_round_draws", ""),
            "gradient_evaluations": int(budget.get("used_gradient_evaluations", 0)),
            "budget_exhausted": budget.get("exhausted", ""), "max_rhat": max_rhat, "min_ess": min_ess,
            "divergences": int(d["divergences"]), "converged": bool(max_rhat <= 1.01 and min_ess >= 400),
            "modes": len(json.loads(attrs.get("pgpgm_modes", "[]"))),
            "refined_theta": " ".join(f"{v:.4g}" for v in refined),
            "refinement_nll": float(r.estimates.attrs["refinement_nll"]),
            "warning": " | ".join(conv)}


def in_fresh_process(name: str, timeout: float, warm: bool = False) -> dict:
    """Case ``name`` fitted by this script in a new interpreter; its row with the process's wall."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", name,
                              *(["--warm"] if warm else [])], capture_output=True,
                             text=True, timeout=timeout, cwd=harness.ROOT)
    except subprocess.TimeoutExpired:
        return {"case": name, "process_s": time.perf_counter() - t0, "error": f"killed after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    if out.returncode or not lines:
        return {"case": name, "process_s": wall, "error": (out.stderr or out.stdout)[-2000:]}
    return {**json.loads(lines[-1][4:]), "process_s": wall}


def main() -> None:
    ap = harness.parser(__doc__, "runaways")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (main, case, main, case, ..., main)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES}")
    ap.add_argument("--timeout", type=float, default=900.0, help="a fit's process is killed after this many s")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no untimed first fit of each case (it fills the compile caches: steps 1-3 and step 4 "
                         "stopped after 200 gradient evaluations)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one fit, in the child process
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("ROW " + json.dumps(one(a.one, a.warm)), flush=True)
        return
    cases = a.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown case(s) {bad}: use {CASES}")
    env = harness.environment()
    (harness.RESULTS / f"{a.out}.partial.jsonl").unlink(missing_ok=True)
    warmup = []
    for name in ([] if a.no_warmup else ["main", *cases]):
        row = in_fresh_process(name, a.timeout, warm=True)
        warmup.append({"case": name, "process_s": row.get("process_s"), "fit_s": row.get("fit_s", ""),
                       "steps_1_3_s": row.get("steps_1_3_s", ""), "step_4_s": row.get("step_4_s", ""),
                       "error": row.get("error", "")})
        print("warm-up", warmup[-1], flush=True)
    runs = []
    for rnd in range(a.rounds):
        order = cases[rnd % len(cases):] + cases[:rnd % len(cases)]
        for name in ["main", *(x for c in order for x in (c, "main"))]:
            row = {"round": rnd + 1, "order": len(runs), **in_fresh_process(name, a.timeout)}
            runs.append(row)
            print({k: v for k, v in row.items() if k != "warning"}, flush=True)
            harness.append_partial(a.out, row)
    mains = [r for r in runs if r["case"] == "main" and "fit_s" in r]
    main_s = statistics.median(r["fit_s"] for r in mains) if mains else float("nan")
    for i, r in enumerate(runs):
        if r["case"] != "main" and "fit_s" in r:
            near = [runs[j]["fit_s"] for j in (i - 1, i + 1) if 0 <= j < len(runs) and "fit_s" in runs[j]
                    and runs[j]["case"] == "main"]
            r["over_main"] = r["fit_s"] / main_s
            r["over_neighbour_mains"] = r["fit_s"] / (sum(near) / len(near)) if near else float("nan")
            r["target_met"] = bool(r["over_main"] <= 4.0 and (r["converged"] or r["warning"]))
    cols = ["round", "case", "fit_s", "over_main", "over_neighbour_mains", "target_met", "process_s", "steps_1_3_s",
            "step_4_s", "budget_used_s", "sampling_time_s", "rounds", "round_draws", "gradient_evaluations", "budget_exhausted", "max_rhat", "min_ess", "divergences",
            "converged", "modes", "refinement_nll", "refined_theta", "error"]
    rows = [{c: r.get(c, "") for c in cols} for r in runs]
    summary = []
    for name in cases:
        mine = [r for r in runs if r["case"] == name and "fit_s" in r]
        summary.append({"case": name, "fits": len(mine),
                        "median_fit_s": statistics.median(r["fit_s"] for r in mine) if mine else float("nan"),
                        "max_over_main": max((r["over_main"] for r in mine), default=float("nan")),
                        "met_in": f"{sum(r['target_met'] for r in mine)} of {sum(r['case'] == name for r in runs)}",
                        "converged_in": sum(r["converged"] for r in mine)})
    each_main = " ".join(f"{r['fit_s']:.1f}" for r in mains)
    warnings_rows = [{"round": r["round"], "case": r["case"], "warning": r.get("warning", "").replace("\n", " ")}
                     for r in runs if r["case"] != "main" and r.get("warning")]
    harness.write(a.out, summary, "Step 4's runaway cases against the main job (issue 30), each fit in a fresh process",
                  env=env, sections={"Every fit, in the order run": rows, "The ConvergenceWarnings": warnings_rows,
                                              "Warm-up fits (untimed: compile caches; step 4 stopped after 200 "
                                              "gradient evaluations)": warmup},
                  notes=f"Main job (FitzHugh-Nagumo R observed, seed 0): median fit wall {main_s:.1f} s over "
                        f"{len(mains)} fits (each {each_main} s). Target: each "
                        "case's fit <= 4x the main job's, converged (R-hat <= 1.01, ESS >= 400) or with the "
                        "ConvergenceWarning. over_main: fit wall / median main job; over_neighbour_mains: / the mean "
                        "of the main jobs run just before and after it; process_s: the whole process (imports, "
                        "compile caches); budget_used_s: step 4's seconds on its budget's clock (from the start of "
                        "run_nuts: compilation, chain processes, every round); sampling_time_s: PyMC's sampling "
                        "time of the last round.")


if __name__ == "__main__":
    main()

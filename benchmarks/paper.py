"""Every published case (Chen et al. 2019) over noise seeds with the default fit (steps 1-4):
parameter errors of the sampled (gradient-matching mean), refined and posterior-mean estimates,
latent-trajectory RMSE, step 4's convergence (max R-hat, min bulk/tail ESS, divergences, rounds,
whether its budget ran out, modes named, the largest sd Monte Carlo error), wall seconds.

Targets (issue 30): step 4 <= 60 s per fit; R-hat <= 1.01 and ESS >= 400 in at least 38 of the
40 fits of seeds 0-4, divergences named. Seed-major order: every case once before any case twice,
so an interrupted run still covers every case; each row is also appended to
``results/OUT.partial.jsonl`` as it finishes.

``--variants adapt:500,laplace:200`` fits each case and seed once per step-4 variant (first-round
mass matrix ``pgpgm.NUTS(metric=...)``: ``adapt`` (the default) or ``laplace``, and tuning iterations per
chain; an optional third field, ``adapt:500:2``, sets ``pgpgm.NUTS(cores=...)``, the chain processes:
fewer than the chains run them in waves; a fourth, ``adapt:500::1e-8``, ``pgpgm.NUTS(rtol=...)``, step 4's
solver tolerance), one after the other, so that the variants are compared side by
side under the same load.

    ./run.sh bench paper [--seeds 5] [--first-seed 0] [--cases lv-x1,fhn-R|all] [--variants adapt:500]
                         [--out paper]
"""

from __future__ import annotations

import json
import warnings

import harness
import numpy as np

import pgpgm


def row(case: harness.Published, seed: int, r) -> dict:
    spec, c = case.spec, case.case
    identifiable = [p != "t6" for p in spec.system.parameters]  # t6 is published as not identifiable
    est = r.estimates["theta"]

    def rel(th):
        return float((np.abs(th - c.theta)[identifiable] / np.abs(c.theta)[identifiable]).max())

    latent = [s for s in spec.system.states if s not in c.observed]
    x = r.trajectories["x"]
    rmse = {e: float(np.sqrt(np.mean((x.sel(estimate=e, state=latent) - x.sel(estimate="truth", state=latent)) ** 2)))
            for e in ("sampled", "refined")}
    d = r.diagnostics.sel(sampler="posterior")
    attrs = r.posterior.attrs
    min_ess = float(min(d["ess_bulk"].min(), d["ess_tail"].min()))
    return {"case": case.key, "seed": seed,
            "sampled_max_rel_err": rel(est.sel(estimate="sampled").values),
            "refined_max_rel_err": rel(est.sel(estimate="refined").values),
            "posterior_max_rel_err": rel(est.sel(estimate="posterior").values),
            "max_rhat": float(d["rhat"].max()), "min_ess": min_ess, "divergences": int(d["divergences"]),
            "converged": bool(float(d["rhat"].max()) <= 1.01 and min_ess >= 400),
            "latent_rmse_sampled": rmse["sampled"], "latent_rmse_refined": rmse["refined"],
            "seconds": r.timings["total"], "posterior_s": r.timings["posterior"],
            "rounds": int(attrs.get("pgpgm_rounds", 1)),
            "sampler": attrs.get("pgpgm_sampler", ""),
            "budget_spent": json.loads(attrs.get("pgpgm_budget", "{}")).get("exhausted", ""),
            "gradient_evaluations": json.loads(attrs.get("pgpgm_budget", "{}")).get("used_gradient_evaluations", 0),
            "modes": len(json.loads(attrs.get("pgpgm_modes", "[]"))),
            "max_sd_error": float(d["sd_error"].max())}


def parse_variant(text: str) -> tuple:
    """``METRIC:TUNE[:CORES[:RTOL]]`` -> (metric, tune, cores or None, rtol); an empty CORES is None,
    an omitted RTOL the default ``pgpgm.NUTS().rtol``."""
    f = text.split(":") + ["", ""]
    return (f[0], int(f[1]), int(f[2]) if f[2] else None, float(f[3]) if f[3] else pgpgm.NUTS().rtol)


def main() -> None:
    ap = harness.parser(__doc__, "paper")
    ap.add_argument("--seeds", type=int, default=5, help="number of noise seeds")
    ap.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed, first-seed + 1, ...")
    ap.add_argument("--cases", default=None, help="comma-separated case keys (default: every published case)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated METRIC:TUNE[:CORES[:RTOL]] step-4 variants (METRIC adapt or laplace: PyMC's "
                         "NUTS with that first metric; nutpie or auto: that engine), e.g. adapt:500,laplace:200, "
                         "adapt:500:4,adapt:500:2 or adapt:500,nutpie:500 "
                         "(default: the default fit only)")
    ap.add_argument("--solver", default=None, choices=["cvode", "dopri5"],
                    help="the fit's ODE solver (default: pgpgm's default, CVODE); dopri5: pgpgm.DOPRI5() in every step")
    a = ap.parse_args()
    variants = [None] if not a.variants else [parse_variant(v) for v in a.variants.split(",")]
    env = harness.environment()
    keys = harness.case_keys(a.cases)
    warnings.simplefilter("ignore")  # convergence is reported in the table
    (harness.RESULTS / f"{a.out}.partial.jsonl").unlink(missing_ok=True)
    rows = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for key, variant in ((k, v) for k in keys for v in variants):
            extra = {} if variant is None else {"posterior": (
                pgpgm.NUTS(tune=variant[1], sampler=variant[0], cores=variant[2], rtol=variant[3])
                if variant[0] in ("nutpie", "auto") else
                pgpgm.NUTS(tune=variant[1], metric=variant[0], sampler="pymc", cores=variant[2], rtol=variant[3]))}
            if a.solver is not None:
                extra["solver"] = pgpgm.DOPRI5() if a.solver == "dopri5" else pgpgm.CVODE()
            case = harness.published(key, seed=seed, **extra)
            r = case.fit(seed=seed)
            label = None if variant is None else ":".join("" if v is None else str(v) for v in variant).rstrip(":")
            rows.append(row(case, seed, r) | ({} if variant is None else {"variant": label}))
            print(rows[-1], flush=True)
            harness.append_partial(a.out, rows[-1])
    n_ok = sum(r["converged"] for r in rows)
    slow = sum(r["posterior_s"] > 60 for r in rows)
    harness.write(a.out, rows, f"Published cases, default fit (steps 1-4), seeds {a.first_seed}.."
                  f"{a.first_seed + a.seeds - 1}", env=env,
                  notes=f"Converged (R-hat <= 1.01, ESS >= 400): {n_ok} of {len(rows)}; step 4 over 60 s: {slow}. "
                        "Relative errors exclude t6 (not identifiable).")


if __name__ == "__main__":
    main()

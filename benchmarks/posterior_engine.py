"""Step 4's engines side by side (issue 30, items 1 and 4): PyMC's NUTS (pgpgm's default: seeded dense
mass matrix, rounds) against nutpie (numba-compiled, its own adaptation) on the same step-4 model of a
published case (data seed 0), started where the default fit's steps 1-3 put it. For each engine: wall
seconds of sampling, gradient evaluations (leapfrog steps, tuning included), wall seconds per gradient
evaluation against the compiled log density + gradient's own cost at the centre, R-hat, ESS and
divergences. The step-4 inputs are taken from a real ``pgpgm.fit`` (its ``sample_posterior`` call is
intercepted), so the model, centre, spreads and covariance are exactly the fit's.

    .venv/bin/python benchmarks/posterior_engine.py [--cases fhn-R lv-x1] [--draws 500] [--tune 500]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np

import pgpgm
import pgpgm.pipeline as pipeline
from _common import median_time, write
from pgpgm.diagnostics import diagnose, problems
from pgpgm.posterior import ValueSpace, sample_posterior
from vs_multistart import published


class Captured(Exception):
    pass


def step4_inputs(key: str):
    """(model, center, sd, keyword arguments) of the default fit's step 4 on a published case."""
    spec, case, data, opts = published(key)
    got = {}
    real = pipeline.sample_posterior

    def capture(model, center, sd, **kw):
        got.update(model=model, center=center, sd=sd, kw=kw)
        raise Captured

    pipeline.sample_posterior = capture
    try:
        pgpgm.fit(spec.system, data, case.observed, **{**opts, "posterior": "nuts"})
    except Captured:
        pass
    finally:
        pipeline.sample_posterior = real
    return got


def gradient_cost(model, center) -> float:
    """Median seconds of one compiled log density + gradient at ``center``."""
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    point = ValueSpace(model).point(center)
    x = np.concatenate([np.ravel(point[v.name]) for v in model.value_vars])
    return median_time(lambda: fn(x), repeat=200, warmup=5)


def run_pymc(inp, draws, tune, max_rounds):
    kw = {**inp["kw"], "draws": draws, "tune": tune, "max_rounds": max_rounds, "budget": None, "warn": False,
          "progressbar": False}
    t = time.perf_counter()
    tree = sample_posterior(inp["model"], inp["center"], inp["sd"], **kw)
    wall = time.perf_counter() - t
    spent = json.loads(tree.attrs["pgpgm_budget"])
    return tree, wall, spent["used_gradient_evaluations"], tree.attrs["pgpgm_rounds"]


def run_nutpie(inp, draws, tune):
    import nutpie

    model, names = inp["model"], {rv.name for rv in inp["model"].free_RVs}
    start = {n: np.asarray(v, float) for n, v in inp["center"].items() if n in names}
    t = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, backend="numba", initial_points=start)
    compile_s = time.perf_counter() - t
    chains, cores = inp["kw"]["chains"], inp["kw"]["cores"] or os.cpu_count() or 1
    t = time.perf_counter()
    tree = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=min(chains, cores), seed=0,
                         save_warmup=True, progress_bar=False, target_accept=0.9)
    wall = time.perf_counter() - t
    grads = int(tree["warmup_sample_stats"]["n_steps"].sum()) + int(tree["sample_stats"]["n_steps"].sum())
    return tree, wall, grads, compile_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["fhn-R", "lv-x1"])
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--tune", type=int, default=500)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for key in args.cases:
        inp = step4_inputs(key)
        free = [rv.name for rv in inp["model"].free_RVs]
        g = gradient_cost(inp["model"], inp["center"])
        runs = [("pymc, 1 round", *run_pymc(inp, args.draws, args.tune, 1)[:3], np.nan)]
        if problems(diagnose(runs[0][1], free)):  # further rounds (no budget), as the default would run them
            runs.append(("pymc, rounds", *run_pymc(inp, args.draws, args.tune, 6)[:3], np.nan))
        runs.append(("nutpie", *run_nutpie(inp, args.draws, args.tune)))
        for name, tree, wall, grads, compile_s in runs:
            d = diagnose(tree, free)
            rows.append({"case": key, "engine": name, "wall_s": round(wall, 1),
                         "compile_s": round(compile_s, 1) if np.isfinite(compile_s) else "-",
                         "gradient_evaluations": grads, "ms_per_gradient": round(1e3 * wall / max(grads, 1), 3),
                         "gradient_alone_ms": round(1e3 * g, 3), "ratio": round(wall / max(grads, 1) / g, 2),
                         "max_rhat": round(float(d["rhat"].max()), 4),
                         "min_ess": round(float(np.minimum(d["ess_bulk"], d["ess_tail"]).min())),
                         "divergences": d.attrs["divergences"], "converged": not problems(d)})
            print(rows[-1], flush=True)
    write("posterior_engine", rows, "Step 4 engines side by side: PyMC NUTS (pgpgm's rounds) vs nutpie, same model")


if __name__ == "__main__":
    main()

"""Step 4, the posterior: pgpgm's step 4 (``sample_posterior`` with the fit's own options: the engine the fit
chose - nutpie by default, whitened by the refined optimum, with pgpgm's checks - rows "pgpgm, 1 round" and,
where that one fails its checks, "pgpgm, rounds") against nutpie's own sampler alone (``nutpie.sample`` on the
model as it is, its own adaptation: row "nutpie alone") on the same step-4 model of a published case (data
seed 0), started where the default fit's steps 1-3 put it, side by side in one process.

For each engine: wall seconds of sampling, gradient evaluations (leapfrog steps, tuning
included), wall seconds per gradient evaluation against one compiled log density + gradient at the
centre (the per-gradient overhead; target, issue 30: within 1.5x), R-hat, ESS, divergences. The
step-4 inputs (model, centre, spreads, options) are those of a real ``pgpgm.fit``, captured at its
call of ``run_nuts`` (:func:`harness.private`). Step 4's budget and convergence over every
published case: ``paper.py``.

``--compile``: instead, the seconds nutpie's model takes to compile inside step 4's budget, per case
for three optima of one data set (the refined one, then its mean and covariance moved as another
fit's would be): pgpgm's own callbacks (:func:`pgpgm.posterior.nutpie_engine.compile_whitened`, the
whitening as shared variables), ``nutpie.compile_pymc_model`` on the same model, and on the model
with the whitening and data frozen to constants (nutpie's ``freeze_model=True``: a new graph for every
optimum, as pgpgm's whitening was before it was shared), side by side, with PyTensor's numba cache
hits and misses of each log density; and step 4's own way, pgpgm's callbacks with the compiled model kept
by the graph's structure (``compile_whitened(..., reuse=True)``: optima 1 and 2 compile nothing, as a
later fit of the same model and grid, or step 4's next round). pgpgm's callbacks go first, so that optimum 0 is what a fit
pays in a new process: run the command twice to see the callbacks loaded from numba's cache (they are
cached by the model's structure), and with ``PYTHONPATH`` at another checkout for the code before.
``--ways pgpgm``: pgpgm's callbacks alone.

    ./run.sh bench posterior [--cases fhn-R,lv-x1] [--draws 500] [--tune 500] [--no-nutpie] [--compile [--ways pgpgm]]
"""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np

import harness
import pgpgm


class _Captured(Exception):
    pass


def step4_inputs(key: str) -> dict:
    """(model, center, sd, keyword arguments) of the default fit's step 4 on a published case."""
    case = harness.published(key, posterior="nuts")
    got = {}
    module = harness.private("pgpgm.steps.posterior")
    real = module.run_nuts

    def capture(model, center, sd, **kw):
        got.update(model=model, center=center, sd=sd, kw=kw)
        raise _Captured

    module.run_nuts = capture
    try:
        case.fit()
    except _Captured:
        pass
    finally:
        module.run_nuts = real
    return got


def gradient_cost(model, center) -> float:
    """Median seconds of one compiled log density + gradient at ``center``."""
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    point = harness.private("pgpgm.posterior.space", "ValueSpace")(model).point(center)
    x = np.concatenate([np.ravel(point[v.name]) for v in model.value_vars])
    return harness.median_time(lambda: fn(x), repeat=200, warmup=5)


def run_pgpgm(inp: dict, draws: int, tune: int, max_rounds: int):
    kw = {**inp["kw"], "draws": draws, "tune": tune, "max_rounds": max_rounds, "budget": None, "warn": False,
          "progressbar": False}
    t = time.perf_counter()
    tree = pgpgm.sample_posterior(inp["model"], inp["center"], inp["sd"], **kw)
    wall = time.perf_counter() - t
    spent = json.loads(tree.attrs["pgpgm_budget"])
    return tree, wall, spent["used_gradient_evaluations"], float("nan")


def run_nutpie(inp: dict, draws: int, tune: int):
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


def compile_times(key: str, inp: dict, all_ways: bool = True) -> list[dict]:
    """Seconds to compile the whitened step-4 model of ``key`` for nutpie, four ways (pgpgm's two alone
    unless ``all_ways``), at three optima."""
    import nutpie

    engine = harness.private("pgpgm.posterior.nutpie_engine")
    space = harness.private("pgpgm.posterior.space", "ValueSpace")(inp["model"])
    mean, cov, _ = harness.private("pgpgm.posterior.space", "seed_metric")(space, inp["center"], inp["sd"],
                                                                          inp["kw"]["covariance"])
    rng = np.random.default_rng(0)
    rows = []
    for optimum in range(3):
        shift = np.zeros_like(mean) if optimum == 0 else rng.normal(0.0, 0.1, mean.size) * np.sqrt(np.diag(cov))
        white, keep = engine.whitened_model(inp["model"], mean + shift, cov * (1.0 + 0.1 * optimum))
        ways = {"pgpgm callbacks": lambda: engine.compile_whitened(white, keep),
                "pgpgm, kept by structure": lambda: engine.compile_whitened(white, keep, reuse=True)}
        for name, freeze in (("nutpie", False), ("nutpie, constants", True)) if all_ways else ():
            ways[name] = lambda freeze=freeze: nutpie.compile_pymc_model(
                white, backend="numba", initial_points={engine.WHITE: np.zeros(mean.size)},
                jitter_rvs={white[engine.WHITE]}, var_names=keep, freeze_model=freeze)
        for name, compile_ in ways.items():
            t = time.perf_counter()
            compiled = compile_()
            seconds = time.perf_counter() - t
            vm = getattr(compiled.logp_func, "vm", None)  # none: the compiled model of an earlier optimum, kept
            loaded = getattr(compiled.compiled_logp_func, "cache_hits", 0)  # the callback from numba's cache
            rows.append({"case": key, "optimum": optimum, "way": name, "compile_s": seconds, "callback_cached": loaded,
                         "cache_hits": sum(vm.jit_fn.stats.cache_hits.values()) if vm else "(kept)",
                         "cache_misses": sum(vm.jit_fn.stats.cache_misses.values()) if vm else "(kept)"})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = harness.parser(__doc__, "posterior")
    ap.add_argument("--cases", default="fhn-R,lv-x1", help="comma-separated case keys")
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--tune", type=int, default=500)
    ap.add_argument("--no-nutpie", action="store_true", help="pgpgm's step 4 only (no nutpie alone)")
    ap.add_argument("--compile", action="store_true", help="nutpie's compile times only (see above)")
    ap.add_argument("--ways", choices=("all", "pgpgm"), default="all", help="--compile: every way, or pgpgm's alone")
    a = ap.parse_args()
    env = harness.environment()
    if a.compile:
        warnings.simplefilter("ignore")
        rows = [row for key in harness.case_keys(a.cases) for row in compile_times(key, step4_inputs(key), a.ways == "all")]
        harness.write(a.out, rows, "nutpie's compile time inside step 4's budget, each way side by side", env=env,
                      notes="optimum 0: the refined optimum; 1, 2: mean and covariance moved (another fit's optimum). "
                            "cache hits / misses: PyTensor's numba cache, for the log density and gradient.")
        return
    diagnose, problems = harness.private("pgpgm.posterior", "diagnose"), harness.private("pgpgm.posterior", "problems")
    warnings.simplefilter("ignore")
    rows = []
    for key in harness.case_keys(a.cases):
        inp = step4_inputs(key)
        free = [rv.name for rv in inp["model"].free_RVs]
        g = gradient_cost(inp["model"], inp["center"])
        runs = [("pgpgm, 1 round", *run_pgpgm(inp, a.draws, a.tune, 1))]
        if problems(diagnose(runs[0][1], free)):  # further rounds (no budget), as the default would run them
            runs.append(("pgpgm, rounds", *run_pgpgm(inp, a.draws, a.tune, 6)))
        if not a.no_nutpie:
            runs.append(("nutpie alone", *run_nutpie(inp, a.draws, a.tune)))
        for name, tree, wall, grads, compile_s in runs:
            d = diagnose(tree, free)
            rows.append({"case": key, "engine": name, "wall_s": wall,
                         "compile_s": compile_s if np.isfinite(compile_s) else "(in wall)",
                         "gradient_evaluations": grads, "ms_per_gradient": 1e3 * wall / max(grads, 1),
                         "gradient_alone_ms": 1e3 * g, "overhead_ratio": wall / max(grads, 1) / g,
                         "max_rhat": float(d["rhat"].max()),
                         "min_ess": float(np.minimum(d["ess_bulk"], d["ess_tail"]).min()),
                         "divergences": d.attrs["divergences"], "converged": not problems(d)})
            print(rows[-1], flush=True)
    harness.write(a.out, rows, f"Step 4 side by side: pgpgm's step 4 vs nutpie alone, {a.tune} + "
                  f"{a.draws} per chain", env=env,
                  notes="overhead_ratio: wall seconds per gradient evaluation / one compiled log density + gradient "
                        "at the centre (target <= 1.5).")


if __name__ == "__main__":
    main()

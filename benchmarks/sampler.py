"""Step 2, the gradient-matching sampler: the element-wise scheme against the block scheme (the
default), side by side in one run.

Every case: the published data (seed 0) and density, 2 chains x (``--tune`` + ``--draws``)
iterations, the same seed for both schemes, chains one after the other in this process
(``cores=1``) so that wall times compare the schemes, not the workers; compilation excluded (a
short warm-up run of each scheme first). Reported per scheme: iterations per second, min bulk ESS
and max R-hat over theta, min ESS per second, the posterior means. For FitzHugh-Nagumo V observed
the block run again with the chains in 2 worker processes (worker start included; draws must be
identical).

    ./run.sh bench sampler [--cases fhn-V,lv-x1,fhn-R,pt-R] [--tune 1500] [--draws 2000]
"""

from __future__ import annotations

import time

import arviz as az
import numpy as np

import harness
import pgpgm

SCHEMES = ("elementwise", "block")
CHAINS, SEED = 2, 1


def run(key: str, tune: int, draws: int) -> list[dict]:
    case = harness.published(key)
    c, spec = case.case, case.spec
    density = pgpgm.gradient_matching_density(spec.system, case.data, c.observed, kernel=c.kernel, gamma=c.gamma,
                                              priors=case.options["priors"])
    target = pgpgm.GradientMatchingTarget(density)  # compiled once, used by every run
    names = list(spec.system.parameters)
    rows = []
    for scheme in SCHEMES:
        pgpgm.sample(target, draws=20, tune=20, chains=1, scheme=scheme, cores=1, progressbar=False)  # compile
        t0 = time.perf_counter()
        tree = pgpgm.sample(target, draws=draws, tune=tune, chains=CHAINS, seed=SEED, scheme=scheme, cores=1,
                            progressbar=False)
        seconds = time.perf_counter() - t0
        ess = az.ess(tree, var_names=names, method="bulk")
        rhat = az.rhat(tree, var_names=names)
        ess_min = min(float(ess[p]) for p in names)
        rows.append({"case": key, "scheme": scheme, "seconds": seconds,
                     "iterations_per_s": CHAINS * (tune + draws) / seconds, "min_bulk_ESS_theta": ess_min,
                     "max_Rhat_theta": max(float(rhat[p]) for p in names), "min_ESS_per_s": ess_min / seconds,
                     "posterior_mean": " ".join(f"{float(tree.posterior[p].mean()):.3g}" for p in names)})
        print(rows[-1], flush=True)
    if key == "fhn-V":  # the same block run with the chains in 2 worker processes
        t0 = time.perf_counter()
        par = pgpgm.sample(density, draws=draws, tune=tune, chains=CHAINS, seed=SEED, cores=2, progressbar=False)
        seconds = time.perf_counter() - t0
        same = all(np.array_equal(par.posterior[v].values, tree.posterior[v].values) for v in par.posterior.data_vars)
        rows.append({**rows[-1], "scheme": f"block, cores=2 (worker start included; draws identical: {same})",
                     "seconds": seconds, "iterations_per_s": CHAINS * (tune + draws) / seconds,
                     "min_ESS_per_s": rows[-1]["min_bulk_ESS_theta"] / seconds})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = harness.parser(__doc__, "sampler")
    ap.add_argument("--cases", default="fhn-V,lv-x1,fhn-R,pt-R", help="comma-separated case keys")
    ap.add_argument("--tune", type=int, default=1500)
    ap.add_argument("--draws", type=int, default=2000)
    a = ap.parse_args()
    env = harness.environment()
    rows = [r for k in harness.case_keys(a.cases) for r in run(k, a.tune, a.draws)]
    harness.write(a.out, rows, f"Step 2: element-wise vs block scheme, {CHAINS} chains x ({a.tune} + {a.draws}), "
                  f"seed {SEED}, one process", env=env)


if __name__ == "__main__":
    main()

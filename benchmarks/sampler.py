"""The element-wise scheme against the block scheme (the default), side by side in one run.

Every case: the published data (``spec.simulate(case, seed=0)``) and density, 2 chains x
(1500 tune + 2000 draws), the same seed for both schemes, chains run one after the other
in this process (``cores=1``) so that wall times compare the schemes, not the workers;
compile time excluded (a short warm-up run of each scheme first). Reported per scheme:
min bulk ESS and max R-hat over theta, wall time, min ESS per second. For FitzHugh-Nagumo
V observed, the block run again with the chains in 2 worker processes (each worker
starts Python and compiles the model: included in its time).

    ./run.sh bench sampler            (or: python benchmarks/sampler.py [case ...])

Cases: fhn-V (FitzHugh-Nagumo V observed), lv-x1 (Lotka-Volterra x1 observed),
fhn-R (FitzHugh-Nagumo R observed), pt-R (protein transduction R latent).
"""

import datetime
import sys
import time

import arviz as az
import numpy as np

import pgpgm
from _common import RESULTS, write

CASES = {
    "fhn-V": ("fitzhugh-nagumo", "V-observed"),
    "lv-x1": ("lotka-volterra", "x1-observed"),
    "fhn-R": ("fitzhugh-nagumo", "R-observed"),
    "pt-R": ("protein-transduction", "R-latent"),
}
SCHEMES = ("elementwise", "block")
TUNE, DRAWS, CHAINS, SEED = 1500, 2000, 2, 1


def run(key: str) -> list[dict]:
    name, case_name = CASES[key]
    spec = pgpgm.load_model(name)
    c = spec.case(case_name)
    density = pgpgm.gradient_matching_density(spec.system, spec.simulate(case_name, seed=0), c.observed,
                                              kernel=c.kernel, gamma=c.gamma, priors=spec.priors(case_name))
    target = pgpgm.GradientMatchingTarget(density)  # compiled once, used by every run
    rows = []
    for scheme in SCHEMES:
        pgpgm.sample(target, draws=20, tune=20, chains=1, scheme=scheme, cores=1, progressbar=False)  # compile
        t0 = time.perf_counter()
        tree = pgpgm.sample(target, draws=DRAWS, tune=TUNE, chains=CHAINS, seed=SEED, scheme=scheme, cores=1,
                            progressbar=False)
        seconds = time.perf_counter() - t0
        names = list(spec.system.parameters)
        ess = az.ess(tree, var_names=names, method="bulk")
        rhat = az.rhat(tree, var_names=names)
        ess_min = min(float(ess[p]) for p in names)
        rows.append({"case": f"{name} {case_name}", "scheme": scheme, "min_bulk_ESS_theta": ess_min,
                     "max_Rhat_theta": max(float(rhat[p]) for p in names), "seconds": seconds,
                     "min_ESS_per_s": ess_min / seconds,
                     "posterior_mean": " ".join(f"{float(tree.posterior[p].mean()):.3g}" for p in names)})
        print(rows[-1], flush=True)
    if key == "fhn-V":  # the same block run with the chains in 2 worker processes
        t0 = time.perf_counter()
        par = pgpgm.sample(density, draws=DRAWS, tune=TUNE, chains=CHAINS, seed=SEED, cores=2, progressbar=False)
        seconds = time.perf_counter() - t0
        same = all(np.array_equal(par.posterior[v].values, tree.posterior[v].values) for v in par.posterior.data_vars)
        rows.append({**rows[-1], "scheme": f"block, cores=2 (worker start-up included; draws identical: {same})",
                     "seconds": seconds, "min_ESS_per_s": rows[-1]["min_bulk_ESS_theta"] / seconds})
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    keys = sys.argv[1:] or list(CASES)
    rows = [r for k in keys for r in run(k)]
    command = "python benchmarks/sampler.py " + " ".join(sys.argv[1:])
    write("sampler", rows, f"## Element-wise vs block scheme, {CHAINS} chains x ({TUNE} tune + {DRAWS} draws), "
                           f"seed {SEED}, one process\n\n`{command.strip()}`, {datetime.date.today().isoformat()}")
    print(f"written to {RESULTS / 'sampler.md'}")

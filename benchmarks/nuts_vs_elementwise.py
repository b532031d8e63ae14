"""ESS per second of NUTS (pm.sample, the Op's sensitivity gradients) against the element-wise
Metropolis-within-Gibbs sampler on the same gradient-matching density.

    ./run.sh bench nuts_vs_elementwise
"""

import time

import arviz as az
import pymc as pm

import pgpgm
from _common import write

rows = []
for name, case_name in (("fitzhugh-nagumo", "R-observed"),):  # NUTS takes ~12 min a case here
    spec = pgpgm.load_model(name)
    c = spec.case(case_name)
    density = pgpgm.gradient_matching_density(spec.system, spec.simulate(case_name, seed=0), c.observed, kernel=c.kernel,
                                                gamma=c.gamma, priors=spec.priors(case_name))
    target = pgpgm.GradientMatchingTarget(density)  # compiled once, used by both runs
    params = list(spec.system.parameters)
    pgpgm.sample(target, draws=10, tune=10, chains=1, progressbar=False)  # compile
    t0 = time.perf_counter()
    tree = pgpgm.sample(target, draws=2000, tune=1500, chains=1, seed=1, progressbar=False)
    el = time.perf_counter() - t0
    ess = az.ess(tree, var_names=params)
    rows.append({"case": f"{name} {case_name}", "sampler": "element-wise MwG (3500 it)", "seconds": el,
                 "min_ESS_theta": min(float(ess[p]) for p in params),
                 "min_ESS_per_s": min(float(ess[p]) for p in params) / el})
    start = density.initial_point(c.prior_bounds.mean(axis=1))
    with density.model():
        t0 = time.perf_counter()
        idata = pm.sample(draws=500, tune=500, chains=1, cores=1, initvals=start, random_seed=1,
                          progressbar=False, compute_convergence_checks=False)
        el = time.perf_counter() - t0
    ess = az.ess(idata, var_names=params)
    div = int(idata.sample_stats["diverging"].sum())
    rows.append({"case": f"{name} {case_name}", "sampler": f"NUTS (500 + 500, {div} divergences)", "seconds": el,
                 "min_ESS_theta": min(float(ess[p]) for p in params),
                 "min_ESS_per_s": min(float(ess[p]) for p in params) / el})
    print(rows[-2:], flush=True)
write("nuts_vs_elementwise", rows, "## NUTS vs element-wise Metropolis-within-Gibbs (one chain, seed 1, from the prior midpoints)")

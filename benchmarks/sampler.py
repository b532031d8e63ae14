"""Iterations per second and ESS per second of the element-wise Metropolis-within-Gibbs
sampler: FitzHugh-Nagumo (100 points, 3500 iterations) and protein transduction
(15 points, R latent), one chain, compile time excluded (a warm-up run first).

    ./run.sh bench sampler
"""

import time

import arviz as az
import numpy as np

import pgpgm
from _common import write

rows = []
for name, case_name in (("fitzhugh-nagumo", "V-observed"), ("fitzhugh-nagumo", "R-observed"),
                        ("protein-transduction", "R-latent"), ("protein-transduction", "S-R-latent")):
    spec = pgpgm.load_model(name)
    c = spec.case(case_name)
    density = pgpgm.gradient_matching_density(spec.system, spec.simulate(case_name, seed=0), c.observed, kernel=c.kernel,
                                                gamma=c.gamma, priors=spec.priors(case_name))
    target = pgpgm.GradientMatchingTarget(density)  # compiled once, used by both runs
    pgpgm.sample(target, draws=20, tune=20, chains=1, progressbar=False)  # compile
    tune = 1500
    draws = c.iterations - tune
    t0 = time.perf_counter()
    tree = pgpgm.sample(target, draws=draws, tune=tune, chains=1, seed=1, progressbar=False)
    el = time.perf_counter() - t0
    ess = az.ess(tree, var_names=list(spec.system.parameters))
    ess_min = float(min(float(ess[p]) for p in spec.system.parameters))
    rows.append({"case": f"{name} {case_name}", "N": c.times.size, "iterations": tune + draws, "seconds": el,
                 "iterations_per_s": (tune + draws) / el, "min_ESS_theta": ess_min, "min_ESS_per_s": ess_min / el})
write("sampler", rows, "## Element-wise Metropolis-within-Gibbs, one chain, published iteration budget")

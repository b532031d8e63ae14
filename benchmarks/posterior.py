"""The default fit (steps 1-4: pgpgm finds the basin, NUTS explores it) against NUTS on the same
ODE model started from prior draws (the usual Bayesian route), side by side in one run on
FitzHugh-Nagumo, R observed: wall time, min bulk ESS per second, and how many chains end in the
global mode (cost at the chain's mean within 1 % of the best refined cost).

    ./run.sh bench posterior [--seeds 3]
"""

import argparse
import time
import warnings

import numpy as np
import pymc as pm

import pgpgm
from _common import write
from pgpgm.data import as_observations
from pgpgm.diagnostics import diagnose
from pgpgm.posterior import build_ode_model

ap = argparse.ArgumentParser()
ap.add_argument("--seeds", type=int, default=3)
args = ap.parse_args()
warnings.simplefilter("ignore")
spec = pgpgm.load_model("fitzhugh-nagumo")
case = spec.case("R-observed")
system = spec.system
rows = []
for seed in range(args.seeds):
    data = spec.simulate("R-observed", seed=seed)
    obs = as_observations(data, case.observed, system)
    t0 = time.perf_counter()
    r = pgpgm.fit(system, data, case.observed, kernel=case.kernel, gamma=case.gamma, priors=spec.priors("R-observed"),
                  draws=2000, tune=1500, seed=seed, progressbar=False)
    fit_s = time.perf_counter() - t0
    # the reference: the least-squares cost with the noise sd the fit used, the refined optimum as the global one
    problem = pgpgm.LeastSquaresProblem(pgpgm.Integrator(system, case.times), obs.values, [1],
                                        r.trajectories["noise_sd"].values, case.x0, free_x0=[1])
    best = r.estimates.attrs["refinement_cost"]

    def in_mode(post, c):
        q = [float(post[p].sel(chain=c).mean()) for p in system.parameters] + [float(post["R_0"].sel(chain=c).mean())]
        return problem.cost(q) <= 1.01 * best

    d = r.diagnostics.sel(sampler="posterior")
    post = r.posterior.posterior
    rows.append({"seed": seed, "method": "pgpgm.fit (steps 1-4)", "seconds": fit_s,
                 "max_rhat": float(d["rhat"].max()), "min_ess_bulk": float(d["ess_bulk"].min()),
                 "min_ess_per_s": float(d["ess_bulk"].min()) / fit_s,
                 "chains_in_global_mode": f"{sum(in_mode(post, c) for c in post.chain.values)}/{post.sizes['chain']}"})
    print(rows[-1], flush=True)
    model, layout = build_ode_model(system, obs, x0=case.x0, priors=spec.priors("R-observed"),
                                    noise_center=r.trajectories["noise_sd"].values)
    rng = np.random.default_rng(seed)
    inits = []
    for _ in range(4):
        draw = pm.draw([model[n] for n in layout.free], random_seed=rng)
        inits.append({n: np.asarray(v) for n, v in zip(layout.free, draw)})
    t0 = time.perf_counter()
    tree = pm.sample(draws=500, tune=500, chains=4, cores=2, initvals=inits, random_seed=seed, model=model,
                     nuts_sampler="pymc",
                     progressbar=False, compute_convergence_checks=False)
    nuts_s = time.perf_counter() - t0
    dn = diagnose(tree, layout.free)
    post = tree.posterior
    rows.append({"seed": seed, "method": "NUTS from prior draws (4 x 500+500)", "seconds": nuts_s,
                 "max_rhat": float(dn["rhat"].max()), "min_ess_bulk": float(dn["ess_bulk"].min()),
                 "min_ess_per_s": float(dn["ess_bulk"].min()) / nuts_s,
                 "chains_in_global_mode": f"{sum(in_mode(post, c) for c in post.chain.values)}/{post.sizes['chain']}"})
    print(rows[-1], flush=True)
write("posterior", rows, "## FitzHugh-Nagumo R observed: default fit vs NUTS from prior draws, side by side")

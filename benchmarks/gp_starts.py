"""The GP fit's extra starts (issue 10): before (the first 5 starts only) vs after, side by side.

Before = ``fit_gp(..., max_starts=5)``: exactly the starts the fit made before the change (the
kernel's guess and 4 uniform ones), so both variants run in this process back to back.

Table 1 (step 1 alone): every observed state of each case, data seeds 0-4, GP seed = data seed
+ state index (as ``pgpgm.fit(seed=s)`` calls it); CPU seconds per data set (all states), and
which fits the extra starts improved (log marginal likelihood gained); the two variants alternate
which runs first.
Table 2 (steps 1-3): the default ``pgpgm.fit`` (``posterior=None``, published budget, early
stopping) on protein transduction, R latent, noise unknown, data seed = fit seed 0-4, with step
1 as before and as now: the refinement's NLL, the cost with the true sd 0.01 (1/2 sum of squared
residuals / 0.01^2, solved at rtol 1e-11), step 1's and the whole fit's seconds (after one
warm-up fit that pays the compilation).

    python benchmarks/gp_starts.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import time
import warnings

import numpy as np

import pgpgm
import pgpgm.density as density_module
from pgpgm.data import as_observations
from pgpgm.gp import fit_gp

CASES = [("protein-transduction", "R-latent"), ("protein-transduction", "S-R-latent"),
         ("lotka-volterra", "x1-observed"), ("fitzhugh-nagumo", "R-observed")]
BEFORE = functools.partial(fit_gp, max_starts=5)


def step1(seeds: int) -> None:
    print("| case | CPU s before | CPU s after | ratio | improved fits (data seed, state: nats gained) |")
    print("|---|---|---|---|---|")
    for model, case_name in CASES:
        spec = pgpgm.load_model(model)
        c = spec.case(case_name)
        before = after = 0.0
        gained = []
        for seed in range(seeds):
            obs = as_observations(spec.simulate(case_name, seed=seed), list(c.observed), spec.system)
            for m, s in enumerate(obs.states):
                t, y = obs.state_times(m), obs.state_values(m)
                fits = {}
                for label, f in (("before", BEFORE), ("after", fit_gp))[:: 1 if seed % 2 else -1]:  # alternate order
                    c0 = time.process_time()
                    fits[label] = f(t, y, c.kernel, seed=seed + m)
                    fits[label + " s"] = time.process_time() - c0
                old, new = fits["before"], fits["after"]
                before, after = before + fits["before s"], after + fits["after s"]
                if new.log_marginal_likelihood > old.log_marginal_likelihood + 1e-6:
                    gained.append(f"{seed}, {s}: +{new.log_marginal_likelihood - old.log_marginal_likelihood:.2f}")
        print(f"| {model} {case_name} | {before / seeds:.3f} | {after / seeds:.3f} | {after / before:.2f} | "
              f"{'; '.join(gained) or 'none'} |", flush=True)


def pt_fits(seeds: int) -> None:
    spec = pgpgm.load_model("protein-transduction")
    c = spec.case("R-latent")
    idx = list(spec.system.index_of_states(list(c.observed)))
    exact = pgpgm.Integrator(spec.system, c.times, type(pgpgm.default_solver())(rtol=1e-11, atol=1e-11))

    def run(ds, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0, c0 = time.perf_counter(), time.process_time()
            r = pgpgm.fit(spec.system, ds, c.observed, kernel=c.kernel, gamma=c.gamma, priors=spec.priors("R-latent"),
                          tune=1500, draws=c.iterations - 1500, seed=seed, posterior=None, progressbar=False)
            return r, time.perf_counter() - t0, time.process_time() - c0

    run(spec.simulate("R-latent", seed=0), 0)  # warm-up: compilation
    print("\n| seed | step 1 | NLL | cost (sd 0.01) | step 1 s | fit wall s | fit CPU s |")
    print("|---|---|---|---|---|---|---|")
    try:
        for seed in range(seeds):
            ds = spec.simulate("R-latent", seed=seed)
            obs = as_observations(ds, list(c.observed), spec.system)
            for label, f in (("before", BEFORE), ("after", fit_gp)):
                density_module.fit_gp = f  # what fit_gps calls
                r, wall, cpu = run(ds, seed)
                x = exact.solve(r.theta, r.estimates["x0"].values)[:, idx]
                cost = 0.5 * float(np.sum(((x - obs.values) / 0.01) ** 2))
                print(f"| {seed} | {label} | {r.estimates.attrs['refinement_nll']:.2f} | {cost:.1f} | "
                      f"{r.timings['gp']:.2f} | {wall:.1f} | {cpu:.1f} |", flush=True)
    finally:
        density_module.fit_gp = fit_gp


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} before")
    step1(a.seeds)
    pt_fits(a.seeds)
    print(f"\nload average {os.getloadavg()[0]:.2f} after")

"""NUTS on the gradient-matching density with the compiled ODE Op, beside the element-wise
Metropolis-within-Gibbs sampler on the same density, in one run.

FitzHugh-Nagumo, R observed (V latent, solved by CVODE inside the density through the
ODE Op, which runs compiled under PyTensor's numba backend), data seed 0, one chain,
sampler seed 1, started at the prior midpoints and the GP-smoothed observed states:

- the element-wise sampler (the paper's scheme), 1500 + 2000 iterations;
- PyMC's NUTS, 500 tune + 500 draws, with its default diagonal mass matrix and with a
  dense one (``init="jitter+adapt_full"``);
- nutpie (if installed), 500 + 500, with its low-rank mass-matrix adaptation.

    cd /work/wt-op && .venv/bin/python benchmarks/nuts_vs_elementwise.py
"""

import os
import time

import arviz as az
import numpy as np
import pymc as pm
import pytensor

import pgpgm
from _common import RESULTS, write

NAME, CASE = "fitzhugh-nagumo", "R-observed"
spec = pgpgm.load_model(NAME)
c = spec.case(CASE)
density = pgpgm.gradient_matching_density(spec.system, spec.simulate(CASE, seed=0), c.observed, kernel=c.kernel,
                                          gamma=c.gamma, priors=spec.priors(CASE))
params = list(spec.system.parameters)
start = density.initial_point(c.prior_bounds.mean(axis=1))
integrator = density.integrator
load_before = os.getloadavg()
rows = []


def row(sampler, seconds, idata, solves, steps_name):
    ess = az.ess(idata, var_names=params)
    min_ess = min(float(ess[p]) for p in params)
    post = idata.posterior
    stats = idata.sample_stats
    r = {"sampler": sampler, "seconds": seconds, "min_ESS_theta": min_ess, "min_ESS_per_s": min_ess / seconds,
         "divergences": int(stats["diverging"].sum()) if "diverging" in stats else "-",
         "steps_per_draw": float(stats[steps_name].mean()) if steps_name else "-",
         "ODE_solves": solves,
         "posterior_mean_theta": " ".join(f"{float(post[p].mean()):.3f}" for p in params)}
    rows.append(r)
    print(r, flush=True)


# --- the compiled log density and gradient: time of one evaluation (one augmented solve)
model = density.model()
fn = model.logp_dlogp_function(ravel_inputs=True)
fn.set_extra_values({})
point = np.concatenate([np.ravel(np.asarray(model.initial_point()[v.name])) for v in fn._grad_vars])
fn(point)
n0 = integrator.n_solves
t0 = time.perf_counter()
for _ in range(2000):
    fn(point)
per_eval = (time.perf_counter() - t0) / 2000
solves_per_eval = (integrator.n_solves - n0) / 2000
print(f"logp+grad: {per_eval * 1e6:.0f} us, {solves_per_eval:g} solve per evaluation", flush=True)

# --- element-wise Metropolis-within-Gibbs
target = pgpgm.GradientMatchingTarget(density)
pgpgm.sample(target, draws=10, tune=10, chains=1, progressbar=False)  # compile
n0 = integrator.n_solves
t0 = time.perf_counter()
tree = pgpgm.sample(target, draws=2000, tune=1500, chains=1, seed=1, progressbar=False)
row("element-wise MwG (1500 + 2000 it)", time.perf_counter() - t0, tree, integrator.n_solves - n0, None)

# --- PyMC NUTS (the compiled Op; nuts_sampler="pymc" because PyMC picks nutpie when installed)
for label, init in (("PyMC NUTS, diagonal mass matrix", "jitter+adapt_diag"),
                    ("PyMC NUTS, dense mass matrix", "jitter+adapt_full")):
    with model:
        n0 = integrator.n_solves
        t0 = time.perf_counter()
        idata = pm.sample(draws=500, tune=500, chains=1, cores=1, initvals=start, random_seed=1, init=init,
                          nuts_sampler="pymc", progressbar=False, compute_convergence_checks=False)
        row(f"{label} (500 + 500)", time.perf_counter() - t0, idata, integrator.n_solves - n0, "n_steps")

# --- nutpie (compiles the same PyTensor graph with the numba backend)
try:
    import nutpie
except ImportError:
    nutpie = None
if nutpie is not None:
    t0 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, initial_points=start)
    compile_s = time.perf_counter() - t0
    n0 = integrator.n_solves
    t0 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=500, tune=500, chains=1, cores=1, seed=1, adaptation="low_rank",
                          progress_bar=False)
    row(f"nutpie {nutpie.__version__}, low-rank mass matrix (500 + 500; compile {compile_s:.0f} s not counted)",
        time.perf_counter() - t0, idata, integrator.n_solves - n0, "n_steps")

load_after = os.getloadavg()
header = "\n".join([
    "## NUTS vs element-wise Metropolis-within-Gibbs on the gradient-matching density",
    "",
    "FitzHugh-Nagumo, R observed, data seed 0, one chain, sampler seed 1, from the prior midpoints.",
    "Command: `cd /work/wt-op && .venv/bin/python benchmarks/nuts_vs_elementwise.py`; date 2026-11-23;",
    f"PyMC {pm.__version__}, PyTensor {pytensor.__version__}; 2-core machine shared with other jobs "
    f"(1-min load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end).",
    f"One compiled log density + gradient: {per_eval * 1e6:.0f} us, {solves_per_eval:g} ODE solve per evaluation.",
    "Seconds: sampling wall time including tuning (PyMC rows include pm.sample's own compile, a few seconds;",
    "the other compiles are excluded); ESS: bulk ESS of theta;",
    "ODE solves: latent-state solves during the run (each NUTS gradient is one augmented solve).",
])
write("nuts_vs_elementwise", rows, header)

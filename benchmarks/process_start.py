"""What starting step 4's NUTS chain processes without fork costs: one ``pm.sample`` call (a NUTS
round) of the Lotka-Volterra step-4 model (both states observed, 8 free variables), 2 chains in
2 processes, with the processes started by "fork" (PyMC's default on Linux before), by "spawn"
and by pgpgm's :func:`pgpgm.processes.chain_context` (a fork server with pgpgm loaded),
alternating, in one process; the compiled graph is in the disk caches (a first call of each is
not counted).

    python benchmarks/process_start.py --repeats 5 --draws 50
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import warnings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--draws", type=int, default=50, help="tune and draws per chain")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import numpy as np
    import pymc as pm

    import pgpgm
    from pgpgm.data import as_observations
    from pgpgm.posterior import build_ode_model
    from pgpgm.priors import Priors
    from pgpgm.processes import START_METHOD, chain_context, sample_in_processes

    spec = pgpgm.load_model("lotka-volterra")
    t = np.linspace(0, 2, 20)
    ds = pgpgm.simulate(spec.system, [2, 1, 4, 1], [5, 3], t, noise_sd=0.1, seed=1)
    obs = as_observations(ds, None, spec.system)
    model, _ = build_ode_model(spec.system, obs, x0=[5.0, 3.0], priors=Priors.from_user(spec.system.parameters, None),
                               noise_sd=None, noise_center=[0.1, 0.1])
    start = {"theta1": 2.0, "theta2": 1.0, "theta3": 4.0, "theta4": 1.0}
    contexts = {"fork": multiprocessing.get_context("fork"), "spawn": multiprocessing.get_context("spawn"),
                START_METHOD: chain_context()}
    times: dict[str, list[float]] = {k: [] for k in contexts}
    for rep in range(a.repeats + 1):
        for label, ctx in contexts.items():
            t0 = time.perf_counter()
            sample_in_processes(pm.sample, model=model, nuts_sampler="pymc", draws=a.draws, tune=a.draws, chains=2, cores=2, mp_ctx=ctx,
                                progressbar=False, compute_convergence_checks=False, random_seed=rep, initvals=start)
            if rep:  # the first call of each compiles or loads the graph
                times[label].append(time.perf_counter() - t0)
    fork = statistics.median(times["fork"])
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"{label:10s}: median {med:.2f} s per pm.sample call, {med - fork:+.2f} s and {med / fork:.2f}x against "
              f"fork  ({', '.join(f'{x:.2f}' for x in ts)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

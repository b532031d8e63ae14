"""What a second fit of the same model costs to set up, and a warm fit's CPU time (issue 12).

Lotka-Volterra, x1 observed, in one process:

- **build**: CPU time of setting up the sampler for one more data set (data seeds 1-10, GP
  fits done beforehand): the density, the :class:`~pgpgm.GradientMatchingTarget`, its compiled
  parameter terms, the two chains' starts (``init="spread"``: a prior draw) and the bounds;
  median over the data sets after one warm-up;
- **fit**: CPU time of warm ``pgpgm.fit(..., posterior=None)`` calls (published data, sampler
  seeds 0, 1, 2) after one short warm-up fit, with the number of PyTensor functions compiled
  (``FunctionMaker``) and graph nodes built (``Apply``) during each fit.

    python benchmarks/fit_reuse.py [--rounds 1]

Run it with two versions of pgpgm side by side (e.g. ``PYTHONPATH=<a git archive of main>``)
to compare; it writes nothing.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pytensor.compile.maker as maker
from pytensor.graph.basic import Apply

import pgpgm
from pgpgm.data import as_observations
from pgpgm.density import fit_gps
from pgpgm.sampling.driver import _chain_starts
from pgpgm.sampling.target import GradientMatchingTarget

COUNTS = {"function": 0, "apply": 0}


def _count(cls, key):
    init = cls.__init__

    def counted(self, *a, **k):
        COUNTS[key] += 1
        init(self, *a, **k)

    cls.__init__ = counted


def main(rounds: int) -> None:
    warnings.simplefilter("ignore")
    spec = pgpgm.load_model("lotka-volterra")
    cn = "x1-observed"
    case = spec.case(cn)
    sets = []
    for s in range(11):
        data = spec.simulate(cn, seed=s)
        sets.append((data, fit_gps(as_observations(data, case.observed, spec.system), case.kernel, seed=0)))

    def build(data, gps):
        d = pgpgm.gradient_matching_density(spec.system, data, case.observed, kernel=case.kernel, gamma=case.gamma,
                                            priors=spec.priors(cn), gp_fits=gps)
        t = GradientMatchingTarget(d)
        t.parameter_function
        _chain_starts(t, "spread", 2, 0)
        t.lower_bounds()

    build(*sets[0])
    cpu = []
    for data, gps in sets[1:]:
        c = time.process_time()
        build(data, gps)
        cpu.append(time.process_time() - c)
    print(f"build: CPU per data set median {1e3 * np.median(cpu):.1f} ms (min {1e3 * min(cpu):.1f})", flush=True)

    _count(maker.FunctionMaker, "function")
    _count(Apply, "apply")
    data = spec.simulate(cn, seed=0)
    opts = dict(kernel=case.kernel, gamma=case.gamma, priors=spec.priors(cn), posterior=None, progressbar=False)
    pgpgm.fit(spec.system, data, case.observed, draws=20, tune=20, stop="never", **opts)
    for _ in range(rounds):
        for seed in (0, 1, 2):
            COUNTS.update(function=0, apply=0)
            c = time.process_time()
            r = pgpgm.fit(spec.system, data, case.observed, seed=seed, **opts)
            print(f"fit seed {seed}: CPU {time.process_time() - c:.3f} s, functions compiled {COUNTS['function']}, "
                  f"graph nodes built {COUNTS['apply']}, solves {r.n_ode_solves['sampling']}, refined theta "
                  f"{np.round(r.estimates.theta.sel(estimate='refined').values, 8).tolist()}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    main(ap.parse_args().rounds)

"""Step 2's stop rule: variants against the default on the published cases, fit by fit.

For every case and seed (data seed = sampler seed), warm fits (``posterior=None``, steps 1-3)
with the default :class:`pgpgm.sampling.stopping.RefinedAgreement` and with each variant;
reported per fit: iterations per chain, refined negative log likelihood minus the best of the
fit's variants (0 = this variant found the best optimum any of them found), CPU seconds. A
variant is safe on these data when it reaches the best optimum wherever the default does.

Variants (``--variants``, comma-separated): ``default``; ``every100`` (checks at 100, 200, ...:
the rule before 2026-11-24); ``moves2`` (two block moves per iteration instead of four);
``boundstop`` (an optimum on a prior bound stops the chains like any other: the rule before
2026-11-24); ``boundevery`` (chains held at a prior bound refined at every check, not at growing
intervals: the rule before 2026-11-24 session 15); ``fullbudget`` (``stop="never"``, the
published 3500 iterations).

    python benchmarks/stop_rule.py                                   # default vs every100, seeds 0-9
    python benchmarks/stop_rule.py --variants default,boundstop --cases lv-x2,lv-x1-ln,lv-x2-ln --seeds 5
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import pgpgm
import pgpgm.pipeline as pipeline
from pgpgm.sampling.stopping import RefinedAgreement

sys.path.insert(0, str(Path(__file__).parent))
from _common import write  # noqa: E402

CASES = {"lv-x1": ("lotka-volterra", "x1-observed"), "lv-x2": ("lotka-volterra", "x2-observed"),
         "lv-x1-ln": ("lotka-volterra", "x1-observed-large-noise"),
         "lv-x2-ln": ("lotka-volterra", "x2-observed-large-noise"),
         "fhn-V": ("fitzhugh-nagumo", "V-observed"), "fhn-R": ("fitzhugh-nagumo", "R-observed"),
         "pt-R": ("protein-transduction", "R-latent"), "pt-SR": ("protein-transduction", "S-R-latent")}
DEFAULT_CASES = "lv-x1,lv-x2,fhn-V,fhn-R,pt-R,pt-SR"


def _variant(name: str) -> tuple[dict, dict]:
    """(stop rule settings, extra fit arguments) of a variant."""
    return {"default": ({}, {}), "every100": ({"check_every": 100}, {}),
            "moves2": ({}, {"scheme": pgpgm.Block(n_moves=2)}), "boundstop": ({"bound_patience": 1}, {}),
            "boundevery": ({"bound_growth": 0.0}, {}), "fullbudget": ({}, {"stop": "never"})}[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="default,every100")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {sorted(CASES)}")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", default="stop_rule")
    a = ap.parse_args()
    variants = a.variants.split(",")
    load0 = os.getloadavg()[0]
    warnings.simplefilter("ignore")
    rows = []
    for key in a.cases.split(","):
        name, case = CASES[key]
        spec = pgpgm.load_model(name)
        c = spec.case(case)
        opts = dict(kernel=c.kernel, gamma=c.gamma, priors=spec.priors(case), posterior=None, progressbar=False)
        pgpgm.fit(spec.system, spec.simulate(case, seed=0), c.observed, draws=20, tune=20, stop="never", **opts)
        for seed in range(a.seeds):
            data = spec.simulate(case, seed=seed)
            fits = {}
            for v in variants:
                settings, extra = _variant(v)
                # the fit builds its rule with its own arguments; the variant's settings added
                pipeline.RefinedAgreement = functools.partial(RefinedAgreement, **settings)
                try:
                    t0 = time.process_time()
                    r = pgpgm.fit(spec.system, data, c.observed, seed=seed, **{**opts, **extra})
                    cpu = time.process_time() - t0
                finally:
                    pipeline.RefinedAgreement = RefinedAgreement
                fits[v] = (int(np.max(r.estimates.attrs["sampling_iterations"])),
                           float(r.estimates.attrs["refinement_nll"]), cpu)
            best = min(f[1] for f in fits.values())
            row = {"case": key, "seed": seed}
            for v, (it, nll, cpu) in fits.items():
                row |= {f"{v}_iterations": it, f"{v}_nll_minus_best": nll - best, f"{v}_cpu_s": cpu}
            rows.append(row)
            print(json.dumps(row), flush=True)
    date = datetime.date.today().isoformat()
    write(a.out, rows, f"## Stop rule variants: {', '.join(variants)}\n\n`python benchmarks/stop_rule.py "
                       f"--variants {a.variants} --cases {a.cases} --seeds {a.seeds}`, {date}, load average "
                       f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    for v in variants:
        at_best = sum(r[f"{v}_nll_minus_best"] < 1e-5 for r in rows)
        cpu = np.median([r[f"{v}_cpu_s"] for r in rows])
        print(f"{v}: best optimum in {at_best} of {len(rows)} fits, median CPU {cpu:.2f} s")


if __name__ == "__main__":
    main()

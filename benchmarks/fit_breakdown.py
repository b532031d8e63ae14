"""Where a default fit's steps 1-3 spend their time, and the least that is left of it
against multi-start least squares when step 2's Python overhead is removed.

Each case of ``vs_multistart.py`` (published data, seed 0; warm: after that benchmark's
``run`` on the case in the same process, which compiles and gives the multi-start figure):
the default ``pgpgm.fit`` with ``posterior=None`` for sampler seeds 0..N-1, with timers
around its parts (wall seconds per fit, median over seeds):

- ``gp`` (step 1), ``refinement`` (step 3): ``result.timings``;
- ``checks``: the stop rule's refinements of the chains' means (``RefinedAgreement.decide``);
- ``block_moves``: step 2's joint moves (:func:`pgpgm.sampling.block.block_move`), and inside
  them and elsewhere ``parameter_terms``: the compiled parameter terms of the density
  (``ParameterPart.evaluate_at``: the priors and the latent-state ODE solve, one per proposal);
- ``sweeps``: the state sweeps (:func:`pgpgm.sampling.kernel.sweep_states`);
- ``diagnostics`` (R-hat and ESS of the chains) and ``datatree`` (the chains' DataTree).

``floor`` = gp + checks + parameter_terms + refinement + diagnostics + datatree: the fit
with every block move and sweep costing only its compiled parameter terms - what a step 2
written entirely in compiled code, with the same budget and stop rule, would still pay.
``floor_ratio`` = floor / multi-start CPU to 95 % (``vs_multistart.run``, same process): no
such rewrite gets the fit below it.

    python benchmarks/fit_breakdown.py [--seeds 3] [--starts 200] [case ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import write  # noqa: E402
from vs_multistart import CASES, published, run  # noqa: E402

import pgpgm  # noqa: E402

PARTS = ("checks", "block_moves", "parameter_terms", "sweeps", "diagnostics", "datatree")


def _timed(owner, name: str, part: str, acc: dict) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``acc[part]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[part] += time.perf_counter() - t

    setattr(owner, name, wrapper)


def instrument(acc: dict) -> None:
    mod = importlib.import_module
    _timed(mod("pgpgm.sampling.stopping").RefinedAgreement, "decide", "checks", acc)
    _timed(mod("pgpgm.sampling.block"), "block_move", "block_moves", acc)
    _timed(mod("pgpgm.sampling.block"), "sweep_states", "sweeps", acc)
    _timed(mod("pgpgm.sampling.target").ParameterPart, "evaluate_at", "parameter_terms", acc)
    _timed(mod("pgpgm.sampling.driver"), "_to_datatree", "datatree", acc)
    _timed(mod("pgpgm.pipeline"), "diagnose", "diagnostics", acc)


def breakdown(key: str, seeds, acc: dict) -> dict:
    """Median parts of the timed fits of ``key``, after :func:`vs_multistart.run` on the same case
    in this process (which compiled the model: no warm-up here)."""
    spec, case, data, opts = published(key)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            acc.clear()
            c = time.process_time()
            r = pgpgm.fit(spec.system, data, case.observed, seed=seed, **opts)
            rows.append({"cpu": time.process_time() - c, **{k: r.timings[k] for k in ("gp", "refinement")},
                         **{p: acc[p] for p in PARTS}})
    med = {k: float(np.median([row[k] for row in rows])) for k in rows[0]}
    med["floor"] = sum(med[k] for k in ("gp", "checks", "parameter_terms", "refinement", "diagnostics", "datatree"))
    return med


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="sampler seeds 0..N-1")
    ap.add_argument("--starts", type=int, default=200, help="multi-start starts (vs_multistart.run)")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args(argv)
    load = os.getloadavg()
    out = []
    acc: dict = defaultdict(float)
    instrument(acc)  # run() below reads only its multi-start figures, which the timers do not touch
    for key in a.cases:
        ms = run(key, a.starts, range(a.seeds))
        med = breakdown(key, range(a.seeds), acc)
        out.append({"case": key, "fit_cpu_s": med["cpu"], "gp_s": med["gp"], "checks_s": med["checks"],
                    "block_moves_s": med["block_moves"], "parameter_terms_s": med["parameter_terms"],
                    "sweeps_s": med["sweeps"], "refinement_s": med["refinement"], "diagnostics_s": med["diagnostics"],
                    "datatree_s": med["datatree"], "floor_s": med["floor"], "ms_cpu_to_95_s": ms["ms_cpu_to_95_s"],
                    "ratio": med["cpu"] / ms["ms_cpu_to_95_s"], "floor_ratio": med["floor"] / ms["ms_cpu_to_95_s"]})
        print(out[-1], flush=True)
    cmd = "python benchmarks/fit_breakdown.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write("fit_breakdown", out, f"## Where steps 1-3 spend their time, and the floor against multi-start\n\n"
                                f"`{cmd.strip()}`, {datetime.date.today().isoformat()}, load average "
                                f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; seconds per fit, median over "
                                f"sampler seeds 0-{a.seeds - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Step 3's least-squares solver from prior-box starts: scipy's trf alone, dogbox alone, and
pgpgm's (trf, finished by dogbox when trf spends its budget inside the bounds).

Each case of ``vs_multistart.py`` (published data, seed 0): the refinement problem of that
benchmark's multi-start side (noise sds estimated, observed initial values refined), from
``--starts`` starts drawn uniformly from the prior box (the same starts for every method),
through :func:`pgpgm.refine` with its inner solve (``pgpgm.refine._least_squares``) replaced
for the "trf" and "dogbox" rows. Per method: the share of starts reaching the global optimum
(within 0.01 nats of the best of all runs), CPU milliseconds and ODE solves per start, and how
many inner solves of the trf and dogbox rows ran out of budget (for trf: where pgpgm's finish
runs).

    python benchmarks/refine_methods.py [--starts 100] [case ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import optimize

sys.path.insert(0, str(Path(__file__).parent))
from _common import write  # noqa: E402
from vs_multistart import CASES, multistart_problem  # noqa: E402

import pgpgm  # noqa: E402

REFINE = importlib.import_module("pgpgm.refine")
PGPGM = REFINE._least_squares
TOL = 0.01  # nats


def _scipy(method: str, spent: list):
    def solve(problem, q, lo, hi, max_nfev):
        res = optimize.least_squares(problem.residuals, q, jac=problem.jacobian, bounds=(lo, hi), method=method,
                                     x_scale="jac", max_nfev=max_nfev)
        spent.append(res.status == 0)
        return res
    return solve


def compare(key: str, n_starts: int) -> list[dict]:
    problem, bounds = multistart_problem(key)
    out = {}
    for method in ("trf", "pgpgm", "dogbox"):
        spent: list = []
        REFINE._least_squares = PGPGM if method == "pgpgm" else _scipy(method, spent)
        rng = np.random.default_rng(12345)
        nll, cpu, solves = [], [], []
        try:
            for _ in range(n_starts):
                start = rng.uniform(bounds[:, 0], bounds[:, 1])
                c = time.process_time()
                r = pgpgm.refine(problem, start, bounds, estimate_noise=True, warn=False)
                cpu.append(time.process_time() - c)
                nll.append(r.nll)
                solves.append(r.n_solves)
        finally:
            REFINE._least_squares = PGPGM
        out[method] = (np.array(nll), np.array(cpu), np.array(solves), int(np.sum(spent)))
    best = min(float(np.nanmin(v[0][np.isfinite(v[0])])) for v in out.values())
    return [{"case": key, "method": m, "success": float(np.mean(nll <= best + TOL)), "cpu_ms_per_start": 1e3 * cpu.mean(),
             "solves_per_start": float(solves.mean()), "inner_solves_out_of_budget": spent if m != "pgpgm" else "-"}
            for m, (nll, cpu, solves, spent) in out.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args(argv)
    load = os.getloadavg()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key in a.cases:
            rows += compare(key, a.starts)
    cmd = "python benchmarks/refine_methods.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write("refine_methods", rows, f"## Step 3's solver from prior-box starts: trf, trf + dogbox finish (pgpgm), dogbox\n\n"
                                  f"`{cmd.strip()}`, {datetime.date.today().isoformat()}, load average {load[0]:.2f} "
                                  f"before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""pgpgm's steps 1-3 against multi-start least squares, side by side in one process.

Each case: the published data (``spec.simulate(case, seed=0)``).

- **pgpgm**: the default ``pgpgm.fit`` (GP fit, gradient-matching chains with early stopping
  ``stop="agree"``, least-squares refinement) with ``posterior=None`` (steps 1-3), warm:
  after one short warm-up fit of the same model in this process (compilation is paid there;
  later fits reuse its compiled parameter terms and build no PyTensor graph). Sampler seeds
  0, 1, 2 (``--seeds N``: 0..N-1); the time is the wall time of the whole ``fit`` call (median
  over seeds; ``pgpgm_cpu_mean_s`` and ``cpu_ratio_mean`` the mean, which a seed whose chain sits
  in a wrong basin for long raises).
- **multi-start**: the refinement of step 3 (:func:`pgpgm.refine`, the same
  ``LeastSquaresProblem`` as ``fit`` builds: noise sds estimated from the GP's, observed
  states' initial values refined, started at the first observation) from ``--starts``
  starts drawn uniformly from the prior box. A start succeeds when its negative log
  likelihood is within ``TOL`` nats of the global optimum (the best of every run here,
  pgpgm's included). With per-start success rate p and mean time per start t (failed
  starts included), the starts needed for 95 % success are n95 = ceil(log 0.05 / log(1 - p))
  and the time to 95 % is n95 * t. Wall and CPU seconds of this process (CPU time is less
  affected by other jobs on a shared machine).

    python benchmarks/vs_multistart.py [--starts 200] [case ...]

Cases: lv-x1, fhn-V, fhn-R, pt-R. Ratio = pgpgm time / multi-start time to 95 %.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import RESULTS, write  # noqa: E402

import pgpgm  # noqa: E402
from pgpgm.data import as_observations  # noqa: E402
from pgpgm.density import fit_gps  # noqa: E402
from pgpgm.priors import Priors  # noqa: E402
from pgpgm.refine import LeastSquaresProblem  # noqa: E402

CASES = {
    "lv-x1": ("lotka-volterra", "x1-observed"),
    "fhn-V": ("fitzhugh-nagumo", "V-observed"),
    "fhn-R": ("fitzhugh-nagumo", "R-observed"),
    "pt-R": ("protein-transduction", "R-latent"),
}
TOL = 0.01  # nats
SEEDS = (0, 1, 2)


def published(key: str):
    """(spec, case, data, fit options) of a case: the published data (seed 0) and the default
    fit's options for steps 1-3 (``posterior=None``, no progress bar)."""
    name, case_name = CASES[key]
    spec = pgpgm.load_model(name)
    case = spec.case(case_name)
    opts = {"kernel": case.kernel, "gamma": case.gamma, "priors": spec.priors(case_name), "posterior": None,
            "progressbar": False}
    return spec, case, spec.simulate(case_name, seed=0), opts


def multistart_problem(key: str) -> tuple[LeastSquaresProblem, np.ndarray]:
    """The least-squares problem ``fit`` builds for a case (noise sds from the GPs, observed
    initial values free, started at the first observation) and the prior box (P, 2)."""
    spec, case, data, _ = published(key)
    obs = as_observations(data, case.observed, spec.system)
    noise = np.array([g.noise_sd for g in fit_gps(obs, case.kernel, seed=0)])
    idx = spec.system.index_of_states(obs.states)
    x0 = np.array(case.x0, float)
    x0[list(idx)] = obs.values[0]
    problem = LeastSquaresProblem(pgpgm.Integrator(spec.system, obs.times), obs.values, tuple(idx), noise, x0,
                                  free_x0=tuple(idx))
    return problem, Priors.from_user(spec.system.parameters, spec.priors(case.name)).bounds


def run(key: str, n_starts: int, seeds=SEEDS) -> dict:
    spec, case, data, opts = published(key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pgpgm.fit(spec.system, data, case.observed, draws=20, tune=20, stop="never", **opts)  # compile (warm-up)
        fits = []
        for seed in seeds:
            t0, c0 = time.perf_counter(), time.process_time()
            r = pgpgm.fit(spec.system, data, case.observed, seed=seed, **opts)
            fits.append((time.perf_counter() - t0, r, time.process_time() - c0))

    # multi-start least squares: the problem fit() builds, from uniform starts in the prior box
    problem, bounds = multistart_problem(key)
    rng = np.random.default_rng(12345)
    nll, seconds, cpu = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n_starts):
            start = rng.uniform(bounds[:, 0], bounds[:, 1])
            t0, c0 = time.perf_counter(), time.process_time()
            ref = pgpgm.refine(problem, start, bounds, estimate_noise=True, warn=False)
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            nll.append(ref.nll)
    nll = np.array(nll)
    pg_nll = np.array([r.estimates.attrs["refinement_nll"] for _, r, _ in fits])
    best = float(min(np.nanmin(nll[np.isfinite(nll)]), pg_nll.min()))
    p = float(np.mean(nll <= best + TOL))
    t_start = float(np.mean(seconds))
    n95 = math.ceil(math.log(0.05) / math.log(1 - p)) if 0 < p < 1 else (1 if p == 1 else math.inf)
    t95 = n95 * t_start
    t_pg = float(np.median([t for t, _, _ in fits]))
    cpu_pg = float(np.median([c for _, _, c in fits]))
    cpu_pg_mean = float(np.mean([c for _, _, c in fits]))
    cpu95 = n95 * float(np.mean(cpu))
    steps = float(np.median([sum(r.timings[k] for k in ("gp", "sampling", "refinement")) for _, r, _ in fits]))
    its = [r.estimates.attrs["sampling_iterations"] for _, r, _ in fits]
    return {"case": " ".join(CASES[key]), "pgpgm_fit_s": t_pg, "pgpgm_steps_1_3_s": steps,
            "pgpgm_iterations_per_chain": " / ".join(str(int(np.max(i))) for i in its),
            "pgpgm_success": f"{int(np.sum(pg_nll <= best + TOL))}/{len(fits)}",
            "pgpgm_nll_minus_best": " / ".join(f"{v - best:.2g}" for v in pg_nll),
            "ms_starts": n_starts, "ms_success_rate": p, "ms_s_per_start": t_start, "ms_n95": n95,
            "ms_time_to_95_s": t95, "ratio_pgpgm_over_ms": t_pg / t95, "pgpgm_cpu_s": cpu_pg, "ms_cpu_to_95_s": cpu95,
            "cpu_ratio": cpu_pg / cpu95, "pgpgm_cpu_mean_s": cpu_pg_mean, "cpu_ratio_mean": cpu_pg_mean / cpu95,
            "global_nll": best}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="sampler seeds 0..N-1 of pgpgm's fits")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    load = os.getloadavg()
    rows = []
    for k in a.cases:
        rows.append(run(k, a.starts, range(a.seeds)))
        print(rows[-1], flush=True)
    cmd = "python benchmarks/vs_multistart.py " + " ".join(sys.argv[1:])
    write("vs_multistart", rows, f"## pgpgm steps 1-3 (default fit, warm) vs multi-start least squares to 95 %\n\n"
                                 f"`{cmd.strip()}`, {datetime.date.today().isoformat()}, load average "
                                 f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"written to {RESULTS / 'vs_multistart.md'}")

"""Cost of one block move of step 2 and of its parts, in one process.

Lotka-Volterra x1 observed (published data, seed 0; N = 20, x2 latent): a chain state after
200 warm-up moves, then ``--moves`` block moves timed with ``time.perf_counter``, and each part
alone (the same calls the move makes): the parameter part (PyTensor function with the CVODE
solve), the conditional Gaussian of the observed states (built twice per move: the forward
move's and the reverse move's), its draw, the maintained vectors and the state part of the
density. Microseconds per call.

    python benchmarks/block_move.py [--moves 3000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import pgpgm
from pgpgm.sampling import Block, GradientMatchingTarget, kernel
from pgpgm.sampling.block import block_move
from pgpgm.sampling.conditional import conditional_gaussian

sys.path.insert(0, str(Path(__file__).parent))
from _common import write  # noqa: E402


def _per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moves", type=int, default=3000)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    load0 = os.getloadavg()[0]
    spec = pgpgm.load_model("lotka-volterra")
    case = spec.case("x1-observed")
    data = spec.simulate("x1-observed", seed=0)
    density = pgpgm.gradient_matching_density(spec.system, data, case.observed, kernel=case.kernel, gamma=case.gamma,
                                              priors=spec.priors("x1-observed"))
    target = GradientMatchingTarget(density)
    state = kernel.init(target, np.asarray(data.attrs["theta"], float))
    params, _ = Block().start(target, state, 100)
    rng = np.random.default_rng(0)
    for _ in range(200):
        state = block_move(rng, state, params, target)[0]
    arrays, X = target.arrays, state.X
    move = _per_call_us(lambda: block_move(rng, state, params, target), a.moves)
    g = conditional_gaussian(target, state.theta, X)
    e = rng.standard_normal(g.mean.size)
    stats = target.statistics(state.theta, X)
    row = {"block move": move,
           "parameter part (PyTensor + CVODE)": _per_call_us(lambda: target.parameter_part(state.q, X), a.moves),
           "conditional Gaussian": _per_call_us(
               lambda: conditional_gaussian(target, state.theta, X), a.moves),
           "draw into the states": _per_call_us(lambda: g.draw_into(X.copy(), arrays.obs_idx, e), a.moves),
           "density at the current states": _per_call_us(lambda: g.logpdf_at(X, arrays.obs_idx), a.moves),
           "maintained vectors": _per_call_us(lambda: target.statistics(state.theta, X), a.moves),
           "state part": _per_call_us(lambda: target.state_part(X, stats), a.moves)}
    write("block_move", [{"part": k, "us_per_call": v} for k, v in row.items()],
          f"## One block move and its parts (LV x1, N = 20), microseconds\n\n`python benchmarks/block_move.py "
          f"--moves {a.moves}`, {datetime.date.today().isoformat()}, load average {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()

"""Cost of FitResult.save / load_result for one FitzHugh-Nagumo fit (R observed, default budget,
Laplace posterior): CPU seconds of the first save in the process, best and median of 5 more
saves and of 5 loads, the file's size, and a check that the loaded result is identical.

    python benchmarks/save_result.py
    # before/after a change of pgpgm/result.py, back to back:
    git show <commit>:pgpgm/result.py > pgpgm/result.py; python benchmarks/save_result.py; git checkout pgpgm/result.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _cpu(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        c = time.process_time()
        fn()
        times.append(time.process_time() - c)
    return times


def main() -> int:
    import xarray as xr

    import pgpgm
    from pgpgm.batch import FitJob, run_job

    spec = pgpgm.load_model("fitzhugh-nagumo")
    job = FitJob("seed0", spec, spec.simulate("R-observed", seed=0), ["R"], case="R-observed")
    result, _ = run_job(job, {"posterior": "laplace"})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "r.nc"
        first = _cpu(lambda: result.save(path), 1)[0]
        saves = _cpu(lambda: result.save(path), 5)
        loads = _cpu(lambda: pgpgm.load_result(path), 5)
        size = os.path.getsize(path) / 1e6
        back = pgpgm.load_result(path)
    for part in ("posterior", "estimates", "trajectories", "diagnostics"):
        xr.testing.assert_identical(getattr(back, part), getattr(result, part))
    gm = back.gradient_matching.copy()
    gm.name = None  # loaded as a child named after its group before batch2
    xr.testing.assert_identical(gm, result.gradient_matching)
    print(f"save: first {first:.3f} s CPU, best {min(saves):.3f}, median {statistics.median(saves):.3f}; "
          f"load: best {min(loads):.3f}, median {statistics.median(loads):.3f}; {size:.2f} MB; round trip identical; "
          f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU time an idle LocalCluster made as fit_many makes its own (2 workers) takes: the parent
process (scheduler, nannies, client) and each worker, over --seconds of doing nothing, with
fit_many's dask settings (pgpgm.batch._QUIET) and with dask's defaults, one after the other.

    python benchmarks/cluster_idle.py --seconds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def idle_cpu(seconds: float, workers: int) -> tuple[float, list[float]]:
    import distributed

    from pgpgm.batch import _cluster_client

    with _cluster_client(distributed, None, None, workers) as c:
        time.sleep(3)  # start-up settled
        p0, w0 = time.process_time(), c.run(time.process_time)
        time.sleep(seconds)
        p1, w1 = time.process_time(), c.run(time.process_time)
    return p1 - p0, [w1[k] - w0[k] for k in w0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    import pgpgm.batch

    quiet = dict(pgpgm.batch._QUIET)
    for label, settings in (("fit_many's settings", quiet), ("dask's defaults", {})):
        pgpgm.batch._QUIET = settings
        parent, workers = idle_cpu(a.seconds, a.workers)
        print(f"{label}: idle {a.seconds:.0f} s -> parent {parent:.2f} s CPU, workers "
              f"{', '.join(f'{w:.2f}' for w in workers)} s CPU (load average {os.getloadavg()[0]:.2f})")
    pgpgm.batch._QUIET = quiet
    return 0


if __name__ == "__main__":
    sys.exit(main())

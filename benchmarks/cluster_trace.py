"""Timeline of one cold ``fit_many`` run: when the cluster is up, when each worker starts its
first fit (it imports pgpgm when the first job arrives), every fit's start and end, and the
shutdown. FitzHugh-Nagumo R observed, seeds 0..n-1 (the jobs of ``batch.py``), on a LocalCluster
made as ``fit_many`` makes its own, results saved on the workers.

    python benchmarks/cluster_trace.py [--n 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    t0 = time.time()
    import distributed

    import pgpgm
    from batch import _jobs
    from pgpgm.batch import _cluster_client

    print(f"imports in this process: {time.time() - t0:.2f} s")
    jobs, opts = _jobs(a.n, 2000, 1500, "laplace")
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        with _cluster_client(distributed, None, None, a.workers) as client:
            up = time.time() - t0
            with distributed.get_task_stream(client=client) as ts:
                pgpgm.fit_many(jobs, out, client=client, save_on_workers=True, progressbar=False, **opts)
            done = time.time() - t0
        closed = time.time() - t0
    rows = sorted((s["start"] - t0, s["stop"] - t0, d["worker"]) for d in ts.data for s in d["startstops"]
                  if s["action"] == "compute")
    first = {}
    for start, _, w in rows:
        first.setdefault(w, start)
    print(f"cluster up {up:.2f} s; first fit on each worker at " + ", ".join(f"{v:.2f}" for v in first.values())
          + f" s; last fit ends {max(r[1] for r in rows):.2f} s; fit_many returns {done:.2f} s; closed {closed:.2f} s")
    for start, stop, w in rows:
        print(f"{w.rsplit(':', 1)[-1]:>6}  {start:6.2f} - {stop:6.2f}  {stop - start:5.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

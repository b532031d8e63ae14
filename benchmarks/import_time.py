"""What ``import pgpgm`` costs a fresh process (what each fit_many worker pays before its first
fit): CPU and wall seconds, and whether matplotlib / arviz-plots were imported, in new Python
processes; with ``--before SRC`` (a folder holding another ``pgpgm`` package, e.g. ``git archive
main pgpgm | tar -x -C SRC``) alternated with that tree, one process each per round.
``--statement`` times another statement (default ``import pgpgm, pgpgm.batch``, a worker's cost;
``"import pgpgm"`` is what a notebook or ``pgpgm --help`` pays before any work).

    python benchmarks/import_time.py --rounds 6 [--before /tmp/main_src] [--statement "import pgpgm"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = ("import sys, time, json; t, c = time.perf_counter(), time.process_time(); {statement}; import pgpgm; "
         "print(json.dumps({'cpu': time.process_time() - c, 'wall': time.perf_counter() - t, "
         "'file': pgpgm.__file__, 'plotting': [m for m in ('matplotlib', 'arviz_plots') if m in sys.modules]}))")


def one(src: Path, statement: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD.replace("{statement}", statement)], capture_output=True,
                         text=True, env=env, cwd="/",
                         check=True, timeout=300)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(row["file"]).resolve().is_relative_to(src.resolve()), (row["file"], src)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--before", type=Path, help="a folder holding the pgpgm package to compare with")
    ap.add_argument("--statement", default="import pgpgm, pgpgm.batch", help="the Python statement to time")
    a = ap.parse_args(argv)
    trees = {"this tree": Path(__file__).resolve().parent.parent}
    if a.before:
        trees = {"before": a.before, **trees}
    rows: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(a.rounds):
        for label, src in trees.items():
            rows[label].append(one(src, a.statement))
    print(f"`{a.statement}`: load average {os.getloadavg()[0]:.2f}; {a.rounds} fresh processes per tree, alternated")
    print("| tree | CPU s (each) | median CPU s | median wall s | imports matplotlib / arviz-plots |")
    print("|---|---|---|---|---|")
    for label, rs in rows.items():
        cpus = [r["cpu"] for r in rs]
        print(f"| {label} | {' '.join(f'{c:.2f}' for c in cpus)} | {statistics.median(cpus):.2f} | "
              f"{statistics.median(r['wall'] for r in rs):.2f} | {sorted({m for r in rs for m in r['plotting']})} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

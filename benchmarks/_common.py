"""Shared helpers of the benchmark scripts: timing and writing result tables."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"


def median_time(fn, *, repeat: int = 50, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def write(name: str, rows: list[dict], header: str) -> None:
    """Print rows as a Markdown table and save them (with machine facts) as JSON."""
    RESULTS.mkdir(exist_ok=True)
    cols = list(rows[0])
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    text = "\n".join(lines)
    print(text)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor()}
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / f"{name}.md").write_text(text + "\n")

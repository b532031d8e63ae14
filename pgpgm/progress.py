"""A "compiling" line on the progress display while numba and PyTensor compile (or load) a model.

The first fit of a model in a new process compiles its kernels and log density (seconds;
loaded from the disk caches when an earlier process compiled them, see
:mod:`pgpgm.codegen.cache`). Without a message the sampler's bar would sit at 0 %.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm


@contextmanager
def compiling(what: str, enabled: bool = True, refresh_s: float = 0.5) -> Iterator[None]:
    """Show ``pgpgm: compiling <what>`` with a running clock while the block runs.

    Parameters
    ----------
    what : what is compiled, e.g. ``"the gradient-matching density"``
    enabled : False shows nothing (as ``progressbar=False``)
    refresh_s : seconds between clock updates
    """
    if not enabled:
        yield
        return
    bar = tqdm(total=None, desc=f"pgpgm: compiling {what} (cached on disk afterwards)",
               bar_format="{desc}: {elapsed}", leave=False)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(refresh_s):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.set_description_str(f"pgpgm: compiled {what} in {time.perf_counter() - t0:.1f} s")
        bar.close()

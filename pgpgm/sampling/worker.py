"""A sampling worker process: ``python -m pgpgm.sampling.worker``.

The driver (:func:`pgpgm.sampling.driver.sample` with ``cores > 1``) starts fresh
interpreters running this module rather than forking or re-importing the caller's
``__main__`` (so a script needs no ``if __name__ == "__main__"`` guard). Protocol:

- stdin: one cloudpickle of ``(density, model, kwargs, jobs)``, ``jobs`` a list of
  ``(chain, theta0, generator)``;
- stdout (fd 1, kept private: the worker's own prints go to stderr): a
  :class:`multiprocessing.connection.Connection` carrying ``("progress", chain, n)``,
  ``("done", chain, result)`` and ``("error", chain, traceback)`` messages.

The worker rebuilds the target from the pickled density and model (compiling it once),
runs its chains one after another with BLAS single-threaded, and exits.
"""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Connection

#: Iterations between progress reports.
REPORT_EVERY = 50


def main() -> None:
    channel = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # anything printed from here on goes to stderr
    chain = -1
    try:
        import cloudpickle
        from threadpoolctl import threadpool_limits

        from .driver import run_chain
        from .target import GradientMatchingTarget

        density, model, kwargs, jobs = cloudpickle.loads(sys.stdin.buffer.read())
        with threadpool_limits(limits=1):
            target = GradientMatchingTarget(density, model)
            for chain, theta0, rng in jobs:
                pending = [0]

                def progress(n, chain=chain, pending=pending):
                    pending[0] += n
                    if pending[0] >= REPORT_EVERY:
                        channel.send(("progress", chain, pending[0]))
                        pending[0] = 0

                result = run_chain(target, theta0, rng=rng, progress=progress, **kwargs)
                channel.send(("progress", chain, pending[0]))
                channel.send(("done", chain, result))
    except BaseException:  # reported to the driver, which raises
        channel.send(("error", chain, traceback.format_exc()))
    finally:
        channel.close()


if __name__ == "__main__":
    main()

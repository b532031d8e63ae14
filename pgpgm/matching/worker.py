"""A sampling worker process: ``python -m pgpgm.matching.worker``.

The driver (:func:`pgpgm.matching.driver.sample` with ``cores > 1``) starts fresh
interpreters running this module rather than forking or re-importing the caller's
``__main__`` (so a script needs no ``if __name__ == "__main__"`` guard). Protocol:

- stdin: a :class:`multiprocessing.connection.Connection` carrying first the cloudpickle
  of ``(density, model, kwargs, jobs)`` (``model`` None for the density's own), ``jobs`` a
  list of ``(chain, theta0, generator)``,
  then one bool per check (``kwargs["checks"]``): stop there or go on;
- stdout (fd 1, kept private: the worker's own prints go to stderr): a
  :class:`multiprocessing.connection.Connection` carrying ``("progress", chain, n)``,
  ``("checkpoint", chain, checkpoint)``, ``("done", chain, result)`` and
  ``("error", chain, traceback)`` messages.

The worker rebuilds the target from the pickled density and model (compiling it once; the
density's own parameter part is built from its structure, :func:`~pgpgm.matching.target.shared_parameter_part`),
runs its chains with BLAS single-threaded - one after another, or, with checks, together
from check to check (it sends every chain's checkpoint and waits for the decision) - and
exits.
"""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Connection

from .driver import advance, chain_iterations
from .target import GradientMatchingTarget

#: Iterations between progress reports.
REPORT_EVERY = 50


def main() -> None:
    channel = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # anything printed from here on goes to stderr
    chain = -1
    control = Connection(os.dup(0), writable=False)
    try:
        import cloudpickle
        from threadpoolctl import threadpool_limits

        density, model, kwargs, jobs = cloudpickle.loads(control.recv_bytes())
        with threadpool_limits(limits=1):
            target = GradientMatchingTarget(density, model)
            runs, pending = [], {}
            for chain, theta0, rng in jobs:
                pending[chain] = [0]

                def progress(n, chain=chain):
                    pending[chain][0] += n
                    if pending[chain][0] >= REPORT_EVERY:
                        channel.send(("progress", chain, pending[chain][0]))
                        pending[chain][0] = 0

                runs.append((chain, chain_iterations(target, theta0, rng=rng, progress=progress, chain=chain,
                                                     **kwargs)))
            if kwargs.get("checks"):  # together from check to check
                current = [(chain, *advance(run, None)) for chain, run in runs]
                while current[0][1] == "checkpoint":
                    for chain, _, value in current:
                        channel.send(("checkpoint", chain, value))
                    stop = control.recv()
                    current = [(chain, *advance(run, stop)) for chain, run in runs]
            else:  # one after another
                current = [(chain, *advance(run, None)) for chain, run in runs]
            for chain, _, result in current:
                channel.send(("progress", chain, pending[chain][0]))
                channel.send(("done", chain, result))
    except BaseException:  # reported to the driver, which raises
        channel.send(("error", chain, traceback.format_exc()))
    finally:
        channel.close()
        control.close()


if __name__ == "__main__":
    main()

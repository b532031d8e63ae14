"""Worker processes that start safely: never a fork of a process that runs threads.

A process that has imported numpy, pandas or PyMC runs threads (OpenBLAS's pool, pyarrow's,
a caller's own), and ``fork()`` copies only the forking thread: a lock another thread held
stays locked in the child, which can then deadlock (Python warns: "This process is
multi-threaded, use of fork() may lead to deadlocks in the child"). pgpgm's worker processes
therefore start as fresh interpreters:

- step 2's chains (:mod:`pgpgm.sampling.driver`): ``python -m pgpgm.sampling.worker`` through
  :mod:`subprocess` (fork and exec at once, nothing of the parent runs in the child);
- step 4's NUTS chains: ``pm.sample`` with the :mod:`multiprocessing` context of
  :func:`chain_context` (:data:`START_METHOD`), through :func:`sample_in_processes`;
- :func:`pgpgm.batch.fit_many`'s ``LocalCluster`` workers: dask's "spawn", also without
  running the caller's script again (:func:`main_module_hidden` while the cluster runs).

A chain process gets the compiled model by unpickling PyMC's step method: PyTensor rebuilds
the graph's function from its compile cache and numba's, and pgpgm's kernels from
:mod:`pgpgm.ode.kernel_cache` (nothing is compiled again). It runs one BLAS/OpenMP thread
(PyMC's ``blas_cores`` split over the chains), so the draws are the same whatever the
thread settings (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, threadpoolctl) of the caller.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import types
from collections.abc import Callable, Iterator
from typing import TypeVar

R = TypeVar("R")

#: how step 4's chain processes start: "spawn" (a fresh interpreter per chain). "fork" can
#: deadlock in a threaded process; "forkserver" forks from a server process that, once it
#: has imported pymc (pandas' pyarrow starts a thread), is threaded itself.
START_METHOD = "spawn"


def chain_context() -> multiprocessing.context.BaseContext:
    """The :mod:`multiprocessing` context of step 4's chain processes (:data:`START_METHOD`)."""
    return multiprocessing.get_context(START_METHOD)


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """While open, processes started by "spawn" or "forkserver" do not import the caller's
    ``__main__`` module (a script) before they run.

    A spawned process normally runs the parent's script again (as ``__mp_main__``): a script
    that calls :func:`pgpgm.fit` without ``if __name__ == "__main__":`` would start the whole
    fit again in every chain process. PyMC sends the chains their step method pickled with
    cloudpickle (functions and classes of ``__main__`` by value), so they need nothing of the
    script. ``sys.modules["__main__"]`` is a bare module meanwhile (restored on exit); a main
    module without a file (an interactive session, a notebook, ``python -c``) is left alone.
    """
    main = sys.modules.get("__main__")
    from_file = getattr(main, "__file__", None) is not None or getattr(getattr(main, "__spec__", None), "name", None)
    if main is None or not from_file:
        yield
        return
    stand_in = types.ModuleType("__main__")
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("__main__") is stand_in:
            sys.modules["__main__"] = main


def sample_in_processes(sample: Callable[..., R], **kwargs) -> R:
    """``sample(**kwargs)`` - ``pymc.sample`` - with chain processes started by
    :func:`chain_context` (never fork; the caller's script not imported again:
    :func:`main_module_hidden`) and one BLAS thread per chain (``blas_cores = min(cores,
    chains)``: PyMC limits each chain process, or this process while it samples the chains in
    turn, to ``blas_cores // cores`` threads).

    Parameters
    ----------
    sample : ``pymc.sample`` (passed in: this module imports no PyMC)
    **kwargs : its arguments; ``chains`` and ``cores`` are required here, ``mp_ctx`` and
        ``blas_cores`` default as above.
    """
    kwargs.setdefault("mp_ctx", chain_context())
    kwargs.setdefault("blas_cores", max(1, min(int(kwargs["cores"]), int(kwargs["chains"]))))
    with main_module_hidden():
        return sample(**kwargs)

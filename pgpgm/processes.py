"""Worker processes that start safely: never a fork of a process that runs threads.

A process that has imported numpy, pandas or PyMC runs threads (OpenBLAS's pool, pyarrow's,
a caller's own), and ``fork()`` copies only the forking thread: a lock another thread held
stays locked in the child, which can then deadlock (Python warns: "This process is
multi-threaded, use of fork() may lead to deadlocks in the child"). pgpgm's worker processes
therefore never fork the calling process:

- step 2's chains (:mod:`pgpgm.matching.driver`): ``python -m pgpgm.matching.worker`` through
  :mod:`subprocess` (fork and exec at once, nothing of the parent runs in the child);
- step 4's NUTS chains: ``pm.sample`` with the :mod:`multiprocessing` context of
  :func:`chain_context` (:data:`START_METHOD`: forks of a single-threaded server process that
  has pgpgm loaded), through :func:`sample_in_processes`;
- :func:`pgpgm.batch.fit_many`'s ``LocalCluster`` workers: dask's "spawn", also without
  running the caller's script again (:func:`main_module_hidden` while the cluster runs).

A chain process gets the compiled model by unpickling PyMC's step method: PyTensor rebuilds
the graph's function from its compile cache and numba's, and pgpgm's kernels from
:mod:`pgpgm.codegen.cache` (nothing is compiled again: its PyTensor flags are this process's, fast math
off: :func:`exact_math_environment`). It runs one BLAS/OpenMP thread
(PyMC's ``blas_cores`` split over the chains), so the draws are the same whatever the
thread settings (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, threadpoolctl) of the caller.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from typing import TypeVar

R = TypeVar("R")

#: how step 4's chain processes start: "forkserver" where the platform has it (a fork of a
#: single-threaded server process that has pgpgm's step 4 imported: :func:`chain_context`),
#: else "spawn" (a fresh interpreter per chain). Never "fork": a fork of a threaded process can
#: deadlock.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

#: modules the fork server imports once, so that a chain process starts with them loaded
SERVER_PRELOAD = ("pgpgm.posterior",)

#: the fork server's environment on top of this process's: no thread may run in it (a fork of a
#: threaded process is what this module avoids) - one BLAS/OpenMP thread, and no background
#: thread in the jemalloc of pyarrow (which pandas imports)
SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                      "JE_ARROW_MALLOC_CONF": "background_thread:false"}

_SERVER_LOCK = threading.Lock()


#: PyTensor's flag of LLVM's fast-math flags in the code its numba backend compiles, and step 4's value
#: of it (:func:`exact_math`)
EXACT_MATH_FLAGS = {"numba__fastmath": False}


def exact_math() -> contextlib.AbstractContextManager:
    """A context in which PyTensor's numba backend compiles without its fast-math flags (LLVM's
    floating-point contraction and reassociation: :data:`EXACT_MATH_FLAGS`).

    With them, the log density that a process compiled and the one a later process loaded from
    PyTensor's numba cache (``~/.pytensor/numba``) can differ in the last bits (~1e-12 at some
    points), so the first fit of a new model in a new process would draw other draws than every later
    process with the same seed. Without them both are the same code, bit for bit. They buy nothing
    here: the ODE solve, nearly all of a log density's time, is pgpgm's own numba code without them
    (a log density and gradient take the same time with them and without)."""
    import pytensor  # imported on first use: ``import pgpgm`` stays light

    return pytensor.config.change_flags(**EXACT_MATH_FLAGS)


def exact_math_environment() -> dict[str, str]:
    """``PYTENSOR_FLAGS`` (this process's, if any) with :data:`EXACT_MATH_FLAGS`, for a chain process: it
    then compiles, or loads from the cache, the code that step 4 compiled in this process (in
    :func:`exact_math`). With the default flags a chain process would ask the cache for other code, miss
    and compile the model again, which on empty caches can cost several times the sampling itself."""
    exact = ",".join(f"{k}={v}" for k, v in EXACT_MATH_FLAGS.items())
    flags = os.environ.get("PYTENSOR_FLAGS", "")
    return {"PYTENSOR_FLAGS": f"{flags},{exact}" if flags else exact}


def chain_context() -> multiprocessing.context.BaseContext:
    """The :mod:`multiprocessing` context of step 4's chain processes (:data:`START_METHOD`).

    With "forkserver", the server is started here on first use (unless this process runs one
    already) with :data:`SERVER_PRELOAD` imported and :data:`SERVER_ENVIRONMENT`, so a chain
    process is a fork of a process with one thread that has PyMC and pgpgm loaded: it only
    unpickles its step method (~1 s) where a spawned one imports them first (~3 s more).
    """
    ctx = multiprocessing.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        with _SERVER_LOCK:
            ctx.set_forkserver_preload(list(SERVER_PRELOAD))
            with _environment({**SERVER_ENVIRONMENT, **exact_math_environment()}):
                forkserver.ensure_running()  # a no-op while the server runs
    return ctx


@contextlib.contextmanager
def _environment(changes: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` while open (for a process started meanwhile)."""
    old = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    parallel = min(int(kwargs["cores"]), int(kwargs["chains"]))
    # one process (cores=1): no chain process starts, no fork server is needed; any context but
    # fork makes PyMC limit this process's BLAS threads while it samples
    kwargs.setdefault("mp_ctx", chain_context() if parallel > 1 else multiprocessing.get_context("spawn"))
    kwargs.setdefault("blas_cores", max(1, parallel))
    with main_module_hidden(), _environment(exact_math_environment()):  # for "spawn"d chain processes
        return sample(**kwargs)

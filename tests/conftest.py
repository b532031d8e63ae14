import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pgpgm


@pytest.fixture(scope="session")
def lv():
    return pgpgm.load_model("lotka-volterra")


@pytest.fixture(scope="session")
def fhn():
    return pgpgm.load_model("fitzhugh-nagumo")


@pytest.fixture(scope="session")
def pt_model():
    return pgpgm.load_model("protein-transduction")


@pytest.fixture(scope="session")
def all_models(lv, fhn, pt_model):
    return {"lotka-volterra": lv, "fitzhugh-nagumo": fhn, "protein-transduction": pt_model}


class StopHere(BaseException):
    """Ends a command at a call patched by :func:`capture_call`: the call's arguments are what a test checks."""


@pytest.fixture
def capture_call(monkeypatch):
    """``capture_call(obj, name)`` patches ``obj.name`` to record its keyword arguments (the returned dict) and
    raise :class:`StopHere` (``capture_call.stop``)."""
    def patch(obj, name: str) -> dict:
        seen = {}

        def capture(*args, **kwargs):
            seen.update(kwargs)
            raise StopHere

        monkeypatch.setattr(obj, name, capture)
        return seen

    patch.stop = StopHere
    return patch


def scipy_reference(system, theta, x0, times):
    """A tight, independent reference solve (DOP853, rtol 1e-12) with sympy-lambdified f."""
    import sympy as sp
    from scipy.integrate import solve_ivp

    t, xs, ps = system.symbols
    f = sp.lambdify((t, xs, ps), list(system.expressions), "numpy")
    sol = solve_ivp(lambda tt, y: f(tt, y, theta), (times[0], times[-1]), np.asarray(x0, float),
                    method="DOP853", t_eval=times, rtol=1e-12, atol=1e-12)
    assert sol.success
    return sol.y.T


#: the test files that take longest (seconds in a serial run, 2026-11-27), run first: ``./run.sh test``
#: hands whole files to its two worker processes in collection order (``--dist loadfile``), and a long
#: file started last leaves one worker idle while the other finishes it
SLOW_FILES_FIRST = ("test_posterior.py", "test_notebooks.py", "test_study_noise.py", "test_batch.py",
                    "test_step4_budget.py", "test_step4_nutpie.py", "test_kernel_cache.py", "test_sampling.py",
                    "test_observables.py", "test_processes.py", "test_noise_fit.py", "test_gp.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


@contextlib.contextmanager
def dask_cluster(folder: Path, file: str = "sched.json"):
    """A scheduler and one worker started with dask's command line in ``folder``, as a reader starts them on a
    real cluster: ``dask scheduler --scheduler-file FILE`` and ``dask worker --scheduler-file FILE`` (one
    process, one thread, BLAS on one thread). Yields the scheduler's address; both processes end on exit."""
    dask = str(Path(sys.executable).parent / "dask")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    quiet = dict(cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [subprocess.Popen([dask, "scheduler", "--scheduler-file", file, "--port", "0", "--no-dashboard"],
                              **quiet)]
    try:
        deadline = time.monotonic() + 120
        while not (Path(folder) / file).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        procs.append(subprocess.Popen([dask, "worker", "--scheduler-file", file, "--nworkers", "1",
                                       "--nthreads", "1", "--no-dashboard"], **quiet))
        import json

        yield json.loads((Path(folder) / file).read_text())["address"]
    finally:  # the worker first: a worker whose scheduler is gone waits to reconnect
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

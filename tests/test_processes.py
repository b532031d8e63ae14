"""Worker processes start safely and step 4's draws do not depend on thread settings (issue 33).

Each check runs a script in a fresh interpreter. The script is a file without an
``if __name__ == "__main__":`` guard that starts a thread of its own before it fits (a process
that already runs threads, as a GUI, a server or a notebook kernel does): step 2 in worker
processes (``cores=2``), a fit with NUTS chains in parallel processes (``cores=2``) and
``fit_many`` on a LocalCluster. It must finish without Python's DeprecationWarning about
``fork()`` in a multi-threaded process (all warnings shown: ``-W always``), and without the
chain processes running the unguarded script again. Under two thread settings
(``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` 1 and 2, and a
threadpoolctl limit around the fit) the same seed gives the same draws, bit for bit.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    import numpy as np
    from threadpoolctl import threadpool_limits
    import pgpgm

    print("SCRIPT RUN", flush=True)  # once: the chain processes must not run this script again
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()  # this process runs a thread of its own

    system = pgpgm.ODESystem.from_equations({"x": "-k*x + c"}, ["k", "c"])
    t = np.linspace(0.0, 2.0, 12)
    data = pgpgm.simulate(system, [0.7, 0.5], [3.0], t, noise_sd=0.05, seed=1)
    out = {}
    if "all" in sys.argv:  # step 2 in worker processes
        density = pgpgm.gradient_matching_density(system, data, ["x"], priors=(0.0, 5.0), gp_starts=2)
        tree = pgpgm.sample(density, draws=30, tune=30, chains=2, cores=2, progressbar=False, stop="never")
        out["step2"] = tree.posterior["k"].values.tolist()
    with threadpool_limits(limits=int(sys.argv[1])):
        fit = pgpgm.fit(system, data, ["x"], priors=(0.0, 5.0), draws=60, tune=60, chains=2,
                        posterior=pgpgm.NUTS(draws=40, tune=40, chains=2, rounds=1, cores=2, sampler="pymc"),
                        progressbar=False, seed=3)  # PyMC's chain processes
    out["draws"] = {v: fit.posterior.posterior[v].values.tolist() for v in ("k", "c", "x_0", "sigma_x")}
    if "all" in sys.argv:  # the same fit with the chains in this process
        fit = pgpgm.fit(system, data, ["x"], priors=(0.0, 5.0), draws=60, tune=60, chains=2,
                        posterior=pgpgm.NUTS(draws=40, tune=40, chains=2, rounds=1, cores=1, sampler="pymc"),
                        progressbar=False, seed=3)
        out["in_process"] = {v: fit.posterior.posterior[v].values.tolist() for v in ("k", "c", "x_0", "sigma_x")}
        from pgpgm.batch import FitJob, fit_many
        table = fit_many([FitJob("one", system, data, ["x"], {"priors": (0.0, 5.0)})], sys.argv[2], n_workers=1,
                         progressbar=False, draws=30, tune=30, chains=1, posterior=None)
        out["fit_many"] = table["status"].tolist()
    stop.set()
    print("RESULT " + json.dumps(out), flush=True)
""")

FORK_WARNING = "use of fork() may lead to deadlocks"

#: a default fit (step 4: nutpie) on a grid given on the command line: a model no process has compiled before
FIRST_FIT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import pgpgm

    system = pgpgm.ODESystem.from_equations({"x": "-k*x", "y": "k*x - c*y"}, ["k", "c"])
    t = np.linspace(0.0, float(sys.argv[1]), 15)
    data = pgpgm.simulate(system, [0.7, 0.4], [3.0, 0.0], t, observed=["y"], noise_sd=0.05, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = pgpgm.fit(system, data, ["y"], priors=(0.0, 5.0), x0={"x": 3.0, "y": 0.0}, progressbar=False, seed=2,
                        posterior=pgpgm.NUTS(draws=100, tune=100, chains=2, rounds=1, budget=None))
    print("RESULT " + json.dumps(fit.posterior.posterior["k"].values.tolist()))
""")


def _run(tmp_path, threads: int, *extra: str) -> tuple[dict, str]:
    script = tmp_path / "fit_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    proc = subprocess.run([sys.executable, "-W", "always", str(script), str(threads), *extra], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("SCRIPT RUN") == 1, proc.stdout[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), proc.stderr


@pytest.fixture(scope="module")
def one_thread(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_thread")
    return _run(tmp, 1, "all", str(tmp / "out"))


def test_a_fit_in_a_threaded_process_forks_nothing(one_thread):
    out, stderr = one_thread
    assert FORK_WARNING not in stderr and "fork()" not in stderr, stderr[-3000:]
    assert np.shape(out["step2"]) == (2, 30) and np.shape(out["draws"]["k"]) == (2, 40)
    assert out["fit_many"] == ["ok"]


def test_chain_processes_draw_what_this_process_draws(one_thread):
    """PyMC's chains in their own processes (``cores=2``) and in this one (``cores=1``): the same draws, bit
    for bit. The chain processes compile, or load from the cache, step 4's log density without PyTensor's
    fast-math flags as this process does; with them they ran other code (other last bits, other draws) and,
    with empty caches, compiled the model again (Theoph's hierarchical model: 46 s against 6 s)."""
    out, _ = one_thread
    for name, values in out["draws"].items():
        np.testing.assert_array_equal(np.array(values), np.array(out["in_process"][name]), err_msg=name)


def test_step_4_draws_are_the_same_under_two_thread_settings(one_thread, tmp_path):
    two, stderr = _run(tmp_path, 2)
    assert FORK_WARNING not in stderr
    for name, values in one_thread[0]["draws"].items():
        np.testing.assert_array_equal(np.array(values), np.array(two["draws"][name]), err_msg=name)
    assert np.ptp(np.array(two["draws"]["k"])) > 0  # real draws, not a constant


@pytest.mark.slow  # two fresh processes compiling a new model; CI checks the chain processes' draws against this process's
def test_the_process_that_compiles_a_model_draws_what_a_later_process_draws(tmp_path):
    """The first process that meets a step-4 model compiles its log density (PyTensor's numba backend) and a
    later one loads that from the cache: with the same seed both draw the same, bit for bit. (With PyTensor's
    fast-math flags the two codes differed in the last bits - LLVM contracts and reassociates differently
    when it compiles than in the code it caches - and the chains followed them apart.)"""
    script = tmp_path / "first_fit.py"
    script.write_text(FIRST_FIT)
    end = 6.0 + int.from_bytes(os.urandom(6), "big") / 2**48  # a new grid: a new compiled model
    draws = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), repr(end)], capture_output=True, text=True, timeout=600,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        draws.append(np.array(json.loads(line[len("RESULT "):])))
    assert draws[0].shape == (2, 100) and np.ptp(draws[0]) > 0
    np.testing.assert_array_equal(draws[0], draws[1])

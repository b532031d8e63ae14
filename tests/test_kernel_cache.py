"""The disk cache of compiled kernels (pgpgm.codegen.cache): a second process loads what the
first compiled, a changed model never gets the old kernels, concurrent writers never corrupt it.

Each test runs fresh Python processes (the cache is per process in memory) with their own empty
cache folders (PGPGM_CACHE_DIR for the model kernels, PyTensor's base_compiledir for graphs).
Numbers are checked against closed-form solutions: x' = -k x (x = x0 exp(-k t)) and
x' = -k x + c (x = c/k + (x0 - c/k) exp(-k t)).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# Builds a one-state system, evaluates its kernels, solves it with CVODE (from Python and,
# with OP=1, inside a compiled PyTensor graph) and prints what numba compiled.
_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    from numba.core import event
    import pgpgm
    from pgpgm.codegen import cache as kernel_cache

    rhs = os.environ["RHS"]
    system = pgpgm.ODESystem.from_equations({"x": rhs}, ["k", "c"])
    times = np.linspace(0.0, 2.0, 9)
    theta, x0 = np.array([1.3, 0.4]), np.array([2.0])
    with event.install_recorder("numba:compile") as rec:
        compiled = system.compiled
        f = system.rhs(0.0, x0, theta)
        jx, jp = system.jacobian(0.0, x0, theta)
        x = pgpgm.Integrator(system, times).solve(theta, x0)[:, 0]
        op_x, op_solves = None, None
        if os.environ.get("OP"):
            import pytensor, pytensor.tensor as pt
            from pgpgm.solve.op import ODEOp
            it = pgpgm.Integrator(system, times)
            th, y0 = pt.dvector("th"), pt.dvector("y0")
            fn = pytensor.function([th, y0], ODEOp(it)(th, y0)[:, 0], mode="NUMBA")
            op_x = fn(theta, x0).tolist()
            op_solves = it.n_solves
    funcs = [getattr(e.data["dispatcher"], "py_func", None) or getattr(e.data["dispatcher"], "_pyfunc", None)
             for _, e in rec.buffer if e.is_start]
    compiles = [getattr(f, "__qualname__", repr(f)) for f in funcs]
    print(json.dumps({"compiles": compiles, "key": compiled.key, "f": f.tolist(), "jx": jx.tolist(),
                      "jp": jp.tolist(), "x": x.tolist(), "op_x": op_x, "op_solves": op_solves,
                      "file": str(kernel_cache.cache_dir() / f"pgpgm_kernels_{compiled.key}.py")}))
''')

_DECAY = "-k*x"
_DECAY_SOURCE = "-k*x + c"


def _run(tmp_path, rhs: str, op: bool = False, wait: bool = True):
    env = {**os.environ, "RHS": rhs, "PGPGM_CACHE_DIR": str(tmp_path / "pgpgm"),
           "PYTENSOR_FLAGS": f"base_compiledir={tmp_path / 'pytensor'}"}
    if op:
        env["OP"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    return _result(proc)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _model_compiles(res: dict) -> list[str]:
    """The compiled functions that belong to the model's kernel module (not numba's own helpers)."""
    names = {"rhs", "jac_x", "jac_p", "rhs_grid", "aug_rhs", "sweep", "jacobian_on_grid",
             "cvode_rhs", "cvode_aug_rhs", "cvode_jac", "cvode_aug_jac"}
    return [c for c in res["compiles"] if c in names]


def _check_decay(res: dict, source: bool) -> None:
    k, c, x0 = 1.3, 0.4, 2.0
    t = np.linspace(0.0, 2.0, 9)
    exact = (c / k + (x0 - c / k) * np.exp(-k * t)) if source else x0 * np.exp(-k * t)
    np.testing.assert_allclose(res["f"], [-k * x0 + (c if source else 0.0)], rtol=1e-15)
    np.testing.assert_allclose(res["jx"], [[-k]], rtol=1e-15)
    np.testing.assert_allclose(res["jp"], [[-x0, 1.0 if source else 0.0]], rtol=1e-15)
    np.testing.assert_allclose(res["x"], exact, rtol=1e-5, atol=1e-7)
    if res["op_x"] is not None:
        np.testing.assert_allclose(res["op_x"], exact, rtol=1e-5, atol=1e-7)


def test_second_process_loads_the_compiled_kernels(tmp_path):
    first = _run(tmp_path, _DECAY, op=True)
    second = _run(tmp_path, _DECAY, op=True)
    assert first["key"] == second["key"]
    # (numba reports no compile events for C callbacks; they are compiled with these)
    assert {"rhs", "jac_x", "jac_p", "aug_rhs"} <= set(_model_compiles(first))
    assert _model_compiles(second) == []  # every model kernel came from the disk cache
    # the compiled ODE Op and PyTensor's graph around it came from the caches as well
    assert second["compiles"] == [], second["compiles"]
    for res in (first, second):
        _check_decay(res, source=False)
        assert res["op_solves"] == 1  # the compiled Op counted its solve in the new integrator


def test_changed_equations_never_get_the_old_kernels(tmp_path):
    old = _run(tmp_path, _DECAY, op=True)
    new = _run(tmp_path, _DECAY_SOURCE, op=True)
    assert new["key"] != old["key"] and new["file"] != old["file"]
    assert {"rhs", "jac_x", "jac_p", "aug_rhs"} <= set(_model_compiles(new))  # compiled afresh, not loaded
    _check_decay(old, source=False)
    _check_decay(new, source=True)  # the numbers of the new equations, in the kernels and in the Op
    again = _run(tmp_path, _DECAY, op=True)  # the old model still loads its own kernels
    assert again["compiles"] == []
    _check_decay(again, source=False)


@pytest.mark.slow  # a concurrency run of several processes; CI checks a second process's reuse of the cache
def test_concurrent_processes_share_the_cache_without_corrupting_it(tmp_path):
    procs = [_run(tmp_path, _DECAY_SOURCE, wait=False) for _ in range(4)]
    results = [_result(p) for p in procs]
    for res in results:
        _check_decay(res, source=True)
    assert len({r["key"] for r in results}) == 1
    folder = tmp_path / "pgpgm" / "kernels"
    assert [p.name for p in folder.glob(".tmp-*")] == []  # no half-written module left behind
    from pgpgm.ode import functions as codegen
    import pgpgm

    system = pgpgm.ODESystem.from_equations({"x": _DECAY_SOURCE}, ["k", "c"])
    assert (folder / f"pgpgm_kernels_{results[0]['key']}.py").read_text() == codegen.kernel_source(system)
    after = _run(tmp_path, _DECAY_SOURCE)
    assert _model_compiles(after) == []
    _check_decay(after, source=True)


def test_damaged_module_file_is_replaced(tmp_path):
    first = _run(tmp_path, _DECAY)
    path = first["file"]
    with open(path, "w") as f:
        f.write("raise RuntimeError('damaged')\n")
    again = _run(tmp_path, _DECAY)
    _check_decay(again, source=False)
    assert "damaged" not in open(path).read()


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    from pgpgm.codegen import cache as kernel_cache

    monkeypatch.setenv("PGPGM_CACHE_DIR", str(tmp_path / "here"))
    assert kernel_cache.cache_dir() == tmp_path / "here" / "kernels"
    assert kernel_cache.cache_dir().is_dir()


def test_unwritable_cache_folder_falls_back_to_the_temporary_folder(tmp_path, monkeypatch):
    from pgpgm.codegen import cache as kernel_cache

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PGPGM_CACHE_DIR", str(blocker))  # blocker/kernels cannot be created
    monkeypatch.setattr(kernel_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = kernel_cache.cache_dir()
    assert path.parent.parent == tmp_path / "tmp" and path.name == "kernels" and path.is_dir()

"""Result files: atomic saves, checksums, refusal of damaged files, and a fault-injection run
that kills saves half-way (issue 13, item 5)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import arviz as az
import h5netcdf
import numpy as np
import pytest
import xarray as xr

import pgpgm
from pgpgm.errors import PgpgmError, ResultFileError
from pgpgm.fit_result import CHECKSUM_ATTR, FitResult, _to_tree, load_result

HERE = Path(__file__).resolve().parent


def make_result(seed: int = 0) -> FitResult:
    """A small FitResult built from random arrays (Lotka-Volterra shapes; no fit is run)."""
    rng = np.random.default_rng(seed)
    system = pgpgm.ODESystem.from_equations(
        {"x1": "theta1*x1 - theta2*x1*x2", "x2": "-theta3*x2 + theta4*x1*x2"},
        ["theta1", "theta2", "theta3", "theta4"], name="lotka-volterra")
    chains, draws, times = 2, 40, np.linspace(0.0, 2.0, 20)
    post = {f"theta{i}": rng.normal(size=(chains, draws)) for i in range(1, 5)}
    post |= {"x1": rng.normal(size=(chains, draws, 20)), "x2": rng.normal(size=(chains, draws, 20))}
    stats = {"lp": rng.normal(size=(chains, draws)), "accept_theta": rng.random((chains, draws, 4)) < 0.3}
    posterior = az.from_dict({"posterior": post, "sample_stats": stats, "observed_data": {"y_x1": rng.normal(size=20)}},
                             coords={"time": times, "parameter": list(system.parameters)},
                             dims={"x1": ["time"], "x2": ["time"], "y_x1": ["time"], "accept_theta": ["parameter"]})
    posterior.attrs["pgpgm_settings"] = json.dumps({"draws": draws, "seed": seed})
    params = list(system.parameters)
    estimates = xr.Dataset(
        {"theta": (("estimate", "parameter"), rng.normal(size=(2, 4))), "stderr": ("parameter", rng.random(4)),
         "truth": ("parameter", [2.0, 1.0, 4.0, 1.0])},
        coords={"estimate": ["sampled", "refined"], "parameter": params},
        attrs={"refined_x0": [5.0, 3.0], "refinement_cost": float(rng.random()), "refinement_success": 1,
               "refinement_message": "`ftol` termination condition is satisfied."})
    dense = np.linspace(0.0, 2.0, 100)
    trajectories = xr.Dataset(
        {"x": (("estimate", "time_dense", "state"), rng.normal(size=(3, 100, 2))),
         "y": (("time", "observed"), rng.normal(size=(20, 1))), "noise_sd": ("observed", [0.1])},
        coords={"estimate": ["sampled", "refined", "truth"], "time_dense": dense, "state": ["x1", "x2"],
                "time": times, "observed": ["x1"]})
    return FitResult(system, posterior, estimates, trajectories, {"gp": 0.5 + seed, "total": 2.0},
                     {"sampling": 100 + seed, "refinement": 7})


def same_result(a: FitResult, b: FitResult) -> bool:
    """Every stored part of two results is identical (values, coordinates, attributes, system)."""
    try:
        xr.testing.assert_identical(a.estimates, b.estimates)
        xr.testing.assert_identical(a.trajectories, b.trajectories)
        xr.testing.assert_identical(a.posterior, b.posterior)
    except AssertionError:
        return False
    return (a.system.states == b.system.states and a.system.parameters == b.system.parameters
            and [str(e) for e in a.system.expressions] == [str(e) for e in b.system.expressions]
            and dict(a.timings) == dict(b.timings) and dict(a.n_ode_solves) == dict(b.n_ode_solves))


@pytest.fixture(scope="module")
def result():
    return make_result(0)


@pytest.fixture
def saved(result, tmp_path) -> Path:
    return result.save(tmp_path / "r.nc")


def _open_fds_to(path: Path) -> list[str]:
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        pytest.skip("needs /proc to list open files")
    out = []
    for fd in fd_dir.iterdir():
        try:
            if Path(os.readlink(fd)) == path.resolve():
                out.append(fd.name)
        except OSError:
            pass
    return out


def test_round_trip_is_identical_and_leaves_no_temporary_file(result, saved):
    back = load_result(saved)
    assert same_result(back, result) and back is not result
    assert not same_result(back, make_result(1))  # the comparison can fail
    assert sorted(p.name for p in saved.parent.iterdir()) == ["r.nc"]
    with h5netcdf.File(saved, "r") as f:
        assert len(f.attrs[CHECKSUM_ATTR]) == 64  # a SHA-256 hex digest is stored


def test_round_trip_keeps_gradient_matching_and_diagnostics_identical(result, tmp_path):
    """A result whose gradient-matching chains differ from its posterior (a fit with step 4 or
    a Laplace posterior) and that carries diagnostics: every part comes back identical, the
    gradient-matching tree a root as it was saved."""
    import dataclasses

    gm = make_result(5).posterior
    gm.attrs["pgpgm_stopping"] = json.dumps({"rule": "agree", "iterations": [200, 200]})
    diag = xr.Dataset({"rhat": (("sampler", "variable"), [[1.01, 1.2], [1.0, np.nan]]),
                       "divergences": ("sampler", [0, 3])},
                      coords={"sampler": ["gradient_matching", "posterior"], "variable": ["theta1", "theta2"]})
    full = dataclasses.replace(result, gradient_matching=gm, diagnostics=diag)
    back = load_result(full.save(tmp_path / "full.nc"))
    assert same_result(back, full)
    xr.testing.assert_identical(back.gradient_matching, gm)
    assert back.gradient_matching.name is None and back.gradient_matching is not back.posterior
    xr.testing.assert_identical(back.diagnostics, diag)
    with pytest.raises(AssertionError):  # the comparison can fail
        xr.testing.assert_identical(back.gradient_matching, result.posterior)


def test_save_checks_the_stored_checksum_against_a_full_reread(saved):
    """save() reads the data back once (to compute the digest) and checks the stored digest;
    load_result's independent full pass agrees with it."""
    from pgpgm.fit_result import _digest, _verify

    with h5netcdf.File(saved, "r") as f:
        stored, actual = f.attrs[CHECKSUM_ATTR], _digest(f)
    assert stored == actual
    _verify(saved, written=actual)
    with pytest.raises(ResultFileError, match="stored checksum"):
        _verify(saved, written="0" * 64)


def test_load_closes_the_file_and_saving_back_to_the_same_path_works(saved):
    back = load_result(saved)
    assert _open_fds_to(saved) == []
    back.save(saved)  # over the file it was read from
    again = load_result(saved)
    assert same_result(again, back)
    other = make_result(3)
    other.save(saved)  # and a different result over it
    assert same_result(load_result(saved), other) and not same_result(load_result(saved), back)


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.5, 0.9, 0.999])
def test_a_truncated_file_is_refused_naming_it(saved, fraction):
    size = saved.stat().st_size
    with open(saved, "r+b") as f:
        f.truncate(int(size * fraction))
    with pytest.raises(ResultFileError, match="damaged") as info:
        load_result(saved)
    assert str(saved) in str(info.value)


def test_a_changed_data_byte_is_refused_though_hdf5_still_reads_it(result, saved):
    values = result.trajectories["x"].values
    raw = saved.read_bytes()
    at = raw.find(np.ascontiguousarray(values).tobytes())
    assert at > 0  # the trajectories are stored contiguously, as float64
    at += values.nbytes // 2 + 3  # a mantissa byte in the middle of the array
    saved.write_bytes(raw[:at] + bytes([raw[at] ^ 0x10]) + raw[at + 1:])
    with xr.open_datatree(saved, engine="h5netcdf") as tree:  # without the checksum it loads silently...
        changed = tree["pgpgm_trajectories"]["x"].values
    assert np.sum(changed != values) == 1
    with pytest.raises(ResultFileError, match="does not match the checksum") as info:  # ... with it, refused
        load_result(saved)
    assert str(saved) in str(info.value)


def test_an_edited_attribute_is_refused(saved):
    with h5netcdf.File(saved, "a") as f:
        f.attrs["pgpgm_timings"] = json.dumps({"gp": 99.0, "total": 2.0})
    with pytest.raises(ResultFileError, match="does not match the checksum"):
        load_result(saved)


def test_a_file_without_checksum_is_read_only_when_asked(result, tmp_path):
    p = tmp_path / "old.nc"
    _to_tree(result).to_netcdf(p, engine="h5netcdf")  # what the previous save wrote
    with pytest.raises(ResultFileError, match=r"no checksum .*verify=False"):
        load_result(p)
    assert same_result(load_result(p, verify=False), result)


def test_files_that_are_not_results_are_refused(tmp_path, result):
    text, empty, other, folder = (tmp_path / n for n in ("a.nc", "b.nc", "c.nc", "d"))
    text.write_text("time,state,value\n0,x1,1\n")
    empty.write_bytes(b"")
    xr.Dataset({"v": ("t", [1.0, 2.0])}).to_netcdf(other, engine="h5netcdf")
    folder.mkdir()
    for p, fragment in ((text, "damaged or truncated"), (empty, "damaged or truncated"),
                        (other, "not a pgpgm result file"), (folder, "no result file"),
                        (tmp_path / "missing.nc", "no result file")):
        with pytest.raises(ResultFileError, match=fragment) as info:
            load_result(p)
        assert str(p) in str(info.value) and isinstance(info.value, PgpgmError)


def test_save_refuses_a_folder_or_a_missing_folder_before_writing(result, tmp_path):
    with pytest.raises(ResultFileError, match="is a folder"):
        result.save(tmp_path)
    with pytest.raises(ResultFileError, match="does not exist"):
        result.save(tmp_path / "nope" / "r.nc")
    assert list(tmp_path.iterdir()) == []


def _char_device(folder: Path) -> Path:
    """A character device node like /dev/full: made in ``folder`` when running as root (so that
    a failing check could only destroy this copy), else /dev/full itself (not writable then)."""
    if os.geteuid() != 0:
        return Path("/dev/full")
    node = folder / "full"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    return node


def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "pipe")
    return folder / "pipe"


def _socket(folder: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(folder / "sock"))
    s.close()
    return folder / "sock"


def _link(folder: Path) -> Path:
    (folder / "target.nc").write_bytes(b"not a result")
    (folder / "link.nc").symlink_to(folder / "target.nc")
    return folder / "link.nc"


def _folder(folder: Path) -> Path:
    (folder / "sub").mkdir()
    return folder / "sub"


# (id, make the path in a folder, fragment); issue 33: the rename replaced whatever was there
NOT_REGULAR = [
    ("device node", _char_device, "is a character device, not a regular file, and saving would replace it"),
    ("FIFO", _fifo, "is a FIFO (named pipe), not a regular file"),
    ("socket", _socket, "is a socket, not a regular file"),
    ("symbolic link", _link, "is a symbolic link, not a regular file, and saving would replace it (to "),
    ("folder", _folder, "it is a folder; give a file name such as"),
]


def _kind(path: Path) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, st.st_size


@pytest.mark.parametrize("make, fragment", [c[1:] for c in NOT_REGULAR], ids=[c[0] for c in NOT_REGULAR])
def test_save_refuses_what_is_not_a_regular_file_before_writing(result, tmp_path, make, fragment):
    path = make(tmp_path)
    before, listing = _kind(path), sorted(os.listdir(path.parent))
    with pytest.raises(ResultFileError, match=re.escape(fragment)) as info:
        result.save(path)
    assert str(path) in str(info.value)
    assert _kind(path) == before and sorted(os.listdir(path.parent)) == listing  # untouched, no temporary file
    if path.is_symlink():
        assert path.resolve().read_bytes() == b"not a result"


def test_save_to_a_missing_path_or_over_a_regular_file_works(result, tmp_path):
    new = result.save(tmp_path / "new.nc")
    assert same_result(load_result(new), result)
    old = tmp_path / "old.nc"
    old.write_bytes(b"an earlier file")
    result.save(old)
    assert same_result(load_result(old), result) and sorted(p.name for p in tmp_path.iterdir()) == ["new.nc", "old.nc"]


# -- fault injection: SIGKILL a save at random moments ------------------------------------

SERVER = r"""
import json, os, signal, sys, time, warnings
warnings.filterwarnings("ignore", category=DeprecationWarning)  # fork() in a process with idle threads
sys.path.insert(0, sys.argv[1])
import numpy as np
from test_result_files import make_result, same_result
from pgpgm.fit_result import _to_tree, load_result

folder, runs = sys.argv[2], json.loads(sys.argv[3])
old, new = make_result(1), make_result(2)


def write(mode, target):
    if mode == "atomic":
        new.save(target)
    else:  # control: write straight into the file, as pgpgm did before
        _to_tree(new).to_netcdf(target, engine="h5netcdf")


report = {}
for mode, trials, seed in runs:
    path = os.path.join(folder, f"{mode}.nc")
    old.save(path)
    good = open(path, "rb").read()
    durations = []
    for _ in range(3):  # the first write pays one-off costs that the forked writers (warm copies) do not
        t0 = time.perf_counter()
        write(mode, path + ".probe")
        durations.append(time.perf_counter() - t0)
        os.remove(path + ".probe")
    duration = min(durations)  # how long a warm write takes here; kills fall in [0, 1.2 x that]
    rng = np.random.default_rng(seed)
    outcomes, killed = [], []
    for trial in range(trials):
        delay = rng.uniform(0.0, 1.2 * duration)
        pid = os.fork()
        if pid == 0:  # the child writes the new result over the old file
            try:
                write(mode, path)
            finally:
                os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        killed.append(os.WIFSIGNALED(status))
        try:
            back = load_result(path, verify=mode == "atomic")  # the in-place control writes no checksum
            outcomes.append("old" if same_result(back, old) else "new" if same_result(back, new) else "wrong")
        except Exception as exc:
            outcomes.append(f"error: {type(exc).__name__}: {str(exc)[:200]}")
        if outcomes[-1] != "old":
            with open(path, "wb") as f:  # put the earlier good file back for the next trial
                f.write(good)
    report[mode] = {"duration": duration, "outcomes": outcomes, "killed": killed,
                    "left": sorted(n for n in os.listdir(folder) if n.startswith("."))}
print(json.dumps(report))
"""


def kill_saves(folder: Path, runs: list[tuple[str, int, int]]) -> dict:
    """Run ``(mode, trials, seed)`` fault-injection runs in one subprocess; its report."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", SERVER, str(HERE), str(folder), json.dumps(runs)],
                         capture_output=True, text=True, timeout=240, env=env, cwd=folder)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 24 saves killed at random moments; CI checks the checksum and truncated files
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fault injection forks the saving process")
def test_a_killed_save_never_damages_the_earlier_file(tmp_path):
    report = kill_saves(tmp_path, [("atomic", 16, 20240601), ("in-place", 8, 7)])
    run = report["atomic"]
    outcomes, killed = run["outcomes"], run["killed"]
    assert len(outcomes) == 16
    assert set(outcomes) <= {"old", "new"}, run  # always a whole file: the earlier one or the new one
    # the kills landed inside the save: most saves were cut short and left the earlier file
    assert sum(killed) >= 8 and outcomes.count("old") >= 6, run
    # a save that finished before the kill left the new result
    assert all(o == "new" for o, k in zip(outcomes, killed) if not k), run
    # a killed save leaves at most its hidden temporary file behind
    assert all(n.startswith(".atomic.nc.") and n.endswith(".tmp") for n in run["left"]), run
    # control: the same kills destroy a file written in place (what save() did before)
    control = report["in-place"]
    assert sum(o not in ("old", "new") for o in control["outcomes"]) >= 2, control


def test_save_load_keeps_non_integer_coefficients_exactly(tmp_path):
    """A coefficient 1/3 came back as 0.333333333333333 when systems were saved as str(expr)."""
    import dataclasses

    import sympy as sp

    system = pgpgm.ODESystem.from_equations(
        {"x1": "theta1*x1/3 - 0.1*theta2*x1*x2", "x2": "-1.2345678901234567*theta3*x2 + abs(theta4)*x1*x2 + pi"},
        ["theta1", "theta2", "theta3", "theta4"], name="lotka-volterra-thirds")
    result = dataclasses.replace(make_result(3), system=system)
    back = load_result(result.save(tmp_path / "thirds.nc"))
    assert back.system.expressions == system.expressions  # identical sympy trees
    assert sp.Rational(1, 3) in back.system.expressions[0].atoms(sp.Rational)
    x, th = np.array([1.7, 0.3]), np.array([1.1, 2.2, 3.3, -4.4])
    np.testing.assert_array_equal(back.system.rhs(0.0, x, th), system.rhs(0.0, x, th))

"""CLI errors: one line on stderr, exit 2 for usage and input errors, 1 for a failed fit,
every CSV row checked, output paths checked before the fit."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pgpgm
from pgpgm.cli import main, read_tidy_csv

DECAY = 'name = "decay"\nparameters = ["k", "j"]\n[equations]\na = "-k*a"\nb = "k*a - j*b"\n'
BOOM = 'name = "boom"\nparameters = ["k", "j"]\n[equations]\na = "k*a*a"\nb = "a - j*b"\n'  # blows up for k*a0*t > 1
TINY = ["--draws", "20", "--tune", "20", "--chains", "1", "--posterior", "none", "--no-progress"]
T = np.linspace(0.0, 4.0, 12)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "decay.toml").write_text(DECAY)
    (tmp_path / "boom.toml").write_text(BOOM)
    b = 2.0 * 0.8 / (0.3 - 0.8) * (np.exp(-0.8 * T) - np.exp(-0.3 * T))  # analytic b of the decay chain
    lines = ["time,state,value"] + [f"{float(t)!r},b,{float(v)!r}" for t, v in zip(T, b)]
    (tmp_path / "good.csv").write_text("\n".join(lines) + "\n")
    return tmp_path, lines


def _csv(tmp_path, lines, name="d.csv"):
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return str(tmp_path / name)


def _fit_args(tmp_path, data, *extra):
    return ["fit", "--model", str(tmp_path / "decay.toml"), "--data", data, "--x0", "a=2", *TINY, *extra]


@pytest.fixture
def no_fit(monkeypatch):
    """Makes pgpgm.fit fail loudly: an error reported with exit 2 was found before the fit."""
    def must_not_run(*args, **kwargs):
        raise AssertionError("the fit started before the input was checked")

    monkeypatch.setattr(pgpgm, "fit", must_not_run)


# (id, how the CSV lines are changed, message fragment); line numbers are the file's (header = 1)
CSV_CASES = [
    ("empty value", lambda L: L[:4] + [f"{float(T[3])!r},b,"] + L[5:], "line 5: the value of state b is missing"),
    ("nan value", lambda L: L[:4] + [f"{float(T[3])!r},b,nan"] + L[5:], "line 5: the value of state b is missing"),
    ("inf value", lambda L: L[:4] + [f"{float(T[3])!r},b,inf"] + L[5:], "line 5: the value of state b is not a finite"),
    ("text value", lambda L: L[:3] + [f"{float(T[2])!r},b,abc"] + L[4:], "line 4: the value of state b is not a finite "
     "number ('abc')"),
    ("empty time", lambda L: L[:3] + [",b,1.0"] + L[4:], "line 4: the time of state b is missing"),
    ("two different values", lambda L: L + [f"{float(T[2])!r},b,99"], "lines 4 and 14: two different values"),
    ("unknown state", lambda L: L + [f"{float(T[2])!r},zz,1"], "line 14: state 'zz' is not a state of the model"),
    ("too few points", lambda L: L + [f"{float(T[2])!r},a,1", f"{float(T[5])!r},a,1"],
     "observed state a has 2 measurement(s); each observed state needs at least 3"),
    ("missing column", lambda L: ["time,value"] + [r.rsplit(",", 2)[0] + "," + r.rsplit(",", 1)[1] for r in L[1:]],
     "missing columns ['state']"),
    ("short row", lambda L: L + ["1.0,b"], "line 14: 2 fields, the header has 3"),
    ("header only", lambda L: L[:1], "no data rows"),
    ("empty file", lambda L: [], "the file is empty"),
    ("empty state", lambda L: L + [f"{float(T[2])!r},,1"], "line 14: the state is empty"),
]


@pytest.mark.parametrize("change, fragment", [c[1:] for c in CSV_CASES], ids=[c[0] for c in CSV_CASES])
def test_bad_csv_rows_are_named(files, no_fit, capsys, change, fragment):
    tmp_path, lines = files
    assert main(_fit_args(tmp_path, _csv(tmp_path, change(lines)))) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert err.count("\n") == 1 and err.startswith("pgpgm: error: ")


def test_binary_csv(files, no_fit, capsys):
    tmp_path, _ = files
    (tmp_path / "bin.csv").write_bytes(bytes(range(256)) * 8)
    assert main(_fit_args(tmp_path, str(tmp_path / "bin.csv"))) == 2
    assert "binary content" in capsys.readouterr().err


def test_tidy_csv_is_read_exactly(files):
    """The reference for the refusals: values by (time, state), sorted times, identical repeats once."""
    tmp_path, lines = files
    shuffled = [lines[0], *lines[1:][::-1], lines[3]]  # reversed rows and one identical repeat
    data = read_tidy_csv(tmp_path / _csv(tmp_path, shuffled), ("a", "b"))
    np.testing.assert_array_equal(data["time"], T)
    np.testing.assert_array_equal(data["b"], [float(r.split(",")[2]) for r in lines[1:]])
    assert set(data) == {"time", "b"}


# (id, extra arguments, message fragment); all found before the fit
ARG_CASES = [
    ("x0 not a number", ["--x0", "a=notanumber"], "--x0 'a=notanumber': 'notanumber' is not a number"),
    ("x0 without =", ["--x0", "a"], "expected STATE=VALUE"),
    ("x0 unknown state", ["--x0", "q=1"], "'q' is not a state of the model"),
    ("x0 inf", ["--x0", "a=inf"], "must be finite"),
    ("x0 range reversed", ["--x0", "a=5:1"], "LOW:HIGH with LOW < HIGH"),
    ("fixed unknown parameter", ["--fixed", "zz=1"], "--fixed 'zz=1': expected PARAMETER=VALUE with a parameter"),
    ("fixed not a number", ["--fixed", "k=abc"], "--fixed 'k=abc': 'abc' is not a number"),
    ("bounds reversed", ["--bounds", "5", "1"], "LOWER must be less than UPPER"),
    ("draws negative", ["--draws", "-3"], "argument --draws: -3 must be >= 1"),
    ("draws not whole", ["--draws", "2.5"], "argument --draws: '2.5' is not a whole number"),
    ("seed negative", ["--seed", "-1"], "argument --seed"),
    ("gamma inf", ["--gamma", "inf"], "argument --gamma: inf must be finite"),
    ("unknown option", ["--bogus"], "unrecognized arguments: --bogus"),
    ("posterior choice", ["--posterior", "mcmc"], "argument --posterior: invalid choice"),
    ("kernel unknown", ["--kernel", "gauss"], "unknown kernel 'gauss'"),
    ("observe unknown state", ["--observe", "zz"], "unknown state(s) ['zz'] in observed; the states of decay"),
]


@pytest.mark.parametrize("extra, fragment", [c[1:] for c in ARG_CASES], ids=[c[0] for c in ARG_CASES])
def test_bad_arguments(files, monkeypatch, capsys, extra, fragment):
    tmp_path, _ = files
    if "kernel" not in fragment and "in observed" not in fragment:  # these two are found by fit's own checks
        monkeypatch.setattr(pgpgm, "fit", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fit ran")))
    assert main(_fit_args(tmp_path, str(tmp_path / "good.csv"), *extra)) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_output_paths_are_checked_before_the_fit(files, no_fit, capsys):
    tmp_path, _ = files
    (tmp_path / "afile").write_text("x")
    good = str(tmp_path / "good.csv")
    assert main(_fit_args(tmp_path, good, "--out", str(tmp_path / "afile"))) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(_fit_args(tmp_path, good, "--out", str(tmp_path / "afile" / "sub"))) == 2
    assert "cannot be created" in capsys.readouterr().err
    assert main(["sensitivity", "lotka-volterra", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(_fit_args(tmp_path, good, "--out", str(locked / "out"))) == 2
        assert "not writable" in capsys.readouterr().err


def test_missing_files_and_bad_toml(files, capsys):
    tmp_path, _ = files
    assert main(_fit_args(tmp_path, str(tmp_path / "none.csv"))) == 2
    assert "--data" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text("name = [unclosed\n")
    assert main(["fit", "--model", str(tmp_path / "bad.toml"), "--data", str(tmp_path / "good.csv"), *TINY]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert main(["fit", "--model", str(tmp_path / "none.toml"), "--data", str(tmp_path / "good.csv"), *TINY]) == 2
    assert "no model file" in capsys.readouterr().err
    assert main(["run", "lotka-volterra", "--case", "zz"]) == 2
    assert "has no case 'zz'" in capsys.readouterr().err


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pgpgm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_argparse_errors_are_one_line_with_exit_2():
    """Before: argparse printed the usage and the error (two or more lines); now one line, exit 2."""
    for args, fragment in [((), "the following arguments are required: command"),
                           (("bogus",), "invalid choice: 'bogus'"),
                           (("fit", "--data", "x.csv"), "the following arguments are required: --model")]:
        proc = _cli(*args)
        assert proc.returncode == 2, proc
        assert proc.stderr.count("\n") == 1 and fragment in proc.stderr and "Traceback" not in proc.stderr


def test_a_failed_fit_exits_1_with_one_line_and_a_traceback_only_when_debugging(files):
    """The blow-up model makes every start of the fit fail: exit 1, one error line; with
    PGPGM_DEBUG=1 (or --debug) the traceback precedes it."""
    tmp_path, _ = files
    args = ["fit", "--model", str(tmp_path / "boom.toml"), "--data", str(tmp_path / "good.csv"), "--x0", "a=2",
            "--bounds", "1", "5", *TINY, "--out", str(tmp_path / "out")]
    proc = _cli(*args)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pgpgm: error:")]
    assert len(errors) == 1 and "the fit failed" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    debug = _cli(*args, env={"PGPGM_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == errors[0]


def test_input_error_through_a_subprocess(files):
    tmp_path, lines = files
    data = _csv(tmp_path, lines[:4] + [f"{float(T[3])!r},b,nan"] + lines[5:])
    proc = _cli(*_fit_args(tmp_path, data))
    assert proc.returncode == 2
    assert proc.stderr == f"pgpgm: error: {data} line 5: the value of state b is missing; every row needs a finite " \
                          "value (remove the row, and that time for every observed state)\n"
    assert "Traceback" in _cli("--debug", *_fit_args(tmp_path, data)).stderr


def test_a_reader_that_closes_the_pipe_is_not_an_error():
    """``pgpgm list | head -1``: before, the closed pipe came out as "pgpgm: error: [Errno 32]
    Broken pipe" with exit 2; now the command ends quietly with 0. The read end is closed before
    the subprocess writes (it writes after importing pgpgm's model loader), so its write fails."""
    proc = subprocess.Popen([sys.executable, "-m", "pgpgm.cli", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, stderr
    assert stderr == ""


@pytest.mark.parametrize("given, expected", [("12.5", pgpgm.PosteriorBudget(12.5, None)), ("none", pgpgm.PosteriorBudget(None, None)),
                                             (None, pgpgm.PosteriorBudget())])
def test_posterior_budget_option_reaches_the_fit(files, capture_call, given, expected):
    """``--posterior-budget SECONDS|none`` reaches :func:`pgpgm.fit` as ``posterior=pgpgm.NUTS(budget=...)``
    (absent: NUTS's default budget)."""
    tmp_path, _ = files
    seen = capture_call(pgpgm, "fit")
    extra = ["--posterior", "nuts"] + ([] if given is None else ["--posterior-budget", given])
    with pytest.raises(capture_call.stop):
        main(_fit_args(tmp_path, str(tmp_path / "good.csv"), *extra))
    assert not {"posterior_budget", "posterior_draws", "nuts_sampler"} & set(seen)  # one way to set step 4
    assert isinstance(seen["posterior"], pgpgm.NUTS) and seen["posterior"].budget == expected


@pytest.mark.parametrize("given, expected", [("0.02", 0.02), ("none", None), (None, "default")])
def test_posterior_sd_error_option_reaches_the_fit_as_a_nuts_spec(files, capture_call, given, expected):
    """``--posterior-sd-error FRACTION|none`` reaches :func:`pgpgm.fit` as ``pgpgm.NUTS(sd_error=...)`` with every
    other ``--posterior-*`` option and fit's default budget (absent: NUTS's default goal)."""
    tmp_path, _ = files
    seen = capture_call(pgpgm, "fit")
    extra = ["--posterior", "nuts", "--posterior-draws", "300", "--posterior-chains", "2"] + ([] if given is None else
                                                                      ["--posterior-sd-error", given])
    with pytest.raises(capture_call.stop):
        main(_fit_args(tmp_path, str(tmp_path / "good.csv"), *extra))
    spec = seen["posterior"]
    assert isinstance(spec, pgpgm.NUTS) and spec.sd_error == (pgpgm.NUTS().sd_error if expected == "default" else expected)
    assert (spec.draws, spec.chains, spec.budget) == (300, 2, pgpgm.PosteriorBudget())


@pytest.mark.parametrize("bad", [["--posterior-sd-error", "0"], ["--posterior-sd-error", "1.5"],
                                 ["--posterior-sd-error", "five"],
                                 ["--posterior-sd-error", "0.05", "--posterior", "laplace"]])
def test_a_bad_posterior_sd_error_is_a_usage_error(files, no_fit, capsys, bad):
    tmp_path, _ = files
    assert main(_fit_args(tmp_path, str(tmp_path / "good.csv"), *bad)) == 2
    assert "--posterior-sd-error" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-3", "soon", "inf"])
def test_a_bad_posterior_budget_is_a_usage_error(files, no_fit, capsys, bad):
    tmp_path, _ = files
    assert main(_fit_args(tmp_path, str(tmp_path / "good.csv"), "--posterior-budget", bad)) == 2
    assert "--posterior-budget" in capsys.readouterr().err

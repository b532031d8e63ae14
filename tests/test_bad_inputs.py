"""Bad inputs to the Python API get a pgpgm error naming the input, before any compiled code runs.

Table-driven: each row is an input, the expected exception class and a fragment of its
message. Inputs that crashed the interpreter run in a subprocess with a timeout.
"""

import datetime
import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pandas as pd
import pymc as pm
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pgpgm
from pgpgm.checks import check_count, noise_levels
from pgpgm.data import as_observations, initial_values
from pgpgm.matching.density import GradientMatchingDensity
from pgpgm.errors import DataError, ModelDefinitionError, PgpgmError

T = np.linspace(0.0, 2.0, 20)
Y = np.random.default_rng(0).normal(3.0, 1.0, 20)
Y1 = np.random.default_rng(1).normal(5.0, 1.0, 20)


def _with(**changes):
    """The good dict {"time", "x2"} with some entries replaced (None removes one)."""
    d = {"time": T, "x2": Y}
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None}


# (id, data, observed, exception, message fragment)
DATA_CASES = [
    ("values (20, 2) for one state", _with(x2=np.ones((20, 2))), ["x2"], DataError,
     "values of observed state x2 must be 1-D"),
    ("values (20, 1) for one state", _with(x2=Y[:, None]), ["x2"], DataError, "got shape (20, 1)"),
    ("scalar values", _with(x2=3.0), ["x2"], DataError, "must be 1-D"),
    ("text in a numeric column", pd.DataFrame({"time": T, "x2": ["a"] + [1.0] * 19}), ["x2"], DataError,
     "row 0 is the text 'a'"),
    ("text array", _with(x2=np.array(["1"] * 19 + ["a"])), ["x2"], DataError, "row 19 is the text 'a'"),
    ("the whole column is a string", _with(x2="1,2,3"), ["x2"], DataError, "must be numbers, got the text"),
    ("bytes column", _with(x2=np.array([b"x"] * 20)), ["x2"], DataError, "row 0 is the text b'x'"),
    ("a dict as a column", _with(x2={"a": 1}), ["x2"], DataError, "got a dict"),
    ("booleans", _with(x2=np.ones(20, bool)), ["x2"], DataError, "are booleans"),
    ("object array with a boolean", _with(x2=np.array([1.0] * 19 + [True], dtype=object)), ["x2"], DataError,
     "row 19 is a boolean"),
    ("datetime times", _with(time=pd.date_range("2020-01-01", periods=20, freq="h")), ["x2"], DataError,
     "datetimes or timedeltas"),
    ("datetime objects as times", _with(time=[datetime.datetime(2020, 1, 1, h) for h in range(20)]), ["x2"],
     DataError, "is a date/time"),
    ("timedelta values", _with(x2=pd.to_timedelta(np.arange(20), "s")), ["x2"], DataError, "timedeltas"),
    ("complex values", _with(x2=Y + 1j), ["x2"], DataError, "complex numbers"),
    ("complex object", _with(x2=np.array([1.0] * 19 + [1j], dtype=object)), ["x2"], DataError, "complex number"),
    ("object array of None", _with(x2=np.array([1.0] * 19 + [None], dtype=object)), ["x2"], DataError,
     "row 19 is missing"),
    ("pandas missing value", pd.DataFrame({"time": T, "x2": pd.array([1] * 19 + [None], dtype="Int64")}),
     ["x2"], DataError, "row 19 is missing"),
    ("object array of dicts", _with(x2=np.array([{}] * 20, dtype=object)), ["x2"], DataError, "not a number"),
    ("ragged values", _with(x2=[[1.0, 2.0], [3.0]] * 10), ["x2"], DataError, "rectangular array"),
    ("structured array", _with(x2=np.zeros(20, dtype=[("a", float)])), ["x2"], DataError, "structured"),
    ("two measurements, NaN elsewhere", _with(x2=np.r_[Y[:2], np.full(18, np.nan)]), ["x2"], DataError,
     "observed state x2 has 2 measurement(s); each observed state needs at least 3"),
    ("one state with too few points", _with(x1=np.r_[np.full(19, np.nan), 1.0]), ["x1", "x2"], DataError,
     "observed state x1 has 1 measurement(s)"),
    ("long table: too few points", pd.DataFrame({"time": [0.0, 1, 2, 0, 1], "state": ["x2"] * 3 + ["x1"] * 2,
                                                 "value": [1.0, 2, 3, 4, 5]}), None, DataError,
     "observed state x1 has 2 measurement(s)"),
    ("long table: repeated time", pd.DataFrame({"time": [0.0, 1, 1, 2], "state": ["x2"] * 4,
                                                "value": [1.0, 2, 3, 4]}), None, DataError,
     "state x2 has several values at time(s) [1.0]"),
    ("long table: extra column", pd.DataFrame({"time": [0.0, 1, 2], "state": ["x2"] * 3, "value": [1.0, 2, 3],
                                               "unit": ["mM"] * 3}), None, DataError,
     "time, state, value only; it also has ['unit']"),
    ("inf value", _with(x2=np.r_[np.inf, Y[1:]]), ["x2"], DataError, "contain inf at rows 0"),
    ("NaN time", _with(time=np.r_[T[:19], np.nan]), ["x2"], DataError, "NaN or inf (rows 19)"),
    ("times 2-D", _with(time=T[:, None]), ["x2"], DataError, "'time' column must be a 1-D array"),
    ("times scalar", _with(time=1.0), ["x2"], DataError, "'time' column must be a 1-D array"),
    ("two times", _with(time=T[:2], x2=Y[:2]), ["x2"], DataError, "x2 has 2 measurement(s)"),
    ("unsorted times", _with(time=T[::-1]), ["x2"], DataError, "sorted in increasing order"),
    ("duplicate times", _with(time=np.r_[T[:10], T[9:19]]), ["x2"], DataError, "duplicates"),
    ("fewer values than times", _with(x2=Y[:15]), ["x2"], DataError, "have 15 rows but there are 20 times"),
    ("more values than times", _with(x2=np.r_[Y, Y]), ["x2"], DataError, "have 40 rows but there are 20 times"),
    ("lengths differ between states", _with(x1=Y1[:19]), ["x1", "x2"], DataError, "x1 have 19 rows"),
    ("Dataset without y", "dataset-without-y", None, DataError, "has no variable 'y'"),
    ("DataFrame without time", pd.DataFrame({"t": T, "x2": Y}), ["x2"], DataError, "no 'time' column"),
    ("dict without time", {"x2": Y}, ["x2"], DataError, "no 'time' column"),
    ("a list as data", [T, Y], ["x2"], DataError, "got list"),
    ("a numpy array as data", np.c_[T, Y], ["x2"], DataError, "got ndarray"),
    ("repeated DataFrame columns", pd.DataFrame(np.c_[T, Y, Y], columns=["time", "x2", "x2"]), ["x2"], DataError,
     "repeated columns ['x2']"),
    ("non-text column name", {"time": T, 3: Y}, ["x2"], DataError, "column names must be state names"),
    ("column of an unknown state", _with(z=Y), ["x2"], DataError, "data columns ['z'] are not states"),
    ("observed: unknown state as a string", _with(), "zz", ModelDefinitionError, "unknown state(s) ['zz'] in observed"),
    ("observed: a string of several states", _with(), "x1x2", ModelDefinitionError, "unknown state(s) ['x1x2']"),
    ("observed: state without data", _with(), ["x1"], DataError, "observed states ['x1'] have no data"),
    ("observed: empty list", _with(), [], DataError, "no observed state"),
    ("observed: repeated", _with(), ["x2", "x2"], DataError, "repeated"),
    ("observed: a number", _with(), 3, DataError, "must be a state name or a list"),
    ("values of scale 1e200", _with(x2=Y * 1e200), ["x2"], DataError,
     "values of observed state x2 reach 4.3e+200; pgpgm computes with their squares in 64-bit floats, which overflow "
     "beyond about 1e154: rescale them (e.g. divide by 1e+201"),
    ("values of scale 1e300", _with(x2=Y * 1e300), ["x2"], DataError, "values of observed state x2 reach 4.3e+300"),
    ("values of scale 1e-300", _with(x2=Y * 1e-300), ["x2"], DataError,
     "values of observed state x2 vary by only 3.63e-300; pgpgm computes with squares of their differences"),
    ("times up to 2e300", _with(time=T * 1e300), ["x2"], DataError,
     "the 'time' column reach 2e+300; pgpgm computes with their squares"),
    ("times within 1e-120", _with(time=T * 1e-120), ["x2"], DataError,
     "the 'time' column vary by only 2e-120; pgpgm computes with squares of their differences"),
    ("observed: list of numbers", _with(), [1], DataError, "must be state names (text)"),
]


@pytest.mark.parametrize("data, observed, exc, fragment", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_a_named_data_error(lv, data, observed, exc, fragment):
    if isinstance(data, str) and data == "dataset-without-y":
        data = pgpgm.simulate(lv.system, [2, 1, 4, 1], [5, 3], T, noise_sd=0.1, seed=0).drop_vars("y")
    with pytest.raises(exc) as info:
        as_observations(data, observed, lv.system)
    assert fragment in str(info.value)


def test_good_data_are_read_exactly(lv):
    """The accepted forms give the same float64 arrays (a reference for the refusals above)."""
    ds = pgpgm.simulate(lv.system, [2, 1, 4, 1], [5, 3], T, noise_sd=0.1, seed=0)
    forms = [ds, {"time": T, "x1": ds.y.values[:, 0], "x2": ds.y.values[:, 1]},
             pd.DataFrame({"time": T, "x1": ds.y.values[:, 0], "x2": ds.y.values[:, 1]}),
             {"time": list(T), "x1": ds.y.values[:, 0].astype(object), "x2": [str(v) for v in ds.y.values[:, 1]]}]
    for data in forms:
        obs = as_observations(data, None, lv.system)
        assert obs.states == ("x1", "x2")
        assert obs.values.dtype == np.float64 and obs.values.shape == (20, 2)
        np.testing.assert_array_equal(obs.times, T)
        np.testing.assert_array_equal(obs.values, ds.y.values)
    obs = as_observations({"time": np.arange(5), "x2": np.arange(5, dtype=np.int32)}, "x2", lv.system)
    np.testing.assert_array_equal(obs.values[:, 0], [0.0, 1.0, 2.0, 3.0, 4.0])


# (id, x0, exception, fragment); x2 observed, x1 latent
X0_CASES = [
    ("wrong length", [1.0], DataError, "x0 must have 2 values"),
    ("too long", [1.0, 2.0, 3.0], DataError, "x0 must have 2 values"),
    ("NaN for the latent state", {"x1": np.nan}, DataError, "latent states ['x1'] are required"),
    ("NaN in the vector at the latent state", [np.nan, 1.0], DataError, "latent states ['x1'] are required"),
    ("inf", {"x1": np.inf}, DataError, "latent states ['x1'] are required"),
    ("missing", {}, DataError, "latent states ['x1'] are required"),
    ("unknown state", {"x1": 1.0, "q": 1.0}, DataError, "unknown states ['q']"),
    ("text value", {"x1": "a"}, DataError, "x0[x1] must be numbers"),
    ("vector value", {"x1": [1.0, 2.0]}, DataError, "x0[x1] must be one number"),
    ("complex", {"x1": 1j}, DataError, "x0[x1] are complex"),
    ("text vector", "12", DataError, "x0 must be numbers"),
]


@pytest.mark.parametrize("x0, exc, fragment", [c[1:] for c in X0_CASES], ids=[c[0] for c in X0_CASES])
def test_bad_x0(lv, x0, exc, fragment):
    with pytest.raises(exc) as info:
        initial_values(lv.system, None, x0, [1])
    assert fragment in str(info.value)


def test_good_x0(lv):
    np.testing.assert_array_equal(initial_values(lv.system, None, {"x1": 4}, [1]), [4.0, np.nan])
    np.testing.assert_array_equal(initial_values(lv.system, None, [4, 7], [1]), [4.0, np.nan])


NOISE_CASES = [(-0.1, "positive"), (0.0, "positive"), (np.nan, "positive"), (np.inf, "positive"),
               (1e200, "noise_sd 1e+200 is outside [1e-100, 1e+100]; pgpgm computes with noise variances"),
               ([0.1, 1e-200], "noise_sd [0.1, 1e-200] is outside [1e-100, 1e+100]"),
               ([0.1, 0.2, 0.3], "one number or 2"), ("x", "noise_sd must be numbers"), (np.ones((2, 1)), "shape")]


@pytest.mark.parametrize("noise_sd, fragment", NOISE_CASES)
def test_bad_noise_sd(noise_sd, fragment):
    with pytest.raises(DataError, match=None) as info:
        noise_levels(noise_sd, 2)
    assert fragment in str(info.value)


COUNT_CASES = [(2.5, "whole number"), (-1, ">= 0"), (True, "whole number"), ("3", "whole number"), (None, "whole")]


@pytest.mark.parametrize("value, fragment", COUNT_CASES)
def test_bad_counts(value, fragment):
    with pytest.raises(DataError) as info:
        check_count(value, "draws", minimum=0)
    assert "draws" in str(info.value) and fragment in str(info.value)
    assert check_count(np.int64(7), "draws") == 7 and check_count(20.0, "draws") == 20


# fit's argument checks: (id, keyword overrides, exception, fragment); every one is raised
# before any GP fit or compiled code (the whole table runs in a few seconds)
FIT_CASES = [
    ("negative noise_sd", {"noise_sd": -0.1}, DataError, "noise_sd must be positive"),
    ("NaN noise_sd", {"noise_sd": np.nan}, DataError, "noise_sd must be positive"),
    ("noise_sd 1e200", {"noise_sd": 1e200}, DataError, "noise_sd 1e+200 is outside [1e-100, 1e+100]"),
    ("data of scale 1e250", {"data": _with(x2=Y * 1e250)}, DataError, "values of observed state x2 reach"),
    ("data of scale 1e-300", {"data": _with(x2=Y * 1e-300)}, DataError, "values of observed state x2 vary by only"),
    ("times up to 2e300", {"data": _with(time=T * 1e300)}, DataError, "the 'time' column reach 2e+300"),
    ("gamma inf", {"gamma": np.inf}, DataError, "gamma must be one finite, non-negative number"),
    ("gamma negative", {"gamma": -1.0}, DataError, "gamma"),
    ("gamma text", {"gamma": "big"}, DataError, "gamma must be numbers"),
    ("draws non-integer", {"draws": 2.5}, DataError, "draws must be a whole number"),
    ("draws zero", {"draws": 0}, DataError, "draws must be >= 1"),
    ("tune negative", {"tune": -5}, DataError, "tune must be >= 0"),
    ("chains text", {"chains": "2"}, DataError, "chains must be a whole number"),
    ("chains bool", {"chains": True}, DataError, "chains must be a whole number"),
    ("seed negative", {"seed": -1}, DataError, "seed must be >= 0"),
    ("seed float", {"seed": 0.5}, DataError, "seed must be a whole number"),
    ("posterior unknown", {"posterior": "mcmc"}, DataError, "posterior must be 'nuts', 'laplace', None"),
    ("NUTS chains zero", {"posterior": pgpgm.NUTS}, {"chains": 0}, "NUTS chains must be >= 1"),
    ("NUTS rounds zero", {"posterior": pgpgm.NUTS}, {"rounds": 0}, "NUTS rounds must be >= 1"),
    ("NUTS sampler unknown", {"posterior": pgpgm.NUTS}, {"sampler": "stan"}, "NUTS sampler"),
    ("posterior_chains zero, as earlier releases wrote it", {"posterior_chains": 0}, DataError,
     "NUTS chains must be >= 1"),
    ("kernel unknown", {"kernel": "gauss"}, DataError, "unknown kernel 'gauss'"),
    ("priors a string", {"priors": "uniform"}, DataError, "priors must be"),
    ("priors bounds reversed", {"priors": (5.0, 1.0)}, DataError, "lower < upper"),
    ("priors infinite", {"priors": (0.0, np.inf)}, DataError, "finite"),
    ("priors unknown parameter", {"priors": {"zeta": (0, 1)}}, DataError, "unknown parameters ['zeta']"),
    ("priors of one number", {"priors": {"theta1": 3.0}}, DataError, "prior of theta1 must be"),
    ("prior callable returns None", {"priors": {"theta1": lambda name: None}}, DataError,
     "the prior callable of theta1 returned NoneType None; it must create and return one scalar PyMC variable"),
    ("prior callable returns a number", {"priors": {"theta2": lambda name: 3.0}}, DataError,
     "the prior callable of theta2 returned float 3.0"),
    ("prior callable returns a vector", {"priors": {"theta1": lambda name: pm.Normal(name, shape=2)}}, DataError,
     "the prior callable of theta1 returned a variable of shape (2,)"),
    ("prior callable without the name", {"priors": lambda: pm.Normal("a")}, DataError,
     "the prior callable of theta1 failed (TypeError"),
    ("one prior callable for all returns None", {"priors": lambda name: None}, DataError,
     "the prior callable of theta1 returned NoneType None"),
    ("x0 wrong length", {"x0": [1.0]}, DataError, "x0 must have 2 values"),
    ("x0 NaN for the latent state", {"x0": {"x1": np.nan}}, DataError, "latent states ['x1']"),
    ("true_theta wrong length", {"true_theta": [1.0]}, DataError, "true_theta must be 4 finite numbers"),
    ("data (20, 2) for one state", {"data": _with(x2=np.ones((20, 2)))}, DataError, "must be 1-D"),
    ("observed unknown state", {"observed": "x3"}, ModelDefinitionError, "unknown state(s) ['x3'] in observed"),
]


@pytest.mark.parametrize("changes, exc, fragment", [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES])
def test_fit_refuses_bad_arguments_before_any_computation(lv, monkeypatch, changes, exc, fragment):
    import pgpgm.steps.match as pipeline

    def must_not_run(*args, **kwargs):
        raise AssertionError("the GP fit started before the arguments were checked")

    monkeypatch.setattr(pipeline, "fit_gps", must_not_run)
    kwargs = {"data": _with(), "observed": ["x2"], "x0": {"x1": 5.0}, "progressbar": False, **changes}
    with pytest.raises(DataError if isinstance(exc, dict) else exc) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the flat step-4 keywords of earlier releases
        if isinstance(exc, dict):  # an option object's field: refused where the object is built
            kwargs["posterior"] = kwargs["posterior"](**exc)
        pgpgm.fit(lv.system, **kwargs)
    assert fragment in str(info.value)


SIMULATE_CASES = [
    ("theta wrong length", {"theta": [1.0]}, "theta must be 4 finite numbers"),
    ("theta NaN", {"theta": [np.nan, 1, 1, 1]}, "theta must be 4 finite numbers"),
    ("x0 wrong length", {"x0": [1.0, 2.0, 3.0]}, "x0 must be 2 finite numbers"),
    ("x0 text", {"x0": ["a", "b"]}, "x0: row 0 is the text 'a'"),
    ("times 2-D", {"times": T[:, None]}, "times must be a 1-D array"),
    ("times unsorted", {"times": T[::-1]}, "sorted"),
    ("noise_sd negative", {"noise_sd": -1.0}, "noise_sd must be finite and non-negative"),
    ("noise_sd wrong length", {"noise_sd": [0.1, 0.2, 0.3]}, "one number or 2"),
    ("snr inf", {"noise_sd": None, "snr": np.inf}, "snr must be one positive"),
    ("both noise_sd and snr", {"snr": 3.0}, "exactly one of noise_sd or snr"),
    ("seed negative", {"seed": -3}, "seed must be a whole number"),
    ("seed text", {"seed": "1"}, "seed must be a whole number"),
    ("observed empty", {"observed": []}, "non-empty list"),
]


@pytest.mark.parametrize("changes, fragment", [c[1:] for c in SIMULATE_CASES], ids=[c[0] for c in SIMULATE_CASES])
def test_simulate_refuses_bad_arguments(lv, changes, fragment):
    kwargs = {"theta": [2, 1, 4, 1], "x0": [5, 3], "times": T, "noise_sd": 0.1, **changes}
    with pytest.raises(DataError) as info:
        pgpgm.simulate(lv.system, **kwargs)
    assert fragment in str(info.value)


def test_simulate_observed_unknown_state_is_a_model_error(lv):
    with pytest.raises(ModelDefinitionError, match="unknown state name"):
        pgpgm.simulate(lv.system, [2, 1, 4, 1], [5, 3], T, observed="x9", noise_sd=0.1)


def _run_script(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_values_of_two_columns_for_one_state_no_longer_crash_the_interpreter():
    """Issue 13 item 2: a (20, 2) array as one observed state's values made the sampler's
    compiled sweep read past its inputs (before this fix: "IndexError ... corrupted size vs.
    prev_size", exit 134 (SIGABRT), in a subprocess). Now a DataError before any compiled code."""
    proc = _run_script("""
        import numpy as np, pgpgm
        spec = pgpgm.load_model("lotka-volterra")
        t = np.linspace(0, 2, 20)
        values = np.random.default_rng(0).normal(2, 1, (20, 2))
        pgpgm.fit(spec.system, {"time": t, "x2": values}, ["x2"], x0={"x1": 5.0}, draws=20, tune=20, chains=1,
                  posterior=None, progressbar=False)
    """)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])  # a Python exception, not a signal
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pgpgm.errors.DataError: values of observed state x2 must be 1-D")
    assert "got shape (20, 2)" in last


def test_fit_with_seed_none_draws_and_records_a_seed(lv):
    """seed=None (a TypeError inside fit before) means a fresh seed; the seed used is
    recorded, and fitting again with it reproduces the chains exactly."""
    ds = pgpgm.simulate(lv.system, [2, 1, 4, 1], [5, 3], T, noise_sd=0.1, seed=3)
    kwargs = {"draws": 20, "tune": 20, "chains": 1, "posterior": None, "progressbar": False}
    with pytest.warns(Warning):  # 40 iterations do not converge: a ConvergenceWarning is expected
        first = pgpgm.fit(lv.system, ds, seed=None, **kwargs)
    seed = json.loads(first.gradient_matching.attrs["pgpgm_settings"])["seed"]
    assert isinstance(seed, int) and seed >= 0
    with pytest.warns(Warning):
        again = pgpgm.fit(lv.system, ds, seed=seed, **kwargs)
    np.testing.assert_array_equal(first.gradient_matching.posterior["theta1"].values,
                                  again.gradient_matching.posterior["theta1"].values)


# ------------------------------------------------------------------ property-based
_DTYPES = st.sampled_from(["float64", "float32", "int64", "bool", "complex", "object-str", "object-num", "str",
                           "datetime"])


@st.composite
def _columns(draw):
    n = draw(st.integers(0, 9))
    shape = draw(st.sampled_from([(n,), (n,), (n,), (n, 1), (n, 2), ()]))
    vals = draw(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                                   st.floats(-1e3, 1e3)), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    a = np.array(vals, dtype=float).reshape(shape)
    kind = draw(_DTYPES)
    if kind in ("float32", "int64"):
        with np.errstate(all="ignore"):
            a = np.nan_to_num(a, nan=0, posinf=0, neginf=0).clip(-1e6, 1e6).astype(kind)
    elif kind == "bool":
        a = a > 0
    elif kind == "complex":
        a = a + 1j
    elif kind == "object-str":
        a = a.astype(str).astype(object)
    elif kind == "object-num":
        a = a.astype(object)
    elif kind == "str":
        a = a.astype(str)
    elif kind == "datetime":
        a = np.arange(a.size).astype("datetime64[s]").reshape(a.shape)
    return a


@st.composite
def _data(draw):
    """Mostly well-formed tables (so that GP fits are reached), with bad columns mixed in."""
    n = draw(st.integers(0, 12))
    if draw(st.integers(0, 4)):
        t = np.cumsum(draw(st.lists(st.floats(1e-3, 5.0), min_size=n, max_size=n)))
    else:
        t = draw(_columns())
    states = draw(st.lists(st.sampled_from(["x1", "x2"]), min_size=1, max_size=2, unique=True))
    if draw(st.integers(0, 9)) == 0:
        states.append("z")
    d = {"time": t}
    for s in states:
        if draw(st.integers(0, 2)):
            d[s] = np.array(draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n)))
        else:
            d[s] = draw(_columns())
    if draw(st.booleans()):
        try:
            return pd.DataFrame({k: list(v) if np.ndim(v) == 1 else v for k, v in d.items()})
        except (ValueError, TypeError):  # pandas refuses the shapes; the dict is the input then
            return d
    return d


@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(data=_data(), observed=st.sampled_from([None, None, None, "x1", "x2", ["x1", "x2"], "x3"]))
def test_random_data_give_a_pgpgm_error_or_a_valid_density(lv, data, observed):
    """Only pgpgm errors or a valid density for any data shape, value or dtype (no latent
    state when both are observed; x0 given for the latent one otherwise)."""
    try:
        d = pgpgm.gradient_matching_density(lv.system, data, observed, x0={"x1": 5.0, "x2": 3.0}, gp_starts=1)
    except PgpgmError as exc:
        event(f"{type(exc).__name__}: {str(exc)[:30]}")
        return
    event("a valid density")
    assert isinstance(d, GradientMatchingDensity)
    N, M = d.obs.values.shape
    assert N == d.obs.times.size >= 3 and M == len(d.obs.states) >= 1
    assert np.all(np.isfinite(d.obs.values)) and np.all(np.diff(d.obs.times) > 0)
    assert all(k.grad_precision.shape == (N, N) and np.all(np.isfinite(k.grad_precision)) for k in d.terms)


# ------------------------------------------------------------------ a step budget too small
# (solver class, fragment): issue 33, CVODE(max_steps=1) failed blaming the start, the equations or x0
MAX_STEPS_CASES = [
    (pgpgm.CVODE, "it took more than max_steps=1 internal steps between two output times: raise the solver's "
                  "max_steps (e.g. pgpgm.CVODE(max_steps=20000))"),
    (pgpgm.SksundaeCVODE, "more than max_steps=1 internal steps between two output times: raise the solver's max_steps"),
]


@pytest.mark.parametrize("solver, fragment", MAX_STEPS_CASES, ids=[c[0].name for c in MAX_STEPS_CASES])
def test_a_too_small_step_budget_names_max_steps(lv, solver, fragment):
    if not solver.available():
        pytest.skip(f"{solver.name} is not available here")
    integrator = pgpgm.Integrator(lv.system, T, solver(max_steps=1))
    with pytest.raises(pgpgm.ODESolveError) as info:
        integrator.solve([2, 1, 4, 1], [5, 3])
    assert fragment in str(info.value)
    np.testing.assert_allclose(pgpgm.Integrator(lv.system, T, solver()).solve([2, 1, 4, 1], [5, 3])[0], [5, 3])


def test_a_fit_with_a_too_small_step_budget_names_max_steps(lv):
    """The start of step 2 fails in the latent-state solve: the error says why (max_steps)."""
    ds = pgpgm.simulate(lv.system, [2, 1, 4, 1], [5, 3], T, noise_sd=0.1, seed=0, observed=["x2"])
    with pytest.raises(pgpgm.SamplingError) as info:
        pgpgm.fit(lv.system, ds, ["x2"], draws=20, tune=20, chains=1, posterior=None, progressbar=False,
                  solver=pgpgm.CVODE(max_steps=1))
    assert "the latent-state solve fails there" in str(info.value)
    assert "it took more than max_steps=1 internal steps" in str(info.value)

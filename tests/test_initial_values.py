"""Initial values are held where and when the user says: ``x0`` holds every number it gives, an observed
state's too, at the start ``t0`` (issues 71 and 76). References: closed-form solutions fitted by scipy."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

import pgpgm
from pgpgm.errors import DataError, StartTimeWarning

FAST = dict(draws=300, tune=200, posterior=None, progressbar=False, seed=0)

DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
T = np.linspace(0.0, 4.0, 25)
Y = 2.0 * np.exp(-0.5 * T) + 0.05 * np.random.default_rng(3).standard_normal(T.size)


def _closed_form_fit(model, start, t=T, y=Y) -> np.ndarray:
    """Gaussian maximum likelihood of ``model(p, t)`` against the data ``y`` by scipy (tight tolerances)."""
    return optimize.least_squares(lambda p: model(p, t) - y, start, xtol=1e-14, ftol=1e-14, gtol=1e-14).x


def test_a_known_initial_value_of_an_observed_state_is_held():
    """``x0={"x": 1.7}`` for the measured x holds x(0) = 1.7 (before: silently dropped and estimated): k is
    scipy's fit of 1.7 exp(-k t); left out, x(0) is estimated with k as scipy's fit of x0 exp(-k t)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        held = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0={"x": 1.7}, priors=(0.0, 5.0), **FAST)
        free = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], priors=(0.0, 5.0), **FAST)
    assert held.x0["x"] == 1.7
    k_held = _closed_form_fit(lambda p, t: 1.7 * np.exp(-p[0] * t), [0.5])
    np.testing.assert_allclose(held.theta, k_held, rtol=1e-5)
    k_free, x0_free = _closed_form_fit(lambda p, t: p[1] * np.exp(-p[0] * t), [0.5, 1.0])
    np.testing.assert_allclose([free.theta[0], free.x0["x"]], [k_free, x0_free], rtol=1e-5)
    assert abs(free.x0["x"] - 1.7) > 0.1  # the data alone put x(0) elsewhere: the held value was used


def test_a_vector_x0_holds_its_numbers_and_estimates_its_nans():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        held = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0=[1.7], priors=(0.0, 5.0), **FAST)
        free = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0=[np.nan], priors=(0.0, 5.0), **FAST)
    assert held.x0["x"] == 1.7 and free.x0["x"] != 1.7
    with pytest.raises(DataError, match="x0 must have 1 values"):
        pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0=[1.0, 2.0], **FAST)


def test_x0_observed_of_earlier_releases_warns_and_holds_the_same_value():
    with pytest.warns(DeprecationWarning, match=r"give the observed states' known initial values in x0 \(x0=\{\.\.\., 'x': 1.7\}\)"):
        old = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0_observed={"x": 1.7}, priors=(0.0, 5.0), **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new = pgpgm.fit(DECAY, {"time": T, "x": Y}, ["x"], x0={"x": 1.7}, priors=(0.0, 5.0), **FAST)
    assert old.x0["x"] == new.x0["x"] == 1.7 and old.nll == new.nll


PK = pgpgm.load_model("pk-oral")
THETA = PK.case().theta  # ka, ke, CL
DOSE = 4.5
SAMPLES = np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])


def _concentration(p, t):
    """C(t) of pk-oral after the dose DOSE at t = 0 (the model file's closed form)."""
    ka, ke, cl = p
    return DOSE * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


@pytest.fixture(scope="module")
def oral():
    c = _concentration(THETA, SAMPLES) * np.exp(0.05 * np.random.default_rng(1).standard_normal(SAMPLES.size))
    return {"time": SAMPLES, "C": c}


def test_known_initial_values_apply_at_t0_before_the_first_sample(oral):
    """An oral dose at t = 0, first sample at 0.25 h: with ``t0=0.0`` the fit is scipy's fit of the closed form
    from t = 0 (before: the dose was applied at 0.25 h, CL 0.0605 against the true 0.04); without it a
    StartTimeWarning says where the values were applied."""
    kw = dict(x0={"A": DOSE, "C": 0.0}, priors=PK.priors(), **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(PK.system, oral, ["C"], t0=0.0, **kw)
    ref = _closed_form_fit(_concentration, THETA, SAMPLES, oral["C"])
    np.testing.assert_allclose(r.theta, ref, rtol=1e-4)
    assert r.x0["C"] == 0.0 and r.x0["A"] == DOSE
    with pytest.warns(StartTimeWarning, match="hold at t0 = 0.25, the first measured time"):
        late = pgpgm.fit(PK.system, oral, ["C"], **kw)
    # applied at the first sample, 0.25 h: scipy's fit of the closed form delayed by 0.25 h, another optimum
    ref_late = _closed_form_fit(lambda p, t: _concentration(p, t - 0.25), THETA, SAMPLES, oral["C"])
    np.testing.assert_allclose(late.theta, ref_late, rtol=1e-4)
    assert np.max(np.abs(ref_late / ref - 1)) > 0.03


def test_a_start_after_the_first_measurement_is_refused(oral):
    with pytest.raises(DataError, match="t0 = 1 is after the first measured time 0.25"):
        pgpgm.fit(PK.system, oral, ["C"], x0={"A": DOSE, "C": 0.0}, t0=1.0, **FAST)
    with pytest.raises(DataError, match="t0 must be numbers, got the text 'zero'"):
        pgpgm.fit(PK.system, oral, ["C"], x0={"A": DOSE, "C": 0.0}, t0="zero", **FAST)
    with pytest.raises(DataError, match="t0 must be one finite number"):
        pgpgm.fit(PK.system, oral, ["C"], x0={"A": DOSE, "C": 0.0}, t0=[0.0, 0.1], **FAST)


def test_a_study_takes_each_experiments_start_from_its_inputs(oral):
    """``Study.from_tidy(..., t0="dose_time")``: each experiment's grid starts at its dose time, where its known
    initial values hold; the experiment fitted alone with the same t0 gives the study's separate estimate."""
    shifted = {"time": oral["time"] + 1.0, "C": oral["C"]}  # dosed at t = 1, sampled from 1.25 h
    tidy = pd.concat([pd.DataFrame({"experiment": e, "time": d["time"], "state": "C", "value": d["C"]})
                      for e, d in (("a", oral), ("b", shifted))])
    inputs = pd.DataFrame({"experiment": ["a", "b"], "dose_time": [0.0, 1.0]})
    study = pgpgm.Study.from_tidy(tidy, inputs, x0={"A": DOSE, "C": 0.0}, t0="dose_time")
    assert [e.t0 for e in study.experiments] == [0.0, 1.0]
    assert [o.times[0] for o in study.check(PK.system)] == [0.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pgpgm.fit_study(PK.system, study, priors=PK.priors(), posterior=None, draws=300, tune=200)
    sep = result.theta("separate")
    np.testing.assert_allclose(sep.loc["a"].values, sep.loc["b"].values, rtol=1e-6)  # the same data, shifted
    with pytest.raises(DataError, match="experiment 'b': t0 = 2 is after the first measured time 1.25"):
        pgpgm.Study.from_mapping({"a": oral, "b": shifted}, x0={"a": {"A": DOSE}, "b": {"A": DOSE}},
                                 t0={"a": 0.0, "b": 2.0}).check(PK.system)

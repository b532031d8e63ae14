"""Defects that a second held-out battery of new-user calls (``benchmarks/battery.py --set second``, 156 cases
written from the docs alone, first run 2026-12-07) found: each test failed before its fix.

- valid calls that raised: a :mod:`pgpgm.noise` object in a ``noise`` mapping (the docstring's own example,
  ``noise={"I": pgpgm.noise.NegativeBinomial(5.0)}``: "must be one of [...]"), and ``pgpgm.noise`` itself not
  reachable from ``import pgpgm``;
- a value the user gave not held: a parameter's prior box while another parameter's prior is a callable (the
  refinement then ran unbounded: theta3 refined to 2.90 in the box (3, 5));
- bad input that crashed or was accepted: a prior callable that names its variable otherwise (KeyError from
  inside PyMC), a missing model file (FileNotFoundError, not a pgpgm error), ``x0`` and the deprecated
  ``x0_observed`` giving one state two values (the latter silently won).
"""

import warnings

import numpy as np
import pymc as pm
import pytest

import pgpgm

FAST = dict(draws=200, tune=200, progressbar=False, posterior=None, seed=1)
DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")


@pytest.fixture(scope="module")
def counts():
    t = np.linspace(0.0, 3.0, 16)
    y = np.random.default_rng(3).poisson(40.0 * np.exp(-0.8 * t)).astype(float)
    return {"time": t, "x": y}


def test_a_noise_object_in_a_mapping_is_the_same_fit_as_the_object_for_every_state(counts):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapped = pgpgm.fit(DECAY, counts, ["x"], noise={"x": pgpgm.noise.NegativeBinomial(5.0)},
                           priors=(0.0, 5.0), **FAST)
        whole = pgpgm.fit(DECAY, counts, ["x"], noise=pgpgm.noise.NegativeBinomial(5.0), priors=(0.0, 5.0), **FAST)
    assert mapped.nll == whole.nll and np.array_equal(mapped.theta, whole.theta)  # the same fit, bit for bit
    assert 0.6 < mapped.theta[0] < 1.0
    with pytest.raises(pgpgm.DataError, match=r"noise for \['x'\] must be one of"):
        pgpgm.fit(DECAY, counts, ["x"], noise={"x": "negative-binomial"})


def test_a_box_is_held_when_another_parameters_prior_is_a_callable():
    lv = pgpgm.load_model("lotka-volterra")
    data = lv.simulate("x1-observed", seed=0)  # theta3 = 4 generated the data: its box (4.5, 6) holds it off
    priors = {"theta1": lambda name: pm.HalfNormal(name, 5.0), "theta2": (0.0, 5.0), "theta3": (4.5, 6.0),
              "theta4": (0.0, 5.0)}
    with pytest.warns(pgpgm.BoundWarning, match="theta3"):
        r = pgpgm.fit(lv.system, data, ["x1"], x0={"x2": 3.0}, priors=priors, **FAST)
    theta = dict(zip(lv.system.parameters, r.theta))
    assert 4.5 <= theta["theta3"] <= 6.0 and theta["theta3"] == pytest.approx(4.5, abs=1e-6)
    assert theta["theta1"] > 0


def test_a_prior_callable_that_names_its_variable_otherwise_is_named_before_the_fit():
    with pytest.raises(pgpgm.DataError, match=r"prior callable of k created no variable named 'k' .*'other'"):
        pgpgm.fit(DECAY, {"time": [0.0, 1.0, 2.0, 3.0], "x": [1.0, 0.5, 0.25, 0.12]}, ["x"],
                  priors={"k": lambda name: pm.HalfNormal("other", 2.0)})


def test_a_missing_model_file_is_a_pgpgm_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(pgpgm.MissingFileError, match=r"no model file .*nosuch.*shipped model") as info:
        pgpgm.load_model(tmp_path / "nosuch" / "model.toml")
    assert isinstance(info.value, pgpgm.DataError) and isinstance(info.value, FileNotFoundError)


def test_x0_and_x0_observed_giving_one_state_two_values_is_refused():
    data = {"time": [0.0, 1.0, 2.0, 3.0], "x": [1.0, 0.5, 0.25, 0.12]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(pgpgm.DataError, match=r"x0 and x0_observed .* of x \(1\.0 and 0\.9\)"):
            pgpgm.fit(DECAY, data, ["x"], x0={"x": 1.0}, x0_observed={"x": 0.9})

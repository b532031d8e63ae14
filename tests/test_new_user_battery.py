"""Defects that a held-out battery of new-user calls (``benchmarks/battery.py``, 182 cases written from the docs
alone, first run 2026-12-07) found: each test failed before its fix.

- a valid call that raised: ``fit`` on a system with a parameter fixed (``ODESystem.fix``) and data that
  ``pgpgm.simulate`` made with the full system (xarray's size conflict of the truth); the Laplace approximation
  where the data leave an unknown open (DataError after steps 1-3);
- a silent one: Laplace draws whose solve failed, NaN trajectories and no word;
- bad input that crashed or was accepted: a model's name as the system (AttributeError), an unknown model or case
  (a bare KeyError), a negative known initial value of a state on the log scale, a negative constant noise
  formula in a PEtab problem (its sign dropped).
"""

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import pgpgm

SUITE = Path(__file__).parent / "data" / "petab_suite" / "v1.0.0" / "sbml"
FAST = dict(draws=300, tune=300, progressbar=False)


@pytest.fixture(scope="module")
def lv():
    return pgpgm.load_model("lotka-volterra")


def _data(lv, times=None):
    c = lv.case("x1-observed")
    times = np.linspace(0.0, 2.0, 20) if times is None else times
    return pgpgm.simulate(lv.system, c.theta, c.x0, times, observed=["x1"], noise_sd=0.1, seed=0)


# ----------------------------------------------------------------------------- bad input: a pgpgm error first
def test_a_models_name_as_the_system_is_a_clear_error(lv):
    with pytest.raises(pgpgm.DataError, match=r"system must be a pgpgm.ODESystem .*got str"):
        pgpgm.fit("lotka-volterra", _data(lv), ["x1"])


def test_an_unknown_model_or_case_is_a_pgpgm_error_listing_the_known_ones(lv):
    with pytest.raises(pgpgm.UnknownNameError, match=r"unknown model 'lotka-voltera'.*'lotka-volterra'") as info:
        pgpgm.load_model("lotka-voltera")
    assert isinstance(info.value, KeyError) and isinstance(info.value, pgpgm.PgpgmError)
    assert str(info.value).startswith("unknown model")  # the message, not KeyError's quoted repr of it
    with pytest.raises(pgpgm.UnknownNameError, match=r"no case 'x1-observd'; cases: \['x1-observed'"):
        lv.case("x1-observd")


def test_a_known_initial_value_below_0_of_a_state_on_the_log_scale_is_refused(lv):
    with pytest.raises(pgpgm.DataError, match=r"x0\[x1\] = -1 must be positive: state x1 is on the log scale"):
        pgpgm.fit(lv.system, _data(lv), ["x1"], x0={"x1": -1.0, "x2": 3.0}, transform={"x1": "log"})


def test_a_petab_noise_formula_that_is_a_constant_below_0_is_refused_at_load(tmp_path):
    folder = tmp_path / "0001"
    shutil.copytree(SUITE / "0001", folder)
    table = folder / "_observables.tsv"
    table.write_text(table.read_text().replace("obs_a\tA\t0.5", "obs_a\tA\t-0.5"))
    with pytest.raises(pgpgm.DataError, match=r"_observables.tsv.*noiseFormula.*constant -0.5"):
        pgpgm.load_petab(folder / "_0001.yaml")


# ----------------------------------------------------------------------------- valid input: a result
def test_a_system_with_a_parameter_fixed_fits_data_simulated_with_all_of_them(lv):
    system = lv.system.fix({"theta4": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(system, _data(lv), ["x1"], priors=(0, 10), posterior=None, **FAST)
    assert list(r.system.parameters) == ["theta1", "theta2", "theta3"]
    assert "truth" not in r.estimates  # the simulation's four values are no truth of these three
    assert np.all(np.isfinite(r.theta))


def test_laplace_where_the_data_leave_an_unknown_open_returns_steps_1_3_and_says_why(lv):
    """x1 measured, x2(0) unknown: x2 -> c x2, theta2 -> theta2 / c leaves the data alike, so the refinement's
    covariance is not finite and there is no Laplace approximation; the fit returns steps 1-3 (as with
    posterior=None) with a warning, where it raised a DataError after them."""
    with pytest.warns(pgpgm.IdentifiabilityWarning, match=r"step 4 \(Laplace\) has no approximation"):
        r = pgpgm.fit(lv.system, _data(lv), ["x1"], x0={"x2": (0.5, 10.0)}, priors=(0, 10), posterior="laplace",
                      **FAST)
    assert list(r.diagnostics["sampler"].values) == ["gradient_matching"]
    assert 0.5 <= r.x0["x2"] <= 10.0


def test_laplace_draws_that_cannot_be_solved_are_counted_in_a_warning(lv):
    """First sample at 0.5, every initial value known at t0 = 0: a few of the Gaussian's draws lie where the
    model cannot be solved; their trajectories are NaN, and now a warning counts them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pgpgm.fit(lv.system, _data(lv, np.linspace(0.5, 2.5, 20)), ["x1"], x0={"x1": 5.0, "x2": 3.0}, t0=0.0,
                      priors=(0, 10), posterior="laplace", **FAST)
    x = r.posterior.posterior["x1"].values
    failed = int(np.sum(np.all(np.isnan(x), axis=-1)))
    said = [str(w.message) for w in caught if "Laplace draws could not be solved" in str(w.message)]
    assert failed > 0, "the data set no longer has draws that fail: choose another"
    assert said == [f"{failed} of {x.size // x.shape[-1]} Laplace draws could not be solved (their trajectories of "
                    "x1, x2 are NaN): "
                    "the Gaussian at the optimum reaches parameters where the model cannot be solved, so it is a "
                    "poor approximation there; posterior='nuts' samples the posterior itself"], said
    held = r.posterior.posterior["x1"].isel(time_dense=0).values.ravel()
    assert np.all(held[np.isfinite(held)] == 5.0)  # the known value held at t0 by every solved draw

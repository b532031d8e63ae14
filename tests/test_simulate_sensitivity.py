import numpy as np
import pytest

import pgpgm


def test_simulate_noise_and_labels(lv):
    c = lv.case("x1-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=3)
    assert ds.y.dims == ("time", "observed") and list(ds.observed.values) == ["x1"]
    assert ds.truth.shape == (20, 2)
    resid = ds.y.sel(observed="x1") - ds.truth.sel(state="x1")
    assert 0.05 < float(resid.std()) < 0.17  # 20 draws of sd 0.1
    again = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=3)
    np.testing.assert_array_equal(ds.y, again.y)


def test_simulate_snr_definition(fhn):
    c = fhn.case("V-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times, observed=["V", "R"], snr=100, seed=0)
    truth = ds.truth.values
    np.testing.assert_allclose(ds.noise_sd.values ** 2, np.mean(truth**2, axis=0) / 100)


def test_simulate_bad_input(lv):
    c = lv.case()
    with pytest.raises(pgpgm.DataError, match="non-negative"):
        pgpgm.simulate(lv.system, c.theta, c.x0, c.times, noise_sd=-1)
    with pytest.raises(pgpgm.DataError, match="exactly one"):
        pgpgm.simulate(lv.system, c.theta, c.x0, c.times)
    with pytest.raises(pgpgm.ModelDefinitionError, match="unknown state"):
        pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x9"], noise_sd=0.1)


@pytest.mark.parametrize("name,span", [("lotka-volterra", (0, 2)), ("fitzhugh-nagumo", (0, 10)), ("protein-transduction", (0, 100))])
def test_sensitivity_index_two_ways(all_models, name, span):
    spec = all_models[name]
    c = spec.case()
    a = pgpgm.sensitivity_index(spec.system, c.theta, c.x0, span, n_points=801)
    b = pgpgm.sensitivity_index(spec.system, c.theta, c.x0, span, n_points=801, method="finite-difference")
    assert a.dims == ("parameter", "state") and a.shape == (spec.system.n_parameters, spec.system.n_states)
    ok = np.isfinite(a.values)
    np.testing.assert_allclose(a.values[ok], b.values[ok], rtol=1e-3, atol=1e-6)


def test_sensitivity_index_analytic():
    # x = x0 exp(-k t): dx/dk = -t x, so S = ||t x|| / ||x||, computable in closed form by quadrature.
    s = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"])
    idx = pgpgm.sensitivity_index(s, [0.5], [1.0], (0, 4), n_points=4001)
    t = np.linspace(0, 4, 200001)
    x = np.exp(-0.5 * t)
    expected = np.sqrt(np.trapezoid((t * x) ** 2, t) / np.trapezoid(x**2, t))
    assert float(idx.sel(parameter="k", state="x")) == pytest.approx(expected, rel=1e-5)


def test_model_spec_simulate_and_priors_follow_the_case(fhn):
    c = fhn.case("R-observed")
    ds = fhn.simulate("R-observed", seed=5)
    direct = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times, observed=["R"], snr=100, seed=5)
    np.testing.assert_array_equal(ds.y.values, direct.y.values)
    assert fhn.priors("R-observed") == {"a": (0.0, 5.0), "b": (0.0, 5.0), "c": (0.0, 5.0)}

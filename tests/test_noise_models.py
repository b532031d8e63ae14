"""Noise models (pgpgm.noise): likelihoods against scipy.stats, the residual identity, Jacobians by
finite differences, PyTensor log-likelihoods through pm.logp, the GP transforms, and bad inputs."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pgpgm.errors import DataError, PgpgmError
from pgpgm.noise import NOISE_MODELS, LogNormal, NegativeBinomial, Normal, Poisson, noise_model

RNG = np.random.default_rng(7)
MU = RNG.uniform(0.3, 40.0, 30)
Y_COUNTS = RNG.poisson(MU).astype(float)
Y_COUNTS[[3, 11]] = np.nan  # missing
Y_POS = MU * np.exp(0.2 * RNG.standard_normal(30))
Y_POS[[5]] = np.nan
Y_REAL = MU + RNG.standard_normal(30)
Y_REAL[[0, 29]] = np.nan
M = np.isfinite

MODELS = [(Normal(1.3), Y_REAL), (LogNormal(0.25), Y_POS), (Poisson(), Y_COUNTS),
          (NegativeBinomial(2.5), Y_COUNTS), (NegativeBinomial(400.0), Y_COUNTS)]
IDS = ["normal", "lognormal", "poisson", "negbin", "negbin-large-alpha"]


def scipy_nll(model, y, mu):
    m = M(y)
    y, mu = y[m], mu[m]
    if isinstance(model, Normal):
        return -stats.norm(mu, model.sd).logpdf(y).sum()
    if isinstance(model, LogNormal):
        return -stats.lognorm(s=model.sd, scale=mu).logpdf(y).sum()
    if isinstance(model, Poisson):
        return -stats.poisson(mu).logpmf(y).sum()
    a = model.alpha
    return -stats.nbinom(n=a, p=a / (a + mu)).logpmf(y).sum()


@pytest.mark.parametrize("model,y", MODELS, ids=IDS)
def test_nll_equals_scipy_and_the_residual_identity(model, y):
    for mu in (MU, MU * 1.7, np.maximum(MU - 3.0, 0.05)):
        assert model.nll(y, mu) == pytest.approx(scipy_nll(model, y, mu), rel=1e-12)
        r = model.residuals(y, mu)
        assert r.shape == y.shape and np.all(r[~M(y)] == 0.0)
        assert 0.5 * np.sum(r**2) == pytest.approx(model.nll(y, mu) - model.nll_saturated(y), rel=1e-10, abs=1e-10)
    # the saturated nll is the nll at mu = y (its minimum), where every residual is 0
    ysat = np.where(M(y), np.maximum(y, 1e-300 if model.is_count else y), 1.0)
    assert model.nll_saturated(y) == pytest.approx(model.nll(y, ysat), rel=1e-12)
    np.testing.assert_allclose(model.residuals(y, ysat), 0.0, atol=1e-7)


def test_negbin_parameter_mapping_moments_and_poisson_limit():
    """alpha is PyMC's: mean mu, variance mu + mu^2/alpha (checked on scipy's distribution)."""
    mu, a = 12.0, 2.5
    d = stats.nbinom(n=a, p=a / (a + mu))
    assert d.mean() == pytest.approx(mu) and d.var() == pytest.approx(mu + mu**2 / a)
    y, m = np.array([0.0, 5.0, 20.0]), np.full(3, 7.0)
    assert NegativeBinomial(1e9).nll(y, m) == pytest.approx(Poisson().nll(y, m), rel=1e-7)


@pytest.mark.parametrize("model,y", MODELS, ids=IDS)
def test_d_residuals_by_finite_differences(model, y):
    mu = MU * 1.3
    h = 1e-6 * mu
    fd = (model.residuals(y, mu + h) - model.residuals(y, mu - h)) / (2 * h)
    got = model.d_residuals_d_mu(y, mu)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-9)
    assert np.all(got[~M(y)] == 0.0)


@pytest.mark.parametrize("model", [Poisson(), NegativeBinomial(3.0)], ids=["poisson", "negbin"])
def test_count_residual_slope_at_and_near_y_equal_mu(model):
    """At y = mu the slope is the limit -1/sqrt(Var y); just beside it, no cancellation."""
    y = np.array([4.0, 4.0, 4.0, 0.0])
    mu = np.array([4.0, 4.0 * (1 + 1e-9), 4.0 * (1 - 1e-6), 2.0])
    var = mu + (mu**2 / model.alpha if isinstance(model, NegativeBinomial) else 0.0)
    d = model.d_residuals_d_mu(y, mu)
    np.testing.assert_allclose(d[:3], -1.0 / np.sqrt(var[:3]), rtol=1e-5)
    r = model.residuals(y, mu)
    np.testing.assert_allclose(r[1:3], (y - mu)[1:3] / np.sqrt(var[1:3]), rtol=1e-5)
    h = 1e-6
    fd = (model.residuals(y, mu + h) - model.residuals(y, mu - h))[3] / (2 * h)
    assert d[3] == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("model,y", MODELS, ids=IDS)
def test_logp_through_pytensor_equals_scipy(model, y):
    mu = pt.dvector("mu")
    f = pytensor.function([mu], model.logp(y, mu))
    for m in (MU, MU * 0.8):
        # rel 1e-6: PyMC's negative binomial (a binomial coefficient through betaln) loses ~1e-7
        # relative for large alpha; its normal and lognormal agree to ~1e-9
        assert float(f(m)) == pytest.approx(-scipy_nll(model, y, m), rel=1e-6)


def test_logp_parameter_as_a_tensor():
    mu, sd, alpha = pt.dvector("mu"), pt.dscalar("sd"), pt.dscalar("alpha")
    f = pytensor.function([mu, sd], Normal(1.0).logp(Y_REAL, mu, sd=sd))
    assert float(f(MU, 2.0)) == pytest.approx(-scipy_nll(Normal(2.0), Y_REAL, MU), rel=1e-7)
    g = pytensor.function([mu, alpha], NegativeBinomial(1.0).logp(Y_COUNTS, mu, alpha=alpha))
    assert float(g(MU, 4.0)) == pytest.approx(-scipy_nll(NegativeBinomial(4.0), Y_COUNTS, MU), rel=1e-7)


def test_lognormal_allows_mu_zero_where_y_is_missing():
    """A concentration that starts at 0: C(0) = 0 is not measured (NaN), the rest is lognormal."""
    model = LogNormal(0.2)
    y = model.check([np.nan, 2.0, 5.0], "C")
    mu = np.array([0.0, 2.5, 4.0])
    assert np.isfinite(model.nll(y, mu)) and model.nll(y, mu) == pytest.approx(scipy_nll(model, y, mu), rel=1e-12)
    assert np.all(np.isfinite(model.residuals(y, mu))) and np.all(np.isfinite(model.d_residuals_d_mu(y, mu)))
    f = pytensor.function([m := pt.dvector("m")], model.logp(y, m))
    assert np.isfinite(f(mu))
    # mu = 0 at a measured value has zero likelihood
    assert model.nll(y, np.array([0.0, 0.0, 4.0])) == np.inf
    assert model.residuals(y, np.array([0.0, 0.0, 4.0]))[1] == np.inf


@pytest.mark.parametrize("model,mu", [(Poisson(), 20.0), (NegativeBinomial(5.0), 20.0), (NegativeBinomial(5.0), 200.0),
                                      (Poisson(), 200.0)])
def test_count_gp_transform_stabilises_the_variance(model, mu):
    rng = np.random.default_rng(1)
    if isinstance(model, Poisson):
        y = rng.poisson(mu, 200_000)
    else:
        y = rng.negative_binomial(model.alpha, model.alpha / (model.alpha + mu), 200_000)
    z = model.gp_transform(y)
    assert z.std() == pytest.approx(float(model.gp_noise_sd(np.array(z.mean()))), rel=0.06)
    assert model.gp_inverse(np.median(z)) == pytest.approx(np.median(y), rel=0.05)


@pytest.mark.parametrize("model,y", MODELS, ids=IDS)
def test_gp_inverse_inverts_the_transform(model, y):
    m = M(y)
    np.testing.assert_allclose(model.gp_inverse(model.gp_transform(y[m])), y[m], rtol=1e-12, atol=1e-12)


def test_lognormal_gp_transform_is_the_log_with_its_sd():
    model = LogNormal(0.3)
    np.testing.assert_allclose(model.gp_transform([1.0, np.e]), [0.0, 1.0])
    assert model.gp_noise_sd(np.zeros(2)).tolist() == [0.3, 0.3]


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("model,y,match", [
    (Poisson(), [1.0, 2.5, 3.0], r"counts: 1 measurement\(s\) not whole numbers .*index 1, value 2\.5.*raw counts"),
    (NegativeBinomial(2.0), [1.0, -2.0], r"counts: 1 measurement\(s\) negative .*index 1.*cannot be negative"),
    (Poisson(), [0.0, -1.0, 0.5], r"negative"),
    (LogNormal(0.1), [0.0, 1.0, 2.0], r"counts: 1 measurement\(s\) <= 0 under lognormal.*index 0.*NaN.*t = 0"),
    (LogNormal(0.1), [1.0, -3.0], r"<= 0 under lognormal"),
    (Normal(1.0), [1.0, np.inf], r"counts: measurement 1 is inf; give a finite value, or NaN"),
    (Normal(1.0), [[1.0, 2.0]], r"1-D array"),
    (Normal(1.0), ["a", "b"], r"must be numbers"),
], ids=["fraction", "negative-negbin", "negative-first", "lognormal-zero", "lognormal-negative", "inf", "2d", "text"])
def test_bad_measurements_are_data_errors_naming_the_input(model, y, match):
    with pytest.raises(DataError, match=match):
        model.check(y, "counts")


def test_nan_is_missing_not_an_error():
    for model, _ in MODELS:
        a = model.check([np.nan, 1.0, 2.0], "y")
        assert np.isnan(a[0]) and a.dtype == float


@pytest.mark.parametrize("make,match", [
    (lambda: Normal(0.0), r"normal noise: sd must be a positive finite number, got 0\.0"),
    (lambda: LogNormal(-1.0), r"lognormal noise: sd"),
    (lambda: NegativeBinomial(np.nan), r"alpha \(dispersion\) must be a positive"),
    (lambda: noise_model("poison"), r"unknown noise model 'poison'.*did you mean 'poisson'"),
    (lambda: noise_model("negbin", sd=1.0), r"takes \['alpha'\]; unknown: \['sd'\]"),
    (lambda: noise_model("normal"), r"missing: \['sd'\]"),
    (lambda: Normal(1.0).nll(np.ones(3), np.ones(2)), r"one shape"),
])
def test_bad_parameters_are_data_errors(make, match):
    with pytest.raises(DataError, match=match):
        make()


def test_registry_and_immutability():
    assert set(NOISE_MODELS) == {"normal", "lognormal", "poisson", "negbin"}
    assert noise_model("negbin", alpha=2.0) == NegativeBinomial(2.0)
    assert noise_model("poisson") == Poisson()
    assert issubclass(DataError, PgpgmError)
    with pytest.raises(AttributeError):
        Normal(1.0).sd = 2.0  # frozen


# ------------------------------------------------------------------ properties
counts = st.lists(st.integers(0, 500), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(y=counts, scale=st.floats(0.05, 20.0), alpha=st.floats(0.05, 1e4))
def test_property_count_identity_and_minimum(y, scale, alpha):
    y = np.asarray(y, dtype=float)
    mu = np.maximum(y, 0.5) * scale
    for model in (Poisson(), NegativeBinomial(alpha)):
        nll, sat = model.nll(y, mu), model.nll_saturated(y)
        r = model.residuals(y, mu)
        assert nll >= sat - 1e-9 * max(1.0, abs(sat))
        assert 0.5 * np.sum(r**2) == pytest.approx(nll - sat, rel=1e-8, abs=1e-8)
        assert np.all(np.sign(r) == np.sign(y - mu))


@settings(max_examples=60, deadline=None)
@given(y=st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=20), scale=st.floats(0.1, 10.0),
       sd=st.floats(0.01, 3.0))
def test_property_lognormal_and_normal_identity(y, scale, sd):
    y = np.asarray(y)
    mu = y * scale
    for model in (LogNormal(sd), Normal(sd)):
        r = model.residuals(y, mu)
        assert 0.5 * np.sum(r**2) == pytest.approx(model.nll(y, mu) - model.nll_saturated(y), rel=1e-9, abs=1e-9)

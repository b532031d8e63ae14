"""Step 4: the ODE model's posterior against exact references."""

import warnings

import numpy as np
import pytest
from scipy import stats

import pgpgm
from pgpgm.data import as_observations
from pgpgm.diagnostics import ConvergenceWarning, diagnose
from pgpgm.posterior import build_ode_model, sample_posterior

DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
T = np.linspace(0, 3, 12)
SD = 0.1


def _decay_data(k, x0, seed):
    y = x0 * np.exp(-k * T) + np.random.default_rng(seed).normal(0, SD, T.size)
    return as_observations({"time": T, "x": y}, ["x"], DECAY)


def _exact_moments(obs, k_box=(0.0, 5.0)):
    """Posterior mean and sd of (k, x0) by quadrature on a fine grid (analytic solution)."""
    y = obs.values[:, 0]
    prior_x0 = stats.norm(y[0], np.std(y))
    # locate the bulk with a coarse grid, then integrate on a fine one around it
    k = np.linspace(*k_box, 2001)[1:-1]
    x0 = np.linspace(y[0] - 1.0, y[0] + 1.0, 801)
    for _ in range(2):
        K, X0 = np.meshgrid(k, x0, indexing="ij")
        resid = y[None, None, :] - X0[..., None] * np.exp(-K[..., None] * T)
        lp = -0.5 * (resid**2).sum(-1) / SD**2 + prior_x0.logpdf(X0)
        w = np.exp(lp - lp.max())
        w /= w.sum()
        mk, mx = (w * K).sum(), (w * X0).sum()
        sk, sx = np.sqrt((w * (K - mk) ** 2).sum()), np.sqrt((w * (X0 - mx) ** 2).sum())
        k = np.linspace(max(mk - 10 * sk, k_box[0] + 1e-9), min(mk + 10 * sk, k_box[1]), 801)
        x0 = np.linspace(mx - 10 * sx, mx + 10 * sx, 801)
    return (mk, sk), (mx, sx)


def test_nuts_matches_quadrature_of_the_exact_posterior():
    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    assert layout.free == ("k", "x_0")
    tree = sample_posterior(model, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD},
                            draws=1500, tune=500, chains=2, cores=1, seed=1, progressbar=False)
    diag = diagnose(tree, layout.free)
    (mk, sk), (mx, sx) = _exact_moments(obs)
    for name, m, s in (("k", mk, sk), ("x_0", mx, sx)):
        draws = tree.posterior[name].values.ravel()
        ess = float(diag["ess_bulk"].sel(variable=name))
        assert ess > 400
        assert abs(draws.mean() - m) < 4 * s / np.sqrt(ess), (name, draws.mean(), m)
        assert abs(draws.std() / s - 1) < 4 * np.sqrt(1 / (2 * ess)), (name, draws.std(), s)
    # every state is a deterministic on the dense grid: x(t) = x0 exp(-k t) draw by draw
    post = tree.posterior
    dense = post["time_dense"].values
    expect = post["x_0"].values[..., None] * np.exp(-post["k"].values[..., None] * dense)
    np.testing.assert_allclose(post["x"].values, expect, rtol=1e-5, atol=1e-7)  # CVODE at rtol = atol = 1e-8


def _coverage(n_sets: int, seed: int) -> int:
    """How many of ``n_sets`` data sets, with k drawn from its prior, have k inside the
    posterior's central 90 % interval."""
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(n_sets):
        k = rng.uniform(0.2, 2.0)
        obs = _decay_data(k, 2.0, seed=1000 + i)
        model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.2, 2.0)}, noise_sd=[SD])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = sample_posterior(model, {"k": k, "x_0": float(obs.values[0, 0])}, {"k": 0.1, "x_0": SD},
                                    draws=400, tune=300, chains=2, cores=1, seed=i, progressbar=False)
        lo, hi = np.quantile(tree.posterior["k"].values.ravel(), [0.05, 0.95])
        hits += int(lo <= k <= hi)
    return hits


def test_calibration_fast():
    n = 12
    hits = _coverage(n, seed=0)
    # 90 % intervals: reject calibration at the 1 % level (two-sided binomial test)
    assert stats.binomtest(hits, n, 0.9).pvalue > 0.01, hits


@pytest.mark.slow
def test_calibration_many_data_sets():
    n = 100
    hits = _coverage(n, seed=1)
    assert stats.binomtest(hits, n, 0.9).pvalue > 0.01, hits


def test_fit_returns_a_converged_nuts_posterior_and_both_diagnostics(lv):
    c = lv.case("x1-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=1)
    r = pgpgm.fit(lv.system, ds, ["x1"], draws=300, tune=300, seed=1, progressbar=False, posterior_draws=300,
                  posterior_tune=300, posterior_chains=2, cores=1)
    post = r.posterior.posterior
    assert set(post.data_vars) >= {"theta1", "theta2", "theta3", "theta4", "x1_0", "sigma_x1", "x1", "x2"}
    assert post["x2"].dims == ("chain", "draw", "time_dense")  # latent states on the dense grid
    assert "diverging" in r.posterior.sample_stats
    assert r.gradient_matching.posterior["theta1"].shape == (2, 300)
    assert set(r.diagnostics["sampler"].values) == {"gradient_matching", "posterior"}
    # the table's posterior columns are the posterior's own numbers
    tab = r.parameter_table()
    np.testing.assert_allclose(tab["posterior_mean"], [float(post[p].mean()) for p in lv.system.parameters])
    assert (tab["hdi_3%"] < tab["posterior_mean"]).all() and (tab["posterior_mean"] < tab["hdi_97%"]).all()
    summary = r.summary()
    assert {"theta1", "x1_0", "sigma_x1"} <= set(summary.index) and "r_hat" in summary.columns
    # the posterior mean of theta sits within 4 posterior sds of the refined optimum
    assert np.all(np.abs(tab["posterior_mean"] - tab["refined"]) < 4 * tab["posterior_sd"])


def test_unconverged_posterior_warns_naming_the_parameters():
    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    tree = sample_posterior(model, {"k": 0.8, "x_0": 2.0}, {"k": 0.05, "x_0": SD}, draws=30, tune=30, chains=2,
                            cores=1, seed=0, progressbar=False)
    diag = diagnose(tree, layout.free)
    from pgpgm.diagnostics import problems, warn_if_unconverged

    found = problems(diag)
    assert any("ESS < 400 for k" in f for f in found)
    with pytest.warns(ConvergenceWarning, match="ESS < 400 for k"):
        warn_if_unconverged(diag, "NUTS")


def test_laplace_posterior_matches_the_refinement_covariance(lv):
    c = lv.case("x1-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=1)
    r = pgpgm.fit(lv.system, ds, ["x1"], draws=200, tune=200, seed=1, progressbar=False, posterior="laplace",
                  posterior_draws=1000, posterior_chains=2)
    th = np.column_stack([r.posterior.posterior[p].values.ravel() for p in lv.system.parameters])
    assert th.shape == (2000, 4)
    cov = r.estimates["covariance"].values
    se = np.sqrt(np.diag(cov))
    assert np.all(np.abs(th.mean(0) - r.theta) < 4 * se / np.sqrt(2000))
    assert np.all(np.abs(th.std(0) / se - 1) < 4 * np.sqrt(1 / (2 * 2000)))

"""Step 4: the ODE model's posterior against exact references."""

import warnings

import numpy as np
import pytest
from scipy import stats

import pgpgm
from pgpgm.data import as_observations
from pgpgm.errors import DataError
from pgpgm.posterior.diagnostics import ConvergenceWarning, diagnose
from pgpgm.posterior.model import build_ode_model
from pgpgm.posterior.rounds import sample_posterior

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


def _assert_quadrature_moments(tree, layout, obs, k_box=(0.0, 5.0)):
    """NUTS means and sds of k and x_0 equal the quadrature's within 4 Monte-Carlo errors (ESS > 400)."""
    diag = diagnose(tree, layout.free)
    (mk, sk), (mx, sx) = _exact_moments(obs, k_box)
    for name, m, s in (("k", mk, sk), ("x_0", mx, sx)):
        draws = tree.posterior[name].values.ravel()
        ess = float(diag["ess_bulk"].sel(variable=name))
        assert ess > 400
        assert abs(draws.mean() - m) < 4 * s / np.sqrt(ess), (name, draws.mean(), m)
        assert abs(draws.std() / s - 1) < 4 * np.sqrt(1 / (2 * ess)), (name, draws.std(), s)


def test_nuts_matches_quadrature_of_the_exact_posterior():
    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    assert layout.free == ("k", "x_0")
    tree = sample_posterior(model, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD},
                            draws=1500, tune=500, chains=2, cores=1, seed=1, progressbar=False)
    _assert_quadrature_moments(tree, layout, obs)
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
                                    draws=400, tune=300, chains=2, cores=1, seed=i, progressbar=False,
                                    max_rounds=1)  # 800 draws are plenty for a 90 % interval of k
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pgpgm.fit(lv.system, ds, ["x1"], draws=300, tune=300, seed=1, progressbar=False,
                      posterior=pgpgm.NUTS(draws=300, tune=300, chains=2, cores=1),
                      stop="never")  # the whole step-2 budget
    # step 4's mass matrix is seeded from step 3's covariance (PyMC's full adaptation, which PyMC
    # flags as experimental): pgpgm chose it, so the user is not shown PyMC's notice
    assert not [w for w in caught if "experimental feature" in str(w.message)]
    post = r.posterior.posterior
    assert set(post.data_vars) >= {"theta1", "theta2", "theta3", "theta4", "x1_0", "sigma_x1", "x1", "x2"}
    assert post["x2"].dims == ("chain", "draw", "time_dense")  # latent states on the dense grid
    assert "diverging" in r.posterior.sample_stats
    assert r.gradient_matching.posterior["theta1"].shape == (2, 300)
    # the whole budget ran: step 3 refines from the pooled mean and from each chain's mean
    assert list(r.estimates["nll_per_start"].start.values) == ["pooled mean", "chain 0 mean", "chain 1 mean"]
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
                            cores=1, seed=0, progressbar=False, max_rounds=1)  # 30 draws per chain, no more
    diag = diagnose(tree, layout.free)
    from pgpgm.posterior.diagnostics import problems, warn_if_unconverged

    found = problems(diag)
    assert any("ESS < 400 for k" in f for f in found)
    with pytest.warns(ConvergenceWarning, match="ESS < 400 for k"):
        warn_if_unconverged(diag, "NUTS")
    # divergences alone are not called unconverged: the warning says R-hat and ESS hold and where to look
    fine = diag.assign(rhat=diag["rhat"] * 0 + 1.001, ess_bulk=diag["ess_bulk"] * 0 + 1000,
                       ess_tail=diag["ess_tail"] * 0 + 1000)
    fine.attrs = {**diag.attrs, "divergences": 4}
    with pytest.warns(ConvergenceWarning, match=r"has 4 divergent transitions \(R-hat <= 1.01 and ESS >= 400 hold\)"):
        warn_if_unconverged(fine, "NUTS")
    with pytest.warns(ConvergenceWarning, match="not converged: 4 divergent transitions; step 4 stopped"):
        warn_if_unconverged(fine, "NUTS", notes=["step 4 stopped at its budget"])


def test_laplace_posterior_matches_the_refinement_covariance(lv):
    c = lv.case("x1-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=1)
    r = pgpgm.fit(lv.system, ds, ["x1"], draws=200, tune=200, seed=1, progressbar=False,
                  posterior=pgpgm.Laplace(2000))
    th = np.column_stack([r.posterior.posterior[p].values.ravel() for p in lv.system.parameters])
    assert th.shape == (2000, 4)
    cov = r.estimates["covariance"].values
    se = np.sqrt(np.diag(cov))
    assert np.all(np.abs(th.mean(0) - r.theta) < 4 * se / np.sqrt(2000))
    assert np.all(np.abs(th.std(0) / se - 1) < 4 * np.sqrt(1 / (2 * 2000)))
    # the refined initial value of x1 is drawn with theta: its draws have the refinement's
    # mean and standard error, and each draw's x1 trajectory starts from it
    x10 = r.posterior.posterior["x1_0"].values.ravel()
    se0 = float(r.estimates["x0_stderr"].sel(state="x1"))
    assert 0 < se0 < np.inf
    assert abs(x10.mean() - r.x0["x1"]) < 4 * se0 / np.sqrt(2000)
    assert abs(x10.std() / se0 - 1) < 4 * np.sqrt(1 / (2 * 2000))
    x1 = r.posterior.posterior["x1"].values.reshape(2000, -1)
    ok = np.isfinite(x1[:, 0])
    assert ok.mean() > 0.99
    np.testing.assert_allclose(x1[ok, 0], x10[ok], rtol=1e-10)  # the dense grid starts at the first time


def test_prior_terms_are_float64_and_exact():
    """Every term of the ODE model's log density is float64 and equals scipy's: a Uniform(0, 5)
    prior is -log 5, the noise sd's LogNormal prior scipy's lognorm (PyTensor makes Python-float
    bounds float32 constants otherwise: -log 5 off by 1e-8)."""
    from pgpgm.posterior.model import NOISE_PRIOR_LOG_SD

    obs = _decay_data(0.8, 2.0, seed=3)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_center=[0.2])
    terms = model.compile_logp(sum=False, jacobian=False)
    point = {"k_interval__": 0.3, "x_0": 2.0, "sigma_x_log__": np.log(0.15)}
    names = [rv.name for rv in model.basic_RVs] + [p.name for p in model.potentials]
    values = dict(zip(names, terms(point), strict=True))
    assert all(np.asarray(v).dtype == np.float64 for v in values.values()), {k: np.asarray(v).dtype for k, v in values.items()}
    assert float(values["k"]) == pytest.approx(-np.log(5.0), rel=1e-15, abs=0)
    assert float(values["sigma_x"]) == pytest.approx(stats.lognorm.logpdf(0.15, NOISE_PRIOR_LOG_SD, scale=0.2), rel=1e-14)


def test_fit_passes_posterior_rounds_to_the_sampler(lv, monkeypatch):
    """fit(posterior=NUTS(rounds=...)) reaches run_nuts' max_rounds; both default to MAX_ROUNDS."""
    import inspect

    import pgpgm.steps.posterior
    from pgpgm.posterior.rounds import MAX_ROUNDS, run_nuts

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("max_rounds"))
        return run_nuts(*args, **kwargs)

    monkeypatch.setattr(pgpgm.steps.posterior, "run_nuts", recording)
    c = lv.case("x1-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 20 draws are not converged
        r = pgpgm.fit(lv.system, ds, ["x1"], draws=100, tune=100, seed=1, progressbar=False,
                      posterior=pgpgm.NUTS(draws=20, tune=20, chains=1, cores=1, rounds=2,
                                           sampler="pymc"))  # the rounds are PyMC's engine's
    assert seen == [2] and r.posterior.attrs["pgpgm_rounds"] == 1  # one chain of 20 draws: no further round
    assert r.n_ode_solves["posterior"] == int(r.posterior.sample_stats["n_steps"].sum()) > 20  # one per leapfrog step
    assert pgpgm.NUTS().rounds == MAX_ROUNDS == 6
    assert inspect.signature(sample_posterior).parameters["max_rounds"].default == MAX_ROUNDS


# ------------------------------------------------------------------ step 4's sampling geometry (issue 10)
def test_log_scale_samples_the_same_posterior():
    """k on the log scale (PyMC's log transform, same Uniform prior): the NUTS moments still match
    the quadrature of the exact posterior within Monte-Carlo error."""
    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD], log_scale=["k"])
    assert [v.name for v in model.value_vars] == ["k_softlog__", "x_0"]
    tree = sample_posterior(model, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD},
                            draws=1500, tune=500, chains=2, cores=1, seed=1, progressbar=False)
    _assert_quadrature_moments(tree, layout, obs)


GROWTH = pgpgm.ODESystem.from_equations({"x": "r*x"}, ["r"], name="growth")
T_GROWTH = np.linspace(0.0, 5.0, 15)
SD_GROWTH = 0.5


def test_a_positive_initial_value_samples_its_posterior_on_the_log_scale():
    """x' = r x from x0 = 0.01, measured with sd 0.5 (the first points are noise only): the data fix
    log x0 + r t, a straight ridge in (r, log x0) and a banana in (r, x0) whose curvature grows without
    bound towards x0 = 0. With ``positive_x0`` (x0's Normal prior restricted to x0 > 0, sampled on the
    log scale) NUTS has no divergence and its moments match the quadrature of the exact posterior
    (analytic solution, the same truncated prior) within Monte-Carlo error. (On x0's own scale the same
    runs had 4-8 divergences and a bulk ESS of 76-99 of 1600-3000 draws, against 792-2051 here; 2026-11-29.)"""
    rng = np.random.default_rng(4)
    y = 0.01 * np.exp(1.5 * T_GROWTH) + rng.normal(0.0, SD_GROWTH, T_GROWTH.size)
    obs = as_observations({"time": T_GROWTH, "x": y}, ["x"], GROWTH)
    model, layout = build_ode_model(GROWTH, obs, x0=[np.nan], priors={"r": (0.0, 5.0)}, noise_sd=[SD_GROWTH],
                                    positive_x0=["x"])
    assert [v.name for v in model.value_vars] == ["r_interval__", "x_0_interval__"]
    rv = model["x_0"]  # PyMC's interval transform with no upper bound: log x0
    assert float(model.rvs_to_transforms[rv].forward(np.float64(0.2), *rv.owner.inputs).eval()) == pytest.approx(
        np.log(0.2), rel=1e-12)
    # quadrature on (r, log x0) around the ridge; prior: Uniform r, Normal(y0, sd(y)) x0 > 0, times x0 (Jacobian)
    prior = stats.norm(y[0], np.std(y))
    r = np.linspace(0.8, 2.6, 721)
    lx = np.linspace(np.log(1e-5), np.log(1.0), 801)
    R, LX = np.meshgrid(r, lx, indexing="ij")
    mu = np.exp(LX[..., None] + R[..., None] * T_GROWTH)
    lp = -0.5 * ((y - mu) ** 2).sum(-1) / SD_GROWTH**2 + prior.logpdf(np.exp(LX)) + LX
    w = np.exp(lp - lp.max())
    w /= w.sum()
    assert w[[0, -1], :].sum() + w[:, [0, -1]].sum() < 1e-8  # the grid holds the posterior
    tree = sample_posterior(model, {"r": 1.5, "x_0": 0.01}, {"r": 0.1, "x_0": 0.005}, draws=800, tune=400,
                            chains=2, cores=1, seed=3, progressbar=False, max_rounds=1)
    diag = diagnose(tree, layout.free)
    assert diag.attrs["divergences"] == 0
    for name, grid in (("r", R), ("x_0", np.exp(LX))):
        m = (w * grid).sum()
        s = np.sqrt((w * (grid - m) ** 2).sum())
        draws = tree.posterior[name].values.ravel()
        ess = float(diag["ess_bulk"].sel(variable=name))
        assert ess > 400
        assert abs(draws.mean() - m) < 4 * s / np.sqrt(ess), (name, draws.mean(), m)
        assert abs(draws.std() / s - 1) < 4 * np.sqrt(1 / (2 * ess)), (name, draws.std(), s)
    with pytest.raises(DataError, match="positive_x0"):
        build_ode_model(GROWTH, obs, x0=[np.nan], priors={"r": (0.0, 5.0)}, noise_sd=[SD_GROWTH], positive_x0=["y"])


def test_log_scale_meets_the_prior_bound_without_divergences():
    """A posterior cut by the prior's upper bound (k = 0.98 in Uniform(0, 1), posterior sd ~0.05):
    on PyMC's plain log scale the bound is a hard wall (log density -inf beyond it) and NUTS
    trajectories that reach it diverge; the soft wall of the log scale of build_ode_model has no
    divergences, and its moments match the quadrature of the truncated posterior."""
    import pymc as pm
    from pymc.distributions.transforms import log as plain_log

    obs = _decay_data(0.98, 2.0, seed=3)
    y = obs.values[:, 0]
    kw = dict(draws=1500, tune=500, chains=2, cores=1, random_seed=1, progressbar=False,
              compute_convergence_checks=False)
    with pm.Model():  # the same posterior, analytic solution, hard wall at 1
        k = pm.Uniform("k", 0.0, 1.0, default_transform=plain_log)
        x_0 = pm.Normal("x_0", y[0], np.std(y))
        pm.Normal("y", x_0 * pm.math.exp(-k * T), SD, observed=y)
        hard = pm.sample(**kw)
    assert int(hard.sample_stats["diverging"].sum()) > 0
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 1.0)}, noise_sd=[SD],
                                    log_scale=["k"])
    tree = sample_posterior(model, {"k": 0.95, "x_0": float(y[0])}, {"k": 0.05, "x_0": SD},
                            draws=1500, tune=500, chains=2, cores=1, seed=1, progressbar=False)
    assert int(tree.sample_stats["diverging"].sum()) == 0
    assert np.mean(tree.posterior["k"].values > 0.98) > 0.1  # the bound matters
    _assert_quadrature_moments(tree, layout, obs, k_box=(0.0, 1.0))


def test_the_own_scale_with_its_soft_wall_at_0_samples_the_exact_posterior():
    """k = 0.03 +- 0.02 on its own scale (pgpgm.priors.SoftplusTransform, wall width 0.01): a posterior
    whose left tail reaches 0, where the wall bends theta into a log-like scale. Moments equal the
    quadrature's (the transform's Jacobian is right), no divergence at the wall, and the value variable
    is the own scale's."""
    obs = _decay_data(0.03, 2.0, seed=3)
    y = obs.values[:, 0]
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD],
                                    own_scale={"k": 0.01})
    assert [v.name for v in model.value_vars][0] == "k_softplus__"
    tree = sample_posterior(model, {"k": 0.03, "x_0": float(y[0])}, {"k": 0.02, "x_0": SD},
                            draws=1500, tune=500, chains=2, cores=1, seed=1, progressbar=False)
    assert int(tree.sample_stats["diverging"].sum()) == 0
    assert np.mean(tree.posterior["k"].values < 0.01) > 0.05  # the wall's region is sampled
    _assert_quadrature_moments(tree, layout, obs)
    with pytest.raises(DataError, match="both log_scale and own_scale"):
        build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD], log_scale=["k"],
                        own_scale={"k": 0.01})


def test_an_unknown_latent_initial_value_on_its_own_scale_keeps_its_prior():
    """An unknown latent initial value b(0) ~ Uniform(0, 2) on its own scale (own_scale={"b_0": w}): its value
    variable is the own scale's, and the model's density in the variables themselves (no Jacobian) equals that
    of the default log-odds scale at the same point; a name that is neither a parameter nor an unknown
    initial value is refused before anything compiles."""
    chain = pgpgm.ODESystem.from_equations({"a": "-k1*a", "b": "k1*a - k2*b"}, ["k1", "k2"])
    t = np.linspace(0.0, 4.0, 12)
    data = {"time": t, "a": np.exp(-0.9 * t) + 0.01}
    kw = dict(x0={"b": (0.0, 2.0)}, priors=(0.0, 5.0), noise_sd=[0.01])
    own, _ = build_ode_model(chain, data, ["a"], own_scale={"b_0": 0.25, "k2": 0.25}, **kw)
    plain, _ = build_ode_model(chain, data, ["a"], **kw)
    assert {v.name for v in own.value_vars} == {"k1_interval__", "k2_softplus__", "a_0", "b_0_softplus__"}
    point = {"k1": 0.9, "k2": 0.4, "a_0": 1.0, "b_0": 0.7}

    def at_point(m):  # the point in each value variable's coordinates
        out = {}
        for v in m.value_vars:
            rv = m.values_to_rvs[v]
            tr = m.rvs_to_transforms[rv]
            out[v.name] = (point[rv.name] if tr is None
                           else np.asarray(tr.forward(point[rv.name], *rv.owner.inputs).eval()))
        return out

    values = [m.compile_logp(jacobian=False)(at_point(m)) for m in (own, plain)]
    assert np.isfinite(values[0]) and values[0] == pytest.approx(values[1], rel=1e-10)
    with pytest.raises(DataError, match="own_scale names 'a_0'"):
        build_ode_model(chain, data, ["a"], own_scale={"a_0": 0.25}, **kw)


def test_the_soft_wall_has_no_hard_wall_in_its_tail():
    """Far past the bound of Uniform(0, 10), exp(log 10) rounds to 10.000000000000002, outside the box:
    the prior's log density was -inf from phi ~ 6.7 on, a hard wall 4.3 / p past log 10 that the large-noise
    Lotka-Volterra posteriors reach (theta1 refined on its bound, the Laplace sd 1 in phi: a third of the
    whitened proposals there were -inf). theta is now 10 itself there, and the log density goes on falling
    with slope -p (the Jacobian), finite to phi = 50."""
    import pymc as pm

    from pgpgm.priors import SOFT_WALL_SHARPNESS, SoftLogTransform

    with pm.Model() as model:
        pm.Uniform("k", 0.0, 10.0, default_transform=SoftLogTransform(10.0))
    logp, dlogp = model.compile_logp(), model.compile_dlogp()
    phis = [6.0, 6.7, 7.0, 10.0, 50.0]
    values = np.array([float(logp({"k_softlog__": phi})) for phi in phis])
    assert np.all(np.isfinite(values))
    np.testing.assert_allclose(np.diff(values) / np.diff(phis), -SOFT_WALL_SHARPNESS, rtol=1e-9)
    np.testing.assert_allclose([float(dlogp({"k_softlog__": phi})[0]) for phi in phis], -SOFT_WALL_SHARPNESS,
                               rtol=1e-9)
    assert float(pm.draw(SoftLogTransform(10.0).backward(pm.math.constant(50.0)))) == 10.0


def test_a_centre_on_the_prior_bound_still_samples():
    """A refined k on the upper bound of its box (the log-odds transform is infinite there): the seeded
    mass matrix stays finite (PyMC raised "Mass matrix contains non-finite values"), the adaptation's
    mean too (numpy warned "invalid value encountered" at every tuning draw), and the draws stay inside
    the box."""
    import warnings

    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 0.8)}, noise_sd=[SD])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        tree = sample_posterior(model, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD},
                                draws=100, tune=100, chains=2, cores=1, seed=0, max_rounds=1, progressbar=False)
    k = tree.posterior["k"].values
    assert np.all(np.isfinite(k)) and k.max() < 0.8 and np.median(k) > 0.7


def test_log_scale_names_and_bad_log_scale():
    from pgpgm.errors import DataError
    from pgpgm.posterior.model import log_scale_names
    from pgpgm.priors import Priors

    pri = Priors.from_user(["a", "b", "c", "d"], {"a": (0.0, 10.0), "b": (0.0, 10.0), "c": (1.0, 10.0),
                                                  "d": (0.0, 2.0)})
    # every Uniform(0, upper) parameter; c's lower bound is not 0 (no log scale there)
    assert log_scale_names(pri) == ("a", "b", "d")
    import pymc as pm

    normal = Priors.from_user(["a", "b"], {"a": (0.0, 10.0), "b": lambda name: pm.Normal(name, 1.0, 1.0)})
    assert log_scale_names(normal) == ("a",)  # a callable prior keeps its own transform
    obs = _decay_data(0.8, 2.0, seed=3)
    with pytest.raises(DataError, match="log_scale"):
        build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.1, 5.0)}, noise_sd=[SD], log_scale=["k"])


def test_chains_around_a_centre_on_the_bound_start_inside_the_box():
    """A refined point on the upper bound (theta3 = 10 in Uniform(0, 10): Lotka-Volterra x2 with large
    noise, seed 4) has no finite log density on the log scale: it was the last-resort start of a chain
    whose draws all fell outside the box, and the fit ended with "Bad initial energy". Draws outside the
    box are mirrored inside: every start has a finite density and lies below the bound."""
    from pgpgm.posterior.space import ValueSpace, dispersed_starts

    obs = _decay_data(0.98, 2.0, seed=3)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 1.0)}, noise_sd=[SD], log_scale=["k"])
    space = ValueSpace(model)
    x0 = float(obs.values[0, 0])
    starts = dispersed_starts(space, {"k": 1.0, "x_0": x0}, {"k": 0.05, "x_0": SD}, 200, np.random.default_rng(0))
    k = np.array([float(p["k"]) for p in starts])
    assert all(np.isfinite(space.logp(p)) for p in starts)
    assert k.max() < 1.0 and 0.02 < np.mean(1.0 - k) < 0.06  # |Normal(0, 0.05)|: mean 0.04
    assert np.std([float(p["x_0"]) for p in starts]) > 0.5 * SD  # the other coordinate keeps its spread


def test_a_last_draw_rounded_onto_the_bound_still_continues():
    """A chain far out on the soft wall comes back from the log scale as exactly its upper bound
    (theta = 10.0 in Uniform(0, 10) on Lotka-Volterra x2 with large noise, seed 4); starting the next
    round there was "Bad initial energy" and a failed fit. The next round's start moves inside the
    box by a negligible step; a draw inside it is kept as it is."""
    import xarray as xr

    from pgpgm.posterior.space import ValueSpace, continuing_starts, pooled_covariance

    obs = _decay_data(0.98, 2.0, seed=3)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 1.0)}, noise_sd=[SD], log_scale=["k"])
    space = ValueSpace(model)
    x0 = float(obs.values[0, 0])
    post = xr.Dataset({"k": (("chain", "draw"), [[0.95, 0.97, 1.0], [0.9, 0.99, 0.96]]),
                       "x_0": (("chain", "draw"), [[x0, x0, x0], [x0, x0, x0 + 0.01]])})
    assert not np.isfinite(space.logp({"k": 1.0, "x_0": x0}))  # the bound itself: log(0) on the log scale
    first, second = continuing_starts(space, post)
    assert 1.0 - 1e-8 < float(first["k"]) < 1.0 and float(first["x_0"]) == x0
    assert np.isfinite(space.logp(first))
    assert float(second["k"]) == 0.96 and float(second["x_0"]) == x0 + 0.01  # inside: unchanged
    C = pooled_covariance(space, post)  # the draw on the bound is left out of the next round's mass matrix
    inside = np.array([[np.log(k) - np.log1p(-k ** 8) / 8, x] for k, x in
                       zip([0.95, 0.97, 0.9, 0.99, 0.96], [x0, x0, x0, x0, x0 + 0.01])])
    assert np.allclose(C, 5 / 10 * np.cov(inside.T) + 1e-3 * 5 / 10 * np.eye(2))


def test_pooled_covariance_is_the_covariance_of_the_transformed_draws():
    import xarray as xr

    from pgpgm.posterior.space import ValueSpace, pooled_covariance

    obs = _decay_data(0.8, 2.0, seed=3)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_center=[0.2])
    rng = np.random.default_rng(0)
    k, x_0, sig = rng.uniform(0.5, 1.5, (3, 40)), rng.normal(2, 0.1, (3, 40)), rng.uniform(0.05, 0.3, (3, 40))
    post = xr.Dataset({"k": (("chain", "draw"), k), "x_0": (("chain", "draw"), x_0),
                       "sigma_x": (("chain", "draw"), sig)})
    C = pooled_covariance(ValueSpace(model), post)
    # independent: the interval (log-odds) transform of k on (0, 5), identity, log
    cols = {"k_interval__": np.log(k / (5 - k)), "x_0": x_0, "sigma_x_log__": np.log(sig)}
    U = np.column_stack([cols[v.name].ravel() for v in model.value_vars])
    n = U.shape[0]
    np.testing.assert_allclose(C, n / (n + 5) * np.cov(U.T) + 1e-3 * 5 / (n + 5) * np.eye(3), rtol=1e-10)


def test_a_failed_first_round_is_followed_by_a_pooled_round_that_converges():
    """30 tuning iterations from a bad mass matrix: the first round fails the checks (recorded in
    the result); the next round (pooled dense mass matrix) passes them, and its draws match the
    exact posterior."""
    import json

    from pgpgm.posterior.diagnostics import problems

    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    start, sd = {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.5, "x_0": 0.01}  # badly scaled seed
    kw = dict(draws=200, tune=30, chains=4, cores=1, seed=2, progressbar=False, nuts_sampler="pymc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        more = sample_posterior(model, start, sd, max_rounds=3, **kw)
    rounds, reasons = more.attrs["pgpgm_rounds"], json.loads(more.attrs["pgpgm_round_problems"])
    assert rounds >= 2 and len(reasons) == rounds - 1
    assert reasons[0] and all(isinstance(r, str) for r in reasons[0])  # the first round alone is not converged
    diag = diagnose(more, layout.free)
    assert not problems(diag), problems(diag)
    (mk, sk), _ = _exact_moments(obs)
    draws = more.posterior["k"].values.ravel()
    ess = float(diag["ess_bulk"].sel(variable="k"))
    assert abs(draws.mean() - mk) < 4 * sk / np.sqrt(ess)
    with pytest.raises(pgpgm.errors.DataError, match="max_rounds"):
        sample_posterior(model, start, sd, max_rounds=0, **kw)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_default_fit_converges_on_lotka_volterra_x1_observed(lv):
    """Issue 10 target: the fit's NUTS posterior on LV x1 observed, noise seed 0, meets R-hat <= 1.01
    and ESS >= 400 (a banana-shaped, weakly identified posterior); divergences are counted in the
    diagnostics (issue 30: named, not hidden). Issue 10 also asked for none: met from 2026-11-24 (PyMC's
    engine, CVODE, 193 s), no longer on 2026-11-28: the default engine (nutpie) has 395 of 45612
    transitions diverge at the ridge's far end (theta1 4.9 against a median 2.5); PyMC's engine 21-53
    divergences in three runs, one of them also short of R-hat (1.018) and ESS (201) after its rounds.
    It needs more than step 4's default budget (60 s): ``pgpgm.NUTS(budget=None)``."""
    from pgpgm.posterior.diagnostics import mixing_problems

    c = lv.case("x1-observed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(lv.system, lv.simulate("x1-observed", seed=0), c.observed, kernel=c.kernel, gamma=c.gamma,
                      priors=lv.priors("x1-observed"), seed=0, progressbar=False,
                      posterior=pgpgm.NUTS(budget=None))
    d = r.diagnostics.sel(sampler="posterior")
    assert int(d["divergences"]) == int(r.posterior.sample_stats["diverging"].sum())
    assert not mixing_problems(d), mixing_problems(d)  # R-hat <= 1.01 and ESS >= 400


# ------------------------------------------------------------------ compilation paid once (issue 12)
def _fhn_step4_logp(fhn, y, theta, x0, sigma, x0_mu, x0_sd, center, p):
    """Step 4's log density of FitzHugh-Nagumo with R observed, written out independently: uniform
    priors on (0, 5), Normal prior of R_0, LogNormal(log center, 2) prior of sigma_R, Gaussian
    likelihood of y around a DOP853 solve (rtol 1e-12); plus the log-Jacobians of the sampling
    scales (soft log of theta: theta = (exp(-p phi) + 5^-p)^(-1/p); log of sigma)."""
    from tests.conftest import scipy_reference

    X = scipy_reference(fhn.system, theta, x0, fhn.case("R-observed").times)
    lp = -3 * np.log(5.0) + np.sum(np.log(theta) + np.log1p(-(theta / 5.0) ** p))
    lp += stats.norm.logpdf(x0[1], x0_mu, x0_sd) + stats.lognorm.logpdf(sigma, 2.0, scale=center) + np.log(sigma)
    return lp + stats.norm.logpdf(y, X[:, 1], sigma).sum()


def test_step4_compiled_once_serves_a_second_data_set_with_its_own_numbers(fhn):
    """Issue 12 (compilation paid once), step 4: the ODE model's observations and data-dependent
    constants are pm.Data, so the model of a second data set (same grid, other observations, prior
    centres and known latent x0) compiles nothing - neither NUTS's log density and gradient nor the
    rest of sample_posterior - and its log density is that data set's own (the numpy formula), not
    the first one's. pm.set_data carries a model built for one data set to the other."""
    import pymc as pm
    from numba.core import event
    from pymc.blocking import DictToArrayBijection

    from pgpgm.posterior.space import ValueSpace
    from pgpgm.priors import SOFT_WALL_SHARPNESS

    c = fhn.case("R-observed")
    # as fit(): the log scale of a, b, c; CVODE at rtol 1e-12, whose states are within 2e-9 of the reference
    # (measured 1.6e-9 here; 3e-6 at the default 1e-8): the log densities then agree to ~1e-9 relative
    kw = dict(priors=fhn.priors("R-observed"), log_scale=("a", "b", "c"), solver=pgpgm.CVODE(rtol=1e-12, atol=1e-12))
    x0s, centers = (np.array(c.x0), np.array(c.x0) + [0.1, 0.0]), (0.05, 0.08)  # the known V_0 differs too
    q = {"a": 0.21, "b": 0.19, "c": 3.05, "R_0": 1.02, "sigma_R": 0.075}
    runs = []
    for seed, x0, center in zip((0, 1), x0s, centers):
        ds = fhn.simulate("R-observed", seed=seed)
        y = ds.y.values[:, 0]
        with event.install_recorder("numba:compile") as rec, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, layout = build_ode_model(fhn.system, ds, x0=x0, noise_center=[center], **kw)
            sample_posterior(model, q, {n: 0.01 for n in q}, draws=5, tune=5, chains=1, cores=1, seed=0,
                             progressbar=False, nuts_sampler="pymc")  # PyMC's compiled function
            fn = model.logp_dlogp_function(ravel_inputs=True)  # NUTS's log density and gradient
            fn.set_extra_values({})
            point = ValueSpace(model).point(q)
            lp, grad = fn(DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}).data)
        ref = _fhn_step4_logp(fhn, y, np.array([q["a"], q["b"], q["c"]]), np.array([x0[0], q["R_0"]]), q["sigma_R"],
                              y[0], np.std(y), center, SOFT_WALL_SHARPNESS)
        runs.append((model, fn, lp, grad, ref, sum(1 for _, e in rec.buffer if e.is_start)))
    (m1, fn1, lp1, g1, ref1, _), (m2, fn2, lp2, g2, ref2, compiles2) = runs
    assert compiles2 == 0
    assert abs(lp2 - lp1) > 1.0  # the two data sets' densities differ, and each is its own
    assert lp1 == pytest.approx(ref1, rel=1e-8, abs=0) and lp2 == pytest.approx(ref2, rel=1e-8, abs=0)
    # the first data set's model and compiled function, its data set to the second data set's: the second's numbers
    with m1:
        pm.set_data({name: m2[name].get_value() for name in ("_y_R", "_x0_mu_R", "_x0_sd_R", "_log_noise_center_R",
                                                             "_x0_V")})
    lp12, g12 = fn1(DictToArrayBijection.map({v.name: ValueSpace(m1).point(q)[v.name] for v in m1.value_vars}).data)
    assert lp12 == lp2 and np.array_equal(g12, g2)


def test_a_further_round_is_sized_from_the_last_rounds_ess_per_draw():
    """next_round_draws: the last round's min ESS per draw carried to 2 x 400, kept within
    [draws, 4 draws]: 500 draws with ESS 412 (FitzHugh-Nagumo V seed 4) -> 971; 2000 draws with
    ESS 54 -> the cap 2000; 2000 draws with ESS 5000 -> the floor 500; an ESS of 0 counts as 1."""
    from pgpgm.posterior.diagnostics import ESS_MIN
    from pgpgm.posterior.rounds import ROUND_ESS_MARGIN, next_round_draws

    assert ROUND_ESS_MARGIN * ESS_MIN == 800
    assert next_round_draws(500, 412.0, 500) == int(np.ceil(500 * 800 / 412))
    assert next_round_draws(500, 412.0, 500) == 971
    assert next_round_draws(2000, 54.0, 500) == 2000
    assert next_round_draws(2000, 5000.0, 500) == 500
    assert next_round_draws(500, 0.0, 500) == 2000
    # a round that extends 2500 kept draws with ESS 600: 2500 * 800 / 600 - 2500 = 834 more
    assert next_round_draws(2500, 600.0, 500, extends=True) == int(np.ceil(2500 * 800 / 600 - 2500)) == 834
    assert next_round_draws(2500, 790.0, 500, extends=True) == 500  # a few more draws: at least ``draws``


def _recording_rounds(monkeypatch, mark=None, rhat1=None, mixing=None, forced=2):
    """Patch pgpgm.posterior.rounds so that every pm.sample call is recorded (``calls``: its arguments and
    tree), the checks fail ``forced`` times (``checks``: the diagnostics judged), every pooled covariance
    is seen (``seen``); ``mark`` (call number, chain, draw) marks a divergence in a call's tree, ``rhat1``
    replaces the first round's R-hat, ``mixing`` (a list of bools) forces the answers of mixing_problems."""
    import pgpgm.posterior.rounds as post_mod

    calls, checks, seen, asked = [], [], [], []
    real_sample, real_problems, real_mixing = post_mod.pm.sample, post_mod.problems, post_mod.mixing_problems
    real_full, real_diagnose = post_mod.QuadPotentialFull, post_mod.diagnose

    def sample(*args, **kwargs):
        calls.append(dict(kwargs, tree=real_sample(*args, **kwargs)))
        if mark is not None and len(calls) == mark[0]:
            calls[-1]["tree"]["sample_stats"]["diverging"].values[mark[1], mark[2]] = True
        return calls[-1]["tree"]

    def diagnose(tree, names, ess_min=400):
        d = real_diagnose(tree, names, ess_min)
        return d.assign(rhat=d["rhat"] * 0 + rhat1) if rhat1 is not None and len(calls) == 1 else d

    def problems(diag):
        checks.append(diag)
        return real_problems(diag) or (["forced"] if len(checks) <= forced else [])

    def mixing_problems(diag):
        asked.append(diag)
        if mixing is not None and len(asked) <= len(mixing):  # (later calls, e.g. the final warnings': the real one)
            return ["forced"] if mixing[len(asked) - 1] else []
        return real_mixing(diag) or (["forced"] if len(asked) <= forced else [])

    def full(cov, *a, **k):
        seen.append(np.array(cov))
        return real_full(cov, *a, **k)

    for name, fn in (("diagnose", diagnose), ("problems", problems), ("mixing_problems", mixing_problems),
                     ("QuadPotentialFull", full)):
        monkeypatch.setattr(post_mod, name, fn)
    monkeypatch.setattr(post_mod.pm, "sample", sample)
    return calls, checks, seen


def _decay_rounds(max_rounds: int):
    obs = _decay_data(0.8, 2.0, seed=3)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = sample_posterior(model, {"k": 0.8, "x_0": 2.0}, {"k": 0.05, "x_0": 0.05}, draws=200, tune=200,
                                chains=4, cores=1, seed=1, max_rounds=max_rounds, progressbar=False,
                                nuts_sampler="pymc")  # PyMC's rounds
    return tree, model, layout


@pytest.mark.parametrize("case", ["mixing", pytest.param("diverge", marks=pytest.mark.slow),
                                  pytest.param("unmixed", marks=pytest.mark.slow)])
def test_further_rounds_extend_the_chains_and_are_judged_together(monkeypatch, case):
    """Rounds run because R-hat or ESS failed continue each chain from its last draw and the result
    holds the draws of every round, the first one's included (``mixing``); round 3 is sized from the
    ESS per draw of the draws kept (extends=True) and its mass matrix is their pooled covariance. The
    checks are forced to fail twice so that three rounds run. A divergence in round 2 (``diverge``) is
    carried too (more draws cannot remove it; the result counts it). A first round whose chains have
    not met (``unmixed``: R-hat 1.2 > RHAT_CARRY) is dropped as warm-up."""
    import json

    import xarray as xr

    from pgpgm.posterior.diagnostics import mixing_problems
    from pgpgm.posterior.rounds import RHAT_CARRY, next_round_draws
    from pgpgm.posterior.space import ValueSpace, pooled_covariance

    assert RHAT_CARRY == 1.05
    calls, checks, seen = _recording_rounds(monkeypatch, mark=(2, 1, 7) if case == "diverge" else None,
                                            rhat1=1.2 if case == "unmixed" else None)
    tree, model, layout = _decay_rounds(3)
    assert len(calls) == 3 and tree.attrs["pgpgm_rounds"] == 3 and len(checks) == 2
    r1, r2, r3 = (c["tree"] for c in calls)
    n2, n3 = calls[1]["draws"], calls[2]["draws"]
    assert json.loads(tree.attrs["pgpgm_round_draws"]) == [200, n2, n3]
    kept = [r2, r3] if case == "unmixed" else [r1, r2, r3]
    assert json.loads(tree.attrs["pgpgm_kept_rounds"]) == ([2, 3] if case == "unmixed" else [1, 2, 3])
    assert n2 == next_round_draws(200, _min_ess(checks[0]), 200, extends=case != "unmixed")
    assert n3 == next_round_draws(200 * (case != "unmixed") + n2, _min_ess(checks[1]), 200, extends=True)
    for name in ("k", "x_0"):
        got = tree.posterior[name].values
        np.testing.assert_array_equal(got, np.concatenate([r.posterior[name].values for r in kept], 1))
        for c in range(4):  # each round starts every chain where the round before left it
            assert calls[1]["initvals"][c][name] == r1.posterior[name].values[c, -1]
            assert calls[2]["initvals"][c][name] == r2.posterior[name].values[c, -1]
    n_kept = sum(r.posterior.sizes["draw"] for r in kept)
    np.testing.assert_array_equal(tree.posterior["draw"].values, np.arange(n_kept))
    assert tree.sample_stats["diverging"].shape == (4, n_kept)
    assert int(tree.sample_stats["diverging"].sum()) == (1 if case == "diverge" else 0)
    assert json.loads(tree.attrs["pgpgm_round_gradient_evaluations"]) == [int(r.sample_stats["n_steps"].sum())
                                                                          for r in (r1, r2, r3)]
    space = ValueSpace(model)
    before3 = xr.concat([r.posterior for r in kept[:-1]], dim="draw")  # the draws kept when round 3 began
    np.testing.assert_allclose(seen[0], pooled_covariance(space, r1.posterior), rtol=1e-12)
    np.testing.assert_allclose(seen[1], pooled_covariance(space, before3), rtol=1e-12)
    assert not mixing_problems(diagnose(tree, layout.free))  # and the kept draws mix


@pytest.mark.parametrize("passes", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_round_for_divergences_alone_replaces_the_draws_only_when_it_passes(monkeypatch, passes):
    """Round 1 passes R-hat and ESS but holds a divergence: round 2 draws afresh (a raised target) and
    is kept only when it passes R-hat and ESS too; when it does not, round 1's draws are the result."""
    import json

    calls, _, _ = _recording_rounds(monkeypatch, mark=(1, 0, 3), mixing=[False, not passes], forced=0)
    tree, _, _ = _decay_rounds(2)
    assert len(calls) == 2 and tree.attrs["pgpgm_rounds"] == 2
    assert calls[1]["step"].target_accept == pytest.approx(0.95)
    kept = calls[1]["tree"] if passes else calls[0]["tree"]
    assert json.loads(tree.attrs["pgpgm_kept_rounds"]) == ([2] if passes else [1])
    np.testing.assert_array_equal(tree.posterior["k"].values, kept.posterior["k"].values)
    assert int(tree.sample_stats["diverging"].sum()) == int(kept.sample_stats["diverging"].sum())


def _min_ess(diag) -> float:
    return float(np.nanmin(np.minimum(diag["ess_bulk"].values, diag["ess_tail"].values)))


# ---------------------------------------------------------------- step 4's solver tolerance
def test_nuts_rtol_is_checked_and_reaches_the_step4_model(monkeypatch):
    """``pgpgm.NUTS(rtol=...)``: a number in (0, 1) or None; step 4's model solves at that relative
    tolerance with the fit's solver's atol, and None leaves the fit's solver as it is."""
    import pgpgm.steps.posterior as pipeline

    for bad in (0.0, 1.0, -1e-6, "1e-6"):
        with pytest.raises(DataError, match="NUTS rtol"):
            pgpgm.NUTS(rtol=bad)
    assert pgpgm.NUTS().rtol == 1e-6
    system = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
    t = np.linspace(0, 3, 12)
    y = 2.0 * np.exp(-0.8 * t) + np.random.default_rng(3).normal(0, 0.1, t.size)
    seen = []
    real = pipeline.build_ode_model

    class Built(Exception):
        """step 4's model is built: what it was built with is seen, nothing needs to be sampled"""

    def capture(*args, **kw):
        seen.append(kw["solver"])
        real(*args, **kw)
        raise Built

    monkeypatch.setattr(pipeline, "build_ode_model", capture)
    solver = pgpgm.CVODE(rtol=1e-9, atol=1e-7)
    for rtol in (1e-5, None):
        with warnings.catch_warnings(), pytest.raises(Built):
            warnings.simplefilter("ignore")
            pgpgm.fit(system, {"time": t, "x": y}, observed=["x"], priors=(0.0, 5.0), draws=200, tune=100, seed=1,
                      solver=solver, progressbar=False,
                      posterior=pgpgm.NUTS(draws=30, tune=30, chains=1, cores=1, rounds=1, rtol=rtol))
    # step 4's default solver="auto": the explicit DOPRI5 at those tolerances, the fit's CVODE behind it
    at = pgpgm.CVODE(rtol=1e-5, atol=1e-7, max_steps=solver.max_steps)
    assert seen[0] == pgpgm.DOPRI5(rtol=1e-5, atol=1e-7, max_steps=1000, fallback=at, stiffness=True)
    assert seen[1] == pgpgm.DOPRI5(rtol=1e-9, atol=1e-7, max_steps=1000, fallback=solver, stiffness=True)


def test_step4_log_density_at_the_default_tolerance_against_a_tight_solve():
    """The default step-4 tolerance (rtol 1e-6), with CVODE and with step 4's default DOPRI5, against rtol =
    atol = 1e-12: FitzHugh-Nagumo with R observed (V latent), at the truth and at points 20 % off it,
    moves the log density by < 1e-3 nats
    and its gradient by < 1e-3 of its size - far below what NUTS or a posterior sd notice."""
    from pgpgm.posterior.rounds import POSTERIOR_RTOL
    from pgpgm.posterior.space import ValueSpace

    m = pgpgm.load_model("fitzhugh-nagumo")
    case = m.cases["R-observed"]
    data = m.simulate("R-observed", seed=0)
    obs = as_observations(data, list(case.observed), m.system)
    x0 = np.asarray(case.x0, float)
    out = []
    solvers = (pgpgm.CVODE(rtol=POSTERIOR_RTOL), pgpgm.NUTS().solver_for(pgpgm.CVODE()),  # the default: DOPRI5
               pgpgm.CVODE(rtol=1e-12, atol=1e-12))
    for solver in solvers:
        model, _ = build_ode_model(m.system, obs, x0=x0, priors=(0.0, 10.0), noise_sd=[0.1], solver=solver)
        space = ValueSpace(model)
        values = []
        for scale in (1.0, 0.8, 1.2):
            point = {**dict(zip(m.system.parameters, scale * np.asarray(case.theta))), "R_0": x0[1]}
            x = np.concatenate([np.ravel(space.point(point)[v.name]) for v in model.continuous_value_vars])
            lp, grad = space.logp_dlogp(x)
            values.append((float(lp), np.asarray(grad, float)))
        out.append(values)
    for values in out[:2]:
        for (lp, g), (lp_ref, g_ref) in zip(values, out[2]):
            assert abs(lp - lp_ref) < 1e-3
            assert np.max(np.abs(g - g_ref)) < 1e-3 * np.max(np.abs(g_ref))


@pytest.mark.slow
def test_default_fit_of_an_epidemic_from_few_infected_has_no_divergences():
    """SIR with I measured (the shipped case at 15 irregular times, noise sd 10), the plain default fit: I's
    initial value (refined ~0.3, I(0) = 1 true) is sampled on the log scale, as the equations keep I positive.
    On I's own scale this fit had 1589 divergences of 32160 draws and stopped at the 60 s budget
    (2026-11-29); now no divergence, converged, every I_0 draw positive."""
    from pgpgm.posterior.diagnostics import mixing_problems

    spec = pgpgm.load_model("sir")
    c = spec.case()
    rng = np.random.default_rng(0)
    t = np.sort(np.concatenate([[c.times[0]], rng.uniform(c.times[0], c.times[-1], len(c.times) - 1)]))
    data = pgpgm.simulate(spec.system, c.theta, c.x0, t, observed=list(c.observed), noise_sd=c.noise_sd, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(spec.system, data, list(c.observed), progressbar=False, seed=0)
    d = r.diagnostics.sel(sampler="posterior")
    assert int(d["divergences"]) == 0 == int(r.posterior.sample_stats["diverging"].sum())
    assert not mixing_problems(d), mixing_problems(d)  # R-hat <= 1.01 and ESS >= 400
    assert r.posterior.posterior["I_0"].values.min() > 0


def test_positive_initial_values_are_those_near_zero_of_states_kept_positive():
    """SIR: I refined at 0.3 +- 0.2 (within 5 se of 0) is sampled on the log scale, and so is an I with an
    unknown se; S at 762 +- 5 is far from 0 (its own scale), R is not kept positive by the equations
    (R' = gamma I), a negative refined value is left as it is."""
    from pgpgm.posterior.model import POSITIVE_X0_SE, positive_initial_values

    sir = pgpgm.load_model("sir").system
    assert POSITIVE_X0_SE == 5.0
    assert positive_initial_values(sir, {"S": (762.0, 5.0), "I": (0.3, 0.2), "R": (0.1, 1.0)}) == ("I",)
    assert positive_initial_values(sir, {"I": (0.3, np.nan)}) == ("I",)
    assert positive_initial_values(sir, {"I": (-0.3, 0.2)}) == ()
    assert positive_initial_values(sir, {"I": (1.1, 0.2)}) == ()  # 5.5 se from 0
    assert positive_initial_values(sir, {"S": (0.9, 0.2)}) == ("S",)


def test_evenly_spaced_rows_index_as_a_slice():
    """``as_slice``: the same rows, by a slice where they are evenly spaced (basic indexing compiles fast)."""
    from pgpgm.posterior.model import as_slice

    values = np.arange(100.0) ** 2
    for rows in (np.arange(7), np.arange(3, 40, 4), np.array([5]), np.array([0, 2, 3, 4]), np.array([], int)):
        got = as_slice(rows)
        np.testing.assert_array_equal(values[got], values[rows])
        assert isinstance(got, slice) == (rows.size > 1 and np.ptp(np.diff(rows)) == 0)

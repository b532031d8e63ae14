"""Measurement noise models in fit (issue 31, items 4 and 5): lognormal noise on a state that starts
at 0, Poisson and negative-binomial counts.

References are independent of pgpgm: the closed-form one-compartment solution and scipy's solve_ivp
for SIR, likelihoods from scipy.stats, multi-start optima by scipy.optimize, finite differences; the
theophylline optima also against the committed benchmarks/references/studies_reference_theoph.json.
"""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm.datasets import influenza_boarding_school, theophylline, theophylline_inputs
from pgpgm.errors import DataError
from pgpgm.posterior.space import ValueSpace
from pgpgm.posterior.model import build_ode_model
from pgpgm.refinement import LeastSquaresProblem, refine

PK = pgpgm.load_model("pk-oral").system
SIR = pgpgm.load_model("sir").system
PK_PRIORS = {"ka": (0.0, 10.0), "ke": (0.0, 1.0), "CL": (0.0, 0.5)}
STUDIES = Path(__file__).resolve().parents[1] / "benchmarks" / "references" / "studies_reference_theoph.json"


def _fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgpgm.fit(*args, progressbar=False, **kwargs)


# ------------------------------------------------------------------ independent references
def _conc(t, dose, ka, ke, cl):
    """Closed-form C(t) of the one-compartment oral model with C(0) = 0 (ka != ke)."""
    return dose * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


def _lognormal_reference(t, y, dose, n_starts=30, seed=0):
    """Multi-start ML of (ka, ke, CL) under log y ~ N(log C, sd^2), sd profiled out; y > 0 entries."""
    keep = np.isfinite(y)
    t, ly = t[keep], np.log(y[keep])
    n = ly.size

    def res(q):
        ka, ke, cl = np.exp(q)
        mu = _conc(t, dose, ka, ke, cl)
        return ly - np.log(np.maximum(mu, 1e-300)) if np.all(mu > 0) else np.full(n, 1e3)

    rng = np.random.default_rng(seed)
    best = None
    for _ in range(n_starts):
        q0 = np.log([rng.uniform(0.3, 5.0), rng.uniform(0.01, 0.3), rng.uniform(0.005, 0.2)])
        r = optimize.least_squares(res, q0, xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=3000)
        ka, ke, _ = np.exp(r.x)
        if ka < ke:  # the (ka, ke)-symmetric branch: report ka > ke (the priors' ke <= 1 side)
            continue
        rss = float(r.fun @ r.fun)
        nll = 0.5 * n * np.log(rss / n) + 0.5 * n * (1 + np.log(2 * np.pi)) + float(ly.sum())
        if best is None or nll < best[0]:
            best = (nll, np.exp(r.x), np.sqrt(rss / n))
    return best


def _sir(t, beta, gamma, x0=(762.0, 1.0, 0.0)):
    sol = solve_ivp(lambda _, x: [-beta * x[0] * x[1] / 763, beta * x[0] * x[1] / 763 - gamma * x[1], gamma * x[1]],
                    (t[0], t[-1]), x0, t_eval=t, method="DOP853", rtol=1e-11, atol=1e-10)
    return sol.y[1]


def _count_nll(q, t, y, noise):
    beta, gamma = np.exp(q[:2])
    mu = _sir(t, beta, gamma)
    m = np.isfinite(y)
    if noise == "poisson":
        return -np.sum(stats.poisson.logpmf(y[m], mu[m]))
    alpha = np.exp(q[2])
    return -np.sum(stats.nbinom.logpmf(y[m], alpha, alpha / (alpha + mu[m])))


def _count_reference(t, y, noise, n_starts=8, seed=0):
    """Multi-start ML of (beta, gamma[, alpha]) of SIR counts, Nelder-Mead then L-BFGS-B in logs."""
    rng = np.random.default_rng(seed)
    best = None
    for _ in range(n_starts):
        q0 = np.log([rng.uniform(0.8, 4.0), rng.uniform(0.1, 1.0)] + ([rng.uniform(1.0, 50.0)] if noise == "negbin"
                                                                        else []))
        r = optimize.minimize(_count_nll, q0, args=(t, y, noise), method="Nelder-Mead",
                              options={"xatol": 1e-9, "fatol": 1e-11, "maxiter": 4000})
        r = optimize.minimize(_count_nll, r.x, args=(t, y, noise), method="L-BFGS-B", options={"ftol": 1e-14})
        if best is None or r.fun < best[0]:
            best = (float(r.fun), np.exp(r.x))
    return best


def _theoph(subject: str):
    d = theophylline()
    d = d[d.experiment == subject]
    dose = float(theophylline_inputs().set_index("experiment").loc[subject, "dose_mg_per_kg"])
    t, y = d.time.to_numpy(), d.value.to_numpy().copy()
    y[t == 0] = np.nan  # the pre-dose sample: C(0) = 0 in the model, which lognormal noise cannot explain
    return t, y, dose


def _flu():
    flu = influenza_boarding_school()
    return np.r_[0.0, flu.time.to_numpy()], np.r_[np.nan, flu.in_bed.to_numpy().astype(float)]


# ------------------------------------------------------------------ lognormal noise, C(0) = 0
def test_theoph_subject_lognormal_noise_with_zero_initial_concentration():
    t, y, dose = _theoph("1")
    r = _fit(PK, {"time": t, "C": y}, ["C"], x0={"A": dose, "C": 0.0}, noise={"C": "lognormal"},
             priors=PK_PRIORS, draws=300, tune=300, posterior=None, seed=1)
    assert r.x0["C"] == 0.0 and json.loads(r.estimates.attrs["noise"]) == {"C": "lognormal"}
    nll, theta, sd = _lognormal_reference(t, y, dose)
    np.testing.assert_allclose(r.theta, theta, rtol=1e-4)
    np.testing.assert_allclose(r.trajectories["noise_sd"].values, [sd], rtol=1e-4)
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(nll, abs=1e-5)
    # the likelihood at the optimum is scipy.stats.lognorm's on the measured values
    m = np.isfinite(y)
    mu = _conc(t[m], dose, *r.theta)
    scipy_nll = -np.sum(stats.lognorm.logpdf(y[m], s=r.trajectories["noise_sd"].values[0], scale=mu))
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(scipy_nll, abs=1e-5)  # solvers differ ~1e-7
    # the studies' 200-start reference (benchmarks/studies_reference.py)
    ref = json.loads(STUDIES.read_text())["per_subject"]["lognormal"]["1"]
    np.testing.assert_allclose(r.theta, [ref["ka"], ref["ke"], ref["CL"]], rtol=1e-4)
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(ref["nll"], abs=1e-5)


def test_simulated_subject_lognormal_noise_recovers_the_truth():
    theta, dose = np.array([1.5, 0.085, 0.04]), 4.5
    t = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 16.0, 24.0])
    truth = pgpgm.simulate(PK, theta, [dose, 0.0], t, observed=["C"], noise_sd=0.0)["y"].values[:, 0]
    rng = np.random.default_rng(4)
    y = truth * np.exp(0.1 * rng.normal(size=t.size))
    y[0] = np.nan  # C(0) = 0 is not measured
    r = _fit(PK, {"time": t, "C": y}, ["C"], x0={"A": dose, "C": 0.0}, noise={"C": "lognormal"},
             priors=PK_PRIORS, draws=300, tune=300, posterior=None, seed=2)
    nll, ref, _ = _lognormal_reference(t, y, dose)
    np.testing.assert_allclose(r.theta, ref, rtol=1e-4)
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(nll, abs=1e-5)
    se = r.estimates["stderr"].values
    assert np.all(np.abs(r.theta - theta) < 3 * se), (r.theta, se)


# ------------------------------------------------------------------ counts
def test_simulate_draws_counts_with_numpy_generators():
    t = np.linspace(0.0, 14.0, 15)
    ds = pgpgm.simulate(SIR, [1.7, 0.45], [762.0, 1.0, 0.0], t, observed=["I"], noise="poisson", seed=3)
    rng = np.random.default_rng(3)
    rng.normal(size=(t.size, 1))  # the Gaussian draws come first
    np.testing.assert_array_equal(ds["y"].values[:, 0], rng.poisson(ds["truth"].values[:, 1]))
    assert ds.attrs["noise"] == ["poisson"]
    nb = pgpgm.simulate(SIR, [1.7, 0.45], [762.0, 1.0, 0.0], t, observed=["I"], noise="negbin", alpha=5.0, seed=3)
    rng = np.random.default_rng(3)
    rng.normal(size=(t.size, 1))
    mu = nb["truth"].values[:, 1]
    np.testing.assert_array_equal(nb["y"].values[:, 0], rng.poisson(rng.gamma(5.0, mu / 5.0)))
    with pytest.raises(DataError, match="needs alpha"):
        pgpgm.simulate(SIR, [1.7, 0.45], [762.0, 1.0, 0.0], t, observed=["I"], noise="negbin")


def test_simulated_sir_poisson_counts_at_the_independent_optimum():
    t = np.linspace(0.0, 14.0, 15)
    ds = pgpgm.simulate(SIR, [1.7, 0.45], [762.0, 1.0, 0.0], t, observed=["I"], noise="poisson", seed=5)
    y = ds["y"].values[:, 0].copy()
    y[0] = np.nan  # I(0) = 1 is known
    r = _fit(SIR, {"time": t, "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
             noise={"I": "poisson"}, priors=(0.0, 10.0), draws=300, tune=300, posterior=None, seed=1)
    nll, ref = _count_reference(t, y, "poisson", n_starts=4)  # 4 reach the optimum of 8 to the last digit: measured
    np.testing.assert_allclose(r.theta, ref, rtol=1e-4)
    at_r = _count_nll(np.log(r.theta), t, y, "poisson")  # scipy's likelihood at pgpgm's optimum
    assert at_r <= nll + 1e-6 and r.estimates.attrs["refinement_nll"] == pytest.approx(at_r, abs=1e-5)
    se = r.estimates["stderr"].values
    assert np.all(np.abs(r.theta - [1.7, 0.45]) < 3 * se), (r.theta, se)


@pytest.mark.slow  # accuracy, ~21 s
def test_flu_counts_negative_binomial_at_the_independent_optimum():
    t, y = _flu()
    r = _fit(SIR, {"time": t, "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
             noise={"I": "negbin"}, priors=(0.0, 10.0), draws=300, tune=300, posterior=None, seed=1)
    nll, ref = _count_reference(t, y, "negbin", n_starts=4)  # 4 reach the optimum of 8 to the last digit: measured
    np.testing.assert_allclose(r.theta, ref[:2], rtol=1e-4)
    np.testing.assert_allclose(r.trajectories["noise_sd"].values, ref[2:], rtol=1e-3)  # alpha
    at_r = _count_nll(np.log([*r.theta, *r.trajectories["noise_sd"].values]), t, y, "negbin")
    assert at_r <= nll + 1e-6 and r.estimates.attrs["refinement_nll"] == pytest.approx(at_r, abs=1e-5)
    mu = _sir(t, *r.theta)[1:]
    a = r.trajectories["noise_sd"].values[0]
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(
        -np.sum(stats.nbinom.logpmf(y[1:], a, a / (a + mu))), abs=1e-5)


@pytest.mark.slow
def test_flu_counts_poisson_refinement_at_the_independent_optimum():
    t, y = _flu()
    p = LeastSquaresProblem(pgpgm.Integrator(SIR, t), y, (1,), 1.0, np.array([762.0, 1.0, 0.0]), noise=("poisson",))
    r = refine(p, [1.0, 0.3], [[0.0, 10.0], [0.0, 10.0]])
    nll, ref = _count_reference(t, y, "poisson")
    np.testing.assert_allclose(r.theta, ref, rtol=1e-4)
    at_r = _count_nll(np.log(r.theta), t, y, "poisson")  # scipy's likelihood at pgpgm's optimum
    assert at_r <= nll + 1e-6 and r.nll == pytest.approx(at_r, abs=5e-5)  # CVODE's tolerance against DOP853's


# ------------------------------------------------------------------ step 4's likelihoods
@pytest.mark.parametrize("noise, param", [("poisson", None), ("negbin", 7.5), ("lognormal", 0.2)])
def test_step4_log_likelihood_equals_scipy(noise, param):
    if noise == "lognormal":
        t, y, dose = _theoph("1")
        system, state, x0, values = PK, "C", {"A": dose}, {"ka": 1.4, "ke": 0.06, "CL": 0.02}
        mu = _conc(t, dose, 1.4, 0.06, 0.02)
        held = {"C": 0.0}
    else:
        t, y = _flu()
        system, state, x0, values = SIR, "I", {"S": 762.0, "R": 0.0}, {"beta": 1.8, "gamma": 0.5}
        mu = _sir(t, 1.8, 0.5)
        held = {"I": 1.0}
    m = np.isfinite(y)
    model, layout = build_ode_model(system, {"time": t, state: y}, [state], x0=x0, priors=(0.0, 10.0),
                                    noise=(noise,), noise_center=[param or 1.0], x0_observed=held)
    assert layout.initial == () and layout.noise == (() if param is None else
                                                     ((f"alpha_{state}",) if noise == "negbin" else (f"sigma_{state}",)))
    if param is not None:
        values[layout.noise[0]] = param
    point = ValueSpace(model).point(values)
    logp = model.compile_logp(vars=[model[f"y_{state}"]])(point)
    if noise == "poisson":
        ref = stats.poisson.logpmf(y[m], mu[m]).sum()
    elif noise == "negbin":
        ref = stats.nbinom.logpmf(y[m], param, param / (param + mu[m])).sum()
    else:
        ref = stats.lognorm.logpdf(y[m], s=param, scale=mu[m]).sum()
    assert float(logp) == pytest.approx(ref, rel=1e-6)


# ------------------------------------------------------------------ the sensitivity Jacobian
@pytest.mark.parametrize("noise", ["lognormal", "poisson", "negbin", "normal"])
def test_noise_residuals_jacobian_against_finite_differences(noise):
    if noise in ("lognormal", "normal"):
        t, y, dose = _theoph("3")
        p = LeastSquaresProblem(pgpgm.Integrator(PK, t), y, (1,), 0.15, np.array([dose, 0.0]), noise=(noise,),
                                free_x0=(0,))
        q = np.array([1.3, 0.07, 0.03, dose * 1.05])
    else:
        t, y = _flu()
        p = LeastSquaresProblem(pgpgm.Integrator(SIR, t), y, (1,), 6.0, np.array([762.0, 1.0, 0.0]), noise=(noise,),
                                free_x0=(1,))
        q = np.array([1.8, 0.5, 1.3])
    J = p.jacobian(q)
    h = 1e-6 * np.abs(q)
    fd = np.column_stack([(p.residuals(q + hi * e) - p.residuals(q - hi * e)) / (2 * hi) for hi, e in zip(h, np.eye(q.size))])
    np.testing.assert_allclose(J, fd, rtol=2e-3, atol=1e-5 * np.abs(J).max())  # the solver's tolerance


# ------------------------------------------------------------------ bad inputs, before any compilation
@pytest.mark.parametrize("noise, values, match", [
    ("poisson", [3.0, 2.5, 4.0, 5.0], "not whole numbers under Poisson"),
    ("negbin", [3.0, -1.0, 4.0, 5.0], "negative under negative-binomial"),
    ("lognormal", [3.0, 0.0, 4.0, 5.0], "<= 0 under lognormal"),
    ("gaussian", [3.0, 1.0, 4.0, 5.0], "noise for .* must be one of"),
])
def test_bad_noise_inputs_are_data_errors(noise, values, match):
    data = {"time": np.arange(4.0), "I": values}
    with pytest.raises(DataError, match=match):
        pgpgm.fit(SIR, data, ["I"], x0={"S": 762.0, "R": 0.0}, noise={"I": noise}, draws=10, tune=10)


def test_a_bad_known_initial_value_of_an_observed_state_is_a_data_error():
    data = {"time": np.arange(4.0), "I": [1.0, 3.0, 4.0, 5.0]}
    with pytest.raises(DataError, match=r"x0\[I\] must be one finite number"):
        pgpgm.fit(SIR, data, ["I"], x0={"S": 762.0, "R": 0.0, "I": np.nan}, draws=10, tune=10)
    with pytest.raises(DataError, match="x0_observed names"), pytest.warns(DeprecationWarning):
        pgpgm.fit(SIR, data, ["I"], x0={"S": 762.0, "R": 0.0}, x0_observed={"S": 1.0}, draws=10, tune=10)


# ------------------------------------------------------------------ the whole fit with step 4 (slow)
@pytest.mark.slow
def test_flu_negbin_fit_with_nuts_samples_alpha_around_the_refined_optimum():
    t, y = _flu()
    r = _fit(SIR, {"time": t, "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
             noise={"I": "negbin"}, priors=(0.0, 10.0), draws=300, tune=300, seed=1,
             posterior=pgpgm.NUTS(draws=300, tune=300, chains=2, cores=1))
    post = r.posterior.posterior
    assert "alpha_I" in post and "I_0" not in post  # alpha free, I(0) held
    for k, p in enumerate(SIR.parameters):  # the posterior sits on the refined optimum's basin
        draws = post[p].values.ravel()
        assert abs(np.mean(draws) - r.theta[k]) < 3 * np.std(draws), (p, np.mean(draws), r.theta[k])


def test_lognormal_measurement_model_and_log_scale_state_have_one_optimum(lv):
    """noise="lognormal" alone (the state on its own scale) and with transform="log" (the state on the log
    scale, Gaussian on log y) are the same likelihood: one optimum, nll equal up to sum(log y)."""
    theta, x0 = np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0])
    t = np.linspace(0.0, 2.0, 20)
    y = pgpgm.simulate(lv.system, theta, x0, t, observed=["x1"], noise_sd=0.1, noise="lognormal", seed=3)["y"].values
    bounds = [[0.0, 10.0]] * 4
    natural = refine(LeastSquaresProblem(pgpgm.Integrator(lv.system, t), y, (0,), 0.2, x0, noise=("lognormal",),
                                         free_x0=(0,)), [1.5, 1.5, 3.0, 1.5], bounds, estimate_noise=True)
    logged = pgpgm.log_transform(lv.system, ["x1", "x2"])
    on_log = refine(LeastSquaresProblem(pgpgm.Integrator(logged, t), np.log(y), (0,), 0.2, np.log(x0), free_x0=(0,)),
                    [1.5, 1.5, 3.0, 1.5], bounds, estimate_noise=True)
    np.testing.assert_allclose(natural.theta, on_log.theta, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(natural.x0[0], np.exp(on_log.x0[0]), rtol=1e-4)
    np.testing.assert_allclose(natural.noise_sd, on_log.noise_sd, rtol=1e-4)
    assert natural.nll == pytest.approx(on_log.nll + np.log(y).sum(), abs=1e-5)

"""Log scale for positive states: the symbolic transform, lognormal noise in fit, bad inputs."""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm.errors import DataError, ModelDefinitionError
from pgpgm.ode.system import ODESystem
from pgpgm.ode.transform import LogScale, log_transform

LV = ODESystem.from_equations({"x1": "theta1*x1 - theta2*x1*x2", "x2": "-theta3*x2 + theta4*x1*x2"},
                              ["theta1", "theta2", "theta3", "theta4"], name="lv")
GOODWIN = ODESystem.from_equations({"X": "a/(1 + Z**n) - b*X", "Y": "c*X - d*Y", "Z": "e*Y - f*Z"},
                                   ["a", "b", "c", "d", "e", "f", "n"], name="goodwin")
GW_THETA = np.array([1.0, 0.1, 1.0, 0.1, 1.0, 0.1, 10.0])
GW_X0 = np.array([0.3, 2.5, 2.0])


def _lv(t, x, th):  # written out by hand, independent of pgpgm's kernels
    return [th[0] * x[0] - th[1] * x[0] * x[1], -th[2] * x[1] + th[3] * x[0] * x[1]]


def test_transformed_names_and_equations():
    t = log_transform(LV, ["x1"])
    assert t.states == ("log_x1", "x2") and t.parameters == LV.parameters
    u, x2 = t.symbols[1]
    import sympy as sp
    th = t.symbols[2]
    assert sp.simplify(t.expressions[0] - (th[0] - th[1] * x2)) == 0  # (a x - b x y)/x
    assert sp.simplify(t.expressions[1] - (-th[2] * x2 + th[3] * sp.exp(u) * x2)) == 0
    assert ODESystem.from_dict(t.to_dict()).expressions == t.expressions  # saves and loads exactly


@pytest.mark.parametrize("system, theta, x0, states, t_end", [
    (LV, np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0]), ["x1", "x2"], 2.0),
    (GOODWIN, GW_THETA, GW_X0, ["X", "Z"], 60.0),
])
def test_transformed_system_integrates_to_log_of_the_solution(system, theta, x0, states, t_end):
    scale = LogScale(system, tuple(states))
    times = np.linspace(0, t_end, 25)
    kw = dict(method="DOP853", rtol=1e-13, atol=1e-13, t_eval=times)
    x = solve_ivp(lambda t, y: system.rhs(t, y, theta), (0, t_end), x0, **kw).y.T
    u = solve_ivp(lambda t, y: scale.system.rhs(t, y, theta), (0, t_end), scale.to_log(x0), **kw).y.T
    np.testing.assert_allclose(u, scale.to_log(x), rtol=1e-8, atol=0)
    np.testing.assert_allclose(scale.to_original(u), x, rtol=1e-8, atol=0)
    # and pgpgm's own solver of the transformed system agrees at its tolerance
    u_pg = pgpgm.Integrator(scale.system, times).solve(theta, scale.to_log(x0))
    np.testing.assert_allclose(u_pg, u, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("system, theta, x0, states", [
    (LV, np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0]), ["x2"]),
    (GOODWIN, GW_THETA, GW_X0, ["X", "Y", "Z"]),
])
def test_transformed_jacobians_match_finite_differences(system, theta, x0, states):
    scale = LogScale(system, tuple(states))
    u = scale.to_log(x0)
    jx, jp = scale.system.jacobian(0.3, u, theta)
    h = 1e-6
    fd_x = np.column_stack([(scale.system.rhs(0.3, u + h * e, theta) - scale.system.rhs(0.3, u - h * e, theta)) / (2 * h)
                            for e in np.eye(u.size)])
    fd_p = np.column_stack([(scale.system.rhs(0.3, u, theta + h * e) - scale.system.rhs(0.3, u, theta - h * e)) / (2 * h)
                            for e in np.eye(theta.size)])
    np.testing.assert_allclose(jx, fd_x, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(jp, fd_p, rtol=1e-6, atol=1e-8)


def _lognormal_data(seed=1, sd=0.1, n=20):
    theta, x0 = np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0])
    t = np.linspace(0, 2, n)
    x = solve_ivp(_lv, (0, 2), x0, args=(theta,), method="DOP853", rtol=1e-12, atol=1e-12, t_eval=t).y.T
    y = x * np.exp(sd * np.random.default_rng(seed).standard_normal(x.shape))
    return theta, x0, t, y


def _solve_lv(t, th, x0):
    sol = solve_ivp(_lv, (t[0], t[-1]), x0, args=(th,), method="LSODA", rtol=1e-10, atol=1e-10, t_eval=t)
    return sol.y.T if sol.success and sol.y.shape[1] == t.size else None


def _profile_nll(q, t, y):
    """Lognormal NLL of y with the sds at their maximum (sd_k^2 = RSS_k / N), up to constants."""
    x = _solve_lv(t, q[:4], q[4:])
    if x is None or np.any(x <= 0):
        return np.inf
    rss = np.sum((np.log(x) - np.log(y)) ** 2, axis=0)
    return float(0.5 * t.size * np.sum(np.log(rss)))


def _log_residuals(q, t, y, w):
    x = _solve_lv(t, q[:4], q[4:])
    if x is None or np.any(x <= 0):
        return np.full(y.size, 1e3)
    return ((np.log(x) - np.log(y)) * w).ravel()


@pytest.mark.slow  # an accuracy run (20-35 s on 2 cores): ./run.sh test --slow
def test_lognormal_fit_recovers_theta_at_the_global_optimum_and_uses_the_lognormal_likelihood(tmp_path):
    theta, x0, t, y = _lognormal_data()
    data = pd.DataFrame({"time": t, "x1": y[:, 0], "x2": y[:, 1]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # transform="log": the states themselves on the log scale (what noise="lognormal" alone meant before
        # issue 31; it is now the measurement model only, see tests/test_noise_fit.py)
        r = pgpgm.fit(LV, data, noise={"x1": "lognormal", "x2": "lognormal"}, transform={"x1": "log", "x2": "log"},
                      priors=(0, 10), draws=300, tune=300,
                      chains=2, posterior=None, progressbar=False, seed=3)
    # the likelihood used: -sum of scipy's lognormal log densities at the refined point
    sd = r.trajectories["noise_sd"].values
    x_hat = _solve_lv(t, r.theta, np.array([r.x0["x1"], r.x0["x2"]]))
    scipy_nll = -np.sum(stats.lognorm.logpdf(y, s=sd[None, :], scale=x_hat))
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(scipy_nll, abs=1e-4)  # solvers differ ~1e-8
    # exactly, with pgpgm's solve of the log-transformed system (the trajectory the refinement used)
    x_pg = np.exp(pgpgm.Integrator(log_transform(LV, ["x1", "x2"]), t).solve(r.theta, np.log([r.x0["x1"], r.x0["x2"]])))
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(
        -np.sum(stats.lognorm.logpdf(y, s=sd[None, :], scale=x_pg)), rel=1e-9, abs=1e-9)
    assert "log" in r.trajectories["noise_sd"].attrs["scale"]
    # the result is on the original scale
    assert list(r.trajectories["state"].values) == ["x1", "x2"]
    np.testing.assert_allclose(r.trajectories["y"].values, y)
    back = pgpgm.load_result(r.save(tmp_path / "lognormal.nc"))  # the result file keeps the original scale
    assert back.x0 == r.x0 and back.system.states == ("x1", "x2")
    assert back.trajectories["noise_sd"].attrs["scale"] == r.trajectories["noise_sd"].attrs["scale"]
    # an independent multi-start on the lognormal profile likelihood (scipy ODE solver, hand-written rhs)
    # (alternating: weighted least squares in q for fixed sds, then sd_k = sqrt(RSS_k / N))
    rng = np.random.default_rng(0)
    best_q, best_nll = None, np.inf
    for _ in range(8):
        q = np.concatenate([rng.uniform(0.5, 6, 4), y[0] * rng.uniform(0.8, 1.25, 2)])
        w = np.ones(2)
        for _ in range(6):
            res = optimize.least_squares(_log_residuals, q, args=(t, y, w), bounds=(0, np.inf), x_scale="jac",
                                         xtol=1e-12, ftol=1e-12, gtol=1e-12)
            q = res.x
            x = _solve_lv(t, q[:4], q[4:])
            if x is None:
                break
            w = 1 / np.sqrt(np.mean((np.log(x) - np.log(y)) ** 2, axis=0))
        nll = _profile_nll(q, t, y)
        if nll < best_nll:
            best_q, best_nll = q, nll
    q_pg = np.concatenate([r.theta, [r.x0["x1"], r.x0["x2"]]])
    assert _profile_nll(q_pg, t, y) <= best_nll + 1e-6 * abs(best_nll) + 1e-8
    np.testing.assert_allclose(q_pg, best_q, rtol=2e-3)
    se = r.estimates["stderr"].values
    assert np.all(np.abs(r.theta - theta) < 3 * se), (r.theta, se)
    np.testing.assert_allclose(r.theta, theta, rtol=0.15)


def test_log_transform_with_normal_noise_keeps_the_gaussian_likelihood():
    theta, x0 = np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0])
    sim = pgpgm.simulate(LV, theta, x0, np.linspace(0, 2, 20), observed=["x1", "x2"], noise_sd=0.1, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(LV, sim, transform={"x1": "log", "x2": "log"}, priors=(0, 10), draws=200, tune=200,
                      chains=2, posterior=None, progressbar=False, seed=1)
    y = sim["y"].values
    sd = r.trajectories["noise_sd"].values
    x_hat = _solve_lv(sim["time"].values, r.theta, np.array([r.x0["x1"], r.x0["x2"]]))
    assert r.estimates.attrs["refinement_nll"] == pytest.approx(-np.sum(stats.norm.logpdf(y, x_hat, sd)), abs=1e-4)
    assert "log" in r.trajectories["noise_sd_gp"].attrs["scale"] and "log" not in r.trajectories["noise_sd"].attrs[
        "scale"]
    np.testing.assert_allclose(r.theta, theta, rtol=0.15)
    assert r.gradient_matching.posterior["log_x1"].sizes["time"] == 20  # matching ran on the log scale


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise="student"), "noise must be one of"),  # was "poisson", a noise model since issue 31
    (dict(noise={"x9": "lognormal"}), r"\['x9'\]"),
    (dict(noise={"x1": "log"}), "noise for"),
    (dict(noise=["lognormal"]), "mapping"),
    (dict(transform={"x1": "sqrt"}), "transform for"),
    (dict(transform="sqrt"), "transform must be one of"),
    (dict(transform={"x7": "log"}), r"\['x7'\]"),
])
def test_bad_noise_and_transform_are_data_errors(kwargs, match):
    data = {"time": np.linspace(0, 1, 5), "x1": np.ones(5), "x2": np.ones(5)}
    with pytest.raises(DataError, match=match):
        pgpgm.fit(LV, data, **kwargs)


def test_noise_for_a_latent_state_is_a_data_error():
    data = {"time": np.linspace(0, 1, 5), "x1": np.ones(5)}
    with pytest.raises(DataError, match=r"\['x2'\]"):
        pgpgm.fit(LV, data, x0={"x2": 1.0}, noise={"x2": "lognormal"})


# noise="lognormal" with transform="log" (the state on the log scale; lognormal noise alone is the
# measurement model since issue 31, whose own message is tested in tests/test_noise_fit.py)
@pytest.mark.parametrize("kwargs", [dict(noise={"x2": "lognormal"}, transform={"x2": "log"}),
                                    dict(transform={"x2": "log"})])
def test_non_positive_values_on_the_log_scale_name_the_state_and_rows(kwargs):
    y = np.ones(6)
    y[[2, 4]] = [0.0, -1.0]
    for data in ({"time": np.arange(6.0), "x1": np.ones(6), "x2": y},
                 pd.DataFrame({"time": np.arange(6.0), "x1": np.ones(6), "x2": y}),
                 pd.DataFrame({"time": np.repeat(np.arange(6.0), 2), "state": ["x1", "x2"] * 6,
                               "value": np.column_stack([np.ones(6), y]).ravel()})):
        with pytest.raises(DataError, match=r"x2 has values <= 0 at rows \[.*\]"):
            pgpgm.fit(LV, data, **kwargs)
    with pytest.raises(DataError, match=r"rows \[2, 4\]"):
        pgpgm.fit(LV, {"time": np.arange(6.0), "x1": np.ones(6), "x2": y}, **kwargs)


def test_non_positive_initial_value_of_a_log_state_is_a_data_error():
    data = {"time": np.linspace(0, 1, 5), "x1": np.ones(5)}
    with pytest.raises(DataError, match=r"x0\[x2\].*positive"):
        pgpgm.fit(LV, data, x0={"x2": 0.0}, transform={"x2": "log"})


def test_clashing_log_name_is_a_model_error():
    s = ODESystem.from_equations({"x": "-k*x", "log_x": "k*x"}, ["k"])
    with pytest.raises(ModelDefinitionError, match="log_x"):
        log_transform(s, ["x"])


def test_simulate_lognormal_noise_multiplies_the_truth(lv):
    """simulate(noise=...): lognormal states get y = x exp(sd e), normal ones y = x + sd e, with the
    same standard normal draws e (numpy's generator, reproduced here); lognormal needs x > 0."""
    c = lv.case("x1-observed")
    times = {"x1": c.times, "x2": c.times[::2]}
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, times, observed=["x1", "x2"], noise_sd=[0.1, 0.3],
                        noise={"x1": "lognormal"}, seed=7)
    assert ds.attrs["noise"] == ["lognormal", "normal"]
    x = ds["truth"].sel(state=["x1", "x2"]).values
    e = np.random.default_rng(7).normal(size=x.shape) * [0.1, 0.3]
    np.testing.assert_allclose(ds["y"].values[:, 0], x[:, 0] * np.exp(e[:, 0]), rtol=1e-14)
    y2 = ds["y"].values[:, 1]
    measured = np.isin(ds["time"].values, c.times[::2])
    np.testing.assert_allclose(y2[measured], (x[:, 1] + e[:, 1])[measured], rtol=1e-14)
    assert np.isnan(y2[~measured]).all()
    # log(y / x) / sd is standard normal: mean and sd within 4 standard errors
    z = np.log(ds["y"].values[:, 0] / x[:, 0]) / 0.1
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and abs(z.std() - 1) < 4 / np.sqrt(2 * z.size)
    # normal noise is unchanged by the option
    plain = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=7)
    again = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=7, noise="normal")
    np.testing.assert_array_equal(plain["y"].values, again["y"].values)


def test_simulate_lognormal_refuses_snr_and_non_positive_signals(lv):
    c = lv.case("x1-observed")
    with pytest.raises(pgpgm.DataError, match="snr sets additive noise"):
        pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], snr=10, noise="lognormal")
    sine = pgpgm.ODESystem.from_equations({"x": "y", "y": "-x"}, [], name="sine")
    with pytest.raises(pgpgm.DataError, match=r"positive signal, but \['x'\]"):
        pgpgm.simulate(sine, [], [1.0, 0.0], np.linspace(0, 4, 9), observed=["x"], noise_sd=0.1, noise="lognormal")
    with pytest.raises(pgpgm.DataError, match="noise must be one of"):
        pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, noise="student")

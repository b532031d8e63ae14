"""Real-style data: each state on its own times, missing values, user grids (issue 11).

References are independent: numpy/scipy log densities written out here, scipy's solve_ivp,
and an independent multi-start least squares.
"""

import numpy as np
import pandas as pd
import pymc as pm
import pytest
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm.data import as_observations
from pgpgm.errors import DataError
from pgpgm.refinement import LeastSquaresProblem
from pgpgm.matching import GradientMatchingTarget, elementwise
from tests.conftest import scipy_reference

THETA, X0 = np.array([2.0, 1.0, 4.0, 1.0]), np.array([5.0, 3.0])
T1 = np.linspace(0.0, 2.0, 21)          # x1 every 0.1
T2 = np.linspace(0.05, 1.95, 12)        # x2 on its own, shifted grid


def _async(lv, missing=0.3, seed=0, noise_sd=0.1):
    return pgpgm.simulate(lv.system, THETA, X0, {"x1": T1, "x2": T2}, noise_sd=noise_sd, seed=seed,
                          missing=missing)


def test_simulate_own_times_and_missing(lv):
    full = pgpgm.simulate(lv.system, THETA, X0, {"x1": T1, "x2": T2}, noise_sd=0.1, seed=3)
    t = np.union1d(T1, T2)
    np.testing.assert_array_equal(full.time.values, t)
    y = full.y.values
    np.testing.assert_array_equal(np.isfinite(y[:, 0]), np.isin(t, T1))
    np.testing.assert_array_equal(np.isfinite(y[:, 1]), np.isin(t, T2))
    np.testing.assert_allclose(full.truth.values, scipy_reference(lv.system, THETA, X0, t), rtol=1e-6, atol=1e-6)
    gappy = pgpgm.simulate(lv.system, THETA, X0, {"x1": T1, "x2": T2}, noise_sd=0.1, seed=3, missing=0.3)
    kept = np.isfinite(gappy.y.values)
    assert kept[:, 0].sum() == T1.size - round(0.3 * T1.size) and kept[:, 1].sum() == T2.size - round(0.3 * T2.size)
    np.testing.assert_array_equal(gappy.y.values[kept], y[kept])  # the kept values are the full set's
    with pytest.raises(DataError, match="missing must be a fraction"):
        pgpgm.simulate(lv.system, THETA, X0, T1, noise_sd=0.1, missing=1.0)
    with pytest.raises(DataError, match=r"times given for \['zz'\]"):
        pgpgm.simulate(lv.system, THETA, X0, {"zz": T1}, noise_sd=0.1)


def test_long_wide_and_dataset_forms_agree(lv):
    ds = _async(lv)
    y = ds.y.values
    wide = {"time": ds.time.values, "x1": y[:, 0], "x2": y[:, 1]}
    long = pd.DataFrame([(t, s, v) for s, col in (("x1", y[:, 0]), ("x2", y[:, 1]))
                         for t, v in zip(ds.time.values, col) if np.isfinite(v)], columns=["time", "state", "value"])
    long = long.sample(frac=1.0, random_state=1)  # any row order
    ref = as_observations(ds, None, lv.system)
    for data in (wide, pd.DataFrame(wide), long):
        obs = as_observations(data, ["x1", "x2"], lv.system)
        seen = obs.mask.any(axis=1)
        np.testing.assert_array_equal(obs.times[seen], ref.times[ref.mask.any(axis=1)])
        np.testing.assert_array_equal(obs.mask[seen], ref.mask[ref.mask.any(axis=1)])
        np.testing.assert_array_equal(obs.values[obs.mask], ref.values[ref.mask])
    # times where no observed state is measured are not on the default grid, except the table's first
    # time (where x0 applies)
    measured = np.unique(np.concatenate([ds.time.values[np.isfinite(y[:, m])] for m in range(2)]))
    np.testing.assert_array_equal(ref.times, np.union1d(ds.time.values[:1], measured))
    gap_first = {"time": wide["time"], "x1": np.r_[np.nan, y[1:, 0]], "x2": np.r_[np.nan, y[1:, 1]]}
    assert as_observations(gap_first, None, lv.system).times[0] == ds.time.values[0]
    for m, s in enumerate(ref.states):
        np.testing.assert_array_equal(ref.state_times(s), ds.time.values[np.isfinite(y[:, m])])
        np.testing.assert_array_equal(ref.state_values(m), y[np.isfinite(y[:, m]), m])
    assert not ref.complete and list(ref.n_obs) == list(np.isfinite(y).sum(0))


def test_user_grid(lv):
    ds = _async(lv)
    grid = np.linspace(0.0, 2.0, 81)
    obs = as_observations(ds, None, lv.system, grid=grid)
    data_t = ds.time.values
    assert np.all(np.isin(grid, obs.times))  # the grid, plus the observation times not on it
    assert obs.times.size == np.unique(np.r_[np.round(grid, 9), np.round(data_t[np.isfinite(ds.y.values).any(1)], 9)]).size
    for m in range(2):  # the measurements sit at their own times on the grid (1 ulp: put on the grid point)
        seen = np.isfinite(ds.y.values[:, m])
        np.testing.assert_allclose(obs.state_times(m), data_t[seen], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(obs.state_values(m), ds.y.values[seen, m])
    with pytest.raises(DataError, match=r"grid \[0.5, 2\] does not cover the observations of \['x1', 'x2'\]"):
        as_observations(ds, None, lv.system, grid=np.linspace(0.5, 2.0, 10))
    with pytest.raises(DataError, match=r"does not cover the observations of \['x1'\]"):
        as_observations(ds, None, lv.system, grid=np.linspace(0.04, 1.96, 10))


def _numpy_density(density, theta, X):
    """The gradient-matching log density written out with numpy and a scipy solve: GP prior,
    Gaussian likelihood of the measured values only, gradient matching on the whole grid."""
    t, obs = density.obs.times, density.obs
    X = X.copy()
    if density.latent:
        x0 = density.x0.copy()
        x0[list(density.observed_idx)] = X[0, list(density.observed_idx)]
        sol = scipy_reference(density.system, theta, x0, t)
        X[:, list(density.latent_idx)] = sol[:, list(density.latent_idx)]
    x1, x2 = X[:, 0], X[:, 1]
    F = np.column_stack([theta[0] * x1 - theta[1] * x1 * x2, -theta[2] * x2 + theta[3] * x1 * x2])
    total = 0.0
    for m, k in enumerate(density.terms):
        g = k.matching
        dx = X[:, k.index] - g.mean
        total += -0.5 * dx @ np.linalg.solve(g.C, dx)
        r = F[:, k.index] - g.D @ dx
        total += -0.5 * r @ k.grad_precision @ r
        seen = obs.mask[:, m]
        total += stats.norm.logpdf(obs.values[seen, m], X[seen, k.index], k.noise_sd).sum()
    return total


@pytest.fixture(scope="module")
def latent_target(lv):
    """x1 measured on its own times with 30 % missing, x2 latent (one model compile, shared)."""
    density = pgpgm.gradient_matching_density(lv.system, _async(lv), ["x1"], x0={"x2": 3.0}, gamma=0.3,
                                              priors=(0, 10), solver=pgpgm.CVODE(rtol=1e-12, atol=1e-12))
    return GradientMatchingTarget(density)


@pytest.mark.parametrize("observed", [["x1", "x2"], ["x1"]])
def test_masked_density_equals_numpy(lv, latent_target, observed):
    if observed == ["x1"]:
        target = latent_target
    else:
        target = GradientMatchingTarget(pgpgm.gradient_matching_density(lv.system, _async(lv), observed, gamma=0.3,
                                                                        priors=(0, 10)))
    density = target.density
    rng = np.random.default_rng(0)
    theta = THETA * np.exp(0.1 * rng.standard_normal(4))
    X = np.zeros((density.obs.times.size, 2))
    X[:, list(density.observed_idx)] = density.gp_posterior_means() + 0.05 * rng.standard_normal(
        (density.obs.times.size, len(observed)))
    lp, _, _ = target.evaluate_model(theta, X)
    prior = 4 * -np.log(10.0)
    np.testing.assert_allclose(lp - prior, _numpy_density(density, theta, X), rtol=1e-7)
    # the sampler's split of the density (O(N) state part) agrees with the compiled model
    lp_par, _, lat = target.parameter_part(theta, X)
    if lat is not None:
        X[:, list(density.latent_idx)] = lat
    np.testing.assert_allclose(lp_par + target.state_part(X, density.statistics(theta, X)), lp, rtol=1e-10)


@pytest.mark.parametrize("scheme", ["elementwise", "block"])
def test_sweeps_with_missing_values_keep_the_density_exact(latent_target, scheme):
    """After many incremental sweeps and moves, the chain's running log density equals a fresh
    evaluation: the O(N) updates count the observation term only where measured."""
    target = latent_target
    state = elementwise.init(target, THETA)
    sch = pgpgm.matching.schemes.get_scheme(scheme)
    params, _ = sch.start(target, state, 10, None, None)
    rng = np.random.default_rng(4)
    for _ in range(15):
        state, _ = sch.step(rng, state, params, target)
    np.testing.assert_allclose(state.logp, target.evaluate_model(state.q, state.X)[0], rtol=1e-9)


def test_masked_refinement_and_posterior_likelihood_equal_numpy(lv):
    ds = _async(lv)
    obs = as_observations(ds, None, lv.system)
    integ = pgpgm.Integrator(lv.system, obs.times, pgpgm.CVODE(rtol=1e-12, atol=1e-12))
    sd = np.array([0.1, 0.2])
    problem = LeastSquaresProblem(integ, obs.values, (0, 1), sd, X0)
    theta = THETA * 1.05
    x = scipy_reference(lv.system, theta, X0, obs.times)
    ref = sum(stats.norm.logpdf(obs.values[obs.mask[:, m], m], x[obs.mask[:, m], m], sd[m]).sum() for m in range(2))
    np.testing.assert_allclose(-problem.nll(theta), ref, rtol=1e-7)
    assert problem.residuals(theta).size == obs.mask.sum() == problem.jacobian(theta).shape[0]
    model, layout = pgpgm.build_ode_model(lv.system, obs, priors=(0, 10), noise_sd=sd,
                                          solver=pgpgm.CVODE(rtol=1e-12, atol=1e-12))
    point = {**{p: v for p, v in zip(lv.system.parameters, theta)}, "x1_0": X0[0], "x2_0": X0[1]}
    like = model.compile_logp(vars=[model["y_x1"], model["y_x2"]])
    np.testing.assert_allclose(float(like(_value_point(model, point))), ref, rtol=1e-7)


def _value_point(model, point):
    """Value-space point of constrained values (interval transform of the Uniform priors)."""
    from pgpgm.posterior.space import ValueSpace

    return ValueSpace(model).point(point)


def _independent_optimum(system, obs, sd, n_starts, seed):
    """Multi-start weighted least squares over (theta, x0) with scipy's solve_ivp (DOP853) and
    finite-difference Jacobians, independent of pgpgm's solver and sensitivities."""
    t = obs.times

    def residuals(q):
        th, x0 = q[:4], q[4:]
        sol = solve_ivp(lambda _, y: [th[0] * y[0] - th[1] * y[0] * y[1], -th[2] * y[1] + th[3] * y[0] * y[1]],
                        (t[0], t[-1]), x0, t_eval=t, method="DOP853", rtol=1e-10, atol=1e-10)
        if not sol.success or sol.y.shape[1] != t.size:
            return np.full(obs.mask.sum(), 1e3)
        return ((sol.y.T - obs.filled(0.0)) / sd)[obs.mask]

    rng = np.random.default_rng(seed)
    best = None
    for _ in range(n_starts):
        q0 = np.r_[rng.uniform(0.5, 6.0, 4), obs.state_values(0)[0], obs.state_values(1)[0]]
        res = optimize.least_squares(residuals, q0, bounds=(np.r_[np.zeros(4), -np.inf, -np.inf],
                                                            np.r_[np.full(4, 10.0), np.inf, np.inf]))
        if best is None or res.cost < best.cost:
            best = res
    return best


@pytest.mark.slow
def test_async_grids_and_missing_values_reach_the_global_optimum(lv):
    ds = _async(lv, missing=0.3, seed=1)
    r = pgpgm.fit(lv.system, ds, ["x1", "x2"], noise_sd=0.1, gamma=0.3, priors=(0, 10), draws=600, tune=600,
                  posterior=None, progressbar=False, seed=0)
    obs = as_observations(ds, None, lv.system)
    best = _independent_optimum(lv.system, obs, 0.1, n_starts=12, seed=0)
    # the fit's refined point is the global optimum of its own data ...
    assert r.estimates.attrs["refinement_cost"] <= best.cost * (1 + 1e-6) + 1e-9
    np.testing.assert_allclose(r.theta, best.x[:4], rtol=1e-3)
    # ... and within the truth's reach at this noise (0.1 on values 1-7, 23 + 8 points)
    np.testing.assert_allclose(r.theta, THETA, rtol=0.15)
    assert np.all(np.abs(r.theta - THETA) < 4 * r.estimates["stderr"].values)


def test_fit_with_missing_values_saves_loads_and_plots(lv, tmp_path):
    """A whole fit on gappy data (x2 latent, x1 on its own times with 30 % missing, a denser grid):
    the stored observations keep the gaps, the figure marks only measured values."""
    import matplotlib

    matplotlib.use("Agg")
    ds = _async(lv)
    grid = np.linspace(0.0, 2.0, 41)
    r = pgpgm.fit(lv.system, ds, ["x1"], x0={"x2": 3.0}, noise_sd=0.1, priors=(0, 10), draws=60, tune=60,
                  chains=1, posterior=pgpgm.Laplace(50), progressbar=False, grid=grid)
    obs = as_observations(ds, ["x1"], lv.system, grid=grid)
    y = r.trajectories["y"].sel(observed="x1").values
    np.testing.assert_array_equal(np.isfinite(y), obs.mask[:, 0])
    back = pgpgm.load_result(r.save(tmp_path / "gappy.nc"))
    np.testing.assert_array_equal(back.trajectories["y"].values, r.trajectories["y"].values)
    fig = back.plot_states()
    markers = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert len(markers) == 1 and markers[0].get_xdata().size == obs.n_obs[0]


# ---------------------------------------------------------------- fixed parameters, per-state settings
def test_fix_substitutes_the_value(lv):
    sub = lv.system.fix({"theta3": 4.0})
    assert sub.parameters == ("theta1", "theta2", "theta4") and sub.states == lv.system.states
    x = np.array([1.3, 0.7])
    np.testing.assert_array_equal(sub.rhs(0.0, x, np.array([2.0, 1.0, 1.0])), lv.system.rhs(0.0, x, THETA))
    assert pgpgm.ODESystem.from_dict(sub.to_dict()).expressions == sub.expressions
    with pytest.raises(DataError, match=r"fixed names \['theta9'\], which are not parameters"):
        lv.system.fix({"theta9": 1.0})
    with pytest.raises(DataError, match=r"fixed\[theta1\] must be one finite number"):
        lv.system.fix({"theta1": np.inf})


def test_fit_with_a_fixed_parameter(lv):
    ds = _async(lv, missing=0.0)
    with pytest.raises(DataError, match=r"fixed names \['t6'\]"):
        pgpgm.fit(lv.system, ds, fixed={"t6": 0.3}, progressbar=False)
    r = pgpgm.fit(lv.system, ds, ["x1", "x2"], noise_sd=0.1, priors={"theta3": (0, 1), "theta1": (0, 10)},
                  fixed={"theta3": 4.0}, draws=150, tune=150, posterior=pgpgm.Laplace(100),
                  progressbar=False)
    assert r.fixed == {"theta3": 4.0}
    table = r.parameter_table()
    assert list(table.index) == list(lv.system.parameters)
    row = table.loc["theta3"]
    assert row["fixed"] and row["refined"] == 4.0 and row["sampled"] == 4.0 and row["refined_stderr"] == 0.0
    assert "theta3" not in r.gradient_matching.posterior and "theta3" not in r.posterior.posterior
    assert table["fixed"].sum() == 1
    # the refined point is a local optimum of the reduced problem, by an independent solver
    obs = as_observations(ds, None, lv.system)
    t = obs.times

    def residuals(q):
        th = [q[0], q[1], 4.0, q[2]]
        sol = solve_ivp(lambda _, y: [th[0] * y[0] - th[1] * y[0] * y[1], -th[2] * y[1] + th[3] * y[0] * y[1]],
                        (t[0], t[-1]), q[3:], t_eval=t, method="DOP853", rtol=1e-10, atol=1e-10)
        return ((sol.y.T - obs.filled(0.0)) / 0.1)[obs.mask]

    q = np.r_[r.theta[[0, 1, 3]], r.estimates["x0"].values]
    local = optimize.least_squares(residuals, q, x_scale="jac")
    assert r.estimates.attrs["refinement_cost"] <= local.cost * (1 + 1e-6)
    np.testing.assert_allclose(r.theta[[0, 1, 3]], local.x[:3], rtol=1e-4)


def test_per_state_kernel_and_gamma(lv):
    ds = _async(lv, missing=0.0)
    d = pgpgm.gradient_matching_density(lv.system, ds, ["x1", "x2"], kernel={"x1": "rbf", "x2": "matern52"},
                                        gamma={"x1": 0.3, "x2": 0.05})
    assert [k.gp.kernel.name for k in d.terms] == ["rbf", "matern52"]
    for k, g in zip(d.terms, (0.3, 0.05)):
        A = k.matching.A
        np.testing.assert_allclose(k.grad_precision @ (A + g * np.eye(A.shape[0])), np.eye(A.shape[0]), atol=1e-6)
    assert d.gamma == {"x1": 0.3, "x2": 0.05} and d.kernel == {"x1": "rbf", "x2": "matern52"}
    with pytest.raises(DataError, match=r"gamma is a mapping but has no entry for the observed state\(s\) \['x2'\]"):
        pgpgm.gradient_matching_density(lv.system, ds, ["x1", "x2"], gamma={"x1": 0.3})
    with pytest.raises(DataError, match=r"kernel given for \['x3'\]"):
        pgpgm.fit(lv.system, ds, ["x1", "x2"], kernel={"x1": "rbf", "x2": "rbf", "x3": "rbf"}, progressbar=False)


# ---------------------------------------------------------------- estimates at a prior bound
def test_bound_report_counts_draws():
    from pgpgm.refinement.bounds import bound_report

    priors = pgpgm.Priors.from_user(["a", "b", "c"], {"a": (0, 10), "b": (1, 2), "c": lambda n: pm.Normal(n, 0.0, 1.0)})
    rng = np.random.default_rng(0)
    near = rng.uniform(1.0, 1.0 + 0.009, 30)       # within 1 % of the width (0.01) of b's lower bound
    draws = {"a": rng.uniform(2, 8, 200), "b": np.r_[near, rng.uniform(1.2, 1.8, 170)], "c": rng.normal(size=200)}
    report = bound_report(priors, [9.9995, 1.5, 100.0], draws)
    assert [(r.parameter, r.side, r.refined) for r in report] == [("a", "upper", True), ("b", "lower", False)]
    assert report[1].fraction == 30 / 200 and np.isclose(report[0].fraction, np.mean(draws["a"] >= 9.9))
    assert "b is at the lower bound 1 of its Uniform prior (1, 2): 15 % of the posterior draws" in report[1].message
    assert "widen the prior, e.g. priors={'a': (0, 100)}" in report[0].message
    assert bound_report(priors, [5.0, 1.5, 0.0], {"b": np.r_[near[:20], rng.uniform(1.2, 1.8, 180)]}) == ()


def test_fit_warns_when_the_refined_estimate_is_on_a_bound(lv, tmp_path):
    from pgpgm.cli.command import _write_outputs

    ds = _async(lv, missing=0.0)
    with pytest.warns(pgpgm.BoundWarning, match=r"theta3 is at the upper bound 3 of its Uniform prior \(0, 3\)"):
        r = pgpgm.fit(lv.system, ds, ["x1", "x2"], noise_sd=0.1, priors={"theta3": (0, 3)}, draws=150, tune=150,
                      posterior=pgpgm.Laplace(100), progressbar=False)
    assert abs(r.theta[2] - 3.0) <= 1e-3 * 3  # the truth (4) is outside the box
    assert list(r.at_bounds) == ["theta3"] and "widen the prior" in r.at_bounds["theta3"]
    table = r.parameter_table()
    assert table.loc["theta3", "at_bound"] == "upper" and (table["at_bound"] != "").sum() == 1
    back = pgpgm.load_result(r.save(tmp_path / "b.nc"))
    assert back.at_bounds == r.at_bounds
    _write_outputs(r, tmp_path / "out", "bound test")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## At a prior bound" in summary and "theta3 is at the upper bound 3" in summary


# ---------------------------------------------------------------- unknown initial values
def test_refinement_jacobian_wrt_a_latent_initial_value_matches_finite_differences(fhn):
    c = fhn.case("V-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times[::2], observed=["V"], snr=c.snr, seed=0)
    integ = pgpgm.Integrator(fhn.system, ds.time.values, pgpgm.CVODE(rtol=1e-11, atol=1e-11))
    problem = LeastSquaresProblem(integ, ds.y.values, (0,), 0.1, np.array([-1.0, 0.8]), free_x0=(0, 1))
    assert problem.q_names[-1] == "x0[R]"
    q = np.r_[0.25, 0.15, 2.8, -0.9, 0.8]
    J = problem.jacobian(q)
    h = 1e-6
    for j in (3, 4):
        e = np.zeros(q.size)
        e[j] = h
        fd = (problem.residuals(q + e) - problem.residuals(q - e)) / (2 * h)
        np.testing.assert_allclose(J[:, j], fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())


def test_bad_initial_value_priors(lv, fhn):
    ds = _async(lv)
    with pytest.raises(DataError, match=r"x0 gives a prior for \['H'\], which are not states"):
        pgpgm.gradient_matching_density(lv.system, ds, ["x1"], x0={"H": (0, 50)})
    with pytest.raises(DataError, match=r"x0 gives a prior for \['H'\], which are not states"):
        pgpgm.fit(lv.system, ds, ["x1"], x0={"x2": 3.0, "H": (0, 50)}, progressbar=False)
    with pytest.raises(DataError, match=r"prior for the observed state\(s\) \['x1'\]"):
        pgpgm.gradient_matching_density(lv.system, ds, ["x1"], x0={"x1": (0, 10), "x2": 3.0})
    with pytest.raises(DataError, match="prior bounds of x2_0 must be finite with lower < upper"):
        pgpgm.gradient_matching_density(lv.system, ds, ["x1"], x0={"x2": (5, 1)})
    with pytest.raises(DataError, match=r"latent states \['x2'\] are required .* or give a prior"):
        pgpgm.gradient_matching_density(lv.system, ds, ["x1"], x0={})


def test_unknown_latent_initial_value_is_a_free_variable(fhn):
    c = fhn.case("V-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times[::2], observed=["V"], snr=c.snr, seed=0)
    d = pgpgm.gradient_matching_density(fhn.system, ds, ["V"], x0={"R": (-5, 5)}, kernel="matern52",
                                        priors=(0, 5))
    model = d.model()
    assert "R_0" in [v.name for v in model.free_RVs] and d.unknown_x0_idx == (1,)
    target = GradientMatchingTarget(d)
    assert target.coordinate_names[-1] == "R_0_interval__" or target.coordinate_names[-1] == "R_0"
    X = np.zeros((d.obs.times.size, 2))
    X[:, 0] = d.gp_posterior_means()[:, 0]
    _, _, lat = target.evaluate(np.r_[c.theta, 0.7], X)
    x = scipy_reference(fhn.system, c.theta, [X[0, 0], 0.7], d.obs.times)
    np.testing.assert_allclose(lat[:, 0], x[:, 1], rtol=1e-5, atol=1e-6)  # the latent solve starts at R_0
    model, layout = pgpgm.build_ode_model(fhn.system, ds, ["V"], x0={"R": (-5, 5)}, priors=(0, 5), noise_sd=0.1)
    assert layout.initial == ("V_0", "R_0") and {"V_0", "R_0"} <= {v.name for v in model.free_RVs}


@pytest.mark.slow
def test_unknown_latent_initial_value_is_recovered(fhn):
    c = fhn.case("V-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times, observed=["V"], snr=c.snr, seed=0)
    r = pgpgm.fit(fhn.system, ds, ["V"], x0={"R": (-5, 5)}, kernel="matern52", priors=(0, 5), draws=800,
                  tune=800, posterior=None, progressbar=False, seed=0)
    se = float(r.estimates["x0_stderr"].sel(state="R"))
    assert 0 < se < 0.2 and bool(r.estimates["x0_unknown"].sel(state="R"))
    assert abs(r.x0["R"] - 1.0) < 3 * se
    np.testing.assert_allclose(r.theta, c.theta, rtol=0.2)


@pytest.mark.slow
def test_nuts_posterior_with_missing_values_and_an_unknown_initial_value(fhn):
    """Step 4 on gappy data with R_0 unknown: the free variables are there and the posterior of R_0
    covers the truth."""
    c = fhn.case("V-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times, observed=["V"], snr=c.snr, seed=0, missing=0.3)
    r = pgpgm.fit(fhn.system, ds, ["V"], x0={"R": (-5, 5)}, kernel="matern52", priors=(0, 5), draws=500,
                  tune=500, posterior=pgpgm.NUTS(draws=200, tune=200, chains=2, cores=1),
                  progressbar=False, seed=0)
    post = r.posterior.posterior
    assert {"R_0", "V_0", "sigma_V"} <= set(post.data_vars)
    lo, hi = np.quantile(post["R_0"].values, [0.005, 0.995])
    assert lo < 1.0 < hi
    assert abs(float(post["R_0"].mean()) - r.x0["R"]) < 3 * float(r.estimates["x0_stderr"].sel(state="R"))

"""Observables (issue 31, item 3): measured functions of the states and parameters.

The model: oral dosing into a latent gut compartment A (A(0) = dose, known) and a central
compartment C,

    dA/dt = -ka A,    dC/dt = ka A - ke C,

measured as ``y_C = C`` (directly), ``y_total = A + C`` (a sum with the latent state) and
``y_blot = s * A`` (the latent state up to an unknown scale s: steps 1-2 fit a GP to y_blot and match
gradients of A = y_blot / s, s sampled with theta). Lotka-Volterra measured only as y = s * x2 is the
case where step 2 sees the scale only as t2 / s and step 3 pins it from the known x2(0). References are
independent of pgpgm: scipy's solve_ivp and least_squares from 24 starts written here, scipy.stats
densities, the gradient-matching density written out by hand, finite differences.
"""

import json
import warnings

import numpy as np
import pymc as pm
import pytest
import xarray as xr
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm.errors import DataError, ModelDefinitionError, PgpgmError
from pgpgm.matching.target import GradientMatchingTarget
from pgpgm.observables import Observables
from pgpgm.posterior.space import ValueSpace
from pgpgm.posterior.model import build_ode_model
from pgpgm.refinement import ObservablesProblem, refine
from pgpgm.solve import Integrator

SYSTEM = pgpgm.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, ["ka", "ke"], name="oral")
OBSERVABLES = {"y_C": "C", "y_total": "A + C", "y_blot": "s*A"}
TRUTH = np.array([1.2, 0.3, 2.5])  # ka, ke, s
X0 = np.array([10.0, 0.0])  # A(0) = dose, C(0)
TIMES = np.linspace(0.0, 12.0, 25)
SD = np.array([0.1, 0.15, 0.2])
BOX = (0.01, 10.0)


def _data(seed=3, **kwargs):
    return pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=OBSERVABLES, noise_sd=SD, seed=seed, **kwargs)


def _fit(data, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgpgm.fit(SYSTEM, data, observables=OBSERVABLES, priors=BOX, draws=300, tune=300, chains=2,
                         progressbar=False, seed=0, **kwargs)


# ------------------------------------------------------------------ independent references
def _solve(ka, ke, x0, t):
    """(N, 2) A and C by scipy's solve_ivp (LSODA, tight tolerances)."""
    sol = solve_ivp(lambda _, x: [-ka * x[0], ka * x[0] - ke * x[1]], (t[0], t[-1]), x0, t_eval=t, method="LSODA",
                    rtol=1e-11, atol=1e-12)
    return sol.y.T


def _h(x, s):
    """(N, 3) the observables from the states (N, 2) and the scale s."""
    return np.column_stack([x[:, 1], x[:, 0] + x[:, 1], s * x[:, 0]])


def _reference_optimum(y, sd, n_starts=24, columns=(0, 1, 2), free_c0=True):
    """The weighted least-squares optimum over q = (ka, ke, s, C(0)) (C(0) known 0 unless ``free_c0``)
    of the data y (N, len(columns)) of the observables ``columns``, A(0) known, by scipy least_squares
    (trf, finite differences) from n_starts points spread over the prior box."""
    cols = list(columns)

    def res(q):
        x = _solve(q[0], q[1], [X0[0], q[3] if free_c0 else X0[1]], TIMES)
        return ((_h(x, q[2])[:, cols] - y) / sd).ravel()

    rng = np.random.default_rng(11)
    lo, hi = np.array([*[BOX[0]] * 3, -np.inf]), np.array([*[BOX[1]] * 3, np.inf])
    if not free_c0:
        lo, hi = lo[:3], hi[:3]
    best = None
    for _ in range(n_starts):
        q0 = np.concatenate([rng.uniform(0.05, 5.0, 3), rng.uniform(-0.5, 0.5, 1)])[:lo.size]
        r = optimize.least_squares(res, q0, bounds=(lo, hi), method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12,
                                   gtol=1e-12, max_nfev=400)
        if best is None or r.cost < best.cost:
            best = r
    return best


# ------------------------------------------------------------------ simulate, parse
def test_simulate_measures_the_observables():
    d = pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=OBSERVABLES, noise_sd=0.0)
    x = _solve(TRUTH[0], TRUTH[1], X0, TIMES)
    np.testing.assert_allclose(d["y"].values, _h(x, TRUTH[2]), rtol=1e-6, atol=1e-6)  # the solver's tolerance
    assert list(d["observed"].values) == list(OBSERVABLES)
    assert d.attrs["parameters"] == ["ka", "ke", "s"]


def test_parse_finds_observation_parameters_and_identity():
    spec = Observables.parse({"y1": "x1", "y2": "s*x2 + off", "y3": "x1*x2/(k + x1)"},
                             pgpgm.ODESystem.from_equations({"x1": "-a*x1", "x2": "a*x1"}, ["a"]))
    assert spec.observation_parameters == ("s", "off", "k")
    assert spec.parameters == ("a", "s", "off", "k")
    assert spec.identity == {"y1": "x1"}
    assert spec.states_of("y3") == ("x1", "x2")
    # h and its derivatives against numpy and central differences
    rng = np.random.default_rng(0)
    t, x, p = np.linspace(0, 1, 7), rng.uniform(0.5, 2.0, (7, 2)), np.array([0.7, 1.3, 0.2, 0.9])
    expect = np.column_stack([x[:, 0], 1.3 * x[:, 1] + 0.2, x[:, 0] * x[:, 1] / (0.9 + x[:, 0])])
    np.testing.assert_allclose(spec.values(t, x, p), expect, rtol=1e-14)
    hx, hp = spec.jacobians(t, x, p)
    eps = 1e-6
    for j in range(2):
        dx = np.zeros_like(x)
        dx[:, j] = eps
        np.testing.assert_allclose(hx[:, :, j], (spec.values(t, x + dx, p) - spec.values(t, x - dx, p)) / (2 * eps),
                                   rtol=1e-7, atol=1e-9)
    for k in range(4):
        dp = np.zeros(4)
        dp[k] = eps
        np.testing.assert_allclose(hp[:, :, k], (spec.values(t, x, p + dp) - spec.values(t, x, p - dp)) / (2 * eps),
                                   rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------------ step 3
@pytest.mark.parametrize("noise", [None, ("normal", "lognormal", "normal")])
def test_jacobian_matches_finite_differences(noise):
    spec = Observables.parse(OBSERVABLES, SYSTEM)
    y = _data()["y"].values
    problem = ObservablesProblem.of(Integrator(spec.extend(SYSTEM), TIMES), spec, y, SD, X0, free_x0=(1,),
                                    noise=noise)
    q = np.array([1.0, 0.35, 2.0, 0.1])  # ka, ke, s, C(0)
    J = problem.jacobian(q)
    assert J.shape == (y.size, 4)
    fd = np.empty_like(J)
    for k in range(4):
        step = 1e-6 * max(1.0, abs(q[k]))
        dq = np.zeros(4)
        dq[k] = step
        fd[:, k] = (problem.residuals(q + dq) - problem.residuals(q - dq)) / (2 * step)
    np.testing.assert_allclose(J, fd, rtol=1e-4, atol=1e-4 * np.abs(fd).max())


def test_fit_refines_to_the_independent_multistart_optimum():
    d = _data()
    result = _fit(d, noise_sd=SD, posterior=None)
    ref = _reference_optimum(d["y"].values, SD)
    est = result.estimates
    refined = est["theta"].sel(estimate="refined").values
    assert list(est["parameter"].values) == ["ka", "ke", "s"]
    np.testing.assert_allclose(refined, ref.x[:3], rtol=2e-5)
    np.testing.assert_allclose(est["x0"].sel(state="C").values, ref.x[3], atol=2e-5)
    # the same likelihood: pgpgm's weighted cost is the reference's
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-6)
    # and it is near the truth (the data determine it)
    np.testing.assert_allclose(refined, TRUTH, rtol=0.1)
    # the result carries the observables: their trajectories and data, the observation parameter
    traj = result.trajectories
    assert list(traj["observable"].values) == list(OBSERVABLES)
    x = _solve(*refined[:2], est["x0"].values, traj["time_dense"].values)
    np.testing.assert_allclose(traj["h"].sel(estimate="refined").values, _h(x, refined[2]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(traj["y"].values, d["y"].values)


def test_fit_with_estimated_noise_result_saves_and_plots(tmp_path):
    result = _fit(_data(seed=5), posterior=pgpgm.Laplace(100))
    sd = result.trajectories["noise_sd"].values
    assert np.all((sd > 0.3 * SD) & (sd < 3 * SD))
    assert "s" in result.posterior.posterior
    path = result.save(tmp_path / "obs.nc")
    back = pgpgm.load_result(path)
    xr.testing.assert_identical(back.trajectories, result.trajectories)
    assert back.system.parameters == ("ka", "ke", "s")
    fig = result.plot_states()
    assert len(fig.axes) == 2 + 3  # the states, then the observables
    assert [ax.get_title() for ax in fig.axes] == ["A (latent)", "C (observed as y_C)", "y_C (observable)",
                                                  "y_total (observable)", "y_blot (observable)"]


def test_noise_models_and_fixed_observation_parameters():
    # lognormal measurement noise on the total (y_blot falls to 1e-5, where the solver's absolute
    # tolerance 1e-8 moves log mu by 1e-3): refinement_nll is scipy.stats' likelihood
    d = _data(noise={"y_total": "lognormal"})
    result = _fit(d, noise={"y_total": "lognormal"}, posterior=None)
    est, traj = result.estimates, result.trajectories
    theta = est["theta"].sel(estimate="refined").values
    x = _solve(*theta[:2], est["x0"].values, TIMES)
    mu, y, sd = _h(x, theta[2]), d["y"].values, traj["noise_sd"].values
    nll = -(stats.norm(mu[:, 0], sd[0]).logpdf(y[:, 0]).sum() + stats.lognorm(s=sd[1], scale=mu[:, 1]).logpdf(
        y[:, 1]).sum() + stats.norm(mu[:, 2], sd[2]).logpdf(y[:, 2]).sum())
    np.testing.assert_allclose(est.attrs["refinement_nll"], nll, rtol=1e-6)
    np.testing.assert_allclose(sd[1], SD[1], rtol=0.5)  # the sd of log y
    np.testing.assert_allclose(theta, TRUTH, rtol=0.1)
    # an observation parameter held fixed: the refinement is the scipy optimum over (ka, ke, C(0))
    d = _data()
    result = _fit(d, noise_sd=SD, posterior=None, fixed={"s": 2.5})
    est = result.estimates
    assert bool(est["fixed"].sel(parameter="s")) and float(est["stderr"].sel(parameter="s")) == 0.0

    def res(q):
        return ((_h(_solve(q[0], q[1], [X0[0], q[2]], TIMES), 2.5) - d["y"].values) / SD).ravel()

    ref = min((optimize.least_squares(res, q0, bounds=([BOX[0]] * 2 + [-np.inf], [BOX[1]] * 2 + [np.inf]),
                                      xtol=1e-12, ftol=1e-12, gtol=1e-12) for q0 in
               np.random.default_rng(2).uniform([0.05, 0.05, -0.5], [5.0, 5.0, 0.5], (20, 3))), key=lambda r: r.cost)
    np.testing.assert_allclose(est["theta"].sel(estimate="refined").values[:2], ref.x[:2], rtol=2e-5)
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-6)


def test_without_a_matched_observable_step3_starts_from_the_prior_box():
    # A and C are seen only through A + C and s * A + C, each a function of both states: no GP, no
    # gradient matching (steps 1-2 refuse them)
    observables = {"y_total": "A + C", "y_mix": "s*A + C"}
    d = pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=observables, noise_sd=SD[1:], seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pgpgm.fit(SYSTEM, d, observables=observables, priors=BOX, noise_sd=SD[1:],
                           posterior=pgpgm.Laplace(100), progressbar=False, seed=0)

    def res(q):
        x = _solve(q[0], q[1], X0, TIMES)
        return ((np.column_stack([x[:, 0] + x[:, 1], q[2] * x[:, 0] + x[:, 1]]) - d["y"].values) / SD[1:]).ravel()

    rng = np.random.default_rng(11)
    ref = min((optimize.least_squares(res, rng.uniform(0.05, 5.0, 3), bounds=([BOX[0]] * 3, [BOX[1]] * 3),
                                      method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=400)
               for _ in range(24)), key=lambda r: r.cost)
    est = result.estimates
    np.testing.assert_allclose(est["theta"].sel(estimate="refined").values, ref.x, rtol=2e-5)
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-6)
    assert est.sizes["start"] == pgpgm.steps.refine.BOX_STARTS
    assert "steps 1-2 skipped" in est.attrs["sampling_stop_reason"]
    assert result.gradient_matching is None and result.n_ode_solves["sampling"] == 0
    why = json.loads(est.attrs["observables_in_steps_1_2"])
    assert all("a function of the states A, C" in why[n] for n in observables)


# ------------------------------------------------------------------ steps 1-2 on a state measured up to a scale
def test_for_matching_takes_affine_observables_of_one_state_and_says_why_not_the_others():
    two = pgpgm.ODESystem.from_equations({"x1": "-a*x1", "x2": "a*x1 - k*x2"}, ["a", "k"])
    spec = Observables.parse({"y1": "s*x2", "y2": "x1/q + b", "y3": "x1 + x2", "y4": "s*x2**2",
                              "y5": "t*x2", "y6": "2*x2", "y7": "x1"}, two)
    matched, refused = spec.for_matching()
    assert list(matched) == ["y1", "y7"]
    assert (matched["y1"].state, matched["y1"].scale, matched["y1"].offset) == ("x2", Observables.symbol("s"), 0)
    assert matched["y7"].identity and not matched["y1"].identity
    assert "has a GP from 'y7' already" in refused["y2"]  # x1 measured directly: that GP is kept
    offset = Observables.parse({"y2": "x1/q + b"}, two).for_matching()[0]["y2"]
    assert offset.state == "x1" and offset.parameters == ("b", "q")
    assert offset.state_value(4.0, {"q": 2.0, "b": 1.0}) == pytest.approx(6.0)  # (4 - 1) * 2
    assert "a function of the states x1, x2" in refused["y3"]
    assert "not of the form a * x2 + c" in refused["y4"]
    assert "changes with t" in refused["y5"]
    assert "has a GP from 'y1' already" in refused["y6"]
    # the system of steps 1-2: x1 is measured directly, x2 as y1 = s x2: dy1/dt = s (a x1 - k y1 / s)
    gm = spec.matching_system(two, [matched["y1"]])
    assert gm.states == ("x1", "y1") and gm.parameters == ("a", "k", "s")
    rng = np.random.default_rng(1)
    x, p = rng.uniform(0.5, 2.0, (6, 2)), np.array([0.7, 0.4, 2.5])
    expect = np.column_stack([-0.7 * x[:, 0], 2.5 * (0.7 * x[:, 0] - 0.4 * x[:, 1] / 2.5)])
    np.testing.assert_allclose(gm.rhs_on_grid(np.zeros(6), x, p), expect, rtol=1e-14)


LV = pgpgm.ODESystem.from_equations({"x1": "t1*x1 - t2*x1*x2", "x2": "-t3*x2 + t4*x1*x2"},
                                    ["t1", "t2", "t3", "t4"], name="lv")
LV_TRUTH = np.array([2.0, 1.0, 4.0, 1.0, 2.0])  # t1..t4, then the scale s
LV_X0 = np.array([5.0, 3.0])
LV_TIMES = np.linspace(0.0, 2.0, 20)


def _lv_solve(theta, x0, t):
    t1, t2, t3, t4 = theta
    sol = solve_ivp(lambda _, x: [t1 * x[0] - t2 * x[0] * x[1], -t3 * x[1] + t4 * x[0] * x[1]], (t[0], t[-1]), x0,
                    t_eval=t, method="LSODA", rtol=1e-11, atol=1e-12)
    return sol.y.T


def test_matching_density_with_a_scaled_gp_is_the_hand_computed_one():
    # y = s * x2 + b measured, x1 latent (x1(0) = 5): steps 1-2 fit the GP to y and match gradients of
    # x2 = (y - b) / s, dx2/dt = (dy/dt) / s; in the GP's units the residual is s f_2(x1, x2) - D (y - mu)
    spec = Observables.parse({"y": "s*x2 + b"}, LV)
    matched, _ = spec.for_matching()
    gm = spec.matching_system(LV, list(matched.values()))
    assert gm.states == ("x1", "y") and gm.parameters == ("t1", "t2", "t3", "t4", "s", "b")
    x = _lv_solve(LV_TRUTH[:4], LV_X0, LV_TIMES)
    y = 2.0 * x[:, 1] + 0.5 + 0.1 * np.random.default_rng(4).standard_normal(LV_TIMES.size)
    priors = {"s": (0.5, 4.0), "b": (-1.0, 1.0)}
    density = pgpgm.gradient_matching_density(gm, {"time": LV_TIMES, "y": y}, ["y"], x0={"x1": 5.0}, gamma=0.3,
                                              priors=priors, solver=pgpgm.CVODE(rtol=1e-11, atol=1e-12))
    target = GradientMatchingTarget(density)
    term = density.terms[0]
    g = density.gp_posterior_means()[:, 0] + 0.05 * np.sin(LV_TIMES)  # the GP's values of y at the grid
    for q in (np.array([1.9, 0.9, 4.1, 1.05, 2.2, 0.4]), np.array([2.1, 1.3, 3.8, 0.95, 1.4, -0.3])):
        theta, s, b = q[:4], q[4], q[5]
        x2 = (g - b) / s  # the state the GP determines
        x1 = _lv_solve(theta, [LV_X0[0], x2[0]], LV_TIMES)[:, 0]  # the latent state, from x2(0) = (y0 - b) / s
        f2 = -theta[2] * x2 + theta[3] * x1 * x2
        mu, Cinv, D, Prec = term.matching.mean, term.matching.C_precision, term.matching.D, term.grad_precision
        r = s * f2 - D @ (g - mu)
        expect = (stats.uniform(0, 10).logpdf(theta).sum() + stats.uniform(0.5, 3.5).logpdf(s)
                  + stats.uniform(-1, 2).logpdf(b) - 0.5 * (g - mu) @ Cinv @ (g - mu)
                  + stats.norm(g, term.noise_sd).logpdf(y).sum() - 0.5 * r @ Prec @ r)
        X = np.zeros((LV_TIMES.size, 2))
        X[:, 1] = g
        lp, _, lat = target.evaluate(q, X)
        np.testing.assert_allclose(lat[:, 0], x1, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(lp, expect, rtol=1e-8)
        np.testing.assert_allclose(target.evaluate_model(q, X)[0], expect, rtol=1e-8)  # the pm.Model's


def _lv_reference(y, sd, n_starts=24):
    """Least squares over (t1..t4, s) of y = s x2 with x(0) known, by scipy from n_starts points."""
    def res(q):
        return (q[4] * _lv_solve(q[:4], LV_X0, LV_TIMES)[:, 1] - y) / sd

    rng = np.random.default_rng(11)
    return min((optimize.least_squares(res, rng.uniform(0.2, 5.0, 5), bounds=([0.0] * 5, [10.0] * 5), method="trf",
                                       x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=400)
                for _ in range(n_starts)), key=lambda r: r.cost)


@pytest.mark.slow  # accuracy, ~27 s
def test_fit_of_a_state_measured_only_up_to_a_scale_runs_steps_1_2_and_reaches_the_optimum():
    # Lotka-Volterra, only y = s * x2 measured (x1 latent, both initial values known): step 2 samples s
    # with theta on the GP of y; its equations see t2 / s only (x2 = y / s), so the chains lie along that
    # ridge, and step 3 pins s from the known x2(0)
    observables = {"y": "s*x2"}
    d = pgpgm.simulate(LV, LV_TRUTH, LV_X0, LV_TIMES, observables=observables, noise_sd=0.1, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pgpgm.fit(LV, d, observables=observables, noise_sd=0.1, draws=300, tune=300, chains=2,
                           posterior=None, progressbar=False, seed=0)
    y = d["y"].values[:, 0]
    ref = _lv_reference(y, 0.1)
    est = result.estimates
    refined = est["theta"].sel(estimate="refined").values
    np.testing.assert_allclose(refined, ref.x, rtol=2e-5)
    # the same optimum: scipy's cost at pgpgm's point is the reference's (pgpgm's own cost differs by its
    # solver's tolerance, 2e-6 here)
    cost = 0.5 * np.sum(((refined[4] * _lv_solve(refined[:4], LV_X0, LV_TIMES)[:, 1] - y) / 0.1) ** 2)
    np.testing.assert_allclose(cost, ref.cost, rtol=1e-8)
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-5)
    np.testing.assert_allclose(refined[4], LV_TRUTH[4], rtol=0.05)  # s, pinned by the known x2(0)
    gm = result.gradient_matching.posterior  # steps 1-2 ran: s sampled with theta, the GP-smoothed y
    assert {"t1", "t2", "t3", "t4", "s", "y"} <= set(gm.data_vars) and "x2" not in gm.data_vars
    assert result.n_ode_solves["sampling"] > 0
    assert "x2 = y/s in gradient matching, ['s'] sampled" in json.loads(est.attrs["observables_in_steps_1_2"])["y"]


def test_fit_with_a_scaled_state_and_a_sum_reaches_the_optimum():
    # the oral model with y_total = A + C and y_blot = s * A (no state measured directly): steps 1-2 run on
    # the GP of y_blot (A = y_blot / s, C latent), y_total enters at step 3
    observables = {"y_total": "A + C", "y_blot": "s*A"}
    d = pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=observables, noise_sd=SD[1:], seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pgpgm.fit(SYSTEM, d, observables=observables, priors=BOX, noise_sd=SD[1:], draws=300, tune=300,
                           chains=2, posterior=None, progressbar=False, seed=0)
    ref = _reference_optimum(d["y"].values, SD[1:], columns=(1, 2), free_c0=False)
    est = result.estimates
    np.testing.assert_allclose(est["theta"].sel(estimate="refined").values, ref.x, rtol=2e-5)
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-6)
    assert "s" in result.gradient_matching.posterior and "y_blot" in result.gradient_matching.posterior
    why = json.loads(est.attrs["observables_in_steps_1_2"])
    assert why["y_total"].startswith("refused in steps 1-2") and "a GP on the measurement" in why["y_blot"]


def test_scaled_state_with_an_unknown_initial_value_starts_from_the_chains_and_reaches_the_optimum():
    # y_C = C and y_blot = s * A with A(0) unknown (a prior): step 2 matches A = y_blot / s (s pinned by
    # dC/dt = ka y_blot / s - ke C); step 3 starts A(0) at y_blot(0) / s from the chains' means and frees it
    observables = {"y_C": "C", "y_blot": "s*A"}
    sd = SD[[0, 2]]
    d = pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=observables, noise_sd=sd, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pgpgm.fit(SYSTEM, d, observables=observables, x0={"A": (2.0, 20.0)}, priors=BOX, noise_sd=sd,
                           draws=300, tune=300, chains=2, posterior=pgpgm.Laplace(100),
                           progressbar=False, seed=0)
    y = d["y"].values

    def res(q):  # q = (ka, ke, s, A(0), C(0))
        x = _solve(q[0], q[1], q[3:5], TIMES)
        return ((np.column_stack([x[:, 1], q[2] * x[:, 0]]) - y) / sd).ravel()

    rng = np.random.default_rng(11)
    ref = min((optimize.least_squares(res, np.concatenate([rng.uniform(0.05, 5.0, 3), rng.uniform([2.0, -0.5],
                                                                                                  [20.0, 0.5])]),
                                      bounds=([BOX[0]] * 3 + [-np.inf] * 2, [BOX[1]] * 3 + [np.inf] * 2),
                                      method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=400)
               for _ in range(24)), key=lambda r: r.cost)
    est = result.estimates
    np.testing.assert_allclose(est["theta"].sel(estimate="refined").values, ref.x[:3], rtol=2e-5)
    np.testing.assert_allclose(est["x0"].values, ref.x[3:], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(est.attrs["refinement_cost"], ref.cost, rtol=1e-6)
    assert est["x0_unknown"].values.tolist() == [True, False]
    se = float(est["x0_stderr"].sel(state="A"))
    assert np.isfinite(se) and 0 < se < 0.1 * ref.x[3]  # determined: s by C's equation, A(0) by s * A(0)
    gm = result.gradient_matching.posterior
    assert "s" in gm and "y_blot" in gm and "A_0" not in gm  # A(0) is no part of steps 1-2


# ------------------------------------------------------------------ step 4
@pytest.mark.parametrize("noise", [None, ("normal", "lognormal", "normal")])
def test_step4_logp_is_the_hand_computed_posterior(noise):
    d = _data()
    spec = Observables.parse(OBSERVABLES, SYSTEM)
    ext = spec.extend(SYSTEM)
    measured = pgpgm.ODESystem.from_equations({n: "0" for n in OBSERVABLES}, [])
    obs = pgpgm.data.as_observations(d, None, measured)
    center = np.array([0.2, 0.3, 0.4])
    model, layout = build_ode_model(ext, obs, x0=X0, priors={"ka": (0.0, 5.0), "ke": (0.0, 2.0), "s": (0.5, 8.0)},
                                    noise_center=center, noise=noise, observables=spec,
                                    solver=pgpgm.CVODE(rtol=1e-11, atol=1e-12))
    assert layout.parameters == ("ka", "ke", "s") and layout.initial == ("C_0",)
    point = {"ka": 1.1, "ke": 0.33, "s": 2.2, "C_0": 0.05, "sigma_y_C": 0.12, "sigma_y_total": 0.2,
             "sigma_y_blot": 0.25}
    space = ValueSpace(model)
    logp = float(model.compile_logp(jacobian=False)(space.point(point)))
    y = d["y"].values
    x = _solve(point["ka"], point["ke"], [X0[0], point["C_0"]], TIMES)
    mu = _h(x, point["s"])
    expect = (stats.uniform(0, 5).logpdf(1.1) + stats.uniform(0, 2).logpdf(0.33) + stats.uniform(0.5, 7.5).logpdf(2.2)
              + stats.norm(y[0, 0], np.std(y[:, 0])).logpdf(0.05))
    for m, name in enumerate(OBSERVABLES):
        sig = point[f"sigma_{name}"]
        expect += stats.lognorm(s=2.0, scale=center[m]).logpdf(sig)
        if noise is not None and noise[m] == "lognormal":
            expect += stats.lognorm(s=sig, scale=mu[:, m]).logpdf(y[:, m]).sum()
        else:
            expect += stats.norm(mu[:, m], sig).logpdf(y[:, m]).sum()
    np.testing.assert_allclose(logp, expect, rtol=1e-7)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("observables, error, words", [
    ({"C": "C"}, ModelDefinitionError, "is a state"),
    ({"ka": "A"}, ModelDefinitionError, "is a parameter"),
    ({"y_C": "C +* A"}, ModelDefinitionError, "observable 'y_C'"),
    ({"y_C": "2*s"}, ModelDefinitionError, "uses no state"),
    ({"y_C": "C", "y_total": "y_C + A"}, ModelDefinitionError, "also used as parameters"),
    ({"y C": "C"}, ModelDefinitionError, "not a valid identifier"),
    ({"y_C": "foo(C)"}, ModelDefinitionError, "'foo' is not allowed"),
    ({}, ModelDefinitionError, "non-empty mapping"),
    ("C", ModelDefinitionError, "non-empty mapping"),
])
def test_bad_observables_are_clear_errors(observables, error, words, monkeypatch):
    monkeypatch.setattr(pgpgm.fitting, "match", _no_compiled_code)  # raised before steps 1-2 start
    with pytest.raises(error, match=words):
        pgpgm.fit(SYSTEM, _data(), observables=observables, progressbar=False)


def _no_compiled_code(*args, **kwargs):
    raise AssertionError("the bad input reached steps 1-2")


def test_bad_data_and_options_with_observables_are_clear_errors(monkeypatch):
    monkeypatch.setattr(pgpgm.fitting, "match", _no_compiled_code)
    d = _data()
    wide = {"time": TIMES, **{n: d["y"].sel(observed=n).values for n in OBSERVABLES}}
    cases = [
        (dict(data={**wide, "C": wide["y_C"]}), "are states"),
        (dict(data={k: v for k, v in wide.items() if k != "y_blot"}), r"observables \['y_blot'\] have no data"),
        (dict(data={**wide, "z": wide["y_C"]}), r"data columns \['z'\]"),
        (dict(observables={"y_total": "A + C", "y_mix": "s*A + C"}, posterior=None,
              data={"time": TIMES, "y_total": wide["y_total"], "y_mix": wide["y_blot"]}),
         "no state is measured directly"),
        (dict(observables={"y_total": "A + C", "y_mix": "s*A + C"},
              priors={"s": lambda name: pm.LogNormal(name, 0.0, 1.0)}, x0={"A": 10.0, "C": 0.0},
              data={"time": TIMES, "y_total": wide["y_total"], "y_mix": wide["y_blot"]}), r"\['s'\] have no box"),
        (dict(observables={"y_total": "A + C", "y_blot": "s*A"}, x0={"C": 0.0},
              data={k: v for k, v in wide.items() if k != "y_C"}), r"latent states \['A'\]"),
        (dict(kernel={"A": "rbf", "C": "rbf"}), r"kernel given for \['A'\]"),
        (dict(observables={"C_meas": "C", "y_total": "A + C", "y_C": "s*A"},
              data={"time": TIMES, "C_meas": wide["y_C"], "y_total": wide["y_total"], "y_C": wide["y_blot"]}),
         r"\['y_C'\] would name two variables"),
        (dict(transform={"C": "log"}), "transform is not available"),
        (dict(x0_observed={"C": 0.0}), "x0_observed is not available"),
        (dict(fixed={"q": 1.0}), r"fixed names \['q'\]"),
        (dict(true_theta=[1.0, 0.3]), "true_theta must be 3"),
        (dict(priors={"r": (0, 1)}), r"unknown parameters \['r'\]"),
        (dict(noise={"y_C": "lognormal"}, data={**wide, "y_C": wide["y_C"] - 5.0}), "y_C"),
    ]
    for kwargs, words in cases:
        args = {"data": d, "observables": OBSERVABLES} | kwargs
        data = args.pop("data")
        with pytest.raises(PgpgmError, match=words):
            pgpgm.fit(SYSTEM, data, progressbar=False, **args)
    with pytest.raises(DataError, match="observables of"):
        pgpgm.simulate(SYSTEM, TRUTH, X0, TIMES, observables=OBSERVABLES, observed=["C"], noise_sd=0.1)
    with pytest.raises(DataError, match="theta must be 3"):
        pgpgm.simulate(SYSTEM, TRUTH[:2], X0, TIMES, observables=OBSERVABLES, noise_sd=0.1)


@pytest.mark.slow
def test_fit_with_nuts_covers_the_truth():
    # ~60 s: step 4 (NUTS on the ODE model with the observables' likelihood) compiles and samples
    result = _fit(_data(seed=7), posterior=pgpgm.NUTS(draws=300, tune=300, chains=2, budget=300))
    post = result.posterior.posterior
    for name, true in zip(("ka", "ke", "s"), TRUTH):
        lo, hi = np.quantile(post[name].values, [0.001, 0.999])
        assert lo < true < hi, (name, lo, hi, true)
    for name in OBSERVABLES:  # each observable is a deterministic on the plotting grid
        assert post[name].dims == ("chain", "draw", "time_dense")
    assert "sigma_y_blot" in post

"""Step 3: the maximum-likelihood refinement (pgpgm.refine) against independent references."""

import warnings

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy.stats import qmc

import pgpgm
from pgpgm.errors import DataError, IdentifiabilityWarning
from pgpgm.refinement import LeastSquaresProblem, refine


def _tight():
    """The default backend with tolerances far below the tests' tolerances."""
    return type(pgpgm.default_solver())(rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def linear():
    """dx/dt = a + b t: x(t) = x0 + a t + b t^2 / 2 is linear in (a, b, x0)."""
    return pgpgm.ODESystem.from_equations({"x": "a + b*t"}, ["a", "b"], name="linear")


@pytest.fixture(scope="module")
def sum_decay():
    """dx/dt = -(k1 + k2) x: the data determine k1 + k2 only."""
    return pgpgm.ODESystem.from_equations({"x": "-(k1 + k2)*x"}, ["k1", "k2"], name="sum_decay")


@pytest.fixture(scope="module")
def chain():
    """x1 -> x2 -> (): x1 = c e^{-a t}, x2 = x20 e^{-b t} + a c (e^{-a t} - e^{-b t}) / (b - a)."""
    return pgpgm.ODESystem.from_equations({"x1": "-a*x1", "x2": "a*x1 - b*x2"}, ["a", "b"], name="chain")


def _chain_solution(a, b, x10, x20, t):
    e_a, e_b = np.exp(-a * t), np.exp(-b * t)
    with np.errstate(divide="ignore", invalid="ignore"):  # a == b: NaN, which an optimiser treats as worse
        return np.column_stack([x10 * e_a, x20 * e_b + a * x10 * (e_a - e_b) / (b - a)])


# ----------------------------------------------------------------------------- (a) exact LS
def test_linear_in_parameters_matches_closed_form_least_squares(linear):
    t = np.linspace(0.0, 2.0, 15)
    sd = 0.05
    X = np.column_stack([t, t**2 / 2, np.ones_like(t)])  # columns: a, b, x0
    rng = np.random.default_rng(1)
    y = X @ np.array([1.3, -0.7, 0.5]) + sd * rng.standard_normal(t.size)
    prob = LeastSquaresProblem(pgpgm.Integrator(linear, t, _tight()), y[:, None], [0], [sd], [0.0], free_x0=[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdentifiabilityWarning)
        res = refine(prob, [0.0, 0.0])
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    cov = sd**2 * np.linalg.inv(X.T @ X)
    assert res.success and res.rank == 3 and res.undetermined == ()
    np.testing.assert_allclose(res.q, beta, rtol=1e-8)
    np.testing.assert_allclose(res.theta, beta[:2], rtol=1e-8)
    np.testing.assert_allclose(res.q_covariance, cov, rtol=1e-8)
    np.testing.assert_allclose(res.covariance, cov[:2, :2], rtol=1e-8)
    np.testing.assert_allclose(res.stderr, np.sqrt(np.diag(cov)[:2]), rtol=1e-8)
    np.testing.assert_allclose(res.cost, 0.5 * np.sum((X @ beta - y) ** 2) / sd**2, rtol=1e-8)
    # the Gaussian NLL with the known sd, constants included
    nll = 0.5 * np.sum((X @ beta - y) ** 2) / sd**2 + t.size * np.log(sd) + 0.5 * t.size * np.log(2 * np.pi)
    np.testing.assert_allclose(res.nll, nll, rtol=1e-10)
    assert res.q_names == ("a", "b", "x0[x]") and res.x0[0] == pytest.approx(beta[2], rel=1e-8)
    # the singular values are those of X with unit-norm columns
    Xs = X / np.linalg.norm(X, axis=0)
    np.testing.assert_allclose(res.singular_values, np.linalg.svd(Xs, compute_uv=False), rtol=1e-8)


# ----------------------------------------------------------------------------- (b) rank
def test_parameters_entering_as_a_sum_get_infinite_standard_errors(sum_decay):
    t = np.linspace(0.0, 3.0, 20)
    sd, u, x0 = 0.02, 0.7, 2.0
    rng = np.random.default_rng(2)
    y = x0 * np.exp(-u * t) + sd * rng.standard_normal(t.size)
    prob = LeastSquaresProblem(pgpgm.Integrator(sum_decay, t, _tight()), y, [0], sd, [1.5], free_x0=[0])
    with pytest.warns(IdentifiabilityWarning, match=r"do not determine k1, k2\b") as rec:
        res = refine(prob, [0.3, 0.2])
    assert "x0[x]" not in str(rec[0].message)
    assert res.success and res.rank == 2 and res.undetermined == ("k1", "k2")
    assert np.all(np.isinf(res.stderr)) and np.all(np.isinf(np.diag(res.covariance)))
    assert res.singular_values[2] < 1e-12 * res.singular_values[0]
    # the undetermined direction is k1 - k2
    np.testing.assert_allclose(np.abs(res.null_space[:, 0]), [2**-0.5, 2**-0.5, 0.0], atol=1e-9)
    # what the data determine is exact: x0 and k1 + k2 against the analytic model x0 e^{-u t}
    uh, x0h = res.theta.sum(), res.q[2]
    ref = optimize.least_squares(lambda p: p[1] * np.exp(-p[0] * t) - y, [0.5, 1.0], xtol=1e-15, ftol=1e-15).x
    np.testing.assert_allclose([uh, x0h], ref, rtol=1e-7)
    Jr = np.column_stack([-t * x0h * np.exp(-uh * t), np.exp(-uh * t)]) / sd
    np.testing.assert_allclose(res.q_covariance[2, 2], np.linalg.inv(Jr.T @ Jr)[1, 1], rtol=1e-6)
    assert np.isnan(res.q_covariance[0, 2]) and np.isnan(res.q_covariance[0, 1])
    # a multi-start caller can silence the warning; the result says the same
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdentifiabilityWarning)
        quiet = refine(prob, [0.3, 0.2], warn=False)
    assert quiet.undetermined == ("k1", "k2") and np.all(np.isinf(quiet.stderr))


def test_more_unknowns_than_data_is_not_reported_as_precise(lv):
    """3 points of x2, 4 parameters and x2(0) free: rank <= 3, so no finite standard error for
    the directions the data miss (the old pinvh(J^T J) gave ~1e-9)."""
    c = lv.case("x2-observed")
    t = c.times[:3]
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, t, observed=["x2"], noise_sd=0.1, seed=4)
    prob = LeastSquaresProblem(pgpgm.Integrator(lv.system, t), ds.y.values, [1], [0.1], c.x0, free_x0=[1])
    with pytest.warns(IdentifiabilityWarning, match="do not determine") as rec:
        res = refine(prob, c.theta, np.array([[0, 10]] * 4))
    assert res.rank <= 3 and res.null_space.shape == (5, 5 - res.rank)
    msg = str(rec[0].message)
    for name in res.undetermined:
        assert name in msg
    # every unknown with a component in the null space is undetermined, and at least the
    # parameters are (a 2-dimensional null space in 5 unknowns)
    comp = np.linalg.norm(res.null_space * np.linalg.norm(prob.jacobian(res.q), axis=0)[:, None], axis=1)
    assert set(res.undetermined) == {n for n, v in zip(res.q_names, comp) if v > 1e-6}
    assert len(res.undetermined) >= 4
    finite = np.isfinite(res.stderr)
    assert not np.any(res.stderr[finite] < 1e-6)
    assert np.sum(~finite) >= 3


# ----------------------------------------------------------------------------- (c) Jacobian
def test_refinement_jacobian_matches_finite_differences(fhn):
    c = fhn.case("R-observed")
    ds = pgpgm.simulate(fhn.system, c.theta, c.x0, c.times, observed=["R"], snr=100, seed=0)
    prob = LeastSquaresProblem(pgpgm.Integrator(fhn.system, c.times), ds.y.values, [1], ds.noise_sd.values, c.x0,
                               free_x0=[1])
    q = np.r_[c.theta, c.x0[1]]  # parameters and the observed state's initial value
    J = prob.jacobian(q)
    assert J.shape == (100, 4)
    for k in range(4):
        e = np.zeros(4)
        e[k] = 1e-6
        fd = (prob.residuals(q + e) - prob.residuals(q - e)) / 2e-6
        np.testing.assert_allclose(J[:, k], fd, rtol=1e-4, atol=1e-4 * np.abs(fd).max())


def test_jacobian_with_two_free_initial_values_matches_the_analytic_derivative(chain):
    t = np.linspace(0.0, 6.0, 12)
    sd = np.array([0.01, 0.2])
    theta, x0 = np.array([0.8, 0.3]), np.array([2.0, 0.5])
    y = _chain_solution(*theta, *x0, t) + 0.1
    prob = LeastSquaresProblem(pgpgm.Integrator(chain, t, _tight()), y, [0, 1], sd, x0, free_x0=[1, 0])
    q = np.r_[theta, x0[1], x0[0]]
    J = prob.jacobian(q)

    def scaled(p):  # the residuals of an independent, analytic model
        return ((_chain_solution(p[0], p[1], p[3], p[2], t) - y) / sd).ravel()

    for k in range(4):
        h = 1e-5 * max(1.0, abs(q[k]))
        e = np.zeros(4)
        e[k] = h
        fd = (scaled(q + e) - scaled(q - e)) / (2 * h)  # central difference, error O(h^2) ~ 1e-10
        np.testing.assert_allclose(J[:, k], fd, rtol=1e-6, atol=1e-7 * np.abs(fd).max())
    np.testing.assert_allclose(prob.residuals(q), scaled(q), rtol=1e-9, atol=1e-9)


def test_refinement_from_truth_is_a_stationary_optimum(lv):
    c = lv.case("x2-observed")
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=["x2"], noise_sd=0.1, seed=4)
    prob = LeastSquaresProblem(pgpgm.Integrator(lv.system, c.times), ds.y.values, [1], [0.1], c.x0)
    res = refine(prob, c.theta, np.array([[0, 10]] * 4))
    assert res.success and res.cost <= prob.cost(c.theta)
    # stationary: the gradient J^T r vanishes and no nearby point is better
    g = prob.jacobian(res.theta).T @ prob.residuals(res.theta)
    assert np.linalg.norm(g) < 1e-4 * max(1.0, res.cost)
    rng = np.random.default_rng(0)
    for _ in range(10):
        assert prob.cost(res.theta * (1 + 1e-3 * rng.standard_normal(4))) >= res.cost - 1e-9
    # known noise: the covariance is (J^T J)^-1 at the optimum (no s^2 factor)
    J = prob.jacobian(res.theta)
    np.testing.assert_allclose(res.covariance, np.linalg.inv(J.T @ J), rtol=1e-6)
    assert np.all(np.isfinite(res.stderr)) and np.all(res.stderr > 0) and res.covariance.shape == (4, 4)


def test_an_optimum_on_a_bound_is_reached_where_trf_alone_crawls(lv):
    """Lotka-Volterra, x1 observed, from a point in the basin whose optimum lies on theta3's
    upper bound (where step 2's chains in a wrong basin refine to): scipy's trf creeps toward
    the bound and spends its 200 evaluations short of it; refine finishes by dogbox. The
    reference: the least-squares optimum with theta3 held at 10 (Levenberg-Marquardt, tight
    tolerances), whose gradient in theta3 points out of the box (a bound optimum)."""
    data = lv.simulate("x1-observed", seed=0)
    y = data["y"].values
    prob = LeastSquaresProblem(pgpgm.Integrator(lv.system, data["time"].values), y, [0], [0.1], [y[0, 0], 3.0],
                               free_x0=[0])
    bounds = np.array([[0.0, 10.0]] * 4)
    q0 = np.array([7.2, 2.3, 6.7, 1.8, 4.35])
    lo, hi = np.r_[bounds[:, 0], -np.inf], np.r_[bounds[:, 1], np.inf]
    trf = optimize.least_squares(prob.residuals, q0, jac=prob.jacobian, bounds=(lo, hi), method="trf", x_scale="jac",
                                 max_nfev=200)
    assert trf.status == 0 and trf.x[2] < 9.5  # the crawl this test is about

    def on_bound(p):  # (theta1, theta2, theta4, x1_0) -> q with theta3 = 10
        return np.r_[p[:2], 10.0, p[2:]]

    ref = optimize.least_squares(lambda p: prob.residuals(on_bound(p)), np.delete(q0, 2),
                                 jac=lambda p: np.delete(prob.jacobian(on_bound(p)), 2, axis=1), method="lm",
                                 xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=5000)
    q_ref = on_bound(ref.x)
    assert (prob.jacobian(q_ref).T @ prob.residuals(q_ref))[2] < 0  # the cost falls toward theta3 > 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdentifiabilityWarning)
        res = refine(prob, q0, bounds)
    assert res.q[2] == pytest.approx(10.0, abs=1e-9)
    assert res.cost == pytest.approx(ref.cost, rel=1e-8) and trf.cost > ref.cost + 0.1
    np.testing.assert_allclose(res.q, q_ref, rtol=1e-3)


# ----------------------------------------------------------------------------- (d) noise
@pytest.fixture(scope="module")
def chain_data():
    t = np.linspace(0.0, 8.0, 25)
    true_sd = np.array([0.01, 0.2])
    rng = np.random.default_rng(3)
    y = _chain_solution(0.8, 0.3, 2.0, 0.5, t) + true_sd * rng.standard_normal((t.size, 2))
    return t, y


def _nll(p, t, y, sd2=None):
    """Full Gaussian NLL of the chain data in (a, b, x1(0), log sd1[, log sd2]), analytic model."""
    x = _chain_solution(p[0], p[1], p[2], 0.5, t)
    log_sd = np.array([p[3], p[4] if sd2 is None else np.log(sd2)])
    r = (x - y) / np.exp(log_sd)
    if not np.all(np.isfinite(r)):
        return np.inf
    return 0.5 * np.sum(r**2) + t.size * log_sd.sum() + t.size * np.log(2 * np.pi)


def _maximum_likelihood(t, y, starts, sd2=None):
    """Independent ML: Nelder-Mead from several starts, then a Powell polish of the best."""
    f = lambda p: _nll(p, t, y, sd2)  # noqa: E731
    best = min((optimize.minimize(f, s, method="Nelder-Mead",
                                  options={"xatol": 1e-12, "fatol": 1e-13, "maxiter": 40000, "maxfev": 40000})
                for s in starts), key=lambda r: r.fun)
    return optimize.minimize(f, best.x, method="Powell", options={"xtol": 1e-12, "ftol": 1e-15, "maxiter": 40000})


@pytest.mark.parametrize("start_sd, fixed_miss", [([0.00065, 0.2], 3e-5), ([0.2, 0.00065], 0.05)])
def test_noise_estimated_jointly_is_the_maximum_likelihood(chain, chain_data, start_sd, fixed_miss):
    """True sds (0.01, 0.2); the refinement starts from the GP step's kind of mistake."""
    t, y = chain_data
    prob = LeastSquaresProblem(pgpgm.Integrator(chain, t, _tight()), y, [0, 1], start_sd, [1.5, 0.5], free_x0=[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdentifiabilityWarning)
        res = refine(prob, [0.5, 0.5], estimate_noise=True)
    assert res.success and "converged" in res.message and res.noise_estimated.all()
    starts = [[0.5, 0.5, 1.5, np.log(0.05), np.log(0.05)], [1.2, 0.2, 2.5, np.log(0.001), np.log(0.5)],
              [0.6, 0.4, 2.0, np.log(0.01), np.log(0.2)]]
    ml = _maximum_likelihood(t, y, starts)
    # measured: agreement to 1e-8 relative; the brief asked for ~1e-4
    np.testing.assert_allclose(res.q, ml.x[:3], rtol=1e-6)
    np.testing.assert_allclose(res.noise_sd, np.exp(ml.x[3:]), rtol=1e-6)
    np.testing.assert_allclose(res.nll, ml.fun, rtol=0, atol=1e-6)
    # at the optimum the sds are sqrt(RSS_k / N)
    x = _chain_solution(res.theta[0], res.theta[1], res.x0[0], 0.5, t)
    np.testing.assert_allclose(res.noise_sd, np.sqrt(np.mean((x - y) ** 2, axis=0)), rtol=1e-7)
    # the estimated sds are near the truth (0.01, 0.2) within their sampling error (~15 %)
    np.testing.assert_allclose(res.noise_sd, [0.01, 0.2], rtol=0.3)
    # the covariance uses the ML sds: (J^T J)^-1 of the residuals scaled by them
    J = prob.with_noise_sd(res.noise_sd).jacobian(res.q)
    np.testing.assert_allclose(res.q_covariance, np.linalg.inv(J.T @ J), rtol=1e-6)

    # keeping the start sds fixed misses the ML point (measured: by 7.5e-5 relative when the
    # precise state is over-weighted, by 14 % and 52 log-likelihood units when the noisy one is)
    fixed = refine(prob, [0.5, 0.5])
    assert np.max(np.abs(fixed.q / res.q - 1)) > fixed_miss
    assert prob.nll(fixed.q, np.sqrt(prob.rss(fixed.q) / t.size)) > res.nll + 1e-5


def test_known_sd_stays_fixed_while_the_other_is_estimated(chain, chain_data):
    t, y = chain_data
    prob = LeastSquaresProblem(pgpgm.Integrator(chain, t, _tight()), y, [0, 1], [0.00065, 0.3], [1.5, 0.5],
                               free_x0=[0])
    res = refine(prob, [0.5, 0.5], estimate_noise=[True, False])
    assert res.success and res.noise_sd[1] == 0.3 and list(res.noise_estimated) == [True, False]
    ml = _maximum_likelihood(t, y, [[0.5, 0.5, 1.5, np.log(0.05), 0.0], [0.9, 0.3, 2.0, np.log(0.01), 0.0]],
                             sd2=0.3)
    np.testing.assert_allclose(res.q, ml.x[:3], rtol=1e-6)
    np.testing.assert_allclose(res.noise_sd[0], np.exp(ml.x[3]), rtol=1e-6)


def test_noise_of_an_exactly_fitted_state_is_flagged(linear):
    """3 points and 3 unknowns: the fit is exact, the likelihood unbounded as the sd -> 0."""
    t = np.array([0.0, 1.0, 2.0])
    y = np.array([0.3, 1.1, 0.4])
    prob = LeastSquaresProblem(pgpgm.Integrator(linear, t, _tight()), y, [0], 0.1, [0.0], free_x0=[0])
    with pytest.warns(IdentifiabilityWarning, match="fits the data of x exactly"):
        res = refine(prob, [0.0, 0.0], estimate_noise=True)
    assert not res.success and "unbounded" in res.message
    assert res.noise_sd[0] == pytest.approx(1e-7)  # the floor, 1e-6 x the start
    X = np.column_stack([t, t**2 / 2, np.ones_like(t)])
    np.testing.assert_allclose(res.q, np.linalg.solve(X, y), rtol=1e-6)


# ----------------------------------------------------------------------------- (e) failures
def test_a_start_where_the_solve_fails_is_a_failure(sum_decay):
    t = np.linspace(0.0, 3.0, 20)
    y = 2.0 * np.exp(-0.7 * t)
    prob = LeastSquaresProblem(pgpgm.Integrator(sum_decay, t), y, [0], 0.02, [2.0])
    with pytest.raises(pgpgm.ODESolveError):  # the start really cannot be solved (x ~ e^{800 t})
        prob.integrator.solve([-400.0, -400.0], [2.0])
    res = refine(prob, [-400.0, -400.0])
    assert not res.success and "failed at the start" in res.message
    assert np.all(np.isnan(res.stderr)) and np.all(np.isnan(res.covariance))
    assert res.nll == np.inf and res.cost == np.inf and res.rank == 0
    np.testing.assert_array_equal(res.theta, [-400.0, -400.0])
    assert res.n_solves == 1


@pytest.mark.parametrize("change, fragment", [
    (dict(y=np.zeros((5, 1))), "y must have shape"),
    (dict(y=np.full((20, 1), np.nan)), "NaN"),
    (dict(observed_idx=[3]), "observed_idx"),
    (dict(observed_idx=[0.5]), "observed_idx"),
    (dict(noise_sd=[-1.0]), "noise_sd must be positive"),
    (dict(noise_sd=[1.0, 2.0]), "noise_sd must be a scalar"),
    (dict(x0=[1.0, 2.0]), "x0 must hold 1"),
    (dict(free_x0=[1]), "free_x0"),
])
def test_bad_problem_input_is_a_data_error(sum_decay, change, fragment):
    t = np.linspace(0.0, 3.0, 20)
    args = dict(y=np.ones((20, 1)), observed_idx=[0], noise_sd=[0.1], x0=[1.0], free_x0=())
    args.update(change)
    with pytest.raises(DataError, match=fragment):
        LeastSquaresProblem(pgpgm.Integrator(sum_decay, t), args["y"], args["observed_idx"], args["noise_sd"],
                            args["x0"], free_x0=args["free_x0"])


def test_bounds_of_every_unknown_hold_a_free_initial_value():
    """(Q, 2) bounds hold the free initial value too: x' = -k x, x(0) = 2 in the data, held in (0, 1.5) and
    (-inf, inf) for k: the optimum on x(0)'s bound equals scipy's bounded fit of the closed form."""
    system = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay1")
    t = np.linspace(0.0, 3.0, 30)
    y = 2.0 * np.exp(-0.7 * t) + 0.01 * np.random.default_rng(3).standard_normal(t.size)
    prob = LeastSquaresProblem(pgpgm.Integrator(system, t), y, [0], 0.01, [1.0], free_x0=(0,))
    res = refine(prob, [0.5, 1.0], [[-np.inf, np.inf], [0.0, 1.5]])
    ref = optimize.least_squares(lambda q: q[1] * np.exp(-q[0] * t) - y, [0.5, 1.0],
                                 bounds=([-np.inf, 0.0], [np.inf, 1.5]), xtol=1e-14, ftol=1e-14).x
    assert res.x0[0] == pytest.approx(1.5, abs=1e-9) and ref[1] == pytest.approx(1.5)
    assert res.theta[0] == pytest.approx(ref[0], rel=1e-5)
    free = refine(prob, [0.5, 1.0], [[-np.inf, np.inf]])  # (P, 2): the initial value free
    assert free.x0[0] == pytest.approx(2.0, abs=0.02) and free.nll < res.nll


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(q0=[1.0]), "q0 must hold"),
    (dict(q0=[1.0, np.nan]), "q0 must hold"),
    (dict(q0=[1.0, 1.0], bounds=[[0, 1]]), "bounds must be"),
    (dict(q0=[1.0, 1.0], bounds=[[0, 1], [2, 1]]), "bounds must be"),
    (dict(q0=[1.0, 1.0], bounds=[[0, 1], [0, np.nan]]), "bounds must be"),
    (dict(q0=[1.0, 1.0], estimate_noise=[True, False]), "estimate_noise"),
])
def test_bad_refine_input_is_a_data_error(sum_decay, kwargs, fragment):
    t = np.linspace(0.0, 3.0, 20)
    prob = LeastSquaresProblem(pgpgm.Integrator(sum_decay, t), np.ones(20), [0], 0.1, [1.0])
    q0 = kwargs.pop("q0")
    with pytest.raises(DataError, match=fragment):
        refine(prob, q0, **kwargs)


# ----------------------------------------------------------------------------- slow: PT
def _pt_least_squares(integ, obs, idx, x0, sd, bounds, q0):
    """Independent weighted least squares: scipy's least_squares (finite-difference Jacobian, not
    pgpgm's sensitivities) on the residuals scaled by ``sd`` (scalar or one per observed state),
    over theta (6) and the observed states' initial values (4), from ``q0``. Returns (cost, q)."""
    n_theta = bounds.shape[0]

    def resid(q):
        x0_ = np.array(x0, float)
        x0_[idx] = q[n_theta:]
        try:
            x = integ.solve(q[:n_theta], x0_)[:, idx]
        except pgpgm.ODESolveError:
            return np.full(obs.values.size, 1e3)
        return ((x - obs.values) / sd).ravel()

    lo = np.r_[bounds[:, 0], np.full(len(idx), -np.inf)]
    hi = np.r_[bounds[:, 1], np.full(len(idx), np.inf)]
    r = optimize.least_squares(resid, np.clip(q0, lo + 1e-9, hi - 1e-9), bounds=(lo, hi), method="trf",
                               x_scale="jac", xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=4000)
    return 0.5 * float(np.sum(resid(r.x) ** 2)), r.x


def _pt_true_sd_optimum(integ, obs, idx, x0, sd, bounds, starts):
    """Independent reference: the best of a multi-start of :func:`_pt_least_squares` with the true
    sd. Returns (best cost, its q, costs of every start)."""
    runs = [_pt_least_squares(integ, obs, idx, x0, sd, bounds, q0) for q0 in starts]
    costs = [c for c, _ in runs]
    k = int(np.argmin(costs))
    return costs[k], runs[k][1], costs


def _pt_rss(integ, obs, idx, x0, n_theta, q):
    """Residual sum of squares of each observed state (M,) at q = (theta, observed x0)."""
    x0_ = np.array(x0, float)
    x0_[idx] = q[n_theta:]
    return np.sum((integ.solve(q[:n_theta], x0_)[:, idx] - obs.values) ** 2, axis=0)


def _profile_nll(rss, n):
    """Gaussian NLL with every state's sd at its maximum-likelihood value sqrt(RSS_k / n)."""
    return float(0.5 * n * np.sum(np.log(rss / n)) + 0.5 * n * rss.size * (1 + np.log(2 * np.pi)))


def _pt_noise_unknown_optimum(integ, obs, idx, x0, bounds, q):
    """Independent reference for the noise-unknown likelihood: from q (the true-sd optimum),
    alternate :func:`_pt_least_squares` weighted by the sds and sd_k = sqrt(RSS_k / N) until
    the sds change by < 1e-9 (every step lowers the likelihood's NLL). Returns (NLL, q)."""
    n_theta, n = bounds.shape[0], obs.values.shape[0]
    sd = np.sqrt(_pt_rss(integ, obs, idx, x0, n_theta, q) / n)
    for _ in range(100):
        _, q = _pt_least_squares(integ, obs, idx, x0, sd, bounds, q)
        new = np.sqrt(_pt_rss(integ, obs, idx, x0, n_theta, q) / n)
        done = np.max(np.abs(new / sd - 1)) < 1e-9
        sd = new
        if done:
            break
    return _profile_nll(_pt_rss(integ, obs, idx, x0, n_theta, q), n), q


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_protein_transduction_noise_unknown_refined_point_is_the_true_sd_optimum(pt_model, seed):
    """Issue 10: with the noise sds unknown (estimated with theta, the GP's sds only the start), the
    default fit reaches the global optimum of its likelihood, in the basin of the optimum with the
    true noise sd (0.01 for every state). References, independent of pgpgm's refinement (scipy,
    finite differences): a multi-start least-squares search with the true sd (the truth and 7
    random points of the prior box, theta (P,) and observed x0; every start finds the same
    optimum), and from its best point the maximum of the likelihood with the sds free.
    - The fit's NLL (sds at their ML values, recomputed here at rtol 1e-11) is within 0.01 nats of
      the reference's. Before the GP fit's extra starts (issue 10) seed 1 missed it by 60 nats
      (nll -144.05 against -203.98: the GP of Rpp had stopped in the no-signal optimum, noise sd
      0.2 for a true 0.01, and the refinement then ignored Rpp).
    - The cost with the true sd at the refined point exceeds the multi-start best by 0.1 / 0.26 /
      1.0 / 0.4 / 3.3 % on seeds 0-4 (measured 2026-11-23): the ML point weights each state by its
      own estimated sd (seed 4: 0.012, 0.0099, 0.0051, 0.0077), so it is not the equal-weight
      optimum; asserted <= 5 % (seed 1 before the fix: 10547 against 20.2, 521x)."""
    c = pt_model.case("R-latent")
    ds = pt_model.simulate("R-latent", seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(pt_model.system, ds, c.observed, kernel=c.kernel, gamma=c.gamma, priors=pt_model.priors("R-latent"),
                      tune=1500, draws=c.iterations - 1500, seed=seed, posterior=None, progressbar=False)
    assert r.estimates.attrs["noise_estimated"] == 1
    from pgpgm.data import as_observations

    obs = as_observations(ds, list(c.observed), pt_model.system)
    idx = list(pt_model.system.index_of_states(list(c.observed)))
    integ = pgpgm.Integrator(pt_model.system, c.times, type(pgpgm.default_solver())(rtol=1e-11, atol=1e-11))
    bounds = np.asarray(c.prior_bounds, float)
    rng = np.random.default_rng(seed)
    x0_obs = np.asarray(c.x0, float)[idx]
    starts = [np.r_[c.theta, x0_obs]] + [np.r_[rng.uniform(bounds[:, 0], bounds[:, 1]), obs.values[0]] for _ in range(7)]
    best, q_best, costs = _pt_true_sd_optimum(integ, obs, idx, c.x0, 0.01, bounds, starts)
    x0_ref = r.estimates["x0"].values
    x = integ.solve(r.theta, x0_ref)[:, idx]
    cost_ref = 0.5 * float(np.sum(((x - obs.values) / 0.01) ** 2))
    print(f"seed {seed}: cost at refined {cost_ref:.6g}, best of multi-start {best:.6g}, "
          f"excess {cost_ref / best - 1:.3g}, starts {np.round(costs, 3)}")
    nll_ref, _ = _pt_noise_unknown_optimum(integ, obs, idx, c.x0, bounds, q_best)
    nll_fit = _profile_nll(_pt_rss(integ, obs, idx, c.x0, bounds.shape[0], np.r_[r.theta, x0_ref[idx]]),
                           obs.values.shape[0])
    print(f"seed {seed}: NLL with ML sds at refined {nll_fit:.6g}, independent maximum {nll_ref:.6g}")
    assert nll_fit <= nll_ref + 0.01, (nll_fit, nll_ref)
    assert cost_ref <= best * 1.05, (cost_ref, best)
    # the two points are in the same basin: identifiable parameters agree to a few standard errors
    np.testing.assert_allclose(r.theta[:4], q_best[:4], rtol=0.1)


def test_the_fit_names_an_undetermined_parameter_once_and_in_the_singular():
    """A fit of x' = -k x observed, with a latent y' = -m y that never reaches x: the refined optimum
    leaves m free (an infinite standard error), and the warning names m alone, in the singular; k and x(0)
    are those of scipy's fit of x0 exp(-k t)."""
    system = pgpgm.ODESystem.from_equations({"x": "-k*x", "y": "-m*y"}, ["k", "m"], name="apart")
    t = np.linspace(0.0, 4.0, 25)
    y = 2.0 * np.exp(-0.6 * t) + 0.02 * np.random.default_rng(5).standard_normal(t.size)
    with pytest.warns(IdentifiabilityWarning) as rec:
        fit = pgpgm.fit(system, {"time": t, "x": y}, observed=["x"], x0={"y": 1.0}, priors=(0.0, 5.0), noise_sd=0.02,
                        posterior=None, seed=0, progressbar=False)
    messages = [str(r.message) for r in rec if "do not determine" in str(r.message)]
    assert messages == ["the data do not determine m: its standard error is infinite; fix or give a tighter prior "
                        "to it, or measure more states"]
    ref = optimize.least_squares(lambda p: p[1] * np.exp(-p[0] * t) - y, [0.5, 1.0], xtol=1e-14, ftol=1e-14).x
    np.testing.assert_allclose([fit.theta[0], fit.estimates["x0"].values[0]], ref, rtol=1e-5)  # x(0) is refined too


def _fhn_r_nll(q: np.ndarray, t: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """FitzHugh-Nagumo with R observed, q = (a, b, c, V(0), R(0)): the profile negative log likelihood
    (Gaussian, the sd at its maximum) and the residuals, by scipy's own solver."""
    a, b, c, v0, r0 = q
    rhs = lambda _, x: [c * (x[0] - x[0] ** 3 / 3 + x[1]), -(x[0] - a + b * x[1]) / c]  # noqa: E731
    sol = integrate.solve_ivp(rhs, (t[0], t[-1]), [v0, r0], t_eval=t, method="LSODA", rtol=1e-11, atol=1e-11)
    r = sol.y[1] - y
    n = r.size
    return 0.5 * n * (np.log(2 * np.pi * np.mean(r**2)) + 1), r


@pytest.mark.slow  # an accuracy run against an independent bounded multi-start
def test_an_unknown_initial_value_is_held_inside_its_prior_and_what_the_data_said_outside_is_named():
    # FitzHugh-Nagumo, R observed, V(0) unknown with the prior (-0.3, 0.3) while the data's V(0) is -1: step 3
    # refines V(0) unbounded to about -0.91, many standard errors outside the box, then held to it: the refined
    # point is the optimum inside the prior (an independent bounded multi-start's, by scipy's own solver), and
    # a BoundWarning names V_0, the box, and the value and gain outside it (before: -0.91 was returned)
    fhn = pgpgm.load_model("fitzhugh-nagumo")
    data = fhn.simulate("R-observed", seed=0)
    priors = fhn.priors("R-observed")
    with pytest.warns(pgpgm.BoundWarning, match=r"V_0 is held at -0\.3 by its prior \(-0\.3, 0\.3\): the data fit "
                                                r"better outside it, at -0\.9\d* .*lower by \d+") as record:
        r = pgpgm.fit(fhn.system, data, ["R"], x0={"V": (-0.3, 0.3)}, priors=priors, posterior=None,
                      progressbar=False)
    assert r.x0["V"] == pytest.approx(-0.3, abs=1e-9)
    per_start = r.nll_per_start
    assert per_start["the best held inside the initial values' prior boxes"] == pytest.approx(r.nll, abs=1e-9)
    assert per_start.min() < r.nll - 19  # the unbounded optimum, kept in the table
    # the reference, by scipy's solver and least squares: the unbounded optimum from the truth, moved into
    # the box and refined there (R(0), the observed state's initial value, free as in the fit)
    t, y = data.time.values, data.y.values[:, 0]
    box = np.array([priors[p] for p in fhn.system.parameters] + [(-0.3, 0.3), (-np.inf, np.inf)], float)
    nll = lambda q: _fhn_r_nll(q, t, y)[0]  # noqa: E731
    solve = lambda q0, lo, hi: optimize.least_squares(lambda q: _fhn_r_nll(q, t, y)[1], q0,  # noqa: E731
                                                      bounds=(lo, hi), xtol=1e-12, ftol=1e-12, x_scale="jac").x
    free = solve([0.2, 0.2, 3.0, -1.0, 1.0], -np.inf, np.inf)
    assert free[3] == pytest.approx(-0.91, abs=0.02) and nll(free) < r.nll - 19
    held = solve(np.clip(free, box[:, 0], box[:, 1]), box[:, 0], box[:, 1])
    assert r.nll == pytest.approx(nll(held), rel=1e-6, abs=1e-6)
    assert r.theta == pytest.approx(held[:3], rel=1e-3, abs=1e-6)
    # and no better than the fit from random starts in the box
    starts = qmc.LatinHypercube(d=4, seed=1).random(4)
    starts = np.column_stack([qmc.scale(starts, box[:4, 0] + 1e-6, box[:4, 1] - 1e-6), np.full(4, y[0])])
    assert min(nll(solve(q0, box[:, 0], box[:, 1])) for q0 in starts) >= r.nll - 1e-6
    assert len([w for w in record if "held at" in str(w.message)]) == 1
    # inside its box: no such warning
    with warnings.catch_warnings(record=True) as inside:
        warnings.simplefilter("always")
        pgpgm.fit(fhn.system, data, ["R"], x0={"V": (-2.0, 2.0)}, priors=priors, posterior=None,
                  progressbar=False)
    assert not [w for w in inside if "held at" in str(w.message)]


def test_an_initial_value_that_no_refinement_holds_inside_its_box_is_named_as_outside():
    from pgpgm.refinement.bounds import outside_prior_boxes

    held = outside_prior_boxes(["E_0"], [(0.0, 0.02)], [0.02], [0.046], [0.049], 0.145)
    assert held == ("E_0 is held at 0.02 by its prior (0, 0.02): the data fit better outside it, at 0.046 (standard "
                    "error 0.049; the negative log likelihood lower by 0.145); widen the prior if such values are "
                    "plausible",)
    (failed,) = outside_prior_boxes(["E_0"], [(0.0, 0.02)], [0.046], [0.046], [0.049], 0.0, failed="the ODE solve "
                                    "failed at the start")
    assert failed.startswith("E_0 is refined to 0.046 (standard error 0.049), outside its prior (0, 0.02): no "
                             "refinement held inside it succeeded (the ODE solve failed at the start)")
    assert outside_prior_boxes(["E_0"], [(0.0, 0.02)], [0.01], [0.01], [0.001], 0.0) == ()

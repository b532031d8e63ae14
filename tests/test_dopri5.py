"""DOPRI5, the explicit Dormand-Prince solver: analytic solutions, a tight independent reference,
sensitivities against finite differences, breakpoints against a closed form, the compiled Op against
the Python solve and its gradient against finite differences, failures named."""

from types import SimpleNamespace

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pgpgm
from pgpgm import CVODE, DOPRI5, Integrator, ODEOp, ODESolveError, ODESystem
from pgpgm.solve.numba_op import cache_key
from pgpgm.steps.posterior import study_solver
from tests.conftest import scipy_reference
from tests.test_breakpoints import THETA, infusion_exact

TIGHT = DOPRI5(rtol=1e-10, atol=1e-12)


def test_linear_decay_and_oscillator_analytic_with_sensitivities():
    s = ODESystem.from_equations({"x": "-k*x"}, ["k"])
    t = np.linspace(0, 5, 11)
    x, dth, dx0 = Integrator(s, t, TIGHT).solve_sensitivities([0.7], [2.0])
    np.testing.assert_allclose(x[:, 0], 2.0 * np.exp(-0.7 * t), rtol=1e-8)
    np.testing.assert_allclose(dth[:, 0, 0], -2.0 * t * np.exp(-0.7 * t), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(dx0[:, 0, 0], np.exp(-0.7 * t), rtol=1e-8)
    osc = ODESystem.from_equations({"q": "v", "v": "-w**2*q"}, ["w"])
    t, w = np.linspace(0, 10, 41), 1.3
    x, dth, dx0 = Integrator(osc, t, TIGHT).solve_sensitivities([w], [1.0, 0.0])
    np.testing.assert_allclose(x[:, 0], np.cos(w * t), atol=1e-8)
    np.testing.assert_allclose(dth[:, 0, 0], -t * np.sin(w * t), atol=1e-7)  # d cos(wt)/dw
    np.testing.assert_allclose(dx0[:, 0, 1], np.sin(w * t) / w, atol=1e-8)  # d q / d v0


@pytest.mark.parametrize("name", ["lotka-volterra", "fitzhugh-nagumo", "protein-transduction"])
def test_published_models_match_a_tight_scipy_solve(all_models, name):
    spec = all_models[name]
    c = spec.case()
    ref = scipy_reference(spec.system, c.theta, c.x0, c.times)
    x = Integrator(spec.system, c.times, TIGHT).solve(c.theta, c.x0)
    np.testing.assert_allclose(x, ref, rtol=1e-7, atol=1e-9 * np.abs(ref).max())
    # at step 4's tolerance it is at least as close as CVODE is (the comparison behind using it there)
    loose = [np.abs(Integrator(spec.system, c.times, cls(rtol=1e-6)).solve(c.theta, c.x0) - ref).max()
             for cls in (DOPRI5, CVODE)]
    assert loose[0] <= 2 * loose[1], loose


def test_sensitivities_match_finite_differences(lv):
    c = lv.case()
    sol = Integrator(lv.system, c.times, TIGHT)
    _, dth, dx0 = sol.solve_sensitivities(c.theta, c.x0)
    for k in range(lv.system.n_parameters):
        h = 1e-5 * c.theta[k]
        e = np.zeros_like(c.theta)
        e[k] = h
        fd = (sol.solve(c.theta + e, c.x0) - sol.solve(c.theta - e, c.x0)) / (2 * h)
        np.testing.assert_allclose(dth[:, :, k], fd, rtol=1e-5, atol=1e-6)
    e = np.array([1e-5, 0.0])
    fd = (sol.solve(c.theta, c.x0 + e) - sol.solve(c.theta, c.x0 - e)) / 2e-5
    np.testing.assert_allclose(dx0[:, :, 0], fd, rtol=1e-5, atol=1e-6)


def test_sensitivities_left_out_of_the_error_test_step_as_the_states_alone_and_stay_accurate(all_models):
    """``control_sensitivities=False`` measures each step's error on the states only: the solve with
    sensitivities takes the plain solve's steps, so its states equal the plain solve's bit for bit, in the
    Python solve and in the compiled Op. Its sensitivities at rtol 1e-6 stay within 3x the error of those
    counted in the error test (the default), or 1e-4 of their own size, against a tight reference (central
    differences of a 1e-12 scipy solve)."""
    for name in ("lotka-volterra", "fitzhugh-nagumo", "protein-transduction"):
        spec = all_models[name]
        c = spec.case()
        states, counted = DOPRI5(rtol=1e-6, atol=1e-8, control_sensitivities=False), DOPRI5(rtol=1e-6, atol=1e-8)
        assert counted.control_sensitivities  # the default
        x, dth, _ = Integrator(spec.system, c.times, states).solve_sensitivities(c.theta, c.x0)
        np.testing.assert_array_equal(x, Integrator(spec.system, c.times, states).solve(c.theta, c.x0))
        op_x = pytensor.function([], ODEOp(Integrator(spec.system, c.times, states))(
            pt.constant(np.asarray(c.theta, float)), pt.constant(np.asarray(c.x0, float))), mode="NUMBA")()
        np.testing.assert_array_equal(op_x, x)
        _, dth_c, _ = Integrator(spec.system, c.times, counted).solve_sensitivities(c.theta, c.x0)
        assert not np.array_equal(dth, dth_c)  # the other steps: the option is used
        theta = np.asarray(c.theta, float)
        for k in range(theta.size):
            e = np.zeros_like(theta)
            e[k] = 1e-4 * max(abs(theta[k]), 1e-3)
            fd = (scipy_reference(spec.system, theta + e, c.x0, c.times)
                  - scipy_reference(spec.system, theta - e, c.x0, c.times)) / (2 * e[k])
            err, err_c = np.abs(dth[:, :, k] - fd).max(), np.abs(dth_c[:, :, k] - fd).max()
            assert err <= max(3 * err_c, 1e-4 * np.abs(fd).max()), (name, k, err, err_c)


def test_dense_output_interpolates_to_the_solvers_accuracy_and_leaves_the_steps_alone(all_models):
    """The default interpolates the output times between steps (Dormand and Prince's continuous extension):
    the steps do not depend on the output times, so the state at the end is bit-identical with 400 output times
    and with 2; on an oscillator with 400 output times at a tight tolerance the interpolated states and
    sensitivities equal the analytic ones to 1e-8 (a wrong weight would leave an error of the order of the steps);
    at step 4's tolerance the published models' states and sensitivities stay within 3x the error of the solve
    that ends a step at each output time (``dense_output=False``) or 1e-5 of their size, against central
    differences of a 1e-12 scipy solve."""
    osc = ODESystem.from_equations({"q": "v", "v": "-w**2*q"}, ["w"])
    w, t = 1.3, np.linspace(0, 10, 400)
    x, dth, dx0 = Integrator(osc, t, TIGHT).solve_sensitivities([w], [1.0, 0.0])
    np.testing.assert_allclose(x[:, 0], np.cos(w * t), atol=1e-8)
    np.testing.assert_allclose(dth[:, 0, 0], -t * np.sin(w * t), atol=1e-7)
    np.testing.assert_allclose(dx0[:, 0, 1], np.sin(w * t) / w, atol=1e-8)
    landing = Integrator(osc, t, DOPRI5(rtol=1e-10, atol=1e-12, dense_output=False)).solve([w], [1.0, 0.0])
    assert not np.array_equal(landing, x)  # the option is used
    ends = [Integrator(osc, tt, TIGHT).solve_sensitivities([w], [1.0, 0.0])[1][-1] for tt in (t, t[[0, -1]])]
    np.testing.assert_array_equal(*ends)
    for name in ("lotka-volterra", "fitzhugh-nagumo", "protein-transduction"):
        spec = all_models[name]
        c = spec.case()
        theta = np.asarray(c.theta, float)
        times = np.linspace(c.times[0], c.times[-1], 400)
        ref = scipy_reference(spec.system, theta, c.x0, times)
        dense, land = DOPRI5(rtol=1e-6, atol=1e-8), DOPRI5(rtol=1e-6, atol=1e-8, dense_output=False)
        (x, dth, _), (x_l, dth_l, _) = (Integrator(spec.system, times, s).solve_sensitivities(theta, c.x0)
                                        for s in (dense, land))
        err, err_l = np.abs(x - ref).max(), np.abs(x_l - ref).max()
        assert err <= max(3 * err_l, 1e-5 * np.abs(ref).max()), (name, err, err_l)
        for k in range(theta.size):
            e = np.zeros_like(theta)
            e[k] = 1e-4 * max(abs(theta[k]), 1e-3)
            fd = (scipy_reference(spec.system, theta + e, c.x0, times)
                  - scipy_reference(spec.system, theta - e, c.x0, times)) / (2 * e[k])
            err, err_l = np.abs(dth[:, :, k] - fd).max(), np.abs(dth_l[:, :, k] - fd).max()
            assert err <= max(3 * err_l, 1e-5 * np.abs(fd).max()), (name, k, err, err_l)


def test_breakpoints_against_the_closed_form_with_output_times_on_the_breaks():
    pk = pgpgm.load_model("pk-infusion").system
    t = np.array([0.0, 0.5, 1.0, 3.0, 12.0, 12.5, 13.0, 20.0, 24.0])  # 1, 12 and 13 are switches
    x = Integrator(pk, t, TIGHT).solve(THETA, [0.0, 0.0])
    np.testing.assert_allclose(x, infusion_exact(t, *THETA), rtol=1e-8, atol=1e-10)


def test_compiled_op_equals_the_python_solve_and_its_gradient_finite_differences(lv):
    c = lv.case()
    integrator = Integrator(lv.system, c.times, DOPRI5(rtol=1e-10, atol=1e-12))
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    w = np.random.default_rng(0).normal(size=(c.times.size, 2))
    y = (ODEOp(integrator)(th, x0) * w).sum()
    f = pytensor.function([th, x0], [y, *pt.grad(y, [th, x0])], mode="NUMBA")
    value, g_th, g_x0 = f(c.theta, c.x0)
    np.testing.assert_allclose(value, (integrator.solve_sensitivities(c.theta, c.x0)[0] * w).sum(), rtol=1e-13)
    for k in range(4):
        e = np.zeros(4)
        e[k] = 1e-6 * c.theta[k]
        fd = (f(c.theta + e, c.x0)[0] - f(c.theta - e, c.x0)[0]) / (2 * e[k])
        np.testing.assert_allclose(g_th[k], fd, rtol=1e-6, atol=1e-8)
    e = np.array([0.0, 1e-6])
    np.testing.assert_allclose(g_x0[1], (f(c.theta, c.x0 + e)[0] - f(c.theta, c.x0 - e)[0]) / 2e-6, rtol=1e-6)
    # the compiled code is cached under a key of its own: never CVODE's code at the same tolerances
    cv = ODEOp(Integrator(lv.system, c.times, CVODE(rtol=1e-10, atol=1e-12)))
    assert cache_key(ODEOp(integrator)) != cache_key(cv)


def test_a_stiff_system_ends_with_a_named_flag_and_the_op_gives_nan():
    # x' = -1e6 (x - cos t): its explicit steps are held to ~3e-6 by stability, 10^6 steps over [0, 3]
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    t = np.linspace(0, 3, 4)
    with pytest.raises(ODESolveError, match="TOO_MUCH_WORK.*stiff"):
        Integrator(stiff, t, DOPRI5(max_steps=2000)).solve([1e6], [1.0])
    x = Integrator(stiff, t, CVODE()).solve([1e6], [1.0])[:, 0]  # what CVODE is for
    np.testing.assert_allclose(x, np.cos(t), atol=1e-5)
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    op = ODEOp(Integrator(stiff, t, DOPRI5(max_steps=2000)), on_failure="nan")
    f = pytensor.function([th, x0], op(th, x0), mode="NUMBA")
    assert np.isnan(f(np.array([1e6]), np.array([1.0]))).all()


def test_a_blow_up_is_an_error_not_numbers():
    s = ODESystem.from_equations({"x": "x**2"}, [])  # x = 1 / (1 - t): infinite at t = 1
    with pytest.raises(ODESolveError, match="DOPRI5 failed"):
        Integrator(s, np.linspace(0, 2, 5), DOPRI5()).solve([], [1.0])


def test_a_fit_with_dopri5_reaches_cvodes_optimum(lv):
    c = lv.case("x1-observed")
    data = lv.simulate("x1-observed", seed=0)
    kw = dict(kernel=c.kernel, gamma=c.gamma, priors=lv.priors("x1-observed"), posterior=None, progressbar=False)
    a = pgpgm.fit(lv.system, data, c.observed, solver=DOPRI5(), **kw)
    b = pgpgm.fit(lv.system, data, c.observed, **kw)
    np.testing.assert_allclose(a.estimates["theta"].values, b.estimates["theta"].values, rtol=1e-4)


def test_the_fallback_redoes_a_stiff_solve_with_cvode_in_python_and_in_the_op():
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    t = np.linspace(0, 3, 4)
    solver = DOPRI5(max_steps=200, fallback=CVODE())
    np.testing.assert_allclose(Integrator(stiff, t, solver).solve([1e6], [1.0])[:, 0], np.cos(t), atol=1e-5)
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    f = pytensor.function([th, x0], ODEOp(Integrator(stiff, t, solver))(th, x0), mode="NUMBA")
    np.testing.assert_allclose(f(np.array([1e6]), np.array([1.0]))[:, 0], np.cos(t), atol=1e-5)
    slow = ODEOp(Integrator(stiff, t, DOPRI5(rtol=1e-10, atol=1e-12, fallback=CVODE(rtol=1e-10, atol=1e-12))))
    g = pytensor.function([th, x0], slow(th, x0), mode="NUMBA")  # a mild lam: DOPRI5 itself, to its tolerance
    exact = (np.cos(t) + np.sin(t) + np.exp(-t)) / 2  # x' = -(x - cos t), x(0) = 1
    np.testing.assert_allclose(g(np.array([1.0]), np.array([1.0]))[:, 0], exact, atol=1e-9)
    with pytest.raises(pgpgm.DataError, match="fallback must be a pgpgm.CVODE"):
        DOPRI5(fallback=pgpgm.LSODA())


def test_step_4_solves_with_dopri5_and_a_cvode_fallback_by_default():
    auto = pgpgm.NUTS().solver_for(CVODE())
    assert auto == DOPRI5(rtol=1e-6, atol=1e-8, max_steps=1000, fallback=CVODE(rtol=1e-6), stiffness=True)
    assert pgpgm.NUTS(solver="fit").solver_for(CVODE()) == CVODE(rtol=1e-6)
    assert pgpgm.NUTS(rtol=None).solver_for(CVODE(rtol=1e-9)) == DOPRI5(rtol=1e-9, max_steps=1000,
                                                                         fallback=CVODE(rtol=1e-9), stiffness=True)
    assert pgpgm.NUTS().solver_for(pgpgm.LSODA()) == pgpgm.LSODA(rtol=1e-6)  # not CVODE: kept as it is
    assert pgpgm.NUTS(solver=DOPRI5()).solver_for(CVODE()) == DOPRI5(rtol=1e-6)
    with pytest.raises(pgpgm.DataError, match="NUTS solver must be"):
        pgpgm.NUTS(solver="rk4")


def test_step_4_keeps_cvode_where_the_refined_point_is_stiff(lv):
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    t = np.linspace(0, 3, 4)
    nuts = pgpgm.NUTS()
    assert nuts.solver_at(CVODE(), stiff, t, [1e6], [1.0]) == CVODE(rtol=1e-6)  # DOPRI5 gives up there
    assert nuts.solver_at(CVODE(), stiff, t, [1.0], [1.0]) == nuts.solver_for(CVODE())
    c = lv.case()
    assert isinstance(nuts.solver_at(CVODE(), lv.system, c.times, c.theta, c.x0), DOPRI5)


def test_a_study_keeps_cvode_where_one_experiment_is_stiff_at_its_optimum():
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    obs = [SimpleNamespace(times=np.linspace(0, 3, 4))] * 2
    nuts = pgpgm.NUTS()
    mild = SimpleNamespace(thetas=np.array([[1.0], [2.0]]), x0s=np.array([[1.0], [1.0]]))
    one_stiff = SimpleNamespace(thetas=np.array([[1.0], [1e6]]), x0s=np.array([[1.0], [1.0]]))
    assert study_solver(nuts, CVODE(), stiff, obs, mild) == nuts.solver_for(CVODE())
    assert isinstance(study_solver(nuts, CVODE(), stiff, obs, mild), DOPRI5)
    assert study_solver(nuts, CVODE(), stiff, obs, one_stiff) == CVODE(rtol=1e-6)


@pytest.mark.parametrize("lam", [100.0, 3000.0])
def test_the_stiffness_test_hands_a_stiff_solve_to_cvode(lam):
    """x' = -lam (x - cos t) is stiff for large lam: DOPRI5 alone crawls on (and stays exact), with the
    test (at step 4's rtol 1e-6) it stops with STIFF, with a fallback CVODE's answer comes back; an
    oscillator (non-stiff) passes."""
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    t = np.linspace(0, 10, 21)
    exact = (lam**2 * np.cos(t) + lam * np.sin(t)) / (lam**2 + 1) + (1 - lam**2 / (lam**2 + 1)) * np.exp(-lam * t)
    crawled = Integrator(stiff, t, DOPRI5(rtol=1e-6, atol=1e-8, max_steps=100_000)).solve([lam], [1.0])
    np.testing.assert_allclose(crawled[:, 0], exact, rtol=1e-4, atol=1e-6)
    with pytest.raises(ODESolveError, match="STIFF"):
        Integrator(stiff, t, DOPRI5(rtol=1e-6, atol=1e-8, max_steps=100_000, stiffness=True)).solve([lam], [1.0])
    cv = CVODE(rtol=1e-6, atol=1e-8)
    handed = Integrator(stiff, t, DOPRI5(rtol=1e-6, atol=1e-8, stiffness=True, fallback=cv))
    np.testing.assert_array_equal(handed.solve_sensitivities([lam], [1.0])[0],
                                  Integrator(stiff, t, cv).solve_sensitivities([lam], [1.0])[0])
    theta_, x0_ = pt.dvector("theta"), pt.dvector("x0")
    op = ODEOp(handed, sensitivities=False)
    f = pytensor.function([theta_, x0_], op(theta_, x0_), mode="NUMBA")
    np.testing.assert_array_equal(f(np.array([lam]), np.array([1.0])), Integrator(stiff, t, cv).solve([lam], [1.0]))
    oscillator = ODESystem.from_equations({"x": "v", "v": "-w**2*x"}, ["w"])
    t = np.linspace(0, 20, 41)
    out = Integrator(oscillator, t, DOPRI5(rtol=1e-8, atol=1e-10, stiffness=True)).solve([2.0], [1.0, 0.0])
    np.testing.assert_allclose(out[:, 0], np.cos(2 * t), atol=1e-6)


def test_step_4_keeps_cvode_where_the_refined_point_is_mildly_stiff():
    """lam = 300: DOPRI5 does not give up (no max_steps reached) but its steps are bounded by stability."""
    stiff = ODESystem.from_equations({"x": "-lam*(x - cos(t))"}, ["lam"])
    t = np.linspace(0, 10, 21)
    Integrator(stiff, t, DOPRI5(rtol=1e-6, max_steps=1000)).solve_sensitivities([300.0], [1.0])  # no failure
    assert pgpgm.NUTS().solver_at(CVODE(), stiff, t, [300.0], [1.0]) == CVODE(rtol=1e-6)


@pytest.mark.parametrize("theta", [[1e200, 0.085, 0.04], [1.5, 0.085, 1e-300], [1.5, 0.085, 0.0]],
                         ids=["huge-ka", "tiny-CL", "zero-CL"])
def test_an_overflowing_right_hand_side_is_a_failed_solve_not_an_exception(theta):
    """pk-oral at a point a diverging NUTS trajectory of a non-centred study reaches (log ka = mu + sigma z
    ~ 460, or CL ~ 0): |f(x0)| / (atol + rtol |x0|) ~ 1e206 squares to inf in the first step's norm, which
    made the first step size 0 and divided by it (ZeroDivisionError from the compiled solve, inside
    PyMC's NUTS). A failed solve instead: a named error in Python, NaN in the Op, a -inf log density."""
    system = pgpgm.load_model("pk-oral").system
    t = np.array([0.0, 0.5, 1.0, 2.0, 5.0, 12.0, 24.0])
    x0 = np.array([4.5, 0.0])
    with pytest.raises(ODESolveError, match="DOPRI5 failed"):
        Integrator(system, t, DOPRI5()).solve(theta, x0)
    th = pt.dvector("th")
    op = ODEOp(Integrator(system, t, pgpgm.NUTS().solver_for(CVODE())), on_failure="nan", x0_free=())
    x = op(th, pt.as_tensor(x0))
    ok = pt.all(pt.isfinite(x))  # as step 4's models: a failed solve is a -inf potential
    logp = pt.switch(ok, -0.5 * ((pt.switch(ok, x, 0.0)[:, 1] - 1.0) ** 2).sum(), -np.inf)
    f = pytensor.function([th], [x, logp, pytensor.grad(logp, th)], mode="NUMBA")
    out, lp, _ = f(np.array(theta, float))
    assert np.isnan(out).all() and lp == -np.inf
    ka, ke, cl = 1.5, 0.085, 0.04  # a sound point: the closed form of C(t), the Op works
    out, lp, _ = f(np.array([ka, ke, cl]))
    exact = 4.5 * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))
    np.testing.assert_allclose(out[:, 1], exact, rtol=1e-4, atol=1e-6)
    assert lp == pytest.approx(-0.5 * np.sum((exact - 1.0) ** 2), rel=1e-4)

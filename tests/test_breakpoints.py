"""Right-hand sides that switch in time: breakpoints found symbolically, piecewise integration.

References: the closed-form solution of the one-compartment infusion with an effect
compartment (piecewise exponentials), finite differences, and an independent least-squares
fit (scipy's ``least_squares`` on the closed form).
"""

import warnings

import numpy as np
import pytest
import sympy as sp
from scipy.optimize import least_squares

import pgpgm
from pgpgm.errors import ModelDefinitionError
from pgpgm.ode.system import ODESystem
from pgpgm.refinement import LeastSquaresProblem, refine
from pgpgm.solve import LSODA, SksundaeCVODE
from pgpgm.solve.op import ODEOp
from pgpgm.solve.numba_op import numba_ode_function

TIMES = np.linspace(0.0, 24.0, 50)
THETA = np.array([5.0, 20.0, 0.7])  # CL, V, ke0
RATES = [(0.0, 100.0), (1.0, 0.0), (12.0, 100.0), (13.0, 0.0)]  # (start, infusion rate mg/h)


def infusion_exact(times, CL, V, ke0, C0=0.0, Ce0=0.0):
    """C and Ce (N, 2) in closed form: on a piece starting at a with rate R, C = A + B e^{-k tau}
    (A = R/CL, k = CL/V, tau = t - a) and Ce = A + G e^{-k tau} + D e^{-ke0 tau}, G = B ke0/(ke0 - k)."""
    k = CL / V
    out = np.empty((times.size, 2))
    C, Ce = C0, Ce0
    ends = [a for a, _ in RATES[1:]] + [np.inf]
    for (a, R), b in zip(RATES, ends):
        A = R / CL
        B = C - A
        G = B * ke0 / (ke0 - k)
        D = Ce - A - G
        m = (times >= a) & (times <= b)
        tau = times[m] - a
        out[m, 0] = A + B * np.exp(-k * tau)
        out[m, 1] = A + G * np.exp(-k * tau) + D * np.exp(-ke0 * tau)
        if np.isfinite(b):
            C, Ce = A + B * np.exp(-k * (b - a)), A + G * np.exp(-k * (b - a)) + D * np.exp(-ke0 * (b - a))
    return out


@pytest.fixture(scope="module")
def pk():
    return pgpgm.load_model("pk-infusion").system


# ----------------------------------------------------------------------------- detection
def test_pk_infusion_breakpoints_are_the_infusion_switches(pk):
    np.testing.assert_array_equal(pk.breakpoints(0.0, 24.0), [1.0, 12.0, 13.0])
    np.testing.assert_array_equal(pk.breakpoints(1.0, 12.5), [12.0])  # strictly inside the span
    assert pgpgm.Integrator(pk, TIMES).breakpoints.tolist() == [1.0, 12.0, 13.0]


def test_smooth_shipped_models_have_no_breakpoints():
    for name in pgpgm.available_models():
        if name != "pk-infusion":
            assert pgpgm.load_model(name).system.breakpoints(0.0, 100.0).size == 0, name


def test_breakpoints_of_every_kind_of_time_switch():
    s = ODESystem.from_equations({
        "x": "where(sin(2*pi*t) > 0, 1, 0) - x + min(t, 5) + abs(t - 2.5) + where(t*exp(-t) < 0.1, 1, 0)",
        "y": "max(t**2, 2) + where(x > 1, 1, 0) + where(t < k, 1, 0) + max(x, t)",
    }, ["k"])
    got = s.breakpoints(0.0, 6.2)
    lam = lambda t: t * np.exp(-t) - 0.1  # noqa: E731
    roots = [r for r in got if abs(lam(r)) < 1e-14]
    assert len(roots) == 2  # t exp(-t) = 0.1 has no closed form: found numerically
    expected = sorted([0.5 * j for j in range(1, 13)] + [np.sqrt(2.0)] + roots)  # sin zeros, kinks 2.5, 5, sqrt 2
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)
    # state- and parameter-dependent switches are not breakpoints (documented limit) ...
    assert not any(sw.function.free_symbols - {sp.Symbol("t", real=True)} for sw in s.time_switches)
    # ... but a fixed parameter's switch is
    assert 3.0 in s.fix({"k": 3.0}).breakpoints(0.0, 6.2)


def test_too_many_breakpoints_is_a_clear_error():
    s = ODESystem.from_equations({"x": "where(sin(1000*t) > 0, 1, -1)"}, [])
    with pytest.raises(ModelDefinitionError, match="switches more than"):
        pgpgm.Integrator(s, np.linspace(0.0, 1000.0, 5))


# ----------------------------------------------------------------------------- solutions
@pytest.mark.parametrize("solver", [pgpgm.CVODE(rtol=1e-11, atol=1e-11), SksundaeCVODE(rtol=1e-11, atol=1e-11),
                                    LSODA(rtol=1e-11, atol=1e-11)], ids=lambda s: s.name)
def test_pk_infusion_matches_closed_form(pk, solver):
    if not solver.available():
        pytest.skip(f"{solver.name} not installed")
    it = pgpgm.Integrator(pk, TIMES, solver)
    for x0 in ([0.0, 0.0], [3.0, 1.0]):
        exact = infusion_exact(TIMES, *THETA, *x0)
        scale = np.abs(exact).max(axis=0)
        assert np.max(np.abs(it.solve(THETA, x0) - exact) / scale) < 1e-8
        x, _, _ = it.solve_sensitivities(THETA, x0)
        assert np.max(np.abs(x - exact) / scale) < 1e-8


@pytest.mark.parametrize("solver", [pgpgm.CVODE(), SksundaeCVODE(), LSODA()], ids=lambda s: s.name)
def test_no_right_hand_side_evaluation_at_a_break_reads_the_next_piece(pk, solver):
    # at the default tolerances CVODE's last step before a break is long, and BDF evaluates the
    # right-hand side at the step's end: a piece that ended at the break itself read the infusion
    # of where(12 <= t < 13, ...) as off there, 1.9e-3 wrong in C after t = 13 at this theta
    # (4.4e-4 of its range); each piece now ends at the float below its break
    if not solver.available():
        pytest.skip(f"{solver.name} not installed")
    theta, x0 = np.array([4.994023626318701, 19.95987580650593, 0.7400126138197649]), [-2.692152992274159e-4, 0.0]
    exact = infusion_exact(TIMES, *theta, *x0)
    x = pgpgm.Integrator(pk, TIMES, solver).solve(theta, x0)
    assert np.max(np.abs(x - exact) / np.abs(exact).max(axis=0)) < 2e-7
    # output times on the breaks, one of them alone in its piece (a two-point grid is a span to
    # scikit-sundae, which then returns every internal step)
    times = np.array([0.0, 0.5, 1.0, 12.0, 12.5, 13.0, 20.0])
    exact = infusion_exact(times, *theta, *x0)
    x = pgpgm.Integrator(pk, times, solver).solve(theta, x0)
    assert np.max(np.abs(x - exact) / np.abs(exact).max(axis=0)) < 2e-7


def test_output_times_on_and_next_to_breakpoints(pk):
    times = np.array([0.0, 0.5, 1.0, np.nextafter(1.0, 2.0), 1.0 + 1e-12, 12.0, 13.0 - 1e-13, 13.0, 24.0])
    for solver in (pgpgm.CVODE(rtol=1e-11, atol=1e-11), LSODA(rtol=1e-11, atol=1e-11)):
        x = pgpgm.Integrator(pk, times, solver).solve(THETA, [0.0, 0.0])
        exact = infusion_exact(times, *THETA)
        assert np.max(np.abs(x - exact) / np.abs(exact).max(axis=0)) < 1e-8, solver.name


def test_compiled_op_restarts_at_breakpoints_like_the_python_solve(pk):
    it = pgpgm.Integrator(pk, TIMES)
    f = numba_ode_function(ODEOp(it, sensitivities=True))
    if f is None:
        pytest.skip("compiled CVODE unavailable")
    x, dth, dx0 = f(THETA, np.array([0.3, 0.2]))
    ref = it.solve_sensitivities(THETA, [0.3, 0.2])
    for a, b in zip((x, dth, dx0), ref):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- derivatives
def test_sensitivities_match_finite_differences_in_every_unknown(pk):
    """Fourth-order central differences of the solve (h = 1 % of each unknown, truncation
    ~1e-8) against the forward sensitivities, at a tolerance where the solver's rounding
    divided by h stays below 1e-7."""
    it = pgpgm.Integrator(pk, TIMES, pgpgm.CVODE(rtol=1e-10, atol=1e-10))
    q0 = np.array([*THETA, 0.3, 0.2])
    _, dth, dx0 = it.solve_sensitivities(q0[:3], q0[3:])
    sens = np.concatenate([dth, dx0], axis=2)

    def solve(q):
        return it.solve(q[:3], q[3:])

    for k in range(5):
        h = 1e-2 * q0[k]
        e = np.eye(5)[k] * h
        fd = (8 * (solve(q0 + e) - solve(q0 - e)) - (solve(q0 + 2 * e) - solve(q0 - 2 * e))) / (12 * h)
        assert np.max(np.abs(fd - sens[:, :, k])) <= 1e-5 * np.abs(sens[:, :, k]).max(), k
        # and against the derivative of the closed form
        exact = (infusion_exact(TIMES, *(q0 + e)) - infusion_exact(TIMES, *(q0 - e))) / (2 * h) if k < 3 else None
        if exact is not None:
            assert np.max(np.abs(exact - sens[:, :, k])) <= 1e-3 * np.abs(sens[:, :, k]).max()


def test_solution_is_smooth_in_the_unknowns_at_default_tolerances(pk):
    """Stepping over the switches made C jump by up to 5e-4 of its range when an unknown moved
    by 1e-7 (second differences over 100 steps; ke0, which does not enter C, gave the largest);
    restarting at the breakpoints leaves jumps below 100 x the tolerance (measured <= 5e-8)."""
    it = pgpgm.Integrator(pk, TIMES)
    q0 = np.array([*THETA, 0.3, 0.2])
    for k in range(5):
        xs = np.array([it.solve((q0 + j * 1e-7 * np.eye(5)[k])[:3], (q0 + j * 1e-7 * np.eye(5)[k])[3:])
                       for j in range(100)])
        jumps = np.abs(np.diff(xs, 2, axis=0)).max() / np.abs(xs).max()
        assert jumps < 1e-6, (k, jumps)


# ----------------------------------------------------------------------------- least squares
def test_least_squares_reaches_one_optimum_from_several_starts(pk):
    """C observed (50 points on [0, 24], 1 % noise), x0 known: pgpgm.refine from five starts and
    scipy's least_squares on the closed form reach the same negative log likelihood (1e-8
    relative). ke0 does not enter C, so only CL and V are compared."""
    c = infusion_exact(TIMES, *THETA)[:, 0]
    sd = 0.01 * c.max()
    y = c + sd * np.random.default_rng(0).standard_normal(TIMES.size)

    def nll_of(resid):
        return 0.5 * np.sum(resid**2) + TIMES.size * np.log(sd * np.sqrt(2 * np.pi))

    ref = least_squares(lambda q: (infusion_exact(TIMES, q[0], q[1], 0.7)[:, 0] - y) / sd, [3.0, 15.0],
                        xtol=1e-15, ftol=1e-15, gtol=1e-15, method="lm")
    ref_nll = nll_of(ref.fun)
    prob = LeastSquaresProblem(pgpgm.Integrator(pk, TIMES, pgpgm.CVODE(rtol=1e-11, atol=1e-11)), y[:, None], [0], [sd],
                               [0.0, 0.0])
    bounds = np.array([[0.0, 50.0], [0.0, 100.0], [0.0, 5.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for start in ([2.0, 10.0, 0.3], [8.0, 30.0, 1.5], [3.0, 15.0, 2.0], [10.0, 40.0, 0.2], [20.0, 60.0, 4.0]):
            r = refine(prob, np.array(start), bounds, warn=False)
            assert abs(r.nll - ref_nll) <= 1e-8 * abs(ref_nll), (start, r.nll, ref_nll)
            np.testing.assert_allclose(r.theta[:2], ref.x, rtol=1e-6)


def test_integrator_stops_at_breakpoints_it_is_given():
    """A switch at a parameter's value (t < tau) is no breakpoint of the system; given to the integrator,
    every solve stops there: dx/dt = 1 until tau, 0 after, so x(10) = tau exactly."""
    system = pgpgm.ODESystem.from_equations({"x": "where(t < tau, 1, 0)"}, ["tau"])
    times = np.array([0.0, 5.0, 10.0])
    integ = pgpgm.Integrator(system, times, pgpgm.CVODE(rtol=1e-10, atol=1e-12), breakpoints=[3.3, 12.0])
    np.testing.assert_array_equal(integ.breakpoints, [3.3])  # outside the span: ignored
    np.testing.assert_allclose(integ.solve([3.3], [0.0])[:, 0], [0.0, 3.3, 3.3], rtol=1e-12, atol=1e-12)

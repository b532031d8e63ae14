"""The equation language beyond arithmetic: where/min/max, comparisons, pi/E and t.

Every function the parser allows is checked three ways: the numba kernel, the
PyTensor translation and an independent numpy reference agree. Conditional models
are solved with CVODE and compared with analytic solutions and with scipy's
solve_ivp integrating the smooth pieces separately.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
import sympy as sp
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm import CVODE, LSODA, Integrator, ODESystem, SksundaeCVODE
from pgpgm.ode.parse import ALLOWED_CONSTANTS, ALLOWED_FUNCTIONS

TIGHT = CVODE(rtol=1e-10, atol=1e-12)

# One right-hand side per language element (state z_<key>), with a numpy reference
# f(x, y, a, t). The states x, y (in (0.1, 2.5)) and the parameter a feed them all.
FUNCTIONS = {
    "exp": ("exp(a*x - y)", lambda x, y, a, t: np.exp(a * x - y)),
    "log": ("log(x + 2)", lambda x, y, a, t: np.log(x + 2)),
    "sqrt": ("sqrt(x*y + 1)", lambda x, y, a, t: np.sqrt(x * y + 1)),
    "sin": ("sin(a*t + x)", lambda x, y, a, t: np.sin(a * t + x)),
    "cos": ("cos(x - 2*y)", lambda x, y, a, t: np.cos(x - 2 * y)),
    "tan": ("tan(x/3)", lambda x, y, a, t: np.tan(x / 3)),
    "sinh": ("sinh(x - y)", lambda x, y, a, t: np.sinh(x - y)),
    "cosh": ("cosh(y/2)", lambda x, y, a, t: np.cosh(y / 2)),
    "tanh": ("tanh(a*x)", lambda x, y, a, t: np.tanh(a * x)),
    "asin": ("asin(x/3)", lambda x, y, a, t: np.arcsin(x / 3)),
    "acos": ("acos(y/3)", lambda x, y, a, t: np.arccos(y / 3)),
    "atan": ("atan(x - y)", lambda x, y, a, t: np.arctan(x - y)),
    "abs": ("abs(x - y)", lambda x, y, a, t: np.abs(x - y)),
    "min": ("min(x, y, a)", lambda x, y, a, t: np.minimum(np.minimum(x, y), a)),
    "max": ("max(x, 2*y, 1)", lambda x, y, a, t: np.maximum(np.maximum(x, 2 * y), 1)),
    "where": ("where(x < y, a*x, t > 0.5, y, 3)",
              lambda x, y, a, t: np.where(x < y, a * x, np.where(t > 0.5, y, 3.0))),
}
CONDITIONS = {
    "lt": ("where(x < y, 1, 2)", lambda x, y, a, t: np.where(x < y, 1.0, 2.0)),
    "le": ("where(x <= a, x, -y)", lambda x, y, a, t: np.where(x <= a, x, -y)),
    "gt": ("where(t > 0.5, x, y)", lambda x, y, a, t: np.where(t > 0.5, x, y)),
    "ge": ("where(y >= 1, x*y, 0)", lambda x, y, a, t: np.where(y >= 1, x * y, 0.0)),
    "chain": ("where(0.5 < x <= y, 1, 0)", lambda x, y, a, t: np.where((0.5 < x) & (x <= y), 1.0, 0.0)),
    "and": ("where(x > 1 and y > 1, x, y)", lambda x, y, a, t: np.where((x > 1) & (y > 1), x, y)),
    "or": ("where(x > 2 or t < 0.2, x, -x)", lambda x, y, a, t: np.where((x > 2) | (t < 0.2), x, -x)),
    "not": ("where(not (x > y), y, x)", lambda x, y, a, t: np.where(~(x > y), y, x)),
    "bitand": ("where((x > 1) & (t < 0.7), 5, a)", lambda x, y, a, t: np.where((x > 1) & (t < 0.7), 5.0, a)),
    "bitor": ("where((x > 2) | (y < 0.5), 5, a)", lambda x, y, a, t: np.where((x > 2) | (y < 0.5), 5.0, a)),
}
CONSTANTS = {
    "pi": ("pi*x", lambda x, y, a, t: np.pi * x),
    "E": ("E**y", lambda x, y, a, t: np.e**y),
    "t": ("t*x - a", lambda x, y, a, t: t * x - a),
}
ALL = {**FUNCTIONS, **CONDITIONS, **CONSTANTS}


def test_every_language_element_is_covered():
    assert set(FUNCTIONS) == set(ALLOWED_FUNCTIONS)
    assert set(ALLOWED_CONSTANTS) <= set(CONSTANTS)


@pytest.fixture(scope="module")
def language_system():
    eqs = {"x": "-a*x", "y": "x - y"}
    eqs.update({f"z_{k}": text for k, (text, _) in ALL.items()})
    return ODESystem.from_equations(eqs, ["a"], name="language")


def _points(n=400, seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0.1, 2.5, n), rng.uniform(0.1, 2.5, n)
    t = rng.uniform(0, 1, n)
    return x, y, t


def test_numba_and_pytensor_match_numpy_reference_for_every_function(language_system):
    s = language_system
    a = 1.3
    x, y, t = _points()
    X = np.zeros((x.size, s.n_states))
    X[:, 0], X[:, 1] = x, y
    numba_f = s.rhs_on_grid(t, X, np.array([a]))
    tv, th = pt.dvector("t"), pt.dvector("theta")
    xs = {name: pt.dvector(name) for name in s.states}
    f = pytensor.function([tv, th, *xs.values()], s.pytensor_rhs(tv, xs, th), on_unused_input="ignore")
    pytensor_f = np.column_stack(f(t, [a], *X.T))
    for j, (key, (_, ref)) in enumerate(ALL.items(), start=2):
        expected = np.broadcast_to(ref(x, y, a, t), x.shape)
        np.testing.assert_allclose(numba_f[:, j], expected, rtol=1e-13, atol=1e-14, err_msg=key)
        np.testing.assert_allclose(pytensor_f[:, j], expected, rtol=1e-13, atol=1e-14, err_msg=key)
    # both branches of every condition were visited
    for j, key in enumerate(CONDITIONS, start=2 + len(FUNCTIONS)):
        assert np.unique(numba_f[:, j]).size > 1, key


def test_pytensor_gradient_of_conditional_terms(language_system):
    # d/da of where/min pieces through PyTensor against the compiled df/dtheta.
    s = language_system
    x, y, t = _points(50, seed=3)
    X = np.zeros((x.size, s.n_states))
    X[:, 0], X[:, 1] = x, y
    a = 1.3
    tv, th = pt.dvector("t"), pt.dvector("theta")
    xs = {name: pt.dvector(name) for name in s.states}
    outs = s.pytensor_rhs(tv, xs, th)
    for key in ("min", "where", "le", "bitand"):
        j = s.states.index(f"z_{key}")
        g = pytensor.function([tv, th, *xs.values()], pytensor.grad(outs[j].sum(), th), on_unused_input="ignore")
        expected = sum(s.jacobian(ti, Xi, [a])[1][j, 0] for ti, Xi in zip(t, X))
        np.testing.assert_allclose(g(t, [a], *X.T)[0], expected, rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("point", [(0.7, 1.9, 1.3, 0.3), (2.2, 0.4, 0.9, 0.8), (1.4, 1.1, 2.0, 0.1)])
def test_jacobians_of_every_function_match_finite_differences(language_system, point):
    s = language_system
    x, y, a, t = point
    X = np.zeros(s.n_states)
    X[:2] = x, y
    jx, jp = s.jacobian(t, X, [a])
    h = 1e-6
    for j in range(2):
        e = np.zeros_like(X); e[j] = h
        fd = (s.rhs(t, X + e, [a]) - s.rhs(t, X - e, [a])) / (2 * h)
        np.testing.assert_allclose(jx[:, j], fd, rtol=1e-7, atol=1e-8)
    fd = (s.rhs(t, X, [a + h]) - s.rhs(t, X, [a - h])) / (2 * h)
    np.testing.assert_allclose(jp[:, 0], fd, rtol=1e-7, atol=1e-8)


def test_derivatives_of_kinks_have_no_distributions(language_system):
    jac = sp.Matrix.hstack(language_system.state_jacobian, language_system.parameter_jacobian)
    assert not jac.has(sp.Derivative, sp.Subs)
    # min/max differentiate to Heaviside steps, abs to sign: printed as conditionals
    assert jac.has(sp.Heaviside) and jac.has(sp.sign)


def test_compiled_kernels_never_raise_at_singular_points():
    # 1/0, 0**-2, log(0), sqrt(-1), acos(2): inf or nan, never a Python exception
    s = ODESystem.from_equations(
        {"x": "1/x + x**-2 + log(x) + sqrt(y)", "y": "acos(y) + min(x, y)/x + where(x < 1, 1/x, 0)"}, [])
    for x, y in [(0.0, -1.0), (0.0, 0.0), (-1.0, 2.0)]:
        f = s.rhs(0.0, [x, y], [])
        jx, _ = s.jacobian(0.0, [x, y], [])
        assert not np.all(np.isfinite(f)) and not np.all(np.isfinite(jx))


def test_saturating_elimination_min_against_analytic_solution():
    # x' = -a*min(x, 1): linear decay while x > 1, exponential after t1 = (x0 - 1)/a.
    s = ODESystem.from_equations({"x": "-a*min(x, 1)"}, ["a"])
    a, x0 = 0.8, 3.0
    t = np.linspace(0, 6, 61)
    t1 = (x0 - 1) / a
    x, dth, dx0 = Integrator(s, t, TIGHT).solve_sensitivities([a], [x0])
    exact = np.where(t < t1, x0 - a * t, np.exp(-a * (t - t1)))
    # d/da: before t1 -t; after, d/da exp(-a t + (x0 - 1)) = -t exp(...)
    d_da = np.where(t < t1, -t, -t * np.exp(-a * (t - t1)))
    d_dx0 = np.where(t < t1, 1.0, np.exp(-a * (t - t1)))
    np.testing.assert_allclose(x[:, 0], exact, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(dth[:, 0, 0], d_da, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx0[:, 0, 0], d_dx0, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the shipped dosing model
SEGMENTS = [(0.0, 1.0, 100.0), (1.0, 12.0, 0.0), (12.0, 13.0, 100.0), (13.0, 24.0, 0.0)]


def _dosing_reference(theta, x0, times):
    """solve_ivp (DOP853, rtol 1e-12) on each infusion segment, restarted at the switches."""
    CL, V, ke0 = theta
    out = np.empty((times.size, 2))
    state = np.asarray(x0, float)
    for lo, hi, rate in SEGMENTS:
        sel = (times >= lo) & ((times < hi) | ((hi == SEGMENTS[-1][1]) & (times <= hi)))

        def f(t, u, rate=rate):
            return [rate / V - CL / V * u[0], ke0 * (u[0] - u[1])]

        sol = solve_ivp(f, (lo, hi), state, method="DOP853", rtol=1e-12, atol=1e-14,
                        t_eval=times[sel], dense_output=True)
        assert sol.success
        out[sel] = sol.y.T
        state = sol.sol(hi)
    return out


@pytest.fixture(scope="module")
def dosing():
    return pgpgm.load_model("pk-infusion")


def test_dosing_model_written_with_where(dosing):
    assert dosing.system.expressions[0].has(sp.Piecewise)
    assert "where(" in dosing.system.to_dict()["equations"]["C"]


def test_dosing_solution_matches_segmentwise_scipy_and_analytic(dosing):
    c = dosing.case()
    x = Integrator(dosing.system, c.times, TIGHT).solve(c.theta, c.x0)
    ref = _dosing_reference(c.theta, c.x0, c.times)
    np.testing.assert_allclose(x, ref, rtol=1e-7, atol=1e-9)
    # C(t) in closed form: on each segment C -> rate/CL + (C(lo) - rate/CL) exp(-k (t - lo))
    CL, V, _ = c.theta
    k = CL / V
    C, t0, exact = 0.0, 0.0, np.empty(c.times.size)
    for lo, hi, rate in SEGMENTS:
        sel = (c.times >= lo) & (c.times <= hi)
        exact[sel] = rate / CL + (C - rate / CL) * np.exp(-k * (c.times[sel] - lo))
        C = rate / CL + (C - rate / CL) * np.exp(-k * (hi - lo))
    np.testing.assert_allclose(x[:, 0], exact, rtol=1e-7, atol=1e-9)


def test_dosing_sensitivities_match_finite_differences_of_scipy(dosing):
    c = dosing.case()
    _, dth, dx0 = Integrator(dosing.system, c.times, TIGHT).solve_sensitivities(c.theta, c.x0)
    for k in range(3):
        h = 1e-5 * c.theta[k]
        e = np.zeros(3); e[k] = h
        fd = (_dosing_reference(c.theta + e, c.x0, c.times) - _dosing_reference(c.theta - e, c.x0, c.times)) / (2 * h)
        np.testing.assert_allclose(dth[:, :, k], fd, rtol=1e-5, atol=1e-6, err_msg=dosing.system.parameters[k])
    x0 = np.array([0.5, 0.2])
    _, _, dx0 = Integrator(dosing.system, c.times, TIGHT).solve_sensitivities(c.theta, x0)
    for j in range(2):
        e = np.zeros(2); e[j] = 1e-5
        fd = (_dosing_reference(c.theta, x0 + e, c.times) - _dosing_reference(c.theta, x0 - e, c.times)) / 2e-5
        np.testing.assert_allclose(dx0[:, :, j], fd, rtol=1e-5, atol=1e-6)


def test_dosing_jacobian_matches_finite_differences_on_both_sides_of_a_switch(dosing):
    s = dosing.system
    theta = dosing.case().theta
    for t in (0.5, 1.5, 12.5, 20.0):
        x = np.array([2.0, 1.0])
        jx, jp = s.jacobian(t, x, theta)
        for j in range(2):
            e = np.zeros(2); e[j] = 1e-6
            np.testing.assert_allclose(jx[:, j], (s.rhs(t, x + e, theta) - s.rhs(t, x - e, theta)) / 2e-6, rtol=1e-7)
        for k in range(3):
            e = np.zeros(3); e[k] = 1e-6 * theta[k]
            fd = (s.rhs(t, x, theta + e) - s.rhs(t, x, theta - e)) / (2e-6 * theta[k])
            np.testing.assert_allclose(jp[:, k], fd, rtol=1e-7, atol=1e-12)
        rate = 100.0 if (t < 1 or 12 <= t < 13) else 0.0
        np.testing.assert_allclose(s.rhs(t, x, theta)[0], rate / theta[1] - theta[0] / theta[1] * x[0], rtol=1e-14)


@pytest.mark.parametrize("cls", [SksundaeCVODE, LSODA])
def test_dosing_other_backends_agree(dosing, cls):
    if not cls.available():
        pytest.skip(f"{cls.name} not installed")
    c = dosing.case()
    x = Integrator(dosing.system, c.times, cls(rtol=1e-10, atol=1e-12)).solve(c.theta, c.x0)
    np.testing.assert_allclose(x, _dosing_reference(c.theta, c.x0, c.times), rtol=1e-6, atol=1e-8)

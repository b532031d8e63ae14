"""CVODE solves against analytic and tight reference solutions; Op gradients; failures."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pgpgm
from pgpgm import CVODE, Integrator, ODEOp, ODESolveError, ODESystem
from tests.conftest import scipy_reference

SOLVERS = pgpgm.available_solvers()
TIGHT = {cls: cls(rtol=1e-10, atol=1e-12) for cls in SOLVERS}


def test_cvode_compiled_backend_is_available_here():
    # scikit-sundae ships SUNDIALS; the compiled backend must be the default.
    assert SOLVERS[0] is CVODE and isinstance(pgpgm.default_solver(), CVODE)


@pytest.mark.parametrize("cls", SOLVERS)
def test_linear_decay_analytic(cls):
    s = ODESystem.from_equations({"x": "-k*x"}, ["k"])
    t = np.linspace(0, 5, 11)
    x = Integrator(s, t, TIGHT[cls]).solve([0.7], [2.0])[:, 0]
    np.testing.assert_allclose(x, 2.0 * np.exp(-0.7 * t), rtol=1e-6)


@pytest.mark.parametrize("cls", SOLVERS)
def test_harmonic_oscillator_analytic_and_sensitivity(cls):
    s = ODESystem.from_equations({"q": "v", "v": "-w**2*q"}, ["w"])
    t = np.linspace(0, 10, 41)
    w = 1.3
    x, dth, dx0 = Integrator(s, t, TIGHT[cls]).solve_sensitivities([w], [1.0, 0.0])
    np.testing.assert_allclose(x[:, 0], np.cos(w * t), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(x[:, 1], -w * np.sin(w * t), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dth[:, 0, 0], -t * np.sin(w * t), rtol=1e-5, atol=1e-7)  # d cos(wt)/dw
    np.testing.assert_allclose(dx0[:, 0, 1], np.sin(w * t) / w, rtol=1e-5, atol=1e-7)  # d q / d v0


@pytest.mark.parametrize("name", ["lotka-volterra", "fitzhugh-nagumo", "protein-transduction"])
def test_published_models_match_tight_scipy(all_models, name):
    spec = all_models[name]
    c = spec.case()
    ref = scipy_reference(spec.system, c.theta, c.x0, c.times)
    for cls in SOLVERS:
        x = Integrator(spec.system, c.times, TIGHT[cls]).solve(c.theta, c.x0)
        np.testing.assert_allclose(x, ref, rtol=1e-6, atol=1e-8 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["lotka-volterra", "protein-transduction"])
def test_sensitivities_match_finite_differences(all_models, name):
    spec = all_models[name]
    c = spec.case()
    sol = Integrator(spec.system, c.times, TIGHT[CVODE])
    _, dth, dx0 = sol.solve_sensitivities(c.theta, c.x0)
    for k in range(spec.system.n_parameters):
        h = 1e-5 * c.theta[k]
        e = np.zeros_like(c.theta); e[k] = h
        fd = (sol.solve(c.theta + e, c.x0) - sol.solve(c.theta - e, c.x0)) / (2 * h)
        np.testing.assert_allclose(dth[:, :, k], fd, rtol=1e-4, atol=1e-6)
    e = np.zeros(spec.system.n_states); e[0] = 1e-5
    fd = (sol.solve(c.theta, c.x0 + e) - sol.solve(c.theta, c.x0 - e)) / 2e-5
    np.testing.assert_allclose(dx0[:, :, 0], fd, rtol=1e-4, atol=1e-6)


def test_op_verify_grad(lv):
    c = lv.case()
    op = ODEOp(Integrator(lv.system, c.times, TIGHT[CVODE]))
    w = np.random.default_rng(0).normal(size=(c.times.size, 2))
    pytensor.gradient.verify_grad(
        lambda th, x0: (op(th, x0) * w).sum(), [c.theta, c.x0], rng=np.random.default_rng(1), eps=1e-6,
        abs_tol=1e-5, rel_tol=1e-5,
    )


def test_op_in_graph_matches_solver(lv):
    c = lv.case()
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    f = pytensor.function([th, x0], ODEOp(Integrator(lv.system, c.times))(th, x0))
    np.testing.assert_allclose(f(c.theta, c.x0), Integrator(lv.system, c.times).solve(c.theta, c.x0))


def test_blow_up_is_reported_not_hung():
    s = ODESystem.from_equations({"x": "x**2"}, [])
    t = np.linspace(0, 2, 5)  # solution 1/(1-t) explodes at t = 1
    for cls in SOLVERS:
        with pytest.raises(ODESolveError):
            Integrator(s, t, cls(max_steps=500)).solve([], [1.0])
    th = pt.dvector("th")
    op = ODEOp(Integrator(s, t), on_failure="nan")
    out = pytensor.function([th], op(th, pt.as_tensor([1.0])))(np.zeros(0))
    assert np.isnan(out).all()


def test_bad_inputs():
    s = ODESystem.from_equations({"x": "-k*x"}, ["k"])
    with pytest.raises(pgpgm.DataError, match="duplicates"):
        Integrator(s, [0, 1, 1])
    with pytest.raises(pgpgm.DataError, match="sorted"):
        Integrator(s, [0, 2, 1])
    with pytest.raises(pgpgm.DataError, match="NaN"):
        Integrator(s, [0, np.nan])
    sol = Integrator(s, [0, 1])
    with pytest.raises(pgpgm.DataError, match="theta must have 1"):
        sol.solve([1, 2], [1])
    with pytest.raises(pgpgm.DataError, match="must be a pgpgm Solver"):
        Integrator(s, [0, 1], "euler")
    with pytest.raises(pgpgm.DataError, match="tolerances"):
        CVODE(rtol=-1)


def test_value_and_gradient_cost_one_solve(lv):
    """A log density and its gradient through the Op share one augmented solve per evaluation."""
    c = lv.case()
    it = Integrator(lv.system, c.times, TIGHT[CVODE])
    th = pt.dvector("th")
    x = ODEOp(it)(th, pt.as_tensor(c.x0))
    logp = -0.5 * ((x - 1.0) ** 2).sum()
    f = pytensor.function([th], [logp, pytensor.grad(logp, th)])
    nodes = [n for n in f.maker.fgraph.apply_nodes if isinstance(n.op, ODEOp)]
    assert len(nodes) == 1 and nodes[0].op.sensitivities
    n0 = it.n_solves
    val, grad = f(c.theta)
    assert it.n_solves - n0 == 1
    # against the plain solve and finite differences
    xs = Integrator(lv.system, c.times, TIGHT[CVODE]).solve(c.theta, c.x0)
    np.testing.assert_allclose(val, -0.5 * ((xs - 1.0) ** 2).sum(), rtol=1e-7)  # the augmented solve controls more components
    for k in range(4):
        e = np.zeros(4); e[k] = 1e-4 * c.theta[k]
        fd = (f(c.theta + e)[0] - f(c.theta - e)[0]) / (2 * e[k])
        np.testing.assert_allclose(grad[k], fd, rtol=1e-5)


def test_integrator_pickles_and_solves_in_another_process(lv):
    import pickle

    c = lv.case()
    it = Integrator(lv.system, c.times)
    x = it.solve(c.theta, c.x0)
    back = pickle.loads(pickle.dumps(it))
    np.testing.assert_array_equal(back.solve(c.theta, c.x0), x)
    assert back.solver == it.solver


def test_linear_in_the_observed_states():
    """f affine in the chosen states: Lotka-Volterra's x1' = t1 x1 - t2 x1 x2 is affine in x1 alone and in
    x2 alone, not in both (x1 x2); FitzHugh-Nagumo's V' has V^3, R enters linearly; a Piecewise
    (where) in the state counts as not affine."""
    lv, fhn = pgpgm.load_model("lotka-volterra").system, pgpgm.load_model("fitzhugh-nagumo").system
    assert lv.linear_in([0]) and lv.linear_in([1]) and not lv.linear_in([0, 1])
    assert fhn.linear_in([fhn.states.index("R")]) and not fhn.linear_in([fhn.states.index("V")])
    step = pgpgm.ODESystem.from_equations({"a": "where(b > 1, k, 0)", "b": "a"}, ["k"])
    assert step.linear_in([0]) and not step.linear_in([1])


def test_keeps_sign_where_the_right_hand_side_vanishes_on_the_states_axis():
    """SIR's S' = -beta S I / N and I' = beta S I / N - gamma I vanish where S = 0 and I = 0, R' = gamma I does
    not; SEIR's I' = sigma E - gamma I does not (E feeds I); x' = a / x is not even defined at 0, and
    x' = x log(x) is nan there (sympy): neither counts."""
    sir, seir = pgpgm.load_model("sir").system, pgpgm.load_model("seir").system
    assert [sir.keeps_sign(i) for i in range(3)] == [True, True, False]
    assert not seir.keeps_sign(seir.states.index("I")) and seir.keeps_sign(seir.states.index("S"))
    odd = pgpgm.ODESystem.from_equations({"x": "a/x", "y": "y*log(y)", "z": "a*z**2 - z*(x + y)"}, ["a"])
    assert [odd.keeps_sign(i) for i in range(3)] == [False, False, True]

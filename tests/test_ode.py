"""CVODE solves against analytic and tight reference solutions; Op gradients; failures."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pgpgm
from pgpgm import ODEOp, ODESolveError, ODESolver, ODESystem, SolverOptions
from tests.conftest import scipy_reference

BACKENDS = pgpgm.available_backends()
TIGHT = SolverOptions(rtol=1e-10, atol=1e-12)


def test_cvode_compiled_backend_is_available_here():
    # scikit-sundae ships SUNDIALS; the compiled backend must be the default.
    assert BACKENDS[0] == "cvode"


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_decay_analytic(backend):
    s = ODESystem.from_equations({"x": "-k*x"}, ["k"])
    t = np.linspace(0, 5, 11)
    x = ODESolver(s, t, backend=backend, options=TIGHT).solve([0.7], [2.0])[:, 0]
    np.testing.assert_allclose(x, 2.0 * np.exp(-0.7 * t), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_harmonic_oscillator_analytic_and_sensitivity(backend):
    s = ODESystem.from_equations({"q": "v", "v": "-w**2*q"}, ["w"])
    t = np.linspace(0, 10, 41)
    w = 1.3
    x, dth, dx0 = ODESolver(s, t, backend=backend, options=TIGHT).solve_sensitivities([w], [1.0, 0.0])
    np.testing.assert_allclose(x[:, 0], np.cos(w * t), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(x[:, 1], -w * np.sin(w * t), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dth[:, 0, 0], -t * np.sin(w * t), rtol=1e-5, atol=1e-7)  # d cos(wt)/dw
    np.testing.assert_allclose(dx0[:, 0, 1], np.sin(w * t) / w, rtol=1e-5, atol=1e-7)  # d q / d v0


@pytest.mark.parametrize("name", ["lotka-volterra", "fitzhugh-nagumo", "protein-transduction"])
def test_published_models_match_tight_scipy(all_models, name):
    spec = all_models[name]
    c = spec.case()
    ref = scipy_reference(spec.system, c.theta, c.x0, c.times)
    for backend in BACKENDS:
        x = ODESolver(spec.system, c.times, backend=backend, options=TIGHT).solve(c.theta, c.x0)
        np.testing.assert_allclose(x, ref, rtol=1e-6, atol=1e-8 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["lotka-volterra", "protein-transduction"])
def test_sensitivities_match_finite_differences(all_models, name):
    spec = all_models[name]
    c = spec.case()
    sol = ODESolver(spec.system, c.times, options=TIGHT)
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
    op = ODEOp(lv.system, c.times, options=TIGHT)
    w = np.random.default_rng(0).normal(size=(c.times.size, 2))
    pytensor.gradient.verify_grad(
        lambda th, x0: (op(th, x0) * w).sum(), [c.theta, c.x0], rng=np.random.default_rng(1), eps=1e-6,
        abs_tol=1e-5, rel_tol=1e-5,
    )


def test_op_in_graph_matches_solver(lv):
    c = lv.case()
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    f = pytensor.function([th, x0], ODEOp(lv.system, c.times)(th, x0))
    np.testing.assert_allclose(f(c.theta, c.x0), ODESolver(lv.system, c.times).solve(c.theta, c.x0))


def test_blow_up_is_reported_not_hung():
    s = ODESystem.from_equations({"x": "x**2"}, [])
    t = np.linspace(0, 2, 5)  # solution 1/(1-t) explodes at t = 1
    for backend in BACKENDS:
        with pytest.raises(ODESolveError):
            ODESolver(s, t, backend=backend, options=SolverOptions(max_steps=500)).solve([], [1.0])
    th = pt.dvector("th")
    op = ODEOp(s, t, on_failure="nan")
    out = pytensor.function([th], op(th, pt.as_tensor([1.0])))(np.zeros(0))
    assert np.isnan(out).all()


def test_bad_inputs():
    s = ODESystem.from_equations({"x": "-k*x"}, ["k"])
    with pytest.raises(pgpgm.DataError, match="duplicates"):
        ODESolver(s, [0, 1, 1])
    with pytest.raises(pgpgm.DataError, match="sorted"):
        ODESolver(s, [0, 2, 1])
    with pytest.raises(pgpgm.DataError, match="NaN"):
        ODESolver(s, [0, np.nan])
    sol = ODESolver(s, [0, 1])
    with pytest.raises(pgpgm.DataError, match="theta must have 1"):
        sol.solve([1, 2], [1])
    with pytest.raises(ValueError, match="unknown backend"):
        ODESolver(s, [0, 1], backend="euler")

"""The ODE Op compiled for PyTensor's numba backend: no object mode, exact values, one solve
per value and gradient, failures as NaN / -inf, and NUTS (PyMC and nutpie) on a model with it."""

import threading
import warnings

import arviz as az
import numba
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pgpgm
from pgpgm import CVODE, LSODA, Integrator, ODEOp, ODESolveError, ODESystem
from pgpgm.solve.numba_op import numba_ode_function

TIGHT = CVODE(rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def decay():
    return ODESystem.from_equations({"x": "-k*x"}, ["k"])


def _value_and_grad(op, x0):
    th = pt.dvector("th")
    x = op(th, pt.as_tensor(x0))
    logp = -0.5 * ((x - 1.0) ** 2).sum()
    return pytensor.function([th], [logp, pytensor.grad(logp, th)], mode="NUMBA")


def _perform_forbidden(monkeypatch):
    """Make the Op's Python ``perform`` (what an object-mode fallback runs) fail loudly."""
    def perform(*args, **kwargs):
        raise AssertionError("ODEOp.perform ran: the numba backend fell back to object mode")

    monkeypatch.setattr(ODEOp, "perform", perform)


def test_numba_mode_compiles_without_object_mode(lv, monkeypatch):
    c = lv.case()
    op = ODEOp(Integrator(lv.system, c.times, TIGHT))
    _perform_forbidden(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numba's "will use object mode" warning would fail here
        f = _value_and_grad(op, c.x0)
        val, grad = f(c.theta)
    assert np.isfinite(val) and np.all(np.isfinite(grad))
    assert any(isinstance(n.op, ODEOp) for n in f.maker.fgraph.apply_nodes)
    assert isinstance(f.maker.linker, pytensor.link.numba.linker.NumbaLinker)


def test_other_solvers_run_in_object_mode_quietly(lv, monkeypatch):
    """The control of the test above: an LSODA Op does fall back, and the detector sees it."""
    c = lv.case()
    op = ODEOp(Integrator(lv.system, c.times, LSODA(rtol=1e-10, atol=1e-12)))
    assert numba_ode_function(op) is None
    th = pt.dvector("th")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no object-mode warning spam either
        f = pytensor.function([th], op(th, pt.as_tensor(c.x0)), mode="NUMBA")
    np.testing.assert_allclose(f(c.theta), Integrator(lv.system, c.times, TIGHT).solve(c.theta, c.x0),
                               rtol=1e-6, atol=1e-8)
    _perform_forbidden(monkeypatch)
    g = pytensor.function([th], op(th, pt.as_tensor(c.x0)) * 2.0, mode="NUMBA")
    with pytest.raises(AssertionError, match="object mode"):
        g(c.theta)


def test_values_equal_the_integrator(lv):
    c = lv.case()
    it = Integrator(lv.system, c.times, TIGHT)
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    plain = pytensor.function([th, x0], ODEOp(it)(th, x0), mode="NUMBA")
    sens = pytensor.function([th, x0], ODEOp(it, sensitivities=True)(th, x0), mode="NUMBA")
    rng = np.random.default_rng(3)
    for _ in range(3):
        theta = c.theta * rng.uniform(0.8, 1.2, c.theta.size)
        start = c.x0 * rng.uniform(0.8, 1.2, c.x0.size)
        np.testing.assert_allclose(plain(theta, start), it.solve(theta, start), rtol=1e-12, atol=1e-12)
        for got, ref in zip(sens(theta, start), it.solve_sensitivities(theta, start)):
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_sensitivities_match_the_analytic_solution(decay):
    """x = x0 exp(-k t): dx/dk = -t x, dx/dx0 = exp(-k t)."""
    t = np.linspace(0.0, 3.0, 13)
    fn = numba_ode_function(ODEOp(Integrator(decay, t, TIGHT), sensitivities=True))
    k, x0 = 0.8, 1.7
    x, dk, dx0 = fn(np.array([k]), np.array([x0]))
    np.testing.assert_allclose(x[:, 0], x0 * np.exp(-k * t), rtol=1e-8)
    np.testing.assert_allclose(dk[:, 0, 0], -t * x0 * np.exp(-k * t), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(dx0[:, 0, 0], np.exp(-k * t), rtol=1e-7)


def test_gradient_matches_finite_differences_and_verify_grad(lv):
    c = lv.case()
    it = Integrator(lv.system, c.times, TIGHT)
    op = ODEOp(it)
    w = np.random.default_rng(0).normal(size=(c.times.size, 2))
    th, x0 = pt.dvector("th"), pt.dvector("x0")
    logp = (op(th, x0) * w).sum()
    f = pytensor.function([th, x0], [logp, *pytensor.grad(logp, [th, x0])], mode="NUMBA")
    _, g_th, g_x0 = f(c.theta, c.x0)
    for k in range(c.theta.size):
        e = np.zeros_like(c.theta); e[k] = 1e-5 * c.theta[k]
        fd = ((it.solve(c.theta + e, c.x0) - it.solve(c.theta - e, c.x0)) * w).sum() / (2 * e[k])
        np.testing.assert_allclose(g_th[k], fd, rtol=1e-5)
    for j in range(c.x0.size):
        e = np.zeros_like(c.x0); e[j] = 1e-5 * c.x0[j]
        fd = ((it.solve(c.theta, c.x0 + e) - it.solve(c.theta, c.x0 - e)) * w).sum() / (2 * e[j])
        np.testing.assert_allclose(g_x0[j], fd, rtol=1e-5)
    pytensor.gradient.verify_grad(lambda a, b: (op(a, b) * w).sum(), [c.theta, c.x0], rng=np.random.default_rng(1),
                                  eps=1e-6, abs_tol=1e-5, rel_tol=1e-5, mode="NUMBA")


def test_sensitivities_to_the_free_initial_values_only(monkeypatch):
    """``x0_free`` solves S (1 + P + F) equations instead of S (1 + P + S): a chain a -> b -> c with
    only b's initial value free gives the parameters' sensitivities and b's column of the full Op's
    (to the solver's tolerance: CVODE's error test sees fewer columns), zeros in a's and c's, compiled
    and in Python (LSODA), and the gradient of a log density matches finite differences."""
    chain = ODESystem.from_equations({"a": "-k1*a", "b": "k1*a - k2*b", "c": "k2*b"}, ["k1", "k2"])
    t = np.linspace(0.0, 4.0, 17)
    theta, x0 = np.array([0.9, 0.4]), np.array([1.0, 0.3, 0.0])
    it = Integrator(chain, t, TIGHT)
    full = numba_ode_function(ODEOp(it, sensitivities=True))(theta, x0)
    for solver in (TIGHT, LSODA(rtol=1e-10, atol=1e-12)):
        op = ODEOp(Integrator(chain, t, solver), sensitivities=True, x0_free=(1,))
        fn = numba_ode_function(op)
        if fn is None:  # LSODA: the Op's Python perform
            out = [[None], [None], [None]]
            op.perform(None, [theta, x0], out)
            fn_out = [o[0] for o in out]
        else:
            fn_out = fn(theta, x0)
        x, dth, dx0 = fn_out
        np.testing.assert_allclose(x, full[0], rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(dth, full[1], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(dx0[:, :, 1], full[2][:, :, 1], rtol=1e-6, atol=1e-9)
        assert np.all(dx0[:, :, [0, 2]] == 0.0)
    w = np.random.default_rng(2).normal(size=(t.size, 3))
    th = pt.dvector("th")
    b0 = pt.dscalar("b0")
    xv = pt.stack([pt.constant(1.0), b0, pt.constant(0.0)])
    logp = (ODEOp(it, x0_free=(1,))(th, xv) * w).sum()
    f = pytensor.function([th, b0], [logp, *pytensor.grad(logp, [th, b0])], mode="NUMBA")
    _, g_th, g_b0 = f(theta, 0.3)
    value = lambda th_, b: (it.solve(th_, np.array([1.0, b, 0.0])) * w).sum()
    for k in range(2):
        e = np.zeros(2); e[k] = 1e-5
        np.testing.assert_allclose(g_th[k], (value(theta + e, 0.3) - value(theta - e, 0.3)) / 2e-5, rtol=1e-5)
    np.testing.assert_allclose(g_b0, (value(theta, 0.3 + 1e-5) - value(theta, 0.3 - 1e-5)) / 2e-5, rtol=1e-5)
    assert ODEOp(it, x0_free=(0, 1, 2)) == ODEOp(it)  # every entry: the default Op
    for bad in ((1, 0), (3,), (1, 1)):
        with pytest.raises(ValueError, match="x0_free"):
            ODEOp(it, x0_free=bad)


def test_the_ode_model_solves_for_its_free_initial_values_only():
    """``build_ode_model`` gives the Op the indices of the initial values it samples: an observed
    state's (a Normal around its first measurement) and an unknown latent one's, not the known ones'."""
    chain = ODESystem.from_equations({"a": "-k1*a", "b": "k1*a - k2*b", "c": "k2*b"}, ["k1", "k2"])
    t = np.linspace(0.0, 4.0, 12)
    y = np.exp(-0.9 * t) + 0.01
    model, _ = pgpgm.build_ode_model(chain, {"time": t, "a": y}, ["a"], x0={"b": (0.0, 2.0), "c": 0.0},
                                     priors=(0.0, 5.0), noise_sd=[0.01])
    ops = {v.owner.op.x0_free for v in pytensor.graph.traversal.ancestors([model.logp()]) if v.owner
           and isinstance(v.owner.op, ODEOp)}
    assert ops == {(0, 1)}


def test_value_and_gradient_cost_one_solve(lv):
    c = lv.case()
    it = Integrator(lv.system, c.times, TIGHT)
    f = _value_and_grad(ODEOp(it), c.x0)
    nodes = [n for n in f.maker.fgraph.apply_nodes if isinstance(n.op, ODEOp)]
    assert len(nodes) == 1 and nodes[0].op.sensitivities
    n0, c0 = it.n_solves, int(it.compiled_solves[0])
    for s in (1.0, 1.01, 0.99, 1.02, 0.98):
        f(c.theta * s)
    assert it.n_solves - n0 == 5 and int(it.compiled_solves[0]) - c0 == 5
    it.solve(c.theta * 1.5, c.x0)  # Python solves add to the same count
    assert it.n_solves - n0 == 6


def test_failed_solve_is_nan_or_minus_inf_or_raises():
    blow = ODESystem.from_equations({"x": "a*x**2"}, ["a"])  # 1 / (1 - a t) explodes at t = 1/a
    t = np.linspace(0.0, 2.0, 5)
    it = Integrator(blow, t, CVODE(max_steps=500))
    th = pt.dvector("th")
    x = ODEOp(it, on_failure="nan")(th, pt.as_tensor([1.0]))
    logp = pt.switch(pt.all(pt.isfinite(x)), -0.5 * (x**2).sum(), -np.inf)
    f = pytensor.function([th], [x, logp], mode="NUMBA")
    out, lp = f(np.array([1.0]))
    assert np.isnan(out).all() and lp == -np.inf
    out, lp = f(np.array([0.2]))  # 1 / (1 - 0.2 t) stays finite up to t = 2
    np.testing.assert_allclose(out[:, 0], 1.0 / (1.0 - 0.2 * t), rtol=1e-6)
    np.testing.assert_allclose(lp, -0.5 * np.sum(1.0 / (1.0 - 0.2 * t) ** 2), rtol=1e-6)
    out, lp = f(np.array([np.nan]))  # non-finite parameters: no solve, NaN
    assert np.isnan(out).all() and lp == -np.inf
    raising = pytensor.function([th], ODEOp(it)(th, pt.as_tensor([1.0])), mode="NUMBA")
    with pytest.raises(ODESolveError, match="CVODE failed"):
        raising(np.array([1.0]))
    with pytest.raises(pgpgm.DataError):
        raising(np.array([1.0, 2.0]))


def test_concurrent_calls_from_threads_are_independent(lv):
    """nutpie calls the compiled log density from several threads at once: each call owns its solver."""
    c = lv.case()
    fn = numba_ode_function(ODEOp(Integrator(lv.system, c.times, TIGHT), sensitivities=True))

    @numba.njit(nogil=True)
    def repeat(thetas, x0, out):
        for r in range(thetas.shape[0]):
            out[r] = fn(thetas[r], x0)[1]

    rng = np.random.default_rng(5)
    thetas = [c.theta * rng.uniform(0.8, 1.2, (20, c.theta.size)) for _ in range(4)]
    serial = [np.stack([fn(th, c.x0)[1] for th in block]) for block in thetas]
    outs = [np.empty_like(s) for s in serial]
    workers = [threading.Thread(target=repeat, args=(th, c.x0, o)) for th, o in zip(thetas, outs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for got, ref in zip(outs, serial):
        np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------- NUTS on a model with the Op
T_OBS = np.linspace(0.0, 4.0, 21)
K_TRUE, X0, SD = 0.7, 2.0, 0.1


@pytest.fixture(scope="module")
def decay_model(decay):
    """Exponential decay x0 exp(-k t) observed with known noise; prior k ~ LogNormal(0, 1)."""
    y = X0 * np.exp(-K_TRUE * T_OBS) + SD * np.random.default_rng(0).normal(size=T_OBS.size)
    it = Integrator(decay, T_OBS, TIGHT)
    with pm.Model() as model:
        k = pm.LogNormal("k", 0.0, 1.0)
        x = ODEOp(it, on_failure="nan")(pt.stack([k]), pt.as_tensor([X0]))
        pm.Normal("y", x[:, 0], SD, observed=y)
    # the exact posterior of k by quadrature (analytic solution, independent of CVODE)
    grid = np.linspace(0.4, 1.1, 20001)
    log_post = (-0.5 * (((y[None, :] - X0 * np.exp(-grid[:, None] * T_OBS[None, :])) / SD) ** 2).sum(axis=1)
                - np.log(grid) - 0.5 * np.log(grid) ** 2)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    mean = float(w @ grid)
    sd = float(np.sqrt(w @ (grid - mean) ** 2))
    return model, it, mean, sd


def _check_posterior(idata, mean, sd):
    k = idata.posterior["k"]
    mcse_mean = float(az.mcse(idata, var_names=["k"])["k"])
    assert abs(float(k.mean()) - mean) < 4 * mcse_mean + 1e-4 * sd, (float(k.mean()), mean, mcse_mean)
    assert abs(float(k.std()) / sd - 1) < 0.1, (float(k.std()), sd)
    assert int(idata.sample_stats["diverging"].sum()) == 0


def test_pymc_nuts_on_a_model_with_the_op(decay_model):
    model, it, mean, sd = decay_model
    n0 = it.n_solves
    with model:
        idata = pm.sample(draws=1000, tune=500, chains=2, cores=1, random_seed=1, nuts_sampler="pymc",
                          progressbar=False, compute_convergence_checks=False)
    _check_posterior(idata, mean, sd)
    assert it.n_solves - n0 > 1000  # the compiled solves are counted


def test_nutpie_on_a_model_with_the_op(decay_model):
    nutpie = pytest.importorskip("nutpie")
    model, it, mean, sd = decay_model
    compiled = nutpie.compile_pymc_model(model)
    n0 = it.n_solves
    idata = nutpie.sample(compiled, draws=1000, tune=500, chains=2, cores=2, seed=1, progress_bar=False)
    _check_posterior(idata, mean, sd)
    assert it.n_solves - n0 > 1000
    with model:  # the same through PyMC's front door
        idata = pm.sample(draws=1000, tune=500, chains=2, cores=2, random_seed=2, nuts_sampler="nutpie",
                          progressbar=False)
    _check_posterior(idata, mean, sd)

"""Step 2: the PyMC density against an independent numpy formula, and the sampler."""

import arviz as az
import numpy as np
import pymc as pm
import pytest
from pymc.model.transform.conditioning import remove_value_transforms
from scipy import stats

import pgpgm
from pgpgm import DataError, Integrator, ODESystem, build_model, gradient_matching_density, sample
from pgpgm.refinement import LeastSquaresProblem, refine
from tests.conftest import scipy_reference

CASES = [("lotka-volterra", "x1-observed"), ("fitzhugh-nagumo", "R-observed"), ("protein-transduction", "S-R-latent")]


def _data(spec, case, seed=1):
    c = spec.case(case)
    return c, pgpgm.simulate(spec.system, c.theta, c.x0, c.times, observed=c.observed,
                             noise_sd=c.noise_sd, snr=c.snr, seed=seed)


def _numpy_logp(setup, theta, xM, bounds):
    """METHOD.md's density written out independently (up to the same constants)."""
    system, t = setup.system, setup.obs.times
    X = np.zeros((t.size, system.n_states))
    X[:, list(setup.observed_idx)] = xM
    if setup.latent:
        x0 = setup.x0.copy()
        x0[list(setup.observed_idx)] = xM[0]
        X[:, list(setup.latent_idx)] = scipy_reference(system, theta, x0, t)[:, list(setup.latent_idx)]
    F = setup.system.rhs_on_grid(t, X, theta)
    lp = np.sum(-np.log(bounds[:, 1] - bounds[:, 0]))
    for m, term in enumerate(setup.terms):
        g = term.matching
        u = xM[:, m] - g.mean
        lp += -0.5 * u @ np.linalg.solve(g.C, u)
        lp += stats.norm.logpdf(setup.obs.values[:, m], xM[:, m], setup.noise_sd[m]).sum()
        r = F[:, setup.observed_idx[m]] - g.D @ u
        lp += -0.5 * r @ np.linalg.solve(g.A + setup.gamma * np.eye(t.size), r)
    return lp


@pytest.mark.parametrize("name,case", CASES)
def test_model_logp_matches_numpy_formula(all_models, name, case):
    spec = all_models[name]
    c, ds = _data(spec, case)
    setup = gradient_matching_density(spec.system, ds, c.observed, kernel=c.kernel, gamma=c.gamma,
                                      priors={p: tuple(b) for p, b in zip(spec.system.parameters, c.prior_bounds)})
    model = setup.model()
    logp = remove_value_transforms(model).compile_logp()
    rng = np.random.default_rng(0)
    base = setup.gp_posterior_means()
    vals = []
    for _ in range(3):
        theta = c.theta * rng.uniform(0.9, 1.1, c.theta.size)
        xM = base + rng.normal(0, 0.02, base.shape) * np.abs(base).max(axis=0)
        pt_ = {p: theta[j] for j, p in enumerate(spec.system.parameters)}
        pt_.update({s: xM[:, m] for m, s in enumerate(setup.obs.states)})
        vals.append((logp(pt_), _numpy_logp(setup, theta, xM, c.prior_bounds)))
    vals = np.array(vals)
    # equal up to one additive constant (pymc's Flat and our dropped normalisers)
    diffs = vals[:, 0] - vals[:, 1]
    np.testing.assert_allclose(diffs - diffs[0], 0, atol=1e-6 * np.abs(vals).max())


def test_one_compiled_graph_serves_every_data_set_with_its_own_numbers(fhn):
    """Issue 12 (compilation paid once): the density's data, noise and GP matrices are pm.Data,
    so a second data set of the same model (same times) reuses the first one's compiled code -
    no numba compilation at all - and its log density is that data set's (the numpy formula),
    not the first one's."""
    from numba.core import event

    c = fhn.case("R-observed")
    bounds = np.asarray(c.prior_bounds, float)
    priors = {p: tuple(b) for p, b in zip(fhn.system.parameters, bounds)}
    values = []
    for seed in (1, 2):  # other data and another GP seed: different values in every matrix
        _, ds = _data(fhn, "R-observed", seed=seed)
        setup = gradient_matching_density(fhn.system, ds, c.observed, kernel=c.kernel, gamma=c.gamma, priors=priors,
                                          seed=seed)
        with event.install_recorder("numba:compile") as rec:
            target = pgpgm.GradientMatchingTarget(setup)
            xM = setup.gp_posterior_means()
            X = np.zeros((c.times.size, 2))
            X[:, 1] = xM[:, 0]
            lp = target.evaluate_model(c.theta, X)[0]
        compiles = sum(1 for _, e in rec.buffer if e.is_start)
        values.append((lp, _numpy_logp(setup, c.theta, xM, bounds), compiles))
    (lp1, ref1, _), (lp2, ref2, compiles2) = values
    assert compiles2 == 0
    assert abs(lp2 - lp1) > 1.0  # the two data sets' densities differ, and each is its own
    # the latent state from CVODE (rtol 1e-8) against the DOP853 reference (1e-12): ~1e-8 relative
    assert lp1 == pytest.approx(ref1, rel=1e-7) and lp2 == pytest.approx(ref2, rel=1e-7)


def test_model_is_an_ordinary_pymc_model(lv):
    c, ds = _data(lv, "x2-observed")
    model = build_model(lv.system, ds, ["x2"])
    assert {v.name for v in model.free_RVs} == {"theta1", "theta2", "theta3", "theta4", "x2"}
    assert [d.name for d in model.deterministics] == ["x1"]
    assert {p.name for p in model.potentials} == {"gp_prior", "gradient_matching"}
    assert [o.name for o in model.observed_RVs] == ["y_x2"]
    lp = model.point_logps(model.initial_point())
    assert np.isfinite(lp["gradient_matching"])


def test_failed_latent_solve_gives_minus_inf(lv):
    c, ds = _data(lv, "x1-observed")
    density = gradient_matching_density(lv.system, ds, ["x1"], priors=(-1e6, 1e6))
    logp = remove_value_transforms(density.model()).compile_logp()
    xM = density.gp_posterior_means()
    pt_ = {"theta1": 0.0, "theta2": -400.0, "theta3": 0.0, "theta4": 400.0, "x1": xM[:, 0]}
    assert logp(pt_) == -np.inf


def test_all_states_observed_is_fgpgm_without_ode(lv, monkeypatch):
    c = lv.case()
    ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, noise_sd=0.1, seed=2)
    density = gradient_matching_density(lv.system, ds, ["x1", "x2"])
    assert density.integrator is None and not density.model().deterministics

    def no_solve(*a, **k):
        raise AssertionError("FGPGM must not solve the ODE")

    monkeypatch.setattr(Integrator, "_run", no_solve)
    tree = sample(density, draws=200, tune=200, chains=1, cores=1, progressbar=False)
    assert tree.posterior["theta1"].shape == (1, 200)


def _gaussian_case():
    """dx/dt = theta, all observed: the density is jointly Gaussian in (x, theta)."""
    system = ODESystem.from_equations({"x": "theta"}, ["theta"], name="drift")
    t = np.linspace(0, 2, 8)
    y = 0.5 + 0.8 * t + np.random.default_rng(5).normal(0, 0.1, t.size)
    density = gradient_matching_density(system, {"time": t, "x": y}, ["x"], gamma=1.0, noise_sd=0.1,
                                        priors=(-50, 50))
    g, P = density.terms[0].matching, density.terms[0].grad_precision
    one = np.ones(t.size)
    # log p = -1/2 u'C^-1 u - |y - mu - u|^2/(2 s^2) - 1/2 (theta 1 - D u)' P (theta 1 - D u), u = x - mu
    n = t.size
    Lam = np.zeros((n + 1, n + 1))
    Lam[:n, :n] = g.C_precision + np.eye(n) / 0.1**2 + g.D.T @ P @ g.D
    Lam[:n, n] = Lam[n, :n] = -g.D.T @ P @ one
    Lam[n, n] = one @ P @ one
    b = np.zeros(n + 1)
    b[:n] = (y - g.mean) / 0.1**2
    cov = np.linalg.inv(Lam)
    mean = cov @ b
    return density, mean[n], cov[n, n], mean[:n] + g.mean


@pytest.mark.parametrize("seed", [0, 1])
def test_elementwise_sampler_matches_known_gaussian_posterior(seed):
    density, m_theta, v_theta, m_x = _gaussian_case()
    # Started in the bulk so that the test measures the stationary distribution, not
    # the burn-in transient (from theta = 0 the chain needs more than 1000 iterations).
    tree = sample(density, draws=4000, tune=1000, chains=2, seed=seed, progressbar=False, init=[m_theta + 0.3],
                  scheme="elementwise", cores=1)
    th = tree.posterior["theta"]
    ess = float(az.ess(tree, var_names=["theta"])["theta"])
    assert ess > 100
    # Monte Carlo error of the mean is sd/sqrt(ESS); allow 4 of them.
    assert abs(float(th.mean()) - m_theta) < 4 * np.sqrt(v_theta / ess)
    # the variance estimate's relative sd is about sqrt(2/ESS)
    assert abs(float(th.var()) / v_theta - 1) < 4 * np.sqrt(2 / ess)
    x = tree.posterior["x"].mean(("chain", "draw")).values
    assert np.max(np.abs(x - m_x)) < 0.05


def test_elementwise_sampler_is_reproducible_and_reports_acceptance(lv):
    c, ds = _data(lv, "x1-observed")
    density = gradient_matching_density(lv.system, ds, ["x1"], priors=(0, 10))
    a = sample(density, draws=50, tune=50, chains=2, seed=11, progressbar=False, scheme="elementwise", cores=1)
    b = sample(density, draws=50, tune=50, chains=2, seed=11, progressbar=False, scheme="elementwise", cores=1)
    np.testing.assert_array_equal(a.posterior["theta1"].values, b.posterior["theta1"].values)
    assert set(a.sample_stats.data_vars) >= {"lp", "accept_x", "accept_theta"}
    assert 0 < float(a.sample_stats["accept_x"].mean()) < 1
    assert "y_x1" in a.observed_data and "pgpgm_settings" in a.attrs
    assert a.posterior["x2"].dims == ("chain", "draw", "time")


@pytest.mark.slow  # an accuracy run (20-35 s on 2 cores): ./run.sh test --slow
def test_lotka_volterra_posterior_near_least_squares_optimum(lv):
    c, ds = _data(lv, "x1-observed")
    density = gradient_matching_density(lv.system, ds, ["x1"], gamma=c.gamma, priors=(0, 10))
    # the published budget: 3500 iterations per chain (1500 burn-in)
    tree = sample(density, draws=2000, tune=1500, chains=2, seed=3, init="prior-median", progressbar=False, cores=1)
    post = np.array([float(tree.posterior[p].mean()) for p in lv.system.parameters])
    prob = LeastSquaresProblem(Integrator(lv.system, c.times), ds.y.values, [0], [0.1], c.x0)
    opt = refine(prob, c.theta).theta
    # With x2 latent the gradient-matching posterior has a long ridge (theta1 theta3 and
    # theta2 theta4 trade off; its marginal sd of log theta1 is about 0.35 and its mean sits
    # up to 30 % from the optimum along the ridge), so the posterior mean lands within 40 %.
    np.testing.assert_allclose(post, opt, rtol=0.4)
    # ... which is inside the optimum's basin: least squares from there reaches it.
    np.testing.assert_allclose(refine(prob, post).theta, opt, rtol=1e-4)


def test_bad_inputs(lv):
    c, ds = _data(lv, "x1-observed")
    with pytest.raises(pgpgm.ModelDefinitionError, match="unknown state"):
        build_model(lv.system, ds, ["x9"])
    with pytest.raises(DataError, match="latent states \\['x2'\\]"):
        build_model(lv.system, {"time": c.times, "x1": ds.y.values[:, 0]}, ["x1"])
    with pytest.raises(DataError, match="gamma"):
        build_model(lv.system, ds, ["x1"], gamma=-1)
    with pytest.raises(DataError, match="x1 has 2 measurement"):  # NaN is "not measured": too few left
        build_model(lv.system, {"time": c.times, "x1": np.r_[np.full(c.times.size - 2, np.nan), 1.0, 2.0]}, ["x1"],
                    x0=c.x0)
    with pytest.raises(DataError, match="duplicates"):
        build_model(lv.system, {"time": np.r_[0, c.times[:-1]], "x1": ds.y.values[:, 0]}, ["x1"], x0=c.x0)
    with pytest.raises(DataError, match="not states"):
        build_model(lv.system, {"time": c.times, "z": ds.y.values[:, 0]}, ["x1"], x0=c.x0)
    with pytest.raises(DataError, match="unknown parameters"):
        build_model(lv.system, ds, ["x1"], priors={"k": (0, 1)})


def test_extra_terms_in_states_are_refused_and_terms_on_parameters_honoured(lv):
    c, ds = _data(lv, "x1-observed")
    density = gradient_matching_density(lv.system, ds, ["x1"], priors=(0, 10))
    model = density.model()
    with model:
        pm.Potential("extra", -0.5 * (model["x1"] ** 2).sum())
    with pytest.raises(pgpgm.PgpgmError, match="terms \\['extra'\\] on the observed states"):
        pgpgm.GradientMatchingTarget(density, model)
    # a term on a parameter is part of the target: its log density moves by that term exactly
    model = density.model()
    with model:
        pm.Potential("pin", -0.5 * ((model["theta1"] - 2.0) / 0.01) ** 2)
    plain, pinned = pgpgm.GradientMatchingTarget(density), pgpgm.GradientMatchingTarget(density, model)
    X = np.zeros((c.times.size, 2))
    X[:, 0] = density.gp_posterior_means()[:, 0]
    q = np.array([2.1, 1.0, 4.0, 1.0])
    assert pinned.evaluate(q, X)[0] - plain.evaluate(q, X)[0] == pytest.approx(-0.5 * (0.1 / 0.01) ** 2)
    tree = sample(pinned, draws=300, tune=300, chains=1, seed=0, progressbar=False, init=[2.0, 1.0, 4.0, 1.0], cores=1)
    assert abs(float(tree.posterior["theta1"].mean()) - 2.0) < 0.03


def test_pymc_step_method_matches_known_gaussian_posterior():
    density, m_theta, v_theta, m_x = _gaussian_case()
    with density.model():
        tree = pm.sample(draws=3000, tune=1000, chains=2, cores=1, step=pgpgm.GradientMatchingStep(density=density),
                         initvals=density.initial_point([m_theta + 0.3]), random_seed=4,
                         progressbar=False, compute_convergence_checks=False)
    th = tree.posterior["theta"]
    ess = float(az.ess(tree, var_names=["theta"])["theta"])
    assert ess > 100
    assert abs(float(th.mean()) - m_theta) < 4 * np.sqrt(v_theta / ess)
    assert abs(float(th.var()) / v_theta - 1) < 4 * np.sqrt(2 / ess)
    # every chain moves (per-chain state is reset between chains)
    assert np.all(tree.sample_stats["accept_x"].mean("draw").values > 0.2)


def test_a_start_with_no_density_names_the_cause(lv):
    c, ds = _data(lv, "x1-observed")
    boxed = gradient_matching_density(lv.system, ds, ["x1"], priors=(0, 10))
    with pytest.raises(pgpgm.PgpgmError, match="theta1 = 11 is outside its prior's support"):
        sample(boxed, draws=5, tune=5, chains=1, init=[11.0, 1, 4, 1], progressbar=False)
    wide = gradient_matching_density(lv.system, ds, ["x1"], priors=(-1e6, 1e6))
    with pytest.raises(pgpgm.PgpgmError, match="latent-state solve fails there") as info:
        sample(wide, draws=5, tune=5, chains=1, init=[0.0, -400.0, 0.0, 400.0], progressbar=False)
    assert "prior" not in str(info.value)


# ------------------------------------------------------------------ compiled functions shared across fits (issue 12)
_REUSE_FIT = dict(draws=150, tune=150, chains=2, stop="never", posterior=None, progressbar=False)
_REUSE_SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
import numpy as np
import pgpgm
spec = pgpgm.load_model("lotka-volterra")
c = spec.case("x1-observed")
data = spec.simulate("x1-observed", seed=int(sys.argv[2]))
r = pgpgm.fit(spec.system, data, c.observed, kernel=c.kernel, gamma=c.gamma, priors=spec.priors("x1-observed"),
              **{opts})
gm = r.gradient_matching
np.savez(sys.argv[1], **{{p: gm.posterior[p].values for p in spec.system.parameters}}, lp=gm.sample_stats["lp"].values,
         refined=r.estimates.theta.sel(estimate="refined").values, solves=r.n_ode_solves["sampling"])
"""


@pytest.mark.filterwarnings("ignore::pgpgm.errors.ConvergenceWarning")  # 300 iterations: numbers, not a posterior
@pytest.mark.slow  # CI checks the compiled kernels' reuse across processes in test_kernel_cache
def test_second_fit_of_a_model_compiles_nothing_and_matches_a_fresh_process(lv, tmp_path, monkeypatch):
    """Issue 12: a second fit of the same model (other data) in one process builds no PyTensor
    graph (no Apply node) and compiles no function (no FunctionMaker), and its numbers are
    those of the same fit in a fresh process, to the bit."""
    import subprocess
    import sys

    import pytensor.compile.maker as maker
    from pytensor.graph.basic import Apply

    c = lv.case("x1-observed")
    opts = dict(kernel=c.kernel, gamma=c.gamma, priors=lv.priors("x1-observed"), **_REUSE_FIT)
    pgpgm.fit(lv.system, lv.simulate("x1-observed", seed=3), c.observed, **opts)  # the first fit compiles
    counts = {"apply": 0, "function": 0}
    apply_init, maker_init = Apply.__init__, maker.FunctionMaker.__init__

    def counted_apply(self, *a, **k):
        counts["apply"] += 1
        apply_init(self, *a, **k)

    def counted_maker(self, *a, **k):
        counts["function"] += 1
        maker_init(self, *a, **k)

    monkeypatch.setattr(Apply, "__init__", counted_apply)
    monkeypatch.setattr(maker.FunctionMaker, "__init__", counted_maker)
    r = pgpgm.fit(lv.system, lv.simulate("x1-observed", seed=4), c.observed, **opts)
    monkeypatch.undo()
    assert counts == {"apply": 0, "function": 0}
    out = tmp_path / "fresh.npz"
    script = _REUSE_SCRIPT.format(opts=repr(_REUSE_FIT))
    done = subprocess.run([sys.executable, "-c", script, str(out), "4"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = np.load(out)
    gm = r.gradient_matching
    for p in lv.system.parameters:
        np.testing.assert_array_equal(gm.posterior[p].values, fresh[p])
    np.testing.assert_array_equal(gm.sample_stats["lp"].values, fresh["lp"])
    np.testing.assert_array_equal(r.estimates.theta.sel(estimate="refined").values, fresh["refined"])
    assert r.n_ode_solves["sampling"] == int(fresh["solves"]) > 2 * 4 * 300  # every block proposal counted


def test_other_settings_get_their_own_compiled_function(lv):
    """A density whose parameter part differs (priors, observed state, known initial value, grid)
    gets its own compiled function - its terms are the numpy formula's (Uniform priors) and its
    latent states the reference solve's - while equal settings on other data share one, each
    counting its own solves."""
    from tests.conftest import scipy_reference

    c = lv.case("x1-observed")
    theta = np.array(c.theta, float)

    def target(seed=1, observed=("x1",), priors=(0.0, 10.0), x0=None, every=1):
        ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, noise_sd=0.1, seed=seed)
        return pgpgm.GradientMatchingTarget(gradient_matching_density(
            lv.system, ds.isel(time=slice(None, None, every)), list(observed), priors=priors, x0=x0))

    def gp_start(t):
        d = t.density
        X = np.zeros((d.obs.times.size, 2))
        X[:, list(d.observed_idx)] = d.gp_posterior_means()
        return X

    base = target()
    others = {"priors": target(priors=(0.0, 5.0)), "observed": target(observed=("x2",)),
              "x0": target(x0={"x2": 2.5}), "grid": target(every=2)}
    parts = [base.parameters] + [t.parameters for t in others.values()]
    assert len({id(p) for p in parts}) == len(parts)  # no stale reuse
    for name, t in [("base", base), *others.items()]:
        d, X = t.density, gp_start(t)
        lp, th, lat = t.parameter_part(theta, X)
        lo, hi = d.priors.bounds.T
        # PyTensor folds -log(upper - lower) of bounds given as Python floats in float32
        assert lp == pytest.approx(-np.sum(np.log(hi - lo)), rel=1e-7), name
        np.testing.assert_array_equal(th, theta)
        x0 = d.x0.copy()
        x0[list(d.observed_idx)] = X[0, list(d.observed_idx)]
        ref = scipy_reference(lv.system, theta, x0, d.obs.times)[:, list(d.latent_idx)]
        np.testing.assert_allclose(lat, ref, rtol=1e-6, atol=1e-8, err_msg=name)
    outside = np.array([7.0, 1, 4, 1])  # theta1 outside (0, 5), inside (0, 10)
    assert others["priors"].parameter_part(outside, gp_start(base))[0] == -np.inf
    assert np.isfinite(base.parameter_part(outside, gp_start(base))[0])
    again = target(seed=2)  # other data, equal settings: the compiled function is shared
    assert again.parameters is base.parameters
    X = gp_start(again)
    n0 = again.density.integrator.n_solves
    for k in range(3):
        again.parameter_part(theta * (1 + 0.01 * k), X)
    assert again.density.integrator.n_solves - n0 == 3


def test_shared_prior_draws_are_pymc_draws(lv):
    """The chains' prior-draw starts come from a function compiled once; they are the numbers
    pm.draw gives for the same generator."""
    c, ds = _data(lv, "x1-observed")
    d = gradient_matching_density(lv.system, ds, ["x1"], priors=(0.0, 10.0), x0={"x2": (0.0, 8.0)})
    target = pgpgm.GradientMatchingTarget(d)
    m = remove_value_transforms(d.model())
    names = (*lv.system.parameters, "x2_0")
    for seed in (0, 1):
        want = pm.draw([m[p] for p in names], random_seed=np.random.default_rng(seed), mode="FAST_COMPILE")
        np.testing.assert_array_equal(target.parameters.draw(np.random.default_rng(seed)), np.array(want, float))
    np.testing.assert_array_equal(target.parameters.initial_point, [5.0] * 4 + [4.0])

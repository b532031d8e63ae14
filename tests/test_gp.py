"""Step 1: kernels, derivative covariances, hyperparameter fit, D and A."""

import pickle

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
from scipy import optimize

from pgpgm import DataError, ModelDefinitionError
from pgpgm.gp import GPFit, Hyperparameter, Kernel, Scaled, TimeGrid, fit_gp, gradient_matching
from pgpgm.gp.hyperparameters import negative_log_marginal_likelihood
from pgpgm.gp.kernels import _PAIRS_MIN_POINTS, KERNELS

HYPER = {"rbf": [1.3, 0.7], "matern52": [0.8, 1.1], "sigmoid": [1.5, 0.4, 2.0]}
USER = Kernel.from_expression(
    "rq", "variance*(1 + (a-b)**2/(2*al*l**2))**(-al)",
    ["variance", Hyperparameter.lengthscale("l"), Hyperparameter("al", bounds=(0.1, 100.0), guess=1.0)])
ALL = {**KERNELS, "rq": USER, "rbf+matern52": KERNELS["rbf"] + KERNELS["matern52"]}  # the sum: two variances
ALL_HYPER = {**HYPER, "rq": [1.1, 0.6, 2.0], "rbf+matern52": [1.3, 0.7, 0.8, 1.1]}


@pytest.mark.parametrize("name", ["rbf", "matern52", "sigmoid", "rq"])
def test_derivative_covariances_match_finite_differences(name):
    kern, hyper = ALL[name], ALL_HYPER[name]
    ta = np.array([0.0, 0.3, 1.0, 2.5])
    tb = np.array([0.0, 0.2, 1.0, 3.0])  # includes a = b points
    C, Ca, Cb, Cab = kern.cov_grad(ta, tb, hyper)
    h = 1e-5
    k = lambda a, b: kern.cov(a, b, hyper)  # noqa: E731
    np.testing.assert_allclose(C, k(ta, tb), rtol=1e-14)
    np.testing.assert_allclose(Ca, (k(ta + h, tb) - k(ta - h, tb)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(Cb, (k(ta, tb + h) - k(ta, tb - h)) / (2 * h), rtol=1e-6, atol=1e-8)
    h2 = 1e-4
    fd2 = (k(ta + h2, tb + h2) - k(ta + h2, tb - h2) - k(ta - h2, tb + h2) + k(ta - h2, tb - h2)) / (4 * h2 * h2)
    np.testing.assert_allclose(Cab, fd2, rtol=1e-4, atol=1e-5)
    # the same matrices filled in blocks of 2 rows (as large grids are)
    for full, blocked in zip((C, Ca, Cb, Cab), kern._run(kern._f_time, ta, tb, hyper, block=2)):
        np.testing.assert_allclose(blocked, full, rtol=1e-13, atol=1e-15)
    # dK/dh against central differences in each hyperparameter, on an uneven grid (pairwise
    # differences), an even one (Toeplitz from the lags for stationary kernels) and in the
    # lower-triangle form the fit uses (row blocks of 2 to cross block boundaries)
    for t in (np.array([0.0, 0.4, 1.1, 2.0, 3.5]), np.linspace(0.3, 3.3, 7)):
        K, dK = kern.cov_with_hyper_grads(t, hyper)
        np.testing.assert_allclose(K, kern.cov(t, t, hyper), rtol=1e-13)
        for j in range(len(hyper)):
            up, dn = np.array(hyper, float), np.array(hyper, float)
            up[j] += 1e-6 * hyper[j]
            dn[j] -= 1e-6 * hyper[j]
            fd = (kern.cov(t, t, up) - kern.cov(t, t, dn)) / (2e-6 * hyper[j])
            np.testing.assert_allclose(dK[j], fd, rtol=1e-6, atol=1e-9)
        lower = kern._run(kern._f_hyper, t, t, hyper, lower=True, block=2)
        for full, low in zip([K, *dK], lower):
            np.testing.assert_allclose(np.tril(low), np.tril(full), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["rbf", "matern52", "sigmoid", "rq", "rbf+matern52"])
@pytest.mark.parametrize("fixed_noise", [None, 0.2])
@pytest.mark.parametrize("grid", ["uneven", "even"])
def test_likelihood_gradient_matches_finite_differences(name, fixed_noise, grid):
    # The analytic gradient (trace terms from the Cholesky factor) against central
    # differences of the negative log marginal likelihood, at random points of the log box.
    kern = ALL[name]
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 6, 40)) if grid == "uneven" else np.linspace(0, 6, 40)
    z = np.sin(t) + rng.normal(0, 0.1, t.size)
    z = (z - z.mean()) / z.std()
    H = len(kern.hyperparameters)
    for _ in range(3):
        lp = np.log(rng.uniform(0.3, 2.0, H + (fixed_noise is None)))
        f, g = negative_log_marginal_likelihood(lp, kern, t, z, fixed_noise)
        noise = fixed_noise if fixed_noise is not None else np.exp(lp[H])
        K = kern.cov(t, t, np.exp(lp[:H])) + (noise**2 + 1e-8) * np.eye(t.size)  # dense, pairwise
        assert f == pytest.approx(0.5 * z @ np.linalg.solve(K, z) + 0.5 * np.linalg.slogdet(K)[1]
                                  + 0.5 * t.size * np.log(2 * np.pi), rel=1e-9)
        fd = np.empty_like(g)
        for j in range(lp.size):
            e = np.zeros_like(lp)
            e[j] = 1e-6
            fd[j] = (negative_log_marginal_likelihood(lp + e, kern, t, z, fixed_noise)[0]
                     - negative_log_marginal_likelihood(lp - e, kern, t, z, fixed_noise)[0]) / 2e-6
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6 * max(1.0, abs(f)))


def _independent_nll(y, t, variance, lengthscale, noise, jitter):
    """-log N(y | mean(y), K) in the state's units, RBF kernel, dense numpy (no Cholesky)."""
    r = y - y.mean()
    K = variance * np.exp(-0.5 * (t[:, None] - t[None, :]) ** 2 / lengthscale**2) + (noise**2 + jitter) * np.eye(t.size)
    sign, logdet = np.linalg.slogdet(K)
    assert sign > 0
    return 0.5 * r @ np.linalg.solve(K, r) + 0.5 * logdet + 0.5 * t.size * np.log(2 * np.pi)


def test_fixed_noise_is_respected():
    # Data with noise sd 0.05, fitted with the noise fixed at 0.2: the hyperparameters must be the
    # maximum of the likelihood *at noise 0.2*, found here by an independent dense computation
    # and Nelder-Mead from other starts. Fitting the noise instead moves the optimum far away.
    t = np.linspace(0, 5, 30)
    y = np.sin(t) + np.random.default_rng(1).normal(0, 0.05, t.size)
    fit = fit_gp(t, y, "rbf", noise_sd=0.2)
    free = fit_gp(t, y, "rbf")
    assert fit.noise_sd == 0.2 and fit.noise_fixed and not free.noise_fixed
    jitter = 1e-8 * y.var()  # the fit adds 1e-8 of the data variance to the diagonal
    nll = lambda lp: _independent_nll(y, t, *np.exp(lp), 0.2, jitter)  # noqa: E731
    best = min((optimize.minimize(nll, np.log(x0), method="Nelder-Mead",
                                  options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000})
                for x0 in ([0.5, 0.3], [3.0, 2.0], [1.0, 1.0])), key=lambda r: r.fun)
    np.testing.assert_allclose(fit.hyper, np.exp(best.x), rtol=2e-4)
    assert fit.log_marginal_likelihood == pytest.approx(-nll(np.log(fit.hyper)), rel=1e-10)
    assert -nll(np.log(fit.hyper)) >= -best.fun - 1e-7
    # the free-noise optimum is a different point: the test above can tell them apart
    assert abs(free.noise_sd - 0.05) < 0.02
    assert np.max(np.abs(free.hyper / fit.hyper - 1)) > 0.05


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_derivative_of_noisy_sine(kernel):
    # 60 points of sin on [0, 2 pi] with noise sd 0.05. The GP derivative estimate
    # D (x_hat - mu) has error of order noise / lengthscale (~0.05 / 1); away from the
    # two ends (where a GP derivative is extrapolated) 0.15 bounds it with margin.
    rng = np.random.default_rng(0)
    t = np.linspace(0, 2 * np.pi, 60)
    y = np.sin(t) + rng.normal(0, 0.05, t.size)
    fit = fit_gp(t, y, kernel, state="s")
    gm = gradient_matching(fit, t)
    xhat = fit.posterior_mean(t, y)
    deriv = gm.D @ (xhat - gm.mean)
    inner = slice(5, -5)
    assert np.max(np.abs(deriv[inner] - np.cos(t[inner]))) < 0.15
    assert abs(fit.noise_sd - 0.05) < 0.03


def test_fit_recovers_hyperparameters_of_gp_draws():
    # Draws from an RBF GP (variance 1, lengthscale 0.5, noise 0.1) on 120 points;
    # the ML estimate of the lengthscale is consistent, so across 5 seeds the median
    # estimate must be within 15 % and the noise within 25 %.
    t = np.linspace(0, 10, 120)
    true = np.array([1.0, 0.5])
    C = KERNELS["rbf"].cov(t, t, true) + 1e-9 * np.eye(t.size)
    L = np.linalg.cholesky(C)
    ls, noise = [], []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        y = L @ rng.normal(size=t.size) + rng.normal(0, 0.1, t.size)
        fit = fit_gp(t, y, "rbf", n_starts=3, seed=seed)
        ls.append(fit.hyper[1]); noise.append(fit.noise_sd)
    assert np.median(ls) == pytest.approx(0.5, rel=0.15)
    assert np.median(noise) == pytest.approx(0.1, rel=0.25)


def _sigmoid_lml_reference(t, y, n_starts=20):
    """Independent reference for the sigmoid kernel's fit: the log marginal likelihood written
    out with numpy (no pgpgm code), maximised over log (v, c, d, noise) of the
    standardised series within the kernel's bounds from ``n_starts`` uniform starts (L-BFGS-B
    with finite differences). Returns the best log marginal likelihood in the data's units."""
    scale = y.std()
    z = (y - y.mean()) / scale
    a, b = np.meshgrid(t, t, indexing="ij")

    def nll(logp):  # -log N(z | 0, K): Cholesky written out
        v, c, d, s = np.exp(logp)
        K = v * np.arcsin((c + d * a * b) / np.sqrt((c + d * a**2 + 1) * (c + d * b**2 + 1))) + s**2 * np.eye(t.size)
        try:
            L = np.linalg.cholesky(K)
        except np.linalg.LinAlgError:
            return 1e10
        w = np.linalg.solve(L, z)
        return 0.5 * w @ w + np.log(np.diag(L)).sum() + 0.5 * t.size * np.log(2 * np.pi)

    bounds = np.log([[1e-2, 1e2], [1e-6, 1e4], [1e-6, 1e4], [1e-2, 1.0]])  # sigmoid kernel + noise, standardised
    rng = np.random.default_rng(2026)
    best = min(optimize.minimize(nll, rng.uniform(bounds[:, 0], bounds[:, 1]), method="L-BFGS-B", bounds=bounds).fun
               for _ in range(n_starts))
    return -best - t.size * np.log(scale)


@pytest.mark.parametrize("data_seed", [0, 1])
def test_fit_does_not_stop_in_the_no_signal_optimum(pt_model, data_seed):
    """Issue 10: on protein transduction's Rpp (sigmoid kernel) the kernel's guess and about half
    of the uniform starts end in the no-signal optimum (noise sd = data sd) or an over-smoothed
    one; with seed 4 all 5 first starts missed the best optimum, which sent the whole fit (GP
    seed 1 + 3 for Rpp) to a wrong least-squares optimum. The extra starts reach the best of 20
    independent starts (numpy/scipy likelihood); limited to the 5 first starts (the behaviour
    before) the fit is measured 24.3 / 27.7 nats worse on data seeds 0 / 1."""
    ds = pt_model.simulate("R-latent", seed=data_seed)
    t, y = ds["time"].values, ds["y"].sel(observed="Rpp").values
    reference = _sigmoid_lml_reference(t, y)
    fit = fit_gp(t, y, "sigmoid", seed=4)
    assert fit.log_marginal_likelihood == pytest.approx(reference, abs=1e-3)
    assert fit.noise_sd < 0.05 * y.std()  # the true sd is 0.01, the data sd 0.2
    # before the sigmoid kernel's start moved to d = 10 / span^2 (branch gpfast), the 5 first
    # starts alone ended 24.3 / 27.7 nats below (data seeds 0 / 1); now its guess reaches it too
    first_five = fit_gp(t, y, "sigmoid", seed=4, max_starts=5)
    assert first_five.log_marginal_likelihood == pytest.approx(reference, abs=1e-3)


def test_extra_starts_rescue_a_fit_whose_first_starts_all_end_in_the_no_signal_optimum(pt_model):
    """The rescue itself: the sigmoid kernel with its old first guess d = 1 (before branch gpfast)
    on protein transduction's Rpp, GP seeds 1 and 4: all 5 first starts end in the no-signal optimum
    (noise sd = data sd, measured 24.3 nats below the reference); the extra starts, made because
    that optimum explains the series no better than white noise, reach the reference optimum."""
    k = KERNELS["sigmoid"]
    old = Kernel("sigmoid-d1", (*k.hyperparameters[:2], Hyperparameter("d", (1e-6, 1e4), 1.0)), k.expr)
    ds = pt_model.simulate("R-latent", seed=0)
    t, y = ds["time"].values, ds["y"].sel(observed="Rpp").values
    reference = _sigmoid_lml_reference(t, y)
    for seed in (1, 4):
        first_five = fit_gp(t, y, old, seed=seed, max_starts=5)
        assert first_five.noise_sd == pytest.approx(y.std(), rel=1e-3)  # white noise: no signal explained
        assert first_five.log_marginal_likelihood < reference - 20
        rescued = fit_gp(t, y, old, seed=seed)
        assert rescued.log_marginal_likelihood == pytest.approx(reference, abs=1e-3)
        assert rescued.noise_sd < 0.05 * y.std()


def test_extra_starts_leave_confirmed_fits_unchanged(all_models):
    """The extra starts run only when the first 5 do not reach the best optimum twice: on the
    published Lotka-Volterra and FitzHugh-Nagumo data (seeds 0-4) every fit is bit for bit the
    fit of the first 5 starts (measured 2026-11-23: there the first 5 starts always reach the
    best optimum at least twice, so no extra start is made and step 1 costs what it cost)."""
    for model, case_name in [("lotka-volterra", "x1-observed"), ("lotka-volterra", "x2-observed"),
                             ("fitzhugh-nagumo", "V-observed"), ("fitzhugh-nagumo", "R-observed")]:
        spec = all_models[model]
        c = spec.case(case_name)
        for seed in range(5):
            ds = spec.simulate(case_name, seed=seed)
            for s in c.observed:
                t, y = ds["time"].values, ds["y"].sel(observed=s).values
                a, b = fit_gp(t, y, c.kernel, seed=seed), fit_gp(t, y, c.kernel, seed=seed, max_starts=5)
                assert np.array_equal(a.hyper, b.hyper) and a.noise_sd == b.noise_sd, (model, case_name, seed, s)


def _analytic_rbf(t, v, l):
    r = t[:, None] - t[None, :]
    e = np.exp(-0.5 * r**2 / l**2)
    return v * e, -v * r / l**2 * e, v / l**2 * (1 - r**2 / l**2) * e


def _analytic_matern52(t, v, l):
    r = t[:, None] - t[None, :]
    s = np.sqrt(5) / l
    e = np.exp(-s * np.abs(r))
    return (v * (1 + s * np.abs(r) + s**2 * r**2 / 3) * e, -(v * s**2 / 3) * r * (1 + s * np.abs(r)) * e,
            (v * s**2 / 3) * (1 + s * np.abs(r) - s**2 * r**2) * e)


def _mp_sigmoid(t, v, c, d):
    """C, dk/da, d2k/dadb by mpmath differentiation at 30 digits."""
    mp.mp.dps = 30
    k = lambda a, b: v * mp.asin((c + d * a * b) / mp.sqrt((c + d * a**2 + 1) * (c + d * b**2 + 1)))  # noqa: E731
    n = t.size
    out = [np.empty((n, n)) for _ in range(3)]
    for i in range(n):
        for j in range(n):
            a, b = mp.mpf(t[i]), mp.mpf(t[j])
            out[0][i, j] = float(k(a, b))
            out[1][i, j] = float(mp.diff(lambda x: k(x, b), a))
            out[2][i, j] = float(mp.diff(k, (a, b), (1, 1)))
    return out


@pytest.mark.parametrize("kernel", ["rbf", "matern52", "sigmoid"])
@pytest.mark.parametrize("grid", ["lv", "fhn", "pt"])
def test_D_and_A_match_high_precision_reference(all_models, kernel, grid):
    # D = C' C^-1 and A = C'' - C' C^-1 C'^T on the published grids, against analytic
    # derivative covariances (mpmath differentiation for sigmoid) and a 40-digit mpmath solve
    # with the same jittered C. Float64 D loses up to about cond(C) * 1e-16 of its scale
    # (measured <= 1e-9 relative, cond(C) <= 5e7); A is accurate to <= 2e-10 of its scale.
    spec = {"lv": all_models["lotka-volterra"], "fhn": all_models["fitzhugh-nagumo"],
            "pt": all_models["protein-transduction"]}[grid]
    t = spec.case().times
    if grid == "fhn":
        t = t[::2]  # 50 of the 100 points keep the mpmath reference fast
    hyper = {"rbf": [1.0, t[-1] / 5], "matern52": [1.0, t[-1] / 5], "sigmoid": [1.0, 1.0, 0.01]}[kernel]
    fit = GPFit("s", KERNELS[kernel], np.array(hyper), 0.1, 0.3, 1.0, 0.0)
    gm = gradient_matching(fit, t)
    C, C1, C2 = {"rbf": lambda: _analytic_rbf(t, *hyper), "matern52": lambda: _analytic_matern52(t, *hyper),
                 "sigmoid": lambda: _mp_sigmoid(t, *hyper)}[kernel]()
    Cj = C + gm.jitter * np.mean(np.diag(C)) * np.eye(t.size)
    np.testing.assert_allclose(gm.C, Cj, rtol=1e-12, atol=1e-14)
    mp.mp.dps = 40
    X = mp.inverse(mp.matrix(Cj.tolist())) * mp.matrix(C1.T.tolist())  # C^-1 C'^T
    D_ref = np.array(X.T.tolist(), dtype=float)
    A_ref = np.array((mp.matrix(C2.tolist()) - mp.matrix(C1.tolist()) * X).tolist(), dtype=float)
    cond = np.linalg.cond(Cj)
    assert np.max(np.abs(gm.D - D_ref)) <= max(cond * 1e-15, 1e-12) * np.max(np.abs(D_ref))
    assert np.max(np.abs(gm.A - A_ref)) <= 1e-8 * np.max(np.abs(A_ref))
    ev = np.linalg.eigvalsh(gm.A)
    assert ev.min() >= -1e-8 * max(ev.max(), 1e-12)
    P = gm.gradient_precision(0.3)
    np.testing.assert_allclose(P @ (gm.A + 0.3 * np.eye(t.size)), np.eye(t.size), atol=1e-6)


def test_user_lengthscale_named_l_gets_its_declared_bounds():
    # Before, bounds were chosen by name and a length scale called "l" got (1e-6, 1e4).
    t = np.linspace(0, 10, 50)
    grid = TimeGrid.from_times(t)
    rbf_l = Kernel.from_expression("rbf_l", "s2*exp(-(a-b)**2/(2*l**2))", ["s2", Hyperparameter.lengthscale("l")])
    np.testing.assert_allclose(rbf_l.bounds(grid), [[1e-2, 1e2], [0.5 * (10 / 49), 10 * 10.0]])
    np.testing.assert_allclose(rbf_l.guess(grid), [1.0, 1.0])
    # the same kernel under another name, same bounds and guesses: the same fit as the built-in rbf
    y = np.sin(t) + np.random.default_rng(4).normal(0, 0.1, t.size)
    a, b = fit_gp(t, y, rbf_l), fit_gp(t, y, "rbf")
    np.testing.assert_allclose(np.r_[a.hyper, a.noise_sd], np.r_[b.hyper, b.noise_sd], rtol=1e-6)
    # declared bounds bind: the ML length scale of a sine (~1.5) is above 0.3
    tight = Kernel.from_expression("tight", "s2*exp(-(a-b)**2/(2*l**2))",
                                   ["s2", Hyperparameter("l", bounds=(0.05, 0.3), guess=0.1)])
    assert fit_gp(t, y, tight).hyper[1] == pytest.approx(0.3, rel=1e-9)
    assert b.hyper[1] > 0.6
    # grid-relative bounds
    rel = Hyperparameter("p", bounds=(Scaled("min_spacing", 2.0), Scaled("span", 3.0)), guess=Scaled("span", 0.5))
    assert rel.resolve(grid) == pytest.approx((2 * 10 / 49, 30.0, 5.0))


def test_bare_hyperparameter_names_need_bounds():
    with pytest.raises(ModelDefinitionError, match="'l'.*lengthscale"):
        Kernel.from_expression("rq", "v*(1 + (a-b)**2/(2*al*l**2))**(-al)", ["v", "l", "al"])
    with pytest.raises(ModelDefinitionError, match="do not scale k"):
        Kernel.from_expression("bad", "exp(-(a-b)**2/(2*v*l**2))", ["v", Hyperparameter.lengthscale("l")])
    with pytest.raises(ModelDefinitionError, match="unknown name 'q'"):
        Kernel.from_expression("bad", "v*exp(-(a-b)**2/(2*q**2))", ["v", Hyperparameter.lengthscale("l")])
    with pytest.raises(ModelDefinitionError, match=r"\['l'\] do not appear"):
        Kernel.from_expression("bad", "v*exp(-(a-b)**2)", ["v", Hyperparameter.lengthscale("l")])
    with pytest.raises(ModelDefinitionError, match="lower bound"):
        Hyperparameter("l", bounds=(2.0, 1.0))


def test_kernel_sum_product_and_pickle():
    t = np.linspace(0, 3, 7)
    rbf, mat, sig = KERNELS["rbf"], KERNELS["matern52"], KERNELS["sigmoid"]
    s = rbf + mat
    assert s.names == ("variance", "lengthscale", "variance_2", "lengthscale_2")
    np.testing.assert_allclose(s.cov(t, t, [1.3, 0.7, 0.8, 1.1]),
                               rbf.cov(t, t, [1.3, 0.7]) + mat.cov(t, t, [0.8, 1.1]), rtol=1e-13)
    p = rbf * sig
    assert p.names == ("variance", "lengthscale", "c", "d")
    np.testing.assert_allclose(p.cov(t, t, [1.3, 0.7, 0.4, 2.0]),
                               rbf.cov(t, t, [1.3, 0.7]) * sig.cov(t, t, [1.0, 0.4, 2.0]), rtol=1e-13)
    assert [h.kind for h in s.hyperparameters] == ["variance", "lengthscale", "variance", "lengthscale"]
    u = pickle.loads(pickle.dumps(USER))  # after use: compiled functions are not pickled
    np.testing.assert_array_equal(u.cov(t, t, ALL_HYPER["rq"]), USER.cov(t, t, ALL_HYPER["rq"]))
    assert u.hyperparameters == USER.hyperparameters


def test_large_grid():
    t = np.linspace(0, 10, 1000)
    y = np.sin(t) + np.random.default_rng(2).normal(0, 0.1, t.size)
    fit = fit_gp(t, y, "matern52", n_starts=1)
    gm = gradient_matching(fit, t)
    assert gm.D.shape == (1000, 1000) and np.all(np.isfinite(gm.A))


@pytest.mark.parametrize("kernel", ["rbf", pytest.param("matern52", marks=pytest.mark.slow),
                                    pytest.param("sigmoid", marks=pytest.mark.slow)])  # CI: one kernel
def test_long_series_warm_start_reaches_the_full_fits_optimum(kernel):
    """N = 1000 (issue 12): starts on 250 thinned points, then one optimisation on all 1000,
    reach the optimum of every start on all 1000 points (warm_start_points=None) - log marginal
    likelihood to 1e-6 nats, noise sd to 1e-3 relative - on an uneven series; a series of at
    most 2 x 250 points is fitted exactly as before."""
    rng = np.random.default_rng(5)
    t = np.sort(rng.uniform(0, 100, 1000))
    y = 1 / (1 + np.exp(-(t - 30) / 8)) + 0.02 * rng.standard_normal(t.size)
    full = fit_gp(t, y, kernel, n_starts=2, warm_start_points=None)
    warm = fit_gp(t, y, kernel, n_starts=2)
    assert warm.log_marginal_likelihood == pytest.approx(full.log_marginal_likelihood, abs=1e-6)
    assert warm.noise_sd == pytest.approx(full.noise_sd, rel=1e-3)
    short = fit_gp(t[::2], y[::2], kernel, n_starts=2)  # 500 points: no thinning
    same = fit_gp(t[::2], y[::2], kernel, n_starts=2, warm_start_points=None)
    assert short.log_marginal_likelihood == same.log_marginal_likelihood
    np.testing.assert_array_equal(short.hyper, same.hyper)


def test_clear_errors():
    t = np.linspace(0, 1, 10)
    with pytest.raises(DataError, match="warm_start_points"):
        fit_gp(t, np.sin(t), warm_start_points=2)
    with pytest.raises(DataError, match="at least 3"):
        fit_gp(t[:2], t[:2])
    with pytest.raises(DataError, match="NaN"):
        fit_gp(t, np.where(t > 0.5, np.nan, t))
    with pytest.raises(DataError, match="sorted"):
        fit_gp(t[::-1], t)
    with pytest.raises(DataError, match="duplicates"):
        fit_gp(np.r_[t[:5], t[4:]], np.r_[t[:5], t[4:]])
    with pytest.raises(DataError, match="positive"):
        KERNELS["rbf"].cov(t, t, [1.0, -0.5])
    with pytest.raises(DataError, match="positive"):
        fit_gp(t, np.sin(t), noise_sd=-0.1)
    with pytest.raises(ModelDefinitionError, match="unknown kernel"):
        fit_gp(t, np.sin(t), "cubic")
    with pytest.raises(DataError, match="bounds"):
        fit_gp(t, np.sin(t), bounds=[[0.0, 1.0]])


def test_variance_gradient_without_its_matrix():
    # A kernel linear in its only variance v has dK/dv = K / v (the fit then skips that matrix);
    # a sum of kernels has two variances and keeps every matrix.
    t = np.array([0.0, 0.4, 1.1, 2.0, 3.5])
    for name in ("rbf", "matern52", "sigmoid", "rq"):
        kern, hyper = ALL[name], ALL_HYPER[name]
        assert kern.linear_variance == 0
        K, dK = kern.cov_with_hyper_grads(t, hyper)
        np.testing.assert_allclose(dK[0], K / hyper[0], rtol=1e-14)
        K2, dK2 = kern.cov_with_hyper_grads(t, hyper, skip_variance=True)
        assert dK2[0] is None and len(dK2) == len(hyper)
        for a, b in zip([K, *dK[1:]], [K2, *dK2[1:]]):  # another compiled function: equal to rounding
            np.testing.assert_allclose(b, a, rtol=1e-14, atol=1e-16)
    s = ALL["rbf+matern52"]
    assert s.linear_variance is None
    assert all(g is not None for g in s.cov_with_hyper_grads(t, ALL_HYPER["rbf+matern52"], skip_variance=True)[1])
    # the matrices a workspace reuses (Toeplitz on an even grid, row blocks on an uneven one) are those of a fresh call
    for grid in (np.linspace(0, 3, 40), np.sort(np.random.default_rng(0).uniform(0, 3, 40))):
        for name in ("rbf", "sigmoid"):
            kern, ws = ALL[name], []
            for hyper in (ALL_HYPER[name], np.array(ALL_HYPER[name]) * 1.3):
                K, dK = kern.cov_with_hyper_grads(grid, hyper, lower=True, workspace=ws, skip_variance=True)
                Kf, dKf = kern.cov_with_hyper_grads(grid, hyper)
                for a, b in zip([K, *dK[1:]], [Kf, *dKf[1:]]):
                    np.testing.assert_allclose(np.tril(a), np.tril(b), rtol=1e-13, atol=1e-15)


def test_scaled_power():
    grid = TimeGrid(span=20.0, min_spacing=0.1)
    assert Scaled("span", 10.0, power=-2)(grid) == pytest.approx(10.0 / 400.0, rel=1e-15)
    assert Scaled("min_spacing", 0.5)(grid) == pytest.approx(0.05, rel=1e-15)
    assert repr(Scaled("span", 10.0, power=-2)) == "10*span^-2"
    assert pickle.loads(pickle.dumps(Scaled("span", 3.0, power=0.5)))(grid) == pytest.approx(3.0 * 20.0**0.5)
    with pytest.raises(ModelDefinitionError, match="power"):
        Scaled("span", 1.0, power=float("nan"))
    # the sigmoid kernel's d (1 / time^2) starts at 10 / span^2
    assert KERNELS["sigmoid"].guess(grid) == pytest.approx([1.0, 1.0, 10.0 / 400.0])


def _sigmoid_numpy(t, v, c, d):
    """v asin((c + d a b) / sqrt((c + d a^2 + 1)(c + d b^2 + 1))) by a direct numpy formula."""
    q = c + d * t**2 + 1
    return v * np.arcsin((c + d * np.outer(t, t)) / np.sqrt(np.outer(q, q)))


@pytest.mark.parametrize("span", [10.0, 100.0])
def test_sigmoid_fit_reaches_the_multistart_optimum(span):
    # One start from the sigmoid kernel's guess must reach the best optimum that an independent
    # dense numpy likelihood maximised from 6 starts (L-BFGS-B, numerical gradients) finds. From
    # the guess before (d = 1 whatever the time unit) L-BFGS-B stops in the all-noise optimum on
    # these grids: the test tells the two apart.
    n = 80
    t = np.linspace(0, span, n)
    y = np.sin(10 * t / span) + np.random.default_rng(5).normal(0, 0.1, n)
    z = (y - y.mean()) / y.std()

    def nll(lp):  # standardised series, as the fit: bounds below are those of the kernel and NOISE
        v, c, d, noise = np.exp(lp)
        K = _sigmoid_numpy(t, v, c, d) + (noise**2 + 1e-8) * np.eye(n)
        sign, logdet = np.linalg.slogdet(K)
        return 0.5 * z @ np.linalg.solve(K, z) + 0.5 * logdet + 0.5 * n * np.log(2 * np.pi) if sign > 0 else 1e10

    box = np.log([[1e-2, 1e2], [1e-6, 1e4], [1e-6, 1e4], [1e-2, 1.0]])
    rng = np.random.default_rng(11)
    starts = [np.log([1.0, 1.0, 10 / span**2, 0.1])] + [rng.uniform(box[:, 0], box[:, 1]) for _ in range(5)]
    ref = min(optimize.minimize(nll, x0, method="L-BFGS-B", bounds=box).fun for x0 in starts)
    to_state = -n * np.log(y.std())  # the fit reports the likelihood of y in the state's units
    fit = fit_gp(t, y, "sigmoid", n_starts=1)
    lp = np.log(np.r_[fit.hyper / np.r_[y.var(), 1.0, 1.0], fit.noise_sd / y.std()])
    assert fit.log_marginal_likelihood == pytest.approx(-nll(lp) + to_state, rel=1e-9)
    assert fit.log_marginal_likelihood >= -ref + to_state - 1e-6
    res = optimize.minimize(negative_log_marginal_likelihood, np.log([1.0, 1.0, 1.0, 0.1]),
                            args=(KERNELS["sigmoid"], t, z, None), jac=True, method="L-BFGS-B", bounds=box)
    assert res.fun > ref + 10


# User kernels for the compiled pair loop: non-stationary (a polynomial in a, b) and stationary with |a - b|
POLY = Kernel.from_expression("poly", "variance*(c + a*b)**2", ["variance", Hyperparameter("c", bounds=(0.1, 10.0))])
OU = Kernel.from_expression("ou", "variance*exp(-abs(a-b)/l)", ["variance", Hyperparameter.lengthscale("l")])
PAIRS = {**ALL, "poly": POLY, "ou": OU}
PAIRS_HYPER = {**ALL_HYPER, "sigmoid": [1.5, 40.0, 0.3], "poly": [0.7, 1.7], "ou": [1.2, 0.8]}


def _close(a, b, rtol):
    """max |a - b| <= rtol * max |b| (relative to the matrix's scale: entries near 0 carry its rounding)."""
    assert np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(b)), 1e-300), (np.max(np.abs(a - b)), np.max(np.abs(b)))


def _pairs(kern, t, hyper, *, skip_variance=False, lower=False, workspace=None):
    """The matrices of the kernel's compiled pair loop, called directly (any N)."""
    f = kern._pairs_hyper_no_variance if skip_variance else kern._pairs_hyper
    n_out = len(hyper) + 1 - (skip_variance and kern.linear_variance is not None)
    return kern._run_pairs(f, t, hyper, n_out, lower=lower, out=workspace)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_compiled_pair_loop_equals_numpy_and_finite_differences(name):
    # On uneven times (no Toeplitz shortcut) K and every dK/dh come from one compiled pass over the
    # pairs (Kernel._pairs_hyper); they must equal the numpy expressions (sympy.lambdify, row blocks)
    # to rounding, and central differences of k in each hyperparameter.
    kern, hyper = PAIRS[name], np.array(PAIRS_HYPER[name], float)
    assert kern._pairs_hyper is not None and kern._pairs_hyper_no_variance is not None
    iv = kern.linear_variance
    rng = np.random.default_rng(7)
    for n in (9, 1000):
        t = np.sort(rng.uniform(0.0, 6.0, n))
        numpy_full = kern._run(kern._f_hyper, t, t, hyper)
        compiled = _pairs(kern, t, hyper)
        for new, ref in zip(compiled, numpy_full):
            _close(new, ref, 1e-13)
        if n >= _PAIRS_MIN_POINTS:  # what the fit gets at this size
            K, dK = kern.cov_with_hyper_grads(t, hyper)
            assert all(np.array_equal(a, b) for a, b in zip([K, *dK], compiled))
        # the fit's form: lower triangles only, without dK/dv, matrices reused from a workspace
        ws: list = []
        for scale in (1.0, 1.3):
            low = _pairs(kern, t, hyper * scale, skip_variance=True, lower=True, workspace=ws)
            ref = kern._run(kern._f_hyper, t, t, hyper * scale)
            ref = [r for j, r in enumerate(ref) if iv is None or j != iv + 1]
            assert len(low) == len(ref)
            for new, r in zip(low, ref):
                _close(np.tril(new), np.tril(r), 1e-13)
                assert not np.any(np.triu(new, 1))
        # dK/dh against central differences of k: the whole matrix at n = 9, 6 entries at n = 1000
        dK = compiled[1:]
        for j in range(hyper.size):
            up, dn = hyper.copy(), hyper.copy()
            up[j] *= 1 + 1e-6
            dn[j] *= 1 - 1e-6
            if n == 9:
                fd = (kern.cov(t, t, up) - kern.cov(t, t, dn)) / (2e-6 * hyper[j])
                _close(dK[j], fd, 1e-7)
            else:
                i, k = rng.integers(0, n, 6), rng.integers(0, n, 6)
                fd = np.array([(kern.cov(t[[a]], t[[b]], up) - kern.cov(t[[a]], t[[b]], dn))[0, 0]
                               for a, b in zip(i, k)]) / (2e-6 * hyper[j])
                # rounding of the difference quotient: ~1e-16 / 1e-6 of the scale of k
                np.testing.assert_allclose(dK[j][i, k], fd, rtol=1e-6, atol=1e-8 * np.max(np.abs(dK[j])))


def test_small_series_use_the_numpy_expressions():
    # Below _PAIRS_MIN_POINTS times the matrices are the numpy ones bit for bit and nothing is compiled
    # (a fit of a short series, like every published case, is as before)
    kern = Kernel.from_expression("sig2", KERNELS["sigmoid"].expr, KERNELS["sigmoid"].hyperparameters)
    t = np.sort(np.random.default_rng(2).uniform(0, 100, _PAIRS_MIN_POINTS - 1))
    hyper = np.array([1.5, 40.0, 0.3])
    ws: list = []
    K, dK = kern.cov_with_hyper_grads(t, hyper, lower=True, workspace=ws, skip_variance=True)
    ref = kern._run(kern._f_hyper_no_variance, t, t, hyper, lower=True)
    assert all(np.array_equal(a, b) for a, b in zip([K, dK[1], dK[2]], ref))
    assert "_pairs_hyper" not in kern.__dict__ and "_pairs_hyper_no_variance" not in kern.__dict__


def test_pair_loop_falls_back_to_numpy_for_functions_numba_cannot_print():
    # exp2 (2**x) has a numpy form but no Python/numba one in sympy's printers: the kernel keeps working
    from sympy.codegen.cfunctions import exp2

    a, b, v, l = sp.symbols("a b variance l")
    kern = Kernel.from_expression("rbf2", v * exp2(-(a - b) ** 2 / l**2), ["variance", Hyperparameter.lengthscale("l")])
    assert kern._pairs_hyper is None
    t, hyper = np.linspace(0.0, 3.5, _PAIRS_MIN_POINTS) ** 1.5, [1.3, 0.9]  # uneven: no Toeplitz shortcut
    rbf = KERNELS["rbf"]  # exp2(-x) = exp(-x ln 2): the rbf with lengthscale l / sqrt(2 ln 2)
    K, dK = kern.cov_with_hyper_grads(t, hyper)
    r = np.sqrt(2 * np.log(2))
    K_rbf, dK_rbf = rbf.cov_with_hyper_grads(t, [1.3, 0.9 / r])
    np.testing.assert_allclose(K, K_rbf, rtol=1e-13)
    np.testing.assert_allclose(dK[0], dK_rbf[0], rtol=1e-13)
    np.testing.assert_allclose(dK[1], dK_rbf[1] / r, rtol=1e-13, atol=1e-15)


def test_pair_loop_is_compiled_once_and_loaded_from_disk(tmp_path):
    # A fresh process with an empty cache folder compiles the sigmoid kernel's pair loop; a second
    # process finds its machine code on disk (numba cache=True beside the generated module) and
    # compiles nothing, with the same matrices.
    import json
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import hashlib, json
        import numpy as np
        from numba.core import event
        from pgpgm.gp import KERNELS
        t = np.sort(np.random.default_rng(0).uniform(0, 5, 250))  # >= _PAIRS_MIN_POINTS
        with event.install_recorder("numba:compile") as rec:
            K, dK = KERNELS["sigmoid"].cov_with_hyper_grads(t, [1.5, 40.0, 0.3])
        digest = hashlib.sha256(b"".join(m.tobytes() for m in [K, *dK])).hexdigest()
        print(json.dumps({"compiles": sum(e.is_start for _, e in rec.buffer), "digest": digest, "K00": K[0, 0]}))
    ''')
    env = {**os.environ, "PGPGM_CACHE_DIR": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True, timeout=300).stdout) for _ in range(2)]
    assert runs[0]["compiles"] >= 1 and runs[1]["compiles"] == 0
    assert runs[0]["digest"] == runs[1]["digest"]
    q = 40.0 + 0.3 * np.sort(np.random.default_rng(0).uniform(0, 5, 250))[0] ** 2  # k(t, t) = v asin(q / (q + 1))
    assert runs[0]["K00"] == pytest.approx(1.5 * np.arcsin(q / (q + 1)), rel=1e-14)
    assert len(list((tmp_path / "kernels").glob("pgpgm_kernels_*.py"))) == 1

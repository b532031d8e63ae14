"""Step 1: kernels, derivative covariances, hyperparameter fit, D and A."""

import numpy as np
import pytest

from pgpgm import DataError
from pgpgm.gp import fit_gp, gradient_matching
from pgpgm.gp.kernels import KERNELS, Kernel

HYPER = {"rbf": [1.3, 0.7], "matern52": [0.8, 1.1], "sigmoid": [1.5, 0.4, 2.0]}
USER = Kernel.from_expression("rq", "variance*(1 + (a-b)**2/(2*al*l**2))**(-al)", ["variance", "l", "al"])


@pytest.mark.parametrize("name", ["rbf", "matern52", "sigmoid", "rq"])
def test_derivative_covariances_match_finite_differences(name):
    kern, hyper = (USER, [1.1, 0.6, 2.0]) if name == "rq" else (KERNELS[name], HYPER[name])
    ta = np.array([0.0, 0.3, 1.0, 2.5])
    tb = np.array([0.0, 0.2, 1.0, 3.0])  # includes a = b points
    C, Ca, Cb, Cab = kern.cov_grad(ta, tb, hyper)
    h = 1e-5
    k = lambda a, b: kern.cov(a, b, hyper)  # noqa: E731
    np.testing.assert_allclose(Ca, (k(ta + h, tb) - k(ta - h, tb)) / (2 * h), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(Cb, (k(ta, tb + h) - k(ta, tb - h)) / (2 * h), rtol=1e-6, atol=1e-8)
    h2 = 1e-4
    fd2 = (k(ta + h2, tb + h2) - k(ta + h2, tb - h2) - k(ta - h2, tb + h2) + k(ta - h2, tb - h2)) / (4 * h2 * h2)
    np.testing.assert_allclose(Cab, fd2, rtol=1e-4, atol=1e-5)


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


def test_fixed_noise_is_respected():
    t = np.linspace(0, 5, 30)
    y = np.sin(t) + np.random.default_rng(1).normal(0, 0.1, t.size)
    assert fit_gp(t, y, "rbf", noise_sd=0.1).noise_sd == 0.1


@pytest.mark.parametrize("kernel", ["rbf", "matern52", "sigmoid"])
@pytest.mark.parametrize("grid", ["lv", "fhn", "pt"])
def test_A_symmetric_psd_on_published_grids(all_models, kernel, grid):
    spec = {"lv": all_models["lotka-volterra"], "fhn": all_models["fitzhugh-nagumo"],
            "pt": all_models["protein-transduction"]}[grid]
    t = spec.case().times
    y = np.sin(t / t[-1] * 4)  # a smooth series on the grid
    hyper = {"rbf": [1.0, t[-1] / 5], "matern52": [1.0, t[-1] / 5], "sigmoid": [1.0, 1.0, 0.01]}[kernel]
    from pgpgm.gp import GPFit
    fit = GPFit("s", KERNELS[kernel], np.array(hyper), 0.1, float(y.mean()), 1.0, 0.0)
    gm = gradient_matching(fit, t)
    np.testing.assert_array_equal(gm.A, gm.A.T)
    ev = np.linalg.eigvalsh(gm.A)
    assert ev.min() >= -1e-8 * max(ev.max(), 1e-12)
    P = gm.gradient_precision(0.3)
    np.testing.assert_allclose(P @ (gm.A + 0.3 * np.eye(t.size)), np.eye(t.size), atol=1e-6)


def test_large_grid():
    t = np.linspace(0, 10, 1000)
    y = np.sin(t) + np.random.default_rng(2).normal(0, 0.1, t.size)
    fit = fit_gp(t, y, "matern52", n_starts=1)
    gm = gradient_matching(fit, t)
    assert gm.D.shape == (1000, 1000) and np.all(np.isfinite(gm.A))


def test_clear_errors():
    t = np.linspace(0, 1, 10)
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
    with pytest.raises(ValueError, match="unknown kernel"):
        fit_gp(t, np.sin(t), "cubic")

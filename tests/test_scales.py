"""Step 4's sampling scale per parameter (pgpgm.posterior.scales) and the own scale's soft wall at 0
(pgpgm.priors.SoftplusTransform), against analytic log densities and finite differences."""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import stats

from pgpgm.errors import DataError
from pgpgm.posterior.scales import (MIN_ASYMMETRY, MIN_WIDTH_CHANGE, PROBE_SE, WALL_WIDTH_SE, choose_scales,
                                   wall_width)
from pgpgm.priors import SoftplusTransform


def _transform_functions(width: float):
    phi = pt.dscalar("phi")
    tr = SoftplusTransform(width)
    theta = tr.backward(phi)
    return (pytensor.function([phi], theta), pytensor.function([phi], tr.forward(theta)),
            pytensor.function([phi], tr.log_jac_det(phi)))


def test_the_own_scale_round_trips_and_its_jacobian_is_the_derivative():
    width = 0.04
    backward, round_trip, log_jac = _transform_functions(width)
    phis = np.array([-0.3, -0.05, 0.0, 0.02, 0.25, 3.0, 500.0])
    thetas = np.array([float(backward(p)) for p in phis])
    assert np.all(thetas > 0)
    np.testing.assert_allclose([float(round_trip(p)) for p in phis], phis, rtol=1e-9, atol=1e-12)
    # theta itself away from 0: the posterior's scale there is the parameter's own
    np.testing.assert_allclose(thetas[-2:], phis[-2:], rtol=1e-12)
    h = 1e-6
    numeric = [(float(backward(p + h)) - float(backward(p - h))) / (2 * h) for p in phis]
    np.testing.assert_allclose(np.exp([float(log_jac(p)) for p in phis]), numeric, rtol=1e-6)
    with pytest.raises(DataError, match="width"):
        SoftplusTransform(0.0)


def _gaussian(mean, cov):
    return stats.multivariate_normal(mean, cov).logpdf


def test_a_posterior_gaussian_in_theta_goes_on_its_own_scale():
    """alpha0 = 0.25 +- 0.08 (the repressilator's leak: Gaussian in theta, a long left tail in log theta)."""
    (c,) = choose_scales(_gaussian([0.25], [[0.08**2]]), np.array([0.25]), np.array([[0.08**2]]), ["a"], {"a": 2.16})
    assert c.own and c.width == wall_width(0.08) == 4.0**-2  # 0.04 rounded to a power of 4
    assert 0.5 * WALL_WIDTH_SE * 0.08 <= c.width <= 2 * WALL_WIDTH_SE * 0.08
    # the two probes at +- PROBE_SE sds of a Gaussian in theta: equal densities on its own scale
    assert c.own_asymmetry == pytest.approx(0.0, abs=1e-9)
    z = np.array([PROBE_SE, -PROBE_SE]) * 0.08 / 0.25  # +- 2 sds of log theta (delta method)
    theta = 0.25 * np.exp(z)
    expect = stats.norm(0.25, 0.08).logpdf(theta) + np.log(theta)  # the log scale's density, Jacobian included
    assert c.log_asymmetry == pytest.approx(abs(expect[0] - expect[1]), rel=1e-9)


def test_a_lognormal_or_a_tight_posterior_stays_on_the_log_scale():
    """Multiplicative uncertainty (log theta ~ N(log 2, 0.5)) is Gaussian on the log scale; a parameter
    determined to 1 % is close to Gaussian on either (asymmetry below MIN_ASYMMETRY)."""
    def lognormal(q):
        return stats.norm(np.log(2.0), 0.5).logpdf(np.log(q[0])) - np.log(q[0]) if q[0] > 0 else -np.inf

    var = (2.0 * 0.5) ** 2  # the Laplace variance in theta at the mode's scale
    (c,) = choose_scales(lognormal, np.array([2.0]), np.array([[var]]), ["k"], {"k": 100.0})
    assert not c.own and c.log_asymmetry < 1e-9
    (tight,) = choose_scales(_gaussian([3.0], [[0.03**2]]), np.array([3.0]), np.array([[0.03**2]]), ["k"],
                             {"k": 10.0})
    assert not tight.own and tight.log_asymmetry < MIN_ASYMMETRY


def test_the_scale_is_chosen_per_parameter_along_the_regression_line():
    """Two correlated parameters: a Gaussian in (a, log b) with correlation 0.9. a goes on its own scale,
    b stays on the log scale; a parameter not asked about (an initial value) moves along the line but
    gets no choice; one whose box ends within UPPER_ROOM_SE sds stays on the log scale."""
    sa, sl, rho = 0.1, 0.4, 0.9
    cov_w = np.array([[sa**2, rho * sa * sl], [rho * sa * sl, sl**2]])
    dens = stats.multivariate_normal([0.3, np.log(5.0)], cov_w)

    def logp(q):  # the density in (a, b): the Jacobian of b -> log b
        return dens.logpdf([q[0], np.log(q[1])]) - np.log(q[1]) + stats.norm(1.0, 0.1).logpdf(q[2])

    q = np.array([0.3, 5.0, 1.0])
    cov = np.zeros((3, 3))
    cov[:2, :2] = cov_w * np.outer([1.0, 5.0], [1.0, 5.0])  # delta method to (a, b)
    cov[2, 2] = 0.01
    choices = choose_scales(logp, q, cov, ["a", "b", "x0[x]"], {"a": 10.0, "b": 100.0})
    assert [c.name for c in choices] == ["a", "b"]
    assert choices[0].own and not choices[1].own
    assert choices[0].own_asymmetry < 0.05 < MIN_ASYMMETRY <= choices[0].log_asymmetry
    near = choose_scales(logp, q, cov, ["a", "b", "x0[x]"], {"a": 0.8, "b": 100.0})
    assert not near[0].own  # 0.3 + 6 x 0.1 > 0.8


def test_an_undetermined_parameter_or_a_probe_outside_the_box_keeps_the_log_scale():
    logp = _gaussian([0.25, 1.0], np.diag([0.08**2, 1.0]))
    cov = np.diag([np.inf, 1.0])
    (c,) = choose_scales(logp, np.array([0.25, 1.0]), cov, ["a", "b"], {"a": 2.0})
    assert not c.own and np.isnan(c.log_asymmetry)
    # a posterior that reaches 0 within the probes: the own-scale probe leaves the box
    (wide,) = choose_scales(_gaussian([0.1], [[0.08**2]]), np.array([0.1]), np.array([[0.08**2]]), ["a"],
                            {"a": 2.0})
    assert not wide.own and wide.own_asymmetry == np.inf


def test_a_probe_far_along_a_loose_direction_leaves_the_box_quietly():
    """A parameter correlated with one whose se is 1e5 times its value (an unknown initial value on a ridge to
    infinity, the held-out d2029-pt-020): the log-scale probe overflows, leaves the box, and says nothing
    (numpy's overflow RuntimeWarning reached the user)."""
    def logp(q):
        return float(stats.norm(0.25, 0.08).logpdf(q[0]) + stats.norm(200.0, 1e5).logpdf(q[1]))
    cov = np.array([[0.08**2, 0.99 * 0.08 * 1e5], [0.99 * 0.08 * 1e5, 1e10]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choices = choose_scales(logp, np.array([0.25, 200.0]), cov, ["a", "b"], {"a": 2.0, "b": 1e9})
    assert [(c.own, c.log_asymmetry) for c in choices] == [(False, np.inf)] * 2


def _fd_conditional_sd(logp, h=1e-4):
    """Each unknown's sd given the others: 1 / sqrt(-d2 logp / dq_i2) by central differences."""
    def sds(q):
        out = []
        for i in range(q.size):
            e = np.zeros(q.size)
            e[i] = h * q[i]
            d2 = (logp(q + e) - 2 * logp(q) + logp(q - e)) / (h * q[i]) ** 2
            out.append(1 / np.sqrt(-d2) if d2 < 0 else np.nan)
        return np.array(out)
    return sds


def _ridge(relative: bool):
    """log a ~ N(log 3, 0.25) and b | a ~ N(a + 1, w): w = 0.1 fixed in b's units (the width of x2(0) given the
    rest in Lotka-Volterra with x2(0) unknown), or w = 0.05 b's centre (a width fixed in log units)."""
    def logp(q):
        a, b = q
        if a <= 0 or b <= 0:
            return -np.inf
        w = 0.05 * (a + 1) if relative else 0.1
        return stats.norm(np.log(3.0), 0.25).logpdf(np.log(a)) - np.log(a) + stats.norm(a + 1, w).logpdf(b)
    q = np.array([3.0, 4.0])
    sa = 0.25 * 3.0
    w = 0.05 * 4.0 if relative else 0.1
    cov = np.array([[sa**2, sa**2], [sa**2, sa**2 + w**2]])  # the Laplace approximation's (delta method)
    return logp, q, cov


def test_a_width_fixed_in_theta_units_along_a_ridge_goes_on_its_own_scale():
    """b's sd given a stays 0.1 as the ridge b = a + 1 runs from b = 2.7 to 6.1 (the log-scale probes): in
    log b that width narrows 2.2x (a funnel NUTS under-reaches), in b it does not change. The width test
    puts b on its own scale, and a too (its width given b is b's); the asymmetry test alone does not."""
    logp, q, cov = _ridge(relative=False)
    names, uppers = ["a", "b"], {"a": 100.0, "b": 100.0}
    plain = choose_scales(logp, q, cov, names, uppers)
    assert not any(c.own for c in plain) and all(np.isnan(c.log_width_change) for c in plain)
    a, b = choose_scales(logp, q, cov, names, uppers, _fd_conditional_sd(logp))
    assert a.own and b.own and b.width == wall_width(np.sqrt(cov[1, 1]))
    assert b.own_width_change == pytest.approx(0.0, abs=1e-4)
    se_log = np.sqrt(cov[1, 1]) / 4.0  # the probes at +- 2 sds of log b: b+ / b- = exp(4 se_log)
    assert b.log_width_change == pytest.approx(2 * PROBE_SE * se_log, rel=0.05)
    assert b.log_width_change > np.log(MIN_WIDTH_CHANGE)


def test_a_width_fixed_in_log_units_along_a_ridge_stays_on_the_log_scale():
    logp, q, cov = _ridge(relative=True)
    a, b = choose_scales(logp, q, cov, ["a", "b"], {"a": 100.0, "b": 100.0}, _fd_conditional_sd(logp))
    assert not a.own and not b.own
    assert b.own_width_change > np.log(MIN_WIDTH_CHANGE) > b.log_width_change


def test_the_fit_samples_a_ridge_fixed_in_theta_units_on_its_own_scale(lv):
    """Lotka-Volterra with x1 observed and x2(0) unknown (theta2 fixed; the published data, seed 0): the data fix
    theta1 - x2(0), and x2(0)'s width given the rest shrinks 8x in log units along the ridge (2.7x in its own).
    The default fit's step 4 samples theta1 and the initial value x2(0) on their own scale (the width test; the
    asymmetry test alone chose neither) and theta3, theta4 on the log scale."""
    import json
    import warnings

    import pgpgm

    data = lv.simulate("x1-observed", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 3 s budget: not converged
        r = pgpgm.fit(lv.system, data, ["x1"], x0={"x2": (0.0, 10.0)}, fixed={"theta2": 1.0}, seed=0,
                      progressbar=False, posterior=pgpgm.NUTS(budget=3))
    assert json.loads(r.posterior.attrs["pgpgm_own_scale"]) == ["theta1", "x2_0"]

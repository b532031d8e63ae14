"""Step 4's sampling scale per parameter (pgpgm.posterior.scales) and the own scale's soft wall at 0
(pgpgm.priors.SoftplusTransform), against analytic log densities and finite differences."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import stats

from pgpgm.errors import DataError
from pgpgm.posterior.scales import MIN_ASYMMETRY, PROBE_SE, WALL_WIDTH_SE, choose_scales, wall_width
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

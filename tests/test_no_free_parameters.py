"""A fit with no free parameter estimates the initial values and the noise (issue 33: steps 1-2
ran, then a raw TypeError inside ArviZ).

Table-driven: every parameter fixed (``fixed=``), or a system without parameters; with the
NUTS posterior, its Laplace approximation, or none. The reference is independent of pgpgm: the
analytic solution of the linear ODE, fitted to the same data by ``scipy.optimize.least_squares``
in the observed state's initial value, the noise sd its maximum-likelihood value
sqrt(RSS / N), and the standard error of x0 that of a linear model (the solution is linear in x0).
"""

import numpy as np
import pytest
from scipy.optimize import least_squares

import pgpgm

T = np.linspace(0.0, 2.0, 15)
K, C, Y0 = 0.7, 0.5, 2.0  # dx/dt = -k x + c (+ b y), dy/dt = -0.3 y with y(0) = Y0 (latent, known)


def _solution(x0: float, two_states: bool) -> np.ndarray:
    """x(t) of the ODE, analytic."""
    if not two_states:  # x' = -k x + c
        return C / K + (x0 - C / K) * np.exp(-K * T)
    b = 0.5 * Y0 / (K - 0.3)  # x' = -k x + 0.5 y, y = Y0 exp(-0.3 t)
    return b * np.exp(-0.3 * T) + (x0 - b) * np.exp(-K * T)


def _data(two_states: bool) -> np.ndarray:
    return _solution(3.0, two_states) + np.random.default_rng(4).normal(0.0, 0.05, T.size)


def _reference(y: np.ndarray, two_states: bool) -> tuple[float, float, float]:
    """(x0, noise sd, standard error of x0) by least squares on the analytic solution."""
    fit = least_squares(lambda q: _solution(q[0], two_states) - y, [1.0], xtol=1e-14, ftol=1e-14, gtol=1e-14)
    sigma = float(np.sqrt(np.mean(fit.fun**2)))
    slope = np.exp(-K * T)  # d x(t) / d x0
    return float(fit.x[0]), sigma, sigma / float(np.sqrt(slope @ slope))


def _fixed_everything():
    system = pgpgm.ODESystem.from_equations({"x": "-k*x + c"}, ["k", "c"])
    return system, {"fixed": {"k": K, "c": C}}, False


def _no_parameters():
    system = pgpgm.ODESystem.from_equations({"x": "-0.7*x + 0.5*y", "y": "-0.3*y"}, [])
    return system, {"x0": {"y": Y0}}, True


# (id, system and options, posterior)
CASES = [
    ("fixed= every parameter, nuts", _fixed_everything, "nuts"),
    ("fixed= every parameter, laplace", _fixed_everything, "laplace"),
    ("fixed= every parameter, no step 4", _fixed_everything, None),
    ("a system without parameters, nuts", _no_parameters, "nuts"),
    ("a system without parameters, laplace", _no_parameters, "laplace"),
]


@pytest.mark.filterwarnings("ignore::pgpgm.ConvergenceWarning")  # short chains: the check is against the reference
@pytest.mark.parametrize("make, posterior", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_fit_without_free_parameters_estimates_the_initial_values_and_the_noise(make, posterior):
    system, options, two_states = make()
    y = _data(two_states)
    x0_ref, sigma_ref, se_ref = _reference(y, two_states)
    step4 = {"nuts": pgpgm.NUTS(draws=250, tune=250, chains=2, cores=1), "laplace": pgpgm.Laplace(500), None: None}
    result = pgpgm.fit(system, {"time": T, "x": y}, ["x"], draws=100, tune=100, chains=2, posterior=step4[posterior],
                       progressbar=False, seed=1, **options)
    assert result.x0["x"] == pytest.approx(x0_ref, rel=1e-6)
    assert float(result.trajectories["noise_sd"].sel(observed="x")) == pytest.approx(sigma_ref, rel=1e-4)
    assert float(result.estimates["x0_stderr"].sel(state="x")) == pytest.approx(se_ref, rel=1e-3)
    if two_states:
        assert result.x0["y"] == Y0
    else:
        np.testing.assert_array_equal(result.theta, [K, C])
        assert result.estimates["fixed"].values.all()
    if posterior is not None:  # the posterior of x0 centres on the reference with the reference's spread
        draws = result.posterior.posterior["x_0"].values.ravel()
        assert abs(draws.mean() - x0_ref) < 0.25 * se_ref
        assert draws.std() == pytest.approx(se_ref, rel=0.25)

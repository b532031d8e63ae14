import numpy as np
import pytest

import pgpgm


@pytest.fixture(scope="session")
def lv():
    return pgpgm.load_model("lotka-volterra")


@pytest.fixture(scope="session")
def fhn():
    return pgpgm.load_model("fitzhugh-nagumo")


@pytest.fixture(scope="session")
def pt_model():
    return pgpgm.load_model("protein-transduction")


@pytest.fixture(scope="session")
def all_models(lv, fhn, pt_model):
    return {"lotka-volterra": lv, "fitzhugh-nagumo": fhn, "protein-transduction": pt_model}


def scipy_reference(system, theta, x0, times):
    """A tight, independent reference solve (DOP853, rtol 1e-12) with sympy-lambdified f."""
    import sympy as sp
    from scipy.integrate import solve_ivp

    t, xs, ps = system.symbols
    f = sp.lambdify((t, xs, ps), list(system.expressions), "numpy")
    sol = solve_ivp(lambda tt, y: f(tt, y, theta), (times[0], times[-1]), np.asarray(x0, float),
                    method="DOP853", t_eval=times, rtol=1e-12, atol=1e-12)
    assert sol.success
    return sol.y.T

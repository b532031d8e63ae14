"""Competing optima (pgpgm.refinement.optima): a second optimum as good as the refined one is
reported, with its point checked against an independent solver of the closed form."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.optimize import least_squares

import pgpgm
from pgpgm.errors import CompetingOptimaWarning
from pgpgm.refinement.optima import distinct, exchanged_pair, loose_bound_starts, on_bounds


def test_distinct_needs_some_parameter_outside_either_optimum_s_own_uncertainty():
    se = np.array([0.1, 1.0])
    assert not distinct([1.0, 5.0], [1.4, 5.0], se)            # 4 se apart
    assert distinct([1.0, 5.0], [1.6, 5.0], se)                # 6 se apart
    assert not distinct([1.0, 5.0], [1.0, 50.0], [0.1, np.inf])  # only along an undetermined direction
    assert not distinct([1e6, 5.0], [1e6 + 1.0, 5.0], [1e-9, 1.0])  # 0.0001 % of the value: the same optimum


def test_exchanged_pair_names_the_two_parameters_whose_values_are_swapped():
    names = ["ka", "ke", "CL"]
    assert exchanged_pair(np.array([0.1, 1.3, 0.045]), np.array([1.3, 0.1, 0.043]), names) == ("ka", "ke")
    assert exchanged_pair(np.array([1.3, 0.1, 0.045]), np.array([1.3, 0.1, 0.043]), names) is None
    assert exchanged_pair(np.array([0.5, 1.3, 0.045]), np.array([1.3, 0.1, 0.043]), names) is None


def test_on_bounds_names_the_parameters_on_a_bound_of_the_box():
    box = np.array([[0.0, 20.0], [0.0, 0.5], [0.0, 0.5]])
    names = ["ka", "ke", "CL"]
    assert on_bounds(np.array([0.0978, 0.5, 0.006]), box, names) == ("ke on its upper bound 0.5",)
    assert on_bounds(np.array([0.0, 0.4999, 0.006]), box, names) == ("ka on its lower bound 0",)
    assert on_bounds(np.array([0.0, 0.5, 0.006]), None, names) == ()


def _closed_form(theta, c0, t, dose=4.5):
    """C(t) of the one-compartment oral model: absorption ka, elimination ke, clearance CL, C(0) = c0."""
    ka, ke, cl = theta
    return dose * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t)) + c0 * np.exp(-ke * t)


@pytest.fixture(scope="module")
def flip_flop():
    """A plain fit of the oral-dose model with the default prior box (0, 10) for every parameter, in which
    both branches of the flip-flop (ka > ke and ka < ke) fit the concentrations equally well."""
    spec = pgpgm.load_model("pk-oral")
    data = spec.simulate(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = pgpgm.fit(spec.system, data, ["C"], priors=(0, 10), posterior=None, progressbar=False)
    return spec, data, result, caught


def test_the_flip_flop_mirror_is_reported_and_is_an_optimum_of_an_independent_solver(flip_flop):
    spec, data, result, caught = flip_flop
    found = [w for w in caught if issubclass(w.category, CompetingOptimaWarning)]
    assert len(found) == 1 and "ka and ke exchanged" in str(found[0].message)
    assert found[0].filename == __file__  # points at the caller's line
    table = result.competing_optima
    assert len(table) == 1 and table["exchanged"].iloc[0] == "ka <-> ke"
    refined = result.theta
    mirror = table[list(spec.system.parameters)].iloc[0].to_numpy(float)
    assert refined[0] > refined[1] and mirror[0] < mirror[1]
    np.testing.assert_allclose(mirror[:2], refined[1::-1], rtol=1e-3)
    assert abs(table["delta_nll"].iloc[0]) < 1e-4
    # the closed form's least squares (scipy, no ODE solver), from 10 % off the reported mirror: it returns there
    t, y = data["time"].values, data["y"].sel(observed="C").values
    c0 = result.x0["C"]
    fit = least_squares(lambda q: _closed_form(q[:3], q[3], t) - y, np.append(mirror, c0) * 1.1, method="lm",
                        xtol=1e-14, ftol=1e-14)
    np.testing.assert_allclose(fit.x[:3], mirror, rtol=1e-4)
    # and the two branches' residual sums of squares are equal (both are the data's optimum)
    best = least_squares(lambda q: _closed_form(q[:3], q[3], t) - y, np.append(refined, c0) * 1.1, method="lm",
                         xtol=1e-14, ftol=1e-14)
    assert abs(2 * fit.cost - 2 * best.cost) < 1e-6 * (2 * best.cost)


def test_the_mirror_survives_saving_the_result(flip_flop, tmp_path):
    _, _, result, _ = flip_flop
    back = pgpgm.load_result(result.save(tmp_path / "r.nc"))
    a, b = result.competing_optima, back.competing_optima
    assert list(b["exchanged"]) == list(a["exchanged"]) and list(b["origin"]) == list(a["origin"])
    np.testing.assert_array_equal(b[["ka", "ke", "CL", "delta_nll"]].to_numpy(float),
                                  a[["ka", "ke", "CL", "delta_nll"]].to_numpy(float))


def test_a_box_that_keeps_one_branch_has_no_competing_optimum():
    spec = pgpgm.load_model("pk-oral")  # its box keeps ke <= 0.5 < ka: the branch ka > ke only
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompetingOptimaWarning)
        result = pgpgm.fit(spec.system, spec.simulate(seed=0), ["C"], priors=spec.priors(), posterior=None,
                           progressbar=False)
    assert result.competing_optima.empty


def test_loose_parameters_give_starts_held_at_their_bounds():
    # a parameter whose standard error is finite and exceeds its box's width gives two starts, the best's
    # point with it at each bound and bounds that hold it there; a determined one, one the data do not see
    # at all (an infinite standard error: the likelihood is the same along it), or one without a finite
    # box, none
    best = SimpleNamespace(q_names=("k1", "km1", "k2", "x0[S]"), theta=np.array([9.5, 5.8, 0.3]),
                           stderr=np.array([1600.0, 1000.0, 0.09]), q=np.array([9.5, 5.8, 0.3, 10.0]))
    bounds = np.array([[0.0, 10.0], [0.0, 10.0], [0.0, 10.0]])
    starts = loose_bound_starts(best, bounds)
    assert list(starts) == [f"{p} at its {side} bound (loose at the best)" for p in ("k1", "km1")
                            for side in ("lower", "upper")]
    q, held = starts["km1 at its lower bound (loose at the best)"]
    np.testing.assert_array_equal(q, [9.5, 0.0, 0.3, 10.0])
    np.testing.assert_array_equal(held[[0, 2]], bounds[[0, 2]])
    assert held[1, 0] == 0.0 and 0 < held[1, 1] <= 1e-8
    q, held = starts["k1 at its upper bound (loose at the best)"]
    assert q[0] == 10.0 and 10.0 - 1e-8 <= held[0, 0] < held[0, 1] == 10.0
    assert loose_bound_starts(best, None) == {}
    wide = loose_bound_starts(best, np.array([[0.0, 10.0], [0.0, 1e5], [0.0, 10.0]]))  # km1 +- 1000 in (0, 1e5)
    assert [name.split()[0] for name in wide] == ["k1", "k1"]
    unseen = SimpleNamespace(**{**vars(best), "stderr": np.array([np.inf, 1000.0, 0.09])})
    assert list(loose_bound_starts(unseen, bounds)) == [
        "km1 at its lower bound (loose at the best)", "km1 at its upper bound (loose at the best)"]
    assert list(loose_bound_starts(best, np.array([[0.0, np.inf], [0.0, 100.0], [0.0, 10.0]]))) == [
        "km1 at its lower bound (loose at the best)", "km1 at its upper bound (loose at the best)"]

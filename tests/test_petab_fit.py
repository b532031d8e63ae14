"""``pgpgm.fit_petab``: a PEtab problem fitted by the same steps as ``fit`` (a search, step 4, the report),
scored against the petab library's own likelihood and the problem's published parameters."""

from __future__ import annotations

import shutil
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import pgpgm
from pgpgm.errors import DataError, ODESolveError
from pgpgm.posterior.space import ValueSpace
from pgpgm.refinement.multistart import MultiStart, multistart

pytest.importorskip("petab")

COLLECTION = "tests/data/petab_collection"
BLASI = f"{COLLECTION}/Blasi_CellSystems2016/Blasi_CellSystems2016.yaml"


@pytest.fixture(scope="module")
def blasi():
    return pgpgm.load_petab(BLASI)


@pytest.fixture(scope="module")
def fitted(blasi):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgpgm.fit_petab(blasi, posterior="laplace", progressbar=False, seed=0)


def test_the_fit_reaches_the_published_optimum_or_lower_by_the_petab_librarys_own_likelihood(blasi, fitted):
    """The default search's optimum is at least as good as the collection's nominal parameters (+0.1 nats), and
    its nll is what the petab library computes from the simulation table there (an independent likelihood)."""
    nominal = blasi.nll(blasi.nominal_parameters())
    assert fitted.nll <= nominal + 0.1
    assert fitted.search.reason == "agreed" and fitted.search.agreeing >= 3
    llh = blasi.petab_llh(blasi.align(fitted.simulate()), fitted.parameters())  # noise parameters as estimated
    assert fitted.nll == pytest.approx(-llh, rel=1e-9)
    assert set(fitted.petab_parameters) == {p.id for p in blasi.estimated}


def test_the_optimum_is_stationary_inside_its_bounds(blasi, fitted):
    """At the optimum the gradient vanishes in every direction the bounds leave open (the KKT conditions)."""
    nll, grad = blasi.nll_and_gradient(fitted.z)
    lower, upper = blasi.bounds()
    inside = (fitted.z > lower + 1e-6) & (fitted.z < upper - 1e-6)
    assert np.max(np.abs(grad[inside])) < 1e-3 * max(1.0, abs(nll))
    assert np.all(grad[fitted.z <= lower + 1e-6] >= -1e-6) and np.all(grad[fitted.z >= upper - 1e-6] <= 1e-6)


def test_to_petab_writes_tables_the_petab_library_reads_back(blasi, fitted, tmp_path):
    import petab.v1 as petab

    paths = fitted.to_petab(tmp_path / "out")
    table = petab.get_simulation_df(paths["simulation"])
    params = petab.get_parameter_df(paths["parameters"])
    llh = blasi.petab_llh(blasi.align(table), {k: float(v) for k, v in params["nominalValue"].items()})
    assert -llh == pytest.approx(fitted.nll, rel=1e-9)
    for pid, value in fitted.petab_parameters.items():
        assert params.loc[pid, "nominalValue"] == pytest.approx(value, rel=1e-12)
    assert blasi.nll({k: float(v) for k, v in params["nominalValue"].items()}) == pytest.approx(fitted.nll, rel=1e-9)


def test_the_laplace_draws_lie_in_the_bounds_about_the_optimum(blasi, fitted):
    post = fitted.posterior.posterior
    lower, upper = blasi.bounds()
    for k, p in enumerate(blasi.estimated):
        draws = post[p.id].values.ravel()
        assert draws.size == 2000 and np.all((draws >= lower[k]) & (draws <= upper[k]))
    table = fitted.parameter_table()
    assert list(table.index) == [p.id for p in blasi.estimated] and np.all(np.isfinite(table["refined"]))


def test_step_4s_model_is_petabs_likelihood_and_the_uniform_priors_on_the_parameters_scales(blasi, fitted):
    """The pm.Model's log density at the optimum (without the transforms' Jacobians) is -nll plus the log of the
    uniform priors' densities, -sum log(upper - lower) on the parameters' scales."""
    from pgpgm.posterior.petab_model import build_petab_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, names = build_petab_model(blasi)
        point = ValueSpace(model).point(dict(zip(names, fitted.z)))
        logp = float(model.compile_logp(jacobian=False)(point))
    lower, upper = blasi.bounds()
    assert logp == pytest.approx(-fitted.nll - np.sum(np.log(upper - lower)), rel=1e-10)


def test_nuts_on_a_petab_problem_runs_within_its_budget(blasi, fitted):
    """A short NUTS run from the optimum: chains that move, draws in the bounds, the budget recorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit_petab(blasi, posterior=pgpgm.NUTS(draws=30, tune=30, chains=2, cores=1, budget=60),
                            progressbar=False, seed=0)
    post = r.posterior.posterior
    assert r.nll == fitted.nll and post.sizes["chain"] == 2
    assert all(np.std(post[n].values) > 0 for n in r.petab_parameters)
    assert r.diagnostics is not None and "rhat" in r.diagnostics


def test_bad_problems_and_settings_are_clear_errors_before_anything_is_solved(blasi, tmp_path):
    with pytest.raises(DataError, match="no such file|does not exist|not found"):
        pgpgm.fit_petab(tmp_path / "missing.yaml")
    with pytest.raises(DataError, match="search must be a pgpgm.MultiStart"):
        pgpgm.fit_petab(blasi, search={"starts": 5})
    with pytest.raises(DataError, match="agree, min_starts <= max_starts"):
        MultiStart(min_starts=20, max_starts=10)
    folder = tmp_path / "blasi"
    shutil.copytree(f"{COLLECTION}/Blasi_CellSystems2016", folder)
    table = pd.read_csv(folder / "parameters_Blasi_CellSystems2016.tsv", sep="\t")
    table["upperBound"] = table["upperBound"].astype(float)
    table.loc[table["estimate"] == 1, "upperBound"] = np.inf
    table.to_csv(folder / "parameters_Blasi_CellSystems2016.tsv", sep="\t", index=False)
    with pytest.raises(DataError, match="no finite lowerBound and upperBound"):
        pgpgm.fit_petab(folder / "Blasi_CellSystems2016.yaml", posterior=None)


def test_a_search_whose_starts_fail_counts_them_and_goes_on():
    """A double well in one parameter, its solve failing on part of the box: the failures are counted, never
    raised, and the search reaches the deeper well (z = -2, nll -1) that half the starts find."""
    def nll(z):
        if 0.5 < z[0] < 1.5:
            raise ODESolveError("a solve that fails here")
        x = z[0]
        return (x * x - 4.0) ** 2 / 16.0 - 1.0 + 0.25 * (x > 0), np.array([x * (x * x - 4.0) / 4.0])

    found = multistart(nll, np.array([-3.0]), np.array([3.0]), MultiStart(min_starts=12, max_starts=40), seed=1)
    assert found.failed > 0 and np.isinf(found.nlls).sum() == found.failed
    assert found.best == pytest.approx([-2.0], abs=1e-5) and found.nll == pytest.approx(-1.0, abs=1e-9)
    with pytest.raises(ODESolveError, match="every one of the 10 starts"):
        multistart(lambda z: (_ for _ in ()).throw(ODESolveError("never")), np.array([0.0]), np.array([1.0]),
                   MultiStart(min_starts=10, max_starts=10))


@pytest.mark.parametrize("least_squares", [False, True])
def test_a_start_still_running_when_the_budget_ends_stops_there(least_squares):
    """A slow objective (50 ms per evaluation) whose local fit needs hundreds of evaluations: the search ends
    within its 0.3 s budget plus one evaluation and a check, not at the end of that start, and returns the start's
    best point so far (below the start's own value), with reason "seconds"."""
    def rosenbrock(z):
        time.sleep(0.05)
        a, b = z
        return (1 - a) ** 2 + 100 * (b - a * a) ** 2, np.array([-2 * (1 - a) - 400 * a * (b - a * a),
                                                                  200 * (b - a * a)])

    def residuals(z):
        time.sleep(0.05)
        a, b = z
        return np.sqrt(2.0) * np.array([1 - a, 10 * (b - a * a)]), np.sqrt(2.0) * np.array([[-1.0, 0.0],
                                                                                            [-20 * a, 10.0]])

    search = MultiStart(seconds=0.3, min_starts=1, agree=1, max_evaluations=100000)
    t0 = time.perf_counter()
    found = multistart(rosenbrock, np.array([-2.0, -1.0]), np.array([2.0, 3.0]), search, seed=0,
                       residuals=residuals if least_squares else None)
    took = time.perf_counter() - t0
    assert found.reason == "seconds" and len(found.nlls) == 1 and found.failed == 0, found
    assert took < 0.3 + 0.25, took
    assert np.isfinite(found.nll) and found.nll < rosenbrock(found.starts[0])[0], (found.nll, found.starts[0])


def test_a_petab_fit_whose_step_4_cannot_start_returns_the_optimum_with_a_warning(blasi, monkeypatch):
    """NUTS that finds no finite start (forced: its engine raises pgpgm's StartError) ends no fit_petab: the
    optimum stands, no posterior, a warning that says why."""
    from pgpgm.steps import posterior as step4

    def no_start(*args, **kwargs):
        raise pgpgm.StartError("NUTS (PyMC) could not start: Initial evaluation of model at starting point failed")

    monkeypatch.setattr(step4, "run_nuts", no_start)
    with pytest.warns(pgpgm.ConvergenceWarning, match=r"step 4 \(NUTS\) could not start"):
        r = pgpgm.fit_petab(blasi, search=pgpgm.MultiStart(agree=1, min_starts=2, max_starts=2),
                            posterior=pgpgm.NUTS(draws=20, tune=20, chains=2), progressbar=False, seed=0)
    assert r.posterior is None and np.isfinite(r.nll) and "posterior_mean" not in r.estimates

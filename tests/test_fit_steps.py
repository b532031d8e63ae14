"""``fit`` is a composition of step functions with typed results and option objects (issue 32)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import pgpgm
from pgpgm.steps import match, options as step_options, posterior, prepare, refine, report


@pytest.fixture(scope="module")
def problem():
    lv = pgpgm.load_model("lotka-volterra")
    return lv.system, lv.simulate("x1-observed", seed=2)


KW = dict(priors=(0.0, 5.0), draws=200, tune=100, seed=3, progressbar=False)


def test_option_objects_check_their_values(problem):
    with pytest.raises(pgpgm.DataError, match="NUTS draws"):
        pgpgm.NUTS(draws=0)
    with pytest.raises(pgpgm.DataError, match="NUTS sampler"):
        pgpgm.NUTS(sampler="stan")
    with pytest.raises(pgpgm.DataError, match="Laplace draws"):
        pgpgm.Laplace(draws=2.5)
    assert pgpgm.NUTS(budget=30).budget == pgpgm.PosteriorBudget.of(30)
    with pytest.raises(pgpgm.DataError, match="pgpgm.NUTS"):
        pgpgm.fit(*problem, posterior="hmc")


def test_the_flat_step4_keywords_of_earlier_releases_warn_and_give_the_same_fit(problem):
    """``posterior_draws=...`` and the other flat keywords set the NUTS / Laplace fields for one more release, with
    a DeprecationWarning naming what to write; with an option object too they are an error, an unknown keyword a
    TypeError as Python gives."""
    system, data = problem
    with pytest.warns(DeprecationWarning, match=r"posterior=pgpgm.Laplace\(draws=...\)"):
        flat = pgpgm.fit(system, data, posterior="laplace", posterior_draws=40, posterior_chains=3, **KW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = pgpgm.fit(system, data, posterior=pgpgm.Laplace(draws=120), **KW)
    for v in ("theta1", "theta2", "theta3", "theta4"):
        np.testing.assert_array_equal(obj.posterior.posterior[v].values, flat.posterior.posterior[v].values)
    np.testing.assert_array_equal(obj.estimates["theta"].values, flat.estimates["theta"].values)
    assert obj.posterior.posterior.sizes["draw"] == 120
    with pytest.warns(DeprecationWarning, match=r"posterior=pgpgm.NUTS\(draws=0, budget=5\)"):
        with pytest.raises(pgpgm.DataError, match="NUTS draws"):  # the values are checked as the NUTS fields
            pgpgm.fit(system, data, posterior_draws=0, posterior_budget=5, **KW)
    with pytest.raises(pgpgm.DataError, match="both set step 4"):
        pgpgm.fit(system, data, posterior=pgpgm.NUTS(), cores=1, **KW)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kernal'"):
        pgpgm.fit(system, data, kernal="rbf", **KW)


def test_the_steps_called_one_by_one_give_fit_and_their_typed_results(problem):
    """A user can run the steps by hand, inspect each typed result and get ``fit``'s numbers."""
    system, data = problem
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = pgpgm.fit(system, data, posterior=None, **KW)
        options = step_options.fit_options(
            kernel="rbf", gamma=0.3, priors=KW["priors"], noise_sd=None, draws=KW["draws"], tune=KW["tune"], chains=2,
            seed=KW["seed"], init="spread", scheme="block", refine_x0=True, solver=None, posterior=None,
            progressbar=False, stop="agree", grid=None)
        prepared = prepare.prepare(system, data, None, options, x0=None, noise=None, transform=None, fixed=None,
                                   true_theta=None)
        timings, started = {}, time.perf_counter()
        matched = match.match(prepared, options, timings, started)
        refined = refine.refine_step(prepared, matched, options, timings)
        post = posterior.posterior_step(prepared, matched, refined, options, timings)
        result = report.report(prepared, matched, refined, post, options, timings, started)
    np.testing.assert_array_equal(result.estimates["theta"].values, whole.estimates["theta"].values)
    assert result.nll == whole.nll
    run = matched.run
    assert isinstance(run, pgpgm.MatchingRun) and run.decisions and run.last is run.decisions[-1]
    assert run.stopped == bool(whole.estimates.attrs["sampling_stopped"])
    assert list(run.iterations) == list(whole.estimates.attrs["sampling_iterations"])
    if run.stopped:  # step 3 went on from the stop rule's best optimum: the typed decision holds it
        assert "last check's best optimum" in refined.starts
        np.testing.assert_array_equal(refined.starts["last check's best optimum"], np.array(run.last.best_q))
    assert refined.best.nll == min(r.nll for r in refined.refinements)
    assert post.nuts is None and post.tree is run.tree

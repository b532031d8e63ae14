"""Nothing inside a search ends the fit (issues 73 and 76): a solve that fails inside a refinement or inside
step 2's stop rule discards that candidate; the fit returns."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pgpgm
from pgpgm.errors import ODESolveError
from pgpgm.refinement.least_squares import LeastSquaresProblem


@pytest.fixture(scope="module")
def lv():
    spec = pgpgm.load_model("lotka-volterra")
    return spec, spec.simulate("x1-observed", seed=0)


def _failing_after(real, calls: int):
    """``real`` that raises ODESolveError from its ``calls``-th call on (a solve failing partway)."""
    count = [0]

    def method(self, *args, **kwargs):
        count[0] += 1
        if count[0] >= calls:
            raise ODESolveError("CVODE failed: the solver's error test failed repeatedly (forced by the test)")
        return real(self, *args, **kwargs)

    return method, count


def test_a_solve_failing_inside_a_refinement_gives_a_failed_refinement(lv, monkeypatch):
    """refine() from a good start whose noise-sd alternation meets a failing solve returns a failed refinement
    (infinite nll, the reason in its message) instead of raising (before: ODESolveError out of refine)."""
    spec, data = lv
    c = spec.case("x1-observed")
    problem = LeastSquaresProblem(pgpgm.Integrator(spec.system, c.times), data["y"].values[:, :1], [0], 0.5,
                                  np.asarray(c.x0, float), free_x0=(0,))
    q0 = np.concatenate([c.theta, c.x0[:1]])
    method, count = _failing_after(LeastSquaresProblem.rss, 1)
    monkeypatch.setattr(LeastSquaresProblem, "rss", method)
    r = pgpgm.refine(problem, q0, np.array([[0.0, 10.0]] * 4), estimate_noise=True, warn=False)
    assert count[0] >= 1 and not np.isfinite(r.nll) and not r.success
    assert "a solve failed during the refinement (CVODE failed" in r.message


def test_a_fit_whose_stop_rule_meets_failing_solves_returns(lv, monkeypatch):
    """Every refinement of step 2's stop rule from its 5th on meets a failing solve (as a box point outside the
    solver's reach does): the rule discards them and the fit returns, its step 3 at the optimum the same fit
    reaches without failures (step 3's own refinements run after the patch is lifted)."""
    spec, data = lv
    kw = dict(priors=(0.0, 10.0), posterior=None, progressbar=False, seed=0, draws=400, tune=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clean = pgpgm.fit(spec.system, data, ["x1"], **kw)
    import pgpgm.matching.agreement as agreement

    real = agreement.refine
    count = [0]

    def failing(problem, q0, bounds, **kwargs):
        count[0] += 1
        if count[0] >= 5:
            raise ODESolveError("CVODE failed at a box point (forced by the test)")
        return real(problem, q0, bounds, **kwargs)

    monkeypatch.setattr(agreement, "refine", failing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(spec.system, data, ["x1"], **kw)
    assert count[0] > 5  # the rule went on after its refinements failed
    assert r.nll == pytest.approx(clean.nll, abs=1e-3)


def test_a_step_4_that_cannot_start_returns_steps_1_3_with_a_warning():
    """FitzHugh-Nagumo, R measured, parameters drawn from the prior box (a simulation-based calibration's data
    set 53): the refined optimum has c on its bound 0, where the model's right-hand side divides by c and no solve
    succeeds, so nutpie's chains cannot start. The fit returns the steps 1-3 result (as posterior=None) and says
    why, instead of raising nutpie's RuntimeError (which it did before)."""
    spec = pgpgm.load_model("fitzhugh-nagumo")
    case = spec.case("R-observed")
    bounds = pgpgm.Priors.from_user(spec.system.parameters, spec.priors("R-observed")).bounds
    box = {p: (float(lo), float(hi)) for p, (lo, hi) in zip(spec.system.parameters, bounds)}
    rng = np.random.default_rng(10_053)
    theta = [rng.uniform(*box[p]) for p in spec.system.parameters]
    data = pgpgm.simulate(spec.system, theta, case.x0, case.times, observed=["R"], noise_sd=0.1, seed=53)
    x0 = dict(zip(spec.system.states, map(float, case.x0)))
    with pytest.warns(pgpgm.ConvergenceWarning, match=r"step 4 \(NUTS\) could not start"):
        r = pgpgm.fit(spec.system, data, ["R"], x0=x0, noise_sd=0.1, priors=box, seed=53, progressbar=False,
                      posterior=pgpgm.NUTS(budget=60))
    assert list(r.diagnostics["sampler"].values) == ["gradient_matching"]  # no step 4, as with posterior=None
    assert r.estimates["at_bound"].sel(parameter="c").item() == "lower" and np.all(np.isfinite(r.theta))


@pytest.mark.parametrize("sampler", ["pymc", "nutpie"])
def test_either_sampler_that_cannot_start_raises_a_start_error(sampler):
    """A log density that is -inf at every start: both engines raise pgpgm's StartError (which ``fit`` turns into
    the warning above), not PyMC's SamplingError or nutpie's RuntimeError."""
    import pymc as pm
    import pytensor.tensor as pt

    from pgpgm.posterior.rounds import run_nuts

    with pm.Model() as model:
        x = pm.Normal("x", 0.0, 1.0)
        pm.Potential("wall", pt.switch(pt.gt(x, 50.0), 0.0, -np.inf))
    starts = [{"x": 0.0}] * 2 if sampler == "pymc" else None
    with pytest.raises(pgpgm.StartError, match=r"NUTS \((PyMC|nutpie)\) could not start"):
        run_nuts(model, {"x": 0.0}, {"x": 1.0}, draws=20, tune=20, chains=2, cores=1, nuts_sampler=sampler,
                 starts=starts, progressbar=False, warn=False)

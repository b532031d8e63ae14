"""Step 4 that always finishes: its budget, separate modes named, honest bound warnings (issue 30)."""

import json
import time
import warnings

import numpy as np
import xarray as xr
import pytest

import pgpgm
import pgpgm.steps.posterior as pipeline
from pgpgm.refinement.bounds import bound_report
from pgpgm.data import as_observations
from pgpgm.posterior.diagnostics import ConvergenceWarning, diagnose, find_modes, problems
from pgpgm.errors import DataError
from pgpgm.posterior.pymc_engine import TARGET_ACCEPT_MAX, join_waves
from pgpgm.posterior.budget import BudgetMeter, PosteriorBudget
from pgpgm.posterior.model import build_ode_model
from pgpgm.posterior.diagnostics import posterior_notes
from pgpgm.posterior.rounds import sample_posterior

DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
#: a mirror symmetry: the solution depends on k only through k^2, so k and -k fit equally well
MIRROR = pgpgm.ODESystem.from_equations({"x": "-k*k*x"}, ["k"], name="mirror")
T = np.linspace(0, 3, 12)
SD = 0.1


def _data(system, k, seed=3):
    y = 2.0 * np.exp(-(k if system is DECAY else k * k) * T) + np.random.default_rng(seed).normal(0, SD, T.size)
    return as_observations({"time": T, "x": y}, ["x"], system)


def _decay_model():
    obs = _data(DECAY, 0.8)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    return model, layout, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD}


# ---------------------------------------------------------------- the budget
def test_budget_arguments_are_checked():
    assert PosteriorBudget.of(None) == PosteriorBudget(None, None)
    assert PosteriorBudget.of(30) == PosteriorBudget(30.0, None)
    b = PosteriorBudget(10, 500)
    assert PosteriorBudget.of(b) is b
    for bad in (0, -1, float("inf"), "60", True):
        with pytest.raises(DataError, match="budget"):
            PosteriorBudget.of(bad)
    with pytest.raises(DataError, match="gradient_evaluations"):
        PosteriorBudget(10, 0)


def test_a_gradient_budget_stops_the_chains_and_says_so():
    """4000 draws per chain would take ~60000 leapfrog steps; a budget of 3000 stops PyMC's chains once
    3000 are spent (counted exactly, tuning included), keeps the draws made, and warns naming it.
    (nutpie's count is read every POLL seconds: tests/test_step4_nutpie.py.)"""
    model, layout, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="budget.*gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, draws=4000, tune=200, chains=2, cores=1, seed=1,
                                progressbar=False, budget=PosteriorBudget(None, 3000), nuts_sampler="pymc")
    spent = json.loads(tree.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "gradient evaluations"
    assert 3000 <= spent["used_gradient_evaluations"] <= 3000 + 1023  # the last draw's tree at most
    assert 0 < tree.posterior.sizes["draw"] < 4000 and tree.attrs["pgpgm_rounds"] == 1
    assert np.all(np.isfinite(tree.posterior["k"].values))
    # tuning iterations plus the kept draws' leapfrog steps do not exceed what was counted
    assert int(tree.sample_stats["n_steps"].sum()) <= spent["used_gradient_evaluations"]


def test_a_budget_spent_while_tuning_returns_the_tuning_draws():
    model, layout, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="while tuning"):
        tree = sample_posterior(model, center, sd, draws=500, tune=1000, chains=2, cores=1, seed=1,
                                progressbar=False, budget=PosteriorBudget(None, 400))
    assert tree.attrs["pgpgm_tuning_draws"] == 1 and tree.posterior.sizes["draw"] >= 1
    assert "warmup_posterior" not in tree.children


def test_a_time_budget_returns_on_time():
    """2 s for what would take minutes: sample_posterior returns within the budget plus one draw's
    and the return's overhead (generous on a shared machine)."""
    model, layout, center, sd = _decay_model()
    sample_posterior(model, center, sd, draws=20, tune=20, chains=1, cores=1, progressbar=False, warn=False)  # compiled
    t0 = time.perf_counter()
    with pytest.warns(ConvergenceWarning, match="seconds ran out"):
        tree = sample_posterior(model, center, sd, draws=200_000, tune=100, chains=2, cores=1, seed=1,
                                progressbar=False, budget=2.0)
    assert time.perf_counter() - t0 < 2.0 + 8.0
    spent = json.loads(tree.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "seconds" and spent["used_seconds"] >= 2.0
    assert "posterior=pgpgm.NUTS(budget=pgpgm.PosteriorBudget(8.0, None))" in posterior_notes(tree)[0]


@pytest.mark.slow
def test_further_rounds_cap_the_step_size_target(monkeypatch):
    """Further rounds raise target_accept halfway to 1 (0.9 -> 0.95 -> 0.975) but not above 0.99 (0.98 ->
    0.99 -> 0.99, not 0.995, 0.9975, ... which shrank the step size without bound), at tree depth 10. The
    checks are made to fail every round here (``problems`` patched) so that three rounds run (PyMC's
    engine: nutpie, the default where every value variable is a scalar, runs no rounds but one further run,
    at 0.99, for divergences)."""
    import pgpgm.posterior.rounds as posterior

    made, funcs, compiled = [], [], []
    real = posterior.pm.NUTS
    real_compile = posterior.pm.Model.logp_dlogp_function

    def nuts(*args, **kw):
        made.append((kw["target_accept"], kw["max_treedepth"]))
        funcs.append(kw["logp_dlogp_func"])
        return real(*args, **kw)

    def compile_once(self, *args, **kw):
        compiled.append(self)
        return real_compile(self, *args, **kw)

    monkeypatch.setattr(posterior.pm, "NUTS", nuts)
    monkeypatch.setattr(posterior.pm.Model, "logp_dlogp_function", compile_once)
    monkeypatch.setattr(posterior, "problems", lambda diag: ["made to fail"])
    model, layout, center, sd = _decay_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for first in (0.9, 0.98):
            tree = sample_posterior(model, center, sd, draws=200, tune=100, chains=4, cores=1, seed=2, max_rounds=3,
                                    nuts_sampler="pymc", progressbar=False, target_accept=first)
            assert tree.attrs["pgpgm_rounds"] == 3
    assert TARGET_ACCEPT_MAX == 0.99
    assert made == [(0.9, 10), (0.95, 10), (0.975, 10), (0.98, 10), (0.99, 10), (0.99, 10)]
    # the log density and gradient are compiled once per call, and its three rounds take that function
    assert len(compiled) == 2 and funcs[0] is funcs[1] is funcs[2] and funcs[3] is funcs[4] is funcs[5]
    assert funcs[0] is not funcs[3]


def test_a_round_the_budget_cannot_afford_is_not_started():
    """From a badly scaled mass matrix the first round fails the checks (a second round would run).
    With a budget of that round's gradient evaluations plus 5 % (every chain's share holds its own,
    cores=1), none starts (it could not reach 100 draws), and the result says the budget ran out."""
    obs = _data(DECAY, 0.8)
    model, layout = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    start, sd = {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.2, "x_0": 0.01}
    kw = dict(draws=200, tune=30, chains=4, cores=1, seed=2, max_rounds=2, progressbar=False, nuts_sampler="pymc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = sample_posterior(model, start, sd, **{**kw, "max_rounds": 1})
    used_one = json.loads(one.attrs["pgpgm_budget"])["used_gradient_evaluations"]
    assert problems(diagnose(one, ["k", "x_0"]))  # R-hat and ESS fail: without a budget, a second round
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        small = sample_posterior(model, start, sd, **kw, budget=PosteriorBudget(None, int(1.05 * used_one)))
    spent = json.loads(small.attrs["pgpgm_budget"])
    assert small.attrs["pgpgm_rounds"] == 1 and spent["exhausted"] == "gradient evaluations"
    assert spent["used_gradient_evaluations"] == used_one  # round 1 ran whole, and nothing after it


def test_fit_takes_and_checks_a_posterior_budget():
    with pytest.raises(DataError, match=r"NUTS\(budget=...\)"):
        pgpgm.fit(DECAY, {"time": T, "x": np.exp(-T)}, ["x"], posterior=pgpgm.NUTS(budget="1 minute"))
    with pytest.raises(DataError, match="seconds"):
        pgpgm.fit(DECAY, {"time": T, "x": np.exp(-T)}, ["x"], posterior=pgpgm.NUTS(budget=-5))


# ---------------------------------------------------------------- separate modes
def _mirror_model():
    obs = _data(MIRROR, 1.0)
    model, layout = build_ode_model(MIRROR, obs, x0=[np.nan], priors={"k": (-3.0, 3.0)}, noise_sd=[SD])
    return obs, model, layout


def test_chains_in_two_mirror_modes_are_named_not_pooled():
    """x' = -k^2 x: k = +1 and k = -1 fit the data equally well. Chains started in both basins stay
    there (the modes are ~100 posterior sds apart); the result names both modes with their chains
    and does not pass the pooled draws as converged, and no pooled further round runs."""
    obs, model, layout = _mirror_model()
    x0 = float(obs.values[0, 0])
    starts = [{"k": k, "x_0": x0} for k in (1.0, -1.0, 1.0, -1.0)]
    with pytest.warns(ConvergenceWarning, match="2 separate modes") as rec:
        tree = sample_posterior(model, {"k": 1.0, "x_0": x0}, {"k": 0.02, "x_0": SD}, draws=300, tune=300,
                                chains=4, cores=1, seed=0, progressbar=False, starts=starts)
    modes = json.loads(tree.attrs["pgpgm_modes"])
    assert sorted(tuple(m["chains"]) for m in modes) == [(0, 2), (1, 3)]
    k_means = sorted(m["mean"]["k"] for m in modes)
    assert k_means[0] == pytest.approx(-1.0, abs=0.1) and k_means[1] == pytest.approx(1.0, abs=0.1)
    # mirror images: the same fit, so the same mean log density within Monte-Carlo noise
    assert abs(modes[0]["log_density"] - modes[1]["log_density"]) < 1.0
    assert tree.attrs["pgpgm_rounds"] == 1 and json.loads(tree.attrs["pgpgm_round_problems"]) == []
    text = str(rec[0].message)
    assert "chains 0, 2 at k=" in text and "chains 1, 3 at k=" in text and "not converged" in text


def test_a_stuck_chain_is_a_mode_of_its_own():
    """A chain whose step size collapsed at a prior bound barely moves (Lotka-Volterra x1, large noise,
    seed 0: sds 1e-14 to 1e-8, its halves apart by more than that, so not "settled" by that test): it is
    named as a mode of its own, not taken for a chain on its way; three mixing chains stay one mode."""
    rng = np.random.default_rng(0)
    k = rng.normal(1.0, 0.3, (4, 200))
    k[3] = 7.0 + 1e-9 * np.arange(200)  # stuck, drifting by 2e-7 in all: 3.5 of its own sds between halves
    tree = xr.DataTree.from_dict({"posterior": xr.Dataset({"k": (("chain", "draw"), k)})})
    modes = find_modes(tree, ["k"])
    assert sorted(m.chains for m in modes) == [(0, 1, 2), (3,)]
    assert [m.mean["k"] for m in modes if m.chains == (3,)][0] == pytest.approx(7.0)
    k[3] = rng.normal(1.0, 0.3, 200)  # four mixing chains: one mode
    assert find_modes(xr.DataTree.from_dict({"posterior": xr.Dataset({"k": (("chain", "draw"), k)})}), ["k"]) == ()


def test_one_mode_is_not_split():
    """Four chains in one mode (the decay posterior): no modes, whatever their Monte-Carlo spread."""
    model, layout, center, sd = _decay_model()
    tree = sample_posterior(model, center, sd, draws=300, tune=300, chains=4, cores=1, seed=0, progressbar=False)
    assert find_modes(tree, layout.free) == () and json.loads(tree.attrs["pgpgm_modes"]) == []


def test_fit_names_each_modes_refined_optimum(monkeypatch):
    """A fit whose step-4 chains sit in the two mirror basins: its warning names both modes and the
    optimum each refines to (k = +-1.0, the same negative log likelihood: mirror optima)."""
    real = pipeline.run_nuts

    def two_basins(model, center, sd, **kw):
        k = abs(center["k"])
        starts = [{**center, "k": s * k} for s in (1, -1, 1, -1)]
        return real(model, center, sd, **{**kw, "starts": starts})

    monkeypatch.setattr(pipeline, "run_nuts", two_basins)
    obs = _data(MIRROR, 1.0)
    data = {"time": T, "x": obs.values[:, 0]}
    with pytest.warns(ConvergenceWarning, match="refines to k=") as rec:
        r = pgpgm.fit(MIRROR, data, ["x"], priors={"k": (-3.0, 3.0)}, noise_sd=SD, progressbar=False,
                      posterior=pgpgm.NUTS(draws=200, tune=200, cores=1), draws=200, tune=200)
    modes = json.loads(r.posterior.attrs["pgpgm_modes"])
    refined = sorted(m["refined"]["k"] for m in modes)
    assert refined[0] == pytest.approx(-refined[1], rel=1e-4) and refined[1] == pytest.approx(abs(
        float(r.estimates["theta"].sel(estimate="refined", parameter="k"))), rel=1e-4)
    assert modes[0]["nll"] == pytest.approx(modes[1]["nll"], abs=1e-6)
    assert any("separate modes" in str(w.message) for w in rec)


# ---------------------------------------------------------------- bounds
def test_a_small_well_determined_estimate_is_not_at_the_bound():
    """Issue 30: 0.020 +- 0.005 in a box (0, 30) is determined by the data, 4 se from the bound 0;
    its posterior decays before 0. Neither is flagged (the old rule, 1e-3 of the box width = 0.03,
    flagged it). An estimate within 2 se of the bound, or on it, is; so is a posterior piled up
    against it."""
    priors = pgpgm.Priors.from_user(["a"], {"a": (0.0, 30.0)})
    rng = np.random.default_rng(0)
    draws = rng.normal(0.02, 0.005, 4000)
    draws = draws[draws > 0]
    assert bound_report(priors, [0.02], {"a": draws}, stderr=[0.005]) == ()
    on = bound_report(priors, [0.006], None, stderr=[0.005])
    assert [(a.side, a.refined) for a in on] == [("lower", True)] and "within 2 standard errors" in on[0].message
    assert bound_report(priors, [1e-9], None, stderr=[np.nan])[0].refined  # no se: on the bound itself
    piled = np.abs(rng.normal(0, 0.01, 4000))  # a half-normal: the density is highest at the bound
    report = bound_report(priors, [0.02], {"a": piled}, stderr=[0.005])
    assert [(a.side, a.refined) for a in report] == [("lower", False)] and report[0].fraction > 0.2


def test_an_uncertainty_wider_than_the_box_names_one_bound_and_says_so():
    """A refined 3.7 +- 11.3 in (0, 10) (Lotka-Volterra x1 with large noise) is within 2 se of both
    bounds: it is named once, at the nearer bound, as hardly determined (not "at the lower bound 0
    and at the upper bound 10"); an estimate on its bound itself with the same se is at that bound."""
    priors = pgpgm.Priors.from_user(["a", "b"], {"a": (0.0, 10.0), "b": (0.0, 10.0)})
    report = bound_report(priors, [3.7, 10.0], None, stderr=[11.3, 34.2])
    assert [(a.parameter, a.side, a.active) for a in report] == [("a", "lower", False), ("b", "upper", True)]
    assert "hardly determined" in report[0].message and "(22.6)" in report[0].message
    assert "widen the prior" in report[1].message and "hardly" not in report[1].message
    # an se within the box: the usual message
    assert "within 2 standard errors" in bound_report(priors, [1.0], None, stderr=[0.6])[0].message


def test_the_time_before_sampling_counts_but_leaves_sampling_a_share():
    """run_nuts(started=): the budget's seconds count from when step 4 began (fit: before building the model,
    whose solve compiles on a cold cache); 9 s spent before a 4 s budget still leave MIN_SAMPLING_SHARE (1 s)
    to sampling, and 2 s spent before an 8 s budget leave 6 s."""
    from pgpgm.posterior.budget import MIN_SAMPLING_SHARE
    from pgpgm.posterior.rounds import run_nuts

    model, layout, center, sd = _decay_model()
    run_nuts(model, center, sd, draws=20, tune=20, chains=1, cores=1, progressbar=False, warn=False)  # compiled
    for budget, before, sampling in ((4.0, 9.0, MIN_SAMPLING_SHARE * 4.0), (8.0, 2.0, 6.0)):
        t0 = time.perf_counter()
        run = run_nuts(model, center, sd, draws=200_000, tune=100, chains=2, cores=1, seed=1, progressbar=False,
                       budget=budget, warn=False, started=t0 - before)
        took = time.perf_counter() - t0
        assert run.budget["exhausted"] == "seconds"
        assert sampling <= took < sampling + 4.0, (budget, before, took)
        assert run.budget["used_seconds"] >= min(budget, before + sampling) - 0.1


def test_fit_returns_on_its_posterior_budget_with_the_warning():
    """fit(posterior=NUTS(budget=)) reaches step 4: a budget of 600 gradient evaluations stops it (counted
    exactly: at most one tree past it), and the fit returns its draws and says so."""
    obs = _data(DECAY, 0.8)
    data = {"time": T, "x": obs.values[:, 0]}
    with pytest.warns(ConvergenceWarning, match="step 4 stopped at its budget"):
        r = pgpgm.fit(DECAY, data, ["x"], priors={"k": (0.0, 5.0)}, noise_sd=SD, progressbar=False, draws=200,
                      tune=200, posterior=pgpgm.NUTS(budget=PosteriorBudget(None, 600), sampler="pymc", cores=1))
    spent = json.loads(r.posterior.attrs["pgpgm_budget"])
    # PyMC's engine checks the budget after every draw: it passes by at most one trajectory (tree depth 10)
    assert spent["exhausted"] == "gradient evaluations" and 600 <= spent["used_gradient_evaluations"] <= 600 + 1023
    assert r.posterior.posterior.sizes["draw"] >= 1 and np.all(np.isfinite(r.posterior.posterior["k"].values))


def test_fit_names_an_sd_its_budget_left_above_the_goal_once():
    """A converged fit whose extension for sharper sds ends at 3/4 of its gradient budget before a 0.3 % goal
    (a Gaussian posterior's sd asks ~55000 independent draws for it) says so once, with each variable above the
    goal and its error as result.diagnostics reports it; no ConvergenceWarning (R-hat and ESS hold)."""
    obs = _data(DECAY, 0.8)
    data = {"time": T, "x": obs.values[:, 0]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pgpgm.fit(DECAY, data, ["x"], priors={"k": (0.0, 5.0)}, noise_sd=SD, progressbar=False, seed=0,
                      posterior=pgpgm.NUTS(sd_error=0.003, budget=PosteriorBudget(None, 200_000)))
    precise = [w for w in caught if issubclass(w.category, pgpgm.PrecisionWarning)]
    assert len(precise) == 1 and "sd_error=0.003 asks" in str(precise[0].message)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    diag = r.diagnostics.sel(sampler="posterior")
    assert not problems(diag)
    over = {str(v): float(e) for v, e in zip(diag["variable"].values, diag["sd_error"].values) if e > 0.003}
    assert over and all(f"{v} ({e:.1%})" in str(precise[0].message) for v, e in over.items())
    assert json.loads(r.posterior.attrs["pgpgm_budget"])["exhausted"] == ""  # draws that passed: no budget stop


def test_an_unconverged_fit_names_a_parameter_on_its_bound_as_a_likely_cause():
    """The box (0, 0.5) cuts off the data's k = 0.8: the refined k lies on the upper bound, and when step 4
    then fails R-hat or ESS (a small budget here) its ConvergenceWarning names that bound as a likely cause
    and points to the BoundWarning, instead of only "run longer chains"."""
    obs = _data(DECAY, 0.8)
    data = {"time": T, "x": obs.values[:, 0]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pgpgm.fit(DECAY, data, ["x"], priors={"k": (0.0, 0.5)}, noise_sd=SD, progressbar=False, draws=200,
                      tune=200, posterior=pgpgm.NUTS(budget=PosteriorBudget(None, 600), sampler="pymc", cores=1))
    assert r.at_bounds and "k" in r.at_bounds
    assert r.convergence_problems()["posterior"]
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning))
    assert "k (upper) at a bound of the prior box" in text and "widen the box" in text


def test_the_causes_of_poor_mixing_in_words():
    from pgpgm.posterior.diagnostics import causes_of_poor_mixing
    from pgpgm.refinement import AtBound

    assert causes_of_poor_mixing((), []) == []
    notes = causes_of_poor_mixing(("ke0",), [AtBound("V", "upper", 10.0, (0.0, 10.0), True, 0.3)])
    assert len(notes) == 2 and notes[0].startswith("the data do not determine ke0") and "fixed=" in notes[0]
    assert notes[1].startswith("V (upper) at a bound")


def test_chains_in_one_process_share_the_budget():
    """cores=1 runs the chains one after the other: each gets an equal share of the budget, so a stop
    leaves every chain, at about the same length (not the first chain whole and the others undrawn)."""
    model, layout, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, draws=4000, tune=100, chains=4, cores=1, seed=1,
                                progressbar=False, budget=PosteriorBudget(None, 8000))
    assert tree.posterior.sizes["chain"] == 4 and 100 < tree.posterior.sizes["draw"] < 4000
    spent = json.loads(tree.attrs["pgpgm_budget"])
    # nutpie reports its steps every 0.1 s and the run stops at the first report past the budget: on this
    # model ~3000-7000 gradients a report (more where the solve is cheaper), so the stop comes within two of them
    assert spent["exhausted"] == "gradient evaluations" and spent["used_gradient_evaluations"] <= 2 * 8000 + 4 * 1023


@pytest.mark.slow  # CI checks that waves share the budget; their draws are checked with --slow
def test_chains_in_waves_draw_as_the_chains_of_one_call(monkeypatch):
    """Four chains on two processes with a budget run as two waves of two chains, one pymc.sample call
    each, every chain with its own random stream and start: the same draws as the four chains sampled
    in one call (here one process, cores=1), when the budget does not bind."""
    import pgpgm.posterior.pymc_engine as nuts

    model, layout, center, sd = _decay_model()
    kw = dict(draws=60, tune=60, chains=4, seed=3, progressbar=False, warn=False, max_rounds=1,
              budget=PosteriorBudget(None, 10**7), nuts_sampler="pymc")
    calls = []
    real = nuts.sample_in_processes

    def counted(sample, **kwargs):
        calls.append((kwargs["chains"], kwargs["cores"]))
        return real(sample, **kwargs)

    monkeypatch.setattr(nuts, "sample_in_processes", counted)
    waves = sample_posterior(model, center, sd, cores=2, **kw)
    assert calls == [(2, 2), (2, 2)]
    one = sample_posterior(model, center, sd, cores=1, **kw)
    assert calls[2:] == [(4, 1)]
    assert waves.posterior.sizes["chain"] == 4 and list(waves.posterior.chain.values) == [0, 1, 2, 3]
    for v in ("k", "x_0"):  # equal but for rounding (7e-10 apart once, on a loaded machine)
        np.testing.assert_allclose(waves.posterior[v].values, one.posterior[v].values, rtol=1e-7)
    np.testing.assert_array_equal(waves.sample_stats["n_steps"].values, one.sample_stats["n_steps"].values)
    assert np.all(np.ptp(waves.posterior["k"].values, axis=1) > 0)  # every chain moved


def test_chains_in_waves_share_the_budget():
    """A gradient budget that binds, four chains on two processes: each wave of two chains gets half of
    it, so every chain is drawn, all at one length (PyMC's own scheduling of four chains on two
    processes starts chains 2 and 3 only when 0 and 1 end, which this budget stops first). PyMC's sampler:
    the default engine for this model is nutpie, whose chains are threads of one run (no waves; its budget is
    read every POLL seconds, 16000 gradients of this fast model may pass between two reads)."""
    model, layout, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, draws=4000, tune=100, chains=4, cores=2, seed=1,
                                progressbar=False, budget=PosteriorBudget(None, 16000), max_rounds=1,
                                nuts_sampler="pymc")
    assert tree.posterior.sizes["chain"] == 4 and 100 < tree.posterior.sizes["draw"] < 4000
    spent = json.loads(tree.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "gradient evaluations" and spent["dropped_chains"] == 0
    # the last wave may run a quarter of the budget over while a late-started chain catches up, and
    # what the waves drew before their last chain started is not counted
    late = spent["late_start_gradient_evaluations"]
    assert 16000 <= spent["used_gradient_evaluations"] <= 1.25 * 16000 + late + 4 * 1023 and late <= 16000
    steps = tree.sample_stats["n_steps"].sum("draw").values  # each chain's leapfrog steps after tuning
    assert steps.min() > 0.5 * steps.max()  # the second wave's chains as long as the first's


def _wave_draws(meter, steps_by_chain):
    """Feed ``meter`` one draw per (chain, leapfrog steps) in order, as PyMC's callback; returns how
    many draws it took until it stopped the sampling (KeyboardInterrupt), or None."""
    from types import SimpleNamespace

    for i, (chain, steps) in enumerate(steps_by_chain):
        try:
            meter(None, SimpleNamespace(chain=chain, stats=[{"tree_size": steps}]))
        except KeyboardInterrupt:
            return i + 1
    return None


def test_the_time_that_ending_takes_counts_as_spent():
    """nutpie's run ends by reading its trace back (as long as a check: up to seconds): the meter
    counts those seconds as spent already, so that step 4 returns within its time budget."""
    meter = BudgetMeter(PosteriorBudget(10.0, None))
    meter.start -= 9.0  # 9 s of the 10 spent
    assert meter.check() == "" and meter.check(ahead=0.5) == ""
    assert meter.check(ahead=1.5) == "seconds" and meter.check() == "seconds"  # remembered


def test_a_wave_waits_for_its_slow_chain_and_a_very_slow_one_is_capped():
    """Two waves of two chains, 8000 gradient evaluations: wave 0 ends once *each* of its chains has
    used 2000 (half of its 4000), not once the pair has used 4000 - a chain whose process runs 1.5x
    slower (a loaded machine) is not stopped at two thirds of its part; a chain 10x slower is, once
    the wave has used 4000 + half of wave 1's 4000 = 6000 (after its lag). Wave 1 then gets what is left,
    1000 each."""
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    assert _wave_draws(meter, [(0, 10), (0, 10), (0, 10), (1, 10), (1, 10)] * 1000) == 500
    assert meter.wave_gradients == {0: 3000, 1: 2000} and not meter.exhausted
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    # 55 x 11 draws, then 6 of chain 0 (the 110 evaluations before chain 1's first draw are the wave's lag)
    assert _wave_draws(meter, [*[(0, 10)] * 10, (1, 10)] * 1000) == 611
    assert meter.wave_gradients == {0: 5560, 1: 550} and not meter.exhausted
    meter.end_wave()
    meter.begin_wave(1, 2)
    assert _wave_draws(meter, [(0, 10), (1, 10)] * 1000) == 200
    assert meter.wave_gradients == {0: 1000, 1: 1000} and meter.cut == "gradient evaluations"


def test_a_wave_waits_until_a_late_started_chain_would_be_kept():
    """A chain whose process starts 140 draws late (a loaded machine): its wave does not end when each
    chain has used its part (chain 1 at 200 draws, chain 0 at 340 - PyMC, stopped, leaves out a chain
    with fewer than half the longest's iterations, and 0.59 is near that) but once the late chain has
    0.6 of the other's: 210 and 350. In the last wave this runs past the budget (8000) by up to half
    the wave's share (2000); the budget is then used up, and the wave's stop says so."""
    late = [(0, 10)] * 140 + [(0, 10), (1, 10)] * 1000
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    assert _wave_draws(meter, late) == 350 + 210
    assert meter.wave_draws == {0: 350, 1: 210} and meter.gradients == 5600 and not meter.exhausted
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    assert _wave_draws(meter, [(0, 10), (1, 10)] * 1000) == 400  # 2000 each, balanced: the share
    meter.begin_wave(1, 2)
    assert meter.gradients_left() == 4000 + 2000  # the last wave's share, and half of it beyond
    assert _wave_draws(meter, late) == 350 + 210
    assert meter.gradients == 4000 + 5600 and meter.cut == "gradient evaluations" and not meter.check()
    meter.end_waves()
    assert meter.gradients_left() == 8000 - 9600 and meter.check() == "gradient evaluations"
    meter.dropped = 1  # had a chain been left out anyway, the warning's note says so
    tree = xr.DataTree()
    tree.attrs["pgpgm_budget"] = json.dumps(meter.record())
    assert "it stopped 1 chain(s) before they had drawn a quarter as much" in posterior_notes(tree)[0]


def test_a_waves_gradients_before_its_last_chain_starts_are_not_held_against_it():
    """Chain 1's process starts 300 draws (3000 gradient evaluations) after chain 0's (processes start
    seconds apart on a loaded machine; a fast model draws thousands of gradients a second). Those are
    the wave's lag: its cap (4000 + half of wave 1's 4000) counts from where chain 1 started, so the
    wave ends at 9020 with chain 1 at 301 draws - counting the lag, it ended at 6000 with chain 1 at 150
    of chain 0's 450, and PyMC left chain 1 out. The lag (up to the wave's share) is not taken from
    the budget either, and the record says how much it was."""
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    assert _wave_draws(meter, [(0, 10)] * 300 + [(0, 10), (1, 10)] * 1000) == 300 + 2 * 301
    assert meter.wave_draws == {0: 601, 1: 301} and meter.gradients == 9020 and not meter.exhausted
    meter.end_wave()
    assert meter.late == 3020 and meter.record()["late_start_gradient_evaluations"] == 3020
    meter.begin_wave(1, 2)
    assert meter.gradients_left() == 8000 + 3020 - 9020 + 1000  # what is left, and half of it beyond
    # a chain that never starts: the lag stops growing at the wave's share, and the budget ends the wave
    meter = BudgetMeter(PosteriorBudget(None, 8000))
    meter.begin_waves(2)
    meter.begin_wave(0, 2)
    assert _wave_draws(meter, [(0, 10)] * 2000) == 1000  # 4000 of lag, then the cap of 6000
    assert meter.record()["late_start_gradient_evaluations"] == 4000


def test_a_spent_budget_waits_for_a_chain_that_has_not_started():
    """Chains that run at once, a budget of 100 gradient evaluations: spent by chain 0 while chain 1's
    process is still starting, the stop waits for chain 1's first draw (an 8 s budget on Lotka-Volterra
    had kept 1 chain of 1 draw: the processes' start took it all), then stops with both - but not past
    1.25 times the budget when chain 1 does not come."""
    meter = BudgetMeter(PosteriorBudget(None, 100))
    meter.begin_round(2, sequential=False)
    assert _wave_draws(meter, [(0, 60), (0, 30), (0, 20), (1, 10), (0, 10)]) == 4
    assert meter.call_draws == {0: 3, 1: 1} and meter.exhausted == "gradient evaluations"
    meter = BudgetMeter(PosteriorBudget(None, 100))
    meter.begin_round(2, sequential=False)
    assert _wave_draws(meter, [(0, 30)] * 10) == 5  # 150: past 1.25 x the budget


def test_chains_stopped_together_are_cut_to_the_shortest_rather_than_left_out():
    """When the budget stops chains that run at once, the longer chains' traces end at the shortest's
    length (PyMC then keeps every chain) - unless the shortest has drawn under a quarter of the
    longest's iterations; chains run one after another are left as they are."""
    from types import SimpleNamespace

    def stop(meter, lengths):
        traces = [SimpleNamespace(draw_idx=n) for n in lengths]
        with pytest.raises(KeyboardInterrupt):
            for c, t in enumerate(traces):
                meter(t, SimpleNamespace(chain=c, stats=[{"tree_size": 10}]))
        return [t.draw_idx for t in traces]

    for lengths, kept in (([40, 12, 30], [12, 12, 12]), ([40, 9, 30], [40, 9, 30])):
        meter = BudgetMeter(PosteriorBudget(None, 25))
        meter.begin_round(3, sequential=False)
        assert stop(meter, lengths) == kept
    meter = BudgetMeter(PosteriorBudget(None, 25))
    meter.begin_round(3, sequential=True)
    assert stop(meter, [40, 12, 30]) == [40, 12, 30]


def test_a_wave_whose_time_share_went_to_starting_its_processes_waits_for_its_chains():
    """10 s in two waves: wave 0's time ends at 5 s. A draw of chain 0 alone after 6 s (the processes'
    start took the share) does not end it - chain 1 has drawn nothing and would be left out - a draw
    of each does; past 7.5 s (half of wave 1's time taken too) the first draw ends it."""
    for late, stop in ((6.0, 2), (8.0, 1)):
        meter = BudgetMeter(PosteriorBudget(10.0, None))
        meter.begin_waves(2)
        meter.begin_wave(0, 2)
        meter.start -= late  # as if the wave's processes had taken ``late`` seconds to start
        assert _wave_draws(meter, [(0, 5), (1, 5)]) == stop and meter.cut == "seconds" and not meter.exhausted


def _wave_tree(chains: int, draws: int, tuning: bool = False) -> xr.DataTree:
    post = xr.Dataset({"k": (("chain", "draw"), np.ones((chains, draws)))},
                      coords={"chain": np.arange(chains), "draw": np.arange(draws)})
    stats = xr.Dataset({"n_steps": (("chain", "draw"), np.full((chains, draws), 3.0))}, coords=post.coords)
    tree = xr.DataTree.from_dict({"posterior": post, "sample_stats": stats})
    if tuning:
        tree.attrs["pgpgm_tuning_draws"] = 1
    return tree


def test_waves_are_joined_keeping_the_most_draws():
    """A wave is kept when it has at least a quarter of the longest wave's draws (as chains stopped
    together): a wave of 1 draw is left out, not every chain cut to 1 draw; waves of 300 and 200 draws
    are joined at 200, and so are waves of 740 and 271 (a slower process; PyMC's rule, chains x shortest
    length, had kept 2 chains of 740: seen in CI); tuning draws only where no wave has draws after
    tuning."""
    one = join_waves([_wave_tree(2, 1), _wave_tree(2, 400)])
    assert one.posterior.sizes == {"chain": 2, "draw": 400}
    both = join_waves([_wave_tree(2, 300), _wave_tree(2, 200)])
    assert both.posterior.sizes == {"chain": 4, "draw": 200} and list(both.posterior.chain.values) == [0, 1, 2, 3]
    assert join_waves([_wave_tree(2, 740), _wave_tree(2, 271)]).posterior.sizes == {"chain": 4, "draw": 271}
    assert join_waves([_wave_tree(2, 740), _wave_tree(2, 99), _wave_tree(2, 400)]).posterior.sizes == {
        "chain": 4, "draw": 400}
    assert join_waves([_wave_tree(2, 50, tuning=True), _wave_tree(2, 10)]).posterior.sizes["draw"] == 10
    assert join_waves([_wave_tree(2, 50, tuning=True), _wave_tree(2, 30, tuning=True)]).posterior.sizes == {
        "chain": 4, "draw": 30}


def test_a_budget_spent_just_after_tuning_keeps_the_latter_tuning_draws_too():
    """A gradient budget that runs out a few draws after tuning (counted from an unbudgeted run of the
    same seed: the draws are the same up to the stop) keeps the latter half of the tuning iterations
    with those draws, not a handful of draws that no diagnostic can judge."""
    model, layout, center, sd = _decay_model()
    kw = dict(draws=300, tune=200, chains=1, cores=1, seed=4, progressbar=False, max_rounds=1, nuts_sampler="pymc")
    free = sample_posterior(model, center, sd, warn=False, **kw)
    per_draw = free.sample_stats["n_steps"].values[0]
    spent_tuning = json.loads(free.attrs["pgpgm_round_gradient_evaluations"])  # after tuning only
    used = json.loads(free.attrs["pgpgm_budget"])["used_gradient_evaluations"]
    tuning = used - spent_tuning[0]  # the leapfrog steps of the 200 tuning iterations
    budget = tuning + int(per_draw[:3].sum())  # spent on the 3rd draw after tuning
    with pytest.warns(ConvergenceWarning, match="while tuning"):
        tree = sample_posterior(model, center, sd, budget=PosteriorBudget(None, budget), **kw)
    assert tree.attrs["pgpgm_tuning_draws"] == 1
    assert tree.posterior.sizes["draw"] == 100 + 3  # the latter 100 tuning iterations, then the 3 draws
    np.testing.assert_array_equal(tree.posterior["k"].values[0, -3:], free.posterior["k"].values[0, :3])


def test_a_budget_spent_before_the_first_wave_still_returns_its_first_draws():
    """A time budget spent before any wave starts (0.01 s: compiling the log density takes longer):
    the first wave runs to its first draws, the result says the budget ran out and which chains
    were left out, instead of failing to join no waves."""
    model, layout, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="seconds ran out"):
        tree = sample_posterior(model, center, sd, draws=200, tune=100, chains=4, cores=2, seed=1,
                                progressbar=False, budget=PosteriorBudget(0.01, None), max_rounds=1,
                                nuts_sampler="pymc")  # PyMC's waves
    spent = json.loads(tree.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "seconds" and 1 <= tree.posterior.sizes["chain"] <= 2
    assert spent["dropped_chains"] == 4 - tree.posterior.sizes["chain"]
    assert np.all(np.isfinite(tree.posterior["k"].values))


@pytest.mark.parametrize("draws", [0, 2])
def test_a_posterior_with_too_few_draws_says_so_instead_of_nan_r_hats(draws):
    """A budget spent before any draw (a PEtab model whose gradient takes 0.4 s) leaves no draws: the finding is
    "no draws" (or how few), not an R-hat of nan per parameter."""
    from pgpgm.posterior.diagnostics import mixing_problems

    rng = np.random.default_rng(0)
    tree = xr.DataTree.from_dict({"posterior": xr.Dataset({n: (("chain", "draw"), rng.normal(size=(4, draws)))
                                                           for n in ("a", "b")})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's warnings about so few draws
        found = mixing_problems(diagnose(tree, ["a", "b"]))
    assert found == (["no draws"] if draws == 0 else ["only 2 draws per chain, too few to judge R-hat and ESS"])
    many = xr.DataTree.from_dict({"posterior": xr.Dataset({n: (("chain", "draw"), rng.normal(size=(4, 600)))
                                                           for n in ("a", "b")})})
    assert mixing_problems(diagnose(many, ["a", "b"])) == []  # independent normal draws: R-hat ~ 1, ESS ~ 2400

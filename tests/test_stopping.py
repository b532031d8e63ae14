"""Early stopping of the gradient-matching chains (against the full budget and an independent
multi-start least-squares optimum), chains advanced together from check to check (in this
process and in worker processes), and the ODE solves per proposal."""

import json
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest

import pgpgm
from pgpgm import DataError, gradient_matching_density, sample
from pgpgm.priors import Priors
from pgpgm.refinement import LeastSquaresProblem, refine
from pgpgm.matching import Block, Elementwise, GradientMatchingTarget
from pgpgm.matching.stop import Checkpoint, Decision
from pgpgm.matching.agreement import RefinedAgreement


@dataclass(frozen=True)
class StopAt:
    """A stop rule for tests: stop at the first check at or after ``at``; keeps every checkpoint seen."""

    at: int
    check_every: int = 20
    min_iterations: int = 20
    seen: list = field(default_factory=list)
    name: ClassVar[str] = "at"

    def decide(self, checkpoints, previous):
        self.seen.append(list(checkpoints))
        it = checkpoints[0].iteration
        return Decision(it, it >= self.at, f"iteration {it}")


def _case(spec, case, seed=0):
    c = spec.case(case)
    data = spec.simulate(case, seed=seed)
    return data, c, gradient_matching_density(spec.system, data, c.observed, kernel=c.kernel, gamma=c.gamma,
                                              priors=spec.priors(case))


# ---------------------------------------------------------------- one solve per proposal
@pytest.mark.parametrize("scheme", [Block(n_moves=4), Elementwise()], ids=["block", "elementwise"])
def test_every_solve_is_one_proposal(fhn, scheme):
    # FitzHugh-Nagumo with R observed: V is latent, so every parameter proposal needs a solve
    _, _, density = _case(fhn, "R-observed")
    target = GradientMatchingTarget(density)
    integrator = density.integrator
    tune, draws, chains = 150, 60, 2
    n0, e0 = integrator.n_solves, target.n_logp_evals
    sample(target, draws=draws, tune=tune, chains=chains, seed=2, cores=1, scheme=scheme, progressbar=False)
    solves, evals = integrator.n_solves - n0, target.n_logp_evals - e0
    iterations = chains * (tune + draws)
    starts = 2 * chains  # the start is checked, then the chain evaluates it again
    if isinstance(scheme, Block):
        proposals = iterations * scheme.n_moves
        assert evals == proposals + starts
        assert solves == proposals + starts  # the anchor against round-off needs no solve
    else:  # every parameter and the observed state's initial value, each alone
        proposals = iterations * (fhn.system.n_parameters + 1)
        anchors = chains * (3 + (tune + draws) // 100)  # the paper's scheme keeps its solving anchor
        assert evals == proposals + starts + anchors
        assert solves == proposals + starts + anchors


# ---------------------------------------------------------------- chains together, check by check
def test_checks_leave_the_draws_alone_and_a_stop_keeps_the_window(lv):
    _, _, density = _case(lv, "x1-observed")
    target = GradientMatchingTarget(density)
    kw = {"draws": 60, "tune": 40, "chains": 2, "seed": 5, "cores": 1, "progressbar": False}
    never = sample(target, **kw)
    watched = sample(target, stop=StopAt(10_000), **kw)  # checks every 20 iterations, never stops
    for v in ("theta1", "theta3", "x1", "x2"):
        np.testing.assert_array_equal(never.posterior[v].values, watched.posterior[v].values)
    s = json.loads(watched.attrs["pgpgm_stopping"])
    assert (s["rule"], s["stopped"], s["iterations"]) == ("at", False, [100, 100])
    assert [c["iteration"] for c in s["checks"]] == [20, 40, 60, 80]
    assert json.loads(never.attrs["pgpgm_stopping"])["rule"] == "never"

    rule = StopAt(80)
    stopped = sample(target, stop=rule, **kw)
    s = json.loads(stopped.attrs["pgpgm_stopping"])
    assert (s["stopped"], s["iterations"], s["reason"]) == (True, [80, 80], "iteration 80")
    # kept: the latter half of the 80 iterations, min(80 // 2, tune) = 40 to 80 = draws 0..39 of the full run
    assert stopped.posterior.sizes["draw"] == 40
    np.testing.assert_array_equal(stopped.posterior["theta2"].values, never.posterior["theta2"].values[:, :40])
    last = rule.seen[-1]
    for c, cp in enumerate(last):
        assert (cp.chain, cp.iteration, cp.start) == (c, 80, 40)
        means = [float(stopped.posterior[p].sel(chain=c).mean()) for p in lv.system.parameters]
        np.testing.assert_allclose(cp.theta, means, rtol=1e-12)
        np.testing.assert_allclose(cp.x0[0], float(stopped.posterior["x1"].sel(chain=c).isel(time=0).mean()), rtol=1e-12)
    # before tuning ends the window is the latter half of the chain so far
    assert [(cp.iteration, cp.start) for cp in (cps[0] for cps in rule.seen)] == [(20, 10), (40, 20), (60, 30),
                                                                                     (80, 40)]


def test_workers_stop_where_this_process_stops(lv):
    _, _, density = _case(lv, "x1-observed")
    kw = {"draws": 60, "tune": 40, "chains": 3, "seed": 8, "progressbar": False}
    one = sample(density, cores=1, stop=StopAt(60), **kw)
    two = sample(density, cores=2, stop=StopAt(60), **kw)  # chains 0 and 2 in one worker, chain 1 in the other
    for v in ("theta1", "theta4", "x2"):
        np.testing.assert_array_equal(one.posterior[v].values, two.posterior[v].values)
    assert json.loads(two.attrs["pgpgm_stopping"])["iterations"] == [60, 60, 60]


def test_bad_stop_settings(lv):
    data, c, density = _case(lv, "x1-observed")
    with pytest.raises(DataError, match="stop must be"):
        sample(density, stop="soon", progressbar=False)
    with pytest.raises(DataError, match="stop must be"):
        pgpgm.fit(lv.system, data, c.observed, stop="soon", progressbar=False)
    with pytest.raises(DataError, match="check_every"):
        RefinedAgreement(density, density.integrator, check_every=0)
    for bad in ({"box_starts": -1}, {"box_starts": np.inf}, {"box_release": 1.5}, {"box_release": -2}):
        with pytest.raises(DataError, match="box_starts must be a number >= 0 and box_release"):
            RefinedAgreement(density, density.integrator, **bad)
    for bad in ({"probe_at": 0}, {"probe_at": 100}, {"probe_at": 20.5}):
        with pytest.raises(DataError, match="probe_at must be None or a whole number from 1 to min_iterations - 1"):
            RefinedAgreement(density, density.integrator, **bad)
    with pytest.raises(DataError, match="probe_starts must be a whole number >= 0"):
        RefinedAgreement(density, density.integrator, probe_starts=-1)
    for bad in (0, 1.5):
        with pytest.raises(DataError, match="probe_agree must be a whole number >= 1"):
            RefinedAgreement(density, density.integrator, probe_agree=bad)


# ---------------------------------------------------------------- early stopping finds the optimum
def _multistart_optimum(spec, case, data, c, n_starts: int, seed: int = 1):
    """The best of ``n_starts`` least-squares refinements from uniform starts in the prior box,
    with the observed states' initial values started at the first observation (independent of
    the sampler)."""
    obs = pgpgm.data.as_observations(data, c.observed, spec.system)
    gps = pgpgm.matching.density.fit_gps(obs, c.kernel, seed=0)
    idx = tuple(spec.system.index_of_states(obs.states))
    x0 = np.array(c.x0, float)
    x0[list(idx)] = obs.values[0]
    problem = LeastSquaresProblem(pgpgm.Integrator(spec.system, obs.times), obs.values, idx,
                                  [g.noise_sd for g in gps], x0, free_x0=idx)
    bounds = Priors.from_user(spec.system.parameters, spec.priors(case)).bounds
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [refine(problem, rng.uniform(bounds[:, 0], bounds[:, 1]), bounds, estimate_noise=True, warn=False)
                for _ in range(n_starts)]
    return min(refs, key=lambda r: r.nll)


def _fit(spec, case, data, c, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgpgm.fit(spec.system, data, c.observed, kernel=c.kernel, gamma=c.gamma, priors=spec.priors(case),
                         posterior=None, progressbar=False, seed=0, **kw)


def _check_stopped_at_optimum(r, best, budget):
    a = r.estimates.attrs
    assert a["sampling_stopped"] == 1
    assert "same optimum" in a["sampling_stop_reason"] or "has not changed" in a["sampling_stop_reason"]
    assert max(a["sampling_iterations"]) < budget
    s = json.loads(r.gradient_matching.attrs["pgpgm_stopping"])
    assert s["rule"] == "agree" and s["checks"][-1]["stop"] and not any(ch["stop"] for ch in s["checks"][:-1])
    assert r.gradient_matching.posterior.sizes["draw"] == max(a["sampling_iterations"]) - min(
        max(a["sampling_iterations"]) // 2, 1500)
    assert abs(a["refinement_nll"] - best.nll) < 1e-6
    np.testing.assert_allclose(r.theta, best.theta, rtol=1e-4)
    # step 3 goes on from the last check's best optimum (the check refined every chain's mean already)
    assert list(r.estimates["nll_per_start"].start.values) == ["pooled mean", "last check's best optimum"]
    last = s["checks"][-1]
    assert a["refinement_nll"] <= min(last["nll"]) + 1e-9
    np.testing.assert_allclose(last["q"][int(np.argmin(last["nll"]))][: len(r.theta)], best.theta, rtol=1e-4)


def test_early_stopping_reaches_the_multistart_optimum_on_lotka_volterra(lv):
    data, c, _ = _case(lv, "x1-observed")
    best = _multistart_optimum(lv, "x1-observed", data, c, 40)
    _check_stopped_at_optimum(_fit(lv, "x1-observed", data, c), best, 3500)


@pytest.mark.slow
@pytest.mark.parametrize("name,case,starts", [("lotka-volterra", "x1-observed", 40),
                                              ("fitzhugh-nagumo", "R-observed", 150)])
def test_early_stopping_gives_the_full_budgets_optimum(name, case, starts):
    spec = pgpgm.load_model(name)
    data, c, _ = _case(spec, case)
    best = _multistart_optimum(spec, case, data, c, starts)
    early = _fit(spec, case, data, c)
    full = _fit(spec, case, data, c, stop="never")
    _check_stopped_at_optimum(early, best, 3500)
    assert full.estimates.attrs["sampling_stopped"] == 0
    assert full.gradient_matching.posterior.sizes["draw"] == 2000
    assert abs(full.estimates.attrs["refinement_nll"] - best.nll) < 1e-6
    # the same optimum, to the least-squares solver's tolerance (from the last check's optimum step 3
    # converges in a few steps: a few 1e-5 apart on FitzHugh-Nagumo's a and b)
    assert abs(early.estimates.attrs["refinement_nll"] - full.estimates.attrs["refinement_nll"]) < 1e-6
    np.testing.assert_allclose(early.theta, full.theta, rtol=1e-4)
    assert early.n_ode_solves["sampling"] < full.n_ode_solves["sampling"] / 2


# ---------------------------------------------------------------- the early probe
def test_the_probe_stops_only_when_chains_and_box_starts_agree(lv):
    # Lotka-Volterra, x1 observed: checkpoints near the truth (the data's basin), as RefinedAgreement sees them
    data, c, _ = _case(lv, "x1-observed")
    best = _multistart_optimum(lv, "x1-observed", data, c, 40)
    theta_true = np.asarray(data.attrs["theta"], float)
    x0 = np.array(c.x0, float)

    def rule(priors, **kw):
        density = gradient_matching_density(lv.system, data, c.observed, kernel=c.kernel, gamma=c.gamma,
                                            priors=priors)
        return RefinedAgreement(density, density.integrator, density.priors.bounds, **kw)

    def at(it, far=False):
        return [Checkpoint(k, it, it // 2, np.full(4, 9.0) if far and k == 1 else theta_true * (1 + 0.02 * k), x0)
                for k in range(2)]

    wide = rule(lv.priors("x1-observed"))
    assert wide.first_checks == (50,)
    assert rule(lv.priors("x1-observed"), probe_at=None).first_checks == ()
    assert rule(lv.priors("x1-observed"), probe_starts=0).first_checks == ()
    # both chains and least squares from points spread over the box reach the independent multi-start's
    # optimum: the chains stop at the probe once two box points reached it (and none a better one)
    d = wide.decide(at(50), None)
    assert d.stop and 2 <= d.box_starts <= wide.probe_starts and "probe at 50 iterations" in d.reason
    assert f"2 of {d.box_starts} point(s)" in d.reason
    one = rule(lv.priors("x1-observed"), probe_agree=1).decide(at(50), None)
    assert one.stop and one.box_starts < d.box_starts and one.best_nll == pytest.approx(d.best_nll, abs=1e-9)
    none = rule(lv.priors("x1-observed"), probe_agree=4, probe_starts=3).decide(at(50), None)
    assert not none.stop and none.box_starts == 3 and "2 of 3 box starts reach the chains' best" in none.reason
    assert abs(d.best_nll - best.nll) < 1e-6 and abs(d.box_nll - best.nll) < 1e-6
    np.testing.assert_allclose(d.best_q[:4], best.theta, rtol=1e-4)
    # an optimum on a prior bound (theta1's box (0, 1.5) cuts the data's optimum off) never stops at the probe
    cut = rule(dict(lv.priors("x1-observed"), theta1=(0.0, 1.5))).decide(at(50), None)
    assert not cut.stop and cut.at_bound == ("theta1 at its upper bound 1.5",) and "prior bound" in cut.reason


def test_the_probe_does_not_stop_in_the_issues_trap(fhn):
    # FitzHugh-Nagumo, R observed, default box: the wrong optimum theta ~ (1.52, 2.42, 1.64) (a chain held
    # there) and the global one near (0.2, 0.2, 3.0)
    density = gradient_matching_density(fhn.system, _fhn_default(fhn), ["R"], priors=(0, 10))
    x0 = np.array([-1.0, 1.0])

    def at(it, *thetas):
        return [Checkpoint(k, it, it // 2, np.asarray(th, float), x0) for k, th in enumerate(thetas)]

    rule = RefinedAgreement(density, density.integrator, density.priors.bounds)
    wrong, right = [1.5, 2.4, 1.6], [0.2, 0.2, 3.0]
    # both chains in the wrong mode: they agree on an optimum that fits worse than the GP; no stop, no box start spent
    d = rule.decide(at(50, wrong, np.multiply(wrong, 1.02)), None)
    assert not d.stop and d.box_starts == 0 and "fits the data worse than the GPs after a short refinement" in d.reason
    # one chain in each: different optima, no stop; the first regular check is judged as without the probe
    d = rule.decide(at(50, wrong, right), None)
    assert not d.stop and d.box_starts == 0 and max(d.nll) - min(d.nll) > 100
    after = rule.decide(at(100, wrong, right), d)
    alone = RefinedAgreement(density, density.integrator, density.priors.bounds, probe_at=None).decide(
        at(100, wrong, right), None)
    assert not after.stop and after.settled == alone.settled == 0 and after.nll == alone.nll
    assert after.box_starts == alone.box_starts


def test_an_optimum_a_chain_leaves_is_kept(fhn):
    # FitzHugh-Nagumo's issue data, its fit check off (so that the wrong optimum theta ~ (1.52, 2.42, 1.64)
    # could stop the chains): one chain's mean in the data's basin at the probe, both in the wrong mode after.
    # The rule used to forget the probe's optimum and stop at 150 iterations in the wrong one (as the default
    # fit of the held-out grid's d2027-seir-016 with the Matern 5/2 kernel did, 1.16 nats above the optimum)
    density = gradient_matching_density(fhn.system, _fhn_default(fhn), ["R"], priors=(0, 10))
    x0 = np.array([-1.0, 1.0])

    def at(it, *thetas):
        return [Checkpoint(k, it, it // 2, np.asarray(th, float), x0) for k, th in enumerate(thetas)]

    rule = RefinedAgreement(density, density.integrator, density.priors.bounds, fit_ratio=None)
    wrong, right = [1.5, 2.4, 1.6], [0.2, 0.2, 3.0]
    probe = rule.decide(at(50, wrong, right), None)
    right_nll, wrong_nll = min(probe.nll), max(probe.nll)
    assert not probe.stop and wrong_nll - right_nll > 100
    d, decisions = probe, []
    for it in (100, 150, 200, 250):
        d = rule.decide(at(it, wrong, np.multiply(wrong, 1.01)), d)
        decisions.append(d)
        assert max(d.nll) - min(d.nll) < rule.tol and min(d.nll) == pytest.approx(wrong_nll, abs=1e-3)
        assert d.kept_nll == pytest.approx(right_nll) and d.best_nll == pytest.approx(right_nll)
        np.testing.assert_allclose(d.best_q, probe.q[int(np.argmin(probe.nll))])
        assert "worse than the optimum a chain reached at an earlier check" in d.reason
        if d.stop:
            break
    # the chains disagree with the best: it must hold for `patience` checks, then step 3 starts from it
    assert [x.stop for x in decisions] == [False, False, True] and decisions[-1].settled == rule.patience
    assert decisions[-1].as_dict()["kept_nll"] == pytest.approx(right_nll)


# ---------------------------------------------------------------- an optimum on a prior bound
def test_an_optimum_on_a_prior_bound_does_not_stop_the_chains(lv):
    data, c, _ = _case(lv, "x1-observed")
    theta_true = np.asarray(data.attrs["theta"], float)
    x0 = np.array(c.x0, float)
    def decisions(priors, iterations=(100, 150, 200), **kw):
        density = gradient_matching_density(lv.system, data, c.observed, kernel=c.kernel, gamma=c.gamma,
                                            priors=priors)
        rule = RefinedAgreement(density, density.integrator, density.priors.bounds, **kw)
        out, prev = [], None
        for it in iterations:
            prev = rule.decide([Checkpoint(k, it, it // 2, theta_true * (1 + 0.02 * k), x0) for k in range(2)], prev)
            out.append(prev)
        return out

    # the data's optimum (theta1 near 2) inside the box: the agreeing chains stop at the second check
    wide = decisions(lv.priors("x1-observed"))
    assert [d.stop for d in wide[:2]] == [False, True] and "bound" not in wide[1].reason
    # theta1's prior (0, 1.5) cuts it off: every refinement ends on the bound, and the chains go on
    cut = dict(lv.priors("x1-observed"), theta1=(0.0, 1.5))
    held = decisions(cut, iterations=(100, 150, 200, 250, 300, 350, 400))
    for d in held:
        assert max(d.nll) - min(d.nll) < 0.01 and all(abs(t[0] - 1.5) < 1e-6 for t in d.theta)
        assert not d.stop and d.at_bound == ("theta1 at its upper bound 1.5",)
        assert "theta1 at its upper bound 1.5" in d.reason
    # refined at growing intervals while held there (half as long again: 100, 150, 250, 400)
    assert [d.refined_at for d in held] == [100, 150, 150, 250, 250, 250, 400]
    assert all("whole budget" in d.reason for d in held if d.refined_at == d.iteration)
    assert all("refined again at 250 iterations" in d.reason for d in held[2:3])
    assert [d.settled for d in held] == [0, 1, 1, 2, 2, 2, 3]
    assert min(held[0].nll) > min(wide[0].nll) + 1  # the bound costs likelihood: a worse optimum
    # meanwhile least squares from points spread over the box (2 per 50 iterations run) finds no
    # better optimum; at 600 iterations 24 points have: the chains stop there
    assert [d.box_starts for d in held] == [4, 6, 6, 10, 10, 10, 16]
    assert all(d.box_nll >= min(d.nll) - 1e-6 for d in held)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. scipy's Sobol balance warning for a draw of 2^m + k points
        released = decisions(cut, iterations=(100, 150, 200, 250, 300, 350, 400, 450, 500, 550, 600))
    assert [d.stop for d in released] == [False] * 10 + [True] and released[-1].box_starts == 24
    assert "the box search found no better optimum" in released[-1].reason and not released[-1].held
    # a finite bound_patience lets such an optimum stop the chains after that many settled checks
    assert [d.stop for d in decisions(cut, bound_patience=2)] == [False, False, True]
    with pytest.raises(DataError, match="bound_patience"):
        RefinedAgreement(_case(lv, "x1-observed")[2], None, bound_patience=0)


def test_chains_held_at_a_bound_reach_the_multistart_optimum(lv):
    # Lotka-Volterra with x2 observed, data and sampler seed 4: both chains sit in a mode of the
    # gradient-matching density whose refinement ends on theta1's upper bound 10, 38 nats above the
    # optimum, until ~2600 iterations; stopped at 200 with no other search the fit kept that optimum
    data, c, _ = _case(lv, "x2-observed", seed=4)
    best = _multistart_optimum(lv, "x2-observed", data, c, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(lv.system, data, c.observed, kernel=c.kernel, gamma=c.gamma, priors=lv.priors("x2-observed"),
                      posterior=None, progressbar=False, seed=4)
    s = json.loads(r.gradient_matching.attrs["pgpgm_stopping"])
    # the chains' means refine to the bound (theta1 = 10), which starts the box search; its least
    # squares from a few points spread over the box find the optimum, and the chains stop at 200
    # iterations instead of ~2700
    first = next(ch for ch in s["checks"] if ch["iteration"] >= 100)  # the first regular check (after the probe)
    chains_theta = np.array(first["theta"])
    assert np.allclose(chains_theta[:, 0], 10) and min(first["nll"]) > best.nll + 30
    assert 0 < first["box_starts"] <= 8 and first["box_nll"] == pytest.approx(best.nll, abs=1e-6)
    assert max(r.estimates.attrs["sampling_iterations"]) <= 300
    assert abs(r.estimates.attrs["refinement_nll"] - best.nll) < 1e-6
    np.testing.assert_allclose(r.theta, best.theta, rtol=1e-4)
    assert abs(best.theta[0] - 10) > 1


# ---------------------------------------------------------------- an optimum that does not fit the data
def _fhn_default(fhn):
    """The data of the robustness issue: FitzHugh-Nagumo, R observed, 100 points, SNR 100, data seed 0."""
    return pgpgm.simulate(fhn.system, [0.2, 0.2, 3.0], [-1.0, 1.0], np.linspace(0, 10, 100), snr=100,
                          observed=["R"], seed=0)


def test_chains_agreeing_on_an_optimum_that_fits_worse_than_the_gp_go_on(fhn):
    # both chains' means at 100 and 150 iterations of the default fit (box (0, 10)) refined to the
    # wrong optimum theta ~ (1.52, 2.42, 1.64): the old rule stopped there
    data = _fhn_default(fhn)
    density = gradient_matching_density(fhn.system, data, ["R"], priors=(0, 10))
    rule = RefinedAgreement(density, density.integrator, density.priors.bounds)
    x0 = np.array([-1.0, 1.0])

    def decisions(theta, rule=rule):
        prev, out = None, []
        for it in (100, 150):
            prev = rule.decide([Checkpoint(k, it, it // 2, np.asarray(theta) * (1 + 0.02 * k), x0)
                                for k in range(2)], prev)
            out.append(prev)
        return out

    wrong = decisions([1.5, 2.4, 1.6])
    # the residual sd there against the GP's noise sd (an independent look: the GP's own sd, and the
    # residuals of the refined point's solve)
    best = int(np.argmin(wrong[-1].nll))
    problem = rule.problem(x0)
    sd_res = np.sqrt(problem.rss(np.array(wrong[-1].q[best])) / problem.n_obs)
    assert wrong[-1].fit_ratio[0] == pytest.approx(float(sd_res[0] / density.noise_sd[0]), rel=1e-6)
    assert wrong[-1].fit_ratio[0] > 5
    assert max(wrong[-1].nll) - min(wrong[-1].nll) < 0.01  # the chains agree ...
    assert [d.stop for d in wrong] == [False, False]  # ... on an optimum that does not fit: they go on
    assert "fits the data worse than the GPs" in wrong[-1].reason and wrong[-1].held
    # near the truth the same rule stops at the second check, the optimum fitting as well as the GP
    right = decisions([0.2, 0.2, 3.0])
    assert [d.stop for d in right] == [False, True] and right[-1].fit_ratio[0] < 1.2
    assert min(right[-1].nll) < min(wrong[-1].nll) - 100
    # the check switched off: the old rule, which stops on the wrong optimum
    off = RefinedAgreement(density, density.integrator, density.priors.bounds, fit_ratio=None)
    assert [d.stop for d in decisions([1.5, 2.4, 1.6], off)] == [False, True]
    with pytest.raises(DataError, match="fit_ratio"):
        RefinedAgreement(density, density.integrator, fit_ratio=0.5)


@pytest.mark.slow  # an accuracy run (20-35 s on 2 cores): ./run.sh test --slow
def test_the_default_fit_of_the_robustness_issue_reaches_the_global_optimum(fhn):
    data = _fhn_default(fhn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(fhn.system, data, ["R"], posterior=None, progressbar=False)
    # the references: least squares from the truth (the data's basin at this noise) and from 50 starts
    # spread over the box, which all end in worse optima (only a few per cent of such starts reach it)
    y = data["y"].values  # (N, 1): R
    problem = LeastSquaresProblem(pgpgm.Integrator(fhn.system, data.time.values), y, (1,), np.array([0.1]),
                                  np.array([-1.0, y[0, 0]]), free_x0=(1,))
    bounds = np.tile([0.0, 10.0], (3, 1))
    truth = refine(problem, np.r_[0.2, 0.2, 3.0, y[0, 0]], bounds, estimate_noise=True, warn=False)
    rng = np.random.default_rng(0)
    nll = [refine(problem, np.r_[rng.uniform(0, 10, 3), y[0, 0]], bounds, estimate_noise=True, warn=False).nll
           for _ in range(50)]
    assert r.nll == pytest.approx(truth.nll, rel=1e-6) and r.nll <= min(nll) + 1e-6
    np.testing.assert_allclose(r.theta, [0.217, 0.245, 2.959], atol=0.01)
    assert r.nll_per_start.min() == r.nll


def test_the_difference_noise_estimate_is_unbiased_for_white_noise_on_a_line():
    # y = a + b t + e on an uneven grid: every inner point's deviation from its neighbours' line is
    # pure noise with variance s^2 (1 + (h1^2 + h2^2) / (h1 + h2)^2), so the mean square, scaled,
    # estimates s^2 without bias
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 10, 40))
    s, reps = 0.3, 4000
    v = np.array([pgpgm.data.Observations(t, (1.5 - 0.7 * t + s * rng.standard_normal(t.size))[:, None], ("y",))
                  .difference_noise_sd()[0] ** 2 for _ in range(reps)])
    assert v.mean() == pytest.approx(s**2, rel=4 * v.std() / np.sqrt(reps) / s**2)
    # a measured state with gaps uses its own measurements only
    y = np.column_stack([1.5 - 0.7 * t, np.where(np.arange(t.size) % 3 == 0, np.nan, 2 * t)])
    obs = pgpgm.data.Observations(t, y, ("a", "b"))
    np.testing.assert_allclose(obs.difference_noise_sd(), [0.0, 0.0], atol=1e-12)


def test_a_gp_that_takes_noise_for_signal_does_not_hold_the_chains(pt_model):
    pt = pt_model
    # protein transduction, R latent, data seed 1: the GP of S estimates sd 0.0028 (the data's is
    # 0.01), so at the global optimum S's residual sd is 2-3x the GP's; judged against the
    # measurements' own noise level the chains stop early, at the full budget's optimum
    data, c, density = _case(pt, "R-latent", seed=1)
    assert density.noise_sd[0] < 0.004
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pgpgm.fit(pt.system, data, c.observed, kernel=c.kernel, gamma=c.gamma, priors=pt.priors("R-latent"),
                      posterior=None, progressbar=False, seed=1)
    a = r.estimates.attrs
    assert max(a["sampling_iterations"]) <= 300
    ratio = json.loads(r.gradient_matching.attrs["pgpgm_stopping"])["checks"][-1]["fit_ratio"]
    assert max(ratio) < 2
    # the optimum of least squares started at the truth (the data's basin at this noise)
    obs = pgpgm.data.as_observations(data, c.observed, pt.system)
    idx = pt.system.index_of_states(obs.states)
    problem = LeastSquaresProblem(pgpgm.Integrator(pt.system, obs.times), obs.values, tuple(idx), np.full(4, 0.01),
                                  np.array(c.x0, float), free_x0=tuple(idx))
    truth = refine(problem, np.r_[data.attrs["theta"], np.array(c.x0)[list(idx)]], density.priors.bounds,
                   estimate_noise=True, warn=False)
    assert r.nll == pytest.approx(truth.nll, rel=1e-6)


def test_chains_apart_whose_rival_does_not_fit_stop_without_the_ranked_search(lv):
    # Lotka-Volterra, x2 observed, data seed 0: one chain's mean refines to the optimum, the other's to a mode
    # 49 nats worse that does not fit the data; the ranked box search (for rivals that fit) is not run, and the
    # fit ends at the independent multi-start's optimum
    data, c, density = _case(lv, "x2-observed")
    best = _multistart_optimum(lv, "x2-observed", data, c, 40)
    r = _fit(lv, "x2-observed", data, c)
    reason = r.estimates.attrs["sampling_stop_reason"]
    assert "refine to different optima" in reason and "ranks highest" not in reason
    checks = json.loads(r.gradient_matching.attrs["pgpgm_stopping"])["checks"]
    assert checks[-1]["screened"] == 0 and max(checks[-1]["nll"]) - min(checks[-1]["nll"]) > 40
    rule = RefinedAgreement(density, density.integrator, density.priors.bounds)
    worst = int(np.argmax(checks[-1]["nll"]))
    assert max(checks[-1]["fit_ratio"]) <= rule.fit_ratio  # the best fits; the rival's fit is judged below
    problem = rule.problem(np.array(c.x0, float))
    rival = refine(problem, checks[-1]["q"][worst], density.priors.bounds, estimate_noise=True, warn=False)
    assert np.any(rule.residual_ratio(problem, rival) > rule.fit_ratio)
    assert abs(r.nll - best.nll) < 1e-6

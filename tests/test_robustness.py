"""A fast subset of the robustness grid (``benchmarks/robustness.py``): default fits must reach
the global optimum of their data, as found by an independent multi-start.

The references (``tests/data/robustness_reference.jsonl``) were written by
``python benchmarks/robustness.py reference --references tests/data/robustness_reference.jsonl
--only <problem ids>`` (the held-out grids', ids ``d2027-...`` and ``d2028-...``, are their rows of
``benchmarks/references/robustness_d<seed>_reference.jsonl``, made by ``reference --design-seed <seed>``):
500 starts of scipy's trf and dogbox from a Latin hypercube over the
prior box, with the benchmark's own residuals and profile likelihood
(``benchmarks/robustness_reference.py``), not pgpgm.refinement.least_squares. This test does not recompute them;
it checks that the data it simulates are those the references were computed on (a hash).
"""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import pgpgm
from pgpgm.matching.stop import Checkpoint

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import robustness as rb  # noqa: E402
import robustness_reference as rr  # noqa: E402

REFERENCES = Path(__file__).parent / "data" / "robustness_reference.jsonl"

#: The subset: small problems of several systems, kernels, boxes, noise models and known or
#: unknown latent initial values, and the issue's own FitzHugh-Nagumo case (default settings).
CI_FITS = [
    "fhn-issue-rbf-s0",     # the call: FitzHugh-Nagumo, R observed, default kernel, box and seed
    "fhn-issue-rbf-s1",     # the same data, another seed
    "fhn-010-sigmoid-s0",   # 20 points, box 10 x truth
    "pt-002-matern52-s0",   # protein transduction, 4 observed states, 1 % noise, box 10 x truth
    "mm-035-sigmoid-s0",    # Michaelis-Menten, tight box, unknown latent initial value
    "rm-006-rbf-s0",        # Rosenzweig-MacArthur (Holling II), tight box, 20 % noise
    "seir-007-matern52-s0",  # SEIR, default box, unknown latent initial value (E0)
    "rm-015-sigmoid-s2",    # Rosenzweig-MacArthur, lognormal noise, unknown P0, box 10 x truth
    # the held-out grid (design seed 2027), misses of its first run:
    "d2027-seir-025-rbf-s0",       # SEIR, box 3 x truth: the box's centre, chain 0's start, fails the latent solve
    "d2027-seir-016-matern52-s0",  # SEIR, lognormal: a chain left the optimum for a mode 1.16 nats worse
    # the second held-out grid (design seed 2028):
    "d2028-mm-026-matern52-s0",    # Michaelis-Menten, 20 % noise: a loose ridge; the optimum at km1 = 0
    "d2027-seir-034-rbf-s0",       # SEIR, E(0) unknown: the data put it at -0.0014, its prior box is (0, 0.02)
    # the fifth (2031): E(0) 0.046 by the data, (0, 0.02) its box; there the ODE fails with the data's I(0) < 0
    "d2031-seir-034-rbf-s0",
    # Goodwin, 20 points, 20 % noise, box 10 x truth: chains in two modes 14 and 24 nats above the optimum, which
    # 1 of 500 random least-squares starts reaches; the ranked box points' first does (test below)
    "d2031-goodwin-003-rbf-s0",
    # the sixth (2032): protein transduction, 20 points, 20 % noise; step 3 left the stop rule's optimum (below)
    "d2032-pt-011-matern52-s0",
]
#: Fits that missed the global optimum before the stop rule judged the optimum's fit and searched
#: the prior box (issue 29): fhn-issue-rbf-s0 (both chains stopped at 150 iterations in the mode
#: theta ~ (1.52, 2.42, 1.64)) and seir-007-matern52-s0 (stopped at 200 iterations in the mode
#: theta ~ (6.62, 0.90, 3.27)); a fit that misses now is marked here with the reason (strict xfail).
KNOWN_MISSES: dict[str, str] = {}
_ROWS: dict[str, dict] = {}


def _references() -> dict[str, dict]:
    return {r["problem"]: r for r in map(json.loads, REFERENCES.read_text().splitlines()) if r}


def _row(fit_id: str) -> dict:
    """The fit's benchmark row (run once per test session)."""
    if fit_id not in _ROWS:
        _ROWS[fit_id] = rb.run_fit(rb.fit_by_id(fit_id))
    return _ROWS[fit_id]


def test_the_references_are_an_independent_multistart_of_500_starts():
    refs = _references()
    assert {rb.fit_by_id(f).problem.id for f in CI_FITS} <= set(refs)
    for ref in refs.values():
        assert ref["n_starts"] >= 500 and 0 <= ref["n_reached"] <= ref["n_starts"]
        assert min(ref["nll_starts"]) >= ref["nll"] - rr.REL_TOL * rr.scale_of(ref["nll"], ref["n_obs"])


#: the long ones (15-35 s each on 2 cores) run with ``./run.sh test --slow``
SLOW_FITS = {"d2031-goodwin-003-rbf-s0", "d2032-pt-011-matern52-s0"}


@pytest.mark.parametrize("fit_id", [pytest.param(f, marks=pytest.mark.xfail(reason=KNOWN_MISSES[f], strict=True))
                                    if f in KNOWN_MISSES else
                                    pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FITS else f
                                    for f in CI_FITS])
def test_default_fit_reaches_the_global_optimum(fit_id):
    fit = rb.fit_by_id(fit_id)
    ref = _references()[fit.problem.id]
    assert rb.data_hash(fit.problem) == ref["data_hash"], "the data changed: recompute the reference"
    row = _row(fit_id)
    assert not row["error"]
    verdict = rr.compare(row["nll"], ref["nll"], ref["n_obs"])
    assert verdict in ("optimum", "better"), (
        f"{fit_id}: refined NLL {row['nll']:.8g} vs global optimum {ref['nll']:.8g}; refined theta "
        f"{np.round(row['theta'], 4).tolist()} vs {np.round(ref['theta'], 4).tolist()}")
    s = rb.BY_KEY[fit.problem.system]
    if fit.problem.x0 == "unknown":  # inside its prior box, as the references (v3) hold it
        x0 = row["x0_refined"][pgpgm.load_model(s.model).system.states.index(s.unknown)]
        assert s.unknown_box[0] <= x0 <= s.unknown_box[1], f"{fit_id}: {s.unknown}(0) = {x0} outside {s.unknown_box}"


@pytest.mark.parametrize("fit_id", ["fhn-issue-rbf-s0", "mm-035-sigmoid-s0", "rm-015-sigmoid-s2"])
def test_the_reference_nll_is_the_fits_likelihood(fit_id):
    """The multi-start's profile NLL at the fit's refined point equals the fit's refinement_nll
    (same likelihood definition, constants included): Gaussian and lognormal noise, known and
    unknown latent initial values."""
    row = _row(fit_id)
    problem = rb.reference_problem(rb.fit_by_id(fit_id).problem)
    free = np.asarray(row["x0_refined"])[list(problem.free)]
    if problem.lognormal:
        free[: len(problem.observed)] = np.log(free[: len(problem.observed)])
    q = np.concatenate([row["theta"], free])
    assert problem.nll(q) == pytest.approx(row["nll"], rel=1e-9, abs=1e-9)


@pytest.mark.slow  # a held-out grid case, ~27 s
def test_chains_that_would_stop_apart_first_refine_the_box_points_the_density_ranks_highest():
    """The held-out grid's d2031-goodwin-003 (Goodwin, X and Z observed, box 10 x truth): the default fit's two
    chains sat in different modes of the gradient-matching density, their means refined to optima 22.15 and
    32.4, and the rule stopped on that (the best unchanged for two checks). Least squares from the box's points
    that the density ranks highest (at the GPs' means) reaches the multi-start's optimum (8.324), which 1 of
    its 500 random starts reached; the chains then go on, and stop when the next ranked points find nothing
    better."""
    fit = rb.fit_by_id("d2031-goodwin-003-rbf-s0")
    ref = _references()[fit.problem.id]
    assert ref["n_reached"] == 1 and ref["n_starts"] == 500
    system, data = rb.make_data(fit.problem)
    kw = rb.fit_kwargs(fit)
    density = pgpgm.gradient_matching_density(system, data, rb.observed_of(fit.problem), kernel="rbf",
                                              priors=kw["priors"], seed=0)
    x0 = np.asarray(data.attrs["x0"], float)
    chains = ([2600.0, 4.3, 2.7, 3.4, 3.6], [1350.0, 1.95, 0.63, 1.3, 1.4])  # the default fit's chains at 200

    def at(it):
        return [Checkpoint(k, it, it // 2, np.asarray(th, float), x0) for k, th in enumerate(chains)]

    def run(rule):
        d, out = None, []
        for it in range(100, 450, 50):
            d = rule.decide(at(it), d)
            out.append(d)
            if d.stop:
                return out
        return out

    base = dict(density=density, integrator=density.integrator, bounds=density.priors.bounds, probe_at=None)
    off = run(pgpgm.RefinedAgreement(**base, screen_starts=0))
    assert [d.stop for d in off] == [False, False, True] and min(off[-1].nll) > ref["nll"] + 10
    assert off[-1].screened == 0 and off[-1].best_nll == pytest.approx(min(off[-1].nll))
    rule = pgpgm.RefinedAgreement(**base)
    on = run(rule)
    # at 200 the chains would stop apart: 16 ranked points are refined first, and one reaches the optimum
    assert [d.screened for d in on] == [0, 0, 16, 16, 32] and [d.stop for d in on] == [False] * 4 + [True]
    assert on[2].best_nll == pytest.approx(ref["nll"], rel=1e-6) and "a better optimum" in on[2].reason
    assert on[-1].best_nll == pytest.approx(ref["nll"], rel=1e-6) and "none better" in on[-1].reason
    np.testing.assert_allclose(on[-1].best_q[:5], ref["theta"], rtol=1e-3)
    # the ranking: 256 points inside the box, by the density at the GPs' means, highest first
    z = rule.screened_points
    box = np.asarray(density.priors.bounds)
    assert z.shape == (256, 5) and np.all((z >= box[:, 0]) & (z <= box[:, 1]))
    target = pgpgm.GradientMatchingTarget(density)
    X = np.zeros((data.time.size, 3))
    X[:, [0, 2]] = density.gp_posterior_means()
    lp = np.array([target.evaluate(q, X)[0] for q in z])
    assert np.all(np.diff(lp) <= 0) and lp[0] - np.median(lp) > 50


def test_a_refinement_ends_no_higher_than_its_start():
    """Held-out d2032-pt-011 (protein transduction, 4 states observed, 20 points, 20 % noise): least squares
    started at the multi-start's optimum, with the GPs' noise sds as the start of their estimates (as step 3
    starts), left it: the first rounds weight dS by a GP sd 60 times below its residuals' and end in another
    basin, 53-55 nats higher, where the sensitivity solve fails. The default fit returned that point. refine()
    now ends no higher than its start: it runs again from the sds that maximise the likelihood there."""
    fit = rb.fit_by_id("d2032-pt-011-matern52-s0")
    ref = _references()[fit.problem.id]
    system, data = rb.make_data(fit.problem)
    kw = rb.fit_kwargs(fit)
    observed = rb.observed_of(fit.problem)
    density = pgpgm.gradient_matching_density(system, data, observed, kernel="matern52", priors=kw["priors"],
                                              x0=kw["x0"], seed=0)
    idx = tuple(system.states.index(o) for o in observed)
    x0 = np.asarray(data.attrs["x0"], float)
    problem = pgpgm.LeastSquaresProblem(pgpgm.Integrator(system, data.time.values), data.y.values, idx,
                                        density.noise_sd, x0, free_x0=idx + (system.states.index("R"),))
    q = np.asarray(ref["q"], float)
    ml_sd = np.sqrt(problem.rss(q) / problem.n_obs)
    assert ml_sd[1] / density.noise_sd[1] > 30  # dS: the GP's sd far below the residuals' at the optimum
    r = pgpgm.refine(problem, q, density.priors.bounds, estimate_noise=True, warn=False)
    assert r.nll == pytest.approx(ref["nll"], rel=1e-8) and r.success
    uphill = re.search(r"rerun from the start's own noise sds \(the given sds' rounds ended at (\S+), above", r.message)
    assert uphill and float(uphill.group(1)) > ref["nll"] + 50
    np.testing.assert_allclose(r.q, q, rtol=1e-3, atol=1e-6)


def test_the_side_by_side_reruns_the_references_own_starts():
    """``robustness.py sidebyside`` times the reference multi-start's own starts beside the fits: a
    start rerun with the stored run's best-so-far ends at the NLL that run recorded for it, the cost to
    95 % is the stored starts needed x the mean time measured here, and the breakdown of the fit's time
    adds up (the stop rule within step 2, its least squares within it) and leaves pgpgm unpatched."""
    problem, ref = rb.problem_by_id("fhn-010"), _references()["fhn-010"]
    methods = (pgpgm.RefinedAgreement.decide, pgpgm.LeastSquaresProblem.jacobian, pgpgm.LeastSquaresProblem.residuals)
    with rb.Breakdown() as bd:
        row = rb.side_by_side_problem(problem, ref, [rb.fit_by_id("fhn-010-sigmoid-s0")], 4, bd)
    assert (pgpgm.RefinedAgreement.decide, pgpgm.LeastSquaresProblem.jacobian,
            pgpgm.LeastSquaresProblem.residuals) == methods
    assert pgpgm.matching.agreement.refine is pgpgm.refine and pgpgm.steps.refine.refine is pgpgm.refine
    assert [s["index"] for s in row["starts"]] == rb.sample_indices(500, 4, problem.data_seed)
    assert all(s["reproduced"] for s in row["starts"]), row["starts"]
    assert [s["stored_nll"] for s in row["starts"]] == [ref["nll_starts"][s["index"]] for s in row["starts"]]
    fit = row["fits"][0]
    assert fit["verdict"] in ("optimum", "better") and fit["cpu"] > 0
    b = fit["breakdown"]
    assert b["checks"] and 0 < b["rule_wall"] <= fit["sampling"]
    assert b["jac_rule_n"] >= 1 and b["jac_step3_n"] >= 1 and b["jac_rule_wall"] + b["res_rule_wall"] <= b["rule_wall"]
    assert b["refines_rule"] >= 2 and b["refines_step3"] >= 1 and len(b["rule_refines"]) == b["refines_rule"]
    summary = rb.sbs_summary(row)
    assert summary["cost_cpu"] == pytest.approx(ref["starts_95"] * np.mean([s["cpu"] for s in row["starts"]]))
    assert summary["ratio_wall"] == pytest.approx(fit["steps13"] / summary["cost_wall"])

def test_one_multistart_size_for_all_data_sets_and_multistarts_that_stop_themselves():
    """The side-by-side report's multi-start a user configures once, against closed forms: with success
    fractions p the fewest starts N with mean(1 - (1 - p)^N) >= 95 %; and a multi-start that stops once two
    starts agree on its best, on a run where one start of n reaches the optimum and the rest share a worse
    mode: it ends at the optimum only when that start is among the first two (2 / n), else after two."""
    assert rb.starts_for_share(np.full(10, 0.5)) == 5  # 1 - 0.5^5 = 0.969; 0.5^4 leaves 0.938
    p = np.array([1.0, 0.1])  # mean(1, 1 - 0.9^N) >= 0.95 <=> 0.9^N <= 0.1: N = 22
    assert rb.starts_for_share(p) == 22
    assert rb.starts_for_share(np.array([0.5, 0.0])) is None  # half never reached: 95 % out of reach
    n = 10
    ref = {"nll": -100.0, "n_obs": 50, "nll_starts": [-100.0] + [-80.0] * (n - 1)}
    hit, used = rb.agreement_stop(ref, 2, repeats=4000, seed=1)
    assert hit == pytest.approx(2 / n, abs=0.02)
    assert used == pytest.approx(2 / n * n + (1 - 2 / n) * 2, abs=0.1)
    assert rb.agreement_stop({**ref, "nll_starts": [-100.0] * n}, 3) == (1.0, 3.0)
    hit, used = rb.agreement_stop({**ref, "nll_starts": [np.nan, -100.0, -100.0]}, 2, repeats=4000)
    assert hit == 1.0 and used == pytest.approx(8 / 3, abs=0.05)  # a failed start counts for nothing



def _repressilator(x, th):
    m1, m2, m3, p1, p2, p3 = x.T
    alpha, alpha0, beta = th
    return np.column_stack([-m1 + alpha / (1 + p3**2) + alpha0, -m2 + alpha / (1 + p1**2) + alpha0,
                            -m3 + alpha / (1 + p2**2) + alpha0, -beta * (p1 - m1), -beta * (p2 - m2),
                            -beta * (p3 - m3)])


def _rosenzweig_macarthur(x, th):
    N, P = x.T
    r, K, a, h, m = th
    eat = a * N * P / (1 + a * h * N)
    return np.column_stack([r * N * (1 - N / K) - eat, 0.5 * eat - m * P])


def _seir(x, th):
    S, E, I, R = x.T
    beta, sigma, gamma = th
    return np.column_stack([-beta * S * I, beta * S * I - sigma * E, sigma * E - gamma * I, gamma * I])


def _michaelis_menten(x, th):
    S, E, C, P = x.T
    k1, km1, k2 = th
    bind = k1 * E * S
    return np.column_stack([-bind + km1 * C, -bind + (km1 + k2) * C, bind - (km1 + k2) * C, k2 * C])


@pytest.mark.parametrize(("name", "rhs"), [("repressilator", _repressilator),
                                           ("rosenzweig-macarthur", _rosenzweig_macarthur),
                                           ("seir", _seir), ("michaelis-menten", _michaelis_menten)])
def test_new_models_encode_their_published_equations_and_simulate(name, rhs):
    """The model file's equations equal the cited ones (written out here in numpy) at random
    states and parameters; the first case has a latent state; every case simulates to finite data."""
    spec = pgpgm.load_model(name)
    rng = np.random.default_rng(0)
    S, P = spec.system.n_states, spec.system.n_parameters
    x, theta = rng.uniform(0.1, 3.0, (50, S)), rng.uniform(0.1, 3.0, P)
    np.testing.assert_allclose(spec.system.rhs_on_grid(np.zeros(50), x, theta), rhs(x, theta), rtol=1e-12)
    assert S >= 2 and (name != "repressilator" or S >= 5)
    assert set(spec.case().observed) < set(spec.system.states)  # the first case has a latent state
    for case_name in spec.cases:
        data = spec.simulate(case_name, seed=0)
        assert np.all(np.isfinite(data.y.values)) and np.all(data.truth.values >= 0)


def test_a_near_miss_is_judged_by_tight_solves():
    """pk-infusion with C observed cannot see ke0 or Ce0 (the effect compartment feeds nothing measured):
    the likelihood is flat along them, and the default solves' error (rtol 1e-8) alone moves the NLL by
    ~1e-6 relative there. A point moved along that direction from the held-out reference's optimum is a
    near miss with the default solves and the same optimum with solves to 1e-12."""
    ref = _references()["d2027-pk-013"]
    problem = rb.reference_problem(rb.problem_by_id("d2027-pk-013"))
    q = np.array(ref["q"], float)
    q[2], q[4] = 2.25, 2.9  # ke0 and Ce(0): the fit with the Matern 5/2 kernel ended near here
    assert problem.free == (0, 1)  # C's initial value, then Ce's
    default = problem.nll(q)
    assert rr.compare(default, ref["nll"], ref["n_obs"]) == "miss"  # 6e-5 nats above: > 1e-6 relative
    tight = rr.tight_nll(problem, q), rr.tight_nll(problem, ref["q"])
    assert abs(tight[0] - tight[1]) < 1e-7 * abs(tight[1])
    row = {"nll": default, "theta": q[:3].tolist(), "x0_refined": [q[3], q[4]]}
    verdict = rb.judge(row, ref)
    assert verdict["verdict"] == "optimum" and verdict["tight"]["nll"] == pytest.approx(tight[0], abs=1e-12)
    far = rb.judge(dict(row, nll=ref["nll"] + 1.0), ref)  # far above: no second look
    assert far["verdict"] == "miss" and far["miss_kind"] == "far" and "tight" not in far

"""Step 4 by nutpie under pgpgm's budget (pgpgm.posterior.nutpie_engine): the budget ends the run, a run
that passes R-hat and ESS ends there, chains cut to equal length (issue 30)."""

import json
import time
import warnings

import arviz_stats
import numpy as np
import pymc as pm
import pytest
import xarray as xr

from pgpgm.errors import DataError, PrecisionWarning
from pgpgm.posterior.diagnostics import ConvergenceWarning, diagnose, mixing_problems
from pgpgm.posterior.nutpie_engine import (
    CHECK_STATS,
    BETWEEN,
    COMPILED_KEPT,
    START_JITTER,
    STEP_SIZE_JITTER,
    checked_draws,
    check_points,
    GROWTH,
    WHITE,
    compile_whitened,
    compiled_for_structure,
    equal_chains,
    whitened_model,
)
from pgpgm.posterior.budget import PosteriorBudget
from pgpgm.posterior.model import build_ode_model
from pgpgm.posterior.rounds import sample_posterior

pytest.importorskip("nutpie")

import pgpgm
from pgpgm.data import as_observations

DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
T = np.linspace(0, 3, 12)
SD = 0.1


def _decay_model():
    y = 2.0 * np.exp(-0.8 * T) + np.random.default_rng(3).normal(0, SD, T.size)
    obs = as_observations({"time": T, "x": y}, ["x"], DECAY)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    return model, {"k": 0.8, "x_0": float(obs.values[0, 0])}, {"k": 0.05, "x_0": SD}


def test_nutpie_stops_at_its_gradient_budget_and_says_so():
    """Up to 4000 x 32 draws per chain asked; a budget of 20000 leapfrog steps ends the run (watched
    every 0.1 s: the count may pass the budget by what the chains do in that time), keeps equal chains
    of finite draws, and warns naming the budget."""
    model, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, draws=4000, tune=200, chains=2, seed=1, progressbar=False,
                                nuts_sampler="nutpie", budget=PosteriorBudget(None, 20_000))
    spent = json.loads(tree.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "gradient evaluations"
    assert spent["used_gradient_evaluations"] >= 20_000
    n = tree.posterior.sizes["draw"]
    assert 0 < n < 4000 and tree.posterior.sizes["chain"] == 2
    assert np.all(np.isfinite(tree.posterior["k"].values))
    # the kept draws' leapfrog steps do not exceed what was counted (tuning excluded from the draws)
    assert int(tree.sample_stats["n_steps"].sum()) <= spent["used_gradient_evaluations"]


def test_nutpie_ends_when_the_chains_pass_and_agrees_with_pymc():
    """With no budget, the run asked for up to 300 x 32 draws per chain ends once R-hat <= 1.01 and
    ESS >= 400 (checked once every chain has 300 draws, then at 1.5x as many or every 5 s); its posterior mean of k equals
    PyMC's NUTS (an independent sampler, long chains) within four Monte Carlo standard errors."""
    model, center, sd = _decay_model()
    tree = sample_posterior(model, center, sd, draws=300, tune=300, chains=4, seed=2, progressbar=False,
                            nuts_sampler="nutpie", budget=None)
    diag = diagnose(tree, ["k", "x_0"])
    assert float(diag["rhat"].max()) <= 1.01 and float(diag["ess_bulk"].min()) >= 400
    assert 300 <= tree.posterior.sizes["draw"] < 300 * 32
    assert tree.attrs["pgpgm_sampler"] == "nutpie"
    # each draw's step size is the adapted one times U(1 - j, 1 + j), j = STEP_SIZE_JITTER (nutpie's own: 0.1)
    ratio = (tree.sample_stats["step_size"] / tree.sample_stats["step_size_bar"]).values.ravel()
    assert 1 - STEP_SIZE_JITTER - 1e-9 <= ratio.min() < 1 - 0.9 * STEP_SIZE_JITTER
    assert 1 + 0.9 * STEP_SIZE_JITTER < ratio.max() <= 1 + STEP_SIZE_JITTER + 1e-9
    np.testing.assert_array_equal(tree["observed_data"]["y_x"].values.ravel(),
                                  np.asarray(model.rvs_to_values[model["y_x"]].eval()).ravel())
    ref = sample_posterior(model, center, sd, draws=3000, tune=500, chains=4, cores=2, seed=3, progressbar=False,
                           budget=None, warn=False)
    for name in ("k", "x_0"):
        a, b = tree.posterior[name].values.ravel(), ref.posterior[name].values.ravel()
        ess_a = float(diagnose(tree, [name])["ess_bulk"][0])
        ess_b = float(diagnose(ref, [name])["ess_bulk"][0])
        se = np.sqrt(a.var() / ess_a + b.var() / ess_b)
        assert abs(a.mean() - b.mean()) < 4 * se, name
        assert a.std() == pytest.approx(b.std(), rel=0.15), name


def test_ess_asks_every_variable_for_that_many_effective_draws():
    """``ess=1600``: the same run goes on until every variable's bulk and tail ESS reach 1600 (not 400), with
    more draws than the default's; the checks and the warning speak of 1600; a bad value is refused."""
    model, center, sd = _decay_model()
    kw = dict(draws=300, tune=300, chains=4, seed=2, progressbar=False, nuts_sampler="nutpie", budget=None)
    default, sharp = sample_posterior(model, center, sd, **kw), sample_posterior(model, center, sd, ess=1600, **kw)
    diag = diagnose(sharp, ["k", "x_0"], 1600)
    assert float(np.minimum(diag["ess_bulk"], diag["ess_tail"]).min()) >= 1600 and float(diag["rhat"].max()) <= 1.01
    assert sharp.posterior.sizes["draw"] > default.posterior.sizes["draw"]
    found = mixing_problems(diagnose(default, ["k", "x_0"], 1600))  # the default's draws: enough for 400 only
    assert not mixing_problems(diag) and found and all(m.startswith("ESS < 1600 for ") for m in found)
    with pytest.raises(DataError, match="ess must be a number >= 1"):
        sample_posterior(model, center, sd, ess=0, **kw)
    with pytest.raises(DataError, match="NUTS ess must be a number >= 1"):
        pgpgm.NUTS(ess=float("nan"))


def test_a_check_reads_the_same_draws_as_the_whole_trace():
    """checked_draws (the scalars and CHECK_STATS from nutpie's Arrow trace) holds exactly the first n
    draws after tuning of every chain that nutpie's whole trace holds; None while a chain has fewer."""
    import nutpie

    model, center, _ = _decay_model()
    compiled = nutpie.compile_pymc_model(model, backend="numba")
    run = nutpie.sample(compiled, draws=5000, tune=50, chains=3, seed=4, progress_bar=False, blocking=False)
    got = None
    while got is None:  # read while the chains run on, as sample_nutpie's checks do (at their pace)
        time.sleep(0.05)
        got = checked_draws(run, ["k", "x_0"], 100)
    assert checked_draws(run, ["k"], 5001) is None
    whole = equal_chains(run.abort(), 100)
    assert got.posterior.sizes == {"chain": 3, "draw": 100}
    for name in ("k", "x_0"):
        np.testing.assert_array_equal(got.posterior[name].values, whole.posterior[name].values)
    for name in CHECK_STATS:
        np.testing.assert_array_equal(got.sample_stats[name].values, whole.sample_stats[name].values)
    assert diagnose(got, ["k", "x_0"]).equals(diagnose(whole, ["k", "x_0"]))


def test_no_check_is_begun_that_would_end_past_the_time_budget():
    """Each convergence check reads nutpie's trace while the chains sample (0.8-3.3 s on Lotka-Volterra when it
    read the whole trace; one begun at 58 s of a 60 s budget ended at 61.5 s). With 0.1 s left all along and
    checks that take 0.3 s, only the first is begun (nothing known of their time before it). Checks that lag
    behind the chains are not run one after another past a spent gradient budget (before: 60 checks and 80000
    draws per chain on a budget of 8000 gradients); with no limit every check point the run reaches is checked.
    The budget is asked whether it is spent with the seconds that ending takes (reading the trace back: the
    last check's duration, 0 before the first), so that the run ends within it."""
    import time

    from pgpgm.posterior.nutpie_engine import sample_nutpie

    model, center, sd = _decay_model()
    aheads = []

    def run(seconds_left, gradients, max_draws, pause, after_a_check=False):
        calls = []

        def spent(steps, ahead=0.0):  # after_a_check: not before the first check (a fast model on an idle
            aheads.append(ahead)      # machine may spend 8000 gradients between two polls before it)
            return steps >= gradients and (calls or not after_a_check)

        def converged(so_far):
            calls.append(int(so_far.posterior.sizes["draw"]))
            time.sleep(pause)
            return False

        tree = sample_nutpie(model, center, draws=100, tune=100, chains=2, seed=1, target_accept=0.9,
                             max_treedepth=10, max_draws=max_draws, spent=spent,
                             converged=converged, seconds_left=seconds_left,
                             whiten=(np.array([-0.2, 1.9]), np.array([[0.04, 0.01], [0.01, 0.09]])))
        return calls, int(tree.posterior.sizes["draw"])

    few, n_few = run(lambda: 0.1, 8_000, 100_000, 0.3, after_a_check=True)
    assert few == [100] and n_few > 100  # one check; the draws up to the end are returned
    assert aheads[0] == 0.0 and 0.3 <= max(aheads) < 5.0  # the check slept 0.3 s
    lagging, n_lagging = run(None, 8_000, 100_000, 0.3)
    assert len(lagging) <= 5 and n_lagging < 20_000
    many, _ = run(None, 10**9, 1_000, 0.0)
    assert len(many) >= 3 and many[:3] == check_points(100, 1000)[:3] == [100, 112, 125]


def test_the_checks_keep_every_count_of_growth_alone_and_add_counts_between():
    """check_points: every count of ``draws`` times GROWTH (rounded up) is checked, so no run passes later
    than with those alone; BETWEEN more lie strictly between two of them; up to the first count >= last."""
    points = check_points(500, 16000)
    alone = [500]
    while alone[-1] < 16000:
        alone.append(int(np.ceil(alone[-1] * GROWTH)))
    assert alone[:3] == [500, 625, 782] and 11403 in alone  # the counts before BETWEEN
    assert set(alone) <= set(points) and points == sorted(set(points)) and points[-1] == alone[-1]
    assert len(points) == len(alone) + (len(alone) - 1) * BETWEEN
    assert 10199 in points and 9122 < 10199 < 11403


def test_the_trajectories_computed_after_sampling_are_the_models_at_each_draw():
    """nutpie's trace holds z and the free variables only; the deterministics (the dense trajectory) are
    computed after sampling for every kept draw (add_after, two threads): equal to the model's own
    deterministic at that draw's free values, by name, dims and coordinates."""
    import pytensor

    model, center, sd = _decay_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        tree = sample_posterior(model, center, sd, draws=150, tune=100, chains=2, seed=7, progressbar=False,
                                nuts_sampler="nutpie", max_rounds=1)
    post = tree.posterior
    dense = post["x"]
    assert dense.dims == ("chain", "draw", "time_dense") and dense.sizes["draw"] == 150
    np.testing.assert_array_equal(dense["time_dense"].values, model.coords["time_dense"])
    trajectory = pytensor.function([model["k"], model["x_0"]], model["x"])  # at the constrained values
    rng = np.random.default_rng(0)
    for c, d in zip(rng.integers(0, 2, 6), rng.integers(0, 150, 6)):
        np.testing.assert_allclose(dense.values[c, d], trajectory(post["k"].values[c, d], post["x_0"].values[c, d]),
                                   rtol=1e-12)


def test_equal_chains_cuts_every_chain_to_the_shortest():
    """nutpie pads a chain that drew less with NaN (step size too): every group is cut to the draws all
    chains have."""
    step = np.array([[0.1, 0.1, 0.1, 0.1], [0.2, 0.2, np.nan, np.nan]])
    k = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, np.nan, np.nan]])
    tree = xr.DataTree.from_dict({
        "posterior": xr.Dataset({"k": (("chain", "draw"), k)}),
        "sample_stats": xr.Dataset({"step_size": (("chain", "draw"), step)}),
        "observed_data": xr.Dataset({"y": ("t", np.arange(3.0))})})
    out = equal_chains(tree)
    np.testing.assert_array_equal(out.posterior["k"].values, [[1.0, 2.0], [5.0, 6.0]])
    assert out.sample_stats.sizes["draw"] == 2 and out["observed_data"].sizes["t"] == 3


def test_the_whitened_model_is_the_model_in_whitened_coordinates():
    """nutpie samples z with u = mean + L z: the whitened model's log density at z equals the model's at u
    (up to the constant log |L|, the same at every z), and its deterministics are the model's free variables
    (constrained) and deterministics at u, by name."""
    import pytensor

    model, _, _ = _decay_model()
    mean, cov = np.array([-0.2, 1.9]), np.array([[0.04, 0.01], [0.01, 0.09]])
    white, keep = whitened_model(model, mean, cov)
    assert set(keep) == {rv.name for rv in model.free_RVs} | {d.name for d in model.deterministics}
    chol = np.linalg.cholesky(cov)
    logp, logp_white = model.compile_logp(), white.compile_logp()
    outputs = pytensor.function(model.value_vars, model.replace_rvs_by_values([model[n] for n in keep]),
                                on_unused_input="ignore")
    outputs_white = pytensor.function(white.value_vars, white.replace_rvs_by_values([white[n] for n in keep]))
    names = [v.name for v in model.value_vars]
    gaps = []
    for z in np.random.default_rng(0).normal(size=(5, 2)):
        u = mean + chol @ z
        point = dict(zip(names, u))
        gaps.append(float(logp_white({WHITE: z})) - float(logp(point)))
        for a, b in zip(outputs(*u), outputs_white(z)):
            np.testing.assert_allclose(b, a, rtol=1e-12)
    np.testing.assert_allclose(gaps, 0.0, atol=1e-9)
    assert [v.name for v in white.free_RVs] == [WHITE] and white[WHITE].owner.op.name == "flat"


def test_the_compiled_callbacks_are_the_whitened_log_density_its_gradient_and_the_draw():
    """The C callbacks nutpie calls (:func:`compile_whitened`), called here through ctypes: the log density
    at z equals the model's at u = mean + L z (up to the constant log |L|), its gradient equals L^T times
    the model's gradient in u (chain rule), and the draw holds z and then the kept variables at u. A point
    where the log density or its gradient is not finite returns the code by which nutpie rejects it. The whitening is data of the graph, not constants: two optima give one graph."""
    import ctypes

    import pytensor

    model, _, _ = _decay_model()
    mean, cov = np.array([-0.2, 1.9]), np.array([[0.04, 0.01], [0.01, 0.09]])
    white, keep = whitened_model(model, mean, cov)
    compiled = compile_whitened(white, keep).model
    chol = np.linalg.cholesky(cov)
    # the log density with its gradient in one function, as in the callback: the ODE solve with
    # sensitivities steps differently from one without (log densities 1e-5 apart)
    logp_dlogp = pytensor.function(model.value_vars, [model.logp(), *pytensor.grad(model.logp(), model.value_vars)])
    outputs = pytensor.function(model.value_vars, model.replace_rvs_by_values([model[n] for n in keep]),
                                on_unused_input="ignore")
    double_p = ctypes.POINTER(ctypes.c_double)

    def call_logp(z):
        grad, value = np.zeros(2), np.zeros(1)
        code = compiled.compiled_logp_func.ctypes(2, z.ctypes.data_as(double_p), grad.ctypes.data_as(double_p),
                                                  value.ctypes.data_as(double_p), compiled.user_data.ctypes.data)
        return code, float(value[0]), grad

    gaps = []
    for z in np.random.default_rng(1).normal(size=(4, 2)):
        u = mean + chol @ z
        reference, *gradient = logp_dlogp(*u)
        code, value, grad = call_logp(z)
        assert code == 0
        gaps.append(value - float(reference))
        np.testing.assert_allclose(grad, chol.T @ np.array(gradient, float), rtol=1e-9, atol=1e-12)
        draw = np.zeros(compiled.n_expanded)
        assert compiled.compiled_expand_func.ctypes(2, compiled.n_expanded, z.ctypes.data_as(double_p),
                                                    draw.ctypes.data_as(double_p), compiled.user_data.ctypes.data) == 0
        np.testing.assert_array_equal(draw[:2], z)
        np.testing.assert_allclose(draw[2:], np.concatenate([np.ravel(a) for a in outputs(*u)]), rtol=1e-12)
    np.testing.assert_allclose(gaps, gaps[0], atol=1e-9)
    # chains start near the centre, each its own point: within START_JITTER whitened sds (nutpie's own: 1)
    starts = np.array([compiled.initial_point_func(seed) for seed in range(4)])
    assert np.abs(starts).max() <= START_JITTER == 0.1 and len({tuple(s) for s in starts}) == 4
    far = np.linalg.solve(chol, np.array([0.0, 1e300]) - mean)  # x(0) = 1e300: squared residuals overflow
    assert call_logp(far)[0] in (3, 4)  # a gradient (3) or log density (4) not finite: nutpie rejects the point
    other, _ = whitened_model(model, mean + 0.1, 2 * cov)
    shared = {v.name for v in pytensor.graph.traversal.ancestors([other.logp()])
              if isinstance(v, pytensor.compile.SharedVariable)}
    assert {"pgpgm_white_mean", "pgpgm_white_chol"} <= shared


#: the grid of :func:`_callback_values`'s model, used by no other test
OWN_GRID = np.linspace(0.0, 3.0, 13)


def _callback_values(seed: int, mean: float) -> dict:
    """The decay model of data seed ``seed``, whitened at (``mean``, 0.7), compiled for nutpie: the
    callbacks' log density, gradient and draw at two points, the compiled PyTensor functions' own values
    there (the shared values as they are now), and how many of the two callbacks numba loaded from its
    cache."""
    import ctypes

    times = OWN_GRID  # no other test compiles this model: no other process writes its cache meanwhile
    y = 2.0 * np.exp(-0.8 * times) + np.random.default_rng(seed).normal(0, SD, times.size)
    obs = as_observations({"time": times, "x": y}, ["x"], DECAY)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    white, keep = whitened_model(model, np.array([mean, 0.7]), np.array([[0.04, 0.01], [0.01, 0.09]]))
    compiled = compile_whitened(white, keep).model
    p, data = ctypes.POINTER(ctypes.c_double), compiled.user_data.ctypes.data
    out = []
    for z in (np.array([0.3, -0.2]), np.array([-1.1, 0.8])):
        grad, value, draw = np.zeros(2), np.zeros(1), np.zeros(compiled.n_expanded)
        code = compiled.compiled_logp_func.ctypes(2, z.ctypes.data_as(p), grad.ctypes.data_as(p),
                                                  value.ctypes.data_as(p), data)
        compiled.compiled_expand_func.ctypes(2, compiled.n_expanded, z.ctypes.data_as(p), draw.ctypes.data_as(p), data)
        ref_value, ref_grad = compiled.logp_func(z)
        (ref_draw,) = compiled.expand_func(z)
        out.append({"code": int(code), "value": float(value[0]), "grad": grad.tolist(), "draw": draw.tolist(),
                    "ref_value": float(ref_value), "ref_grad": np.asarray(ref_grad).tolist(),
                    "ref_draw": np.asarray(ref_draw).tolist()})
    return {"points": out, "hits": compiled.compiled_logp_func.cache_hits + compiled.compiled_expand_func.cache_hits}


def test_the_callbacks_are_cached_by_structure_and_read_each_fits_data():
    """nutpie's callbacks read the data and the whitening from ``user_data``, so numba caches their code
    by the model's structure: once this process has compiled (or loaded) them, a fresh process fitting
    other data at another optimum loads both from the cache (no compilation) and still returns its own
    log density, gradient and draw - those of PyTensor's function with its shared values - not this
    process's."""
    import os
    import pathlib
    import subprocess
    import sys

    first = _callback_values(3, -0.2)
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); from test_step4_nutpie import _callback_values; "
              "print(json.dumps(_callback_values(11, 0.1)))")
    proc = subprocess.run([sys.executable, "-c", script, str(pathlib.Path(__file__).parent)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert second["hits"] == 2  # both callbacks loaded
    for res in (first, second):
        for p in res["points"]:
            assert p["code"] == 0
            np.testing.assert_allclose(p["value"], p["ref_value"], rtol=1e-12)
            np.testing.assert_allclose(p["grad"], p["ref_grad"], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(p["draw"], p["ref_draw"], rtol=1e-12)
    gaps = [abs(a["value"] - b["value"]) for a, b in zip(first["points"], second["points"])]
    assert min(gaps) > 1e-3  # other data and another optimum: other values, from the same cached code


def _decay_white(seed: int, mean: float, times=T):
    y = 2.0 * np.exp(-0.8 * times) + np.random.default_rng(seed).normal(0, SD, times.size)
    obs = as_observations({"time": times, "x": y}, ["x"], DECAY)
    model, _ = build_ode_model(DECAY, obs, x0=[np.nan], priors={"k": (0.0, 5.0)}, noise_sd=[SD])
    return model, whitened_model(model, np.array([mean, 0.7]), np.array([[0.04, 0.01], [0.01, 0.09]]))


def _callbacks_at(compiled, points) -> list:
    """The log density, gradient and draw of ``compiled``'s C callbacks (through its ``logp_func`` and
    ``expand_func`` where those are the callbacks' own) at each point z."""
    import ctypes

    p, out = ctypes.POINTER(ctypes.c_double), []
    for z in points:
        grad, value, draw = np.zeros(2), np.zeros(1), np.zeros(compiled.n_expanded)
        code = compiled.compiled_logp_func.ctypes(2, z.ctypes.data_as(p), grad.ctypes.data_as(p),
                                                  value.ctypes.data_as(p), compiled.user_data.ctypes.data)
        compiled.compiled_expand_func.ctypes(2, compiled.n_expanded, z.ctypes.data_as(p), draw.ctypes.data_as(p),
                                             compiled.user_data.ctypes.data)
        out.append((code, value[0], grad, draw))
    return out


def test_a_model_of_a_compiled_structure_reuses_its_callbacks_with_its_own_data():
    """A second data set at another optimum (the same graph, other shared values) reuses the callbacks
    compiled for the first (no PyTensor compilation) and returns, bit for bit, what a fresh compilation of
    its own model returns: log density, gradient, draw, and nutpie's draws of the same seed. Another time
    grid (another ODE solve, other shapes) is another structure."""
    def counts():
        info = compiled_for_structure.cache_info()
        return info.hits, info.misses

    compiled_for_structure.cache_clear()
    points = [np.array([0.3, -0.2]), np.array([-1.1, 0.8])]
    first = compile_whitened(*_decay_white(3, -0.2)[1], reuse=True).model
    assert counts() == (0, 1)
    model, white = _decay_white(11, 0.1)
    reused = compile_whitened(*white, reuse=True).model
    assert counts() == (1, 1)
    assert reused.compiled_logp_func is first.compiled_logp_func  # the same compiled code
    fresh = compile_whitened(*_decay_white(11, 0.1)[1]).model  # compiled for this model alone
    for (c1, v1, g1, d1), (c2, v2, g2, d2), (c0, v0, *_) in zip(_callbacks_at(reused, points),
                                                                _callbacks_at(fresh, points),
                                                                _callbacks_at(first, points)):
        assert c1 == c2 == 0 and v1 == v2 and np.array_equal(g1, g2) and np.array_equal(d1, d2)
        assert abs(v1 - v0) > 1e-3  # its own data and whitening, not the first model's
    value, grad = reused.logp_func(points[0])  # the reused model's Python functions call its callbacks
    ref_value, ref_grad = fresh.logp_func(points[0])
    np.testing.assert_allclose([value, *grad], [float(ref_value), *np.ravel(ref_grad)], rtol=1e-12)
    np.testing.assert_allclose(reused.expand_func(points[0])[0], np.ravel(fresh.expand_func(points[0])[0]), rtol=1e-12)
    # another grid: another structure
    compile_whitened(*_decay_white(3, -0.2, times=np.linspace(0, 3, 15))[1], reuse=True)
    assert counts() == (1, 2) and compiled_for_structure.cache_info().maxsize == COMPILED_KEPT
    # sampling: a run on the reused compiled model and one on a fresh compilation give the same draws
    kw = dict(draws=100, tune=100, chains=2, seed=5, progressbar=False, nuts_sampler="nutpie", max_rounds=1)
    draws = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for runs in (2, 1):
            compiled_for_structure.cache_clear()  # the first run compiles; a second reuses that
            for _ in range(runs):
                tree = sample_posterior(model, {"k": 0.8, "x_0": 2.0}, {"k": 0.05, "x_0": SD}, **kw)
            assert counts() == (runs - 1, 1)
            draws.append((tree.posterior["k"].values, tree.posterior["x"].values))
    np.testing.assert_array_equal(draws[0][0], draws[1][0])
    np.testing.assert_array_equal(draws[0][1], draws[1][1])  # the trajectories after sampling: its own data


def test_auto_runs_nutpie_where_every_value_variable_is_a_scalar():
    """``nuts_sampler="auto"`` (the default): nutpie, whitened,
    where every value variable is a scalar (every single-experiment fit); PyMC's rounds on a model with a
    vector-valued variable (a study's random effects), which the whitening does not cover."""
    import pymc as pm

    from pgpgm.posterior.rounds import auto_sampler

    assert pgpgm.NUTS().sampler == "auto"
    model, center, sd = _decay_model()
    assert auto_sampler(model) == "nutpie"
    with pm.Model() as vector:
        pm.Normal("effects", 0.0, 1.0, shape=3)
    assert auto_sampler(vector) == "pymc"
    cov = (["k", "x_0"], np.array([[sd["k"] ** 2, 0.0004], [0.0004, sd["x_0"] ** 2]]))
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, covariance=cov, draws=400, tune=100, chains=2, seed=1,
                                progressbar=False, nuts_sampler="auto", budget=PosteriorBudget(None, 3000))
    assert tree.attrs["pgpgm_sampler"] == "nutpie"


def test_a_short_run_asked_for_stays_short_as_with_pymc():
    """50 draws of 2 chains (fewer than 2 x ESS_MIN in all): PyMC's engine runs no second round, and
    nutpie is not asked for more than the 50 draws either - an unconverged short run with the warning,
    not a run to the budget (the notebooks' quick runs: 81 s against PyMC's 38 s before)."""
    model, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="ESS < 400"):
        tree = sample_posterior(model, center, sd, draws=50, tune=50, chains=2, seed=1, progressbar=False)
    assert tree.attrs["pgpgm_sampler"] == "nutpie"
    assert tree.posterior.sizes["draw"] == 50 and tree.posterior.sizes["chain"] == 2
    assert not json.loads(tree.attrs["pgpgm_budget"])["exhausted"]


def test_a_nutpie_run_the_budget_stops_while_tuning_keeps_the_latter_half_of_its_tuning():
    """A budget spent before tuning ends (5000 tuning iterations asked, 4000 leapfrog steps allowed): as
    with PyMC's engine, the result holds the latter half of the tuning iterations every chain made,
    flagged ``pgpgm_tuning_draws``, finite, with the budget warning - not zero draws."""
    model, center, sd = _decay_model()
    with pytest.warns(ConvergenceWarning, match="gradient evaluations ran out"):
        tree = sample_posterior(model, center, sd, draws=500, tune=5000, chains=2, seed=1, progressbar=False,
                                nuts_sampler="nutpie", budget=PosteriorBudget(None, 4000))
    assert tree.attrs["pgpgm_tuning_draws"] == 1 and json.loads(tree.attrs["pgpgm_budget"])["exhausted"]
    n = tree.posterior.sizes["draw"]
    assert 10 < n < 2500 and tree.posterior.sizes["chain"] == 2
    assert np.all(np.isfinite(tree.posterior["k"].values)) and not any(g.startswith("warmup") for g in tree.children)
    # the trajectories, computed after sampling, for the tuning iterations kept too
    assert tree.posterior["x"].sizes["draw"] == n and np.all(np.isfinite(tree.posterior["x"].values))


def _funnel():
    """Neal's funnel: v ~ Normal(0, 1.5), x ~ Normal(0, exp(v)) - NUTS at the adapted step size diverges in
    its neck (v well below 0)."""
    import pymc as pm

    with pm.Model() as model:
        v = pm.Normal("v", 0.0, 1.5)
        pm.Normal("x", 0.0, pm.math.exp(v))
    return model, {"v": 0.0, "x": 0.0}, {"v": 1.5, "x": 1.0}


def test_divergences_in_draws_that_pass_bring_one_run_at_the_highest_target_where_the_budget_affords_it():
    """The funnel's first run (target 0.9) passes R-hat and ESS with divergences: one more run at
    TARGET_ACCEPT_MAX (smaller steps) follows and its draws, passing too, are the result (round 2 kept); v's
    marginal is Normal(0, 1.5). With a gradient budget of twice the first run's, which cannot afford
    DIVERGENCE_RUN_COST times it, the first run's draws are the result and the warning names the divergences."""
    from pgpgm.posterior.rounds import DIVERGENCE_RUN_COST
    from pgpgm.posterior.pymc_engine import TARGET_ACCEPT_MAX

    model, center, sd = _funnel()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        tree = sample_posterior(model, center, sd, draws=500, tune=500, chains=4, seed=2, progressbar=False,
                                nuts_sampler="nutpie", sd_error=None)
    assert tree.attrs["pgpgm_rounds"] == 2 and json.loads(tree.attrs["pgpgm_kept_rounds"]) == [2]
    problems = json.loads(tree.attrs["pgpgm_round_problems"])
    assert len(problems) == 1 and "divergent transitions" in problems[0][-1]
    first, second = json.loads(tree.attrs["pgpgm_round_gradient_evaluations"])
    diag = diagnose(tree, ["v", "x"])
    assert float(diag["rhat"].max()) <= 1.01 and float(np.minimum(diag["ess_bulk"], diag["ess_tail"]).min()) >= 400
    v = tree.posterior["v"].values
    assert abs(v.mean()) < 0.3 and 1.2 < v.std() < 1.8
    # the higher target's steps are smaller: more leapfrog steps per draw than the first run's
    n_first, n_second = json.loads(tree.attrs["pgpgm_round_draws"])
    assert second / n_second > first / n_first
    assert TARGET_ACCEPT_MAX == 0.99 and DIVERGENCE_RUN_COST > 1

    with pytest.warns(ConvergenceWarning, match="divergent transitions"):
        alone = sample_posterior(model, center, sd, draws=500, tune=500, chains=4, seed=2, progressbar=False,
                                 nuts_sampler="nutpie", budget=PosteriorBudget(None, 2 * first), sd_error=None)
    assert alone.attrs["pgpgm_rounds"] == 1 and alone.posterior.sizes["draw"] == n_first
    assert int(alone.sample_stats["diverging"].sum()) > 0


def test_draws_that_pass_go_on_until_every_sd_is_known_to_the_goal():
    """A Student-t posterior (nu 5: kurtosis 9, sd sqrt(5/3)) passes R-hat and ESS with its sd uncertain by
    more than 3 %; with sd_error=0.03 the chains go on (no budget) until every sd's Monte Carlo error is at most
    3 % (ArviZ's mcse of the sd, recomputed here) with more draws than sd_error=None's, and the sd is within 3
    of those errors of the exact one. With a gradient budget the extension stops by SHARPEN_SHARE of it and
    the draws that passed come back with no budget stop recorded."""
    from pgpgm.posterior.budget import SHARPEN_SHARE

    with pm.Model() as model:
        pm.StudentT("t", nu=5.0, mu=0.0, sigma=1.0)
        pm.Normal("n", 0.0, 2.0)
    center, sd = {"t": 0.0, "n": 0.0}, {"t": 1.3, "n": 2.0}
    kw = dict(draws=500, tune=500, chains=4, seed=2, progressbar=False, nuts_sampler="nutpie")
    plain = sample_posterior(model, center, sd, sd_error=None, **kw)
    sharp = sample_posterior(model, center, sd, sd_error=0.03, **kw)
    assert not mixing_problems(diagnose(plain, ["t", "n"]))

    def error(tree, n):
        return float(arviz_stats.mcse(tree, var_names=[n], method="sd")[n]) / float(tree.posterior[n].std(ddof=1))

    recorded = json.loads(sharp.attrs["pgpgm_sd_error"])
    assert recorded["goal"] == 0.03 and recorded["errors"]["t"] == pytest.approx(error(sharp, "t"), rel=1e-9)
    assert error(plain, "t") > 0.03 and max(error(sharp, "t"), error(sharp, "n")) <= 0.03
    assert sharp.posterior.sizes["draw"] > plain.posterior.sizes["draw"]
    exact = np.sqrt(5.0 / 3.0)
    assert abs(float(sharp.posterior["t"].std(ddof=1)) - exact) <= 3 * error(sharp, "t") * exact
    grads = sum(json.loads(plain.attrs["pgpgm_round_gradient_evaluations"]))
    capped = sample_posterior(model, center, sd, sd_error=0.03, budget=PosteriorBudget(None, 2 * grads), **kw)
    spent = json.loads(capped.attrs["pgpgm_budget"])
    assert spent["exhausted"] == "" and spent["used_gradient_evaluations"] <= (SHARPEN_SHARE + 0.25) * 2 * grads
    assert not mixing_problems(diagnose(capped, ["t", "n"]))
    # a goal no such budget reaches (0.5 %: t's kurtosis 9 asks for ~80000 independent draws) is named, with
    # each error above it; a goal met (sharp) warns of nothing
    with pytest.warns(PrecisionWarning, match="sd_error=0.005 asks") as caught:
        short = sample_posterior(model, center, sd, sd_error=0.005, budget=PosteriorBudget(None, 2 * grads), **kw)
    over = {n: e for n, e in json.loads(short.attrs["pgpgm_sd_error"])["errors"].items() if e > 0.005}
    assert "t" in over  # (n, a Normal, may reach it: NUTS's draws of a Gaussian are nearly independent)
    message = str(next(w.message for w in caught if w.category is PrecisionWarning))
    assert all(f"{n} ({e:.1%})" in message for n, e in over.items())
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        sample_posterior(model, center, sd, sd_error=0.03, **kw)

"""Many experiments in one fit and hierarchical models (issue 31 items 1-2): pgpgm.fit_study.

References are independent: the closed-form one-compartment oral model written out here, a scipy
multi-start of the joint likelihood, scipy.stats log densities of the joint PyMC model.
"""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import optimize, stats

import pgpgm
from pgpgm.errors import DataError, ResultFileError
from pgpgm.study import Study, StudyExperiment

TRUTH = {"ka": 1.5, "ke": 0.085, "CL": 0.04}
TIMES = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
DOSES = (2.0, 4.5, 8.0)


def conc(t, dose, ka, ke, cl):
    """C(t) of pk-oral: D ka ke / (CL (ka - ke)) (exp(-ke t) - exp(-ka t))."""
    return dose * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


@pytest.fixture(scope="module")
def pk():
    return pgpgm.load_model("pk-oral")


def _simulated(seed=7, sd=0.3):
    rng = np.random.default_rng(seed)
    return {f"dose {d:g}": conc(TIMES, d, *TRUTH.values()) + sd * rng.standard_normal(TIMES.size) for d in DOSES}


def _study(ys):
    return Study.from_mapping({k: pd.DataFrame({"time": TIMES, "C": y}) for k, y in ys.items()},
                              x0={k: {"A": float(k.split()[1]), "C": 0.0} for k in ys})


def _joint_multistart(ys, n_starts=40, seed=0):
    """Independent optimum of the joint likelihood: shared (ka, ke, CL), one noise sd profiled out."""
    doses = [float(k.split()[1]) for k in ys]
    y = np.concatenate(list(ys.values()))

    def res(q):
        ka, ke, cl = np.exp(q)
        return np.concatenate([conc(TIMES, d, ka, ke, cl) for d in doses]) - y

    rng = np.random.default_rng(seed)
    best = None
    for q0 in np.log([0.3, 0.01, 0.005]) + rng.random((n_starts, 3)) * np.log([30.0, 30.0, 30.0]):
        r = optimize.least_squares(res, q0, xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=3000)
        ka, ke, cl = np.exp(r.x)
        if ka < ke:  # the (ka, ke)-symmetric branch; the prior box ke <= 1 excludes it here
            continue
        rss = float(np.sum(r.fun**2))
        if best is None or rss < best[0]:
            best = (rss, np.exp(r.x))
    rss, theta = best
    n = y.size
    return theta, np.sqrt(rss / n), 0.5 * n * np.log(rss / n) + 0.5 * n + 0.5 * n * np.log(2 * np.pi)


@pytest.fixture(scope="module")
def joint3(pk):
    ys = _simulated()
    return ys, pgpgm.fit_study(pk.system, _study(ys), priors=pk.priors(), posterior=None)


def test_joint_fit_equals_independent_multistart(joint3):
    ys, res = joint3
    theta, sd, nll = _joint_multistart(ys)
    joint = res.theta("joint")
    for name in ys:  # shared: the same values in every experiment
        np.testing.assert_allclose(joint.loc[name].to_numpy(), theta, rtol=2e-4)
    np.testing.assert_allclose(res.estimates["noise_sd"].sel(estimate="joint").values, sd, rtol=2e-4)
    assert res.nll == pytest.approx(nll, abs=1e-4)
    # each experiment alone (C(0) = 0 and A(0) = dose held) equals its own independent optimum
    for name, y in ys.items():
        one = _joint_multistart({name: y})
        np.testing.assert_allclose(res.theta("separate").loc[name].to_numpy(), one[0], rtol=2e-4)
        assert res.estimates["nll"].sel(estimate="separate", experiment=name).item() == pytest.approx(one[2], abs=1e-4)
    starts = json.loads(res.estimates.attrs["nll_per_start"])
    assert set(starts) == {*(f"experiment {k}" for k in ys), "mean"}


def test_save_load_and_plot(joint3, tmp_path):
    _, res = joint3
    path = res.save(tmp_path / "study.nc")
    back = pgpgm.load_study(path)
    pd.testing.assert_frame_equal(back.theta("joint"), res.theta("joint"))
    np.testing.assert_array_equal(back.trajectories["x"].values, res.trajectories["x"].values)
    assert back.nll == res.nll and back.posterior is None
    with pytest.raises(ResultFileError, match="not a study"):
        pgpgm.load_study(_single_fit_file(tmp_path, res))
    fig = res.plot()
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 3


def _single_fit_file(tmp_path, res):
    r = pgpgm.FitResult(res.system, xr.DataTree(),
                        res.estimates.drop_attrs(), res.trajectories, {}, {})
    return r.save(tmp_path / "single.nc")


def test_a_symmetric_box_gives_one_competing_optima_warning_for_the_study(pk):
    """With the default box (0, 10) both branches of pk-oral's flip-flop are inside: the experiments' fits
    find the mirror (ka and ke exchanged) and the study says so once, naming them."""
    ys = _simulated()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pgpgm.fit_study(pk.system, _study(ys), priors=(0.0, 10.0), posterior=None, progressbar=False)
    found = [str(w.message) for w in caught if issubclass(w.category, pgpgm.CompetingOptimaWarning)]
    assert len(found) == 1 and "ka <-> ke exchanged" in found[0]
    assert any(f"{n} of 3 experiments" in found[0] for n in (1, 2, 3)) and "dose" in found[0]


def test_varying_parameter_refines_per_experiment(pk, joint3):
    """CL varying, ka and ke shared: the joint optimum equals an independent scipy fit of that structure."""
    ys, _ = joint3
    res = pgpgm.fit_study(pk.system, _study(ys), varying=("CL",), priors=pk.priors(), posterior=None,
                          draws=300, tune=200)
    doses = [float(k.split()[1]) for k in ys]
    y = np.concatenate(list(ys.values()))

    def r(q):
        ka, ke, *cls = np.exp(q)
        return np.concatenate([conc(TIMES, d, ka, ke, c) for d, c in zip(doses, cls)]) - y

    fit = optimize.least_squares(r, np.log([1.5, 0.08, 0.04, 0.04, 0.04]), xtol=1e-14, ftol=1e-14, gtol=1e-14)
    q = np.exp(fit.x)
    got = res.theta("joint")
    np.testing.assert_allclose(got[["ka", "ke"]].to_numpy(), np.tile(q[:2], (3, 1)), rtol=2e-4)
    np.testing.assert_allclose(got["CL"].to_numpy(), q[2:], rtol=2e-4)


@pytest.mark.parametrize("centred", [False, True])
def test_joint_model_log_density_equals_scipy(pk, centred):
    """The step-4 model (hierarchical ka, shared ke and CL, one noise sd) against scipy.stats."""
    from pgpgm.data import as_observations
    from pgpgm.priors import Priors
    from pgpgm.study import build_study_model

    ys = _simulated(seed=3)
    names = list(ys)
    obs = [as_observations(pd.DataFrame({"time": TIMES, "C": y}), None, pk.system) for y in ys.values()]
    x0s = [np.array([float(n.split()[1]), 0.0]) for n in names]
    prior = Priors.from_user(pk.system.parameters, pk.priors())
    model = build_study_model(pk.system, obs, names, x0s, [(), (), ()], [{}, {}, {}], hierarchical={"ka": "lognormal"},
                              priors=prior, noise_center={"C": 0.3}, centred=centred)
    point = {"mu_ka": 0.3, "sigma_ka": 0.4, "ke": 0.09, "CL": 0.045, "sigma_C": 0.35,
             **{f"z_ka[{n}]": z for n, z in zip(names, (-0.5, 0.2, 1.1))},
             **{f"log_ka[{n}]": 0.3 + 0.4 * z for n, z in zip(names, (-0.5, 0.2, 1.1))}}
    logp = model.compile_logp(jacobian=False)
    value = logp(model.initial_point() | {model.rvs_to_values[rv].name: _to_value(model, rv, point[rv.name])
                                          for rv in model.free_RVs})
    expect = stats.norm(0, 3).logpdf(0.3) + stats.halfnorm(scale=1).logpdf(0.4)
    bounds = pk.priors()  # the model file's Uniform boxes
    expect += sum(stats.uniform(bounds[p][0], bounds[p][1] - bounds[p][0]).logpdf(v) for p, v in (("ke", 0.09),
                                                                                                  ("CL", 0.045)))
    expect += stats.lognorm(s=2.0, scale=0.3).logpdf(0.35)
    for n, z in zip(names, (-0.5, 0.2, 1.1)):
        ka = np.exp(0.3 + 0.4 * z)
        prior_z = stats.norm(0.3, 0.4).logpdf(np.log(ka)) if centred else stats.norm.logpdf(z)
        expect += prior_z + stats.norm(conc(TIMES, float(n.split()[1]), ka, 0.09, 0.045), 0.35).logpdf(
            ys[n]).sum()
    assert value == pytest.approx(expect, rel=1e-6)


def _to_value(model, rv, x):
    tr = model.rvs_to_transforms.get(rv)
    if tr is None:
        return np.asarray(x)
    return np.asarray(tr.forward(np.asarray(x, float), *rv.owner.inputs).eval())


def _population(pk, n, seed):
    rng = np.random.default_rng(seed)
    mu, sigma = np.log(1.5), 0.4
    kas = np.exp(mu + sigma * rng.standard_normal(n))
    doses = np.round(rng.uniform(3.0, 6.0, n), 2)
    data = {f"s{i}": pd.DataFrame({"time": TIMES, "C": conc(TIMES, d, ka, 0.085, 0.04)
                                   + 0.3 * rng.standard_normal(TIMES.size)})
            for i, (d, ka) in enumerate(zip(doses, kas))}
    study = Study.from_mapping(data, x0={f"s{i}": {"A": d, "C": 0.0} for i, d in enumerate(doses)})
    return study, mu


def _hierarchical_covers(pk, n, seed, draws, centred=False, chains=2):
    study, mu = _population(pk, n, seed)
    res = pgpgm.fit_study(pk.system, study, hierarchical={"ka": "lognormal"}, priors=pk.priors(),
                          posterior=pgpgm.NUTS(draws=draws, tune=draws, chains=chains, budget=240), seed=seed,
                          centred=centred, draws=300, tune=200)
    draws_mu = res.posterior.posterior["mu_ka"].values.ravel()
    lo, hi = np.quantile(draws_mu, [0.03, 0.97])
    assert lo <= mu <= hi, (lo, mu, hi)
    # the starting population: log mean of the refined values
    start = res.population[("start", "mu")]["ka"]
    assert abs(start - mu) < 3 * 0.4 / np.sqrt(n) + 0.1
    return res


def test_hierarchical_posterior_covers_population_truth_small(pk, tmp_path):
    """4 subjects, short chains: the population mean of log ka lies in its 94 % interval."""
    res = _hierarchical_covers(pk, 4, seed=1, draws=250)
    assert {"mu_ka", "sigma_ka", "ke", "CL", "sigma_C"} <= set(res.posterior.posterior.data_vars)
    assert res.theta("posterior").shape == (4, 3)
    # the posterior mean of ka[e] is that of exp(mu + sigma z[e])
    post = res.posterior.posterior
    ka0 = np.exp(post["mu_ka"] + post["sigma_ka"] * post["z_ka[s0]"]).mean()
    assert res.theta("posterior").loc["s0", "ka"] == pytest.approx(float(ka0), rel=1e-9)
    back = pgpgm.load_study(res.save(tmp_path / "h.nc"))
    pd.testing.assert_frame_equal(back.population, res.population)
    np.testing.assert_array_equal(back.posterior.posterior["mu_ka"].values, post["mu_ka"].values)


@pytest.mark.slow
def test_hierarchical_posterior_covers_population_truth_8(pk):
    res = _hierarchical_covers(pk, 8, seed=2, draws=500, centred=True, chains=4)
    assert not res.convergence_problems(), res.convergence_problems()


# ----------------------------------------------------------------------------- bad inputs
def test_bad_inputs(pk):
    tidy = pd.DataFrame({"experiment": ["a"] * 4 + ["b"] * 4, "time": [0, 1, 2, 3] * 2, "state": "C",
                         "value": [0, 1.0, 0.8, 0.5] * 2})
    inputs = pd.DataFrame({"experiment": ["a", "b", "c"], "dose": [1.0, 2.0, 3.0]})
    with pytest.raises(DataError, match=r"inputs name experiment\(s\) \['c'\] that have no data"):
        Study.from_tidy(tidy, inputs, x0={"A": "dose"})
    with pytest.raises(DataError, match=r"experiment\(s\) \['b'\] have no row in the inputs"):
        Study.from_tidy(tidy, inputs.iloc[:1], x0={"A": "dose"})
    with pytest.raises(DataError, match=r"inputs lack the column\(s\) \['weight'\]"):
        Study.from_tidy(tidy, inputs.iloc[:2], x0={"A": "weight"})
    with pytest.raises(DataError, match="'experiment' column"):
        Study.from_tidy(tidy.drop(columns="experiment"))
    with pytest.raises(DataError, match="experiment 'b' has no data"):
        Study.from_mapping({"a": tidy.iloc[:4], "b": pd.DataFrame()})
    with pytest.raises(DataError, match="experiment 'b' has no data"):
        StudyExperiment("b", None)
    with pytest.raises(DataError, match=r"x0 names experiment\(s\) \['z'\] that have no data"):
        Study.from_mapping({"a": tidy.iloc[:4]}, x0={"z": {"A": 1.0}})
    with pytest.raises(DataError, match="distinct"):
        Study((StudyExperiment("a", tidy.iloc[:4]), StudyExperiment("a", tidy.iloc[4:])))
    study = Study.from_tidy(tidy, inputs.iloc[:2], x0={"A": "dose", "C": 0.0})
    with pytest.raises(DataError, match="varying names \\['V'\\], which are not parameters"):
        pgpgm.fit_study(pk.system, study, varying=("V",))
    with pytest.raises(DataError, match="hierarchical names 'V'"):
        pgpgm.fit_study(pk.system, study, hierarchical={"V": "lognormal"})
    with pytest.raises(DataError, match="population distributions"):
        pgpgm.fit_study(pk.system, study, hierarchical={"ka": "normal"})
    with pytest.raises(DataError, match="both varying and hierarchical"):
        pgpgm.fit_study(pk.system, study, varying=("ka",), hierarchical={"ka": "lognormal"})
    with pytest.raises(DataError, match="latent state\\(s\\) \\['A'\\] need a known initial value"):
        pgpgm.fit_study(pk.system, Study.from_tidy(tidy))
    with pytest.raises(DataError, match="x0 names unknown state"):
        pgpgm.fit_study(pk.system, Study.from_tidy(tidy, x0={"B": 1.0}))
    with pytest.raises(DataError, match="fixed names unknown parameter"):
        pgpgm.fit_study(pk.system, Study.from_tidy(tidy, x0={"A": 1.0}, fixed={"V": 1.0}))
    with pytest.raises(DataError, match="must be a pgpgm.Study"):
        pgpgm.fit_study(pk.system, tidy)
    with pytest.raises(DataError, match="fit_kwargs must not hold"):
        pgpgm.fit_study(pk.system, study, fit_kwargs={"x0": {}})
    with pytest.raises(DataError, match="noise_sd of C must be a positive number"):
        pgpgm.fit_study(pk.system, study, noise_sd=-1.0)


def test_study_from_tidy_theophylline():
    data, inputs = pgpgm.datasets.theophylline(), pgpgm.datasets.theophylline_inputs()
    study = Study.from_tidy(data, inputs, x0={"A": "dose_mg_per_kg", "C": 0.0})
    assert study.names == tuple(str(i) for i in range(1, 13))
    dose = dict(zip(inputs.experiment, inputs.dose_mg_per_kg))
    for e in study.experiments:
        assert e.x0 == {"A": dose[e.name], "C": 0.0}
        assert e.data.shape[0] == 11 and list(e.data.columns) == ["time", "state", "value"]
    obs = study.check(pgpgm.load_model("pk-oral").system)
    assert [o.states for o in obs] == [("C",)] * 12
    assert study.subset(["3", "1"]).names == ("3", "1")


def test_study_model_samples_the_named_initial_values_on_the_log_scale():
    """``build_study_model(positive_x0=)``: the named experiment's initial value gets the Normal prior restricted
    to positive values, on PyMC's log scale (value variable ``..._interval__``, log x0); the other keeps the
    plain Normal, and the restricted prior's log density is the Normal's renormalised to x0 > 0."""
    import pymc as pm

    from pgpgm.data import as_observations
    from pgpgm.priors import Priors
    from pgpgm.study.model import build_study_model

    growth = pgpgm.ODESystem.from_equations({"x": "r*x"}, ["r"], name="growth")
    t = np.linspace(0.0, 2.0, 6)
    obs = [as_observations({"time": t, "x": 0.5 * np.exp(t) + d}, ["x"], growth) for d in (0.0, 0.1)]
    model = build_study_model(growth, obs, ["a", "b"], [np.array([0.5]), np.array([0.6])], [(0,), (0,)], [{}, {}],
                              priors=Priors.from_user(["r"], (0.0, 5.0)), noise_sd={"x": 0.1},
                              positive_x0=[(0,), ()])
    assert [v.name for v in model.value_vars] == ["r_interval__", "x_0[a]_interval__", "x_0[b]"]
    y0, sd = float(obs[0].values[0, 0]), float(np.std(obs[0].values[:, 0]))
    rv = model["x_0[a]"]
    assert float(model.rvs_to_transforms[rv].forward(np.float64(0.3), *rv.owner.inputs).eval()) == pytest.approx(
        np.log(0.3), rel=1e-12)
    logp = float(pm.logp(rv, np.float64(0.3)).eval())
    assert logp == pytest.approx(stats.norm(y0, sd).logpdf(0.3) - stats.norm(y0, sd).logsf(0.0), rel=1e-7)


def test_an_unconverged_study_posterior_names_what_the_data_leave_open():
    """x' = -(a + b) x determines a + b alone: the joint refinement's standard errors of a and b are
    infinite, and when step 4's chains then mix poorly (here a small budget) the study's ConvergenceWarning
    says that the data do not determine a and b, and what to do."""
    from pgpgm.posterior.budget import PosteriorBudget

    system = pgpgm.ODESystem.from_equations({"x": "-(a + b)*x"}, ["a", "b"], name="sum-decay")
    t = np.linspace(0.0, 3.0, 15)
    study = Study.from_mapping({f"e{k}": pgpgm.simulate(system, [0.3, 0.5], [x0], t, noise_sd=0.05, seed=k)
                                for k, x0 in enumerate((2.0, 3.0))})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pgpgm.fit_study(system, study, priors=(0.0, 2.0), noise_sd=0.05, draws=200, tune=100,
                              posterior=pgpgm.NUTS(draws=100, tune=50, chains=2, rounds=1, cores=1, sampler="pymc",
                                                   budget=PosteriorBudget(None, 400)))
    se = res.estimates["stderr"]
    assert not np.isfinite(se.sel(parameter=["a", "b"]).values).any()
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, pgpgm.ConvergenceWarning))
    assert "NUTS (study)" in text and "the data do not determine a, b" in text and "fixed=" in text


def test_a_study_whose_step_4_cannot_start_returns_the_joint_fit_with_a_warning(pk, joint3, monkeypatch):
    """NUTS that finds no finite start (forced here: its engine raises pgpgm's StartError, as nutpie's "All
    initialization points failed" becomes) ends no study fit: the joint refinement stands, no posterior, a warning."""
    from pgpgm.steps import posterior as step4

    def no_start(*args, **kwargs):
        raise pgpgm.StartError("NUTS (nutpie) could not start: All initialization points failed (forced)")

    monkeypatch.setattr(step4, "run_nuts", no_start)
    ys, plain = joint3
    with pytest.warns(pgpgm.ConvergenceWarning, match=r"step 4 \(NUTS\) could not start"):
        r = pgpgm.fit_study(pk.system, _study(ys), priors=pk.priors(), progressbar=False,
                            posterior=pgpgm.NUTS(draws=20, tune=20, chains=2))
    assert r.posterior is None
    np.testing.assert_allclose(r.theta("joint").values, plain.theta("joint").values, rtol=1e-6)

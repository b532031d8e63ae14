"""Noise models in a study (issue 31 items 4-5 with item 1): lognormal, Poisson and per-experiment noise in
pgpgm.fit_study's refinements and step-4 model.

References are independent: the closed-form one-compartment oral model and solve_ivp for SIR written out
here, multi-start (>= 20 starts) scipy optima of the joint likelihood written with scipy.stats, and
scipy.stats log densities of the joint PyMC model.
"""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm.errors import DataError
from pgpgm.solve import default_solver
from pgpgm.study import Study

TRUTH = (1.5, 0.085, 0.04)  # ka, ke, CL
TIMES = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
DOSES = (2.0, 4.5, 8.0)
N_STARTS = 24
FAST = {"draws": 300, "tune": 200}


def conc(t, dose, ka, ke, cl):
    """C(t) of pk-oral: D ka ke / (CL (ka - ke)) (exp(-ke t) - exp(-ka t)); C(0) = 0."""
    return dose * ka * ke / (cl * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


@pytest.fixture(scope="module")
def pk():
    return pgpgm.load_model("pk-oral")


def _pk_study(ys):
    return Study.from_mapping({k: pd.DataFrame({"time": TIMES, "C": y}) for k, y in ys.items()},
                              x0={k: {"A": float(k.split()[1]), "C": 0.0} for k in ys})


LOG_LO, LOG_SPAN = np.log([0.3, 0.01, 0.005]), np.log(30.0)  # log-uniform starts: ka, ke, CL in [lo, 30 lo]


def _multistart(nll, k, seed=0, lo=LOG_LO, span=LOG_SPAN):
    """The best of N_STARTS L-BFGS-B minimisations of ``nll`` over log parameters (k,) from log-uniform starts,
    polished by Nelder-Mead."""
    rng = np.random.default_rng(seed)
    best = None
    for q0 in lo[:k] + rng.random((N_STARTS, k)) * span:
        r = optimize.minimize(nll, q0, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000})
        if np.isfinite(r.fun) and (best is None or r.fun < best.fun):
            best = r
    return optimize.minimize(nll, best.x, method="Nelder-Mead",
                             options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000, "maxfev": 8000})


# ----------------------------------------------------------------------------- lognormal, C(0) = 0
@pytest.fixture(scope="module")
def lognormal3(pk):
    rng = np.random.default_rng(11)
    ys = {}
    for d in DOSES:
        y = conc(TIMES, d, *TRUTH) * np.exp(0.15 * rng.standard_normal(TIMES.size))
        y[0] = np.nan  # C(0) = 0: log y undefined, the pre-dose sample is missing
        ys[f"dose {d:g}"] = y
    return ys, pgpgm.fit_study(pk.system, _pk_study(ys), priors=pk.priors(), noise={"C": "lognormal"},
                               posterior=None, **FAST)


def _lognormal_reference(ys, per_experiment=False):
    """Independent optimum: shared (ka, ke, CL), lognormal sd(s) profiled out (sd^2 = mean squared log
    residual, per experiment or pooled), the NLL by scipy.stats.lognorm."""
    doses = [float(k.split()[1]) for k in ys]

    def logres(q):
        ka, ke, cl = np.exp(q)
        return [np.log(y[1:]) - np.log(conc(TIMES[1:], d, ka, ke, cl)) for d, y in zip(doses, ys.values())]

    def profile(q):
        with np.errstate(all="ignore"):
            rs = logres(q)
        if not all(np.all(np.isfinite(r)) for r in rs):
            return 1e12
        if per_experiment:
            return float(sum(0.5 * r.size * np.log(np.mean(r**2)) for r in rs))
        r = np.concatenate(rs)
        return float(0.5 * r.size * np.log(np.mean(r**2)))

    best = _multistart(profile, 3)
    ka, ke, cl = np.exp(best.x)
    rs = logres(best.x)
    sds = [np.sqrt(np.mean(r**2)) for r in rs] if per_experiment else [np.sqrt(np.mean(np.concatenate(rs) ** 2))] * 3
    nll = -sum(stats.lognorm(s=s, scale=conc(TIMES[1:], d, ka, ke, cl)).logpdf(y[1:]).sum()
               for s, d, y in zip(sds, doses, ys.values()))
    return np.array([ka, ke, cl]), np.array(sds), float(nll)


def test_lognormal_joint_fit_equals_independent_multistart(lognormal3):
    ys, res = lognormal3
    theta, sds, nll = _lognormal_reference(ys)
    for name in ys:
        np.testing.assert_allclose(res.theta("joint").loc[name].to_numpy(), theta, rtol=2e-4)
    np.testing.assert_allclose(res.estimates["noise_sd"].sel(estimate="joint").values.ravel(), sds, rtol=2e-4)
    assert res.nll == pytest.approx(nll, abs=1e-4)
    assert res.estimates.attrs["noise"] == '{"C": "lognormal"}'
    # C(0) = 0 is held: the trajectories start at 0
    assert np.all(res.trajectories["x"].sel(estimate="joint", state="C").isel(point=0).values == 0.0)


@pytest.fixture(scope="module")
def per_experiment3(pk):
    """Gaussian noise whose sd differs by experiment (three labs): 0.05, 0.2, 0.6."""
    rng = np.random.default_rng(5)
    ys = {f"dose {d:g}": conc(TIMES, d, *TRUTH) + sd * rng.standard_normal(TIMES.size)
          for d, sd in zip(DOSES, (0.05, 0.2, 0.6))}
    return ys, pgpgm.fit_study(pk.system, _pk_study(ys), priors=pk.priors(), noise_per_experiment=True,
                               posterior=None, **FAST)


def test_per_experiment_noise_sds_equal_independent_multistart(per_experiment3):
    """Each experiment's own sd, profiled out: min over theta of sum_j N_j/2 log(RSS_j / N_j)."""
    ys, res = per_experiment3
    doses = [float(k.split()[1]) for k in ys]

    def rss(q):
        ka, ke, cl = np.exp(q)
        return np.array([np.sum((conc(TIMES, d, ka, ke, cl) - y) ** 2) for d, y in zip(doses, ys.values())])

    best = _multistart(lambda q: float(np.sum(0.5 * TIMES.size * np.log(rss(q) / TIMES.size))), 3)
    theta, sds = np.exp(best.x), np.sqrt(rss(best.x) / TIMES.size)
    nll = -sum(stats.norm(conc(TIMES, d, *theta), s).logpdf(y).sum() for s, d, y in zip(sds, doses, ys.values()))
    np.testing.assert_allclose(res.theta("joint").to_numpy(), np.tile(theta, (3, 1)), rtol=2e-4)
    np.testing.assert_allclose(res.estimates["noise_sd"].sel(estimate="joint", observed="C").values, sds, rtol=2e-4)
    assert res.nll == pytest.approx(nll, abs=1e-4)
    # the sds differ as the labs do, and a shared sd is a worse fit of these data
    assert sds[0] < sds[1] < sds[2]
    shared = -sum(stats.norm(conc(TIMES, d, *theta), np.sqrt(np.mean(rss(best.x)) / TIMES.size)).logpdf(y).sum()
                  for d, y in zip(doses, ys.values()))
    assert res.nll < shared - 5


@pytest.mark.slow  # an accuracy run; CI checks the joint lognormal fit against an independent multistart
def test_per_experiment_lognormal_equals_independent_multistart(pk, lognormal3):
    ys, _ = lognormal3
    ys = {k: np.where(np.isnan(y), np.nan, y ** (1.0 + 0.5 * j)) / conc(TIMES, 1.0, *TRUTH) ** (0.5 * j)
          for j, (k, y) in enumerate(ys.items())}  # log residuals scaled 1, 1.5, 2: the sds differ
    res = pgpgm.fit_study(pk.system, _pk_study(ys), priors=pk.priors(), noise="lognormal", noise_per_experiment=["C"],
                          posterior=pgpgm.NUTS(draws=100, tune=100, chains=2, rounds=1, budget=90, cores=1),
                          **FAST)
    theta, sds, nll = _lognormal_reference(ys, per_experiment=True)
    np.testing.assert_allclose(res.theta("joint").to_numpy(), np.tile(theta, (3, 1)), rtol=2e-4)
    np.testing.assert_allclose(res.estimates["noise_sd"].sel(estimate="joint", observed="C").values, sds, rtol=2e-4)
    assert res.nll == pytest.approx(nll, abs=1e-4)
    # step 4 ran on the joint model (one lognormal sd per experiment) and moved from the refined point: its
    # means near the maximum-likelihood values (weak priors, 30 measurements)
    post = res.posterior.posterior
    assert {f"sigma_C[{k}]" for k in ys} <= set(post.data_vars) and "sigma_C" not in post
    assert all(float(post[v].std()) > 0 for v in ("ka", "ke", "CL", *(f"sigma_C[{k}]" for k in ys)))
    got = res.estimates["noise_sd"].sel(estimate="posterior", observed="C").values
    assert np.all(np.abs(np.log(got / sds)) < np.log(2.0)), (got, sds)
    assert np.all(np.abs(np.log(res.theta("posterior").to_numpy() / theta)) < 0.5)


# ----------------------------------------------------------------------------- Poisson counts (SIR)
SIR_T = np.arange(0.0, 15.0)
SIR_I0 = (1.0, 3.0, 8.0)
SIR_TRUTH = (1.7, 0.45)


def sir_i(t, beta, gamma, i0):
    """I(t) of the SIR model (N = 763) from (763 - I0, I0, 0), solved tightly by LSODA."""
    def f(_, x):
        s, i, _r = x
        inf = beta * s * i / 763.0
        return [-inf, inf - gamma * i, gamma * i]

    return solve_ivp(f, (0.0, float(t[-1])), [763.0 - i0, i0, 0.0], method="LSODA", t_eval=t,
                     rtol=1e-10, atol=1e-10).y[1]


@pytest.fixture(scope="module")
def poisson3():
    sir = pgpgm.load_model("sir")
    rng = np.random.default_rng(2)
    ys = {f"I0 {i0:g}": rng.poisson(sir_i(SIR_T, *SIR_TRUTH, i0)).astype(float) for i0 in SIR_I0}
    for y in ys.values():
        y[0] = np.nan  # day 0: not counted (I(0) is known)
    study = Study.from_mapping({k: pd.DataFrame({"time": SIR_T, "I": y}) for k, y in ys.items()},
                               x0={k: {"S": 763.0 - float(k.split()[1]), "I": float(k.split()[1]), "R": 0.0}
                                   for k in ys})
    return ys, pgpgm.fit_study(sir.system, study, priors=sir.priors(), noise={"I": "poisson"}, posterior=None,
                               **FAST)


def _poisson_multistart(ys, i0s, n_starts=N_STARTS):
    """Independent Poisson maximum likelihood of (beta, gamma) shared by the experiments ``i0s``: trust-region
    least squares on the Poisson deviance residuals sign(y - mu) sqrt(2 (y log(y/mu) - (y - mu))) (their half
    sum of squares is the NLL minus its value at mu = y) from ``n_starts`` log-uniform starts; returns (theta,
    NLL by scipy.stats.poisson)."""
    def dev(q):
        out = []
        for i0, y in zip(i0s, ys):
            mu = np.maximum(sir_i(SIR_T, *np.exp(q), i0)[1:], 1e-12)
            d = 2.0 * (np.where(y[1:] > 0, y[1:] * np.log(np.maximum(y[1:], 1e-300) / mu), 0.0) - (y[1:] - mu))
            out.append(np.sign(y[1:] - mu) * np.sqrt(np.maximum(d, 0.0)))
        return np.concatenate(out)

    rng = np.random.default_rng(0)
    best = None
    for q0 in np.log([0.5, 0.05]) + rng.random((n_starts, 2)) * np.log([12.0, 40.0]):
        r = optimize.least_squares(dev, q0, xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=500)
        if best is None or r.cost < best.cost:
            best = r
    theta = np.exp(best.x)
    nll = -sum(stats.poisson(sir_i(SIR_T, *theta, i0)[1:]).logpmf(y[1:]).sum() for i0, y in zip(i0s, ys))
    return theta, float(nll)


@pytest.mark.slow  # accuracy against a scipy multi-start, ~45 s
def test_poisson_joint_fit_equals_independent_multistart(poisson3):
    ys, res = poisson3
    theta, nll = _poisson_multistart(list(ys.values()), SIR_I0)
    np.testing.assert_allclose(res.theta("joint").to_numpy(), np.tile(theta, (3, 1)), rtol=2e-4)
    assert res.nll == pytest.approx(nll, abs=1e-4)
    # each experiment alone: its own Poisson optimum (the separate estimates; 8 starts reach the optimum of 24
    # on each of these two-parameter problems, theta within 4e-7 relative: measured)
    for i0, (name, y) in zip(SIR_I0, ys.items()):
        own, own_nll = _poisson_multistart([y], [i0], n_starts=8)
        np.testing.assert_allclose(res.theta("separate").loc[name].to_numpy(), own, rtol=2e-4)
        assert res.estimates["nll"].sel(estimate="separate", experiment=name).item() == pytest.approx(own_nll, abs=1e-4)


# ----------------------------------------------------------------------------- the step-4 model's density
def _to_value(model, rv, x):
    tr = model.rvs_to_transforms.get(rv)
    if tr is None:
        return np.asarray(x)
    return np.asarray(tr.forward(np.asarray(x, float), *rv.owner.inputs).eval())


def _logp(model, point):
    f = model.compile_logp(jacobian=False)
    return f(model.initial_point() | {model.rvs_to_values[rv].name: _to_value(model, rv, point[rv.name])
                                      for rv in model.free_RVs})


def test_study_model_lognormal_per_experiment_density_equals_scipy(pk):
    from pgpgm.data import as_observations
    from pgpgm.priors import Priors
    from pgpgm.study import build_study_model

    rng = np.random.default_rng(3)
    names = [f"dose {d:g}" for d in DOSES]
    ys = [np.r_[np.nan, conc(TIMES[1:], d, *TRUTH) * np.exp(0.2 * rng.standard_normal(TIMES.size - 1))] for d in DOSES]
    obs = [as_observations(pd.DataFrame({"time": TIMES, "C": y}), None, pk.system) for y in ys]
    x0s = [np.array([d, 0.0]) for d in DOSES]
    prior = Priors.from_user(pk.system.parameters, pk.priors())
    model = build_study_model(pk.system, obs, names, x0s, [(), (), ()], [{}, {}, {}], priors=prior,
                              noise={"C": "lognormal"}, noise_per_experiment=("C",),
                              noise_center={f"C[{n}]": 0.2 for n in names})
    sig = (0.15, 0.25, 0.3)
    point = {"ka": 1.4, "ke": 0.09, "CL": 0.045, **{f"sigma_C[{n}]": s for n, s in zip(names, sig)}}
    expect = sum(stats.uniform(pk.priors()[p][0], np.diff(pk.priors()[p])[0]).logpdf(point[p]) for p in ("ka", "ke", "CL"))
    for d, y, s in zip(DOSES, ys, sig):
        expect += stats.lognorm(s=2.0, scale=0.2).logpdf(s)
        expect += stats.lognorm(s=s, scale=conc(TIMES[1:], d, 1.4, 0.09, 0.045)).logpdf(y[1:]).sum()
    assert _logp(model, point) == pytest.approx(expect, rel=1e-6)


@pytest.mark.parametrize("kind", ["poisson", "negbin"])
def test_study_model_count_density_equals_scipy(kind):
    from pgpgm.data import as_observations
    from pgpgm.priors import Priors
    from pgpgm.study import build_study_model

    sir = pgpgm.load_model("sir")
    rng = np.random.default_rng(4)
    names = [f"I0 {i:g}" for i in SIR_I0]
    ys = [np.r_[np.nan, rng.poisson(sir_i(SIR_T, *SIR_TRUTH, i0)[1:]).astype(float)] for i0 in SIR_I0]
    obs = [as_observations(pd.DataFrame({"time": SIR_T, "I": y}), None, sir.system) for y in ys]
    x0s = [np.array([763.0 - i0, i0, 0.0]) for i0 in SIR_I0]
    prior = Priors.from_user(sir.system.parameters, sir.priors())
    model = build_study_model(sir.system, obs, names, x0s, [(), (), ()], [{}, {}, {}], priors=prior,
                              noise={"I": kind}, noise_center={"I": 20.0}, solver=replace(default_solver(), rtol=1e-10, atol=1e-9))
    point = {"beta": 1.6, "gamma": 0.5, "alpha_I": 12.0}
    expect = sum(stats.uniform(*sir.priors()[p]).logpdf(point[p]) for p in ("beta", "gamma"))
    if kind == "negbin":
        expect += stats.lognorm(s=2.0, scale=20.0).logpdf(12.0)
    for i0, y in zip(SIR_I0, ys):
        mu = sir_i(SIR_T, 1.6, 0.5, i0)[1:]
        dist = stats.poisson(mu) if kind == "poisson" else stats.nbinom(n=12.0, p=12.0 / (12.0 + mu))
        expect += dist.logpmf(y[1:]).sum()
    assert _logp(model, point) == pytest.approx(expect, rel=1e-6)


# ----------------------------------------------------------------------------- bad inputs
def test_bad_noise_inputs(pk):
    study = _pk_study({f"dose {d:g}": conc(TIMES, d, *TRUTH) + 0.1 for d in DOSES[:2]})
    with pytest.raises(DataError, match=r"noise_per_experiment names \['A'\]"):
        pgpgm.fit_study(pk.system, study, noise_per_experiment=["A"])
    with pytest.raises(DataError, match=r"noise names \['A'\], which are not observed"):
        pgpgm.fit_study(pk.system, study, noise={"A": "lognormal"})
    with pytest.raises(DataError, match="noise must be one of .*got 'lognorm'"):
        pgpgm.fit_study(pk.system, study, noise="lognorm")
    with pytest.raises(DataError, match="C is measured .* at the first time 0, where its known initial value is 0"):
        pgpgm.fit_study(pk.system, study, noise="lognormal")  # the pre-dose sample 0.1 where C(0) = 0 is known
    zero = _pk_study({f"dose {d:g}": conc(TIMES, d, *TRUTH) for d in DOSES[:2]})
    with pytest.raises(DataError, match="<= 0 under lognormal noise"):  # C(0) = 0 measured: log y undefined
        pgpgm.fit_study(pk.system, zero, noise="lognormal")
    counts = Study.from_mapping({"a": pd.DataFrame({"time": SIR_T[:5], "I": [1, 2.5, 4, 6, 9]})},
                                x0={"a": {"S": 762.0, "R": 0.0}})
    with pytest.raises(DataError, match="not whole numbers under Poisson"):
        pgpgm.fit_study(pgpgm.load_model("sir").system, counts, noise="poisson")
    with pytest.raises(DataError, match="fit_kwargs must not hold"):
        pgpgm.fit_study(pk.system, study, fit_kwargs={"noise": "poisson"})


# ----------------------------------------------------------------------------- the command line
def test_cli_fit_study_hierarchical_subprocess(tmp_path):
    """``pgpgm fit`` on a CSV with an experiment column runs fit_study: --inputs gives each experiment's dose,
    --hierarchical ka=lognormal a ka per experiment; the written result equals the independent optimum."""
    import subprocess
    import sys
    from pathlib import Path

    rng = np.random.default_rng(9)
    kas = (1.1, 1.6, 2.3)
    rows, doses = [], {"a": 2.0, "b": 4.5, "c": 8.0}
    ys = {}
    for (e, d), ka in zip(doses.items(), kas):
        ys[e] = conc(TIMES, d, ka, *TRUTH[1:]) + 0.2 * rng.standard_normal(TIMES.size)
        rows += [{"experiment": e, "time": t, "state": "C", "value": v} for t, v in zip(TIMES, ys[e])]
    pd.DataFrame(rows).to_csv(tmp_path / "study.csv", index=False)
    pd.DataFrame({"experiment": list(doses), "dose": list(doses.values())}).to_csv(tmp_path / "inputs.csv",
                                                                                   index=False)
    model = Path(pgpgm.__file__).parent.parent / "models" / "pk_oral.toml"
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "pgpgm.cli", "fit", "--model", str(model), "--data",
                           str(tmp_path / "study.csv"), "--inputs", str(tmp_path / "inputs.csv"), "--x0", "A=dose",
                           "C=0", "--hierarchical", "ka=lognormal", "--posterior", "none", "--draws", "200",
                           "--tune", "150", "--no-progress", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert {"experiments.png", "parameters.csv", "summary.md", "result.nc"} <= {p.name for p in out.iterdir()}
    res = pgpgm.load_study(out / "result.nc")

    def r(q):
        *ka, ke, cl = np.exp(q)
        return np.concatenate([conc(TIMES, d, k, ke, cl) - ys[e] for (e, d), k in zip(doses.items(), ka)])

    best = None
    rng = np.random.default_rng(0)
    for q0 in np.log([0.3, 0.3, 0.3, 0.02, 0.01]) + rng.random((N_STARTS, 5)) * np.log(10.0):
        f = optimize.least_squares(r, q0, xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=4000)
        ka, ke = np.exp(f.x[:3]), np.exp(f.x[3])
        if np.all(ka > ke) and (best is None or f.cost < best.cost):  # the branch ka > ke (the prior box's)
            best = f
    q = np.exp(best.x)
    got = res.theta("joint")
    np.testing.assert_allclose(got["ka"].to_numpy(), q[:3], rtol=2e-4)
    np.testing.assert_allclose(got[["ke", "CL"]].to_numpy(), np.tile(q[3:], (3, 1)), rtol=2e-4)
    table = pd.read_csv(out / "parameters.csv", index_col=[0, 1])
    assert table.loc[("joint", "b"), "ka"] == pytest.approx(q[1], rel=2e-4)
    # a study option without an experiment column is a usage error (exit 2)
    single = tmp_path / "single.csv"
    pd.DataFrame(rows).drop(columns="experiment").iloc[:11].to_csv(single, index=False)
    bad = subprocess.run([sys.executable, "-m", "pgpgm.cli", "fit", "--model", str(model), "--data", str(single),
                          "--varying", "CL", "--out", str(tmp_path / "o2")], check=False, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "need a study" in bad.stderr


def test_cli_fit_study_takes_the_sd_error_goal_with_the_study_budget(tmp_path, capture_call):
    """``pgpgm fit --posterior-sd-error 0.04`` on a study CSV reaches :func:`pgpgm.fit_study` as
    ``pgpgm.NUTS(sd_error=0.04)`` with the study's own default budget (not a single fit's)."""
    import inspect
    from pathlib import Path

    from pgpgm.cli import main

    rows = [{"experiment": e, "time": t, "state": "C", "value": v}
            for e, d in (("a", 2.0), ("b", 4.5)) for t, v in zip(TIMES, conc(TIMES, d, *TRUTH))]
    pd.DataFrame(rows).to_csv(tmp_path / "study.csv", index=False)
    pd.DataFrame({"experiment": ["a", "b"], "dose": [2.0, 4.5]}).to_csv(tmp_path / "inputs.csv", index=False)
    real = pgpgm.fit_study
    seen = capture_call(pgpgm, "fit_study")
    model = Path(pgpgm.__file__).parent.parent / "models" / "pk_oral.toml"
    with pytest.raises(capture_call.stop):
        main(["fit", "--model", str(model), "--data", str(tmp_path / "study.csv"), "--inputs",
              str(tmp_path / "inputs.csv"), "--x0", "A=dose", "C=0", "--posterior-sd-error", "0.04", "--no-progress",
              "--out", str(tmp_path / "out")])
    spec = seen["posterior"]
    from pgpgm.steps.options import STUDY_BUDGET

    assert isinstance(spec, pgpgm.NUTS) and spec.sd_error == 0.04 and spec.budget == STUDY_BUDGET
    assert STUDY_BUDGET != pgpgm.PosteriorBudget()  # (the study's budget is its own: 300 s)
    assert inspect.signature(real).parameters["posterior"].default == "nuts"  # NUTS(budget=STUDY_BUDGET)

"""Valid input to fit: every value the user gave held."""

from __future__ import annotations

import json

import numpy as np

from battery_cases.common import *  # noqa: F403  (the registry, the checks and the data every case uses)


# ================================================================================================ valid cases
@case("valid")
def v_readme_quickstart(tmp):
    """README quick start (x1 measured, x2 latent with its value from the Dataset), steps 1-3."""
    p = pg()
    spec = lv_spec()
    c = spec.case("x1-observed")
    data = p.simulate(spec.system, c.theta, c.x0, c.times, observed=["x1"], noise_sd=0.1, seed=0)
    r = p.fit(spec.system, data, ["x1"], kernel="rbf", gamma=0.3, priors=(0, 10), posterior=None, **FAST)
    r.parameter_table()
    chk = Checks()
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    chk.true(np.all((r.theta >= 0) & (r.theta <= 10)), "refined theta inside the prior box (0, 10)", "prior",
             r.theta)
    return chk


@case("valid")
def v_lv_laplace(tmp):
    """Lotka-Volterra x1 measured, step 4 by the Laplace approximation; draws count honoured."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior=p.Laplace(draws=500), **FAST)
    chk = Checks()
    chk.close(r.posterior.posterior.sizes["draw"] * r.posterior.posterior.sizes["chain"], 500,
              "Laplace(draws=500) draws", key="draws")
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_lv_nuts_small_budget(tmp):
    """NUTS with 2 chains and a 20 s budget: chains honoured, step 4 within its budget."""
    p = pg()
    nuts = p.NUTS(draws=100, tune=100, chains=2, budget=20)
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior=nuts, **FAST)
    chk = Checks()
    chk.close(r.posterior.posterior.sizes["chain"], 2, "NUTS(chains=2) chains", key="chains")
    chk.true(r.timings["posterior"] <= 1.5 * 20 + 5, "step 4 within 1.5 x its 20 s budget", "budget",
             r.timings["posterior"])
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_x0_every_state_from_paper(tmp):
    """x0 copied from the paper for every state, the measured x1 too: both held."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], x0={"x1": 5.0, "x2": 3.0}, priors=(0, 10), posterior="laplace",
              **FAST)
    chk = Checks()
    check_held(chk, r, {"x1": 5.0, "x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_x0_vector_every_state(tmp):
    """x0 as a vector in state order, every state known."""
    p = pg()
    r = p.fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0=[5.0, 3.0], priors=(0, 10), posterior="laplace",
              **FAST)
    chk = Checks()
    check_held(chk, r, {"x1": 5.0, "x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_x0_vector_nan_observed(tmp):
    """x0 vector with NaN for the measured state: x1 estimated, x2 held."""
    p = pg()
    r = p.fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0=[np.nan, 3.0], priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    chk.true(np.isfinite(r.x0["x1"]) and abs(r.x0["x1"] - 5.0) < 0.5, "x1(0) estimated near its data", "x1",
             r.x0["x1"])
    return chk


@case("valid")
def v_x0_measured_and_latent_fhn(tmp):
    """FitzHugh-Nagumo, R measured (30 points), x0 from the paper for both V and R."""
    p = pg()
    spec = p.load_model("fitzhugh-nagumo")
    c = spec.case("R-observed")
    data = p.simulate(spec.system, c.theta, c.x0, np.linspace(0, 10, 30), observed=["R"], snr=100, seed=0)
    r = p.fit(spec.system, data, ["R"], x0={"V": -1.0, "R": 1.0}, kernel="matern52", priors=spec.priors(),
              posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"V": -1.0, "R": 1.0}, t0=0.0)
    return chk


@case("valid")
def v_pk_dose_t0_docs(tmp):
    """The docs' oral dose: A = 4.5 and C = 0 at t0 = 0, first sample at 0.25 h (steps 1-3)."""
    p = pg()
    pk, data, _ = pk_after_dose()
    r = p.fit(pk.system, data, ["C"], x0={"A": 4.5, "C": 0.0}, t0=0.0, priors=pk.priors(), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_pk_dose_t0_laplace(tmp):
    """Oral dose at t0 = 0, first sample 0.25 h, Laplace step 4: x0 held in every draw."""
    p = pg()
    pk, data, _ = pk_after_dose(seed=1)
    r = p.fit(pk.system, data, ["C"], x0={"A": 4.5, "C": 0.0}, t0=0.0, priors=pk.priors(), posterior="laplace",
              **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_pk_dose_t0_nuts(tmp):
    """Oral dose at t0 = 0, first sample 0.25 h, small NUTS: x0 held in every draw, budget honoured."""
    p = pg()
    pk, data, _ = pk_after_dose(seed=2)
    r = p.fit(pk.system, data, ["C"], x0={"A": 4.5, "C": 0.0}, t0=0.0, priors=pk.priors(),
              posterior=p.NUTS(draws=100, tune=100, chains=2, budget=25), **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    chk.true(r.timings["posterior"] <= 1.5 * 25 + 5, "step 4 within 1.5 x its 25 s budget", "budget",
             r.timings["posterior"])
    return chk


@case("valid")
def v_pk_x0_without_t0_warns(tmp):
    """x0 given, first sample at 0.25 h, no t0: the docs promise a StartTimeWarning."""
    p = pg()
    pk, data, _ = pk_after_dose()
    r = p.fit(pk.system, data, ["C"], x0={"A": 4.5, "C": 0.0}, priors=pk.priors(), posterior=None, **FAST)
    chk = Checks()
    chk.close(r.x0["A"], 4.5, "result.x0['A']", key="A")
    return dict(issues=chk.issues, info="check of StartTimeWarning done by the harness", expect_warning="StartTimeWarning")


@case("valid")
def v_pk_lognormal_theoph_subject1(tmp):
    """The options page's theophylline subject 1: lognormal noise, t0 = 0, x0 A = dose and C = 0, Laplace."""
    p = pg()
    pk = p.load_model("pk-oral")
    theoph = p.datasets.theophylline()
    s = theoph[(theoph["experiment"] == "1") & (theoph["time"] > 0)]
    r = p.fit(pk.system, {"time": s["time"], "C": s["value"]}, ["C"], x0={"A": 4.02, "C": 0.0}, t0=0.0,
              noise={"C": "lognormal"}, priors=pk.priors(), posterior="laplace", **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 4.02, "C": 0.0}, t0=0.0)
    chk.true(r.trajectories["noise_sd"].attrs.get("scale", "log") is not None, "noise_sd scale recorded", "noise")
    return chk


@case("valid")
def v_sir_negbin_influenza(tmp):
    """The influenza counts, negative-binomial noise, x0 S, I, R at t0 = 0 (I measured from day 1), Laplace."""
    p = pg()
    sir = p.load_model("sir")
    flu = p.datasets.influenza_boarding_school()
    r = p.fit(sir.system, {"time": flu["time"], "I": flu["in_bed"]}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
              t0=0.0, noise={"I": "negbin"}, priors=sir.priors(), posterior="laplace", **FAST)
    chk = Checks()
    check_held(chk, r, {"S": 762.0, "I": 1.0, "R": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_sir_poisson_influenza(tmp):
    """The influenza counts, Poisson noise, as in the notebook (day 0 a NaN row), steps 1-3."""
    p = pg()
    sir = p.load_model("sir")
    flu = p.datasets.influenza_boarding_school()
    t = np.r_[0.0, flu.time.to_numpy()]
    y = np.r_[np.nan, flu.in_bed.to_numpy().astype(float)]
    r = p.fit(sir.system, {"time": t, "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0}, noise={"I": "poisson"},
              priors=sir.priors(), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"S": 762.0, "I": 1.0, "R": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_async_times_dataset(tmp):
    """Both states measured on their own times (simulate with a mapping of times)."""
    p = pg()
    t1, t2 = np.linspace(0.0, 2.0, 15), np.linspace(0.1, 1.9, 8)
    data = lv_data(observed=("x1", "x2"), times={"x1": t1, "x2": t2})
    r = p.fit(lv_spec().system, data, ["x1", "x2"], priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.true(np.all(np.isfinite(r.theta)), "finite estimates", "theta", r.theta)
    return chk


@case("valid")
def v_async_times_tidy_x0_t0(tmp):
    """Tidy table, x1 and x2 on different times, x2 first measured at 0.3; x0 of both at t0 = 0 held."""
    p = pg()
    t1, t2 = np.linspace(0.2, 2.0, 14), np.linspace(0.3, 1.9, 9)
    data = lv_data(observed=("x1", "x2"), times={"x1": t1, "x2": t2})
    r = p.fit(lv_spec().system, to_tidy(data), ["x1", "x2"], x0={"x1": 5.0, "x2": 3.0}, t0=0.0, priors=(0, 10),
              posterior="laplace", **FAST)
    chk = Checks()
    check_held(chk, r, {"x1": 5.0, "x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_wide_dict_with_gaps(tmp):
    """A wide dict with NaN where a state was not measured."""
    p = pg()
    data = lv_data(observed=("x1", "x2"), missing=0.3)
    r = p.fit(lv_spec().system, to_wide(data), ["x1", "x2"], priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.true(np.all(np.isfinite(r.theta)), "finite estimates", "theta", r.theta)
    return chk


@case("valid")
def v_wide_dataframe_observed_default(tmp):
    """A wide pandas DataFrame of both states, observed left to its default (every state in the data)."""
    import pandas as pd

    p = pg()
    df = pd.DataFrame(to_wide(lv_data(observed=("x1", "x2"))))
    r = p.fit(lv_spec().system, df, priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.true(list(r.trajectories["y"]["observed"].values) == ["x1", "x2"], "both states observed", "observed",
             list(r.trajectories["y"]["observed"].values))
    return chk


@case("valid")
def v_latent_unknown_x0_box(tmp):
    """x2 latent with an unknown initial value: a Uniform prior box; its estimate inside the box."""
    p = pg()
    data = to_tidy(lv_data())
    r = p.fit(lv_spec().system, data, ["x1"], x0={"x2": (0.5, 10.0)}, priors=(0, 10), posterior="laplace", **FAST)
    chk = Checks()
    chk.true(0.5 <= r.x0["x2"] <= 10.0, "x2(0) inside its prior box (0.5, 10)", "x2", r.x0["x2"])
    chk.true(bool(r.estimates["x0_unknown"].sel(state="x2")), "x2(0) marked unknown", "x2")
    post = r.posterior.posterior
    if "x2_0" in post:
        v = post["x2_0"].values
        chk.true(np.all((v >= 0.5) & (v <= 10.0)), "posterior draws of x2_0 inside (0.5, 10)", "x2", v)
    return chk


@case("valid")
def v_latent_unknown_x0_callable(tmp):
    """x2 latent with a PyMC prior callable for its initial value."""
    import pymc as pm

    p = pg()
    r = p.fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0={"x2": lambda name: pm.Normal(name, 3.0, 1.0)},
              priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.true(np.isfinite(r.x0["x2"]), "x2(0) estimated", "x2", r.x0["x2"])
    return chk


@case("valid")
def v_wide_prior_box_lv(tmp):
    """A wide prior box (0, 1000) for every parameter."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 1000), posterior=None, **FAST)
    chk = Checks()
    chk.true(np.all((r.theta >= 0) & (r.theta <= 1000)), "refined theta inside (0, 1000)", "prior", r.theta)
    return chk


@case("valid")
def v_wide_prior_box_pk(tmp):
    """pk-oral dose case with a wide box (0, 100): both flip-flop branches allowed."""
    p = pg()
    pk, data, _ = pk_after_dose()
    r = p.fit(pk.system, data, ["C"], x0={"A": 4.5, "C": 0.0}, t0=0.0, priors=(0, 100), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    chk.true(np.all((r.theta >= 0) & (r.theta <= 100)), "refined theta inside (0, 100)", "prior", r.theta)
    return chk


@case("valid")
def v_prior_box_binding_laplace(tmp):
    """A prior box that binds (theta1 in (0, 2.05)): estimate and every Laplace draw inside it."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors={"theta1": (0.0, 2.05)}, posterior="laplace", **FAST)
    chk = Checks()
    i = list(r.system.parameters).index("theta1")
    chk.true(0.0 <= r.theta[i] <= 2.05, "refined theta1 inside (0, 2.05)", "theta1", r.theta[i])
    v = r.posterior.posterior["theta1"].values
    chk.true(np.all((v >= 0.0) & (v <= 2.05)), "Laplace draws of theta1 inside its box (0, 2.05)", "theta1", v)
    return chk


@case("valid")
def v_prior_box_binding_nuts(tmp):
    """A prior box that binds (theta1 in (0, 2.05)), small NUTS: every draw inside the box."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors={"theta1": (0.0, 2.05)},
              posterior=p.NUTS(draws=100, tune=100, chains=2, budget=20), **FAST)
    chk = Checks()
    v = r.posterior.posterior["theta1"].values
    chk.true(np.all((v >= 0.0) & (v <= 2.05)), "NUTS draws of theta1 inside its box (0, 2.05)", "theta1", v)
    return chk


@case("valid")
def v_priors_mixed_box_callable(tmp):
    """priors by name: a box and a HalfNormal callable; the rest default."""
    import pymc as pm

    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors={"theta1": (0, 5), "theta2": lambda name: pm.HalfNormal(name, 2)},
              posterior=None, **FAST)
    chk = Checks()
    chk.true(0 <= r.theta[0] <= 5, "theta1 inside (0, 5)", "theta1", r.theta[0])
    return chk


@case("valid")
def v_fixed_parameter(tmp):
    """fixed={'theta2': 1.0}: held at 1.0, marked fixed, not in the posterior."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], fixed={"theta2": 1.0}, priors=(0, 10), posterior="laplace", **FAST)
    chk = Checks()
    params = list(r.system.parameters)
    if "theta2" in params:
        chk.close(r.theta[params.index("theta2")], 1.0, "result.theta of theta2", key="theta2")
    chk.close(r.fixed.get("theta2", np.nan), 1.0, "result.fixed['theta2']", key="theta2")
    post = r.posterior.posterior
    if "theta2" in post:
        chk.close(post["theta2"].values, 1.0, "posterior draws of the fixed theta2", key="theta2")
    tab = r.parameter_table()
    chk.true("theta2" in str(tab.index.tolist()) or "theta2" in tab.to_string(), "theta2 in parameter_table",
             "theta2")
    return chk


@case("valid")
def v_fixed_every_parameter(tmp):
    """Every parameter fixed: estimates x1(0) and the noise only."""
    p = pg()
    fixed = {"theta1": 2.0, "theta2": 1.0, "theta3": 4.0, "theta4": 1.0}
    r = p.fit(lv_spec().system, lv_data(), ["x1"], fixed=fixed, posterior=None, **FAST)
    chk = Checks()
    for k, v in fixed.items():
        chk.close(r.fixed.get(k, np.nan), v, f"result.fixed['{k}']", key=k)
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_fixed_from_model_fix(tmp):
    """ODESystem.fix then fit: protein transduction-like use, on LV (theta4 substituted)."""
    p = pg()
    system = lv_spec().system.fix({"theta4": 1.0})
    r = p.fit(system, lv_data(), ["x1"], priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.true("theta4" not in r.system.parameters, "theta4 no longer a parameter", "theta4", r.system.parameters)
    return chk


@case("valid")
def v_noise_sd_known(tmp):
    """noise_sd=0.1 given: held in the result."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], noise_sd=0.1, priors=(0, 10), posterior="laplace", **FAST)
    chk = Checks()
    chk.close(r.trajectories["noise_sd"].values, 0.1, "trajectories['noise_sd'] (given 0.1)", key="noise")
    if "sigma_x1" in r.posterior.posterior:
        chk.close(r.posterior.posterior["sigma_x1"].values, 0.1, "posterior sigma_x1 (given 0.1)", key="noise")
    return chk


@case("valid")
def v_seed_recorded_and_reproducible(tmp):
    """seed=123: recorded in the settings, and two fits with it give the same numbers."""
    p = pg()
    data = lv_data()
    r1 = p.fit(lv_spec().system, data, ["x1"], priors=(0, 10), posterior=None, seed=123, **FAST)
    r2 = p.fit(lv_spec().system, data, ["x1"], priors=(0, 10), posterior=None, seed=123, **FAST)
    chk = Checks()
    chk.close(json.loads(r1.gradient_matching.attrs["pgpgm_settings"])["seed"], 123, "recorded seed", key="seed")
    chk.close(r1.theta, r2.theta, "same seed, same refined theta", key="seed", rtol=0, atol=0)
    chk.close(r1.gradient_matching.posterior["theta1"].values, r2.gradient_matching.posterior["theta1"].values,
              "same seed, same step-2 draws", key="seed", rtol=0, atol=0)
    return chk


@case("valid")
def v_seed_none_recorded(tmp):
    """seed=None draws a fresh seed, recorded."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior=None, seed=None, **FAST)
    chk = Checks()
    s = json.loads(r.gradient_matching.attrs["pgpgm_settings"])["seed"]
    chk.true(isinstance(s, int), "a seed recorded", "seed", s)
    return chk


@case("valid")
def v_dense_grid(tmp):
    """A gradient-matching grid denser than the data (41 points on [0, 2])."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], grid=np.linspace(0, 2, 41), priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_kernel_gamma_mappings(tmp):
    """kernel and gamma as mappings per observed state."""
    p = pg()
    data = lv_data(observed=("x1", "x2"))
    r = p.fit(lv_spec().system, data, ["x1", "x2"], kernel={"x1": "matern52", "x2": "rbf"},
              gamma={"x1": 0.3, "x2": 0.1}, priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    gp = {f["state"]: f["kernel"] for f in json.loads(r.gradient_matching.attrs["pgpgm_gp_fits"])}
    chk.true(gp.get("x1") == "matern52" and gp.get("x2") == "rbf", "each state's GP has its kernel", "kernel", gp)
    return chk


@case("valid")
def v_transform_log(tmp):
    """transform={'x1': 'log'}: the state on the log scale for steps 1-2."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], transform={"x1": "log"}, priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_lognormal_lv(tmp):
    """Lognormal data and noise='lognormal', both states measured."""
    p = pg()
    data = lv_data(observed=("x1", "x2"), noise="lognormal")
    r = p.fit(lv_spec().system, data, ["x1", "x2"], noise="lognormal", priors=(0, 10), posterior="laplace", **FAST)
    chk = Checks()
    chk.true(np.all(np.isfinite(r.theta)), "finite estimates", "theta", r.theta)
    return chk


@case("valid")
def v_lynx_hare_lognormal(tmp):
    """The lynx-hare notebook: real data, lognormal noise, unknown initial values, steps 1-3."""
    p = pg()
    table = p.datasets.lynx_hare()
    data = table[["time", "hare", "lynx"]].rename(columns={"hare": "H", "lynx": "L"})
    system = p.ODESystem.from_equations({"H": "alpha*H - beta*H*L", "L": "-gamma*L + delta*H*L"},
                                        ["alpha", "beta", "gamma", "delta"], name="lynx-hare")
    priors = {"alpha": (0.0, 2.0), "beta": (0.0, 0.2), "gamma": (0.0, 2.0), "delta": (0.0, 0.2)}
    r = p.fit(system, data, noise="lognormal", priors=priors, posterior=None, **FAST)
    chk = Checks()
    for i, k in enumerate(system.parameters):
        chk.true(priors[k][0] <= r.theta[i] <= priors[k][1], f"{k} inside its box", k, r.theta[i])
    return chk


@case("valid")
def v_observables_docs(tmp):
    """The observables example of the options page (y_C, y_total, y_blot), Laplace."""
    p = pg()
    system = p.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, parameters=["ka", "ke"])
    t = np.linspace(0.0, 8.0, 25)
    obs = {"y_C": "C", "y_total": "A + C", "y_blot": "s * A"}
    data = p.simulate(system, [1.2, 0.3, 2.5], [10.0, 0.0], t, observables=obs, noise_sd=0.1,
                      noise={"y_blot": "lognormal"}, seed=0)
    r = p.fit(system, data, observables=obs, priors={"s": (0.1, 20)}, noise={"y_blot": "lognormal"},
              posterior="laplace", **FAST)
    chk = Checks()
    chk.true("s" in r.system.parameters, "observation parameter s estimated", "s", r.system.parameters)
    return chk


@case("valid")
def v_observables_x0_known_tidy(tmp):
    """Observables with known initial values (A = 10, C = 0) held; a tidy table of two observables."""
    p = pg()
    system = p.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, parameters=["ka", "ke"])
    t = np.linspace(0.0, 8.0, 25)
    obs = {"y_C": "C", "y_blot": "s * A"}
    data = p.simulate(system, [1.2, 0.3, 2.5], [10.0, 0.0], t, observables=obs, noise_sd=0.1, seed=1)
    r = p.fit(system, to_tidy(data), observables=obs, x0={"A": 10.0, "C": 0.0}, priors={"s": (0.1, 20)},
              posterior="laplace", **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 10.0, "C": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_from_function_system(tmp):
    """ODESystem.from_function with sympy; decay with a known initial value, fit with Laplace."""
    import sympy

    p = pg()
    system = p.ODESystem.from_function(lambda t, y, q: [-q.k * y.u, q.k * y.u - q.m * sympy.sqrt(y.v + 1) + q.m],
                                       states=["u", "v"], parameters=["k", "m"])
    data = p.simulate(system, [0.8, 0.3], [2.0, 0.0], np.linspace(0, 5, 25), observed=["v"], noise_sd=0.02, seed=0)
    r = p.fit(system, data, ["v"], x0={"u": 2.0, "v": 0.0}, priors=(0, 5), posterior="laplace", **FAST)
    chk = Checks()
    check_held(chk, r, {"u": 2.0, "v": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_own_toml_model(tmp):
    """Own TOML model file: load_model(path), spec.simulate(case), fit with the case's priors."""
    p = pg()
    path = write(tmp / "decay.toml", chain_toml("decay-chain", "A -> B -> (gone).", 3.0, 25))
    spec = p.load_model(path)
    data = spec.simulate("B-observed", seed=0)
    r = p.fit(spec.system, data, ["B"], x0={"A": 3.0}, priors=spec.priors("B-observed"), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"A": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_save_load_roundtrip(tmp):
    """save then load_result: the same theta and x0."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior="laplace", **FAST)
    path = r.save(tmp / "lv.nc")
    back = p.load_result(path)
    chk = Checks()
    chk.close(back.theta, r.theta, "loaded theta", key="theta", rtol=0, atol=0)
    chk.close([back.x0[s] for s in ("x1", "x2")], [r.x0[s] for s in ("x1", "x2")], "loaded x0", key="x0", rtol=0,
              atol=0)
    return chk


@case("valid")
def v_results_api(tmp):
    """The result's documented methods: parameter_table, summary, convergence_problems, plots."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior="laplace", **FAST)
    r.parameter_table()
    r.summary()
    r.convergence_problems()
    import matplotlib

    matplotlib.use("Agg")
    r.plot_states()
    r.plot_parameters()
    return Checks()


@case("valid")
def v_integer_data_and_x0(tmp):
    """Integer columns and integer x0 values (a user's CSV of whole numbers)."""
    import pandas as pd

    p = pg()
    system = p.ODESystem.from_equations({"x": "-k*x", "y": "k*x - m*y"}, ["k", "m"])
    d = p.simulate(system, [0.1, 0.05], [50.0, 0.0], np.arange(20.0), observed=["x", "y"], noise_sd=1.0, seed=0)
    y = d["y"].values
    df = pd.DataFrame({"time": np.arange(20), "x": np.round(y[:, 0]).astype(int), "y": np.round(y[:, 1]).astype(int)})
    r = p.fit(system, df, ["x", "y"], x0={"x": 50, "y": 0}, priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"x": 50.0, "y": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_dopri5_solver(tmp):
    """solver=pgpgm.DOPRI5() for every step."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], solver=p.DOPRI5(), priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"x2": 3.0}, t0=0.0)
    return chk


@case("valid")
def v_elementwise_scheme_stop_never(tmp):
    """The paper's elementwise scheme, stop='never', a short budget."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], scheme="elementwise", stop="never", draws=100, tune=100,
              progressbar=False, priors=(0, 10), posterior=None)
    chk = Checks()
    chk.true(r.gradient_matching.posterior.sizes["draw"] == 100, "stop='never' keeps all 100 draws", "draws",
             r.gradient_matching.posterior.sizes["draw"])
    return chk


@case("valid")
def v_init_per_chain(tmp):
    """init= your own start (P values, as run_chains' docstring says; battery fix: was one start per chain)."""
    p = pg()
    p.fit(lv_spec().system, lv_data(), ["x1"], init=[2.0, 1.0, 4.0, 1.0], priors=(0, 10),  # P values (run_chains)
          posterior=None, **FAST)
    return Checks()


@case("valid")
def v_true_theta(tmp):
    """true_theta adds the truth to the tables (data as a tidy table, without attrs)."""
    p = pg()
    r = p.fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0={"x2": 3.0}, true_theta=[2.0, 1.0, 4.0, 1.0],
              priors=(0, 10), posterior=None, **FAST)
    chk = Checks()
    chk.close(r.estimates["truth"].values, [2.0, 1.0, 4.0, 1.0], "estimates['truth']", key="truth")
    return chk


@case("valid")
def v_legacy_posterior_keywords(tmp):
    """Flat keywords of earlier releases: a DeprecationWarning, and the chains honoured."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior_draws=60, posterior_tune=60,
              posterior_chains=2, posterior_budget=15, **FAST)
    chk = Checks()
    chk.close(r.posterior.posterior.sizes["chain"], 2, "posterior_chains=2", key="posterior_chains")
    return dict(issues=chk.issues, expect_warning="DeprecationWarning")


@case("valid")
def v_data_later_than_t0_lv(tmp):
    """LV, first sample at 0.5, every x0 known at t0 = 0 (the pre-sample dynamics matter)."""
    p = pg()
    data = lv_data(times=np.linspace(0.5, 2.5, 20))
    r = p.fit(lv_spec().system, data, ["x1"], x0={"x1": 5.0, "x2": 3.0}, t0=0.0, priors=(0, 10), posterior="laplace",
              **FAST)
    chk = Checks()
    check_held(chk, r, {"x1": 5.0, "x2": 3.0}, t0=0.0)
    # the data were simulated from x(0) = (5, 3); the refined trajectory at 0.5 should be near the truth there
    truth = lv_data(times=np.linspace(0.5, 2.5, 20))["truth"].sel(state="x1").values[0]
    x = r.trajectories["x"].sel(estimate="refined", state="x1")
    chk.close(float(x.interp(time_dense=0.5)), truth, "refined x1(0.5) near the truth (x0 applied at t0=0)",
              key="t0", rtol=0.05)
    return chk


@case("valid")
def v_negative_values_normal_noise(tmp):
    """FitzHugh-Nagumo V measured: negative values with normal noise are fine."""
    p = pg()
    spec = p.load_model("fitzhugh-nagumo")
    c = spec.case("V-observed")
    data = p.simulate(spec.system, c.theta, c.x0, np.linspace(0, 10, 30), observed=["V"], snr=100, seed=0)
    r = p.fit(spec.system, data, ["V"], kernel="matern52", priors=spec.priors(), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, {"R": 1.0}, t0=0.0)
    return chk


@case("valid")
def v_goodwin_notebook_small(tmp):
    """The Goodwin notebook: own grids, gaps, lognormal, log transform, Y(0) unknown in a box (steps 1-3)."""
    p = pg()
    spec = p.load_model("goodwin")
    c = spec.case()
    times = {"X": np.arange(0.0, 20.01, 1.0), "Z": np.arange(0.5, 20.0, 1.0)}
    sim = p.simulate(spec.system, c.theta, c.x0, times, observed=["X", "Z"], noise="lognormal", noise_sd=0.1,
                     missing=0.2, seed=0)
    r = p.fit(spec.system, to_tidy(sim), x0={"Y": (0.1, 10.0)}, grid=sim["time"].values, noise="lognormal",
              transform={"X": "log", "Z": "log"}, priors=spec.priors(), posterior=None, draws=200, tune=200,
              progressbar=False)
    chk = Checks()
    chk.true(0.1 <= r.x0["Y"] <= 10.0, "Y(0) inside (0.1, 10)", "Y", r.x0["Y"])
    return chk


@case("valid")
def v_michaelis_menten_latent_known(tmp):
    """Michaelis-Menten, S and P measured; latent Enz and C known from the paper, x0 of all four given."""
    p = pg()
    spec = p.load_model("michaelis-menten")
    c = spec.case("S-P-observed")
    data = p.simulate(spec.system, c.theta, c.x0, np.linspace(0, 40, 30), observed=["S", "P"], snr=100, seed=0)
    x0 = {"S": 10.0, "Enz": 1.0, "C": 0.0, "P": 0.0}
    r = p.fit(spec.system, data, ["S", "P"], x0=x0, priors=spec.priors(), posterior=None, **FAST)
    chk = Checks()
    check_held(chk, r, x0, t0=0.0)
    return chk

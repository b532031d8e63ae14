"""Bad input to fit: refused early, naming the input."""

from __future__ import annotations


import numpy as np

from battery_cases.common import *  # noqa: F403  (the registry, the checks and the data every case uses)


# ================================================================================================ invalid cases
@case("invalid", names=["x3"])
def i_observed_unknown_state(tmp):
    """observed names a state the model lacks."""
    data = lv_data()
    with bad():
        pg().fit(lv_spec().system, data, ["x3"], posterior=None, **FAST)


@case("invalid", names=["y9"])
def i_tidy_unknown_state(tmp):
    """A tidy table whose state column names an unknown state."""
    df = to_tidy(lv_data())
    df.loc[df.index[:5], "state"] = "y9"
    with bad():
        pg().fit(lv_spec().system, df, posterior=None, **FAST)


@case("invalid", names=["time", "nan"])
def i_nan_time(tmp):
    """A NaN time."""
    d = to_wide(lv_data())
    d["time"] = d["time"].copy()
    d["time"][4] = np.nan
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["inf", "x1"])
def i_inf_value(tmp):
    """An infinite measurement."""
    d = to_wide(lv_data())
    d["x1"] = d["x1"].copy()
    d["x1"][3] = np.inf
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["sort", "increas", "order"])
def i_unsorted_times(tmp):
    """Times not sorted (wide form)."""
    d = to_wide(lv_data())
    d["time"] = d["time"].copy()
    d["time"][[3, 4]] = d["time"][[4, 3]]
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["duplicate"])
def i_duplicate_times_wide(tmp):
    """Duplicate times (wide form)."""
    d = to_wide(lv_data())
    d["time"] = d["time"].copy()
    d["time"][5] = d["time"][4]
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["duplicate"])
def i_duplicate_times_tidy(tmp):
    """The same state measured twice at the same time (tidy form)."""
    import pandas as pd

    df = to_tidy(lv_data())
    df = pd.concat([df, df.iloc[[3]]], ignore_index=True)
    with bad():
        pg().fit(lv_spec().system, df, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["noise_sd", "negative"])
def i_negative_noise_sd(tmp):
    """noise_sd=-0.1."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], noise_sd=-0.1, posterior=None, **FAST)


@case("invalid", names=["noise_sd", "zero", "positive"])
def i_zero_noise_sd(tmp):
    """noise_sd=0."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], noise_sd=0.0, posterior=None, **FAST)


@case("invalid", names=["noise_sd"])
def i_noise_sd_wrong_length(tmp):
    """noise_sd with three values for one observed state."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], noise_sd=[0.1, 0.2, 0.3], posterior=None, **FAST)


@case("invalid", names=["empty", "no data", "no measurement", "rows"])
def i_empty_data(tmp):
    """An empty DataFrame."""
    import pandas as pd

    with bad():
        pg().fit(lv_spec().system, pd.DataFrame(columns=["time", "state", "value"]), ["x1"], posterior=None, **FAST)


@case("invalid", names=["x1"])
def i_too_few_points(tmp):
    """Only two measurements of the observed state."""
    d = {"time": [0.0, 1.0], "x1": [5.0, 4.0]}
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["x3"])
def i_x0_state_typo(tmp):
    """x0 names a state with a typo (x3 for x2)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], x0={"x3": 3.0}, posterior=None, **FAST)


@case("invalid", names=["x0"])
def i_x0_vector_wrong_length(tmp):
    """x0 a vector of the wrong length."""
    with bad():
        pg().fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0=[5.0], posterior=None, **FAST)


@case("invalid", names=["x2"])
def i_latent_without_x0(tmp):
    """A latent state with neither a number nor a prior (tidy data, no Dataset attrs)."""
    with bad():
        pg().fit(lv_spec().system, to_tidy(lv_data()), ["x1"], posterior=None, **FAST)


@case("invalid", names=["x2"])
def i_x0_nan_latent(tmp):
    """x0={'x2': nan} for a latent state."""
    with bad():
        pg().fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0={"x2": np.nan}, posterior=None, **FAST)


@case("invalid", names=["x2"])
def i_x0_box_reversed(tmp):
    """An unknown initial value's box with lower > upper."""
    with bad():
        pg().fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0={"x2": (10.0, 0.5)}, posterior=None, **FAST)


@case("invalid", names=["x0"])
def i_x0_string_value(tmp):
    """x0 value given as a string ('5.0')."""
    with bad():
        pg().fit(lv_spec().system, to_tidy(lv_data()), ["x1"], x0={"x1": "5.0", "x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["t0"])
def i_data_before_t0(tmp):
    """t0 = 0.5 while the data start at 0."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], x0={"x2": 3.0}, t0=0.5, posterior=None, **FAST)


@case("invalid", names=["t0"])
def i_t0_nan(tmp):
    """t0 = NaN."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], x0={"x2": 3.0}, t0=np.nan, posterior=None, **FAST)


@case("invalid", names=["lognormal", "C", "positive", "<= 0"])
def i_lognormal_zero_measurement(tmp):
    """Lognormal noise with the pre-dose 0 measurement left in (theophylline subject 2)."""
    p = pg()
    pk = p.load_model("pk-oral")
    th = p.datasets.theophylline()
    s = th[th["experiment"] == "2"]
    with bad():
        p.fit(pk.system, {"time": s["time"], "C": s["value"]}, ["C"], x0={"A": 4.4, "C": 0.0}, noise={"C": "lognormal"},
              priors=pk.priors(), posterior=None, **FAST)


@case("invalid", names=["lognormal", "x1", "positive", "<= 0"])
def i_lognormal_negative_measurement(tmp):
    """Lognormal noise with a negative measurement."""
    d = to_wide(lv_data())
    d["x1"] = d["x1"].copy()
    d["x1"][6] = -0.3
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, noise="lognormal", posterior=None, **FAST)


@case("invalid", names=["x1", "log"])
def i_log_transform_negative_x0(tmp):
    """transform={'x1': 'log'} with a negative known x1(0)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], x0={"x1": -1.0, "x2": 3.0}, transform={"x1": "log"},
                 posterior=None, **FAST)


@case("invalid", names=["prior", "lower", "upper", "bound"])
def i_prior_box_reversed(tmp):
    """priors=(10, 0)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], priors=(10, 0), posterior=None, **FAST)


@case("invalid", names=["prior", "nan", "finite", "bound"])
def i_prior_box_nan(tmp):
    """priors=(0, nan)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], priors=(0, np.nan), posterior=None, **FAST)


@case("invalid", names=["theta9"])
def i_prior_unknown_parameter(tmp):
    """priors name a parameter the model lacks."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], priors={"theta9": (0, 1)}, posterior=None, **FAST)


@case("invalid", names=["theta1", "prior"])
def i_prior_callable_wrong(tmp):
    """A prior callable that returns a number instead of a PyMC variable."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], priors={"theta1": lambda name: 1.0}, posterior=None, **FAST)


@case("invalid", names=["theta9"])
def i_fixed_unknown_parameter(tmp):
    """fixed names a parameter the model lacks."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], fixed={"theta9": 1.0}, posterior=None, **FAST)


@case("invalid", names=["theta1"])
def i_fixed_nan(tmp):
    """fixed={'theta1': nan}."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], fixed={"theta1": np.nan}, posterior=None, **FAST)


@case("invalid", names=["foo"])
def i_unknown_keyword(tmp):
    """An unknown keyword argument to fit."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], posterior=None, foo=1, **FAST)


@case("invalid", names=["mcmc", "posterior"])
def i_unknown_posterior_string(tmp):
    """posterior='mcmc'."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], posterior="mcmc", **FAST)


@case("invalid", names=["draws"])
def i_nuts_negative_draws(tmp):
    """NUTS(draws=-5)."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.NUTS(draws=-5, budget=10), **FAST)


@case("invalid", names=["stan", "sampler"])
def i_nuts_unknown_sampler(tmp):
    """NUTS(sampler='stan')."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.NUTS(sampler="stan", budget=10), **FAST)


@case("invalid", names=["budget", "seconds"])
def i_nuts_negative_budget(tmp):
    """NUTS(budget=-10)."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.NUTS(budget=-10), **FAST)


@case("invalid", names=["chains"])
def i_nuts_zero_chains(tmp):
    """NUTS(chains=0)."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.NUTS(chains=0, budget=10), **FAST)


@case("invalid", names=["draws"])
def i_laplace_zero_draws(tmp):
    """Laplace(draws=0)."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.Laplace(draws=0), **FAST)


@case("invalid", names=["metric"])
def i_nuts_unknown_metric(tmp):
    """NUTS(metric='dense')."""
    with bad():
        p = pg()
        p.fit(lv_spec().system, lv_data(), ["x1"], posterior=p.NUTS(metric="dense", budget=10), **FAST)


@case("invalid", names=["draws"])
def i_draws_float(tmp):
    """draws=2.5 (step 2)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], draws=2.5, tune=300, posterior=None, progressbar=False)


@case("invalid", names=["chains"])
def i_chains_zero(tmp):
    """chains=0 (step 2)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], chains=0, draws=300, tune=300, posterior=None, progressbar=False)


@case("invalid", names=["seed"])
def i_seed_negative(tmp):
    """seed=-1."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], seed=-1, posterior=None, **FAST)


@case("invalid", names=["gauss", "kernel"])
def i_unknown_kernel(tmp):
    """kernel='gauss'."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], kernel="gauss", posterior=None, **FAST)


@case("invalid", names=["gamma"])
def i_negative_gamma(tmp):
    """gamma=-1."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], gamma=-1.0, posterior=None, **FAST)


@case("invalid", names=["cauchy", "noise"])
def i_unknown_noise_model(tmp):
    """noise={'x1': 'cauchy'}."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], noise={"x1": "cauchy"}, posterior=None, **FAST)


@case("invalid", names=["x2"])
def i_noise_for_latent_state(tmp):
    """noise for a state that is not measured."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], noise={"x2": "lognormal"}, posterior=None, **FAST)


@case("invalid", names=["I", "whole", "integer", "count"])
def i_poisson_non_integer(tmp):
    """Poisson noise on non-integer values."""
    p = pg()
    sir = p.load_model("sir")
    flu = p.datasets.influenza_boarding_school()
    with bad():
        p.fit(sir.system, {"time": flu["time"], "I": flu["in_bed"] + 0.5}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
              t0=0.0, noise={"I": "poisson"}, priors=sir.priors(), posterior=None, **FAST)


@case("invalid", names=["I", "negative", "count"])
def i_negbin_negative_count(tmp):
    """Negative-binomial noise with a negative count."""
    p = pg()
    sir = p.load_model("sir")
    flu = p.datasets.influenza_boarding_school()
    y = flu["in_bed"].to_numpy().copy()
    y[5] = -3
    with bad():
        p.fit(sir.system, {"time": flu["time"], "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0}, t0=0.0,
              noise={"I": "negbin"}, priors=sir.priors(), posterior=None, **FAST)


@case("invalid", names=["value", "text", "number", "numeric"])
def i_text_in_values(tmp):
    """Text in the value column."""
    df = to_tidy(lv_data())
    df["value"] = df["value"].astype(object)
    df.loc[4, "value"] = "n/a"
    with bad():
        pg().fit(lv_spec().system, df, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["time", "date"])
def i_dates_as_times(tmp):
    """Dates (datetime64) in the time column."""
    import pandas as pd

    p = pg()
    flu = p.datasets.influenza_boarding_school()
    sir = p.load_model("sir")
    with bad():
        p.fit(sir.system, {"time": pd.to_datetime(flu["date"]), "I": flu["in_bed"]}, ["I"],
              x0={"S": 762.0, "R": 0.0, "I": 1.0}, priors=sir.priors(), posterior=None, **FAST)


@case("invalid", names=["1e100", "magnitude", "rescale", "units"])
def i_huge_values(tmp):
    """Measurements of 1e200."""
    d = to_wide(lv_data())
    d["x1"] = d["x1"] * 1e200
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["length", "x1", "time"])
def i_mismatched_lengths(tmp):
    """A wide dict whose columns have different lengths."""
    d = to_wide(lv_data())
    d["x1"] = d["x1"][:-1]
    with bad():
        pg().fit(lv_spec().system, d, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["data"])
def i_data_wrong_type(tmp):
    """data=42."""
    with bad():
        pg().fit(lv_spec().system, 42, ["x1"], x0={"x2": 3.0}, posterior=None, **FAST)


@case("invalid", names=["system", "ODESystem"])
def i_system_is_model_name(tmp):
    """The model's name where the ODESystem goes."""
    with bad():
        pg().fit("lotka-volterra", lv_data(), ["x1"], posterior=None, **FAST)


@case("invalid", names=["observed", "x1"])
def i_observed_one_string(tmp):
    """observed='x1x2' (a string, not a list)."""
    with bad():
        pg().fit(lv_spec().system, lv_data(observed=("x1", "x2")), "x1x2", posterior=None, **FAST)


@case("invalid", names=["grid", "span"])
def i_grid_not_spanning(tmp):
    """A grid that does not span the data."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], grid=np.linspace(0, 1, 11), posterior=None, **FAST)


@case("invalid", names=["true_theta"])
def i_true_theta_wrong_length(tmp):
    """true_theta of the wrong length."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], true_theta=[1.0, 2.0], posterior=None, **FAST)


@case("invalid", names=["init", "chain", "start"])
def i_init_wrong_shape(tmp):
    """init with starts of the wrong length."""
    with bad():
        pg().fit(lv_spec().system, lv_data(), ["x1"], init=[[1.0, 2.0], [1.0, 2.0]], posterior=None, **FAST)


@case("invalid", names=["x1", "observable", "state"])
def i_observable_named_like_state(tmp):
    """An observable named like a state."""
    p = pg()
    system = p.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, parameters=["ka", "ke"])
    d = {"time": np.linspace(0, 8, 20), "A": np.linspace(1, 2, 20)}
    with bad():
        p.fit(system, d, observables={"A": "A + C"}, x0={"A": 10.0, "C": 0.0}, posterior=None, **FAST)


@case("invalid", names=["y", "state"])
def i_observable_without_state(tmp):
    """An observable expression that uses no state."""
    p = pg()
    system = p.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, parameters=["ka", "ke"])
    d = {"time": np.linspace(0, 8, 20), "y": np.linspace(1, 2, 20)}
    with bad():
        p.fit(system, d, observables={"y": "2*s"}, x0={"A": 10.0, "C": 0.0}, posterior=None, **FAST)


@case("invalid", names=["theta", "length", "4", "parameter"])
def i_simulate_theta_wrong_length(tmp):
    """simulate with 3 parameter values for a 4-parameter model."""
    with bad():
        pg().simulate(lv_spec().system, [1.0, 2.0, 3.0], [5.0, 3.0], np.linspace(0, 2, 20), noise_sd=0.1)


@case("invalid", names=["x3", "observed"])
def i_simulate_unknown_observed(tmp):
    """simulate with observed naming an unknown state."""
    with bad():
        pg().simulate(lv_spec().system, [2.0, 1.0, 4.0, 1.0], [5.0, 3.0], np.linspace(0, 2, 20), observed=["x3"],
                      noise_sd=0.1)

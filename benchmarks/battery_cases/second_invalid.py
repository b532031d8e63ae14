"""Second battery, invalid input to fit, the models and simulate: each must be refused early by a pgpgm error (or a
ValueError/TypeError from pgpgm) that names the input or says what to do. Written from the docs alone."""

from __future__ import annotations

import numpy as np

from battery_cases.common import (
    bad,
    case,
    lv_data,
    lv_spec,
    pg,
    to_tidy,
    to_wide,
    write,
)
from battery_cases.second_common import QUICK, decay

LV = [2.0, 1.0, 4.0, 1.0]


def fit_bad(data=None, observed=("x1",), system=None, **kw):
    """fit LV (x1 observed, x2 = 3 known unless x0 is given) with a small budget: the call under test."""
    p = pg()
    system = lv_spec().system if system is None else system
    data = lv_data() if data is None else data
    opts = dict(QUICK, priors=(0, 10))
    opts.setdefault("x0", {"x2": 3.0})
    opts.update(kw)
    with bad():
        p.fit(system, data, None if observed is None else list(observed), **opts)


def wide(**cols):
    d = to_wide(lv_data())
    d.update(cols)
    return d


# ------------------------------------------------------------------------------------------------------- data
@case("invalid", names=("value", "measurement"))
def b2_i_tidy_missing_value_column(tmp):
    """A tidy table whose value column is called 'measurement'."""
    t = to_tidy(lv_data()).rename(columns={"value": "measurement"})
    fit_bad(t)


@case("invalid", names=("time", "Time"))
def b2_i_wide_time_capitalised(tmp):
    """A wide dict with 'Time' instead of 'time'."""
    d = to_wide(lv_data())
    d["Time"] = d.pop("time")
    fit_bad(d)


@case("invalid", names=("DataFrame", "ndarray", "array"))
def b2_i_data_numpy_array(tmp):
    """data as a bare (N, 2) numpy array (time, x1)."""
    d = to_wide(lv_data())
    fit_bad(np.column_stack([d["time"], d["x1"]]))


@case("invalid", names=("complex", "x1"))
def b2_i_complex_values(tmp):
    """Complex numbers in a measured column."""
    d = wide()
    d["x1"] = np.asarray(d["x1"]) + 1j
    fit_bad(d)


@case("invalid", names=("state", "nan", "NaN"))
def b2_i_tidy_state_name_missing(tmp):
    """A tidy row with no state name (NaN in the state column)."""
    t = to_tidy(lv_data())
    t.loc[3, "state"] = np.nan
    fit_bad(t)


@case("invalid", names=("1e100", "1e+100", "time", "rescale"))
def b2_i_times_beyond_1e100(tmp):
    """Times of order 1e150 (beyond the documented 1e100)."""
    d = wide(time=np.linspace(0.0, 2.0, 20) * 1e150)
    fit_bad(d)


@case("invalid", names=("time", "1e-100"))
def b2_i_times_vary_below_1e100(tmp):
    """Times that vary by less than 1e-100 (0, 1e-120, 2e-120, ...)."""
    d = wide(time=np.arange(20) * 1e-120)
    fit_bad(d)


@case("invalid", names=("x1", "duplicate", "twice", "observed"))
def b2_i_observed_duplicate_names(tmp):
    """observed=['x1', 'x1']."""
    fit_bad(observed=("x1", "x1"))


@case("invalid", names=("observed",))
def b2_i_observed_empty_list(tmp):
    """observed=[] (no state measured)."""
    fit_bad(observed=())


# --------------------------------------------------------------------------------------------------- x0 and t0
@case("invalid", names=("x2",))
def b2_i_x0_three_tuple(tmp):
    """x0={'x2': (1, 2, 3)}: neither a number nor a (lower, upper) box."""
    fit_bad(x0={"x2": (1.0, 2.0, 3.0)})


@case("invalid", names=("x2",))
def b2_i_x0_vector_nan_latent(tmp):
    """x0=[5.0, nan]: NaN is documented for an observed state only, x2 is latent."""
    fit_bad(x0=[5.0, float("nan")])


@case("invalid", names=("x2",))
def b2_i_x0_box_zero_width(tmp):
    """x0={'x2': (3, 3)}: a box of zero width."""
    fit_bad(x0={"x2": (3.0, 3.0)})


@case("invalid", names=("t0",))
def b2_i_t0_minus_inf(tmp):
    """t0=-inf."""
    fit_bad(x0={"x1": 5.0, "x2": 3.0}, t0=-float("inf"))


# ----------------------------------------------------------------------------------------- fixed and priors
@case("invalid", names=("x1",))
def b2_i_fixed_names_state(tmp):
    """fixed={'x1': 5.0}: a state, not a parameter."""
    fit_bad(fixed={"x1": 5.0})


@case("invalid", names=("theta9",))
def b2_i_system_fix_unknown(tmp):
    """ODESystem.fix({'theta9': 1.0}): the docstring promises a DataError."""
    s = lv_spec().system
    with bad():
        s.fix({"theta9": 1.0})


@case("invalid", names=("prior",))
def b2_i_priors_three_numbers(tmp):
    """priors=(0, 5, 10)."""
    fit_bad(priors=(0.0, 5.0, 10.0))


@case("invalid", names=("prior",))
def b2_i_priors_zero_width(tmp):
    """priors=(5, 5): a box of zero width."""
    fit_bad(priors=(5.0, 5.0))


@case("invalid", names=("x2",))
def b2_i_priors_names_state(tmp):
    """priors={'x2': (0, 5)}: a state, not a parameter."""
    fit_bad(priors={"x2": (0.0, 5.0)})


@case("invalid", names=("theta2",))
def b2_i_priors_callable_vector(tmp):
    """A prior callable returning a vector variable (shape 2)."""
    import pymc as pm

    fit_bad(priors={"theta2": lambda name: pm.HalfNormal(name, 2.0, shape=2)})


@case("invalid", names=("theta3",))
def b2_i_priors_callable_wrong_name(tmp):
    """A prior callable that names its variable 'other' instead of the name given."""
    import pymc as pm

    fit_bad(priors={"theta3": lambda name: pm.HalfNormal("other", 2.0)})


@case("invalid", names=("prior", "inf", "finite"))
def b2_i_priors_infinite_upper(tmp):
    """priors=(0, inf): a Uniform without an upper bound."""
    fit_bad(priors=(0.0, float("inf")))


# ------------------------------------------------------------------------------------------------- options
@case("invalid", names=("x3",))
def b2_i_kernel_mapping_unknown_state(tmp):
    """kernel={'x3': 'rbf'}: no state x3."""
    fit_bad(kernel={"x3": "rbf"})


@case("invalid", names=("sqrt",))
def b2_i_transform_unknown_mode(tmp):
    """transform={'x1': 'sqrt'}."""
    fit_bad(transform={"x1": "sqrt"})


@case("invalid", names=("init",))
def b2_i_init_nan(tmp):
    """init=[2, nan, 4, 1]."""
    fit_bad(init=[2.0, float("nan"), 4.0, 1.0])


@case("invalid", names=("scheme", "gibbs"))
def b2_i_scheme_unknown(tmp):
    """scheme='gibbs'."""
    fit_bad(scheme="gibbs")


@case("invalid", names=("stop", "sometimes"))
def b2_i_stop_unknown(tmp):
    """stop='sometimes'."""
    fit_bad(stop="sometimes")


@case("invalid", names=("posterior", "NUTS"))
def b2_i_posterior_class_not_instance(tmp):
    """posterior=pgpgm.NUTS (the class, not NUTS())."""
    fit_bad(posterior=pg().NUTS)


@case("invalid", names=("sd_error",))
def b2_i_nuts_sd_error_negative(tmp):
    """NUTS(sd_error=-0.1)."""
    with bad():
        pg().NUTS(sd_error=-0.1)


@case("invalid", names=("solver", "rk4"))
def b2_i_nuts_solver_unknown(tmp):
    """NUTS(solver='rk4')."""
    with bad():
        pg().NUTS(solver="rk4")


@case("invalid", names=("seconds",))
def b2_i_budget_negative_seconds(tmp):
    """PosteriorBudget(seconds=-5)."""
    with bad():
        pg().PosteriorBudget(seconds=-5)


@case("invalid", names=("posterior_chains", "chains"))
def b2_i_legacy_keyword_contradicts_nuts(tmp):
    """posterior=NUTS(chains=2) and the flat posterior_chains=4: two different chain counts."""
    fit_bad(posterior=pg().NUTS(chains=2, budget=10), posterior_chains=4)


@case("invalid", names=("x1",))
def b2_i_x0_and_x0_observed_contradict(tmp):
    """x0={'x1': 5.0} and x0_observed={'x1': 4.0}: two values for x1(0)."""
    fit_bad(x0={"x1": 5.0, "x2": 3.0}, x0_observed={"x1": 4.0})


@case("invalid", names=("grid",))
def b2_i_grid_unsorted(tmp):
    """grid unsorted (linspace reversed)."""
    fit_bad(grid=np.linspace(2.0, 0.0, 41))


@case("invalid", names=("solver",))
def b2_i_solver_string(tmp):
    """solver='cvode' (a string, not a solver object)."""
    fit_bad(solver="cvode")


# ---------------------------------------------------------------------------------------------- observables
def _oral():
    p = pg()
    system = p.ODESystem.from_equations({"A": "-ka*A", "C": "ka*A - ke*C"}, parameters=["ka", "ke"])
    return p, system, np.linspace(0.0, 8.0, 25)


def _obs_bad(obs, data_obs=None, theta=(1.2, 0.3, 2.5), rename=None, **kw):
    p, system, t = _oral()
    data = p.simulate(system, list(theta), [10.0, 0.0], t, observables=data_obs or {"y_C": "C", "y_blot": "s * A"},
                      noise_sd=0.1, seed=0)
    if rename:
        data = {rename.get(k, k): v for k, v in to_wide(data).items()}
    opts = dict(QUICK, priors={"ka": (0, 5), "ke": (0, 5), "s": (0.1, 20)}, x0={"A": 10.0, "C": 0.0})
    opts.update(kw)
    with bad():
        p.fit(system, data, observables=obs, **opts)


@case("invalid", names=("y_total",))
def b2_i_observables_missing_column(tmp):
    """observables name y_total, which the data lack."""
    _obs_bad({"y_C": "C", "y_blot": "s * A", "y_total": "A + C"})


@case("invalid", names=("y_blot",))
def b2_i_observables_bad_expression(tmp):
    """An observable expression that does not parse ('s * * A')."""
    _obs_bad({"y_C": "C", "y_blot": "s * * A"})


@case("invalid", names=("ka",))
def b2_i_observable_named_like_parameter(tmp):
    """An observable named 'ka' (a parameter's name)."""
    _obs_bad({"y_C": "C", "ka": "s * A"}, rename={"y_blot": "ka"})


@case("invalid", names=("posterior", "None"))
def b2_i_observables_unmatched_posterior_none(tmp):
    """Only y_total = A + C (no matching: no chains) with posterior=None, documented as refused."""
    _obs_bad({"y_total": "A + C"}, data_obs={"y_total": "A + C"}, theta=(1.2, 0.3), priors=(0, 5))


@case("invalid", names=("transform",))
def b2_i_observables_with_transform(tmp):
    """observables with transform={'C': 'log'}: documented as refused together."""
    _obs_bad({"y_C": "C", "y_blot": "s * A"}, transform={"C": "log"})


@case("invalid", names=("ka", "box", "lower"))
def b2_i_observables_unmatched_callable_prior(tmp):
    """No matched observable (box starts) while ka's prior is a callable: every start needs a (lower, upper) box."""
    import pymc as pm

    _obs_bad({"y_total": "A + C"}, data_obs={"y_total": "A + C"}, theta=(1.2, 0.3), posterior="laplace",
             priors={"ka": lambda name: pm.HalfNormal(name, 2.0), "ke": (0, 5)})


# ------------------------------------------------------------------------------------------------------ models
def _eq_bad(equations, parameters):
    with bad():
        pg().ODESystem.from_equations(equations, parameters=parameters)


@case("invalid", names=("'k'", '"k"', " k ", "duplicate", "twice"))
def b2_i_duplicate_parameter_names(tmp):
    """parameters=['k', 'k']."""
    _eq_bad({"x": "-k*x"}, ["k", "k"])


@case("invalid", names=("'x'", '"x"', " x "))
def b2_i_parameter_named_like_state(tmp):
    """A parameter with a state's name."""
    _eq_bad({"x": "-k*x", "y": "k*x"}, ["k", "x"])


@case("invalid", names=("equation", "state"))
def b2_i_no_equations(tmp):
    """from_equations({}) - no state at all."""
    _eq_bad({}, ["k"])


@case("invalid", names=("time", "'t'", '"t"', "state t", "named t"))
def b2_i_state_named_t(tmp):
    """A state named t (the time)."""
    _eq_bad({"t": "-k*t"}, ["k"])


@case("invalid", names=("depth", "nest", "50"))
def b2_i_nesting_too_deep(tmp):
    """An expression nested 60 levels deep (limit 50): x + (x + (x + ...)).

    Battery fix: the first run's 60 redundant parentheses around '-k*x' nest nothing (accepted, rightly)."""
    _eq_bad({"x": "-k*" + "(x+" * 60 + "x" + ")" * 60}, ["k"])


@case("invalid", names=("10000", "10,000", "long", "characters"))
def b2_i_equation_too_long(tmp):
    """An equation of more than 10,000 characters."""
    _eq_bad({"x": "-k*x" + " + 0*x" * 2000}, ["k"])


@case("invalid", names=("1e400", "finite", "64"))
def b2_i_constant_overflows(tmp):
    """A constant 1e400 (not a finite 64-bit number)."""
    _eq_bad({"x": "-1e400*k*x"}, ["k"])


@case("invalid", names=("expressions", "one per state", "2 states"))
def b2_i_from_function_wrong_count(tmp):
    """from_function returning one expression for two states."""
    with bad():
        pg().ODESystem.from_function(lambda t, y, p: [p.a * y.u], states=["u", "v"], parameters=["a"])


@case("invalid", names=("Float", "precision", "64"))
def b2_i_from_function_float_precision(tmp):
    """A sympy Float of 50 digits' precision in the right-hand side."""
    import sympy

    with bad():
        pg().ODESystem.from_function(lambda t, y, p: [-sympy.Float("0.1", 50) * p.a * y.u], states=["u"],
                                     parameters=["a"])


@case("invalid", names=("equations",))
def b2_i_from_dict_missing_equations(tmp):
    """ODESystem.from_dict without 'equations'."""
    d = lv_spec().system.to_dict()
    d.pop("equations")
    with bad():
        pg().ODESystem.from_dict(d)


TOML_HEAD = """name = "mine"
parameters = ["k1", "k2"]

[equations]
A = "-k1*A"
B = "k1*A - k2*B"

[experiment]
theta = {theta}
x0 = [5.0, 0.0]
times = {{ start = 0.0, stop = 8.0, num = 20 }}
noise_sd = 0.05
priors = {{ lower = 0.0, upper = 5.0 }}

[cases.one]
observed = {observed}
"""


@case("invalid", names=("'Q'", '"Q"', "state Q", "Q "))
def b2_i_toml_case_observes_unknown(tmp):
    """A model file whose case observes a state Q it lacks."""
    path = write(tmp / "m.toml", TOML_HEAD.format(theta="[1.0, 0.4]", observed='["Q"]'))
    with bad():
        pg().load_model(path)


@case("invalid", names=("nosuch",))
def b2_i_load_model_missing_path(tmp):
    """load_model('nosuch/model.toml'): a path that does not exist."""
    with bad():
        pg().load_model(str(tmp / "nosuch" / "model.toml"))


@case("invalid", names=("lengthscale", "bounds", "'l'"))
def b2_i_kernel_bare_hyperparameter(tmp):
    """Kernel.from_expression with a bare name 'l' after the first (the docstring: refused, say what it is)."""
    from pgpgm.gp import Kernel

    with bad():
        Kernel.from_expression("se", "var*exp(-(a-b)**2/(2*l**2))", ["var", "l"])


# ---------------------------------------------------------------------------------------------------- simulate
@case("invalid", names=("times", "increasing", "sort"))
def b2_i_simulate_unsorted_times(tmp):
    """simulate with times [0, 2, 1]."""
    with bad():
        pg().simulate(decay(), [0.5], [2.0], [0.0, 2.0, 1.0], noise_sd=0.1)  # battery fix: noise_sd was missing


@case("invalid", names=("alpha",))
def b2_i_simulate_negbin_without_alpha(tmp):
    """simulate(noise='negbin') without alpha."""
    with bad():
        pg().simulate(decay(), [0.5], [20.0], np.linspace(0, 4, 10), noise="negbin")


@case("invalid", names=("snr", "noise_sd"))
def b2_i_simulate_snr_and_noise_sd(tmp):
    """simulate with both snr=10 and noise_sd=0.1."""
    with bad():
        pg().simulate(decay(), [0.5], [2.0], np.linspace(0, 4, 10), noise_sd=0.1, snr=10.0)

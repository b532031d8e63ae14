"""Model definition: safe parsing, symbolic Jacobians, compiled kernels, model files."""

import numpy as np
import pytest
import sympy as sp

import pgpgm
from pgpgm import ModelDefinitionError, ODESystem

LV_EQ = {"x1": "theta1*x1 - theta2*x1*x2", "x2": "-theta3*x2 + theta4*x1*x2"}
LV_P = ["theta1", "theta2", "theta3", "theta4"]


@pytest.mark.parametrize(
    "bad",
    [
        "__import__('os').system('echo hi')",
        "x1.__class__",
        "(lambda: 1)()",
        "x1 + unknown",
        "open('f')",
        "x1 if x1 else x2",
        "x1 = 3",
        "x1 ^ 2",
        "[x1, x2]",
        "exp(x1, x2)",
        "'text'",
        "",
        "x1 < 2",
        "x1[0]",
    ],
)
def test_parser_rejects(bad):
    with pytest.raises(ModelDefinitionError):
        ODESystem.from_equations({"x1": bad, "x2": "x1"}, [])


def test_parser_error_names_the_problem():
    with pytest.raises(ModelDefinitionError, match="unknown name 'k'"):
        ODESystem.from_equations({"x": "-k*x"}, ["a"])
    with pytest.raises(ModelDefinitionError, match="call of '__import__'"):
        ODESystem.from_equations({"x": "__import__('os')"}, [])


def test_bad_names():
    with pytest.raises(ModelDefinitionError, match="more than once"):
        ODESystem.from_equations({"x": "-x"}, ["x"])
    with pytest.raises(ModelDefinitionError, match="reserved"):
        ODESystem.from_equations({"t": "1"}, [])
    with pytest.raises(ModelDefinitionError, match="unknown state"):
        ODESystem.from_equations(LV_EQ, LV_P).index_of_states(["x3"])


def test_string_and_function_definitions_agree():
    a = ODESystem.from_equations(LV_EQ, LV_P)
    b = ODESystem.from_function(
        lambda t, y, p: {"x1": p.theta1 * y.x1 - p.theta2 * y.x1 * y.x2, "x2": -p[2] * y[1] + p[3] * y[0] * y[1]},
        ["x1", "x2"], LV_P,
    )
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, th = rng.uniform(0.1, 3, 2), rng.uniform(0.1, 3, 4)
        np.testing.assert_allclose(a.rhs(0.0, x, th), b.rhs(0.0, x, th), rtol=1e-14)
        np.testing.assert_allclose(a.rhs(0.0, x, th), [th[0] * x[0] - th[1] * x[0] * x[1], -th[2] * x[1] + th[3] * x[0] * x[1]])


def test_function_definition_errors():
    with pytest.raises(ModelDefinitionError, match="2 states"):
        ODESystem.from_function(lambda t, y, p: [y.x1], ["x1", "x2"], [])
    with pytest.raises(ModelDefinitionError, match="undeclared"):
        ODESystem.from_function(lambda t, y, p: [sp.Symbol("zz")], ["x1"], [])


@pytest.mark.parametrize("name", ["lotka-volterra", "fitzhugh-nagumo", "protein-transduction"])
def test_symbolic_jacobians_match_finite_differences(all_models, name):
    system = all_models[name].system
    case = all_models[name].case()
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = np.abs(case.x0) + rng.uniform(0.1, 1.0, system.n_states)
        th = case.theta * rng.uniform(0.8, 1.2, system.n_parameters)
        jx, jp = system.jacobian(0.3, x, th)
        for j in range(system.n_states):
            h = 1e-6 * max(1, abs(x[j]))
            e = np.zeros_like(x); e[j] = h
            fd = (system.rhs(0.3, x + e, th) - system.rhs(0.3, x - e, th)) / (2 * h)
            np.testing.assert_allclose(jx[:, j], fd, rtol=1e-6, atol=1e-8)
        for k in range(system.n_parameters):
            h = 1e-6 * max(1, abs(th[k]))
            e = np.zeros_like(th); e[k] = h
            fd = (system.rhs(0.3, x, th + e) - system.rhs(0.3, x, th - e)) / (2 * h)
            np.testing.assert_allclose(jp[:, k], fd, rtol=1e-6, atol=1e-8)


def test_pytensor_rhs_matches_numeric(all_models):
    import pytensor
    import pytensor.tensor as pt

    for spec in all_models.values():
        system, case = spec.system, spec.case()
        N = 7
        rng = np.random.default_rng(2)
        X = rng.uniform(0.1, 2.0, (N, system.n_states))
        tt = np.linspace(0, 1, N)
        tv, th = pt.dvector("t"), pt.dvector("theta")
        xs = {s: pt.dvector(s) for s in system.states}
        f = pytensor.function([tv, th, *xs.values()], system.pytensor_rhs(tv, xs, th), on_unused_input="ignore")
        got = np.column_stack(f(tt, case.theta, *X.T))
        np.testing.assert_allclose(got, system.rhs_on_grid(tt, X, case.theta), rtol=1e-12)


def test_models_load_by_name_and_match_method():
    assert pgpgm.available_models() == ["fitzhugh-nagumo", "goodwin", "lotka-volterra", "michaelis-menten",
                                        "pk-infusion", "pk-oral", "protein-transduction", "repressilator",
                                        "rosenzweig-macarthur", "seir", "sir"]
    lv = pgpgm.load_model("lotka-volterra")
    c = lv.case("x1-observed")
    assert c.observed == ("x1",) and c.gamma == 0.3 and c.kernel == "rbf" and c.noise_sd == 0.1
    np.testing.assert_array_equal(c.theta, [2, 1, 4, 1])
    np.testing.assert_allclose(c.times, np.linspace(0, 2, 20))
    assert lv.case("x2-observed-large-noise").noise_sd == 0.5
    big = lv.case("x1-observed-large-noise")  # METHOD.md's fourth Lotka-Volterra case
    assert big.observed == ("x1",) and big.noise_sd == 0.5
    fhn = pgpgm.load_model("fitzhugh-nagumo")
    assert fhn.case("R-observed").snr == 100 and fhn.case().times.size == 100 and fhn.case().kernel == "matern52"
    ptm = pgpgm.load_model("protein-transduction")
    assert ptm.system.states == ("S", "dS", "R", "RS", "Rpp")
    assert ptm.case("S-R-latent").observed == ("dS", "RS", "Rpp") and ptm.case().gamma == 1e-4
    with pytest.raises(KeyError, match="unknown model"):
        pgpgm.load_model("nope")


def test_model_file_round_trip(tmp_path):
    f = tmp_path / "decay.toml"
    f.write_text('name = "decay"\nparameters = ["k"]\n[equations]\nx = "-k*x"\n[experiment]\nx0=[1.0]\ntheta=[0.5]\ntimes=[0,1,2]\nnoise_sd=0.1\n')
    spec = pgpgm.load_model(f)
    assert spec.system.states == ("x",) and spec.case().observed == ("x",)
    f.write_text('parameters = ["k"]\n[equations]\nx = "import os"\n')
    with pytest.raises(ModelDefinitionError, match="not an arithmetic expression"):
        pgpgm.load_model(f)


# ------------------------------------------------------------------ lossless to_dict / from_dict
ROUND_TRIP = {
    "x": "x/3 - 0.1*y + 1.2345678901234567*a*x + abs(x - y)**1.5",
    "y": "where(t < 2, a, 0) - min(x, y, 0.5) + max(x, 2/7) + exp(-x*y) + pi*x**2 - E**(y/3)",
    "z": "where(x > 1, 0.1*3*x, y < 0.5, 1e-300, 0.12345678901234567890123) + x**(1/3) + 1/y**2 + log(1 + z)",
}


def _identical(a, b):
    return a == b and sp.srepr(a) == sp.srepr(b)


def test_to_dict_reads_back_identically():
    import json

    s = ODESystem.from_equations(ROUND_TRIP, ["a"], name="round trip")
    d = json.loads(json.dumps(s.to_dict()))  # plain JSON data
    assert set(d) == {"name", "states", "parameters", "equations"} and d["states"] == ["x", "y", "z"]
    back = ODESystem.from_dict(d)
    assert back.name == "round trip" and back.parameters == ("a",)
    for e1, e2 in zip(s.expressions, back.expressions):
        assert _identical(e1, e2), (e1, e2)
    # the exact values survived: 1/3 is a fraction, the 17-digit literal its double,
    # the 23-digit literal the exact decimal
    x = sp.Symbol("x", real=True)
    assert x / 3 in back.expressions[0].args
    assert 1.2345678901234567 in {float(f) for f in back.expressions[0].atoms(sp.Float)}
    assert sp.Rational("0.12345678901234567890123") in back.expressions[2].atoms(sp.Rational)
    rng = np.random.default_rng(0)
    for _ in range(3):
        X, t = rng.uniform(0.2, 2, 3), rng.uniform(0, 3)
        np.testing.assert_array_equal(s.rhs(t, X, [0.7]), back.rhs(t, X, [0.7]))


def test_to_dict_of_from_function_systems():
    def rhs(t, y, p):
        return {"u": 2 / 3 * y.u - 0.1 * 3 * y.v + sp.Rational(1, 3) * sp.Abs(y.u) ** 3,
                "v": sp.Piecewise((p.k, t < 1), (0, True)) + sp.Min(y.u, y.v) - sp.exp(-p.k * t) / y.v**2}

    s = ODESystem.from_function(rhs, ["u", "v"], ["k"])
    back = ODESystem.from_dict(s.to_dict())
    for e1, e2 in zip(s.expressions, back.expressions):
        assert _identical(e1, e2), (e1, e2)
    assert repr(2 / 3) in s.to_dict()["equations"]["u"]  # the double, every digit it needs


def test_to_dict_rejects_what_the_language_cannot_spell():
    with pytest.raises(ModelDefinitionError, match="erf is not part of the equation language"):
        ODESystem.from_function(lambda t, y, p: [sp.erf(y.x)], ["x"], [])
    with pytest.raises(ModelDefinitionError, match="otherwise"):
        ODESystem.from_function(lambda t, y, p: [sp.Piecewise((y.x, t < 1))], ["x"], [])
    with pytest.raises(ModelDefinitionError, match="has 103 bits of precision"):  # refused when built (issue 33)
        ODESystem.from_function(lambda t, y, p: [sp.Float("0.1", 30) * y.x], ["x"], [])


def test_from_dict_checks_its_input():
    good = ODESystem.from_equations({"x": "-k*x"}, ["k"]).to_dict()
    with pytest.raises(ModelDefinitionError, match="unknown \\['equation'\\]"):
        ODESystem.from_dict({**{k: v for k, v in good.items() if k != "equations"}, "equation": {"x": "-k*x"}})
    with pytest.raises(ModelDefinitionError, match="do not match"):
        ODESystem.from_dict({**good, "states": ["y"]})
    with pytest.raises(ModelDefinitionError, match="not allowed"):
        ODESystem.from_dict({**good, "equations": {"x": "__import__('os').getcwd()"}})


def test_names_must_be_lists_not_strings():
    with pytest.raises(ModelDefinitionError, match="parameters must be a list of names, not the string 'ab'"):
        ODESystem.from_equations({"x": "-a*x"}, "ab")
    with pytest.raises(ModelDefinitionError, match="states must be a list of names, not the string 'xy'"):
        ODESystem.from_function(lambda t, y, p: [-y[0]], "xy", [])

"""Bad model input gets a ModelDefinitionError that names it - quickly, never a hang or a crash.

Table-driven: each input with the expected error class and a fragment of its message.
Inputs that could hang or crash the interpreter run in a subprocess with a timeout.
A failing right-hand side makes the ODE solve fail (also in a subprocess, to read
stderr). A property-based test feeds random expression strings to the parser.
"""

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgpgm
from pgpgm import ModelDefinitionError, ODESystem
from pgpgm.ode.parse import MAX_LENGTH
from pgpgm.spec import spec_from_dict

# ------------------------------------------------------------------ equation strings
BAD_EQUATIONS = [
    # (right-hand side of x, fragment of the message)
    ("9**9**9", "exponents are limited to 1000"),
    ("2**100000", "exponents are limited to 1000"),
    ("x**(2**100000)", "exponents are limited to 1000"),
    ("x**1001", "exponents are limited to 1000"),
    ("10**400", "the constant '10**400' is not a finite real number"),
    ("exp(1000)*x", "the constant 'exp(1000)' is not a finite real number"),
    ("1e999*x", "the constant '1e999' is not a finite real number"),
    ("1e308*10 + x", "the constant '1e308*10' is not a finite real number"),
    ("1e-400*x", "'1e-400' is too small for a 64-bit float"),
    ("inf*x", "'inf' is not a finite number"),
    ("x + nan", "'nan' is not a finite number"),
    ("1j*x", "the complex constant '1j'"),
    ("1/0 + x", "the constant '1/0' is not a finite real number"),
    ("x/0", "not finite and real everywhere"),
    ("1e308*(x - pi)", "the constant -1.0e+308*pi in the equation for x is not a finite 64-bit number"),
    ("1e308*(x + x)", "is not a finite 64-bit number"),
    ("x/(a - a)", "not finite and real everywhere"),
    ("tan(pi/2)*x", "not finite and real everywhere"),
    ("log(0)*x", "the constant 'log(0)'"),
    ("sqrt(-1)*x", "the constant 'sqrt(-1)'"),
    ("(-8)**(1/3)*x", "the constant '(-8)**(1/3)'"),
    ("acos(2)", "the constant 'acos(2)'"),
    ("x" + "+x" * (MAX_LENGTH // 2), f"at most {MAX_LENGTH} are accepted"),
    ("exp(" * 60 + "x" + ")" * 60, "nests deeper than 50 levels"),
    ("-" * 5000 + "x", "nests deeper than 50 levels"),
    ("(" * 300 + "x" + ")" * 300, "not an arithmetic expression"),
    ("1" * 5000, "not an arithmetic expression"),
    ("x\0", "not an arithmetic expression"),
    ("x < 2", "comparisons may appear only as conditions of where()"),
    ("(x < 2)*3", "comparisons may appear only as conditions of where()"),
    ("where(x, 1, 2)", "of where() must be a comparison"),
    ("where(x == 1, 1, 2)", "use < <= > >="),
    ("where(t < 1, 1)", "an odd number of at least 3 arguments, got 2"),
    ("where(t < 1, 1, t < 2, 2)", "an odd number of at least 3 arguments, got 4"),
    ("min(x)", "min() takes two or more arguments, got 1"),
    ("max(*x)", "positional arguments only"),
    ("exp(x, a)", "exp() takes exactly one argument, got 2"),
    ("sqrt(x=1)", "positional arguments only"),
    ("x if x else a", "IfExp 'x if x else a' is not allowed"),
    ("~x", "UnaryOp '~x' is not allowed"),
    ("x & a", "BinOp 'x & a' is not allowed"),
    ("True*x", "only numeric constants are allowed, not 'True'"),
    ("'x'", "only numeric constants are allowed"),
    ("x ^ 2", "'^' is not a power"),
    ("__import__('os')", "call of '__import__' is not allowed"),
    ("__import__('os').system('echo hi')", "is not allowed in the equation for x; allowed functions are"),
    ("unknown*x", "unknown name 'unknown'"),
    ("", "empty or non-string expression"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_EQUATIONS, ids=[t[:30] for t, _ in BAD_EQUATIONS])
def test_bad_equation_strings(text, fragment):
    with pytest.raises(ModelDefinitionError) as info:
        ODESystem.from_equations({"x": text, "y": "-y"}, ["a"])
    assert fragment in str(info.value)
    assert "equation for x" in str(info.value)
    assert len(str(info.value)) < 600  # long inputs are shortened in the message


GOOD_EQUATIONS = [
    # (right-hand side of x, the sympy expression it must give)
    ("2**1000*x", sp.Integer(2) ** 1000 * sp.Symbol("x", real=True)),
    ("0.1*x", sp.Float(0.1) * sp.Symbol("x", real=True)),
    ("1.2345678901234567*x", sp.Float(1.2345678901234567) * sp.Symbol("x", real=True)),
    ("0.12345678901234567890123*x", sp.Rational("0.12345678901234567890123") * sp.Symbol("x", real=True)),
    ("1_000.5*x", sp.Float(1000.5) * sp.Symbol("x", real=True)),
    ("x**1000", sp.Symbol("x", real=True) ** 1000),
]


@pytest.mark.parametrize(("text", "expected"), GOOD_EQUATIONS)
def test_constants_are_kept_exactly(text, expected):
    got = ODESystem.from_equations({"x": text}, []).expressions[0]
    assert got == expected and sp.srepr(got) == sp.srepr(expected)


# ------------------------------------------------------------------ names
BAD_NAMES = [
    (lambda: ODESystem.from_equations({"x": "-a*x"}, "ab"), "parameters must be a list of names, not the string 'ab'"),
    (lambda: ODESystem.from_equations({"x": "-a*x"}, "a"), "parameters must be a list of names, not the string 'a'"),
    (lambda: ODESystem.from_equations({"x": "-x"}, 5), "parameters must be a list of names, got int"),
    (lambda: ODESystem.from_equations({"x": "-x"}, {"a": 1}), "parameters must be a list of names, got dict"),
    (lambda: ODESystem.from_function(lambda t, y, p: [-y[0]], "xy", []), "states must be a list of names"),
    (lambda: ODESystem.from_equations({"x": "-x"}, ["where"]), "parameter name 'where' is reserved"),
    (lambda: ODESystem.from_equations({"min": "-min"}, []), "state name 'min' is reserved"),
    (lambda: ODESystem.from_equations({"x": "-x"}, ["a b"]), "parameter name 'a b' is not a valid identifier"),
    (lambda: ODESystem.from_equations({"x": 1.5}, []), "empty or non-string expression"),
    (lambda: ODESystem.from_equations({"x": "-x"}, [], name=""), "name must be a non-empty string"),
]


@pytest.mark.parametrize(("make", "fragment"), BAD_NAMES, ids=[f for _, f in BAD_NAMES])
def test_bad_names(make, fragment):
    with pytest.raises(ModelDefinitionError, match=None) as info:
        make()
    assert fragment in str(info.value)


# ------------------------------------------------------------------ ODESystem.from_function
# (id, rhs(t, y, p), fragments); issue 33: raw TypeErrors before
FUNCTION_CASES = [
    ("math.exp", lambda t, y, p: [math.exp(-p.k) * y.x], ["rhs(t, y, p) failed with TypeError",
                                                            "use sympy functions (sympy.exp, sympy.sin, ...)"]),
    ("numpy.exp", lambda t, y, p: [np.exp(-p.k * y.x)], ["rhs(t, y, p) failed with TypeError",
                                                          "not math or numpy ones"]),
    ("numpy.sin of a state", lambda t, y, p: [np.sin(y.x)], ["failed with TypeError", "use sympy functions"]),
    ("returns None", lambda t, y, p: None, ["rhs(t, y, p) returned None; it must return a list of 1 expressions",
                                             "is a 'return' missing?"]),
    ("returns one expression", lambda t, y, p: -p.k * y.x, ["returned Mul '-k*x'; it must return a list of 1"]),
    ("returns a number", lambda t, y, p: 3.0, ["returned float '3.0'; it must return a list"]),
    ("unknown state", lambda t, y, p: [-p.k * y.z], ["failed with AttributeError", "y has the states ['x']"]),
    ("a NaN", lambda t, y, p: [np.float64(np.nan) * y.x], ["NaN is not part of the equation language"]),
]


@pytest.mark.parametrize(("rhs", "fragments"), [c[1:] for c in FUNCTION_CASES], ids=[c[0] for c in FUNCTION_CASES])
def test_bad_rhs_functions(rhs, fragments):
    with pytest.raises(ModelDefinitionError) as info:
        ODESystem.from_function(rhs, ["x"], ["k"])
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_good_rhs_function_with_sympy_functions():
    s = ODESystem.from_function(lambda t, y, p: [sp.exp(-p.k) * y.x], ["x"], ["k"])
    assert s.rhs(0.0, [2.0], [0.5])[0] == pytest.approx(2.0 * math.exp(-0.5), rel=1e-15)


# ------------------------------------------------------------------ model files
GOOD_DOC = {
    "name": "decay", "parameters": ["k"], "equations": {"x": "-k*x"},
    "experiment": {"theta": [0.5], "x0": [1.0], "times": {"start": 0, "stop": 2, "num": 5}, "noise_sd": 0.1,
                   "priors": {"lower": 0, "upper": 3}},
    "cases": {"a": {"observed": ["x"]}},
}


def _doc(path, value):
    """GOOD_DOC with ``value`` set at ``path`` (a tuple of keys)."""
    doc = json.loads(json.dumps(GOOD_DOC))
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return doc


BAD_DOCS = [
    (("prior",), {"lower": 0}, "unknown key 'prior' in the model file (did you mean 'priors', a key of [experiment] and [cases.NAME]?); the known keys are: name, description"),
    (("experiment", "noise"), 0.1, "unknown key 'noise' in [experiment] (did you mean 'noise_sd'?); the known keys are: observed, theta"),
    (("cases", "a", "observe"), ["x"], "unknown key 'observe' in [cases.a] (did you mean 'observed'?)"),
    (("cases", "a", "zzz"), 1, "unknown key 'zzz' in [cases.a]; the known keys are"),
    (("experiment", "priors"), {"lower": 0, "uper": 3}, "unknown key 'uper' in [cases.a] priors"),
    (("experiment", "priors"), {"lower": 0}, "priors needs both 'lower' and 'upper'"),
    (("experiment", "times"), {"start": 0, "stop": 2, "step": 1}, "unknown key 'step' in [cases.a] times"),
    (("experiment", "times"), {"start": 0, "stop": 2}, "times lacks ['num']"),
    (("experiment", "theta"), [0.5, 1.0], "[cases.a] theta must have shape (1,)"),
    (("experiment", "x0"), ["one"], "[cases.a] x0 must be numbers"),
    (("experiment", "priors"), {"lower": [0, 0], "upper": 3}, "priors.lower must have shape (1,)"),
    (("experiment", "kernel"), 3, "[cases.a] kernel must be a string"),
    (("experiment", "iterations"), 2.5, "[cases.a] iterations must be an integer"),
    (("experiment", "noise_sd"), "0.1", "[cases.a] noise_sd must be a number"),
    (("cases", "a", "observed"), ["q"], "unknown state name(s) ['q']"),
    (("parameters",), "k", "parameters must be a list of names, not the string 'k'"),
    (("experiment",), [1, 2], "[experiment] must be a table"),
]


@pytest.mark.parametrize(("path", "value", "fragment"), BAD_DOCS, ids=[f[:40] for *_, f in BAD_DOCS])
def test_bad_model_files(path, value, fragment):
    with pytest.raises(ModelDefinitionError) as info:
        spec_from_dict(_doc(path, value))
    assert fragment in str(info.value)


def test_good_model_file_and_every_shipped_model_load(tmp_path):
    spec = spec_from_dict(GOOD_DOC)
    assert spec.case("a").observed == ("x",) and spec.case().times.tolist() == [0, 0.5, 1, 1.5, 2]
    one = spec_from_dict(_doc(("cases", "a", "observed"), "x"))  # one name as a plain string
    assert one.case().observed == ("x",)
    for name in pgpgm.available_models():
        assert pgpgm.load_model(name).cases
    f = tmp_path / "typo.toml"
    f.write_text('parameters = ["k"]\nprior = { lower = 0, upper = 1 }\n[equations]\nx = "-k*x"\n')
    with pytest.raises(ModelDefinitionError, match="unknown key 'prior' in the model file .did you mean 'priors'"):
        pgpgm.load_model(f)


# ------------------------------------------------------------------ hangs and crashes (subprocess)
HEAVY = {
    "tower": "9**9**9**9",
    "big power": "7**999**2",
    "digits": "1" * 100_000,
    "hex": "0x" + "f" * 9_000,
    "parens": "(" * 100_000 + "x" + ")" * 100_000,
    "unary": "-" * 9_999 + "x",
    "long valid sum": "+".join(f"{k}*a*x**{k % 997}" for k in range(1, 1_000))[:9_990].rsplit("+", 1)[0],
    "long product": "*".join(["(x + a)"] * 1_200),
    "nested calls": "exp(" * 49 + "x" + ")" * 49,
    "nested powers": "x**" * 49 + "x",
    "where chain": "where(x < 1, 1, " * 48 + "0" + ")" * 48,
    "null": "x\0" * 4_000,
}


def test_heavy_inputs_finish_quickly_in_a_subprocess():
    script = textwrap.dedent("""
        import json, sys, time
        from pgpgm import ODESystem, ModelDefinitionError
        cases = json.loads(sys.stdin.read())
        out = {}
        for label, text in cases.items():
            t0 = time.perf_counter()
            try:
                s = ODESystem.from_equations({"x": text}, ["a"])
                result = "ok"
            except ModelDefinitionError as exc:
                result = "ModelDefinitionError: " + str(exc)[:80]
            except BaseException as exc:
                result = "OTHER " + type(exc).__name__ + ": " + str(exc)[:200]
            parse = time.perf_counter() - t0
            if result == "ok":
                try:
                    s.state_jacobian  # valid input: differentiable (sympy's time grows with the size)
                except BaseException as exc:
                    result = "OTHER in the Jacobian " + type(exc).__name__ + ": " + str(exc)[:200]
            out[label] = [result, parse]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(HEAVY), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    for label, (result, seconds) in out.items():
        assert not result.startswith("OTHER"), (label, result)
        assert seconds < 2.0, (label, seconds)
    for label in ("long valid sum", "long product", "nested calls", "nested powers", "where chain"):
        assert out[label][0] == "ok", (label, out[label])
    for label in ("tower", "big power", "digits", "hex", "parens", "unary", "null"):
        assert out[label][0].startswith("ModelDefinitionError"), (label, out[label])


# ------------------------------------------------------------------ a failing right-hand side
SQRT_SCRIPT = textwrap.dedent("""
    import json, numpy as np, pgpgm
    s = pgpgm.ODESystem.from_equations({"u": "-a*u + sqrt(v)", "v": "-b"}, ["a", "b"])
    out = {}
    names = {"cvode": "cvode", "sksundae": "sksundae", "lsoda": "scipy"}
    for cls in pgpgm.available_solvers():
        backend = names[cls.name]
        for grid in ("ends", "fine"):
            times = np.array([0.0, 2.0]) if grid == "ends" else np.linspace(0, 2, 11)
            for method in ("solve", "solve_sensitivities"):
                solver = pgpgm.Integrator(s, times, cls())
                try:
                    r = getattr(solver, method)([1.0, 1.0], [1.0, 0.5])
                    x = r[0] if isinstance(r, tuple) else r
                    out[f"{backend}-{grid}-{method}"] = "numbers " + repr(x[-1].tolist())
                except pgpgm.ODESolveError as exc:
                    out[f"{backend}-{grid}-{method}"] = "ODESolveError " + str(exc)[:100]
                except Exception as exc:
                    out[f"{backend}-{grid}-{method}"] = "OTHER " + type(exc).__name__ + str(exc)[:100]
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def sqrt_solves():
    proc = subprocess.run([sys.executable, "-c", SQRT_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):]), proc.stderr


def test_a_failing_callback_prints_no_ignored_exception(sqrt_solves):
    _, stderr = sqrt_solves
    assert "Exception ignored" not in stderr and "ZeroDivisionError" not in stderr


@pytest.mark.parametrize("key", [
    "cvode-ends-solve", "cvode-ends-solve_sensitivities",
    "cvode-fine-solve", "cvode-fine-solve_sensitivities",
    "sksundae-ends-solve", "sksundae-ends-solve_sensitivities", "sksundae-fine-solve",
    "sksundae-fine-solve_sensitivities",
    "scipy-ends-solve", "scipy-ends-solve_sensitivities", "scipy-fine-solve", "scipy-fine-solve_sensitivities",
])
def test_a_solution_leaving_the_domain_is_an_ode_solve_error(sqrt_solves, key):
    # sqrt(v) with v = 0.5 - t: the model is undefined after t = 0.5; no numbers may come back
    results, _ = sqrt_solves
    if key not in results:
        pytest.skip(f"backend of {key} not available")
    assert results[key].startswith("ODESolveError"), results[key]


# ------------------------------------------------------------------ property-based
NAMES = ["x", "y", "a", "b", "t", "pi", "E", "q", "inf", "nan", "os", "__import__", "lambda"]
FUNCS = ["exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "abs",
         "min", "max", "where", "eval", "open", "getattr", "float"]
NUMBERS = ["0", "1", "2", "3", "0.5", "1e308", "1e-400", "1e999", "9", "1000", "1001", "1j", "1.2345678901234567",
           "0.123456789012345678901", "0x10", "1_0", "-1"]
TOKENS = NAMES + FUNCS + NUMBERS + ["+", "-", "*", "/", "**", "^", "(", ")", ",", "<", "<=", ">", ">=", "==",
                                   "&", "|", "and", "or", "not", "[", "]", ".", ":", "=", "'", "if", "else", "~",
                                   "%", "//", "@", "lambda", "__class__"]

leaves = st.sampled_from(NAMES + NUMBERS)


def _combine(children):
    binop = st.tuples(children, st.sampled_from(["+", "-", "*", "/", "**", "<", ">=", "&", "|", " and ", " or "]),
                      children).map(lambda p: f"({p[0]}{p[1]}{p[2]})")
    unary = st.tuples(st.sampled_from(["-", "+", "not ", "~"]), children).map(lambda p: f"{p[0]}({p[1]})")
    call = st.tuples(st.sampled_from(FUNCS), st.lists(children, max_size=5)).map(
        lambda p: f"{p[0]}({', '.join(p[1])})")
    chain = st.tuples(children, children, children).map(lambda p: f"({p[0]} < {p[1]} <= {p[2]})")
    return st.one_of(binop, unary, call, chain)


expressions = st.one_of(
    st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join),
    st.recursive(leaves, _combine, max_leaves=25),
    st.text(max_size=40),
)


def _check(text):
    try:
        s = ODESystem.from_equations({"x": text, "y": "a*x - y"}, ["a", "b"])
    except ModelDefinitionError:
        return
    s.state_jacobian  # differentiable
    back = ODESystem.from_dict(s.to_dict())  # and writes back losslessly
    assert back.expressions == s.expressions


@settings(max_examples=600, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(expressions)
def test_random_expressions_give_a_system_or_a_model_definition_error(text):
    _check(text)


# ------------------------------------------------------------------ long literals: one model everywhere
# (literal, the 64-bit float every part of a fit must use). Issue 33: sympy prints floats with 15
# significant digits, so the compiled kernels computed 2.000000000000001 as 2.0 while the PyTensor
# density used the exact value.
LITERALS = [
    ("2.000000000000001", 2.000000000000001),
    ("3.0000000000000004", 3.0000000000000004),
    ("1.2345678901234567", 1.2345678901234567),
    ("0.1", 0.1),
    ("1e-300", 1e-300),
    ("0.12345678901234567890123", 0.12345678901234568),  # a longer literal: the exact fraction, rounded once
]


def _tiny_result(system):
    """A FitResult with ``system`` and empty parts (enough to save and load the system)."""
    import arviz as az
    import xarray as xr

    post = az.from_dict({"posterior": {"k": np.zeros((1, 2))}})
    return pgpgm.FitResult(system, post, xr.Dataset({"a": ("i", [0.0])}), xr.Dataset({"b": ("j", [0.0])}), {}, {})


@pytest.mark.parametrize(("literal", "value"), LITERALS, ids=[lit for lit, _ in LITERALS])
def test_a_long_literal_is_one_number_in_the_kernels_the_density_and_the_saved_file(literal, value, tmp_path):
    import pytensor
    import pytensor.tensor as pt

    assert float(literal) == value
    system = ODESystem.from_equations({"x": f"{literal}*k*x", "y": f"-y + {literal}"}, ["k"])
    loaded = pgpgm.load_result(_tiny_result(system).save(tmp_path / "r.nc")).system
    # at x = k = 1 the right-hand side is the constant itself, exactly
    for s in (system, loaded):
        np.testing.assert_array_equal(s.rhs(0.0, [1.0, 0.0], [1.0]), [value, value])
        jx, jp = s.jacobian(0.0, [1.0, 0.0], [1.0])
        assert jx[0, 0] == value and jp[0, 0] == value
    t, x, y, th = pt.dvector("t"), pt.dvector("x"), pt.dvector("y"), pt.dvector("theta")
    graph = pytensor.function([t, x, y, th], system.pytensor_rhs(t, {"x": x, "y": y}, th), on_unused_input="ignore")
    rng = np.random.default_rng(0)
    pts = rng.uniform(0.5, 2.0, (5, 3))  # (x, y, k) at 5 time points
    kernel = np.array([system.rhs(0.0, p[:2], p[2:]) for p in pts])
    after = np.array([loaded.rhs(0.0, p[:2], p[2:]) for p in pts])
    density = np.column_stack([np.concatenate(graph([0.0], [p[0]], [p[1]], [p[2]])) for p in pts]).T
    np.testing.assert_array_equal(kernel, density)
    np.testing.assert_array_equal(kernel, after)
    np.testing.assert_array_equal(density[:, 1], value - pts[:, 1])  # -y + c


def test_a_sympy_float_of_other_precision_is_refused():
    """A sympy Float of more than 64-bit precision cannot be one model everywhere: refused when the
    system is built (before: a model that compiled rounded and could not be saved)."""
    with pytest.raises(ModelDefinitionError, match="has 103 bits of precision in the rhs for x; pgpgm computes in "
                                                   "64-bit floats"):
        ODESystem.from_function(lambda t, y, p: [sp.Float("2.0000000000000000000001", 30) * y.x], ["x"], [])
    exact = ODESystem.from_function(lambda t, y, p: [sp.Rational("2.0000000000000000000001") * y.x], ["x"], [])
    assert exact.rhs(0.0, [1.0], [])[0] == 2.0  # an exact fraction: the nearest float, everywhere


# ------------------------------------------------------------------ a saved model keeps every constant
def _save_paths(system, tmp_path):
    """``system`` written and read back by each way pgpgm writes a model: the equation language
    (:func:`format_expression`), ``to_dict``, a result file's system text, a result file, a TOML model file."""
    from pgpgm.ode.parse import format_expression, parse_expression
    from pgpgm.fit_result import _decode_system, _encode_system

    symbols = {s.name: s for s in (system.symbols[0], *system.symbols[1], *system.symbols[2])}
    equations = system.to_dict()["equations"]
    model_file = tmp_path / "model.toml"
    model_file.write_text(f"name = {json.dumps(system.name)}\nparameters = {json.dumps(list(system.parameters))}\n"
                          "[equations]\n" + "".join(f"{s} = {json.dumps(e)}\n" for s, e in equations.items()))
    yield "equation language", [parse_expression(format_expression(e), symbols) for e in system.expressions]
    yield "to_dict", ODESystem.from_dict(system.to_dict())
    yield "result file text", _decode_system(_encode_system(system))
    yield "result file", pgpgm.load_result(_tiny_result(system).save(tmp_path / "r.nc")).system
    yield "TOML model file", pgpgm.load_model(model_file).system


AWKWARD = {"x": "2.000000000000001*x - 1e-300*y*k", "y": "0.3333333333333333*x + 6.02214076e23*k*y - 1e-310"}


@pytest.mark.parametrize("how", ["equations", "function"])
def test_awkward_constants_read_back_identically_by_every_path(how, tmp_path):
    if how == "equations":
        system = ODESystem.from_equations(AWKWARD, ["k"], name="awkward")
    else:  # Python floats, 1/3 computed
        system = ODESystem.from_function(lambda t, y, p: [2.000000000000001 * y.x - 1e-300 * y.y * p.k,
                                                          1 / 3 * y.x + 6.02214076e23 * p.k * y.y - 1e-310],
                                         ["x", "y"], ["k"], name="awkward")
    assert system.expressions == ODESystem.from_equations(AWKWARD, ["k"]).expressions
    rng = np.random.default_rng(1)
    points = rng.uniform(0.5, 2.0, (6, 3))  # (x, y, k)
    reference = np.array([system.rhs(0.0, p[:2], p[2:]) for p in points])
    # at x = 1, y = 0, k = 1 the first terms are the constants themselves
    np.testing.assert_array_equal(system.rhs(0.0, [1.0, 0.0], [1.0]), [2.000000000000001, 1 / 3 - 1e-310])
    for path, back in _save_paths(system, tmp_path):
        expressions = back if isinstance(back, list) else back.expressions
        assert [sp.srepr(e) for e in expressions] == [sp.srepr(e) for e in system.expressions], path
        if not isinstance(back, list):
            after = np.array([back.rhs(0.0, p[:2], p[2:]) for p in points])
            np.testing.assert_array_equal(after, reference, err_msg=path)


@pytest.mark.parametrize(("text", "rounded"), [("x*1e-300*1e-10", "1e-310"), ("x/1.7976931348623157e308", "5.56"),
                                               ("1e-300*1e-300*x", "0.0"), ("(x + 1e-300)*1e-300", "0.0")])
def test_a_constant_sympy_forms_below_the_64_bit_range_is_refused(text, rounded):
    """sympy multiplies the numbers of an equation with 53 bits at any exponent: 1e-300*1e-10 is 1.0e-310
    with 53 bits, which no 64-bit float holds. Before, such a system was built, its kernels and density
    computed with the rounded value, and it could not be saved (to_dict: 'do not read back
    identically'), so a fit's result file failed after the fit. Refused when the system is built."""
    with pytest.raises(ModelDefinitionError, match=f"is below the range of 64-bit floats .* rounded to {rounded}"):
        ODESystem.from_equations({"x": text}, [])
    with pytest.raises(ModelDefinitionError, match="is below the range of 64-bit floats"):
        ODESystem.from_function(lambda t, y, p: [y.x * sp.Float(1e-300) * sp.Float(1e-10)], ["x"], [])
    one = ODESystem.from_equations({"x": "1e-310*x"}, [])  # one number: a 64-bit (subnormal) float, kept
    assert one.rhs(0.0, [1.0], [])[0] == 1e-310
    assert ODESystem.from_dict(one.to_dict()).expressions == one.expressions

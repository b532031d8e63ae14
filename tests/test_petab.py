"""PEtab import: the official PEtab test suite, the likelihood against the petab library, gradients
against finite differences, and bad input named by file, line and column.

The test suite's v1.0.0 SBML cases (PEtab-dev/petab_test_suite, BSD-3) are shipped under
tests/data/petab_suite; each gives its expected llh, chi2 and simulations with tolerances.
The benchmark collection's problems are tested in tests/test_petab_collection.py (slow).
"""

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import pgpgm
from pgpgm import DataError, ModelDefinitionError
from pgpgm.solve import CVODE

SUITE = Path(__file__).parent / "data" / "petab_suite" / "v1.0.0" / "sbml"
CASES = sorted(p.name for p in SUITE.iterdir() if p.is_dir())


def _case(name: str) -> Path:
    return SUITE / name / f"_{name}.yaml"


def test_the_suite_is_shipped_whole():
    assert CASES == [f"{i:04d}" for i in range(1, 21)]


@pytest.mark.parametrize("case", CASES)
def test_petab_test_suite_case(case):
    """Each case passes: llh, chi2 and every simulated value within the case's tolerances."""
    solution = yaml.safe_load((SUITE / case / f"_{case}_solution.yaml").read_text())
    problem = pgpgm.load_petab(_case(case))
    nominal = problem.nominal_parameters()
    assert -problem.nll(nominal) == pytest.approx(solution["llh"], abs=solution["tol_llh"])
    assert problem.chi2(nominal) == pytest.approx(solution["chi2"], abs=solution["tol_chi2"])
    expected = pd.concat([pd.read_csv(SUITE / case / f, sep="\t") for f in solution["simulation_files"]])
    simulated = problem.simulate(nominal)
    assert list(simulated["observableId"]) == list(expected["observableId"])
    np.testing.assert_allclose(simulated["time"], expected["time"].astype(float))
    np.testing.assert_allclose(simulated["simulation"], expected["simulation"], rtol=0,
                               atol=solution["tol_simulations"])


def _petab_llh(problem, table: pd.DataFrame) -> float:
    """The petab library's llh of ``table`` (a simulation table) for the problem's own files."""
    import petab.v1 as petab

    p = petab.Problem.from_yaml(problem.files.yaml)
    sim = p.measurement_df.drop(columns="measurement").assign(simulation=table["simulation"].to_numpy())
    return petab.calculate_llh(p.measurement_df, sim, p.observable_df, p.parameter_df)


@pytest.mark.parametrize("case", ["0003", "0007", "0014", "0015", "0016"])
def test_likelihood_equals_the_petab_librarys_on_the_same_simulation(case):
    problem = pgpgm.load_petab(_case(case))
    nominal = problem.nominal_parameters()
    assert problem.nll(nominal) == pytest.approx(-_petab_llh(problem, problem.simulate(nominal)), rel=1e-12)


def _variant(tmp_path: Path, case: str = "0001") -> Path:
    """A copy of a suite case in ``tmp_path`` (its YAML path), for edits."""
    target = tmp_path / case
    shutil.copytree(SUITE / case, target)
    return target / f"_{case}.yaml"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text)
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("transformation", ["lin", "log", "log10"])
@pytest.mark.parametrize("distribution", ["normal", "laplace"])
def test_noise_models_equal_the_petab_librarys(tmp_path, transformation, distribution):
    """Laplace noise and every transformation, which the suite's v1.0.0 cases do not all cover."""
    path = _variant(tmp_path)
    _set_cells(path, "_observables.tsv", 0, ["observableTransformation", "noiseDistribution"],
               [transformation, distribution])
    problem = pgpgm.load_petab(path)
    nominal = problem.nominal_parameters()
    assert problem.nll(nominal) == pytest.approx(-_petab_llh(problem, problem.simulate(nominal)), rel=1e-12)


def _check_gradient(problem, z, rtol):
    f, g = problem.nll_and_gradient(z)
    assert f == pytest.approx(problem.nll(problem.from_scale(z)), rel=1e-9)  # the solves with and without
    # sensitivities differ in their error control only
    h = 1e-5
    fd = np.array([(problem.nll(problem.from_scale(z + h * e)) - problem.nll(problem.from_scale(z - h * e))) / (2 * h)
                   for e in np.eye(z.size)])
    np.testing.assert_allclose(g, fd, rtol=0, atol=rtol * np.abs(fd).max())


@pytest.mark.parametrize("case", ["0010", "0015", "0016", "0018", "0019"])
def test_gradient_equals_finite_differences(case):
    """Forward sensitivities through preequilibration with a conservation law (0010), a rate rule
    (0018), parametric noise (0015), log transformation (0016), estimated initial values (0019)."""
    problem = pgpgm.load_petab(_case(case), solver=CVODE(rtol=1e-12, atol=1e-14))
    z = problem.to_scale(problem.nominal_parameters()) + 0.1
    _check_gradient(problem, z, 1e-6)


def test_residuals_and_their_jacobian():
    problem = pgpgm.load_petab(_case("0016"), solver=CVODE(rtol=1e-12, atol=1e-14))
    assert problem.least_squares
    z = problem.to_scale(problem.nominal_parameters()) + 0.1
    r, jac = problem.residuals(z, jacobian=True)
    nll = problem.nll(problem.from_scale(z))
    sigma = problem._evaluate(problem._vector(problem.from_scale(z)), False).sigma
    m = problem.measurements.value
    log = np.array([problem.observables[o].transformation == "log" for o in problem.measurements.observable])
    assert log.any() and not log.all()
    # normal noise: nll = sum(0.5 log(2 pi sigma^2) + log m where log-transformed) + 0.5 |r|^2
    const = np.sum(0.5 * np.log(2 * math.pi * sigma ** 2) + np.where(log, np.log(m), 0.0))
    plain = problem.residuals(z)
    assert nll == pytest.approx(const + 0.5 * plain @ plain, rel=1e-12)
    np.testing.assert_allclose(r, plain, rtol=1e-8)  # (from the solve with sensitivities)
    h = 1e-6
    fd = np.stack([(problem.residuals(z + h * e) - problem.residuals(z - h * e)) / (2 * h) for e in np.eye(z.size)], 1)
    np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-8)
    assert not pgpgm.load_petab(_case("0015")).least_squares  # a noise parameter is estimated


def test_experiment_inputs_solve_to_the_simulation():
    """The per-experiment parameters and initial states a fitter gets, solved by pgpgm's Integrator,
    give the problem's own simulation (0019: initial values from a parameter on the log10 scale)."""
    problem = pgpgm.load_petab(_case("0019"))
    z = problem.to_scale(problem.nominal_parameters()) + 0.1
    (inputs,) = problem.experiment_inputs(z)
    assert inputs.condition == "c0" and inputs.preequilibration is None and not inputs.steady_state
    assert problem.system.states == ("A", "B")
    np.testing.assert_allclose(inputs.x0, [10 ** (math.log10(2.0) + 0.1), 3.0])  # initial_A, initial_B fixed
    states = pgpgm.Integrator(problem.system, inputs.times, problem.simulator.solver).solve(inputs.theta, inputs.x0)
    simulated = problem.simulate(problem.from_scale(z))
    np.testing.assert_allclose(simulated["simulation"], states[np.searchsorted(inputs.times, simulated["time"]), 0],
                               rtol=1e-12)
    preeq = pgpgm.load_petab(_case("0010")).experiment_inputs(np.array([0.6]))[0]
    assert preeq.preequilibration == "preeq_c0"
    assert np.isnan(preeq.x0[0]) and preeq.x0[1] == 1.0  # A from the steady state, B reset by c0


def test_a_problem_pickles():
    import pickle

    problem = pgpgm.load_petab(_case("0010"))
    nominal = problem.nominal_parameters()
    problem.nll_and_gradient(problem.to_scale(nominal))  # compiled functions and integrators built
    assert pickle.loads(pickle.dumps(problem)).nll(nominal) == problem.nll(nominal)


def test_residuals_refuse_laplace_noise(tmp_path):
    path = _variant(tmp_path)
    _set_cells(path, "_observables.tsv", 0, ["noiseDistribution"], ["laplace"])
    problem = pgpgm.load_petab(path)
    assert not problem.least_squares
    with pytest.raises(DataError, match="Laplace noise"):
        problem.residuals(problem.to_scale(problem.nominal_parameters()))


def test_parameters_on_their_scales():
    problem = pgpgm.load_petab(_case("0019"))
    assert [p.id for p in problem.estimated] == ["k1", "k2", "initial_A"]
    assert [p.scale for p in problem.estimated] == ["lin", "lin", "log10"]
    z = problem.to_scale(problem.nominal_parameters())
    np.testing.assert_allclose(z, [0.8, 0.6, math.log10(2.0)])
    assert problem.from_scale(z) == pytest.approx(problem.nominal_parameters())
    lower, upper = problem.bounds()
    np.testing.assert_allclose(lower, [0, 0, 0]) and np.testing.assert_allclose(upper, [10, 10, 1])
    with pytest.raises(DataError, match="no values for the estimated parameters"):
        problem.nll({"k1": 1.0})


def test_the_docs_page_examples_run_as_written(monkeypatch):
    import re

    page = Path(__file__).parent.parent / "docs" / "petab.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    assert len(blocks) == 3
    monkeypatch.chdir(page.parent.parent)
    namespace: dict = {}
    for block in blocks[:2]:  # the third, a fit, runs with every page's examples (tests/test_docs_examples.py)
        exec(compile(block, str(page), "exec"), namespace)
    assert namespace["nll"] == pytest.approx(138.2219978, rel=1e-8)  # the page's comment (AMICI: 138.22199774)


# ------------------------------------------------------------------------------------ bad input
def test_yaml_naming_a_missing_file(tmp_path):
    path = _variant(tmp_path)
    _edit(path, "_measurements.tsv", "_nowhere.tsv")
    with pytest.raises(DataError, match=r"_0001\.yaml: 'measurement_files' names _nowhere\.tsv, which does not exist"):
        pgpgm.load_petab(path)
    with pytest.raises(DataError, match="does not exist"):
        pgpgm.load_petab(tmp_path / "missing.yaml")


def test_sbml_that_does_not_parse(tmp_path):
    path = _variant(tmp_path)
    (path.parent / "_model.xml").write_text("<sbml><model id='x'><listOfSpecies><species id=</sbml>")
    with pytest.raises(DataError, match=r"_model\.xml is not a valid SBML file \(line \d+"):
        pgpgm.load_petab(path)


def test_observable_naming_an_unknown_symbol(tmp_path):
    path = _variant(tmp_path)
    _edit(path.parent / "_observables.tsv", "\tA\t", "\tA + nowhere\t")
    with pytest.raises(DataError, match=r"_observables\.tsv, line 2, column 'observableFormula': the symbol "
                                        r"'nowhere' is no model entity"):
        pgpgm.load_petab(path)


def _set_cells(path: Path, table: str, row: int, columns: list[str], values: list) -> None:
    """Set cells of the table file ``table`` beside the problem's YAML ``path`` (``row`` from 0)."""
    frame = pd.read_csv(path.parent / table, sep="\t", dtype=str, keep_default_na=False)
    frame.loc[row, columns] = [str(v) for v in values]
    frame.to_csv(path.parent / table, sep="\t", index=False)


BAD_CELLS = [
    # (table, row, columns, values, fragment of the message)
    ("_measurements.tsv", 1, ["simulationConditionId"], ["c9"],
     r"_measurements\.tsv, line 3, column 'simulationConditionId': 'c9' is not in the condition table"),
    ("_parameters.tsv", 1, ["lowerBound", "upperBound"], [5, 1],
     r"_parameters\.tsv, line 3, column 'upperBound': the upper bound 1 is below the lower bound 5"),
    ("_measurements.tsv", 0, ["measurement"], ["seven"],
     r"_measurements\.tsv, line 2, column 'measurement': 'seven' is not a number"),
    ("_measurements.tsv", 0, ["observableId"], ["obs_z"],
     r"_measurements\.tsv, line 2, column 'observableId': 'obs_z' is not in the observable table"),
    ("_conditions.tsv", 1, ["a0"], ["k9"],
     r"_conditions\.tsv, line 3, column 'a0': 'k9' is neither a number nor a parameter of the parameter table"),
    ("_parameters.tsv", 0, ["parameterScale"], ["ln"], r"_parameters\.tsv, line 2, column 'parameterScale': 'ln' is not"),
]


@pytest.mark.parametrize("table, row, columns, values, message", BAD_CELLS,
                         ids=[f"{b[0]}:{b[2][-1]}" for b in BAD_CELLS])
def test_bad_cells_are_named_by_file_line_and_column(tmp_path, table, row, columns, values, message):
    path = _variant(tmp_path, "0002")
    _set_cells(path, table, row, columns, values)
    with pytest.raises(DataError, match=message):
        pgpgm.load_petab(path)


def _add_event(model, libsbml):
    event = model.createEvent()
    event.setId("dose")
    event.setUseValuesFromTriggerTime(True)
    event.createTrigger().setMath(libsbml.parseL3Formula("time > 1"))
    assignment = event.createEventAssignment()
    assignment.setVariable("A")
    assignment.setMath(libsbml.parseL3Formula("1"))


def _add_algebraic_rule(model, libsbml):
    model.createAlgebraicRule().setMath(libsbml.parseL3Formula("A + B - 1"))


def _delay_in_a_rate(model, libsbml):
    law = model.getReaction(0).getKineticLaw()
    law.setMath(libsbml.parseL3Formula(f"delay({libsbml.formulaToL3String(law.getMath())}, 1)"))


def _floor_in_a_rate(model, libsbml):
    law = model.getReaction(0).getKineticLaw()
    law.setMath(libsbml.parseL3Formula(f"floor({libsbml.formulaToL3String(law.getMath())})"))


REFUSED = [(_add_event, "the event dose"), (_add_algebraic_rule, "an algebraic rule"),
           (_delay_in_a_rate, r"the function delay in the kinetic law of reaction"),
           (_floor_in_a_rate, r"the math of the kinetic law of reaction \w+: floor is not part of the equation language")]


@pytest.mark.parametrize("edit, message", REFUSED, ids=[r[0].__name__ for r in REFUSED])
def test_unsupported_sbml_is_refused_at_load_naming_the_element(tmp_path, edit, message):
    import libsbml

    path = _variant(tmp_path)
    doc = libsbml.readSBMLFromFile(str(path.parent / "_model.xml"))
    edit(doc.getModel(), libsbml)
    libsbml.writeSBMLToFile(doc, str(path.parent / "_model.xml"))
    with pytest.raises(ModelDefinitionError, match=message):
        pgpgm.load_petab(path)


def test_petab_v2_is_refused(tmp_path):
    path = _variant(tmp_path)
    _edit(path, "format_version: 1", "format_version: 2.0.0")
    with pytest.raises(ModelDefinitionError, match="pgpgm reads PEtab v1 problems"):
        pgpgm.load_petab(path)

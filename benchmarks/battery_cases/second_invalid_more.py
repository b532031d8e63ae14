"""Second battery, invalid input to studies, PEtab, the command line, result files and many fits: each must be
refused early by a pgpgm error (or ValueError/TypeError from pgpgm) naming the input. Written from the docs alone."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from battery_cases.common import (
    COLLECTION,
    MODELS,
    bad,
    case,
    cli_bad,
    copy_suite,
    lv_data,
    lv_spec,
    pg,
    to_tidy,
    write,
)
from battery_cases.second_common import QUICK


# ----------------------------------------------------------------------------------------------------- studies
def _theoph(ids=("1", "2", "3")):
    p = pg()
    th, inp = p.datasets.theophylline(), p.datasets.theophylline_inputs()
    return p, th[th["experiment"].isin(ids)], inp[inp["experiment"].isin(ids)].copy(), p.load_model("pk-oral")


def _study_fit_bad(study=None, **kw):
    p, th, inp, pk = _theoph()
    study = study or p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0})
    opts = dict(priors=pk.priors(), posterior=None, draws=300, tune=300)
    opts.update(kw)
    with bad():
        p.fit_study(pk.system, study, **opts)


@case("invalid", names=("posterior", "laplace"))
def b2_i_study_posterior_laplace(tmp):
    """fit_study(posterior='laplace'): its docstring allows 'nuts', a NUTS or None only."""
    _study_fit_bad(posterior="laplace")


@case("invalid", names=("99",))
def b2_i_study_inputs_unknown_experiment(tmp):
    """Inputs with a row for experiment 99, which has no data (documented as an unknown experiment)."""
    p, th, inp, _ = _theoph()
    inp = pd.concat([inp, pd.DataFrame({"experiment": ["99"], "dose_mg_per_kg": [4.0], "weight_kg": [70.0],
                                        "dose_mg": [280.0]})], ignore_index=True)
    with bad():
        p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0})


@case("invalid", names=("experiment", "empty"))
def b2_i_study_from_mapping_empty(tmp):
    """Study.from_mapping({}) then fit_study: a study without experiments."""
    p = pg()
    with bad():
        study = p.Study.from_mapping({})
        p.fit_study(p.load_model("pk-oral").system, study, posterior=None, draws=300, tune=300)


@case("invalid", names=("e9",))
def b2_i_study_t0_mapping_unknown_experiment(tmp):
    """Study.from_mapping with t0={'e1': 0, 'e9': 0}: e9 is no experiment."""
    p = pg()
    pk = p.load_model("pk-oral")
    d = pk.simulate("C-observed", seed=0)
    with bad():
        study = p.Study.from_mapping({"e1": d}, x0={"e1": {"A": 4.5}}, t0={"e1": 0.0, "e9": 0.0})
        p.fit_study(pk.system, study, priors=pk.priors(), posterior=None, draws=300, tune=300)


@case("invalid", names=("'Q'", '"Q"', "state Q", "Q "))
def b2_i_study_noise_per_experiment_unknown(tmp):
    """fit_study(noise_per_experiment=['Q'])."""
    _study_fit_bad(noise_per_experiment=["Q"])


@case("invalid", names=("ka",))
def b2_i_study_varying_and_hierarchical(tmp):
    """ka both varying and hierarchical: two contradicting models of one parameter."""
    _study_fit_bad(varying=["ka"], hierarchical={"ka": "lognormal"})


@case("invalid", names=("dose_mg_per_kg", "NaN"))
def b2_i_study_input_dose_nan(tmp):
    """Subject 2's dose missing (NaN) in the inputs, used as A(0)."""
    p, th, inp, pk = _theoph()
    inp.loc[inp["experiment"] == "2", "dose_mg_per_kg"] = np.nan
    with bad():
        study = p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0})
        p.fit_study(pk.system, study, priors=pk.priors(), posterior=None, draws=300, tune=300)


@case("invalid", names=("e1", "distinct", "duplicate"))
def b2_i_study_duplicate_experiment_names(tmp):
    """A Study of two StudyExperiments both named 'e1' (the docstring: distinct names)."""
    p = pg()
    d = p.load_model("pk-oral").simulate("C-observed", seed=0)
    e = p.StudyExperiment(name="e1", data=d, x0={"A": 4.5}, fixed={}, t0=None)
    with bad():
        study = p.Study(experiments=(e, e))
        p.fit_study(p.load_model("pk-oral").system, study, posterior=None, draws=300, tune=300)


# -------------------------------------------------------------------------------------------------------- PEtab
def _suite(tmp, number="0001"):
    return copy_suite(tmp, number)


def _load_bad(yaml):
    with bad():
        pg().load_petab(yaml)


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@case("invalid", names=("format_version",))
def b2_i_petab_yaml_no_format_version(tmp):
    """A YAML file without format_version."""
    d, y = _suite(tmp)
    _edit(y, "format_version: 1\n", "")
    _load_bad(y)


@case("invalid", names=("problems", "one problem", "several", "two"))
def b2_i_petab_yaml_two_problems(tmp):
    """A YAML file with two problems (documented: one model and one problem)."""
    d, y = _suite(tmp)
    text = y.read_text()
    y.write_text(text + text[text.index("- condition_files"):])
    _load_bad(y)


@case("invalid", names=("estimate",))
def b2_i_petab_parameters_no_estimate_column(tmp):
    """A parameter table without the 'estimate' column."""
    d, y = _suite(tmp)
    t = pd.read_csv(d / "_parameters.tsv", sep="\t").drop(columns=["estimate"])
    t.to_csv(d / "_parameters.tsv", sep="\t", index=False)
    _load_bad(y)


@case("invalid", names=("'ln'", '"ln"', "parameterScale"))
def b2_i_petab_unknown_parameter_scale(tmp):
    """parameterScale 'ln' (PEtab knows lin, log, log10)."""
    d, y = _suite(tmp)
    _edit(d / "_parameters.tsv", "k1\tlin", "k1\tln")
    _load_bad(y)


@case("invalid", names=("obs_zzz",))
def b2_i_petab_unknown_observable_in_measurements(tmp):
    """A measurement of an observable obs_zzz the observable table lacks."""
    d, y = _suite(tmp)
    with (d / "_measurements.tsv").open("a") as f:
        f.write("obs_zzz\tc0\t5\t0.3\n")
    _load_bad(y)


@case("invalid", names=("sigma_zzz",))
def b2_i_petab_noise_formula_unknown_symbol(tmp):
    """A noise formula using an unknown symbol sigma_zzz."""
    d, y = _suite(tmp)
    _edit(d / "_observables.tsv", "A\t0.5", "A\tsigma_zzz")
    _load_bad(y)


@case("invalid", names=("event",))
def b2_i_petab_sbml_event(tmp):
    """An SBML model with an event (documented as refused at load, named)."""
    d, y = _suite(tmp)
    event = """    <listOfEvents>
      <event id="ev1">
        <trigger><math xmlns="http://www.w3.org/1998/Math/MathML"><apply><gt/><csymbol encoding="text"
          definitionURL="http://www.sbml.org/sbml/symbols/time"> time </csymbol><cn> 5 </cn></apply></math></trigger>
        <listOfEventAssignments><eventAssignment variable="A"><math xmlns="http://www.w3.org/1998/Math/MathML">
          <cn> 1 </cn></math></eventAssignment></listOfEventAssignments>
      </event>
    </listOfEvents>
  </model>"""
    _edit(d / "_model.xml", "  </model>", event)
    _load_bad(y)


@case("invalid", names=("k1", "lowerBound"))
def b2_i_petab_log_scale_zero_bound(tmp):
    """k1 on log10 scale with lowerBound 0 (log10 of 0)."""
    d, y = _suite(tmp)
    _edit(d / "_parameters.tsv", "k1\tlin\t0\t10", "k1\tlog10\t0\t10")
    _load_bad(y)


@case("invalid", names=("cauchy", "noiseDistribution"))
def b2_i_petab_noise_distribution_unknown(tmp):
    """noiseDistribution 'cauchy' (normal and laplace are documented)."""
    d, y = _suite(tmp)
    write(d / "_observables.tsv", "observableId\tobservableFormula\tnoiseFormula\tnoiseDistribution\n"
                                   "obs_a\tA\t0.5\tcauchy\n")
    _load_bad(y)


@case("invalid", names=("k1",))
def b2_i_petab_nll_nan_value(tmp):
    """problem.nll with k1 = NaN (documented DataError)."""
    d, y = _suite(tmp)
    prob = pg().load_petab(y)
    par = prob.nominal_parameters()
    par["k1"] = float("nan")
    with bad():
        prob.nll(par)


@case("invalid", names=("length", "shape", "(4,)", "4 estimated", "V_e"))
def b2_i_petab_gradient_wrong_length(tmp):
    """nll_and_gradient with 3 values for 4 estimated parameters."""
    d, y = _suite(tmp)
    prob = pg().load_petab(y)
    with bad():
        prob.nll_and_gradient(np.array([1.0, 0.0, 0.8]))


@case("invalid", names=("xml", "yaml", "YAML"))
def b2_i_fit_petab_sbml_path(tmp):
    """fit_petab given the SBML file's path instead of the YAML file's."""
    d, y = _suite(tmp)
    with bad():
        pg().fit_petab(str(d / "_model.xml"), posterior=None, progressbar=False)


# ------------------------------------------------------------------------------------------------ command line
def _lv_csv(tmp):
    path = tmp / "lv.csv"
    to_tidy(lv_data()).to_csv(path, index=False)
    return path


def _lv_cli(tmp, *extra):
    cli_bad("fit", "--model", MODELS / "lotka_volterra.toml", "--data", _lv_csv(tmp), "--observe", "x1",
            "--out", tmp / "out", "--no-progress", *extra)


def _theoph_cli(tmp, *extra, inputs=True):
    p, th, inp, _ = _theoph()
    th.to_csv(tmp / "th.csv", index=False)
    inp.to_csv(tmp / "inp.csv", index=False)
    args = ["fit", "--model", MODELS / "pk_oral.toml", "--data", tmp / "th.csv", "--x0", "A=dose_mg_per_kg", "C=0"]
    if inputs:
        args += ["--inputs", tmp / "inp.csv"]
    cli_bad(*args, "--out", tmp / "out", "--no-progress", *extra)


@case("invalid", names=("--model", "model"))
def b2_i_cli_fit_without_model(tmp):
    """pgpgm fit --data lv.csv (no --model, no --petab)."""
    cli_bad("fit", "--data", _lv_csv(tmp), "--observe", "x1", "--out", tmp / "out")


@case("invalid", names=("--petab", "--model", "petab"))
def b2_i_cli_model_and_petab(tmp):
    """pgpgm fit with both --model/--data and --petab."""
    d, y = copy_suite(tmp)
    _lv_cli(tmp, "--petab", y)


@case("invalid", names=("grid",))
def b2_i_cli_grid_reversed(tmp):
    """pgpgm fit --grid 2 0 41 (START after STOP)."""
    _lv_cli(tmp, "--x0", "x2=3", "--grid", "2", "0", "41")


@case("invalid", names=("lv.csv", "empty", "no data", "rows", "measurement"))
def b2_i_cli_csv_header_only(tmp):
    """pgpgm fit of a CSV with the header line only."""
    path = write(tmp / "lv.csv", "time,state,value\n")
    cli_bad("fit", "--model", MODELS / "lotka_volterra.toml", "--data", path, "--observe", "x1", "--x0", "x2=3",
            "--out", tmp / "out")


@case("invalid", names=("time", "state", "value", "column"))
def b2_i_cli_csv_semicolons(tmp):
    """pgpgm fit of a CSV separated by semicolons (a European spreadsheet's export)."""
    path = tmp / "lv.csv"
    to_tidy(lv_data()).to_csv(path, index=False, sep=";")
    cli_bad("fit", "--model", MODELS / "lotka_volterra.toml", "--data", path, "--observe", "x1", "--x0", "x2=3",
            "--out", tmp / "out")


@case("invalid", names=("equation", "m.toml", "'B'"))
def b2_i_cli_toml_bad_equation(tmp):
    """pgpgm fit --model of a TOML file whose equation for B does not parse."""
    model = write(tmp / "m.toml", 'name = "m"\nparameters = ["k1", "k2"]\n\n[equations]\nA = "-k1*A"\n'
                                  'B = "k1*A - - * k2*B"\n')
    data = tmp / "b.csv"
    pd.DataFrame({"time": [0.0, 1.0, 2.0, 3.0], "state": "B", "value": [0.0, 1.0, 1.2, 1.0]}).to_csv(data,
                                                                                                     index=False)
    cli_bad("fit", "--model", model, "--data", data, "--observe", "B", "--x0", "A=5", "--out", tmp / "out")


@case("invalid", names=("normal", "lognormal", "ka"))
def b2_i_cli_hierarchical_normal(tmp):
    """pgpgm fit of a study with --hierarchical ka=normal (only lognormal is documented)."""
    _theoph_cli(tmp, "--hierarchical", "ka=normal", "--posterior", "none")


@case("invalid", names=("varying", "experiment", "study"))
def b2_i_cli_varying_without_experiments(tmp):
    """pgpgm fit --varying theta1 on a CSV without an experiment column (one experiment, nothing to vary)."""
    _lv_cli(tmp, "--x0", "x2=3", "--varying", "theta1")


@case("invalid", names=("experiment", "inp.csv"))
def b2_i_cli_inputs_without_experiment_column(tmp):
    """pgpgm fit of a study whose --inputs CSV lacks the experiment column."""
    p, th, inp, _ = _theoph()
    th.to_csv(tmp / "th.csv", index=False)
    inp.rename(columns={"experiment": "subject"}).to_csv(tmp / "inp.csv", index=False)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", tmp / "th.csv", "--inputs", tmp / "inp.csv",
            "--x0", "A=dose_mg_per_kg", "C=0", "--out", tmp / "out", "--posterior", "none")


@case("invalid", names=("nosuch",))
def b2_i_cli_run_unknown_case(tmp):
    """pgpgm run lotka-volterra --case nosuch."""
    cli_bad("run", "lotka-volterra", "--case", "nosuch", "--out", tmp / "out")


@case("invalid", names=("nosuchmodel",))
def b2_i_cli_sensitivity_unknown_model(tmp):
    """pgpgm sensitivity nosuchmodel."""
    cli_bad("sensitivity", "nosuchmodel")


@case("invalid", names=("x2",))
def b2_i_cli_x0_box_reversed(tmp):
    """pgpgm fit --x0 x2=6:1 (LOW above HIGH)."""
    _lv_cli(tmp, "--x0", "x2=6:1")


@case("invalid", names=("sd-error", "sd_error"))
def b2_i_cli_posterior_sd_error_negative(tmp):
    """pgpgm fit --posterior-sd-error -0.1."""
    _lv_cli(tmp, "--x0", "x2=3", "--posterior", "nuts", "--posterior-sd-error", "-0.1", "--posterior-budget", "10")


# ------------------------------------------------------------------------------------------------ result files
def _saved(tmp, name="lv.nc"):
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], x0={"x2": 3.0}, priors=(0, 10), **QUICK)
    return p, r, r.save(tmp / name)


@case("invalid", names=("lv.nc",))
def b2_i_load_truncated_result(tmp):
    """load_result of a result file cut to half its size."""
    p, r, path = _saved(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with bad():
        p.load_result(path)


@case("invalid", names=("lv.nc",))
def b2_i_load_damaged_result(tmp):
    """load_result of a result file with 64 bytes overwritten in its middle."""
    p, r, path = _saved(tmp)
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes((b ^ 0xFF) for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))
    with bad():
        p.load_result(path)


@case("invalid", names=("lv.nc", "single fit", "load_result", "study"))
def b2_i_load_study_of_fit_result(tmp):
    """load_study of a single fit's file (documented ResultFileError)."""
    p, r, path = _saved(tmp)
    with bad():
        p.load_study(path)


@case("invalid", names=("link.nc", "link", "symbolic"))
def b2_i_save_to_symlink(tmp):
    """result.save to a symbolic link (documented: refused before anything is written)."""
    p, r, path = _saved(tmp, "real.nc")
    os.symlink(path, tmp / "link.nc")
    with bad():
        r.save(tmp / "link.nc")


# ---------------------------------------------------------------------------------------------------- many fits
@case("invalid", names=("j1", "duplicate", "unique"))
def b2_i_fit_many_duplicate_names(tmp):
    """fit_many with two jobs named j1 (documented DataError before anything starts)."""
    p = pg()
    jobs = [p.FitJob("j1", lv_spec(), lv_data(), ("x1",)), p.FitJob("j1", lv_spec(), lv_data(seed=1), ("x1",))]
    with bad():
        p.fit_many(jobs, tmp / "out", n_workers=1, posterior=None, draws=300, tune=300, progressbar=False)


@case("invalid", names=("gama", "gamma"))
def b2_i_fit_many_unknown_option(tmp):
    """fit_many(gama=0.3): a misspelt fit option (documented DataError before anything starts)."""
    p = pg()
    jobs = [p.FitJob("j1", lv_spec(), lv_data(), ("x1",))]
    with bad():
        p.fit_many(jobs, tmp / "out", n_workers=1, gama=0.3, posterior=None, progressbar=False)


@case("invalid", names=("a/b",))
def b2_i_fitjob_name_with_slash(tmp):
    """FitJob('a/b', ...): a name that is no file name (documented characters only)."""
    p = pg()
    with bad():
        job = p.FitJob("a/b", lv_spec(), lv_data(), ("x1",), options=dict(posterior=None, draws=300, tune=300))
        p.batch.fit_and_save(job, tmp / "out")


@case("invalid", names=("dataset",))
def b2_i_jobs_from_tidy_csv_no_dataset(tmp):
    """jobs_from_tidy_csv of a table without the dataset column."""
    path = tmp / "all.csv"
    to_tidy(lv_data()).to_csv(path, index=False)
    with bad():
        pg().jobs_from_tidy_csv(path, "lotka-volterra")


# -------------------------------------------------------------------------------------------------------- tools
@case("invalid", names=("adjoint", "method"))
def b2_i_sensitivity_unknown_method(tmp):
    """sensitivity_index(method='adjoint')."""
    with bad():
        pg().sensitivity_index(lv_spec().system, [2.0, 1.0, 4.0, 1.0], [5.0, 3.0], (0.0, 2.0), method="adjoint")


@case("invalid", names=("x3",))
def b2_i_log_transform_unknown_state(tmp):
    """log_transform(system, ['x3'])."""
    with bad():
        pg().log_transform(lv_spec().system, ["x3"])


@case("invalid", names=("zzz",))
def b2_i_petab_nll_unknown_id(tmp):
    """problem.nll with an unknown parameter id zzz beside the nominal ones (documented DataError)."""
    prob = pg().load_petab(COLLECTION / "Boehm_JProteomeRes2014" / "Boehm_JProteomeRes2014.yaml")
    par = dict(prob.nominal_parameters(), zzz=1.0)
    with bad():
        prob.nll(par)

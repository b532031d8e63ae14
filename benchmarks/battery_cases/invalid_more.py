"""Bad input to models, studies, PEtab problems, result files and the command line."""

from __future__ import annotations


import numpy as np

from battery_cases.common import *  # noqa: F403  (the registry, the checks and the data every case uses)


# ------------------------------------------------------------------------------------------- models (invalid)
@case("invalid", names=["a*x +", "x", "parse", "syntax"])
def i_equation_syntax(tmp):
    """An equation string that does not parse."""
    with bad():
        pg().ODESystem.from_equations({"x": "a*x +"}, parameters=["a"])


@case("invalid", names=["y"])
def i_equation_unknown_symbol(tmp):
    """An equation using an undeclared name."""
    with bad():
        pg().ODESystem.from_equations({"x": "a*y"}, parameters=["a"])


@case("invalid", names=["parameters", "list", "string"])
def i_parameters_one_string(tmp):
    """parameters='a b' (one string)."""
    with bad():
        pg().ODESystem.from_equations({"x": "-a*x"}, parameters="ab")


@case("invalid", names=["sympy", "numpy", "math", "exp"])
def i_from_function_numpy(tmp):
    """from_function whose right-hand side calls numpy.exp."""
    with bad():
        pg().ODESystem.from_function(lambda t, y, q: [-q.k * np.exp(y.u)], states=["u"], parameters=["k"])


@case("invalid", names=["E"])
def i_state_named_E(tmp):
    """A state named E (Euler's number)."""
    with bad():
        pg().ODESystem.from_equations({"S": "-b*S*E", "E": "b*S*E - g*E"}, parameters=["b", "g"])


@case("invalid", names=["__import__", "os", "allowed", "unknown"])
def i_equation_code_injection(tmp):
    """An equation that tries to call Python (the parser must refuse it)."""
    with bad():
        pg().ODESystem.from_equations({"x": "__import__('os').getpid()*x"}, parameters=[])


@case("invalid", names=["paramters"])
def i_toml_unknown_key(tmp):
    """A model file with a misspelt key."""
    path = write(tmp / "m.toml", 'name = "m"\nparamters = ["k"]\n\n[equations]\nx = "-k*x"\n')
    with bad():
        pg().load_model(path)


@case("invalid", names=["m.toml", "line", "toml"])
def i_toml_syntax_error(tmp):
    """A model file that is not TOML."""
    path = write(tmp / "m.toml", 'name = "m"\nparameters = ["k"\n[equations]\nx = "-k*x"\n')
    with bad():
        pg().load_model(path)


@case("invalid", names=["equations"])
def i_toml_missing_equations(tmp):
    """A model file without [equations]."""
    path = write(tmp / "m.toml", 'name = "m"\nparameters = ["k"]\n')
    with bad():
        pg().load_model(path)


@case("invalid", names=["x0", "length", "state"])
def i_toml_case_x0_wrong_length(tmp):
    """A model file whose experiment's x0 has the wrong length."""
    path = write(tmp / "m.toml", 'name = "m"\nparameters = ["k"]\n\n[equations]\nx = "-k*x"\ny = "k*x"\n\n'
                                 '[experiment]\ntheta = [1.0]\nx0 = [1.0]\ntimes = { start = 0.0, stop = 2.0, num = 20 }\n'
                                 'noise_sd = 0.1\n\n[cases.x-observed]\nobserved = ["x"]\n')
    with bad():
        spec = pg().load_model(path)
        spec.simulate("x-observed", seed=0)


@case("invalid", names=["lotka-voltera", "lotka-volterra", "available"])
def i_load_model_unknown_name(tmp):
    """load_model with a misspelt name."""
    with bad():
        pg().load_model("lotka-voltera")


@case("invalid", names=["x1-observd", "x1-observed", "case"])
def i_unknown_case(tmp):
    """spec.case with a misspelt case name."""
    with bad():
        lv_spec().case("x1-observd")


# ------------------------------------------------------------------------------------------ studies (invalid)
@case("invalid", names=["dose_typo"])
def i_study_missing_input_column(tmp):
    """Study.from_tidy with x0 naming a column that the inputs lack."""
    th, inp = theoph_subset()
    with bad():
        pg().Study.from_tidy(th, inp, x0={"A": "dose_typo", "C": 0.0})


@case("invalid", names=["experiment"])
def i_study_no_experiment_column(tmp):
    """Study.from_tidy of a table without an experiment column."""
    with bad():
        pg().Study.from_tidy(to_tidy(lv_data()), None)


@case("invalid", names=["3", "experiment", "input"])
def i_study_inputs_missing_row(tmp):
    """An experiment of the data without a row of inputs while columns are asked for."""
    th, inp = theoph_subset()
    with bad():
        pg().Study.from_tidy(th, inp[inp["experiment"] != "3"], x0={"A": "dose_mg_per_kg", "C": 0.0})


@case("invalid", names=["kaa"])
def i_study_varying_unknown(tmp):
    """fit_study varying names an unknown parameter."""
    p = pg()
    th, inp, study, spec = theoph_study()
    with bad():
        p.fit_study(spec.system, study, varying=["kaa"], priors=spec.priors(), posterior=None, **FAST)


@case("invalid", names=["gamma", "lognormal", "hierarch"])
def i_study_hierarchical_unknown_dist(tmp):
    """hierarchical={'ka': 'gamma'} (only lognormal is documented)."""
    p = pg()
    th, inp, study, spec = theoph_study()
    with bad():
        p.fit_study(spec.system, study, hierarchical={"ka": "gamma"}, priors=spec.priors(), posterior=None, **FAST)


@case("invalid", names=["Q"])
def i_study_noise_unknown_state(tmp):
    """fit_study noise names an unknown state."""
    p = pg()
    th, inp, study, spec = theoph_study()
    with bad():
        p.fit_study(spec.system, study, noise={"Q": "lognormal"}, priors=spec.priors(), posterior=None, **FAST)


@case("invalid", names=["Study", "study"])
def i_study_not_a_study(tmp):
    """fit_study given the DataFrame instead of a Study."""
    p = pg()
    th, _ = theoph_subset()
    with bad():
        p.fit_study(p.load_model("pk-oral").system, th, posterior=None, **FAST)


@case("invalid", names=["t0", "dose_time"])
def i_study_data_before_t0(tmp):
    """A study whose t0 column is after the experiments' first measurements."""
    p = pg()
    th, inp = theoph_subset()
    inp = inp.assign(dose_time=5.0)
    study = p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0}, t0="dose_time")
    spec = p.load_model("pk-oral")
    with bad():
        p.fit_study(spec.system, study, priors=spec.priors(), posterior=None, **FAST)


@case("invalid", names=["lognormal", "C", "positive", "<= 0"])
def i_study_lognormal_with_zero(tmp):
    """A study with lognormal noise and the pre-dose zeros left in."""
    p = pg()
    th, inp, study, spec = theoph_study(("2", "3", "4"))
    with bad():
        p.fit_study(spec.system, study, noise={"C": "lognormal"}, priors=spec.priors(), posterior=None, **FAST)


@case("invalid", names=["e9", "experiment"])
def i_study_from_mapping_unknown_exp(tmp):
    """Study.from_mapping with x0 for an experiment the data lack."""
    pk, d, _ = pk_after_dose()
    with bad():
        pg().Study.from_mapping({"e0": d}, x0={"e9": {"A": 4.5}})


# -------------------------------------------------------------------------------------------- PEtab (invalid)
@case("invalid", names=["nope.yaml"])
def i_petab_missing_yaml(tmp):
    """load_petab of a file that does not exist."""
    with bad():
        pg().load_petab(tmp / "nope.yaml")


@case("invalid", names=["_measurements.tsv"])
def i_petab_missing_table(tmp):
    """A PEtab problem whose measurement file is missing."""
    folder, yml = copy_suite(tmp)
    (folder / "_measurements.tsv").unlink()
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["_parameters.tsv", "bound", "k1"])
def i_petab_upper_below_lower(tmp):
    """A parameter table with upperBound below lowerBound."""
    folder, yml = copy_suite(tmp)
    f = folder / "_parameters.tsv"
    f.write_text(f.read_text().replace("k1\tlin\t0\t10", "k1\tlin\t10\t0"))
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["c9", "condition"])
def i_petab_unknown_condition(tmp):
    """A measurement for an unknown condition."""
    folder, yml = copy_suite(tmp)
    f = folder / "_measurements.tsv"
    lines = f.read_text().splitlines()
    lines[2] = lines[2].replace("c0", "c9")
    f.write_text("\n".join(lines) + "\n")
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["_measurements.tsv", "abc", "measurement"])
def i_petab_bad_cell(tmp):
    """A measurement cell that is not a number."""
    folder, yml = copy_suite(tmp)
    f = folder / "_measurements.tsv"
    f.write_text(f.read_text().replace("\t0.7", "\tabc"))
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["Q", "obs_a", "_observables.tsv"])
def i_petab_unknown_symbol(tmp):
    """An observable formula with an unknown symbol."""
    folder, yml = copy_suite(tmp)
    f = folder / "_observables.tsv"
    f.write_text(f.read_text().replace("obs_a\tA\t", "obs_a\tA*Q\t"))
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["_model.xml", "sbml", "line"])
def i_petab_bad_sbml(tmp):
    """An SBML file that does not parse."""
    folder, yml = copy_suite(tmp)
    f = folder / "_model.xml"
    f.write_text(f.read_text()[:1500] + "\n<<< broken")
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["version", "v2", "format_version"])
def i_petab_version_2(tmp):
    """A YAML file of PEtab format version 2."""
    folder, yml = copy_suite(tmp)
    yml.write_text(yml.read_text().replace("format_version: 1", "format_version: 2.0.0"))
    with bad():
        pg().load_petab(yml)


@case("invalid", names=["time", "negative", "-1", "t0", "_measurements.tsv"])
def i_petab_negative_time(tmp):
    """A measurement at time -1 (PEtab simulates from t = 0)."""
    folder, yml = copy_suite(tmp)
    f = folder / "_measurements.tsv"
    f.write_text(f.read_text().replace("c0\t10\t", "c0\t-1\t"))
    with bad():
        prob = pg().load_petab(yml)
        prob.nll(prob.nominal_parameters())


@case("invalid", names=["noise", "negative", "sigma", "obs_a", "_observables.tsv"])
def i_petab_negative_noise(tmp):
    """A negative noise formula (noise sd -0.5)."""
    folder, yml = copy_suite(tmp)
    f = folder / "_observables.tsv"
    f.write_text(f.read_text().replace("obs_a\tA\t0.5", "obs_a\tA\t-0.5"))
    with bad():
        prob = pg().load_petab(yml)
        prob.nll(prob.nominal_parameters())


@case("invalid", names=["k1", "k2", "a0", "b0", "estimated"])
def i_petab_nll_missing_parameter(tmp):
    """problem.nll without the estimated parameters."""
    prob = pg().load_petab(SUITE / "0001" / "_0001.yaml")
    with bad():
        prob.nll({"a0": 1.0})


@case("invalid", names=["agree"])
def i_multistart_zero_agree(tmp):
    """MultiStart(agree=0)."""
    with bad():
        p = pg()
        p.fit_petab(SUITE / "0001" / "_0001.yaml", search=p.MultiStart(agree=0, seconds=10), posterior=None, progressbar=False)


# ------------------------------------------------------------------------------------------ results (invalid)
@case("invalid", names=["folder", "directory", "regular file", "res"])
def i_save_to_folder(tmp):
    """result.save to an existing folder."""
    p = pg()
    r = p.fit(lv_spec().system, lv_data(), ["x1"], priors=(0, 10), posterior=None, **FAST)
    (tmp / "res").mkdir()
    with bad():
        r.save(tmp / "res")


@case("invalid", names=["junk.nc"])
def i_load_result_garbage(tmp):
    """load_result of a text file."""
    path = write(tmp / "junk.nc", "this is not a result\n")
    with bad():
        pg().load_result(path)


# -------------------------------------------------------------------------------------------- CLI (invalid)
@case("invalid", names=["nope.toml"])
def i_cli_missing_model(tmp):
    """pgpgm fit --model of a missing file."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", tmp / "nope.toml", "--data", csv, "--out", tmp / "o", "--no-progress")


@case("invalid", names=["value", "column"])
def i_cli_csv_missing_column(tmp):
    """pgpgm fit of a CSV without a value column."""
    csv = tmp / "d.csv"
    to_tidy(lv_data()).rename(columns={"value": "measurement"}).to_csv(csv, index=False)
    cli_bad("fit", "--model", MODELS / "lotka_volterra.toml", "--data", csv, "--x0", "x2=3", "--out", tmp / "o",
            "--no-progress")


@case("invalid", names=["n/a", "value", "line", "row"])
def i_cli_csv_text_value(tmp):
    """pgpgm fit of a CSV with text in a value cell."""
    csv = tmp / "d.csv"
    df = to_tidy(lv_data())
    df["value"] = df["value"].astype(object)
    df.loc[3, "value"] = "n/a"
    df.to_csv(csv, index=False)
    cli_bad("fit", "--model", MODELS / "lotka_volterra.toml", "--data", csv, "--x0", "x2=3", "--out", tmp / "o",
            "--no-progress")


@case("invalid", names=["Q"])
def i_cli_x0_unknown_state(tmp):
    """pgpgm fit --x0 naming an unknown state."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "Q=0", "--t0", "0",
            "--posterior", "none", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["A4.5", "STATE=VALUE", "x0"])
def i_cli_x0_bad_syntax(tmp):
    """pgpgm fit --x0 A4.5 (no '=')."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A4.5", "--posterior", "none",
            "--out", tmp / "o", "--no-progress")


@case("invalid", names=["Q", "observe"])
def i_cli_observe_unknown(tmp):
    """pgpgm fit --observe Q."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--observe", "Q", "--x0", "A=4.5",
            "--posterior", "none", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["bounds", "lower", "upper"])
def i_cli_bounds_reversed(tmp):
    """pgpgm fit --bounds 5 1."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "C=0", "--t0", "0",
            "--bounds", "5", "1", "--posterior", "none", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["t0", "--t0"])
def i_cli_data_before_t0(tmp):
    """pgpgm fit --t0 5 while the data start at 0.25."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "C=0", "--t0", "5",
            "--posterior", "none", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["budget", "-5"])
def i_cli_negative_budget(tmp):
    """pgpgm fit --posterior-budget -5."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "C=0", "--t0", "0",
            "--posterior-budget", "-5", "--draws", "300", "--tune", "300", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["lognormal", "C", "positive", "<= 0"])
def i_cli_lognormal_zero(tmp):
    """pgpgm fit --lognormal C with a measured 0 (the pre-dose sample)."""
    p = pg()
    pk = p.load_model("pk-oral")
    csv = tmp / "d.csv"
    d = p.simulate(pk.system, pk.case().theta, [4.5, 0.0], pk.case().times, observed=["C"], noise_sd=0.2, seed=0)
    df = to_tidy(d)
    df.loc[df["time"] == 0.0, "value"] = 0.0
    df.to_csv(csv, index=False)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "C=0", "--lognormal", "C",
            "--posterior", "none", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["out", "exists", "file", "folder", "directory"])
def i_cli_out_is_file(tmp):
    """pgpgm fit --out pointing at an existing regular file."""
    csv = pk_csv(tmp)
    target = write(tmp / "taken", "x")
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--x0", "A=4.5", "C=0", "--t0", "0",
            "--posterior", "none", "--out", target, "--no-progress")


@case("invalid", names=["--foo"])
def i_cli_unknown_option(tmp):
    """pgpgm fit --foo."""
    csv = pk_csv(tmp)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--foo", "--out", tmp / "o")


@case("invalid", names=["nosuchmodel", "model"])
def i_cli_run_unknown_model(tmp):
    """pgpgm run nosuchmodel."""
    cli_bad("run", "nosuchmodel", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["missing.yaml"])
def i_cli_petab_missing(tmp):
    """pgpgm fit --petab of a missing YAML file."""
    cli_bad("fit", "--petab", tmp / "missing.yaml", "--out", tmp / "o", "--no-progress")


@case("invalid", names=["dose_typo"])
def i_cli_study_inputs_missing_column(tmp):
    """pgpgm fit of a study with --x0 A=<a column the inputs lack>."""
    th, inp = theoph_subset()
    data, inputs = tmp / "theoph.csv", tmp / "inputs.csv"
    th.to_csv(data, index=False)
    inp.to_csv(inputs, index=False)
    cli_bad("fit", "--model", MODELS / "pk_oral.toml", "--data", data, "--inputs", inputs, "--x0", "A=dose_typo",
            "C=0", "--posterior", "none", "--out", tmp / "o", "--no-progress")

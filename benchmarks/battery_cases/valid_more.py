"""Valid input to studies, PEtab problems and the command line."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from battery_cases.common import *  # noqa: F403  (the registry, the checks and the data every case uses)


# ------------------------------------------------------------------------------------------- studies (valid)
def check_study_held(chk, r, x0_by_exp, t0=None):
    est = r.estimates["x0"]
    x = r.trajectories["x"]
    for e, x0 in x0_by_exp.items():
        for s, v in x0.items():
            for name in est["estimate"].values:
                chk.close(est.sel(estimate=name, experiment=e, state=s), v, f"estimates x0 {name} {e} {s}", key=s)
            for name in x["estimate"].values:
                chk.close(float(x.sel(estimate=name, experiment=e, state=s).isel(point=0)), v,
                          f"trajectory {name} of {s} at the first point, experiment {e}", key=s)
        if t0 is not None:
            chk.close(float(r.trajectories["time"].sel(experiment=e).isel(point=0)), t0[e] if isinstance(t0, dict)
                      else t0, f"experiment {e}'s trajectory starts at t0", key="t0")
    if r.posterior is not None:
        post = r.posterior.posterior
        for s in {s for x0 in x0_by_exp.values() for s in x0}:
            if f"{s}_0" in post:
                chk.true(False, f"posterior samples {s}_0 although it is known", s)


@case("valid")
def v_study_theoph_from_tidy(tmp):
    """Theophylline, 3 subjects from the tidy table, x0 A = dose column, C = 0 (docs), steps 1-3."""
    p = pg()
    th, inp, study, spec = theoph_study()
    r = p.fit_study(spec.system, study, priors=spec.priors(), posterior=None, **FAST)
    r.theta("joint")
    chk = Checks()
    dose = inp.set_index("experiment")["dose_mg_per_kg"]
    check_study_held(chk, r, {e: {"A": float(dose[e]), "C": 0.0} for e in ("1", "2", "3")})
    return chk


@case("valid")
def v_study_theoph_lognormal_t0(tmp):
    """Theophylline after the dose, lognormal noise, t0 = 0 (the studies page), steps 1-3."""
    p = pg()
    th, inp = theoph_subset(after_dose=True)
    study = p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0}, t0=0.0)
    spec = p.load_model("pk-oral")
    r = p.fit_study(spec.system, study, noise={"C": "lognormal"}, priors=spec.priors(), posterior=None, **FAST)
    chk = Checks()
    dose = inp.set_index("experiment")["dose_mg_per_kg"]
    check_study_held(chk, r, {e: {"A": float(dose[e]), "C": 0.0} for e in ("1", "2", "3")}, t0=0.0)
    return chk


@case("valid")
def v_study_t0_column(tmp):
    """A study whose doses are at different times (a t0 column of the inputs), first samples later."""
    import pandas as pd

    p = pg()
    spec = p.load_model("pk-oral")
    rows, inputs = [], []
    for k, (dose, tdose) in enumerate([(4.0, 0.0), (5.0, 1.0), (4.5, 2.0)]):
        t = tdose + np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
        sim = p.simulate(spec.system, spec.case().theta, [dose, 0.0], np.r_[tdose, t], observed=["C"],
                         noise_sd=0.2, seed=k).sel(time=t)
        df = to_tidy(sim)
        df.insert(0, "experiment", f"s{k}")
        rows.append(df)
        inputs.append({"experiment": f"s{k}", "dose": dose, "dose_time": tdose})
    data, inputs = pd.concat(rows, ignore_index=True), pd.DataFrame(inputs)
    study = p.Study.from_tidy(data, inputs, x0={"A": "dose", "C": 0.0}, t0="dose_time")
    r = p.fit_study(spec.system, study, priors=spec.priors(), posterior=None, **FAST)
    chk = Checks()
    check_study_held(chk, r, {"s0": {"A": 4.0, "C": 0.0}, "s1": {"A": 5.0, "C": 0.0}, "s2": {"A": 4.5, "C": 0.0}},
                     t0={"s0": 0.0, "s1": 1.0, "s2": 2.0})
    return chk


@case("valid")
def v_study_from_mapping(tmp):
    """Study.from_mapping of simulated subjects with x0 per experiment and one t0."""
    p = pg()
    spec = p.load_model("pk-oral")
    data, x0 = {}, {}
    for k, dose in enumerate([3.0, 4.5, 6.0]):
        pk, d, _ = pk_after_dose(seed=k, dose=dose)
        data[f"e{k}"] = d
        x0[f"e{k}"] = {"A": dose, "C": 0.0}
    study = p.Study.from_mapping(data, x0=x0, t0=0.0, observed=["C"])
    r = p.fit_study(spec.system, study, priors=spec.priors(), posterior=None, **FAST)
    chk = Checks()
    check_study_held(chk, r, x0, t0=0.0)
    return chk


@case("valid")
def v_study_varying_noise_per_experiment(tmp):
    """varying=['CL'] and noise_per_experiment=True, steps 1-3."""
    p = pg()
    th, inp, study, spec = theoph_study()
    r = p.fit_study(spec.system, study, varying=["CL"], noise_per_experiment=True, priors=spec.priors(),
                    posterior=None, **FAST)
    chk = Checks()
    joint = r.theta("joint")
    chk.true(joint["ka"].nunique() == 1, "ka shared by the experiments", "ka", joint["ka"].values)
    return chk


@case("valid")
def v_study_hierarchical_small_nuts(tmp):
    """Hierarchical ka, CL (centred) with a small NUTS budget (25 s), 3 subjects."""
    p = pg()
    th, inp, study, spec = theoph_study()
    r = p.fit_study(spec.system, study, hierarchical={"ka": "lognormal", "CL": "lognormal"}, priors=spec.priors(),
                    centred=True, posterior=p.NUTS(draws=50, tune=50, chains=2, budget=25), **FAST)
    chk = Checks()
    dose = inp.set_index("experiment")["dose_mg_per_kg"]
    check_study_held(chk, r, {e: {"A": float(dose[e]), "C": 0.0} for e in ("1", "2", "3")})
    chk.true(r.timings.get("posterior", 0) <= 1.5 * 25 + 10, "step 4 within 1.5 x its 25 s budget", "budget",
             r.timings.get("posterior"))
    return chk


@case("valid")
def v_study_save_load(tmp):
    """A study's result saved and read back with load_study."""
    p = pg()
    th, inp, study, spec = theoph_study(("1", "2"))
    r = p.fit_study(spec.system, study, priors=spec.priors(), posterior=None, **FAST)
    path = r.save(tmp / "s.nc")
    back = p.load_study(path)
    chk = Checks()
    chk.close(back.theta("joint").to_numpy(), r.theta("joint").to_numpy(), "loaded joint theta", key="theta")
    return chk


# --------------------------------------------------------------------------------------------- PEtab (valid)
@case("valid")
def v_petab_boehm_nll_docs(tmp):
    """load_petab(Boehm) and the documented nll at the nominal parameters (138.2219978...)."""
    p = pg()
    prob = p.load_petab(COLLECTION / "Boehm_JProteomeRes2014" / "Boehm_JProteomeRes2014.yaml")
    nom = prob.nominal_parameters()
    chk = Checks()
    chk.close(prob.nll(nom), 138.2219978, "nll at nominal (docs 138.2219978)", key="nll", rtol=1e-8)
    import pandas as pd

    table = prob.simulate(nom)
    n = len(pd.read_csv(COLLECTION / "Boehm_JProteomeRes2014" / "measurementData_Boehm_JProteomeRes2014.tsv", sep="\t"))
    chk.true(len(table) == n, f"a simulation row per measurement ({n})", "simulate", len(table))
    z = prob.to_scale(nom)
    nll, grad = prob.nll_and_gradient(z)
    chk.close(nll, prob.nll(nom), "nll_and_gradient at to_scale(nominal)", key="nll", rtol=1e-8)
    if prob.least_squares:
        r, jac = prob.residuals(z, jacobian=True)
        chk.true(jac.shape == (r.size, len(prob.estimated)), "jacobian shape (D, V_e)", "jacobian", jac.shape)
    return chk


@case("valid")
def v_petab_suite_llh_1_10(tmp):
    """The official PEtab suite cases 0001-0010: nll(nominal) = -llh of the solution file."""
    return petab_suite_check(range(1, 11))


@case("valid")
def v_petab_suite_llh_11_20(tmp):
    """The official PEtab suite cases 0011-0020: nll(nominal) = -llh of the solution file."""
    return petab_suite_check(range(11, 21))


def petab_suite_check(numbers):
    import yaml

    p = pg()
    chk = Checks()
    for n in numbers:
        num = f"{n:04d}"
        folder = SUITE / num
        if not folder.exists():
            continue
        sol = yaml.safe_load((folder / f"_{num}_solution.yaml").read_text())
        prob = p.load_petab(folder / f"_{num}.yaml")
        chk.close(prob.nll(prob.nominal_parameters()), -sol["llh"], f"case {num}: nll(nominal) vs -llh", key="nll",
                  rtol=0, atol=sol.get("tol_llh", 1e-3))
    return chk


@case("valid")
def v_petab_fit_boehm_budget(tmp):
    """fit_petab(Boehm) with a 40 s search budget, steps 3 only: within budget, estimates inside the bounds."""
    p = pg()
    prob = p.load_petab(COLLECTION / "Boehm_JProteomeRes2014" / "Boehm_JProteomeRes2014.yaml")
    t = time.perf_counter()
    r = p.fit_petab(prob, search=p.MultiStart(seconds=40, max_starts=30), posterior=None, progressbar=False)
    wall = time.perf_counter() - t
    chk = Checks()
    lo, hi = prob.bounds()
    z = r.estimates["refined"].values
    chk.true(np.all((z >= lo - 1e-9) & (z <= hi + 1e-9)), "estimates inside the parameter bounds", "bounds", z)
    chk.true(wall <= 40 * 1.5 + 15, "fit_petab within its 40 s search budget (+ slack)", "budget", wall)
    r.parameter_table()
    r.summary()
    return chk


@case("valid")
def v_petab_fit_bruno_laplace(tmp):
    """fit_petab(Bruno, the notebook's problem) from its path string, Laplace, 50 s search budget."""
    p = pg()
    path = str(COLLECTION / "Bruno_JExpBot2016" / "Bruno_JExpBot2016.yaml")
    r = p.fit_petab(path, search=p.MultiStart(seconds=50), posterior="laplace", seed=0, progressbar=False)
    prob = p.load_petab(path)
    chk = Checks()
    chk.true(r.nll <= prob.nll(prob.nominal_parameters()) + 0.1, "optimum at least as good as the published",
             "nll", r.nll)
    files = r.to_petab(tmp / "out")
    chk.true(all(Path(f).exists() for f in (files.values() if isinstance(files, dict) else files)),
             "to_petab files written", "to_petab", files)
    return chk


# ------------------------------------------------------------------------------------------------ CLI (valid)
@case("valid")
def v_cli_list_info(tmp):
    """pgpgm list and pgpgm info exit 0."""
    a = cli_ok("list")
    cli_ok("info")
    chk = Checks()
    chk.true("lotka-volterra" in a.stdout, "list names lotka-volterra", "list")
    return chk


@case("valid")
def v_cli_fit_dose_t0(tmp):
    """pgpgm fit of a tidy CSV, --x0 A=4.5 C=0 --t0 0, --posterior none: the result file holds x0 at t0."""
    p = pg()
    csv = pk_csv(tmp)
    out = tmp / "res"
    cli_ok("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--observe", "C", "--x0", "A=4.5", "C=0",
           "--t0", "0", "--draws", "300", "--tune", "300", "--posterior", "none", "--no-progress", "--out", out)
    chk = Checks()
    for f in ("parameters.csv", "summary.md", "result.nc"):
        chk.true((out / f).exists(), f"{f} written", f)
    r = p.load_result(out / "result.nc")
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_cli_fit_lognormal_fixed_bounds(tmp):
    """pgpgm fit with --lognormal C, --fixed ke=0.085, --bounds 0 20, --posterior laplace."""
    p = pg()
    csv = pk_csv(tmp)
    out = tmp / "res"
    cli_ok("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--observe", "C", "--x0", "A=4.5", "C=0",
           "--t0", "0", "--lognormal", "C", "--fixed", "ke=0.085", "--bounds", "0", "20", "--draws", "300",
           "--tune", "300", "--posterior", "laplace", "--no-progress", "--out", out)
    r = p.load_result(out / "result.nc")
    chk = Checks()
    chk.close(r.fixed.get("ke", np.nan), 0.085, "fixed ke", key="ke")
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    return chk


@case("valid")
def v_cli_fit_latent_box(tmp):
    """pgpgm fit LV x1 measured, --x0 x2=0.5:10 (unknown latent initial value)."""
    p = pg()
    csv = tmp / "lv.csv"
    to_tidy(lv_data()).to_csv(csv, index=False)
    out = tmp / "res"
    cli_ok("fit", "--model", MODELS / "lotka_volterra.toml", "--data", csv, "--observe", "x1", "--x0", "x2=0.5:10",
           "--draws", "300", "--tune", "300", "--posterior", "none", "--no-progress", "--out", out)
    r = p.load_result(out / "result.nc")
    chk = Checks()
    chk.true(0.5 <= r.x0["x2"] <= 10, "x2(0) inside 0.5:10", "x2", r.x0["x2"])
    return chk


@case("valid")
def v_cli_fit_study_inputs(tmp):
    """pgpgm fit of a study CSV (experiment column) with --inputs and --x0 A=dose column, --posterior none."""
    p = pg()
    th, inp = theoph_subset(after_dose=True)
    data, inputs = tmp / "theoph.csv", tmp / "inputs.csv"
    th.to_csv(data, index=False)
    inp.to_csv(inputs, index=False)
    out = tmp / "res"
    cli_ok("fit", "--model", MODELS / "pk_oral.toml", "--data", data, "--inputs", inputs, "--x0", "A=dose_mg_per_kg",
           "C=0", "--t0", "0", "--noise", "C=lognormal", "--draws", "300", "--tune", "300", "--posterior", "none",
           "--no-progress", "--out", out)
    r = p.load_study(out / "result.nc")
    chk = Checks()
    dose = inp.set_index("experiment")["dose_mg_per_kg"]
    check_study_held(chk, r, {str(e): {"A": float(dose[e]), "C": 0.0} for e in dose.index}, t0=0.0)
    return chk


@case("valid")
def v_cli_run_case(tmp):
    """pgpgm run lotka-volterra --case x1-observed, short budget, --posterior none."""
    out = tmp / "run"
    cli_ok("run", "lotka-volterra", "--case", "x1-observed", "--draws", "300", "--tune", "300", "--posterior", "none",
           "--no-progress", "--out", out)
    chk = Checks()
    chk.true((out / "result.nc").exists(), "result.nc written", "out")
    return chk


@case("valid")
def v_cli_fit_petab(tmp):
    """pgpgm fit --petab (suite case 0002), --posterior none."""
    out = tmp / "res"
    cli_ok("fit", "--petab", SUITE / "0002" / "_0002.yaml", "--posterior", "none", "--no-progress", "--out", out)
    chk = Checks()
    chk.true(out.exists() and any(out.iterdir()), "output folder written", "out")
    return chk

"""Second battery, valid input (studies, PEtab, the command line, many fits): as second_valid, written from the
docs alone. Registered in :data:`common.CASES` on import."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from battery_cases.common import (
    MODELS,
    SUITE,
    Checks,
    chain_toml,
    case,
    check_held,
    cli_ok,
    lv_data,
    lv_spec,
    pg,
    theoph_study,
    to_tidy,
    write,
)
from battery_cases.second_common import (
    QUICK,
    check_fixed,
    pk_lognormal_after_dose,
    settings,
    suite_problem,
    suite_solution,
)


# ------------------------------------------------------------------------------------------------ studies
def _pk_subject(theta, dose, t_dose, seed):
    p = pg()
    pk = p.load_model("pk-oral")
    t = t_dose + np.array([0.25, 0.5, 1.0, 2.0, 4.0, 6.0, 9.0, 12.0, 24.0])
    ds = p.simulate(pk.system, theta, [dose, 0.0], np.r_[t_dose, t], observed=["C"], noise_sd=0.2, seed=seed)
    return pk, ds.sel(time=t)


@case("valid", timeout=180)
def b2_v_study_from_mapping_t0_per_experiment(tmp):
    """Study.from_mapping: two subjects dosed at t = 0 and t = 1, t0 a mapping, x0 per subject: held in joint."""
    p, chk = pg(), Checks()
    pk, d1 = _pk_subject([1.5, 0.085, 0.04], 4.0, 0.0, 1)
    _, d2 = _pk_subject([1.5, 0.085, 0.04], 5.0, 1.0, 2)
    x0 = {"e1": {"A": 4.0, "C": 0.0}, "e2": {"A": 5.0, "C": 0.0}}
    study = p.Study.from_mapping({"e1": d1, "e2": d2}, x0=x0, t0={"e1": 0.0, "e2": 1.0})
    r = p.fit_study(pk.system, study, priors=pk.priors(), posterior=None, **{k: v for k, v in QUICK.items()
                                                                             if k != "posterior"})
    for e, vals in x0.items():
        for s, v in vals.items():
            for est in ("separate", "joint"):
                chk.close(r.estimates["x0"].sel(estimate=est, experiment=e, state=s), v, f"{est} x0 of {s} in {e}",
                          key=s)
    for e, t0 in (("e1", 0.0), ("e2", 1.0)):
        tt = r.trajectories["time"].sel(experiment=e).values
        chk.close(tt[~np.isnan(tt)][0], t0, f"{e}'s trajectories start at its t0", key="t0")
    return chk


@case("valid", timeout=180)
def b2_v_study_fixed_from_column(tmp):
    """Theophylline 3 subjects, fixed={'ke': a column of the inputs}: the joint C trajectory uses each ke."""
    p, chk = pg(), Checks()
    th, inp = p.datasets.theophylline(), p.datasets.theophylline_inputs()
    ids = ["1", "2", "3"]
    th, inp = th[th["experiment"].isin(ids)], inp[inp["experiment"].isin(ids)].copy()
    inp["ke_known"] = [0.08, 0.09, 0.10]
    pk = p.load_model("pk-oral")
    study = p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0}, fixed={"ke": "ke_known"})
    r = p.fit_study(pk.system, study, priors=pk.priors(), posterior=None, draws=300, tune=300)
    tab = r.theta("joint")
    for e, ke, dose in zip(ids, inp["ke_known"], inp["dose_mg_per_kg"]):
        if "ke" in tab.columns:
            chk.close(tab.loc[e, "ke"], ke, f"ke of subject {e}", key="ke")
        tt = r.trajectories["time"].sel(experiment=e).values
        ok = ~np.isnan(tt)
        theta = [float(tab.loc[e, "ka"]), ke, float(tab.loc[e, "CL"])]
        sim = p.simulate(pk.system, theta, [float(dose), 0.0], tt[ok], noise_sd=0.1)  # battery fix: noise_sd needed
        x = r.trajectories["x"].sel(estimate="joint", experiment=e, state="C").values[ok]
        chk.close(x, sim["truth"].sel(state="C").values, f"subject {e}'s joint C solved with its fixed ke", key="ke",
                  rtol=1e-3, atol=1e-3)
    return chk


@case("valid", timeout=180)
def b2_v_study_noise_sd_known_subset(tmp):
    """study.subset(['1', '3']) of theophylline, noise_sd=0.5 known: two experiments, the sd held."""
    p, chk = pg(), Checks()
    _, _, study, pk = theoph_study(("1", "3"))
    r = p.fit_study(pk.system, study, noise_sd=0.5, priors=pk.priors(), posterior=None, draws=300, tune=300)
    chk.true([str(e) for e in r.estimates["experiment"].values] == ["1", "3"], "experiments 1 and 3", key="subset",
             got=list(r.estimates["experiment"].values))
    chk.close(r.estimates["noise_sd"].sel(estimate="joint").values, 0.5, "joint noise sd (given)", key="noise_sd")
    return chk


@case("valid", timeout=240)
def b2_v_study_seed_reproducible(tmp):
    """fit_study twice with seed=4 (steps 1-3): the same joint estimates; the doses held."""
    p, chk = pg(), Checks()
    _, inp, study, pk = theoph_study(("2", "4"))
    kw = dict(priors=pk.priors(), posterior=None, draws=300, tune=300, seed=4)
    a, b = p.fit_study(pk.system, study, **kw), p.fit_study(pk.system, study, **kw)
    chk.close(a.theta("joint").values, b.theta("joint").values, "same seed, same joint theta", key="seed", rtol=0,
              atol=0)
    doses = inp.set_index("experiment")["dose_mg_per_kg"]
    for e in ("2", "4"):
        chk.close(a.estimates["x0"].sel(estimate="joint", experiment=e, state="A"), doses[e], f"A(0) of {e}", key="A")
    return chk


# ------------------------------------------------------------------------------------------------------ PEtab
@case("valid", timeout=180)
def b2_v_petab_suite_fit_laplace_to_petab(tmp):
    """fit_petab(suite 0001, MultiStart(seconds=30), Laplace): nll consistent, inside the bounds, to_petab writes."""
    p, chk = pg(), Checks()
    prob = suite_problem("0001")
    r = p.fit_petab(prob, search=p.MultiStart(seconds=30), posterior="laplace", progressbar=False, seed=1)
    est = r.estimates
    z = est["refined"].values
    chk.true(np.all((z >= est["lower"].values - 1e-9) & (z <= est["upper"].values + 1e-9)), "estimates in bounds",
             key="bounds", got=z)
    chk.close(prob.nll(r.parameters()), r.nll, "problem.nll(result.parameters()) == result.nll", key="nll",
              rtol=1e-6)
    chk.true(r.nll <= prob.nll(prob.nominal_parameters()) + 1e-3, "optimum no worse than nominal", key="nll",
             got=r.nll)
    paths = r.to_petab(tmp / "out")
    chk.true(all(pp.exists() for pp in map(pathlib.Path, dict(paths).values())), "to_petab files",
             key="to_petab", got=paths)
    return chk


@case("valid", timeout=180)
def b2_v_petab_simulate_matches_suite(tmp):
    """problem.simulate(nominal) of suite cases 0001-0020 against their _simulations.tsv (tol_simulations)."""
    chk = Checks()
    for i in range(1, 21):
        n = f"{i:04d}"
        prob = suite_problem(n)
        sol = suite_solution(n)
        mine = prob.simulate(prob.nominal_parameters())["simulation"].to_numpy(dtype=float)
        ref = prob.align(SUITE / n / sol["simulation_files"][0])
        tol = float(sol.get("tol_simulations", 1e-3))
        chk.close(mine, ref, f"suite {n} simulation", key=n, rtol=tol, atol=tol)
    return chk


@case("valid")
def b2_v_petab_chi2_matches_suite(tmp):
    """problem.chi2(nominal) of suite cases 0001-0020 against the solution files' chi2 (tol_chi2)."""
    chk = Checks()
    for i in range(1, 21):
        n = f"{i:04d}"
        prob, sol = suite_problem(n), suite_solution(n)
        chk.close(prob.chi2(prob.nominal_parameters()), sol["chi2"], f"suite {n} chi2", key=n,
                  rtol=0, atol=float(sol.get("tol_chi2", 1e-3)))
    return chk


@case("valid", timeout=180)
def b2_v_petab_gradient_fd_boehm(tmp):
    """Boehm: nll_and_gradient against central differences at a point off the optimum; to/from_scale round trip."""
    from battery_cases.common import COLLECTION

    p, chk = pg(), Checks()
    prob = p.load_petab(COLLECTION / "Boehm_JProteomeRes2014" / "Boehm_JProteomeRes2014.yaml")
    nom = prob.nominal_parameters()
    z = prob.to_scale(nom)
    back = prob.from_scale(z)
    ids = [q.id for q in prob.estimated]
    chk.close([back[i] for i in ids], [nom[i] for i in ids], "from_scale(to_scale(nominal))", key="scale", rtol=1e-12)
    lo, hi = prob.bounds()
    z = np.clip(np.asarray(z) + 0.05, lo, hi)
    f, g = prob.nll_and_gradient(z)
    fd = np.zeros_like(z)
    h = 1e-5
    for k in range(len(z)):
        e = np.zeros_like(z)
        e[k] = h
        fd[k] = (prob.nll_and_gradient(z + e)[0] - prob.nll_and_gradient(z - e)[0]) / (2 * h)
    chk.close(g, fd, "gradient vs central differences", key="gradient", rtol=1e-3, atol=1e-3 * max(1, np.abs(fd).max()))
    return chk


# --------------------------------------------------------------------------------------------- command line
def _lv_csv(tmp):
    path = tmp / "lv.csv"
    to_tidy(lv_data()).to_csv(path, index=False)
    return path


@case("valid", timeout=180)
def b2_v_cli_fit_options_recorded(tmp):
    """pgpgm fit with --seed 3 --chains 3 --kernel matern52 --gamma 0.1 --grid 0 2 41 --x0 x2=3: held in result.nc."""
    p, chk = pg(), Checks()
    out = tmp / "out"
    cli_ok("fit", "--model", MODELS / "lotka_volterra.toml", "--data", _lv_csv(tmp), "--observe", "x1", "--x0",
           "x2=3", "--seed", "3", "--chains", "3", "--kernel", "matern52", "--gamma", "0.1", "--grid", "0", "2", "41",
           "--draws", "300", "--tune", "300", "--posterior", "none", "--out", out, "--no-progress")
    r = p.load_result(out / "result.nc")
    chk.close(settings(r).get("seed"), 3, "seed recorded", key="seed")
    chk.close(r.gradient_matching.posterior.sizes.get("chain"), 3, "step-2 chains", key="chains")
    check_held(chk, r, {"x2": 3.0})
    return chk


@case("valid", timeout=180)
def b2_v_cli_fit_fixed_x0_noise_lognormal(tmp):
    """pgpgm fit pk-oral after the dose: --x0 A=4.5 C=0 --t0 0 --fixed ke=0.085 --noise C=lognormal, Laplace."""
    p, chk = pg(), Checks()
    _, d = pk_lognormal_after_dose()  # battery fix: simulate() had been asked for lognormal noise at t = 0
    csv = tmp / "pk.csv"
    pd.DataFrame({"time": d["time"], "state": "C", "value": d["C"]}).to_csv(csv, index=False)
    out = tmp / "out"
    cli_ok("fit", "--model", MODELS / "pk_oral.toml", "--data", csv, "--observe", "C", "--x0", "A=4.5", "C=0",
           "--t0", "0", "--fixed", "ke=0.085", "--noise", "C=lognormal", "--draws", "300", "--tune", "300",
           "--posterior", "laplace", "--out", out, "--no-progress")
    r = p.load_result(out / "result.nc")
    check_held(chk, r, {"A": 4.5, "C": 0.0}, t0=0.0)
    check_fixed(chk, r, {"ke": 0.085})
    return chk


@case("valid")
def b2_v_cli_sensitivity_out(tmp):
    """pgpgm sensitivity lotka-volterra --out table.csv: exit 0 and a table with a row per parameter or state."""
    chk = Checks()
    cli_ok("sensitivity", "lotka-volterra", "--out", tmp / "t.csv")
    df = pd.read_csv(tmp / "t.csv")
    chk.true(len(df) >= 2, "the table has rows", key="sensitivity", got=len(df))
    return chk


TOML = chain_toml("my-chain", "A -> B, B measured.", 5.0, 20)


@case("valid", timeout=180)
def b2_v_cli_run_own_toml(tmp):
    """pgpgm run my.toml --case B-observed: the case's latent A(0) = 5 held in result.nc."""
    p, chk = pg(), Checks()
    model = write(tmp / "my.toml", TOML)
    out = tmp / "out"
    cli_ok("run", model, "--case", "B-observed", "--draws", "300", "--tune", "300", "--posterior", "none", "--out",
           out, "--no-progress")
    r = p.load_result(out / "result.nc")
    check_held(chk, r, {"A": 5.0})
    return chk


# ------------------------------------------------------------------------------------------------- many fits
@case("valid", timeout=180)
def b2_v_fit_and_save_job_case_defaults(tmp):
    """pgpgm.batch.fit_and_save of a FitJob with the LV spec and its case: the case's x2(0) = 3 held in <name>.nc."""
    p, chk = pg(), Checks()
    spec = lv_spec()
    job = p.FitJob("j1", spec, lv_data(), ("x1",), options=dict(draws=300, tune=300, posterior=None),
                   case="x1-observed")
    row = p.batch.fit_and_save(job, tmp / "out")
    if str(dict(row).get("status", "ok")) not in ("ok", "skipped"):
        raise RuntimeError(f"fit_and_save recorded a failed fit: {dict(row).get('error')}")
    r = p.load_result(tmp / "out" / "j1.nc")
    check_held(chk, r, {"x2": 3.0})
    return chk


@case("valid")
def b2_v_jobs_from_tidy_csv_and_product(tmp):
    """jobs_from_tidy_csv (datasets a, b) and product_jobs (2 data x 1 model x 2 settings): the jobs named."""
    p, chk = pg(), Checks()
    t1, t2 = to_tidy(lv_data(seed=0)), to_tidy(lv_data(seed=1))
    tab = pd.concat([t1.assign(dataset="a"), t2.assign(dataset="b")])[["dataset", "time", "state", "value"]]
    tab.to_csv(tmp / "all.csv", index=False)
    jobs = p.jobs_from_tidy_csv(tmp / "all.csv", "lotka-volterra", observed=["x1"])
    chk.true([j.name for j in jobs] == ["a", "b"], "jobs a and b", key="dataset", got=[j.name for j in jobs])
    pj = p.product_jobs({"d1": t1, "d2": t2}, {"lv": lv_spec()}, {"s1": {"gamma": 0.3}, "s2": {"gamma": 0.1}},
                        observed=["x1"])
    chk.close(len(pj), 4, "2 x 1 x 2 jobs", key="product_jobs")
    chk.true(len({j.name for j in pj}) == 4, "distinct job names", key="product_jobs", got=[j.name for j in pj])
    return chk

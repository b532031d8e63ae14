"""Real studies (issue 31): many subjects, hierarchical models, measurement noise models.

Subcommands (each writes ``results/studies_<subcommand>.{md,json}``; the independent references
are those of ``benchmarks/studies_reference.py``, in ``references/studies_reference_*.json``):

- ``theoph``: the theophylline study (R's Theoph, 12 subjects, pk-oral, C(0) = 0, A(0) = the dose)
  by ``pgpgm.fit_study``: each subject's refined point against the independent 200-start optimum, and
  the hierarchical fit (ka and CL log-normal across subjects, ke shared: nlme's fm3Theo) with step
  4's R-hat, ESS and time, its population estimates beside the published and the exact ML ones.
- ``scaling``: steps 1-3 of a joint fit of K = 1, 3, 12 subjects against the same subjects fitted
  alone, in one process after a warm-up fit (target: at most ~K times one fit).
- ``noise``: lognormal measurement noise with C(0) = 0 on every Theoph subject, and Poisson /
  negative-binomial counts on the 1978 boarding-school influenza and on simulated SIR counts, steps 1-2
  on the counts as they are and (``transform={"I": "log"}``) on log I: ``pgpgm.fit`` steps 1-3 against
  independent optima (the counts' by a scipy multi-start here); a fit that fails is recorded.

    ./run.sh bench studies theoph [--centred] [--draws 500]
    ./run.sh bench studies scaling [--ks 1,3,12]
    ./run.sh bench studies noise [--subjects 1 2 ...]
"""

from __future__ import annotations

import json
import time
import warnings

import harness
import numpy as np
from scipy import optimize, stats
from scipy.integrate import solve_ivp

import pgpgm
from pgpgm import datasets


def _reference(name: str) -> dict | None:
    path = harness.REFERENCES / f"studies_reference_{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _theoph_study():
    return pgpgm.Study.from_tidy(datasets.theophylline(), datasets.theophylline_inputs(),
                                 x0={"A": "dose_mg_per_kg", "C": 0.0})


def theoph(a, env) -> None:
    ref = _reference("theoph")
    spec = pgpgm.load_model("pk-oral")
    study = _theoph_study()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pgpgm.fit_study(spec.system, study, hierarchical={"ka": "lognormal", "CL": "lognormal"},
                              priors=spec.priors(), centred=a.centred,
                              posterior=pgpgm.NUTS(draws=a.draws, tune=a.draws,
                                                   budget=harness.private("pgpgm.steps.options", "STUDY_BUDGET")))
    seconds = time.perf_counter() - t0
    d, post = res.diagnostics, res.posterior.posterior
    row = {"centred": a.centred, "seconds": round(seconds, 1), "rhat_max": float(d["rhat"].max()),
           "ess_bulk_min": float(d["ess_bulk"].min()), "ess_tail_min": float(d["ess_tail"].min()),
           "divergences": int(d.attrs.get("divergences", 0)), "rounds": res.posterior.attrs.get("pgpgm_rounds"),
           "lKa": float(post["mu_ka"].mean()), "lCl": float(post["mu_CL"].mean()),
           "lKe": float(np.log(post["ke"]).mean()), "sd_lKa": float(post["sigma_ka"].mean()),
           "sd_lCl": float(post["sigma_CL"].mean()), "sd_residual": float(post["sigma_C"].mean())}
    sections = {"warnings": [{"warning": str(w.message)[:300]} for w in caught]}
    if ref is not None:
        sep = res.theta("separate")
        per = ref["per_subject"]["normal"]
        sections["each subject alone against the independent multi-start"] = [
            {"subject": s, **{f"{p} rel. diff": float(sep.loc[s, p] / per[s][p] - 1) for p in ("ka", "ke", "CL")},
             "nll diff": float(res.estimates["nll"].sel(estimate="separate", experiment=s).item() - per[s]["nll"])}
            for s in study.names]
        sections["population: exact ML (independent) and published"] = [
            {"fit": k, **{q: v.get(q) for q in ("lKa", "lCl", "lKe", "sd_lKa", "sd_lCl", "sd_residual")}}
            for k, v in {"agq_diag2": ref["population"]["agq_diag2"], **ref["published"]}.items()]
    harness.write(a.out or "studies_theoph", [row], "Theophylline, 12 subjects, hierarchical (ka, CL log-normal)",
                  env=env, sections=sections, notes="seconds: the whole fit_study (steps 1-4); population "
                  "estimates: step 4's posterior means (lKe = mean log ke).")


def scaling(a, env) -> None:
    spec = pgpgm.load_model("pk-oral")
    study = _theoph_study()
    warnings.simplefilter("ignore")
    pgpgm.fit_study(spec.system, study.subset(study.names[:1]), priors=spec.priors(), posterior=None)  # warm-up
    alone = {}
    for name in study.names:
        t0 = time.perf_counter()
        pgpgm.fit_study(spec.system, study.subset([name]), priors=spec.priors(), posterior=None)
        alone[name] = time.perf_counter() - t0
    rows = []
    for k in map(int, a.ks.split(",")):
        t0 = time.perf_counter()
        pgpgm.fit_study(spec.system, study.subset(study.names[:k]), priors=spec.priors(), posterior=None)
        sec = time.perf_counter() - t0
        total = sum(alone[n] for n in study.names[:k])
        rows.append({"K": k, "seconds": round(sec, 3), "sum_alone_s": round(total, 3),
                     "ratio_to_sum_alone": round(sec / total, 3),
                     "ratio_to_K_x_first": round(sec / (k * alone[study.names[0]]), 3)})
    harness.write(a.out or "studies_scaling", rows, "Steps 1-3 of a joint fit of K subjects", env=env,
                  notes="Target: at most ~K times one fit (ratio_to_sum_alone <= ~1).")


def _sir_i(t, beta, gamma):
    """I(t) of the SIR model (N = 763, (S, I, R)(0) = (762, 1, 0)) by a tight independent solve."""
    def f(_, y):
        s, i = y[0], y[1]
        return [-beta * s * i / 763.0, beta * s * i / 763.0 - gamma * i]

    sol = solve_ivp(f, (0.0, float(t[-1])), [762.0, 1.0], t_eval=t, rtol=1e-10, atol=1e-10, method="LSODA")
    return sol.y[1]


def _count_nll(q, t, y, noise):
    beta, gamma = np.exp(q[:2])
    mu = np.maximum(_sir_i(t, beta, gamma), 1e-300)
    m = np.isfinite(y)
    if noise == "poisson":
        return -stats.poisson.logpmf(y[m], mu[m]).sum()
    alpha = np.exp(q[2])
    return -stats.nbinom.logpmf(y[m], alpha, alpha / (alpha + mu[m])).sum()


def count_reference(t, y, noise, n_starts=8, seed=0):
    """The best of ``n_starts`` Nelder-Mead fits of the count likelihood: (nll, (beta, gamma[, alpha]))."""
    rng = np.random.default_rng(seed)
    best = None
    for _ in range(n_starts):
        q0 = np.log(rng.uniform([0.5, 0.1, 1.0], [5.0, 2.0, 50.0]))[: 2 if noise == "poisson" else 3]
        r = optimize.minimize(_count_nll, q0, args=(t, y, noise), method="Nelder-Mead",
                              options={"xatol": 1e-10, "fatol": 1e-10, "maxiter": 20000})
        if best is None or r.fun < best[0]:
            best = (float(r.fun), np.exp(r.x))
    return best


def noise(a, env) -> None:
    ref = (_reference("theoph") or {}).get("per_subject", {}).get("lognormal")
    pk, sir = pgpgm.load_model("pk-oral").system, pgpgm.load_model("sir").system
    data, doses = datasets.theophylline(), datasets.theophylline_inputs().set_index("experiment")["dose_mg_per_kg"]
    rows = []
    for s in a.subjects if ref is not None else []:
        d = data[data.experiment == s]
        t, y = d.time.to_numpy(), d.value.to_numpy().copy()
        y[t == 0] = np.nan  # the pre-dose sample: C(0) = 0 is known, the measurement is not lognormal
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pgpgm.fit(pk, {"time": t, "C": y}, ["C"], x0={"A": float(doses[s]), "C": 0.0},
                          noise={"C": "lognormal"}, priors={"ka": (0, 10), "ke": (0, 1), "CL": (0, 0.5)},
                          posterior=None, progressbar=False, seed=0)
        want = np.array([ref[s]["ka"], ref[s]["ke"], ref[s]["CL"]])
        rows.append({"case": f"theoph {s} lognormal", "seconds": round(time.perf_counter() - t0, 2),
                     "nll": r.estimates.attrs["refinement_nll"], "nll_reference": ref[s]["nll"],
                     "max_rel_theta": float(np.max(np.abs(r.theta / want - 1)))})
    flu = datasets.influenza_boarding_school()
    t, y = np.r_[0.0, flu.time.to_numpy()], np.r_[np.nan, flu.in_bed.to_numpy().astype(float)]
    sets = [("flu", y)]
    for seed in range(a.sir_seeds):  # simulated SIR counts, (beta, gamma) = (1.7, 0.45), I(0) = 1 known
        sim = pgpgm.simulate(sir, [1.7, 0.45], [762.0, 1.0, 0.0], t, observed=["I"], noise="poisson", seed=seed)
        ys = sim["y"].values[:, 0].copy()
        ys[0] = np.nan
        sets.append((f"sir seed {seed}", ys))
    for label, y in sets:
        for model in ("poisson", "negbin"):
            nll, want = count_reference(t, y, model)
            # steps 1-2 on the counts as they are, and (transform="log") the GP and matching on log I
            for scale, extra in (("natural", {}), ("log I", {"transform": {"I": "log"}})):
                t0 = time.perf_counter()
                row = {"case": f"{label} {model} ({scale})", "nll_reference": nll}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        r = pgpgm.fit(sir, {"time": t, "I": y}, ["I"], x0={"S": 762.0, "R": 0.0, "I": 1.0},
                                      noise={"I": model}, priors=(0.0, 10.0),
                                      posterior=None, progressbar=False, seed=0, **extra)
                    except pgpgm.PgpgmError as err:  # recorded, not hidden
                        rows.append({**row, "seconds": round(time.perf_counter() - t0, 2), "nll": float("nan"),
                                     "max_rel_theta": float("nan"), "error": f"{type(err).__name__}: {str(err)[:200]}"})
                        continue
                got = np.r_[r.theta, r.trajectories["noise_sd"].values if model == "negbin" else []]
                rows.append({**row, "seconds": round(time.perf_counter() - t0, 2),
                             "nll": r.estimates.attrs["refinement_nll"],
                             "max_rel_theta": float(np.max(np.abs(got / want - 1))), "error": ""})
    harness.write(a.out or "studies_noise", rows, "Measurement noise models: pgpgm.fit steps 1-3 against independent "
                  "optima", env=env, notes="nll: the refined negative log likelihood; max_rel_theta: the largest "
                  "relative difference of the parameters (and alpha) from the reference optimum.")


def main() -> None:
    ap = harness.parser(__doc__, "")
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("theoph", help="the hierarchical theophylline fit")
    t.add_argument("--draws", type=int, default=500)
    t.add_argument("--centred", action="store_true")
    s = sub.add_parser("scaling", help="steps 1-3 of K subjects jointly vs alone")
    s.add_argument("--ks", default="1,3,12")
    n = sub.add_parser("noise", help="lognormal and count likelihoods against independent optima")
    n.add_argument("--subjects", nargs="*", default=[str(i) for i in range(1, 13)])
    n.add_argument("--sir-seeds", type=int, default=2, help="simulated SIR count data sets (Poisson noise)")
    a = ap.parse_args()
    {"theoph": theoph, "scaling": scaling, "noise": noise}[a.what](a, harness.environment())


if __name__ == "__main__":
    main()

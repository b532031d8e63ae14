"""Simulation-based calibration of the default posterior (issue 74) on four model classes.

For each data set: the parameters drawn from the very prior the fit uses, data simulated, the default fit
(steps 1-4, the default NUTS within its default budget), and the truth's rank among step 4's draws
(:mod:`pgpgm.posterior.calibration`). Every initial value and noise sd the fit is told is the simulation's, so
that the fit's prior is a proper prior the truth is drawn from (pgpgm centres the prior of an estimated observed
initial value and of an estimated noise sd on the data, which no simulation can draw from first).

Classes: ``fhn-R`` (FitzHugh-Nagumo, R observed, a, b, c), ``lv-x1`` (Lotka-Volterra, x1 observed, x2(0) unknown
in its box), ``sir-poisson`` (SIR, Poisson counts of I), ``pk-hier`` (pk-oral, 6 subjects, ka and CL
hierarchical: their population priors given to the fit and drawn from here).

    ./run.sh bench calibration run --class fhn-R --sets 100 [--seed-offset 0]   # resumable: appends records
    ./run.sh bench calibration report                                            # table and rank histograms

Records go to ``benchmarks/results/calibration_<class>.jsonl``; ``report`` writes ``calibration.md`` and
``calibration.png`` there. A failed fit is recorded as such and counted, never ends the run; so is one whose step 4 could not start or left
fewer draws than a rank needs (statuses "no_posterior", "too_few_draws"): the table counts them beside the ranks.
"""

from __future__ import annotations

import json
import time
import traceback
import warnings

import harness
import numpy as np
import pandas as pd

import pgpgm

#: the draws a rank is taken among (pgpgm.calibration_record refuses fewer)
RANK_DRAWS = harness.private("pgpgm.posterior.calibration", "RANK_DRAWS")


#: the default fit with nothing the user need not say, but a quiet progress bar
FIT = dict(progressbar=False)


def _box(spec, case: str) -> dict[str, tuple[float, float]]:
    """The case's Uniform prior box by parameter (what the fit is given and the truth is drawn from)."""
    bounds = pgpgm.Priors.from_user(spec.system.parameters, spec.priors(case)).bounds
    return {p: (float(lo), float(hi)) for p, (lo, hi) in zip(spec.system.parameters, bounds)}


def _drawn(model: str, case_name: str, rng):
    """The model, its case, the case's prior box and parameters drawn uniformly from that box."""
    spec = pgpgm.load_model(model)
    box = _box(spec, case_name)
    return spec, spec.case(case_name), box, {p: rng.uniform(*box[p]) for p in spec.system.parameters}


def _step4(r):
    """A fit's step-4 draws; None where step 4 could not start (the result then holds step 2's chains, warned)."""
    return r.posterior if "posterior" in r.diagnostics["sampler"].values else None


def fhn(rng, seed):
    spec, case, box, theta = _drawn("fitzhugh-nagumo", "R-observed", rng)
    x0 = dict(zip(spec.system.states, map(float, case.x0)))
    data = pgpgm.simulate(spec.system, list(theta.values()), case.x0, case.times, observed=["R"], noise_sd=0.1,
                          seed=seed)
    r = pgpgm.fit(spec.system, data, ["R"], x0=x0, noise_sd=0.1, priors=box, seed=seed, **FIT)
    return _step4(r), theta


def lv(rng, seed):
    spec, case, box, theta = _drawn("lotka-volterra", "x1-observed", rng)
    x2 = rng.uniform(0.0, 10.0)
    data = pgpgm.simulate(spec.system, list(theta.values()), [case.x0[0], x2], case.times, observed=["x1"],
                          noise_sd=0.1, seed=seed)
    r = pgpgm.fit(spec.system, data, ["x1"], x0={"x1": float(case.x0[0]), "x2": (0.0, 10.0)}, noise_sd=0.1,
                  priors=box, seed=seed, **FIT)
    return _step4(r), {**theta, "x2_0": x2}


def sir(rng, seed):
    spec, case, box, theta = _drawn("sir", "I-observed", rng)
    x0 = dict(zip(spec.system.states, map(float, case.x0)))
    data = pgpgm.simulate(spec.system, list(theta.values()), case.x0, case.times, observed=["I"], noise="poisson",
                          seed=seed)
    r = pgpgm.fit(spec.system, data, ["I"], x0=x0, noise="poisson", priors=box, seed=seed, **FIT)
    return _step4(r), theta


#: pk-hier: the population priors of log ka and log CL the fit is given and the truth is drawn from
POPULATION = {"ka": (np.log(1.5), 0.3, 0.3), "CL": (np.log(0.04), 0.3, 0.3)}  # (mean of mu, sd of mu, scale of sigma)


def pk_hier(rng, seed):
    import pymc as pm

    spec = pgpgm.load_model("pk-oral")
    times = np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
    ke = rng.uniform(0.05, 0.15)
    truth, subjects = {"ke": ke}, {}
    for p, (m, s, scale) in POPULATION.items():
        truth[f"mu_{p}"], truth[f"sigma_{p}"] = rng.normal(m, s), abs(rng.normal(0.0, scale))
    doses = rng.uniform(3.0, 6.0, 6)
    for j, dose in enumerate(doses):
        ka, cl = (float(np.exp(truth[f"mu_{p}"] + truth[f"sigma_{p}"] * rng.standard_normal())) for p in ("ka", "CL"))
        d = pgpgm.simulate(spec.system, [ka, ke, cl], [dose, 0.0], np.r_[0.0, times], observed=["C"], noise_sd=0.2,
                           seed=seed * 10 + j)
        subjects[f"s{j}"] = pd.DataFrame({"time": times, "C": d["y"].sel(observed="C").values[1:]})
    priors = {}
    for p, (m, s, scale) in POPULATION.items():
        priors[f"mu_{p}"] = lambda name, m=m, s=s: pm.Normal(name, m, s)
        priors[f"sigma_{p}"] = lambda name, scale=scale: pm.HalfNormal(name, scale)
    study = pgpgm.Study.from_mapping(subjects, x0={f"s{j}": {"A": float(d), "C": 0.0} for j, d in enumerate(doses)},
                                     t0=0.0)
    r = pgpgm.fit_study(spec.system, study, hierarchical={"ka": "lognormal", "CL": "lognormal"},
                        priors={"ka": (0.0, 20.0), "ke": (0.05, 0.15), "CL": (0.0, 0.5)}, noise_sd=0.2,
                        population_priors=priors, seed=seed)
    return r.posterior, truth


CLASSES = {"fhn-R": fhn, "lv-x1": lv, "sir-poisson": sir, "pk-hier": pk_hier}


def run(name: str, sets: int, offset: int) -> None:
    path = harness.RESULTS / f"calibration_{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["set"] for line in path.read_text().splitlines()} if path.exists() else set()
    for k in range(offset, offset + sets):
        if k in done:
            continue
        rng = np.random.default_rng(10_000 + k)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                posterior, truth = CLASSES[name](rng, k)
            n = 0 if posterior is None else int(posterior.posterior.sizes["chain"] * posterior.posterior.sizes["draw"])
            if posterior is None:  # step 4 could not start (the fit warned and returned steps 1-3)
                row = {"set": k, "status": "no_posterior"}
            elif n < RANK_DRAWS:  # the budget left too few draws to rank the truth among: counted on its own
                row = {"set": k, "status": "too_few_draws", "draws": n}
            else:
                row = {"set": k, "status": "ok", **pgpgm.calibration_record(posterior, truth)}
        except Exception as exc:  # noqa: BLE001  (a failed fit is counted, the run goes on)
            row = {"set": k, "status": "failed", "failed": f"{type(exc).__name__}: {exc}",
                   "trace": traceback.format_exc()[-2000:]}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(name, k, row["status"], row["seconds"], flush=True)


def status(record: dict) -> str:
    """"ok", "too_few_draws" (step 4 returned fewer draws than a rank needs), "no_posterior" (step 4 could not
    start) or "failed" (the fit raised);
    records written before the status was (a too-short posterior then failed in the rank) read the same."""
    if "status" in record:
        return record["status"]
    if "failed" not in record:
        return "ok"
    return "too_few_draws" if "a rank needs at least" in record["failed"] else "failed"


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, panels = [], []
    for name in CLASSES:
        path = harness.RESULTS / f"calibration_{name}.jsonl"
        if not path.exists():
            continue
        records = [json.loads(line) for line in path.read_text().splitlines()]
        good = [r for r in records if status(r) == "ok"]
        short = sum(status(r) in ("too_few_draws", "no_posterior") for r in records)
        names = sorted({n for r in good for n in r["truth"]})
        if len(good) < 20:
            print(f"{name}: {len(good)} data sets, fewer than 20: no table yet")
            continue
        table = pgpgm.calibration_table(good, names)
        for p, t in table.iterrows():
            rows.append({"class": name, "parameter": p, **t.to_dict(), "no_or_too_few_draws": short,
                         "failed_fits": len(records) - len(good) - short})
            panels.append((name, p, [r["rank"][p] for r in good], good[0]["rank_of"]))
    if not rows:
        print("no class has 20 data sets yet")
        return
    harness.write("calibration", rows, "Simulation-based calibration of the default posterior",
                  notes="ranks among thinned draws (rank_of); uniform: chi-square p > 0.01 / parameters "
                        "(Bonferroni); covers: the 90 % intervals' coverage inside its 99 % binomial band")
    cols = 4
    fig, axes = plt.subplots(-(-len(panels) // cols), cols, figsize=(3.2 * cols, 2.4 * -(-len(panels) // cols)),
                             squeeze=False)
    for ax, (name, p, ranks, of) in zip(axes.flat, panels):
        ax.hist(ranks, bins=10, range=(0, of + 1))
        ax.axhline(len(ranks) / 10, color="k", lw=0.8)
        ax.set_title(f"{name}: {p}", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(harness.RESULTS / "calibration.png", dpi=100)


def main() -> None:
    ap = harness.parser(__doc__, "calibration")
    ap.add_argument("what", choices=("run", "report"))
    ap.add_argument("--class", dest="name", choices=sorted(CLASSES), default="fhn-R")
    ap.add_argument("--sets", type=int, default=100)
    ap.add_argument("--seed-offset", type=int, default=0, help="the first data set's index (shards: 0, 100, ...)")
    a = ap.parse_args()
    if a.what == "run":
        run(a.name, a.sets, a.seed_offset)
    else:
        report()


if __name__ == "__main__":
    main()

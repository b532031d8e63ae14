"""Robustness of steps 1-3: does a default fit reach the global optimum on the settings a user picks?

A seeded random design over systems (the shipped models and four more from the literature),
kernels, prior boxes (tight to ten times wider than the truth, and pgpgm's default), numbers
of points (20-200), noise levels (1-20 %), known or unknown latent initial values, Gaussian or
lognormal noise, and seeds. A *problem* is one data set with one prior box, one set of unknown
initial values and one noise model; several fits (kernels x fit seeds) share it, and its
reference global optimum comes from an independent multi-start (:mod:`robustness_reference`:
500 starts of scipy's trf and dogbox from a Latin hypercube over the prior box, its own
residuals and profile likelihood, not pgpgm.refine).

Each fit is a plain default call ``pgpgm.fit(system, data, observed, kernel=..., priors=box,
x0=..., noise=..., seed=s, posterior=None, progressbar=False)``; its refined negative log
likelihood ``estimates.attrs["refinement_nll"]`` is compared with the reference: at the global
optimum when within 1e-6 relative (see :func:`robustness_reference.same_optimum`), or better
than the reference (counted as at the optimum and flagged: the reference missed it).

Targets (issue 29): the global optimum in >= 99.5 % of the grid's fits and >= 98 % in every class;
steps 1-3 faster on the median than the independent multi-start reaching the optimum with 95 %
probability (``report`` gives both; this replaces the former ``vs_multistart.py``).

Commands (run from the repository root; the fits use whatever ``pgpgm`` is importable)::

    ./run.sh bench robustness report                              # the same as below

    python benchmarks/robustness.py design [--only ID ...] [--where k=v ...]   # the grid
    python benchmarks/robustness.py reference [--limit N] ...    # reference optima (cached)
    python benchmarks/robustness.py fits [--limit N] [--out FILE] ...   # fits (resumable)
    python benchmarks/robustness.py report [--out FILE]          # robustness.md from the rows
    python benchmarks/robustness.py --only fhn-issue-rbf-s0       # one fit, printed
    python benchmarks/robustness.py baseline --preface FILE     # the misses, for the notes

Runs used for the committed results (one process each, ``nice -n 10``; the second reference run
takes problems the first has not claimed)::

    nice -n 10 python benchmarks/robustness.py reference --cheap-first &
    nice -n 12 python benchmarks/robustness.py reference --cheap-first \
        --references benchmarks/results/robustness_reference_b.jsonl &
    nice -n 10 python benchmarks/robustness.py fits --follow &   # as the references come in

Grid: 36 problems of the design (4 per system, seeded) and the issue's own case, each fitted with
3 kernels x 4 fit seeds: 444 fits. The fit rows record the NLL, theta, initial values, steps
1-3 times, step 2's iterations and stop reason; ``report`` judges them against the references.

Selection: ``--only`` fit or problem ids, ``--where factor=level`` (e.g. ``--where system=seir
--where box=x10``), ``--limit N`` (first N problems after filtering). Fits whose problem has no
reference yet are skipped by ``fits`` unless ``--no-reference-needed``. Rows are appended to
``benchmarks/results/robustness.jsonl`` (one JSON object per fit; a rerun skips ids already
there, so a run can be stopped and resumed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import harness
import pgpgm
import robustness_reference as rr

RESULTS = harness.RESULTS
ROWS = RESULTS / "robustness.jsonl"
REFERENCES = RESULTS / "robustness_reference.jsonl"
REPORT = RESULTS / "robustness.md"

KERNELS = ("rbf", "matern52", "sigmoid")
FIT_SEEDS = (0, 1, 2, 3)
POINTS = (20, 50, 100, 200)
NOISE = (0.01, 0.05, 0.2)
BOXES = ("tight", "x3", "x10", "default")
N_PROBLEMS = 36
DESIGN_SEED = 2026


@dataclass(frozen=True)
class SystemSetting:
    """One system of the grid: a model file's case, its time span, the latent state whose
    initial value is made unknown (with its prior box), and the observed states of its
    lognormal variant (None: some observed value is not positive, so no lognormal noise)."""

    key: str
    model: str
    case: str
    stop: float
    unknown: str
    unknown_box: tuple[float, float]
    lognormal_observed: tuple[str, ...] | None


SYSTEMS: tuple[SystemSetting, ...] = (
    SystemSetting("lv", "lotka-volterra", "x1-observed", 2.0, "x2", (0.0, 10.0), ("x1",)),
    SystemSetting("fhn", "fitzhugh-nagumo", "R-observed", 10.0, "V", (-3.0, 3.0), None),
    SystemSetting("pt", "protein-transduction", "R-latent", 100.0, "R", (0.0, 3.0), None),
    SystemSetting("goodwin", "goodwin", "X-Z-observed", 20.0, "Y", (0.0, 6.0), ("X", "Z")),
    SystemSetting("pk", "pk-infusion", "C-observed", 24.0, "Ce", (0.0, 5.0), None),
    SystemSetting("repr", "repressilator", "proteins-observed", 15.0, "m1", (0.0, 30.0), ("p1", "p2", "p3")),
    SystemSetting("rm", "rosenzweig-macarthur", "N-observed", 40.0, "P", (0.0, 6.0), ("N",)),
    SystemSetting("seir", "seir", "I-R-observed", 60.0, "Ex", (0.0, 0.02), ("I",)),
    SystemSetting("mm", "michaelis-menten", "S-P-observed", 40.0, "Enz", (0.0, 3.0), ("S",)),
)
BY_KEY = {s.key: s for s in SYSTEMS}


@dataclass(frozen=True)
class ProblemSetting:
    """One data set with its prior box, unknown initial values and noise model."""

    id: str
    system: str
    points: int
    noise_level: float
    box: str
    x0: str  # "known" or "unknown"
    noise: str  # "normal" or "lognormal"
    data_seed: int


@dataclass(frozen=True)
class FitSetting:
    id: str
    problem: ProblemSetting
    kernel: str
    seed: int

    def factors(self) -> dict:
        p = self.problem
        return {"system": p.system, "kernel": self.kernel, "box": p.box, "points": p.points,
                "noise_level": p.noise_level, "x0": p.x0, "noise": p.noise, "seed": self.seed}


def box_of(setting: SystemSetting, box: str) -> np.ndarray | None:
    """(P, 2) prior box of a level: tight (truth x [0.5, 2]), x3 / x10 ((0, 3 or 10 x truth)),
    default (None: pgpgm's (0, 10) for every parameter)."""
    theta = pgpgm.load_model(setting.model).case(setting.case).theta
    if box == "default":
        return None
    if box == "tight":
        return np.column_stack([0.5 * theta, 2.0 * theta])
    factor = {"x3": 3.0, "x10": 10.0}[box]
    return np.column_stack([np.zeros_like(theta), factor * theta])


def default_box_fits(setting: SystemSetting) -> bool:
    """pgpgm's default box (0, 10) holds the truth with room to spare (every value below 5)."""
    return bool(np.all(pgpgm.load_model(setting.model).case(setting.case).theta < 5.0))


def design() -> list[ProblemSetting]:
    """The seeded random design: systems cycled, every other factor balanced by shuffled
    repetition of its levels, re-drawn where a level does not apply (lognormal noise needs
    positive observed values, the default box must hold the truth)."""
    rng = np.random.default_rng(DESIGN_SEED)

    def balanced(levels, n):
        out = np.array(list(levels) * (n // len(levels) + 1), dtype=object)[:n]
        return list(out[rng.permutation(n)])

    n = N_PROBLEMS
    points, noise, boxes = balanced(POINTS, n), balanced(NOISE, n), balanced(BOXES, n)
    x0s = balanced(("known", "unknown"), n)
    problems = []
    for i in range(n):
        s = SYSTEMS[i % len(SYSTEMS)]
        box = boxes[i]
        if box == "default" and not default_box_fits(s):
            box = ("tight", "x3", "x10")[i % 3]
        # lognormal on every third problem where it applies
        noise_model = "lognormal" if s.lognormal_observed and (i // len(SYSTEMS)) % 3 == 1 else "normal"
        problems.append(ProblemSetting(f"{s.key}-{i:03d}", s.key, int(points[i]), float(noise[i]), box, x0s[i],
                                       noise_model, 1000 + i))
    return problems


#: The issue's own case (issue 29): FitzHugh-Nagumo, R observed, 100 points, snr 100 (10 % noise),
#: data seed 0, pgpgm's default box; its default fit (rbf, seed 0) is ``fhn-issue-rbf-s0``.
ISSUE_PROBLEM = ProblemSetting("fhn-issue", "fhn", 100, 0.1, "default", "known", "normal", 0)


def problems() -> list[ProblemSetting]:
    """The grid's problems: the random design and the issue's own case."""
    return [ISSUE_PROBLEM, *design()]


def fits_of(problem: ProblemSetting) -> list[FitSetting]:
    return [FitSetting(f"{problem.id}-{k}-s{s}", problem, k, s) for k in KERNELS for s in FIT_SEEDS]


def observed_of(problem: ProblemSetting) -> list[str]:
    s = BY_KEY[problem.system]
    spec = pgpgm.load_model(s.model)
    return list(s.lognormal_observed if problem.noise == "lognormal" else spec.case(s.case).observed)


def make_data(problem: ProblemSetting):
    """The problem's simulated data set (pgpgm.simulate, seeded): the case's theta and x0, n
    equally spaced times over the system's span, Gaussian noise of sd = level x the state's RMS
    (snr = 1 / level^2) or lognormal noise of sd level on log y."""
    s = BY_KEY[problem.system]
    spec = pgpgm.load_model(s.model)
    c = spec.case(s.case)
    times = np.linspace(0.0, s.stop, problem.points)
    noise = dict(snr=float(np.round(1.0 / problem.noise_level**2, 9))) if problem.noise == "normal" else \
        dict(noise_sd=problem.noise_level, noise="lognormal")
    return spec.system, pgpgm.simulate(spec.system, c.theta, c.x0, times, observed=observed_of(problem),
                                       seed=problem.data_seed, **noise)


def reference_problem(problem: ProblemSetting) -> rr.MultiStartProblem:
    """The likelihood problem that the reference multi-start solves."""
    s = BY_KEY[problem.system]
    system, data = make_data(problem)
    observed = observed_of(problem)
    box = box_of(s, problem.box)
    if box is None:
        box = np.tile([0.0, 10.0], (system.n_parameters, 1))
    unknown = {s.unknown: s.unknown_box} if problem.x0 == "unknown" else {}
    return rr.MultiStartProblem(system, data.time.values, data.y.values,
                                tuple(system.states.index(o) for o in observed), np.asarray(data.attrs["x0"]),
                                box, {system.states.index(k): v for k, v in unknown.items()},
                                lognormal=problem.noise == "lognormal")


def data_hash(problem: ProblemSetting) -> str:
    _, data = make_data(problem)
    return hashlib.sha256(np.round(data.y.values, 12).tobytes()).hexdigest()[:16]


def fit_kwargs(fit: FitSetting) -> dict:
    """The keyword arguments of the fit's pgpgm.fit call (besides system, data, observed)."""
    p = fit.problem
    s = BY_KEY[p.system]
    spec = pgpgm.load_model(s.model)
    system = spec.system
    box = box_of(s, p.box)
    kw = dict(kernel=fit.kernel, seed=fit.seed, posterior=None, progressbar=False)
    if box is not None:
        kw["priors"] = {name: (float(lo), float(hi)) for name, (lo, hi) in zip(system.parameters, box)}
    if p.x0 == "unknown":
        x0 = dict(zip(system.states, spec.case(s.case).x0.tolist()))
        observed = observed_of(p)
        kw["x0"] = {k: (s.unknown_box if k == s.unknown else v) for k, v in x0.items() if k not in observed}
    if p.noise == "lognormal":  # the states themselves on the log scale, as these references were computed
        kw["noise"] = "lognormal"  # (noise="lognormal" alone is the measurement model since issue 31)
        kw["transform"] = dict.fromkeys(observed_of(p), "log")
    return kw


def run_fit(fit: FitSetting) -> dict:
    """One default fit; its row (settings, refined NLL and theta, steps 1-3 time)."""
    system, data = make_data(fit.problem)
    kw = fit_kwargs(fit)
    t0 = time.perf_counter()
    error = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = pgpgm.fit(system, data, observed_of(fit.problem), **kw)
        except Exception as err:  # a failed fit is a miss, recorded with its error
            result, error = None, f"{type(err).__name__}: {err}"
    wall = time.perf_counter() - t0
    row = {"id": fit.id, "problem": fit.problem.id, **fit.factors(), "data_seed": fit.problem.data_seed,
           "pgpgm": str(Path(pgpgm.__file__).parent.parent), "wall": wall, "error": error}
    if result is not None:
        t = result.timings
        est = result.estimates
        row.update(nll=float(est.attrs["refinement_nll"]), steps13=float(t["gp"] + t["sampling"] + t["refinement"]),
                   gp=float(t["gp"]), sampling=float(t["sampling"]), refinement=float(t["refinement"]),
                   theta=est["theta"].sel(estimate="refined").values.tolist(),
                   x0_refined=est["x0"].values.tolist(),
                   iterations=np.asarray(est.attrs["sampling_iterations"]).tolist(),
                   stop_reason=str(est.attrs["sampling_stop_reason"]))
    else:
        row.update(nll=float("inf"), steps13=float("nan"), theta=None)
    return row


# ---------------------------------------------------------------------------------------- storage
def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def references(path: Path = REFERENCES) -> dict[str, dict]:
    """Reference rows by problem id; for the grid's file, with those of its siblings
    ``robustness_reference_*.jsonl`` (written by a second reference run, ``--reverse``)."""
    paths = [path]
    if path.resolve() == REFERENCES.resolve():
        paths += sorted(RESULTS.glob("robustness_reference_*.jsonl"))
    return {r["problem"]: r for p in paths for r in read_jsonl(p)}


def append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------------------- selection
def select(args) -> list[ProblemSetting]:
    problems = globals()["problems"]()
    only = set(args.only or [])
    if only:
        problems = [p for p in problems if p.id in only or any(f.id in only for f in fits_of(p))]
    for cond in args.where or []:
        key, _, value = cond.partition("=")
        if key in ("kernel", "seed"):
            continue  # fit-level factors: applied in select_fits
        problems = [p for p in problems if str(getattr(p, key)) == value]
    return problems[: args.limit] if args.limit else problems


def select_fits(args, problems) -> list[FitSetting]:
    """The selected fits, seed-major (every problem and kernel with seed 0 first, then seed 1, ...),
    so that a run cut short covers every problem."""
    only = set(args.only or [])
    fits = sorted((f for p in problems for f in fits_of(p)), key=lambda f: f.seed)
    if only and any(f.id in only for f in fits):
        fits = [f for f in fits if f.id in only or f.problem.id in only]
    for cond in args.where or []:
        key, _, value = cond.partition("=")
        if key in ("kernel", "seed"):
            fits = [f for f in fits if str(getattr(f, key)) == value]
    return fits


# ---------------------------------------------------------------------------------------- commands
def problem_by_id(pid: str) -> ProblemSetting:
    return {p.id: p for p in problems()}[pid]


def fit_by_id(fid: str) -> FitSetting:
    return {f.id: f for p in problems() for f in fits_of(p)}[fid]


#: rough cost of one multi-start start per observation (relative), by system: the order of
#: ``reference --cheap-first``
_COST = {"lv": 1, "fhn": 1, "pk": 1, "seir": 2, "rm": 2, "mm": 5, "pt": 5, "goodwin": 5, "repr": 20}


def expected_cost(p: ProblemSetting) -> float:
    return _COST[p.system] * p.points * (2 if p.noise == "lognormal" else 1)


def cmd_design(args) -> None:
    for p in select(args):
        print(json.dumps(asdict(p)))


def cmd_reference(args) -> None:
    out = Path(args.references)
    grid_run = out.parent.resolve() == RESULTS.resolve()  # the grid's files (a second run: ..._b.jsonl)
    claims = Path(tempfile.gettempdir()) / "pgpgm_robustness_claims"  # problems a reference run has taken
    claims.mkdir(parents=True, exist_ok=True)
    todo = select(args)
    if args.cheap_first:
        todo = sorted(todo, key=expected_cost)
    for p in (todo[::-1] if args.reverse else todo):
        main = references(REFERENCES)  # re-read: another reference run may have done it meanwhile
        if p.id in references(out) or (grid_run and p.id in main):
            continue
        if grid_run:  # one run per problem: claim it (a second run skips it)
            try:
                (claims / p.id).open("x").close()
            except FileExistsError:
                continue
        if p.id in main and main[p.id]["data_hash"] == data_hash(p):  # a test's reference: the grid's row
            append(out, main[p.id])
            print(f"{p.id}: copied from the grid's references")
            continue
        t0 = time.perf_counter()
        ref = rr.multistart(reference_problem(p), n_starts=args.starts, seed=p.data_seed)
        row = {"problem": p.id, "settings": asdict(p), "data_hash": data_hash(p), "algorithm": 2, **ref.as_dict(),
               "wall": time.perf_counter() - t0}
        append(out, row)
        print(f"{p.id}: nll {ref.nll:.8g}, {ref.n_reached}/{ref.n_starts} starts reached it, "
              f"{ref.time_per_start * 1e3:.0f} ms/start, {row['wall']:.0f} s", flush=True)


def cmd_fits(args) -> None:
    out = Path(args.out)
    while True:
        ran = _fits_pass(args, out)
        todo = [f for f in select_fits(args, select(args)) if f.id not in {r["id"] for r in read_jsonl(out)}]
        if not args.follow or not todo:
            return
        if not ran:
            time.sleep(30)  # waiting for the reference run to reach the next problem


def _fits_pass(args, out: Path) -> int:
    done = {r["id"] for r in read_jsonl(out)}
    refs = references(Path(args.references))
    ran = 0
    for f in select_fits(args, select(args)):
        if f.id in done:
            continue
        if f.problem.id not in refs and not args.no_reference_needed:
            continue
        ran += 1
        row = run_fit(f)
        ref = refs.get(f.problem.id)
        if ref is not None:
            row.update(judge(row, ref))
        append(out, row)
        print(f"{f.id}: nll {row['nll']:.8g} ref {ref['nll'] if ref else float('nan'):.8g} "
              f"{row.get('verdict', '')} {row.get('steps13', float('nan')):.1f} s {row['error'][:80]}", flush=True)
        refs = references(Path(args.references))
    return ran


def judge(row: dict, ref: dict) -> dict:
    """The fit's verdict against its reference: "optimum" (within 1e-6 relative), "better"
    (below the reference by more than that: counts as at the optimum, and flags the reference),
    or "miss"."""
    verdict = rr.compare(row["nll"], ref["nll"], ref["n_obs"])
    gap = row["nll"] - ref["nll"]
    near = bool(np.isfinite(gap) and gap <= 1e-3 * rr.scale_of(ref["nll"], ref["n_obs"]))
    return {"ref_nll": ref["nll"], "ref_theta": ref["theta"], "verdict": verdict,
            "miss_kind": "" if verdict != "miss" else "near" if near else "far"}


def cmd_one(args) -> None:
    refs = references(Path(args.references))
    for f in select_fits(args, select(args)):
        row = run_fit(f)
        ref = refs.get(f.problem.id)
        if ref is not None:
            row.update(judge(row, ref))
        print(json.dumps(row, indent=1))


def cmd_report(args) -> None:
    rows = read_jsonl(Path(args.out))
    refs = references(Path(args.references))
    rows = [r | judge(r, refs[r["problem"]]) for r in rows if r["problem"] in refs]
    Path(args.report).write_text(report(rows, refs))
    print(Path(args.report).read_text())


def cmd_baseline(args) -> None:
    """Notes for the coordinator: every miss so far, with how to reproduce it."""
    rows = read_jsonl(Path(args.out))
    refs = references(Path(args.references))
    rows = [r | judge(r, refs[r["problem"]]) for r in rows if r["problem"] in refs]
    misses = [r for r in rows if r["verdict"] == "miss"]
    ok = sum(r["verdict"] in ("optimum", "better") for r in rows)
    lines = [f"# Robustness baseline: misses of the default fit ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "", f"pgpgm from {sorted({r.get('pgpgm', '?') for r in rows})}; {len(rows)} fits of "
             f"{len({r['problem'] for r in rows})} problems so far, {ok} at the global optimum "
             f"({ok / max(len(rows), 1):.1%}), {len(misses)} misses. The grid is still running; this file is "
             "rewritten as fits come in (`python benchmarks/robustness.py baseline`).", "",
             "Reproduce one fit with your own pgpgm (from the repository root of your checkout, with this "
             "branch's `benchmarks/robustness.py`, `benchmarks/robustness_reference.py`, `models/*.toml` and the "
             "reference file `benchmarks/results/robustness_reference.jsonl` copied in):", "",
             "    python benchmarks/robustness.py --only <fit id>            # one fit, printed with its verdict",
             "    python benchmarks/robustness.py fits --where system=fhn --out /tmp/mine.jsonl   # a class",
             "    python benchmarks/robustness.py report --out /tmp/mine.jsonl --report /tmp/mine.md",
             "", "or by hand: `rb.fit_kwargs(rb.fit_by_id(id))` gives the pgpgm.fit keywords and "
             "`rb.make_data(problem)` the (system, data):", "",
             "    import robustness as rb, pgpgm   # in Python started in benchmarks/",
             "    f = rb.fit_by_id('fhn-issue-rbf-s0'); system, data = rb.make_data(f.problem)",
             "    r = pgpgm.fit(system, data, rb.observed_of(f.problem), **rb.fit_kwargs(f))",
             "    r.estimates.attrs['refinement_nll']   # vs the reference NLL below", "",
             "Verdict: at the optimum when NLL <= reference + 1e-6 x max(|reference|, N/2) (N observations).", "",
             "`far`: NLL more than 1e-3 relative above the reference (another optimum); `near`: within it "
             "(the refinement stopped short, or a noisy ODE solve).", "",
             "| fit id | system | kernel | box | points | noise | x0 | noise model | seed | kind | NLL | ref NLL | "
             "refined theta | reference theta | stop reason |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(misses, key=lambda r: r["id"]):
        th = "-" if r.get("theta") is None else ", ".join(f"{v:.4g}" for v in r["theta"])
        rth = ", ".join(f"{v:.4g}" for v in r["ref_theta"])
        lines.append(f"| {r['id']} | {r['system']} | {r['kernel']} | {r['box']} | {r['points']} | {r['noise_level']} "
                     f"| {r['x0']} | {r['noise']} | {r['seed']} | {r['miss_kind']} | {r['nll']:.8g} | {r['ref_nll']:.8g} | {th} | {rth} | "
                     f"{(r.get('stop_reason') or r.get('error', ''))[:80]} |")
    lines += ["", "Problems (data seed = problem's `data_seed`; settings as in the table):", ""]
    for pid in sorted({r["problem"] for r in misses}):
        lines.append(f"- {pid}: {json.dumps(refs[pid]['settings'])}; reference: {refs[pid]['n_reached']}/"
                     f"{refs[pid]['n_starts']} multi-start starts reached it")
    if args.preface:
        lines[1:1] = ["", Path(args.preface).read_text().rstrip()]
    Path(args.notes).write_text("\n".join(lines) + "\n")
    print(f"{len(rows)} fits, {len(misses)} misses -> {args.notes}")


FACTORS = ("system", "kernel", "box", "points", "noise_level", "x0", "noise", "seed")


def report(rows: list[dict], refs: dict[str, dict]) -> str:
    """robustness.md: per class and overall, the fraction at the global optimum, the median and
    95th-percentile steps 1-3 time, and every miss with its settings."""
    def summary(sel):
        ok = [r["verdict"] in ("optimum", "better") for r in sel]
        t = np.array([r["steps13"] for r in sel if np.isfinite(r.get("steps13", np.nan))])
        return (len(sel), sum(ok), sum(r["verdict"] == "better" for r in sel),
                np.median(t) if t.size else np.nan, np.percentile(t, 95) if t.size else np.nan)

    lines = ["# Robustness of steps 1-3: the global optimum on the settings a user picks", "",
             f"{len(rows)} fits of {len({r['problem'] for r in rows})} problems "
             f"(`python benchmarks/robustness.py fits`, then `report`); pgpgm from "
             f"{sorted({r.get('pgpgm', '?') for r in rows})}. A fit is at the global optimum when its refined NLL "
             "is within 1e-6 relative of the reference's (`robustness_reference.same_optimum`), or below it "
             "(`better`: the reference missed it; counted as at the optimum). Times are steps 1-3 (gp + sampling "
             "+ refinement) on a shared 2-core machine (inflated by contention).", "",
             "| class | level | fits | at optimum | fraction | better than ref | median s | p95 s |",
             "|---|---|---|---|---|---|---|---|"]
    n, k, b, med, p95 = summary(rows)
    lines.append(f"| all | | {n} | {k} | {k / max(n, 1):.3f} | {b} | {med:.2f} | {p95:.2f} |")
    for fac in FACTORS:
        for level in sorted({r[fac] for r in rows}, key=str):
            n, k, b, med, p95 = summary([r for r in rows if r[fac] == level])
            lines.append(f"| {fac} | {level} | {n} | {k} | {k / max(n, 1):.3f} | {b} | {med:.2f} | {p95:.2f} |")
    misses = [r for r in rows if r["verdict"] == "miss"]
    far = sum(r["miss_kind"] == "far" for r in misses)
    lines += ["", f"## Misses ({len(misses)}: {far} far, {len(misses) - far} near)", "",
              "`far`: NLL more than 1e-3 relative above the reference (another optimum); `near`: within it (the "
              "refinement stopped short of the optimum, or the ODE solve is too noisy to resolve 1e-6).", "",
              "| fit id | settings | kind | NLL | reference NLL | refined theta | reference theta | stop |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(misses, key=lambda r: r["id"]):
        settings = ", ".join(f"{f}={r[f]}" for f in FACTORS if f != "system")
        th = "-" if r.get("theta") is None else ", ".join(f"{v:.4g}" for v in r["theta"])
        rth = ", ".join(f"{v:.4g}" for v in r["ref_theta"])
        lines.append(f"| {r['id']} | {settings} | {r['miss_kind']} | {r['nll']:.8g} | {r['ref_nll']:.8g} | {th} | {rth} | "
                     f"{r.get('stop_reason', r.get('error', ''))[:60]} |")
    better = [r for r in rows if r["verdict"] == "better"]
    if better:
        lines += ["", "## Fits better than the reference (the reference multi-start missed the optimum)", ""]
        lines += [f"- {r['id']}: NLL {r['nll']:.8g} < reference {r['ref_nll']:.8g}" for r in better]
    lines += ["", "## References", "",
              "Independent multi-start per problem (`python benchmarks/robustness.py reference`): starts that "
              "reached the best NLL, and the cost of reaching it with 95 % probability (starts needed x mean "
              "time per start) against the fits' median steps 1-3 time on the same problem. Rows marked v1 "
              "come from the first version of the multi-start (each noise-sd round its own budget of 100 "
              "evaluations, far starts alternated to the end, sensitivities for every system): same likelihood "
              "and starts, more time per start on several observed states.", "",
              "| problem | best NLL | reached | starts for 95 % | ms/start | cost 95 % s | fits' median s |",
              "|---|---|---|---|---|---|---|"]
    ratios = []
    for pid in sorted({r["problem"] for r in rows}):
        ref = refs[pid]
        t = [r["steps13"] for r in rows if r["problem"] == pid and np.isfinite(r.get("steps13", np.nan))]
        if t and ref["starts_95"] > 0:
            ratios.append(np.median(t) / ref["cost_95"])
        c95 = f"{ref['cost_95']:.2f}" if ref["starts_95"] > 0 else "none reached (see misses: near)"
        version = "" if ref.get("algorithm", 1) == 2 else " (v1)"
        lines.append(f"| {pid}{version} | {ref['nll']:.8g} | {ref['n_reached']}/{ref['n_starts']} | {ref['starts_95']} | "
                     f"{ref['time_per_start'] * 1e3:.0f} | {c95} | "
                     f"{np.median(t) if t else float('nan'):.2f} |")
    if ratios:
        lines += ["", f"Fits' median steps 1-3 time / multi-start cost for 95 %: median over problems "
                  f"{np.median(ratios):.2f} (the fits are faster on {int(np.sum(np.array(ratios) < 1))} of "
                  f"{len(ratios)} problems). The multi-start's time per start is measured in its own run on the "
                  "same machine (contention differs between the two runs: compare as an order of magnitude)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="one", choices=("design", "reference", "fits", "report", "one", "baseline"))
    parser.add_argument("--only", nargs="*", help="fit or problem ids")
    parser.add_argument("--where", action="append", help="factor=level, e.g. system=seir (repeatable)")
    parser.add_argument("--limit", type=int, help="first N problems after filtering")
    parser.add_argument("--starts", type=int, default=500, help="reference multi-start size")
    parser.add_argument("--out", default=str(ROWS), help="fit rows (JSON lines)")
    parser.add_argument("--references", default=str(REFERENCES), help="reference optima (JSON lines)")
    parser.add_argument("--report", default=str(REPORT))
    parser.add_argument("--notes", default="/work/notes/robustness-baseline.md", help="baseline: notes file")
    parser.add_argument("--preface", help="baseline: a Markdown file put under the title")
    parser.add_argument("--follow", action="store_true",
                        help="fits: keep going as the reference run adds problems, until every selected fit ran")
    parser.add_argument("--reverse", action="store_true", help="reference: last problem first (a second run)")
    parser.add_argument("--cheap-first", action="store_true", help="reference: cheapest problems first")
    parser.add_argument("--no-reference-needed", action="store_true", help="run fits without a reference yet")
    args = parser.parse_args(argv)
    {"design": cmd_design, "reference": cmd_reference, "fits": cmd_fits, "report": cmd_report,
     "one": cmd_one, "baseline": cmd_baseline}[args.command](args)


if __name__ == "__main__":
    main()

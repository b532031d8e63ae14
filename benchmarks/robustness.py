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

Targets (issue 29): the global optimum in >= 99.5 % of the grid's fits and >= 98 % in every class
(``report``); steps 1-3 faster on the median than the independent multi-start reaching 95 % success on
the same data sets (``sidebyside``, both sides timed in one process): one multi-start size for all the
data sets, the fewest starts that reach the optimum on 95 % of them, as a user configures it; beside it
the stricter per-data-set figure, each data set's own starts needed for 95 % (``report``'s ratio divides
by the reference run's own time per start, measured at another time and load).

Commands (run from the repository root; the fits use whatever ``pgpgm`` is importable)::

    ./run.sh bench robustness report                              # the same as below

    python benchmarks/robustness.py design [--only ID ...] [--where k=v ...]   # the grid
    python benchmarks/robustness.py reference [--limit N] ...    # reference optima (cached)
    python benchmarks/robustness.py fits [--limit N] [--out FILE] ...   # fits (resumable)
    python benchmarks/robustness.py report [--out FILE]          # robustness.md from the rows
    python benchmarks/robustness.py --only fhn-issue-rbf-s0       # one fit, printed
    python benchmarks/robustness.py baseline --preface FILE     # the misses, for the notes
    python benchmarks/robustness.py sidebyside --where seed=0   # fits vs the multi-start, one process
    python benchmarks/robustness.py competing [--seeds 3]       # other optima as good, shipped models
    python benchmarks/robustness.py posterior --where kernel=rbf --design-seed 2029   # step 4 too, per fit

``sidebyside`` (the speed target against the multi-start, measured side by side): each problem's
selected fits, each followed in the same process by its share of a systematic sample (``--sample``,
20) of the reference multi-start's own starts, rerun exactly as that run did them and timed; the
cost to 95 % = the starts needed for 95 % success (the stored run's success fraction) x the mean
time per start measured there. Ratios per problem (CPU and wall) and their median; the same against
one multi-start size for all the data sets (:func:`starts_for_share`) and against multi-starts that
stop once 2-5 starts agree on their best (:func:`agreement_stop`); and where the
fits' time goes (step 1, the MCMC, the stop rule's refinements, step 3; least-squares Jacobians
and residuals): ``results/robustness_sbs.jsonl`` (one row per problem, resumable) and ``.md``.

Runs that made the committed references in ``benchmarks/references/`` (one process each, ``nice -n 10``;
the second reference run takes problems the first has not claimed; fit rows and reports go to the
git-ignored ``benchmarks/results/``)::

    nice -n 10 python benchmarks/robustness.py reference --cheap-first &
    nice -n 12 python benchmarks/robustness.py reference --cheap-first \
        --references benchmarks/references/robustness_reference_b.jsonl &
    nice -n 10 python benchmarks/robustness.py fits --follow &   # as the references come in
    python benchmarks/robustness.py sidebyside --where seed=0 --sample 12   # results/robustness_sbs*.md

Grid: 36 problems of the design (4 per system, seeded) and the issue's own case, each fitted with
3 kernels x 4 fit seeds: 444 fits. The fit rows record the NLL, theta, initial values, steps
1-3 times, step 2's iterations and stop reason; ``report`` judges them against the references.

Held-out grids: ``--design-seed 2027`` (2028, 2029) draws the same factors anew (36 problems, ids
``d2027-...``, data seeds 2000-2035; 3000-3035; 4000-4035) that no rule was tuned on, with its own files
(references ``references/robustness_d2027_reference.jsonl``; fit rows and report
``results/robustness_d2027.jsonl``, ``.md``)::

    python benchmarks/robustness.py reference --cheap-first --design-seed 2027 &
    python benchmarks/robustness.py fits --follow --where seed=0 --design-seed 2027 &
    python benchmarks/robustness.py report --design-seed 2027

``posterior`` (step 4 beyond the runaway cases of ``runaways.py``): the selected fits as default calls with
step 4 (``posterior`` left at its default): wall time, step 4's seconds, rounds and what ran out of its
budget, the convergence checks' findings, every warning, and the largest distance of a parameter's
posterior median from step 3's refined value in posterior sds (``results/robustness_posterior.jsonl``).

Selection: ``--only`` fit or problem ids, ``--where factor=level`` (e.g. ``--where system=seir
--where box=x10``), ``--limit N`` (first N problems after filtering). Fits whose problem has no
reference yet are skipped by ``fits`` unless ``--no-reference-needed``. Rows are appended to
``benchmarks/results/robustness.jsonl`` (one JSON object per fit; a rerun skips ids already
there, so a run can be stopped and resumed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
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
REFERENCE_DIR = harness.REFERENCES
ROWS = RESULTS / "robustness.jsonl"
REFERENCES = REFERENCE_DIR / "robustness_reference.jsonl"
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


def design(seed: int = DESIGN_SEED) -> list[ProblemSetting]:
    """The seeded random design: systems cycled, every other factor balanced by shuffled
    repetition of its levels, re-drawn where a level does not apply (lognormal noise needs
    positive observed values, the default box must hold the truth).

    ``seed`` other than :data:`DESIGN_SEED` gives a held-out design: the same factors drawn
    anew, problem ids prefixed ``d<seed>-`` and data seeds ``1000 (seed - 2025) + i``, none of
    which the stop rule was ever tried on while it was built."""
    rng = np.random.default_rng(seed)
    prefix = "" if seed == DESIGN_SEED else f"d{seed}-"
    first_data_seed = 1000 * (seed - DESIGN_SEED + 1)

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
        problems.append(ProblemSetting(f"{prefix}{s.key}-{i:03d}", s.key, int(points[i]), float(noise[i]), box,
                                       x0s[i], noise_model, first_data_seed + i))
    return problems


#: The issue's own case (issue 29): FitzHugh-Nagumo, R observed, 100 points, snr 100 (10 % noise),
#: data seed 0, pgpgm's default box; its default fit (rbf, seed 0) is ``fhn-issue-rbf-s0``.
ISSUE_PROBLEM = ProblemSetting("fhn-issue", "fhn", 100, 0.1, "default", "known", "normal", 0)


def problems(design_seed: int = DESIGN_SEED) -> list[ProblemSetting]:
    """The grid's problems: the random design and the issue's own case (a held-out design,
    ``design_seed`` other than :data:`DESIGN_SEED`: its problems alone)."""
    return [ISSUE_PROBLEM, *design()] if design_seed == DESIGN_SEED else design(design_seed)


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


def reference_problem(problem: ProblemSetting, algorithm: int = 3) -> rr.MultiStartProblem:
    """The likelihood problem that the reference multi-start solves (``algorithm`` < 3: as the references
    made before step 3 held unknown initial values inside their boxes, which left them free)."""
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
                                lognormal=problem.noise == "lognormal", bounded_x0=algorithm >= 3)


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
    t0, c0 = time.perf_counter(), time.process_time()
    error = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = pgpgm.fit(system, data, observed_of(fit.problem), **kw)
        except Exception as err:  # a failed fit is a miss, recorded with its error
            result, error = None, f"{type(err).__name__}: {err}"
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    row = {"id": fit.id, "problem": fit.problem.id, **fit.factors(), "data_seed": fit.problem.data_seed,
           "pgpgm": str(Path(pgpgm.__file__).parent.parent), "wall": wall, "cpu": cpu, "error": error}
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
        paths += sorted(REFERENCE_DIR.glob("robustness_reference_*.jsonl"))
    return {r["problem"]: r for p in paths for r in read_jsonl(p)}


def append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------------------- selection
def select(args) -> list[ProblemSetting]:
    problems = globals()["problems"](args.design_seed)
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
def design_seed_of(some_id: str) -> int:
    """The design a problem or fit id belongs to: ``d<seed>-...`` a held-out one, else the grid's."""
    held_out = re.match(r"d(\d+)-", some_id)
    return int(held_out.group(1)) if held_out else DESIGN_SEED


def problem_by_id(pid: str) -> ProblemSetting:
    return {p.id: p for p in problems(design_seed_of(pid))}[pid]


def fit_by_id(fid: str) -> FitSetting:
    return {f.id: f for p in problems(design_seed_of(fid)) for f in fits_of(p)}[fid]


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
    grid_run = out.parent.resolve() == REFERENCE_DIR.resolve()  # the grid's files (a second run: ..._b.jsonl)
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
                print(f"{p.id}: claimed by another reference run ({claims / p.id}; remove it to run it here)")
                continue
        if p.id in main and main[p.id]["data_hash"] == data_hash(p):  # a test's reference: the grid's row
            append(out, main[p.id])
            print(f"{p.id}: copied from the grid's references")
            continue
        t0 = time.perf_counter()
        ref = rr.multistart(reference_problem(p), n_starts=args.starts, seed=p.data_seed)
        row = {"problem": p.id, "settings": asdict(p), "data_hash": data_hash(p), "algorithm": 3, **ref.as_dict(),
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


def fit_q(row: dict, problem: rr.MultiStartProblem) -> np.ndarray:
    """(Q,) a fit row's refined point in the reference problem's unknowns (theta, then the free initial
    values; log for lognormal observed states, which that problem solves as log x)."""
    free = np.asarray(row["x0_refined"], float)[list(problem.free)]
    if problem.lognormal:
        free[: len(problem.observed)] = np.log(free[: len(problem.observed)])
    return np.concatenate([row["theta"], free])


def judge(row: dict, ref: dict) -> dict:
    """The fit's verdict against its reference: "optimum" (within 1e-6 relative), "better"
    (below the reference by more than that: counts as at the optimum, and flags the reference),
    or "miss". A near miss (within 1e-3 relative) is judged again with both points' NLLs from ODE
    solves to 1e-12 (:func:`robustness_reference.tight_nll`; ``tight`` in the verdict), which the
    default solves' error cannot blur."""
    verdict = rr.compare(row["nll"], ref["nll"], ref["n_obs"])
    gap = row["nll"] - ref["nll"]
    near = bool(np.isfinite(gap) and gap <= 1e-3 * rr.scale_of(ref["nll"], ref["n_obs"]))
    out = {"ref_nll": ref["nll"], "ref_theta": ref["theta"], "verdict": verdict,
           "miss_kind": "" if verdict != "miss" else "near" if near else "far"}
    if verdict == "miss" and near and row.get("theta") is not None:
        problem = reference_problem(ProblemSetting(**ref["settings"]))
        fit_tight, ref_tight = rr.tight_nll(problem, fit_q(row, problem)), rr.tight_nll(problem, ref["q"])
        verdict = rr.compare(fit_tight, ref_tight, ref["n_obs"])
        out |= {"verdict": verdict, "miss_kind": "" if verdict != "miss" else "near",
                "tight": {"nll": fit_tight, "ref_nll": ref_tight}}
    return out


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


def run_posterior_fit(fit: FitSetting) -> dict:
    """One default fit *with* step 4 (the fit's settings, ``posterior`` left at its default): its wall time,
    step 4's seconds, rounds and budget, the convergence checks' findings and every warning's category and
    text, and how far step 4's posterior median lies from step 3's refined point (in posterior sds)."""
    system, data = make_data(fit.problem)
    kw = {k: v for k, v in fit_kwargs(fit).items() if k != "posterior"}
    t0 = time.perf_counter()
    error, caught = "", []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = pgpgm.fit(system, data, observed_of(fit.problem), **kw)
        except Exception as err:  # recorded: a default fit that raises is a finding
            result, error = None, f"{type(err).__name__}: {err}"
    row = {"id": fit.id, "problem": fit.problem.id, **fit.factors(), "wall": time.perf_counter() - t0,
           "error": error, "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught})}
    if result is None:
        return row
    t, tree = result.timings, result.posterior
    post = tree.posterior
    free = [p for p in system.parameters if p in post and p not in result.fixed]
    refined = result.estimates["theta"].sel(estimate="refined").values
    z = [abs(float(post[p].median()) - refined[system.parameters.index(p)]) / max(float(post[p].std()), 1e-300)
         for p in free]
    budget = json.loads(tree.attrs.get("pgpgm_budget", "{}"))
    row.update(nll=float(result.nll), steps13=float(t["gp"] + t["sampling"] + t["refinement"]),
               step4=float(t.get("posterior", np.nan)), rounds=int(tree.attrs.get("pgpgm_rounds", 0)),
               draws=int(post.sizes.get("draw", 0)), chains=int(post.sizes.get("chain", 0)),
               exhausted=budget.get("exhausted", ""), problems=result.convergence_problems(),
               median_from_refined_sd=max(z, default=float("nan")))
    return row


def cmd_posterior(args) -> None:
    """Step 4 on the selected fits (one kernel each by default: ``--where kernel=rbf``): does the default
    fit finish, converged or with its warning, and where? Rows to ``--posterior-out`` (resumable)."""
    out = Path(args.posterior_out)
    done = {r["id"] for r in read_jsonl(out)}
    for f in select_fits(args, select(args)):
        if f.id in done:
            continue
        row = run_posterior_fit(f)
        append(out, row)
        found = "; ".join(row.get("problems", {}).get("posterior", []))
        print(f"{f.id}: {row['wall']:.0f} s (step 4 {row.get('step4', float('nan')):.0f} s, "
              f"{row.get('rounds', 0)} rounds, {row.get('exhausted', '') or 'budget left'}) "
              f"{found[:120] or 'converged'} {row['error'][:80]}", flush=True)
    rows = read_jsonl(out)
    out.with_suffix(".md").write_text(posterior_report(rows))
    print(out.with_suffix(".md").read_text())


def posterior_report(rows: list[dict]) -> str:
    """The ``posterior`` rows as Markdown: how many fits finished converged, with a warning, or raised;
    their wall times; per fit its step 4, what ran out, the findings and the warnings' categories."""
    ok = [r for r in rows if not r["error"]]
    converged = [r for r in ok if not r["problems"].get("posterior")]
    warned = [r for r in ok if any(w.startswith("ConvergenceWarning") for w in r["warnings"])]
    silent = [r for r in ok if r["problems"].get("posterior") and r not in warned]
    walls = np.array([r["wall"] for r in rows])
    lines = ["# Step 4 on the robustness grid's fits: default calls with the exact posterior", "",
             f"{len(rows)} fits ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             "`python benchmarks/robustness.py posterior`): "
             f"**{len(converged)} converged** (R-hat <= 1.01, ESS >= 400, no divergences), {len(warned)} with a "
             f"ConvergenceWarning naming what failed, {len(silent)} unconverged without one, "
             f"{len(rows) - len(ok)} raised. Wall time of the whole fit: median {np.median(walls):.0f} s, "
             f"max {walls.max():.0f} s (step 4's default budget: 60 s).", "",
             "| fit | wall s | step 4 s | rounds | ran out | posterior's findings | warnings | median - refined (sd) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kinds = sorted({w.split(":")[0] for w in r["warnings"]})
        found = "; ".join(r.get("problems", {}).get("posterior", []))
        lines.append(f"| {r['id']} | {r['wall']:.0f} | {r.get('step4', float('nan')):.0f} | {r.get('rounds', '')} | "
                     f"{r.get('exhausted', '') or '-'} | {(found or 'converged')[:160]} | {', '.join(kinds)} "
                     f"{r['error'][:80]} | {r.get('median_from_refined_sd', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


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
             "reference file `benchmarks/references/robustness_reference.jsonl` copied in):", "",
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


# ---------------------------------------------------------------------------------------- side by side
SBS = RESULTS / "robustness_sbs.jsonl"
SBS_REPORT = RESULTS / "robustness_sbs.md"


class Breakdown:
    """Where a fit's steps 1-3 time goes: wall and CPU seconds inside step 2's stop rule
    (``pgpgm.RefinedAgreement.decide``: the probe's and the checks' refinements and the box search;
    per check, with its iteration) and, inside and outside the rule (outside: step 3), in the
    least-squares Jacobians (``pgpgm.LeastSquaresProblem.jacobian``: forward sensitivities) and
    residuals (``.residuals``: plain solves), and the refinements (calls of ``refine`` by the stop rule
    and by step 3: their number, noise-sd rounds, solves; in the rule each as [max_nfev, rounds,
    solves, wall s]). Patches those functions while active (a few microseconds a call); :meth:`take`
    returns the figures gathered since the last call."""

    def __init__(self):
        self._saved: list = []
        self._in_rule = False
        self.take()

    def take(self) -> dict:
        out = getattr(self, "_figures", {})
        self._figures: dict = {"checks": []}
        return out

    def _add(self, key: str, w0: float, c0: float) -> None:
        f = self._figures
        f[f"{key}_wall"] = f.get(f"{key}_wall", 0.0) + time.perf_counter() - w0
        f[f"{key}_cpu"] = f.get(f"{key}_cpu", 0.0) + time.process_time() - c0
        f[f"{key}_n"] = f.get(f"{key}_n", 0) + 1

    def _wrap(self, cls, name: str, key: str) -> None:
        original = getattr(cls, name)
        bd = self

        def timed_method(*args, **kwargs):
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                bd._add(f"{key}_{'rule' if bd._in_rule else 'step3'}", w0, c0)

        self._saved.append((cls, name, original))
        setattr(cls, name, timed_method)

    def _count_refine(self, module) -> None:
        original = module.refine
        bd = self

        def counted_refine(*args, **kwargs):
            w0 = time.perf_counter()
            out = original(*args, **kwargs)
            where = "rule" if bd._in_rule else "step3"
            found = re.search(r"(?:converged in|after) (\d+) rounds", out.message)
            rounds = int(found.group(1)) if found else 0
            f = bd._figures
            f[f"refines_{where}"] = f.get(f"refines_{where}", 0) + 1
            f[f"rounds_{where}"] = f.get(f"rounds_{where}", 0) + rounds
            f[f"solves_{where}"] = f.get(f"solves_{where}", 0) + int(out.n_solves)
            if bd._in_rule:
                f.setdefault("rule_refines", []).append([kwargs.get("max_nfev", 200), rounds, int(out.n_solves),
                                                         round(time.perf_counter() - w0, 4)])
            return out

        self._saved.append((module, "refine", original))
        module.refine = counted_refine

    def __enter__(self) -> Breakdown:
        decide = pgpgm.RefinedAgreement.decide
        bd = self
        self._count_refine(harness.private("pgpgm.matching.agreement"))
        self._count_refine(harness.private("pgpgm.steps.refine"))

        def timed_decide(rule, checkpoints, previous):
            w0, c0 = time.perf_counter(), time.process_time()
            bd._in_rule = True
            try:
                return decide(rule, checkpoints, previous)
            finally:
                bd._in_rule = False
                bd._add("rule", w0, c0)
                bd._figures["checks"].append([int(checkpoints[0].iteration), round(time.perf_counter() - w0, 4)])

        self._saved.append((pgpgm.RefinedAgreement, "decide", decide))
        pgpgm.RefinedAgreement.decide = timed_decide
        self._wrap(pgpgm.LeastSquaresProblem, "jacobian", "jac")
        self._wrap(pgpgm.LeastSquaresProblem, "residuals", "res")
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        self._saved.clear()


def sample_indices(n_starts: int, k: int, seed: int) -> list[int]:
    """A systematic sample of ``k`` of the multi-start's ``n_starts`` starts (every n/k-th from a
    seeded random offset): early starts (no best yet to give up against) and late ones alike, trf
    and dogbox alternately."""
    step = n_starts / k
    offset = np.random.default_rng(seed).uniform(0, step)
    return sorted({int(offset + j * step) for j in range(k)})


def time_start(mp: rr.MultiStartProblem, points: np.ndarray, stored: np.ndarray, i: int, jac: str) -> dict:
    """Start ``i`` of the reference multi-start rerun as that run did it (the same point, method and
    best-so-far of the stored starts before it), timed: wall, CPU, and its NLL against the stored one."""
    best = float(np.min(stored[:i])) if i else np.inf
    w0, c0 = time.perf_counter(), time.process_time()
    f, _ = rr.one_start(mp, points[i], i, best, jac)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n_obs = int(mp.n_obs.sum())
    same = bool((not np.isfinite(f) and not np.isfinite(stored[i])) or
                abs(f - stored[i]) <= rr.REL_TOL * rr.scale_of(stored[i] if np.isfinite(stored[i]) else 0.0, n_obs))
    return {"index": i, "method": "trf" if i % 2 == 0 else "dogbox", "wall": wall, "cpu": cpu,
            "nll": float(f), "stored_nll": float(stored[i]), "reproduced": same}


def same_data(p: ProblemSetting, ref: dict) -> bool:
    """Whether the problem's data are those its reference was computed on: the same hash (values rounded
    to 12 decimals), or a likelihood at the reference optimum within 1e-9 relative of the reference's
    (a change of the simulation can move the values below that rounding: goodwin-003, -012 and -021 moved
    by ~1e-11 in the NLL)."""
    if data_hash(p) == ref["data_hash"]:
        return True
    nll = reference_problem(p, ref.get("algorithm", 1)).nll(np.array(ref["q"]))
    return bool(abs(nll - ref["nll"]) <= 1e-9 * rr.scale_of(ref["nll"], ref["n_obs"]))


def side_by_side_problem(p: ProblemSetting, ref: dict, fits: list[FitSetting], n_starts: int,
                         breakdown: Breakdown | None) -> dict:
    """One problem's row: its fits, each followed in this process by its share of a systematic sample
    of ``n_starts`` of the reference multi-start's own starts, rerun and timed."""
    if not same_data(p, ref):
        raise RuntimeError(f"{p.id}: the data differ from those of the reference")
    mp = reference_problem(p, ref.get("algorithm", 1))  # its starts rerun as that run made them
    jac = rr.jacobian_kind(mp)
    points = rr.start_points(mp, ref["n_starts"], p.data_seed)
    stored = np.array(ref["nll_starts"], float)
    chunks = np.array_split(np.array(sample_indices(ref["n_starts"], n_starts, p.data_seed)), len(fits))
    load0 = os.getloadavg()[0]
    rr.warm(mp)  # as the reference run: the multi-start's solvers compiled outside its timing
    fit_rows, starts = [], []
    for f, chunk in zip(fits, chunks):
        if breakdown is not None:
            breakdown.take()
        row = run_fit(f)
        if breakdown is not None:
            row["breakdown"] = breakdown.take()
        fit_rows.append(row | judge(row, ref))
        starts += [time_start(mp, points, stored, int(i), jac) for i in chunk]
    return {"problem": p.id, "algorithm": ref.get("algorithm", 1), "jacobian": jac, "n_reached": ref["n_reached"],
            "n_starts": ref["n_starts"], "starts_95": ref["starts_95"],
            "stored_ms_per_start": ref["time_per_start"] * 1e3,
            "load": [load0, os.getloadavg()[0]], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "pgpgm": str(Path(pgpgm.__file__).parent.parent), "fits": fit_rows, "starts": starts}


def cmd_sidebyside(args) -> None:
    out = Path(args.sbs)
    done = {r["problem"] for r in read_jsonl(out)}
    refs = references(Path(args.references))
    todo = [p for p in select(args) if p.id in refs and p.id not in done and select_fits(args, [p])]
    stale = [p.id for p in todo if not same_data(p, refs[p.id])]
    if stale:  # their reference was computed on other data (the simulation changed since): not comparable
        print(f"skipped, the data differ from their reference's: {', '.join(stale)}", flush=True)
        todo = [p for p in todo if p.id not in stale]
    bd = Breakdown() if args.breakdown else None
    if todo and args.warmup:  # one untimed (cheap) fit first: the process's own first-fit costs (imports, caches)
        run_fit(fit_by_id("pk-031-rbf-s0"))
    with bd if bd is not None else contextlib.nullcontext():
        for p in todo:
            row = side_by_side_problem(p, refs[p.id], select_fits(args, [p]), args.starts_sample, bd)
            append(out, row)
            s = sbs_summary(row)
            print(f"{p.id}: fits {s['fits_wall']:.2f} s wall / {s['fits_cpu']:.2f} s CPU (median of "
                  f"{len(row['fits'])}, {s['at_optimum']} at the optimum); starts {s['start_wall'] * 1e3:.0f} / "
                  f"{s['start_cpu'] * 1e3:.0f} ms (stored {row['stored_ms_per_start']:.0f}) x {row['starts_95']} "
                  f"for 95 %: ratio {s['ratio_wall']:.2f} "
                  f"wall, {s['ratio_cpu']:.2f} CPU; load {row['load'][0]:.1f}-{row['load'][1]:.1f}", flush=True)
    Path(args.sbs_report).write_text(sbs_report(read_jsonl(out), all_references()))
    print(Path(args.sbs_report).read_text())


def sbs_summary(row: dict) -> dict:
    """A side-by-side row's figures: the fits' medians (steps 1-3 wall; the whole fit call's CPU), the
    multi-start's mean wall and CPU per start over the sample, its cost to 95 % success (starts needed
    x mean per start) and the ratios (fits / cost to 95 %; NaN where no start reached the optimum)."""
    fits = [r for r in row["fits"] if np.isfinite(r.get("steps13", np.nan))]
    fw = float(np.median([r["steps13"] for r in fits])) if fits else np.nan
    fc = float(np.median([r["cpu"] for r in fits])) if fits else np.nan
    sw = float(np.mean([s["wall"] for s in row["starts"]]))
    sc = float(np.mean([s["cpu"] for s in row["starts"]]))
    n = len(row["starts"])
    se = float(np.std([s["cpu"] for s in row["starts"]], ddof=1) / np.sqrt(n) / sc) if n > 1 else np.nan
    need = row["starts_95"] if row["starts_95"] > 0 else np.nan
    return {"fits_wall": fw, "fits_cpu": fc, "start_wall": sw, "start_cpu": sc, "cost_wall": need * sw,
            "cost_cpu": need * sc, "ratio_wall": fw / (need * sw), "ratio_cpu": fc / (need * sc), "start_cpu_se": se,
            "at_optimum": sum(r.get("verdict") in ("optimum", "better") for r in row["fits"]),
            "reproduced": sum(s["reproduced"] for s in row["starts"])}


def starts_for_share(success: np.ndarray, share: float = 0.95, cap: int = 1_000_000) -> int | None:
    """The fewest starts ``N`` with which one multi-start, run with ``N`` starts on every data set, reaches
    the optimum on ``share`` of them: the smallest N with mean(1 - (1 - p)^N) >= share, ``p`` (n,) each
    data set's success fraction per start. None where no N up to ``cap`` does (too many never reached)."""
    p = np.asarray(success, float)
    def share_at(n: int) -> float:
        return float(np.mean(1.0 - (1.0 - p) ** n))
    if share_at(cap) < share:
        return None
    lo, hi = 1, cap
    while lo < hi:  # the share grows with N
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if share_at(mid) < share else (lo, mid)
    return lo


def agreement_stop(ref: dict, agree: int, repeats: int = 200, seed: int = 0) -> tuple[float, float]:
    """A multi-start that decides itself when to stop: it stops once ``agree`` of its starts have reached
    its best NLL so far (within the 1e-6 relative test), or after all the stored starts. Simulated on the
    reference run's stored start NLLs taken in ``repeats`` random orders: (fraction of orders that stop at
    the reference optimum, mean starts used)."""
    nll = np.array(ref["nll_starts"], float)
    nll[~np.isfinite(nll)] = np.inf
    tol = rr.REL_TOL * rr.scale_of(ref["nll"], ref["n_obs"])
    rng = np.random.default_rng(seed)
    hits, used = 0, 0
    for _ in range(repeats):
        order = rng.permutation(nll)
        best, count, n = np.inf, 0, len(order)
        for i, f in enumerate(order):
            if f < best - tol:
                best, count = f, 1
            elif np.isfinite(f) and f <= best + tol:
                count += 1
            if count >= agree:
                n = i + 1
                break
        hits += rr.same_optimum(best, ref["nll"], ref["n_obs"])
        used += n
    return hits / repeats, used / repeats


def all_references() -> dict[str, dict]:
    """Every stored reference: the grid's and the held-out grids' (``robustness_d*_reference.jsonl``)."""
    refs = references(REFERENCES)
    for path in sorted(REFERENCE_DIR.glob("robustness_d*_reference.jsonl")):
        refs |= references(path)
    return refs


def one_multistart_section(rows: list[dict], sums: dict[str, dict], refs: dict[str, dict]) -> list[str]:
    """The report's section on a multi-start a user configures once: one number of starts for every data
    set (the fewest that reach 95 % of the side-by-side problems, and of all stored references), and
    multi-starts that stop when 2-5 starts agree on their best."""
    p = np.array([r["n_reached"] / r["n_starts"] for r in rows])
    p_all = np.array([r["n_reached"] / r["n_starts"] for r in refs.values()])
    fits = np.array([sums[r["problem"]]["fits_cpu"] for r in rows])
    start = np.array([sums[r["problem"]]["start_cpu"] for r in rows])
    lines = ["", "## One multi-start for all the data sets", "",
             "A user who runs a multi-start picks its number of starts once, not per data set. Below, the fewest "
             "starts N with which one multi-start reaches the optimum on 95 % of the data sets (mean over data sets "
             "of 1 - (1 - p)^N, p its stored 500-start run's success fraction), costed at each problem's CPU per start "
             "measured here; the ratio is the fits' median CPU over N x that.", "",
             "| N from | data sets | N for 95 % | multi-start CPU s, median | fits CPU s, median | ratio, median over "
             "problems | fits faster on |", "|---|---|---|---|---|---|---|"]
    for name, success in (("the side-by-side problems", p), ("all stored references (grid and held-out)", p_all)):
        n = starts_for_share(success)
        if n is None:
            lines.append(f"| {name} | {len(success)} | not reachable | | | | |")
            continue
        ratio = fits / (n * start)
        lines.append(f"| {name} | {len(success)} | {n} | {np.median(n * start):.2f} | {np.median(fits):.2f} | "
                     f"**{np.median(ratio):.2f}** | {int(np.sum(ratio < 1))} of {len(rows)} |")
    lines += ["", "Multi-starts that decide themselves when to stop (once `m` starts reach their best so far; "
              "simulated on the stored runs' start NLLs in 200 random orders each): the share of data sets at the "
              "optimum, and the cost against the fits on the side-by-side problems.", "",
              "| m | at the optimum, side-by-side problems | at the optimum, all references | starts, median | "
              "ratio (fits / its CPU), median |", "|---|---|---|---|---|"]
    for agree in (2, 3, 5):
        every = {pid: agreement_stop(ref, agree) for pid, ref in refs.items()}  # (share at the optimum, starts)
        here = np.array([every[r["problem"]] for r in rows])
        lines.append(f"| {agree} | {np.mean(here[:, 0]):.1%} | {np.mean([h for h, _ in every.values()]):.1%} | "
                     f"{np.median(here[:, 1]):.0f} | {np.median(fits / (here[:, 1] * start)):.2f} |")
    return lines


def sbs_report(rows: list[dict], refs: dict[str, dict] | None = None) -> str:
    """robustness_sbs.md: per problem, the fits and the multi-start's starts timed in one process
    (ratios CPU and wall), their medians over problems, the same against one multi-start size for all the data
    sets (with ``refs``, every stored reference by problem id), and where the fits' time goes."""
    sums = {r["problem"]: sbs_summary(r) for r in rows}
    loads = [v for r in rows for v in r["load"]]
    nfits = sum(len(r["fits"]) for r in rows)
    lines = ["# Steps 1-3 against the independent multi-start, side by side", "",
             f"{len(rows)} problems, {nfits} fits ({sorted({f['kernel'] for r in rows for f in r['fits']})} x seeds "
             f"{sorted({f['seed'] for r in rows for f in r['fits']})}), {min(r['date'] for r in rows)} to "
             f"{max(r['date'] for r in rows)}, load average {min(loads):.1f}-{max(loads):.1f}; pgpgm from "
             f"{sorted({r['pgpgm'] for r in rows})} (`python benchmarks/robustness.py sidebyside`).", "",
             "Each fit is followed in the same process by its share of a systematic sample of the reference "
             "multi-start's own starts (`robustness_reference.one_start`: the same Latin-hypercube point, trf or "
             "dogbox, the same best-so-far of the stored run to give up against), timed. Cost to 95 % = starts needed "
             "for 95 % success (from the stored 500-start run's success fraction) x the mean time per start measured "
             "here. Fits: median steps 1-3 wall (`result.timings`) and median CPU of the whole `pgpgm.fit` call "
             "(`time.process_time`; steps 1-3 plus ~0.1 s of set-up and result assembly). `reproduced`: sampled "
             "starts whose NLL equals the stored run's (v1 references were made by the first version of the "
             "multi-start, which spent more time per start).", "",
             "| problem | ref | fits at opt. | fits wall s | fits CPU s | ms/start wall (stored) | ms/start CPU (± se) | "
             "reproduced | starts 95 % | cost 95 % wall s | cost 95 % CPU s | ratio wall | ratio CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: sums[r["problem"]]["ratio_cpu"]):
        s = sums[r["problem"]]
        lines.append(f"| {r['problem']} | v{r['algorithm']} | {s['at_optimum']}/{len(r['fits'])} | "
                     f"{s['fits_wall']:.2f} | {s['fits_cpu']:.2f} | "
                     f"{s['start_wall'] * 1e3:.0f} ({r['stored_ms_per_start']:.0f}) | "
                     f"{s['start_cpu'] * 1e3:.0f} (± {s['start_cpu_se']:.0%}) | {s['reproduced']}/{len(r['starts'])} | "
                     f"{r['starts_95']} | "
                     f"{s['cost_wall']:.2f} | {s['cost_cpu']:.2f} | {s['ratio_wall']:.2f} | {s['ratio_cpu']:.2f} |")
    rc = np.array([s["ratio_cpu"] for s in sums.values()])
    rw = np.array([s["ratio_wall"] for s in sums.values()])
    ok = np.isfinite(rc)
    lines += ["", f"**Median over problems: ratio CPU {np.median(rc[ok]):.2f}, wall {np.median(rw[ok]):.2f}** "
              f"(the fits are faster on {int(np.sum(rc[ok] < 1))} of {int(ok.sum())} problems by CPU, "
              f"{int(np.sum(rw[ok] < 1))} by wall). Fits at the reference optimum: "
              f"{sum(s['at_optimum'] for s in sums.values())} of {nfits}."]
    if refs is not None:
        lines += one_multistart_section(rows, sums, refs)
    bd_rows = [r for r in rows if all("breakdown" in f for f in r["fits"])]
    if bd_rows:
        lines += ["", "## Where the fits' time goes (medians over each problem's fits, wall s)", "",
                  "gp: step 1; MCMC: step 2 without its stop rule; rule: the stop rule's checks (the probe's and the "
                  "checks' refinements, the box search), of which `probe`: the check at 50 iterations; step 3: the "
                  "refinement; LS jac / res: least-squares Jacobians (forward sensitivities) and residuals (plain "
                  "solves), inside the rule and in step 3 (count per fit in brackets); refines: refinements (their noise-sd "
                  "rounds in brackets), in the rule and in step 3.", "",
                  "| problem | ratio CPU | iterations | steps 1-3 | gp | MCMC | rule | probe | step 3 | LS jac rule | "
                  "LS res rule | LS jac step 3 | LS res step 3 | refines rule | refines step 3 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        med = lambda xs: float(np.median(xs)) if xs else np.nan
        for r in sorted(bd_rows, key=lambda r: -sums[r["problem"]]["ratio_cpu"]):
            fs = [f for f in r["fits"] if np.isfinite(f.get("steps13", np.nan))]
            b = [f["breakdown"] for f in fs]
            g = lambda key: med([x.get(key, 0.0) for x in b])
            probe = med([sum(w for it, w in x["checks"] if it < 100) for x in b])
            its = "/".join(str(max(f["iterations"])) for f in fs)
            cell = lambda k: f"{g(k + '_wall'):.2f} ({g(k + '_n'):.0f})"
            steps = [med([f[k] for f in fs]) for k in ("steps13", "gp")]
            mcmc = med([f["sampling"] - x.get("rule_wall", 0.0) for f, x in zip(fs, b)])
            cells = [f"{v:.2f}" for v in (*steps, mcmc, g("rule_wall"), probe, med([f["refinement"] for f in fs]))]
            cells += [cell(k) for k in ("jac_rule", "res_rule", "jac_step3", "res_step3")]
            cells += [f"{g('refines_' + w):.0f} ({g('rounds_' + w):.0f})" for w in ("rule", "step3")]
            lines.append(f"| {r['problem']} | {sums[r['problem']]['ratio_cpu']:.2f} | {its} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
    tight = [r for r in rows if "tight" in r]
    if tight:
        lines += ["", "## Near misses judged with 1e-12 ODE solves", "",
                  "Within 1e-3 relative of the reference but not 1e-6 with the default solves (rtol = atol = 1e-8); "
                  "both points' NLLs again with solves to 1e-12 (`robustness_reference.tight_nll`):", ""]
        lines += [f"- {r['id']}: default solves {r['nll']:.10g} vs {r['ref_nll']:.10g}; 1e-12 solves "
                  f"{r['tight']['nll']:.10g} vs {r['tight']['ref_nll']:.10g}: {r['verdict']}" for r in tight]
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
              "and starts, more time per start on several observed states. Rows marked v3 hold the unknown initial "
              "values inside their prior boxes, as the fit's refined point (the others left them free: kept only "
              "where their optimum lies inside the boxes, where it is the same).", "",
              "| problem | best NLL | reached | starts for 95 % | ms/start | cost 95 % s | fits' median s |",
              "|---|---|---|---|---|---|---|"]
    ratios = []
    for pid in sorted({r["problem"] for r in rows}):
        ref = refs[pid]
        t = [r["steps13"] for r in rows if r["problem"] == pid and np.isfinite(r.get("steps13", np.nan))]
        if t and ref["starts_95"] > 0:
            ratios.append(np.median(t) / ref["cost_95"])
        c95 = f"{ref['cost_95']:.2f}" if ref["starts_95"] > 0 else "none reached (see misses: near)"
        version = {1: " (v1)", 3: " (v3)"}.get(ref.get("algorithm", 1), "")
        lines.append(f"| {pid}{version} | {ref['nll']:.8g} | {ref['n_reached']}/{ref['n_starts']} | {ref['starts_95']} | "
                     f"{ref['time_per_start'] * 1e3:.0f} | {c95} | "
                     f"{np.median(t) if t else float('nan'):.2f} |")
    if ratios:
        lines += ["", f"Fits' median steps 1-3 time / multi-start cost for 95 %: median over problems "
                  f"{np.median(ratios):.2f} (the fits are faster on {int(np.sum(np.array(ratios) < 1))} of "
                  f"{len(ratios)} problems). The multi-start's time per start is measured in its own run on the "
                  "same machine (contention differs between the two runs: compare as an order of magnitude; "
                  "`sidebyside` times both in one process)."]
    return "\n".join(lines) + "\n"


def cmd_competing(args) -> None:
    """Competing optima (``FitResult.competing_optima``) in plain default fits of every shipped model's
    cases, with the case's prior box and with pgpgm's default box, data seeds 0 to ``--seeds`` - 1:
    which fits report another optimum as good, and what it is (``results/robustness_competing.md``)."""
    env = harness.environment()
    rows = []
    for name in pgpgm.available_models():
        spec = pgpgm.load_model(name)
        for case_name, case in spec.cases.items():
            if case.theta is None:
                continue
            for box in ("case", "default"):
                for seed in range(args.seeds):
                    data = spec.simulate(case_name, seed=seed)
                    kwargs = {"priors": spec.priors(case_name)} if box == "case" else {}
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        r = pgpgm.fit(spec.system, data, list(case.observed), seed=seed, posterior=None,
                                      progressbar=False, **kwargs)
                    table = r.competing_optima
                    rows.append({"model": name, "case": case_name, "box": box, "seed": seed,
                                 "steps13_s": time.perf_counter() - t0, "nll": r.nll,
                                 "refined": " ".join(f"{v:.4g}" for v in r.theta), "competing": len(table),
                                 "exchanged": " ".join(table["exchanged"]),
                                 "delta_nll": " ".join(f"{v:.2g}" for v in table["delta_nll"]),
                                 "other": "; ".join(" ".join(f"{v:.4g}" for v in row)
                                                   for row in table[list(spec.system.parameters)].to_numpy()),
                                 "found_by": "; ".join(table["origin"])})
                    print(rows[-1], flush=True)
    hits = [r for r in rows if r["competing"]]
    harness.write("robustness_competing", rows, "Competing optima in plain default fits of the shipped models",
                  env=env, notes=f"{len(hits)} of {len(rows)} fits report another optimum within 2 nats of the "
                                 "refined one (`result.competing_optima`): " + (", ".join(sorted(
                                     {f"{r['model']} {r['case']} ({r['box']} box)" for r in hits})) or "none"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="one", choices=("design", "reference", "fits", "report", "one", "baseline",
                                                                 "sidebyside", "competing", "posterior"))
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
    parser.add_argument("--sbs", default=str(SBS), help="sidebyside: rows (JSON lines, one per problem; resumable)")
    parser.add_argument("--sbs-report", default=str(SBS_REPORT), help="sidebyside: the report")
    parser.add_argument("--sample", dest="starts_sample", type=int, default=20,
                        help="sidebyside: the reference multi-start's starts rerun per problem")
    parser.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                        help="sidebyside: do not time the stop rule and the least squares inside the fits")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="sidebyside: no untimed first fit")
    parser.add_argument("--posterior-out", default=str(RESULTS / "robustness_posterior.jsonl"),
                        help="posterior: rows (JSON lines, resumable)")
    parser.add_argument("--seeds", type=int, default=3, help="competing: data seeds per case and box")
    parser.add_argument("--design-seed", type=int, default=DESIGN_SEED,
                        help=f"the design's seed; another than {DESIGN_SEED} draws a held-out grid (ids d<seed>-..., "
                             "its own files robustness_d<seed>*.jsonl (references in benchmarks/references/) unless "
                             "--out/--references are given)")
    args = parser.parse_args(argv)
    if args.design_seed != DESIGN_SEED:  # a held-out design keeps its rows apart from the grid's
        tag = f"robustness_d{args.design_seed}"
        for name, default, path in (("out", ROWS, f"{tag}.jsonl"), ("references", REFERENCES, f"{tag}_reference.jsonl"),
                                    ("report", REPORT, f"{tag}.md")):
            if getattr(args, name) == str(default):
                setattr(args, name, str(default.parent / path))  # references/ or results/, as the grid's
    {"design": cmd_design, "reference": cmd_reference, "fits": cmd_fits, "report": cmd_report,
     "one": cmd_one, "baseline": cmd_baseline, "sidebyside": cmd_sidebyside,
     "competing": cmd_competing, "posterior": cmd_posterior}[args.command](args)


if __name__ == "__main__":
    main()

"""PEtab import: the PEtab test suite's cases and ten Benchmark-Models-PEtab problems, pass/refuse/fail.

For each test suite case (tests/data/petab_suite, v1.0.0 SBML): load time, llh and chi2 against the
case's solution, the largest simulation error, within the case's tolerances or not. For each
collection problem (tests/data/petab_collection): load time, the nll at the nominal parameters
against the llh that the petab library computes from the problem's simulatedData file, the largest
relative difference of the simulations from that file, and - where benchmarks/results/petab_amici.json
exists (benchmarks/petab_amici_reference.py, run with AMICI) - the same against AMICI. With
``--boehm-points``, the nll and gradient on Boehm_JProteomeRes2014 at the points AMICI used, side by
side, with the time per evaluation.

Two steps for the AMICI columns (AMICI lives in its own environment)::

    python benchmarks/petab_suite.py --write-points          # writes results/petab_boehm_points.json
    /tmp/amici-venv/bin/python benchmarks/petab_amici_reference.py --points benchmarks/results/petab_boehm_points.json
    python benchmarks/petab_suite.py
"""

from __future__ import annotations

import json
import time

import harness
import numpy as np
import pandas as pd
import yaml

import pgpgm

DATA = harness.ROOT / "tests" / "data"
SUITE = DATA / "petab_suite" / "v1.0.0" / "sbml"
COLLECTION = DATA / "petab_collection"
AMICI = harness.RESULTS / "petab_amici.json"
POINTS = harness.RESULTS / "petab_boehm_points.json"
BOEHM = COLLECTION / "Boehm_JProteomeRes2014" / "Boehm_JProteomeRes2014.yaml"


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a - b| / |b| (0 where both are 0)."""
    with np.errstate(all="ignore"):
        rel = np.where((a == 0) & (b == 0), 0.0, np.abs(a - b) / np.abs(b))
    return float(np.max(rel))


def suite_rows() -> list[dict]:
    rows = []
    for case in sorted(p.name for p in SUITE.iterdir() if p.is_dir()):
        solution = yaml.safe_load((SUITE / case / f"_{case}_solution.yaml").read_text())
        start = time.perf_counter()
        try:
            problem = pgpgm.load_petab(SUITE / case / f"_{case}.yaml")
        except pgpgm.ModelDefinitionError as exc:
            rows.append({"case": case, "result": "refused", "why": str(exc)[:120]})
            continue
        load = time.perf_counter() - start
        nominal = problem.nominal_parameters()
        llh, chi2 = -problem.nll(nominal), problem.chi2(nominal)
        expected = pd.concat([pd.read_csv(SUITE / case / f, sep="\t") for f in solution["simulation_files"]])
        error = float(np.max(np.abs(problem.simulate(nominal)["simulation"].to_numpy() - expected["simulation"])))
        ok = (abs(llh - solution["llh"]) <= solution["tol_llh"] and abs(chi2 - solution["chi2"]) <= solution["tol_chi2"]
              and error <= solution["tol_simulations"])
        rows.append({"case": case, "result": "pass" if ok else "FAIL", "load s": load, "llh": llh,
                     "llh expected": solution["llh"], "chi2": chi2, "chi2 expected": solution["chi2"],
                     "max simulation error": error})
    return rows


def collection_rows(amici: dict) -> list[dict]:
    rows = []
    for folder in sorted(p for p in COLLECTION.iterdir() if p.is_dir()):
        name = folder.name
        start = time.perf_counter()
        try:
            problem = pgpgm.load_petab(folder / f"{name}.yaml")
        except pgpgm.ModelDefinitionError as exc:
            rows.append({"problem": name, "result": "refused", "why": str(exc)[:120]})
            continue
        load = time.perf_counter() - start
        nominal = problem.nominal_parameters()
        start = time.perf_counter()
        simulated = problem.simulate(nominal)["simulation"].to_numpy()
        simulate = time.perf_counter() - start
        nll = problem.nll(nominal)
        reference = problem.align(next(folder.glob("simulatedData_*.tsv")))
        file_llh = problem.petab_llh(reference)
        row = {"problem": name, "load s": load, "simulate s": simulate, "nll": nll, "-llh (file)": -file_llh,
               "rel. to file": abs(nll + file_llh) / abs(file_llh),
               "max rel. sim. error (file)": _relative(simulated, reference)}
        if "llh" in amici.get(name, {}):
            row["-llh (AMICI)"] = -amici[name]["llh"]
            row["rel. to AMICI"] = abs(nll + amici[name]["llh"]) / abs(amici[name]["llh"])
            row["max rel. sim. error (AMICI)"] = _relative(simulated, problem.align(pd.DataFrame(amici[name]["table"])))
        rows.append(row)
    return rows


def boehm_points(n: int = 3, seed: int = 0) -> list[list[float]]:
    """The nominal point and ``n - 1`` points drawn uniformly within 0.5 of it on the parameters' scales."""
    problem = pgpgm.load_petab(BOEHM)
    z = problem.to_scale(problem.nominal_parameters())
    rng = np.random.default_rng(seed)
    return [z.tolist()] + [(z + rng.uniform(-0.5, 0.5, z.size)).tolist() for _ in range(n - 1)]


def boehm_rows(amici: dict) -> list[dict]:
    """pgpgm's nll and gradient beside AMICI's at AMICI's points (AMICI's llh is -nll)."""
    problem = pgpgm.load_petab(BOEHM)
    if [p.id for p in problem.estimated] != amici["ids"]:
        raise SystemExit(f"AMICI's parameters {amici['ids']} are not the estimated ones of {BOEHM.name}")
    rows = []
    for k, point in enumerate(amici["points"]):
        z = np.array(point["z"])
        problem.nll_and_gradient(z)  # compiled and warm
        seconds = harness.median_time(lambda z=z: problem.nll_and_gradient(z), repeat=20)
        nll, grad = problem.nll_and_gradient(z)
        ref = -np.array(point["gradient"])
        rows.append({"point": k, "nll": nll, "-llh (AMICI)": -point["llh"],
                     "rel. nll": abs(nll + point["llh"]) / abs(point["llh"]),
                     "max rel. gradient": float(np.max(np.abs(grad - ref)) / np.max(np.abs(ref))),
                     "pgpgm ms": seconds * 1e3, "AMICI ms": point["seconds"] * 1e3,
                     "pgpgm nll only ms": harness.median_time(_nudged(problem, z), repeat=20) * 1e3})
    return rows


def _nudged(problem, z: np.ndarray):
    """``problem.nll`` at z moved by 1e-12 more at each call: the integrator serves a repeated solve at the
    same point from its last result, which a fit never asks for."""
    calls = iter(range(1, 10 ** 6))
    return lambda: problem.nll(problem.from_scale(z + 1e-12 * next(calls)))


def main() -> None:
    ap = harness.parser(__doc__, "petab_suite")
    ap.add_argument("--write-points", action="store_true", help=f"write {POINTS.name} for AMICI and stop")
    args = ap.parse_args()
    if args.write_points:
        harness.RESULTS.mkdir(exist_ok=True)
        POINTS.write_text(json.dumps(boehm_points()))
        print("wrote", POINTS)
        return
    env = harness.environment()
    amici = json.loads(AMICI.read_text()) if AMICI.exists() else {}
    suite = suite_rows()
    collection = collection_rows(amici)
    sections = {"Benchmark-Models-PEtab problems at their nominal parameters": collection}
    if "Boehm_gradients" in amici:
        sections["Boehm_JProteomeRes2014: nll and gradient beside AMICI "
                 f"(AMICI {amici.get('amici')}, rtol/atol {amici.get('tolerances')})"] = boehm_rows(amici["Boehm_gradients"])
    passed = sum(r["result"] == "pass" for r in suite)
    refused = sum(r["result"] == "refused" for r in suite)
    harness.write(args.out, suite, "PEtab test suite v1.0.0 (SBML) and Benchmark-Models-PEtab problems", env=env,
                  notes=f"Test suite: {passed} pass, {refused} refused, {len(suite) - passed - refused} fail of "
                        f"{len(suite)} cases. " + ("" if amici else "No AMICI reference (run "
                                                   "benchmarks/petab_amici_reference.py for its columns)."),
                  sections=sections)


if __name__ == "__main__":
    main()

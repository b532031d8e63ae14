"""AMICI's side of the PEtab comparison: the ten collection problems' nominal llh and simulations, and
the llh and its gradient on Boehm_JProteomeRes2014 at given points, with the time per evaluation.

It imports neither pgpgm nor its dependencies: run it with a Python that has ``amici`` and ``petab``
(AMICI builds from source, needing a C++ compiler, SWIG and BLAS; keep it out of pgpgm's
environment, whose sympy it may move)::

    python -m venv /tmp/amici-venv && /tmp/amici-venv/bin/pip install amici petab
    /tmp/amici-venv/bin/python benchmarks/petab_amici_reference.py [--points points.json]

It writes ``benchmarks/results/petab_amici.json``, which ``benchmarks/petab_suite.py`` reads:
per problem the llh at the nominal parameters and the simulation table's values (in the
measurement table's row order), and with ``--points`` (a JSON list of parameter vectors on the
estimated parameters' scales, the order of the parameter table) Boehm's llh and gradient at each.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COLLECTION = ROOT / "tests" / "data" / "petab_collection"
OUT = ROOT / "benchmarks" / "results"
#: The solver tolerances for the reference (tighter than AMICI's defaults, as pgpgm's PEtab default).
RTOL, ATOL = 1e-12, 1e-14


def _problem(name: str):
    import petab.v1 as petab
    from amici.importers.petab.v1 import import_petab_problem

    problem = petab.Problem.from_yaml(COLLECTION / name / f"{name}.yaml")
    model = import_petab_problem(problem, output_dir=OUT / "amici_models" / name, compile_=None)
    solver = model.create_solver()
    solver.set_relative_tolerance(RTOL)
    solver.set_absolute_tolerance(ATOL)
    solver.set_max_steps(10 ** 6)
    return problem, model, solver


def nominal(name: str) -> dict:
    """llh and simulations at the nominal parameters."""
    from amici.sim.sundials.petab.v1 import rdatas_to_simulation_df, simulate_petab

    problem, model, solver = _problem(name)
    out = simulate_petab(problem, amici_model=model, solver=solver)
    sim = rdatas_to_simulation_df(out["rdatas"], model, problem.measurement_df)
    return {"llh": float(out["llh"]), "simulation": [float(x) for x in sim["simulation"]]}


def gradients(name: str, points: list[list[float]], repeats: int = 20) -> dict:
    """llh and its gradient (forward sensitivities) at each point on the parameters' scales."""
    import amici
    from amici.sim.sundials.petab.v1 import simulate_petab

    problem, model, solver = _problem(name)
    solver.set_sensitivity_order(amici.sim.sundials.SensitivityOrder.first)
    solver.set_sensitivity_method(amici.sim.sundials.SensitivityMethod.forward)
    ids = list(problem.x_free_ids)
    results = []
    for z in points:
        params = dict(zip(ids, z))
        out = simulate_petab(problem, amici_model=model, solver=solver, problem_parameters=params,
                             scaled_parameters=True, scaled_gradients=True)
        start = time.perf_counter()
        for _ in range(repeats):
            simulate_petab(problem, amici_model=model, solver=solver, problem_parameters=params,
                           scaled_parameters=True, scaled_gradients=True)
        seconds = (time.perf_counter() - start) / repeats
        results.append({"z": list(z), "llh": float(out["llh"]), "gradient": [float(out["sllh"][i]) for i in ids],
                        "seconds": seconds})
    return {"ids": ids, "points": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=Path, help="JSON list of Boehm parameter vectors (scaled)")
    parser.add_argument("problems", nargs="*", help="collection problems (default: all shipped)")
    args = parser.parse_args()
    names = args.problems or sorted(p.name for p in COLLECTION.iterdir() if p.is_dir())
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / "petab_amici.json"
    report = json.loads(target.read_text()) if target.exists() else {}
    import amici

    report["amici"] = amici.__version__
    report["tolerances"] = [RTOL, ATOL]
    for name in names:
        try:
            report[name] = nominal(name)
        except Exception as exc:  # reported, so that one problem AMICI refuses does not hide the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, {k: v for k, v in report[name].items() if k != "simulation"}, flush=True)
    if args.points:
        report["Boehm_gradients"] = gradients("Boehm_JProteomeRes2014", json.loads(args.points.read_text()))
        for p in report["Boehm_gradients"]["points"]:
            print("Boehm", p["llh"], f"{p['seconds'] * 1e3:.2f} ms")
    target.write_text(json.dumps(report, indent=1))
    print("wrote", target)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

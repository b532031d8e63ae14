"""AMICI's side of the PEtab comparison: the ten collection problems' nominal llh and simulations, and
the llh and its gradient on Boehm_JProteomeRes2014 at given points, with the time per evaluation.

It imports neither pgpgm nor its dependencies: run it with a Python that has ``amici`` and ``petab``
(AMICI builds from source, needing a C++ compiler, SWIG and BLAS; keep it out of pgpgm's
environment, whose sympy it may move)::

    python -m venv /tmp/amici-venv && /tmp/amici-venv/bin/pip install amici petab
    PATH=/tmp/amici-venv/bin:$PATH /tmp/amici-venv/bin/python benchmarks/petab_amici_reference.py \
        [--points points.json] [--test-data]

(the venv's ``bin`` first on ``PATH``: the models are built with the SWIG that AMICI was built with).
``--test-data`` also writes ``tests/data/petab_collection/amici_reference.json``, the reference of
``tests/test_petab_collection.py``.

It writes ``benchmarks/results/petab_amici.json``, which ``benchmarks/petab_suite.py`` reads:
per problem the llh at the nominal parameters and AMICI's simulation table, and with ``--points`` (a JSON list of parameter vectors on the
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
#: The reference that tests/test_petab_collection.py compares with (AMICI cannot run in CI).
TEST_DATA = COLLECTION / "amici_reference.json"


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
    table = sim.astype(object).where(sim.notna(), "")
    return {"llh": float(out["llh"]), "table": {c: [v if isinstance(v, str) else float(v) for v in table[c]]
                                                for c in table.columns}}


def gradients(name: str, points: list[list[float]], repeats: int = 20) -> dict:
    """llh and its gradient (forward sensitivities) at each point on the parameters' scales, and the time per
    evaluation: the experiments' data and the parameter mapping built once (as a fitter would), the solver
    at pgpgm's PEtab tolerances (rtol 1e-10, atol 1e-12) for the timing, at :data:`RTOL`, :data:`ATOL` for
    the values."""
    import amici
    import petab.v1 as petab
    from amici.sim.sundials.petab.v1 import create_edatas, simulate_petab
    from amici.sim.sundials.petab.v1._parameter_mapping import create_parameter_mapping

    problem, model, solver = _problem(name)
    conditions = petab.get_simulation_conditions(problem.measurement_df)
    edatas = create_edatas(model, problem, conditions)
    mapping = create_parameter_mapping(problem, conditions, scaled_parameters=True, amici_model=model)
    ids = list(problem.x_free_ids)
    fast = model.create_solver()
    fast.set_relative_tolerance(1e-10)
    fast.set_absolute_tolerance(1e-12)
    for s in (solver, fast):
        s.set_sensitivity_order(amici.sim.sundials.SensitivityOrder.first)
        s.set_sensitivity_method(amici.sim.sundials.SensitivityMethod.forward)

    def run(z, s):
        return simulate_petab(problem, amici_model=model, solver=s, problem_parameters=dict(zip(ids, z)),
                              scaled_parameters=True, scaled_gradients=True, edatas=edatas,
                              parameter_mapping=mapping)

    results = []
    for z in points:
        out = run(z, solver)
        run(z, fast)
        start = time.perf_counter()
        for _ in range(repeats):
            run(z, fast)
        seconds = (time.perf_counter() - start) / repeats
        results.append({"z": list(z), "llh": float(out["llh"]), "gradient": [float(out["sllh"][i]) for i in ids],
                        "seconds": seconds})
    return {"ids": ids, "points": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=Path, help="JSON list of Boehm parameter vectors (scaled)")
    parser.add_argument("--test-data", action="store_true",
                        help=f"also write the nominal llh and simulation tables to {TEST_DATA.relative_to(ROOT)}")
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
        except Exception as exc:  # noqa: BLE001 - reported, so that one problem AMICI refuses does not hide the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, {k: v for k, v in report[name].items() if k != "table"}, flush=True)
    if args.points:
        report["Boehm_gradients"] = gradients("Boehm_JProteomeRes2014", json.loads(args.points.read_text()))
        for p in report["Boehm_gradients"]["points"]:
            print("Boehm", p["llh"], f"{p['seconds'] * 1e3:.2f} ms")
    target.write_text(json.dumps(report, indent=1))
    print("wrote", target)
    if args.test_data:
        keep = {k: report[k] for k in ("amici", "tolerances")}
        keep.update({n: report[n] for n in sorted(report) if isinstance(report[n], dict) and
                     ("table" in report[n] or "error" in report[n])})
        TEST_DATA.write_text(json.dumps(keep, indent=0))
        print("wrote", TEST_DATA)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

"""ODE solve speed per backend: one Lotka-Volterra solve (20 output times on [0, 2], rtol = atol
= 1e-8), with and without forward sensitivities, by every backend (the explicit ``DOPRI5`` too) against
scipy's ``solve_ivp(LSODA)`` with a plain Python right-hand side (what a user would write). Median over
many solves, a fresh theta each (no reuse of a solver's last result); the backends interleaved round by
round.

Then the solve with forward sensitivities (what every step-4 gradient and step-3 Jacobian costs) on
the main job's FitzHugh-Nagumo and on larger systems - protein transduction (5 states), the
repressilator (6), the 10-state linear chain of ``runaways.py`` - at their published or runaway
settings; and step 4's log density with its gradient on the same systems (``build_ode_model``'s model,
one sensitivity solve each, noise sds free; the chain with its runaway case's states observed); with ``--before REF`` (a git commit or a folder holding ``pgpgm/``) each round also times
the same solves with REF's package in a subprocess, so that a change of the solver is measured side
by side in one run.

    ./run.sh bench ode_solve [--rounds 5] [--repeat 200] [--before REF]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

import harness
import pgpgm

#: the larger systems: (label, model name or None for the chain, case)
LARGER = (("FitzHugh-Nagumo, 2 states", "fitzhugh-nagumo", "R-observed"),
          ("protein transduction, 5 states", "protein-transduction", "R-latent"),
          ("repressilator, 6 states", "repressilator", "proteins-observed"),
          ("linear chain, 10 states", None, None))


def larger_solves() -> dict:
    """label -> a callable doing one solve with forward sensitivities (rtol = atol = 1e-8) at a fresh theta, by
    CVODE (the label alone) and by DOPRI5 (", DOPRI5"); and the step-4 gradient with CVODE."""
    rng = np.random.default_rng(1)
    out = {}
    for label, name, case_name in LARGER:
        if name is None:
            system, theta0 = harness.chain_system(), np.array(harness.CHAIN_RATES)
            x0 = np.zeros(10)
            x0[0] = 10.0
            times = np.linspace(0.0, 20.0, 50)
        else:
            spec = pgpgm.load_model(name)
            case = spec.case(case_name)
            system, theta0, x0, times = spec.system, np.asarray(case.theta, float), np.asarray(case.x0, float), case.times
        for cls in (pgpgm.CVODE, *([pgpgm.DOPRI5] if hasattr(pgpgm, "DOPRI5") else [])):  # --before: older trees
            it = pgpgm.Integrator(system, times, cls(rtol=1e-8, atol=1e-8))
            out[label + ("" if cls is pgpgm.CVODE else ", DOPRI5")] = (
                lambda it=it, th=theta0, x=x0:
                it.solve_sensitivities(th * (1 + 1e-3 * rng.standard_normal(th.size)), x))
        observed = list(harness.CHAIN_OBSERVED) if name is None else list(spec.case(case_name).observed)
        data = pgpgm.simulate(system, theta0, x0, times, observed=observed, snr=100.0, seed=0)
        out[f"step-4 gradient, {label}"] = _model_gradient(system, data, observed, rng)
    return out


def _model_gradient(system, data, observed, rng):
    """One evaluation of the log density and its gradient of ``build_ode_model``'s model of ``data``
    (priors Uniform(0, 10), the noise sds free) at its initial point jittered by 1e-3, as NUTS makes them."""
    from pymc.blocking import DictToArrayBijection

    model, _ = pgpgm.build_ode_model(system, data, observed, priors=(0.0, 10.0), noise_center=[0.1] * len(observed))
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    x = DictToArrayBijection.map(model.initial_point()).data
    return lambda: fn(x + 1e-3 * rng.standard_normal(x.size))


def worker(repeat: int) -> None:
    """One round of the larger systems' sensitivity solves (this process's pgpgm); prints JSON medians."""
    fns = larger_solves()
    timed = harness.side_by_side(fns, rounds=1, repeat=repeat, warmup=3)
    print("ROW " + json.dumps({k: timed.median(k) for k in fns}))


def before_round(tree: Path, repeat: int) -> dict:
    """One round of :func:`worker` with the package in ``tree``, in a subprocess."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parent)])}
    out = subprocess.run([sys.executable, __file__, "--worker", "--repeat", str(repeat)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("ROW "))[4:])


def main() -> None:
    ap = harness.parser(__doc__, "ode_solve")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--repeat", type=int, default=200, help="solves per backend and round (median)")
    ap.add_argument("--before", help="a git commit or folder: its package's larger sensitivity solves beside today's")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:  # one round for --before: ``--repeat`` is the solves per system
        return worker(a.repeat)
    env = harness.environment()
    spec = pgpgm.load_model("lotka-volterra")
    case = spec.case()
    t = case.times
    rng = np.random.default_rng(0)

    def theta():  # a fresh theta each call
        return case.theta * (1 + 1e-3 * rng.standard_normal(case.theta.size))

    def lv(tt, y, a_, b, c, d):
        return [a_ * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]

    solves = {"scipy solve_ivp LSODA (Python RHS)": lambda: solve_ivp(
        lv, (t[0], t[-1]), case.x0, t_eval=t, args=tuple(theta()), method="LSODA", rtol=1e-8, atol=1e-8)}
    sens = {}
    for cls in (*pgpgm.available_solvers(), pgpgm.DOPRI5):
        solver = pgpgm.Integrator(spec.system, t, cls(rtol=1e-8, atol=1e-8))
        solves[f"pgpgm {cls.name}"] = lambda s=solver: s.solve(theta(), case.x0)
        sens[f"pgpgm {cls.name}"] = lambda s=solver: s.solve_sensitivities(theta(), case.x0)
    plain = harness.side_by_side(solves, rounds=a.rounds, repeat=a.repeat, warmup=3)
    with_sens = harness.side_by_side(sens, rounds=a.rounds, repeat=a.repeat, warmup=3)
    base = next(iter(solves))
    rows = [{"backend": k, "solve_ms": 1e3 * plain.median(k),
             "sensitivities_ms": 1e3 * with_sens.median(k) if k in sens else float("nan"),
             "speed_up_vs_scipy_lsoda": plain.median(base) / plain.median(k)} for k in solves]
    larger = larger_solves()
    tree = harness.source_tree(a.before) if a.before else None
    now: dict[str, list[float]] = {k: [] for k in larger}
    then: dict[str, list[float]] = {k: [] for k in larger}
    repeat = max(a.repeat // 4, 10)

    def today(r: int) -> None:
        if tree is not None:  # as REF's: a fresh subprocess, so that neither side runs in a warmer process
            for k, v in before_round(Path(__file__).resolve().parent.parent, repeat).items():
                now[k].append(v)
            return
        timed = harness.side_by_side(larger, rounds=1, repeat=repeat, warmup=3 if r == 0 else 0)
        for k in larger:
            now[k].append(timed.median(k))

    def before(r: int) -> None:
        if tree is not None:
            for k, v in before_round(tree, repeat).items():
                then[k].append(v)

    for r in range(a.rounds):  # today's and REF's solves alternate which goes first, round by round
        for step in ((today, before) if r % 2 == 0 else (before, today)):
            step(r)
    systems = []
    for k in larger:
        row = {"system": k, "sensitivities_ms": 1e3 * float(np.median(now[k]))}
        if tree is not None and then[k]:
            row["before_sensitivities_ms"] = 1e3 * float(np.median(then[k]))
            row["before_over_now"] = float(np.median(then[k]) / np.median(now[k]))
        systems.append(row)
    harness.write(a.out, rows, "ODE solve: Lotka-Volterra, 20 output times on [0, 2], rtol = atol = 1e-8; "
                  "sensitivity solves of larger systems", env=env,
                  notes=f"Median ms per solve ({a.rounds} interleaved rounds x {a.repeat} solves, a fresh theta "
                        "each); sensitivities: the solve with forward sensitivities in every parameter and "
                        "initial value; step-4 gradient: the model's log density and gradient (sensitivities "
                        f"to its free initial values). Larger systems: {repeat} solves per round"
                        + (f"; before: {a.before}, in a subprocess per round, alternating with today's (in a "
                           "subprocess too)" if tree else ""),
                  sections={"Solves with forward sensitivities, pgpgm's CVODE (and DOPRI5), rtol = atol = 1e-8": systems})


if __name__ == "__main__":
    main()

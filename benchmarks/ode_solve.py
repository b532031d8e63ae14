"""ODE solve speed per backend: one Lotka-Volterra solve (20 output times on [0, 2], rtol = atol
= 1e-8), with and without forward sensitivities, against scipy's ``solve_ivp(LSODA)`` with a
plain Python right-hand side (what a user would write). Median over many solves, a fresh theta
each (no reuse of a solver's last result); the backends interleaved round by round.

    ./run.sh bench ode_solve [--rounds 5] [--repeat 200]
"""

from __future__ import annotations

import numpy as np
from scipy.integrate import solve_ivp

import harness
import pgpgm


def main() -> None:
    ap = harness.parser(__doc__, "ode_solve")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--repeat", type=int, default=200, help="solves per backend and round (median)")
    a = ap.parse_args()
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
    for cls in pgpgm.available_solvers():
        solver = pgpgm.Integrator(spec.system, t, cls(rtol=1e-8, atol=1e-8))
        solves[f"pgpgm {cls.name}"] = lambda s=solver: s.solve(theta(), case.x0)
        sens[f"pgpgm {cls.name}"] = lambda s=solver: s.solve_sensitivities(theta(), case.x0)
    plain = harness.side_by_side(solves, rounds=a.rounds, repeat=a.repeat, warmup=3)
    with_sens = harness.side_by_side(sens, rounds=a.rounds, repeat=a.repeat, warmup=3)
    base = next(iter(solves))
    rows = [{"backend": k, "solve_ms": 1e3 * plain.median(k),
             "sensitivities_ms": 1e3 * with_sens.median(k) if k in sens else float("nan"),
             "speed_up_vs_scipy_lsoda": plain.median(base) / plain.median(k)} for k in solves]
    harness.write(a.out, rows, "ODE solve: Lotka-Volterra, 20 output times on [0, 2], rtol = atol = 1e-8", env=env,
                  notes=f"Median ms per solve ({a.rounds} interleaved rounds x {a.repeat} solves, a fresh theta "
                        "each); sensitivities: the solve with forward sensitivities in every parameter and "
                        "initial value.")


if __name__ == "__main__":
    main()

"""Median time of one Lotka-Volterra solve (20 output times on [0, 2], rtol = atol = 1e-8),
with and without forward sensitivities, per backend, against scipy's solve_ivp(LSODA)
with a plain Python right-hand side (what a user would write).

    ./run.sh bench ode_solve
"""

import numpy as np
from scipy.integrate import solve_ivp

import pgpgm
from _common import median_time, write

spec = pgpgm.load_model("lotka-volterra")
case = spec.case()
t = case.times
rng = np.random.default_rng(0)


def thetas():
    while True:  # a fresh theta each call: no reuse of the solver's last result
        yield case.theta * (1 + 1e-3 * rng.standard_normal(4))


def lv(tt, y, a, b, c, d):
    return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]


def lsoda(th):
    return solve_ivp(lv, (0, 2), case.x0, t_eval=t, args=tuple(th), method="LSODA", rtol=1e-8, atol=1e-8)


gen = thetas()
ref = median_time(lambda: lsoda(next(gen)), repeat=200)
rows = [{"backend": "scipy solve_ivp LSODA (Python RHS)", "solve_ms": ref * 1e3, "sensitivities_ms": float("nan"),
         "speed-up vs LSODA": 1.0}]
for cls in pgpgm.available_solvers():
    solver = pgpgm.Integrator(spec.system, t, cls(rtol=1e-8, atol=1e-8))
    solver.solve(case.theta, case.x0)
    solver.solve_sensitivities(case.theta, case.x0)
    a = median_time(lambda: solver.solve(next(gen), case.x0), repeat=500)
    b = median_time(lambda: solver.solve_sensitivities(next(gen), case.x0), repeat=200)
    rows.append({"backend": f"pgpgm {cls.name}", "solve_ms": a * 1e3, "sensitivities_ms": b * 1e3,
                 "speed-up vs LSODA": ref / a})
write("ode_solve", rows, "## Lotka-Volterra solve, 20 output times on [0, 2], rtol = atol = 1e-8 (median)")

"""pk-infusion (switches at t = 1, 12, 13): solving piecewise between the breakpoints against
stepping over them (the solve before the breakpoints existed: the same kernel with no breaks,
which is that solve call for call), side by side in one process.

Per backend and way: the median time of one solve and of one solve with sensitivities (50
output times on [0, 24], rtol = atol = 1e-8, a fresh theta each call), the largest error
against the closed-form solution (relative to each state's range), and the largest jump of
the solution when an unknown moves by 1e-7 from (CL, V, ke0, C0, Ce0) = (5, 20, 0.7, 0.3, 0.2)
(second differences over 100 such steps, relative to the range; a smooth function of the
unknowns gives rounding-level values).

    ./run.sh bench breakpoints
"""

import numpy as np

import pgpgm
from _common import median_time, write

system = pgpgm.load_model("pk-infusion").system
TIMES = np.linspace(0.0, 24.0, 50)
THETA = np.array([5.0, 20.0, 0.7])
RATES = [(0.0, 100.0), (1.0, 0.0), (12.0, 100.0), (13.0, 0.0)]
rng = np.random.default_rng(0)


def exact(times, CL, V, ke0):
    """C and Ce in closed form (piecewise exponentials; see tests/test_breakpoints.py)."""
    k, out, C, Ce = CL / V, np.empty((times.size, 2)), 0.0, 0.0
    for (a, R), b in zip(RATES, [1.0, 12.0, 13.0, np.inf]):
        A = R / CL
        G = (C - A) * ke0 / (ke0 - k)
        D = Ce - A - G
        m = (times >= a) & (times <= b)
        tau = times[m] - a
        out[m] = np.c_[A + (C - A) * np.exp(-k * tau), A + G * np.exp(-k * tau) + D * np.exp(-ke0 * tau)]
        if np.isfinite(b):
            C, Ce = A + (C - A) * np.exp(-k * (b - a)), A + G * np.exp(-k * (b - a)) + D * np.exp(-ke0 * (b - a))
    return out


def jumps(it):
    q0, worst = np.array([*THETA, 0.3, 0.2]), 0.0
    for k in range(5):
        xs = np.array([it.solve(*np.split(q0 + j * 1e-7 * np.eye(5)[k], [3])) for j in range(100)])
        worst = max(worst, np.abs(np.diff(xs, 2, axis=0)).max() / np.abs(xs).max())
    return worst


ref = exact(TIMES, *THETA)
rows = []
for cls in pgpgm.available_solvers():
    for piecewise in (True, False):
        it = pgpgm.Integrator(system, TIMES, cls(rtol=1e-8, atol=1e-8))
        if not piecewise:
            it.breakpoints = np.empty(0)
        x = it.solve(THETA, [0.0, 0.0])
        it.solve_sensitivities(THETA, [0.0, 0.0])
        repeat = 300 if cls.name == "cvode" else 30
        a = median_time(lambda: it.solve(THETA * (1 + 1e-3 * rng.standard_normal(3)), [0.0, 0.0]), repeat=repeat)
        b = median_time(lambda: it.solve_sensitivities(THETA * (1 + 1e-3 * rng.standard_normal(3)), [0.0, 0.0]),
                        repeat=repeat)
        rows.append({"backend": cls.name, "way": "piecewise (now)" if piecewise else "over the switches (before)",
                     "solve_ms": a * 1e3, "sensitivities_ms": b * 1e3,
                     "max error vs closed form": float(np.max(np.abs(x - ref) / np.abs(ref).max(axis=0))),
                     "max jump per 1e-7 step": jumps(it) if cls.name == "cvode" else float("nan")})
write("breakpoints", rows, "## pk-infusion, 50 output times on [0, 24], rtol = atol = 1e-8 (median)")

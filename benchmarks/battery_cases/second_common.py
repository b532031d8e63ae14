"""Helpers of the second battery's cases (second_valid, second_invalid, second_invalid_more): small systems, data
and checks, written from the documentation alone (README, docs/, models/, notebooks/, public docstrings)."""

from __future__ import annotations

import json

import numpy as np

from battery_cases.common import FAST, SUITE, pg

QUICK = dict(FAST, posterior=None)  # steps 1-3, small step-2 budget
QUICK_NP = dict(FAST)  # the same budget, step 4 given by the case
SMALL_NUTS = dict(draws=200, tune=200, chains=2, budget=30)


def decay():
    return pg().ODESystem.from_equations({"x": "-k*x"}, parameters=["k"])


def chain3():
    """A -> B -> C; C measured in the cases, A and B latent."""
    return pg().ODESystem.from_equations({"A": "-k1*A", "B": "k1*A - k2*B", "C": "k2*B"}, parameters=["k1", "k2"])


def decay_data(times=None, k=0.8, x0=2.0, noise_sd=0.05, seed=0, start=None):
    """Decay data at ``times``; with ``start`` the value x0 holds at ``start`` (before the first time)."""
    times = np.linspace(0.0, 4.0, 15) if times is None else np.asarray(times, dtype=float)
    grid = times if start is None else np.r_[start, times]
    ds = pg().simulate(decay(), [k], [x0], grid, noise_sd=noise_sd, seed=seed)
    return ds if start is None else ds.sel(time=times)


def lv_both(n=20, seed=0, noise_sd=0.1, noise=None):
    spec = pg().load_model("lotka-volterra")
    return spec, pg().simulate(spec.system, [2.0, 1.0, 4.0, 1.0], [5.0, 3.0], np.linspace(0.0, 2.0, n),
                               noise_sd=noise_sd, seed=seed, noise=noise)


def refined(r, p):
    return float(r.estimates["theta"].sel(estimate="refined", parameter=p))


def settings(r):
    return json.loads(r.gradient_matching.attrs["pgpgm_settings"])


def noise_of(r, s):
    da = r.trajectories["noise_sd"]
    for d in da.dims:
        if s in [str(v) for v in da[d].values]:
            return np.asarray(da.sel({d: s}).values, dtype=float)
    return np.asarray(da.values, dtype=float)


def post(r):
    return r.posterior.posterior


def draws_of(r, name):
    """The main posterior's draws of ``name`` (a scalar variable, or one entry along a non-sample dim); None."""
    po = post(r)
    if name in po:
        return po[name].values
    for v in po.data_vars:
        da = po[v]
        for d in da.dims:
            if d not in ("chain", "draw") and name in [str(x) for x in da[d].values]:
                return da.sel({d: name}).values
    return None


def same_posterior(chk, a, b, what, key):
    """Every variable of two main posteriors equal, number for number."""
    pa, pb = post(a), post(b)
    chk.true(sorted(pa.data_vars) == sorted(pb.data_vars), f"{what}: the same variables", key=key)
    for v in pa.data_vars:
        if v in pb:
            chk.close(pa[v].values, pb[v].values, f"{what}: {v}", key=key, rtol=0, atol=0)


def check_fixed(chk, r, fixed):
    for p, v in fixed.items():
        est = r.estimates["theta"]
        if p in [str(x) for x in est["parameter"].values]:
            chk.close(refined(r, p), v, f"refined estimate of the fixed {p}", key=p)
        chk.close(r.fixed.get(p, np.nan), v, f"result.fixed['{p}']", key=p)
        if r.posterior is not None:
            d = draws_of(r, p)
            if d is not None:
                chk.close(d, v, f"posterior draws of the fixed {p}", key=p)


def step4_seconds(r):
    t = {k: float(v) for k, v in dict(r.timings).items()}
    hits = [v for k, v in t.items() if "post" in k.lower() or "4" in k]
    return max(hits) if hits else None


def suite_problem(number):
    return pg().load_petab(SUITE / number / f"_{number}.yaml")


def suite_solution(number):
    import yaml

    return yaml.safe_load((SUITE / number / f"_{number}_solution.yaml").read_text())


def pk_lognormal_after_dose(sd=0.1, seed=0):
    """pk-oral's C after a 4.5 dose at t = 0 (first sample 0.25 h) with lognormal noise, as a wide dict (the noise drawn
    here: pgpgm.simulate cannot draw lognormal noise at t = 0, where C = 0)."""
    p = pg()
    pk = p.load_model("pk-oral")
    t = np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
    ds = p.simulate(pk.system, pk.case().theta, [4.5, 0.0], np.r_[0.0, t], observed=["A"], noise_sd=0.1, seed=seed)
    c = ds["truth"].sel(state="C").values[1:]
    return pk, {"time": t, "C": c * np.exp(sd * np.random.default_rng(seed).standard_normal(t.size))}


def sir_from_day_1(**noise):
    """The SIR model, counts of I simulated on days 1-14 from a start at day 0 (``noise``: simulate's noise
    arguments, seed included), and the start x0 (S, I, R at t0 = 0)."""
    sir = pg().load_model("sir")
    t = np.arange(1.0, 15.0)
    ds = pg().simulate(sir.system, [1.7, 0.45], [762.0, 1.0, 0.0], np.r_[0.0, t], observed=["I"], **noise).sel(time=t)
    return sir, ds, {"S": 762.0, "I": 1.0, "R": 0.0}


def lv_from_0(spec, t):
    """Lotka-Volterra x1 (theta 2, 1, 4, 1; x0 5, 3 at t = 0; sd 0.1, seed 0) measured at the times ``t`` only."""
    return pg().simulate(spec.system, [2.0, 1.0, 4.0, 1.0], [5.0, 3.0], np.r_[0.0, t], observed=["x1"], noise_sd=0.1,
                         seed=0).sel(time=t)

"""What the battery's cases share: the registry (:func:`case`), what a case checks (:class:`Checks`), the
call under test of an invalid case (:func:`bad`), the command line, and the data and models the cases use."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(os.environ.get("PGPGM_BATTERY_ROOT") or Path(__file__).resolve().parents[2])
MODELS = ROOT / "models"
SUITE = ROOT / "tests" / "data" / "petab_suite" / "v1.0.0" / "sbml"
COLLECTION = ROOT / "tests" / "data" / "petab_collection"
PGPGM_CLI = str(Path(sys.executable).parent / "pgpgm")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "battery.jsonl"
TIMEOUT = 120

# small step-2 budget for every fit (the docs' notebooks use 200-300 in their fast mode)
FAST = dict(draws=300, tune=300, progressbar=False)

CASES: dict[str, dict] = {}


def case(kind, names=(), timeout=None, note=""):
    """Register a case. ``names``: for an invalid case, substrings (any one) the error message should hold."""

    def register(fn):
        CASES[fn.__name__] = dict(kind=kind, fn=fn, names=tuple(names), timeout=timeout or TIMEOUT,
                                  note=note or (fn.__doc__ or "").strip().splitlines()[0] if (note or fn.__doc__) else "")
        return fn

    return register


# ----------------------------------------------------------------------------------------------- the harness
_MARK = {"t": None}


@contextlib.contextmanager
def bad():
    """Marks the call under test of an invalid case: what raises before it is a set-up error of the case."""
    _MARK["t"] = time.perf_counter()
    yield


class CLIOutcome(Exception):
    """The outcome of a command-line call under test (an invalid CLI case)."""

    def __init__(self, rc, stdout, stderr):
        super().__init__(stderr.strip()[-2000:] or stdout.strip()[-2000:])
        self.rc, self.stdout, self.stderr = rc, stdout, stderr


class Checks:
    """What a valid case checks: each failed check is an issue, keyed by the name a warning would mention."""

    def __init__(self):
        self.issues = []

    def close(self, got, want, what, key, rtol=1e-9, atol=1e-12):
        try:
            g, w = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
            ok = g.shape == w.shape or g.size == 1 or w.size == 1
            ok = ok and bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        except Exception as err:  # noqa: BLE001
            ok, g = False, f"{type(err).__name__}: {err}"
        if not ok:
            self.issues.append(dict(what=what, got=_short(got), want=_short(want), key=key))
        return ok

    def true(self, cond, what, key, got=None):
        if not cond:
            self.issues.append(dict(what=what, got=_short(got), want=None, key=key))
        return bool(cond)


def _short(v):
    try:
        a = np.asarray(v, dtype=float)
        if a.size > 6:
            nan = int(np.isnan(a).sum())
            return (f"array{a.shape} min={np.nanmin(a):.6g} max={np.nanmax(a):.6g}" if nan < a.size else
                    f"array{a.shape} all NaN") + (f" ({nan} NaN)" if nan else "")
        return a.round(10).tolist()
    except Exception:  # noqa: BLE001
        return str(v)[:200]


def run_cli(*args, timeout=110):
    p = subprocess.run([PGPGM_CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return p


def cli_ok(*args):
    p = run_cli(*args)
    if p.returncode != 0:
        raise RuntimeError(f"pgpgm {' '.join(map(str, args[:2]))} exited {p.returncode}: {p.stderr.strip()[-1500:]}")
    return p


def cli_bad(*args):
    """Run a command line expected to be refused; a fit it starts anyway gets a short budget."""
    args = list(args)
    if args[0] == "fit" and "--petab" not in args and "--draws" not in args:
        args += ["--draws", "300", "--tune", "300"]
    if args[0] == "fit" and "--petab" not in args and "--posterior" not in args and "--posterior-budget" not in args:
        args += ["--posterior", "none"]
    with bad():
        try:
            p = run_cli(*args, timeout=100)
        except subprocess.TimeoutExpired:
            raise CLIOutcome(None, "", "") from None
        raise CLIOutcome(p.returncode, p.stdout, p.stderr)


# ================================================================================================ helpers
def pg():
    import pgpgm

    return pgpgm


def lv_spec():
    return pg().load_model("lotka-volterra")


def lv_data(observed=("x1",), n=20, seed=0, noise_sd=0.1, times=None, **kw):
    spec = lv_spec()
    case_ = spec.case("x1-observed")
    times = np.linspace(0.0, 2.0, n) if times is None else times
    return pg().simulate(spec.system, case_.theta, case_.x0, times, observed=list(observed), noise_sd=noise_sd,
                         seed=seed, **kw)


def to_tidy(ds):
    """A simulate() Dataset as the tidy table time,state,value (measured values only)."""
    y = ds["y"].to_pandas()
    t = y.stack().rename("value").reset_index()
    t = t.rename(columns={"observed": "state"})[["time", "state", "value"]].dropna().reset_index(drop=True)
    return t


def to_wide(ds):
    y = ds["y"].to_pandas()
    d = {"time": y.index.to_numpy()}
    for c in y.columns:
        d[str(c)] = y[c].to_numpy()
    return d


def pk_after_dose(seed=0, noise_sd=0.2, dose=4.5):
    """The docs' oral-dose example: dose at t = 0, first sample at 0.25 h."""
    pk = pg().load_model("pk-oral")
    t = np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0])
    data = pg().simulate(pk.system, pk.case().theta, [dose, 0.0], np.r_[0.0, t], observed=["C"], noise_sd=noise_sd,
                         seed=seed).sel(time=t)
    return pk, data, t


def post_is_step4(r):
    return r.posterior is not None and "pgpgm_settings" not in r.posterior.attrs


def check_held(chk, r, x0, t0=None):
    """Every value of ``x0`` held: result.x0, the refined (and posterior) trajectories at t0, step 4's draws."""
    x = r.trajectories["x"]
    if t0 is not None:
        chk.close(float(x["time_dense"][0]), t0, "trajectories start at t0 (time_dense[0])", key="t0")
    for s, v in x0.items():
        chk.close(r.x0[s], v, f"result.x0['{s}']", key=s)
        for est in x["estimate"].values:
            if est in ("refined", "posterior"):
                chk.close(float(x.sel(estimate=est, state=s).isel(time_dense=0)), v,
                          f"trajectory '{est}' of {s} at its first time", key=s)
        chk.close(r.estimates["x0"].sel(state=s), v, f"estimates['x0'] of {s}", key=s)
        if post_is_step4(r):
            post = r.posterior.posterior
            if f"{s}_0" in post:
                chk.close(post[f"{s}_0"].values, v, f"posterior draws of {s}_0 (a held value, sampled)", key=s)
            if s in post and "time_dense" in post[s].dims:
                if t0 is not None:
                    chk.close(float(post["time_dense"][0]), t0, "posterior trajectories start at t0", key="t0")
                chk.close(post[s].isel(time_dense=0).values, v, f"posterior draws of {s} at its first time", key=s)


def write(path, text):
    path = Path(path)
    path.write_text(text)
    return path


def copy_suite(tmp, number="0001"):
    dst = Path(tmp) / f"petab_{number}"
    shutil.copytree(SUITE / number, dst)
    return dst, dst / f"_{number}.yaml"


def theoph_subset(ids=("1", "2", "3"), after_dose=False):
    p = pg()
    th, inp = p.datasets.theophylline(), p.datasets.theophylline_inputs()
    th = th[th["experiment"].isin(ids)]
    if after_dose:
        th = th[th["time"] > 0]
    return th, inp[inp["experiment"].isin(ids)]


def pk_csv(tmp, after_dose=True):
    pk, data, t = pk_after_dose()
    df = to_tidy(data)
    path = tmp / "obs.csv"
    df.to_csv(path, index=False)
    return path


def theoph_study(ids=("1", "2", "3")):
    """Theophylline subjects ``ids``: their data, inputs, the Study with the dose as A(0) and C(0) = 0, pk-oral."""
    th, inp = theoph_subset(ids)
    p = pg()
    return th, inp, p.Study.from_tidy(th, inp, x0={"A": "dose_mg_per_kg", "C": 0.0}), p.load_model("pk-oral")


def chain_toml(name: str, description: str, a0: float, num: int) -> str:
    """The text of a TOML model file of the chain A -> B -> (gone), B measured (the docs' model-file example):
    A(0) = ``a0``, ``num`` times on [0, 8]."""
    return f"""name = "{name}"
description = "{description}"
parameters = ["k1", "k2"]

[equations]
A = "-k1*A"
B = "k1*A - k2*B"

[experiment]
theta = [1.0, 0.4]
x0 = [{a0!r}, 0.0]
times = {{ start = 0.0, stop = 8.0, num = {num} }}
noise_sd = 0.05
kernel = "rbf"
gamma = 0.3
priors = {{ lower = 0.0, upper = 5.0 }}

[cases.B-observed]
observed = ["B"]
"""

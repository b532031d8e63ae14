"""A new user's battery of pgpgm cases: valid input must fit and honour what the user gave, invalid input must
be refused early by pgpgm with a message that names the input.

Written from the documentation alone (README.md, docs/, models/, notebooks/, the public docstrings), as a
held-out measurement: no case was written by reading how pgpgm handles it.

    python benchmarks/battery.py [--set first|second|all] [--only NAME[,NAME...]] [--out FILE] [--update] [--list]
                                 [--timeout S]

--set chooses the cases: ``first`` (default; valid_fits, valid_more, invalid_fits, invalid_more), ``second`` (the
held-out second battery: second_valid, second_valid_more, second_invalid, second_invalid_more; default output
benchmarks/results/battery2.jsonl) or ``all``.

Each case runs in its own process (this script with --child NAME) with a timeout (120 s), so that a crash
or a hang ends only that case. Outcomes:

- valid:   ok | silent (a value the user gave - x0, t0, a fixed parameter, a seed, a prior box, a budget - was
           not held, and no pgpgm warning said so) | valid-raises | timeout
- invalid: ok (a pgpgm error, or a ValueError/TypeError raised inside pgpgm, whose message names the input
           or says what to do) | unclear (neither) | crash (an exception from deep inside a dependency,
           KeyError/IndexError/AttributeError/..., a dead process or a hang) | accepted (no error)
- battery-error: the case's own set-up failed before the call under test (a bug of this file).

One JSON line per case goes to --out (default benchmarks/results/battery.jsonl); --update replaces the lines
of the cases run and keeps the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path



from battery_cases import invalid_fits, invalid_more, valid_fits, valid_more  # noqa: F401  (register)
from battery_cases import second_invalid, second_invalid_more, second_valid, second_valid_more  # noqa: F401
from battery_cases.common import *  # noqa: F403
from battery_cases.common import _MARK


SETS = {"first": {m.__name__ for m in (valid_fits, valid_more, invalid_fits, invalid_more)},
        "second": {m.__name__ for m in (second_valid, second_valid_more, second_invalid, second_invalid_more)}}
SETS["all"] = SETS["first"] | SETS["second"]
OUTS = {"first": DEFAULT_OUT, "second": DEFAULT_OUT.with_name("battery2.jsonl"),
        "all": DEFAULT_OUT.with_name("battery_all.jsonl")}


def child(name, json_path):
    """Run one case in this process and write what happened to ``json_path``."""
    spec = CASES[name]
    out = dict(name=name, kind=spec["kind"], names=list(spec["names"]))
    tmp = tempfile.mkdtemp(prefix=f"battery_{name}_")
    os.chdir(ROOT)
    t_start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import pgpgm  # noqa: F401

            ret = spec["fn"](Path(tmp))
            out["status"] = "returned"
            if isinstance(ret, Checks):
                out["issues"] = ret.issues
            elif isinstance(ret, dict):
                out["issues"] = ret.get("issues", [])
                out["info"] = ret.get("info")
                out["expect_warning"] = ret.get("expect_warning")
        except BaseException as err:  # noqa: BLE001
            mark = _MARK["t"]
            out["status"] = "raised"
            out["before_call"] = spec["kind"] == "invalid" and mark is None
            out["seconds_to_error"] = None if mark is None else time.perf_counter() - mark
            out["exc_type"] = type(err).__name__
            out["exc_module"] = type(err).__module__
            out["exc_mro"] = [c.__module__ + "." + c.__name__ for c in type(err).__mro__]
            out["message"] = str(err)[:4000]
            tb = traceback.extract_tb(err.__traceback__)
            out["traceback_tail"] = [f"{f.filename}:{f.lineno} {f.name}" for f in tb[-4:]]
            last = tb[-1].filename if tb else ""
            import pgpgm as _p

            pkg = str(Path(_p.__file__).resolve().parent)
            out["raised_in"] = ("pgpgm" if str(Path(last).resolve()).startswith(pkg) else
                                "battery" if Path(last).resolve() == Path(__file__).resolve() else last)
            if isinstance(err, CLIOutcome):
                out["cli_rc"], out["cli_stderr"] = err.rc, err.stderr[-3000:]
            out["exc_text"] = "".join(traceback.format_exception_only(type(err), err))[:3000]
        out["warnings"] = [dict(category=w.category.__name__, module=w.category.__module__,
                                message=str(w.message)[:600]) for w in caught
                           if w.category.__module__.startswith("pgpgm") or "pgpgm" in str(w.filename)
                           or Path(str(w.filename)).name == Path(__file__).name]
    out["seconds"] = time.perf_counter() - t_start
    shutil.rmtree(tmp, ignore_errors=True)
    Path(json_path).write_text(json.dumps(out, default=str))


ADVICE = re.compile(r"\b(use|give|pass|must|should|expected|expects|remove|rename|rescale|sort|drop|choose|set|"
                    r"leave|write|add|one of|known|did you mean|instead|needs?|requires?|at least|at most|"
                    r"allowed|only|try|widen|fix|convert)\b", re.I)
CRASH_TYPES = {"KeyError", "IndexError", "ZeroDivisionError", "LinAlgError", "AttributeError", "UnboundLocalError",
               "NameError", "AssertionError", "RecursionError", "OverflowError", "FloatingPointError", "RuntimeError",
               "NotImplementedError", "StopIteration", "SystemError", "MemoryError"}


def classify(spec, res):
    """(outcome, detail) of one case's child record ``res`` (None: the process died or hung)."""
    kind = spec["kind"]
    if res.get("timed_out"):
        return ("timeout" if kind == "valid" else "crash"), f"no result within {res['timeout']} s (hang)"
    if res.get("died"):
        detail = f"process died, exit code {res['rc']}: {res.get('stderr_tail', '')[-300:]}"
        return ("valid-raises" if kind == "valid" else "crash"), detail
    if kind == "valid":
        if res["status"] == "raised":
            if res["exc_type"] == "TimeoutExpired":
                return "timeout", res["exc_text"].strip()
            return "valid-raises", f"{res['exc_text'].strip()} (raised in {res['raised_in']})"
        issues = res.get("issues") or []
        want = res.get("expect_warning")
        if want and not any(w["category"] == want for w in res["warnings"]):
            issues.append(dict(what=f"no {want} (the docs promise one here)", got=None, want=want, key=None))
        unwarned = []
        for issue in issues:
            key = str(issue.get("key") or "")
            if issue.get("want") == want and want:
                issue["warned"] = []
                unwarned.append(issue)
                continue
            warned = [w for w in res["warnings"] if key and key.lower() in w["message"].lower()]
            issue["warned"] = [w["category"] + ": " + w["message"][:200] for w in warned]
            if not warned:
                unwarned.append(issue)
        if unwarned:
            return "silent", "; ".join(f"{i['what']}: got {i['got']}, want {i['want']}" for i in unwarned)
        if issues:
            return "ok", "changed but warned: " + "; ".join(i["what"] for i in issues)
        return "ok", ""
    # invalid
    if res["status"] == "returned":
        return "accepted", "no error: the bad input was accepted"
    if res.get("before_call"):
        return "battery-error", "set-up failed before the call under test: " + res["exc_text"].strip()
    msg = res["message"]
    if res["exc_type"] == "CLIOutcome":
        rc, err = res["cli_rc"], res.get("cli_stderr", "")
        if rc is None:
            return "accepted", "no error within 100 s: the command was still running (computing on bad input)"
        if rc == 0:
            return "accepted", "exit 0: the bad input was accepted"
        if "Traceback (most recent call last)" in err or rc not in (1, 2):
            return "crash", f"exit {rc} with a traceback: {err.strip().splitlines()[-1] if err.strip() else ''}"
        if rc == 2 and re.search(r"\b(error|DataError|ModelDefinitionError)\b", err, re.I):
            pass
        elif rc == 1:
            res["cli_note"] = "exit 1 (the docs: 2 for an input error)"
        msg = err
    else:
        from_pgpgm_class = res["exc_module"].startswith("pgpgm")
        std = res["exc_type"] in ("ValueError", "TypeError") or any(
            m.endswith(("builtins.ValueError", "builtins.TypeError")) for m in res["exc_mro"][1:2])
        if not from_pgpgm_class:
            if res["exc_type"] in CRASH_TYPES or not std or res["raised_in"] != "pgpgm":
                return "crash", res["exc_text"].strip()
    names = spec["names"]
    named = any(n.lower() in msg.lower() for n in names) if names else False
    advises = bool(ADVICE.search(msg))
    res["names_input"], res["advises"] = named, advises
    late = res.get("seconds_to_error") is not None and res["seconds_to_error"] > 20
    extra = (f" [late: {res['seconds_to_error']:.0f} s]" if late else "") + (
        f" [{res['cli_note']}]" if res.get("cli_note") else "")
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    if not named and not advises:
        return "unclear", f"{res['exc_type']}: {first}{extra}"
    part = "" if (named and advises) else (" [names the input only]" if named else " [advice only, input not named]")
    return "ok", f"{res['exc_type']}: {first[:160]}{part}{extra}"


def run_case(name, timeout):
    spec = CASES[name]
    fd, jpath = tempfile.mkstemp(prefix=f"battery_{name}_", suffix=".json")
    os.close(fd)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--json", jpath], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    res = {}
    try:
        _, stderr = proc.communicate(timeout=timeout)
        try:
            res = json.loads(Path(jpath).read_text())
        except Exception:  # noqa: BLE001
            res = dict(died=True, rc=proc.returncode, stderr_tail=stderr[-2000:])
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # this case's own process group (chain processes included)
        proc.communicate()
        res = dict(timed_out=True, timeout=timeout)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(jpath)
    wall = time.perf_counter() - t0
    outcome, detail = classify(spec, res)
    record = dict(name=name, kind=spec["kind"], outcome=outcome, wall_s=round(wall, 1), detail=detail,
                  note=spec["note"]) | {k: v for k, v in res.items() if k not in ("name", "kind")}
    return record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--set", default="first", choices=sorted(SETS), help="which cases (default: first)")
    ap.add_argument("--out", help="results file (default: results/battery.jsonl, battery2.jsonl for --set second)")
    ap.add_argument("--update", action="store_true", help="replace these cases' lines in --out, keep the others")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--child")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.json)
        return 0
    chosen = [n for n, s in CASES.items() if s["fn"].__module__ in SETS[args.set]]
    if args.list:
        for n in chosen:
            print(f"{n:45s} {CASES[n]['kind']:8s} {CASES[n]['note']}")
        print(len(chosen), "cases")
        return 0
    names = chosen if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in chosen]
    if unknown:
        ap.error(f"unknown case(s) {unknown} in --set {args.set}; --list names them")
    out = Path(args.out or OUTS[args.set])
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if args.update and out.exists():
        kept = [ln for ln in out.read_text().splitlines() if ln.strip() and json.loads(ln)["name"] not in names]
    records = []
    t_all = time.perf_counter()
    for i, name in enumerate(names, 1):
        rec = run_case(name, args.timeout or CASES[name]["timeout"])
        records.append(rec)
        print(f"[{i:3d}/{len(names)}] {name:44s} {rec['kind']:8s} {rec['outcome']:13s} {rec['wall_s']:6.1f}s  "
              f"{rec['detail'][:150]}", flush=True)
    total = time.perf_counter() - t_all
    with out.open("w") as f:
        for ln in kept:
            f.write(ln + "\n")
        for rec in records:
            f.write(json.dumps(rec, default=str) + "\n")
    all_recs = [json.loads(ln) for ln in kept] + records
    outcomes = ["ok", "silent", "valid-raises", "timeout", "unclear", "crash", "accepted", "battery-error"]
    print(f"\n{'kind':10s}" + "".join(f"{o:>14s}" for o in outcomes) + f"{'total':>8s}")
    for kind in ("valid", "invalid"):
        row = [sum(1 for r in all_recs if r["kind"] == kind and r["outcome"] == o) for o in outcomes]
        print(f"{kind:10s}" + "".join(f"{c:14d}" for c in row) + f"{sum(row):8d}")
    print(f"\n{len(records)} cases run in {total:.0f} s; results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

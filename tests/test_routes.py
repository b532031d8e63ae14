"""The road an option takes through the package (issue 71): recorded as the program runs, not read from the code.

``kernel`` (and ``gamma``) from :func:`pgpgm.fit` to their use, the GP fit and the gradient-matching density
(:mod:`pgpgm.matching.density`), enter each module at most twice and never return to a module they left; fit,
fit_study and fit_petab pass through the same step modules (:mod:`pgpgm.steps`).
"""

from __future__ import annotations

import sys
import warnings

import pandas as pd
import pytest

import pgpgm

USE = "pgpgm.matching.density"  # where kernel and gamma are used: the GPs and the gradient-matching density


def _calls(run, keep) -> list[str]:
    """The pgpgm modules, in order, of the functions ``run()`` calls for which ``keep(frame)`` holds, consecutive
    calls in one module counted once (dunder methods left out: a record's accessors are no step of the road)."""
    modules: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("pgpgm") and not frame.f_code.co_name.startswith("__") and keep(frame) and \
                (not modules or modules[-1] != module):
            modules.append(module)

    sys.setprofile(profile)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run()
    finally:
        sys.setprofile(None)
    return modules


def _route(value, run) -> list[str]:
    """The modules whose functions are called with ``value`` among their arguments (itself, or a record holding
    it as its ``kernel`` or ``gamma``)."""
    def carries(frame) -> bool:
        code = frame.f_code
        args = (frame.f_locals.get(a) for a in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
        return any(v is value or any(getattr(v, f, None) is value for f in ("kernel", "gamma")) for v in args)

    return _calls(run, carries)


def _steps(run) -> set[str]:
    """The step modules (:mod:`pgpgm.steps`) whose functions ``run()`` calls."""
    return set(_calls(run, lambda frame: frame.f_globals.get("__name__", "").startswith("pgpgm.steps.")))


@pytest.fixture(scope="module")
def lv():
    spec = pgpgm.load_model("lotka-volterra")
    return spec, spec.simulate("x1-observed", seed=0)


FAST = dict(draws=100, tune=100, posterior=None, progressbar=False)


@pytest.mark.parametrize("option", ["kernel", "gamma"])
def test_an_option_reaches_its_use_entering_each_module_once(lv, option):
    spec, data = lv
    value = {"x1": "rbf"} if option == "kernel" else {"x1": 0.3}
    route = _route(value, lambda: pgpgm.fit(spec.system, data, ["x1"], **{option: value}, **FAST))
    to_use = route[:route.index(USE) + 1]
    # the mapping's state names are checked in prepare (pgpgm.checks), where the observed states are first known
    assert to_use == ["pgpgm.fitting", "pgpgm.steps.options", "pgpgm.steps.prepare", "pgpgm.checks",
                      "pgpgm.steps.match", USE]
    assert len(set(to_use)) == len(to_use)  # no module entered twice, none returned to


def test_fit_study_and_fit_petab_pass_the_same_step_modules_as_fit(lv):
    spec, data = lv
    fit_steps = _steps(lambda: pgpgm.fit(spec.system, data, ["x1"], **FAST))
    assert fit_steps == {f"pgpgm.steps.{s}" for s in ("options", "prepare", "match", "refine", "posterior", "report")}
    tidy = pd.concat([pd.DataFrame({"experiment": f"e{s}", "time": d["time"].values, "state": "x1",
                                    "value": d["y"].sel(observed="x1").values})
                      for s, d in ((s, spec.simulate("x1-observed", seed=s)) for s in (0, 1))])
    study = pgpgm.Study.from_tidy(tidy.dropna(), x0={"x2": float(spec.case("x1-observed").x0[1])})
    study_steps = _steps(lambda: pgpgm.fit_study(spec.system, study, priors=(0.0, 10.0), **FAST))
    assert study_steps == fit_steps
    search = pgpgm.MultiStart(min_starts=1, max_starts=1, agree=1)
    problem = pgpgm.load_petab("tests/data/petab_collection/Blasi_CellSystems2016/Blasi_CellSystems2016.yaml")
    petab_steps = _steps(lambda: pgpgm.fit_petab(problem, search=search, posterior=None, progressbar=False))
    assert petab_steps == fit_steps - {"pgpgm.steps.match"}  # no GP: PEtab's observables are no measured states

"""The package reads as the pipeline: no import circle between its modules; its public API is
loaded on first use."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import pgpgm

ROOT = Path(pgpgm.__file__).parent


def _graph() -> dict[str, set[str]]:
    """Module-level relative imports of every pgpgm module (``from . import sub`` counts the
    submodule, not the package; imports inside functions are deferred and not counted)."""
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, ast.ImportFrom) and n.level:
                parts = pkg.split(".")
                target = ".".join(parts[: len(parts) - (n.level - 1)] + ([n.module] if n.module else []))
                subs = [f"{target}.{a.name}" for a in n.names if f"{target}.{a.name}" in mods]
                deps = subs if len(subs) == len(n.names) else [target, *subs]
                graph[m].update(d for d in deps if d in mods and d != m)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_pgpgm_modules():
    graph = _graph()
    assert len(graph) > 30 and "pgpgm.density" in graph["pgpgm.pipeline"]
    assert _cycles(graph) == []


def test_every_public_name_resolves_and_functions_keep_their_module_names():
    """The public API is loaded on first use: every name of ``pgpgm.__all__`` resolves, and
    ``pgpgm.simulate`` / ``pgpgm.refine`` stay the functions once their modules are imported."""
    import types

    import pgpgm.refine  # noqa: F401  (the modules named like the functions)
    import pgpgm.simulate  # noqa: F401

    assert callable(pgpgm.simulate) and pgpgm.simulate.__module__ == "pgpgm.simulate"
    assert callable(pgpgm.refine) and pgpgm.refine.__module__ == "pgpgm.refine"
    assert {"fit", "FitResult", "load_model", "ODESystem", "fit_many", "datasets", "gp"} <= set(pgpgm.__all__)
    for name in pgpgm.__all__:
        obj = getattr(pgpgm, name)
        where = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__
        assert where.startswith("pgpgm."), (name, where)


HEAVY = ("pymc", "pytensor", "arviz_stats", "arviz_base", "sympy", "numba", "scipy", "xarray", "pandas", "dask")


@pytest.mark.parametrize("code", [
    "import pgpgm",
    "import pgpgm.cli\ntry:\n    pgpgm.cli.main(['--help'])\nexcept SystemExit:\n    pass",
    "import pgpgm.cli\npgpgm.cli.main(['fit', '--bogus'])",  # a usage error: one line, exit 2
])
def test_import_and_the_cli_help_load_no_heavy_library(code):
    """``import pgpgm``, ``pgpgm --help`` and a usage error import none of PyMC, PyTensor, ArviZ,
    SymPy, numba, SciPy, xarray, pandas or dask (~3 s together; `benchmarks/startup.py`)."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (
        HEAVY,)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/")
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], out.stdout[-2000:] + out.stderr[-2000:]

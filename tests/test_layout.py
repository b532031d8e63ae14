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


#: The layers, lowest first: a module imports only from its own layer's package or from lower layers.
LAYERS = (
    ("pgpgm.errors",),  # the exceptions and warnings
    ("pgpgm.checks", "pgpgm.progress", "pgpgm.processes"),  # input checks, utilities
    ("pgpgm.codegen",),  # code generation that knows nothing of ODEs
    ("pgpgm.ode",),  # the model: equations, their compiled functions
    ("pgpgm.solve",),  # ODE solvers, the PyTensor Op
    ("pgpgm.data", "pgpgm.priors", "pgpgm.noise", "pgpgm.observables"),  # measurements, priors, noise models,
    # observables
    ("pgpgm.petab",),  # PEtab problems: SBML and tables to an ODESystem, their likelihood
    ("pgpgm.refinement",),  # least squares of the ODE solution: step 3, and the tool of step 2's stop rule
    ("pgpgm.gp",),  # step 1
    ("pgpgm.matching",),  # step 2, its stop rules among it
    ("pgpgm.posterior",),  # step 4
    ("pgpgm.plots", "pgpgm.sensitivity"),
    ("pgpgm.fit_result", "pgpgm.petab_result"),
    ("pgpgm.logscale",),  # lognormal and log-transformed states: the problem on the log scale and back
    ("pgpgm.simulate",),
    ("pgpgm.spec", "pgpgm.datasets"),
    ("pgpgm.study",),  # many experiments: their design, the joint least squares, the joint pm.Model
    ("pgpgm.study_result",),
    ("pgpgm.steps",),  # the steps of a fit: options, prepare, match, refine, posterior, report
    ("pgpgm.fitting",),  # fit, fit_study and fit_petab, compositions of the steps
    ("pgpgm.batch", "pgpgm.versions"),
    ("pgpgm",),  # the package's public API, loaded on first use
    ("pgpgm.cli",),  # the command line, on the public API
)


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the layer's package or module that holds ``module``)."""
    for i, names in enumerate(LAYERS):
        for n in names:
            if module == n or (n != "pgpgm" and module.startswith(n + ".")):
                return i, n
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add it to LAYERS")


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _imports() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Every import of a pgpgm module by a pgpgm module: (importer, imported module, names, where), where
    is ``"module"`` (at module level), ``"typing"`` (under ``if TYPE_CHECKING:``) or ``"function"``
    (inside a function or class body: deferred). ``from . import sub`` counts the submodule."""
    mods = _modules()
    out = []
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        tree = ast.parse(p.read_text())
        top = {id(n): "module" for n in tree.body}
        for n in tree.body:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                top |= {id(x): "typing" for x in ast.walk(n)}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").split(".")[0] == "pgpgm"):
                if n.level:
                    parts = pkg.split(".")
                    target = ".".join(parts[: len(parts) - (n.level - 1)] + ([n.module] if n.module else []))
                else:
                    target = n.module
                names = tuple(a.name for a in n.names)
                subs = [f"{target}.{a}" for a in names if f"{target}.{a}" in mods]
                where = top.get(id(n), "function")
                for t in (subs if len(subs) == len(names) else [target, *subs]):
                    if t in mods and t != m:
                        out.append((m, t, names, where))
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.split(".")[0] == "pgpgm" and a.name in mods and a.name != m:
                        out.append((m, a.name, (), top.get(id(n), "function")))
    return out


def _graph() -> dict[str, set[str]]:
    """Module-level imports between pgpgm modules (importer -> imported)."""
    graph = {m: set() for m in _modules()}
    for m, t, _, where in _imports():
        if where == "module":
            graph[m].add(t)
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
    assert len(graph) > 30 and "pgpgm.matching.density" in graph["pgpgm.steps.match"]
    assert _cycles(graph) == []


def test_no_pgpgm_import_inside_a_function():
    """Every pgpgm module imports pgpgm modules at module level: no deferred import dodges a circle
    or a layer (third-party libraries may be imported where used, to keep ``import pgpgm`` light)."""
    deferred = [(m, t) for m, t, _, where in _imports() if where == "function"]
    assert deferred == []


def test_no_private_name_is_imported_from_another_module():
    private = [(m, t, names) for m, t, names, _ in _imports() if any(n.startswith("_") for n in names)]
    assert private == []


def test_layers_only_look_down():
    """Every import (type-checking ones included) goes to a lower layer or within one layer's package."""
    up = []
    for m, t, _, where in _imports():
        (lm, pm), (lt, pt) = _layer(m), _layer(t)
        if lt > lm or (lt == lm and pm != pt):
            up.append(f"{m} -> {t} ({where})")
    assert up == []


def test_the_layout_checks_see_a_deferred_import_and_an_upward_one(tmp_path, monkeypatch):
    """The checks above can fail: a module with an import inside a function and one that imports a
    higher layer, in a copy of the package."""
    import shutil

    copy = tmp_path / "pgpgm"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "gp" / "extra.py").write_text("from ..fitting import fit\n\n\ndef f():\n    from ..fit_result import FitResult\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    found = _imports()
    assert ("pgpgm.gp.extra", "pgpgm.fit_result", ("FitResult",), "function") in found
    assert ("pgpgm.gp.extra", "pgpgm.fitting", ("fit",), "module") in found
    assert _layer("pgpgm.gp.extra")[0] < _layer("pgpgm.fitting")[0]


def test_every_public_name_resolves_and_functions_keep_their_module_names():
    """The public API is loaded on first use: every name of ``pgpgm.__all__`` resolves, and
    ``pgpgm.simulate`` / ``pgpgm.refine`` stay the functions once their modules are imported."""
    import types

    import pgpgm.refinement
    import pgpgm.simulate

    assert callable(pgpgm.simulate) and pgpgm.simulate.__module__ == "pgpgm.simulate"
    assert callable(pgpgm.refine) and pgpgm.refine.__module__ == "pgpgm.refinement.least_squares"
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


def _mapped_tree() -> list[str]:
    """The module paths (``pgpgm/...``, folders ending in ``/``) that docs/architecture.md's tree lists, in order."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    block = page.split("```text\n", 1)[1].split("```", 1)[0]
    out, folders = [], []
    for line in block.splitlines()[1:]:  # the first line is "pgpgm/"
        for marker in ("├── ", "└── "):
            if marker in line:
                depth = line.index(marker) // 4
                name = line.split(marker, 1)[1].split()[0]
                folders[depth:] = [name] if name.endswith("/") else []
                out.append("pgpgm/" + "".join(folders[:depth]) + name)
    return out


def test_the_package_map_lists_every_module_in_the_order_of_the_layers():
    """docs/architecture.md's tree names every module of the package and no other, and the layers appear in
    it in the order of :data:`LAYERS` (a newcomer reads the pipeline from the page as the code has it)."""
    mapped = _mapped_tree()
    files = {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}
    assert {m for m in mapped if m.endswith(".py")} == files
    order = [_layer(m.removesuffix("/").removesuffix(".py").replace("/", "."))[0] for m in mapped
             if m.count("/") == 1 and m != "pgpgm/__init__.py"]
    assert order == sorted(order)


def test_the_map_reader_sees_a_missing_module(monkeypatch, tmp_path):
    """The check above can fail: a copy of the page without one module is told apart from the package."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(page.replace("│   ├── budget.py", "│   ├── budgets.py"))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "pgpgm")
    assert "pgpgm/posterior/budgets.py" in _mapped_tree() and "pgpgm/posterior/budget.py" not in _mapped_tree()


def test_every_subpackage_is_in_the_wheel():
    """pyproject.toml lists the packages a wheel holds: every folder of pgpgm with an ``__init__.py``
    (a missing one installs from a checkout in editable mode and breaks a real install)."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("__init__.py")}
    assert found <= listed

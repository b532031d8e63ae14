"""The standing benchmarks (``benchmarks/*.py``) parse, run their ``--help`` and use only pgpgm's
public API plus the harness: ``pgpgm.<name in pgpgm.__all__>`` (not a module), ``pgpgm.gp.*``,
``pgpgm.solve.*``, ``pgpgm.datasets``; anything else goes through ``harness.private``, which only
serves the names listed in ``harness.PRIVATE_NAMES``. No ``sys.path`` edits, no imports of other
benchmark scripts (the harness and the robustness reference excepted)."""

import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import pgpgm
import pgpgm.gp
import pgpgm.solve

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py"))
#: Modules a benchmark may import besides third-party ones.
LOCAL = {"harness", "robustness_reference"}
PUBLIC_MODULES = {"gp": pgpgm.gp, "solve": pgpgm.solve, "datasets": None}


def _public() -> set[str]:
    names = {n for n in pgpgm.__all__ if not isinstance(getattr(pgpgm, n), types.ModuleType)}
    return names | set(PUBLIC_MODULES)


def _sub_public(module: str) -> set[str]:
    if module == "datasets":
        import pgpgm.datasets as ds

        return {n for n in vars(ds) if not n.startswith("_") and callable(getattr(ds, n))}
    return set(PUBLIC_MODULES[module].__all__)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                ids.add(id(node.body[0].value))
    return ids


def violations(path: Path, public: set[str]) -> list[str]:
    """What in ``path`` reaches past the public API, edits sys.path or imports another script."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    bad = []

    def check_dotted(dotted: str, line: int) -> None:
        parts = dotted.split(".")
        if parts[0] != "pgpgm" or len(parts) == 1 or parts[1].startswith("__"):
            return
        if parts[1] not in public:
            bad.append(f"{path.name}:{line}: pgpgm.{parts[1]} is not public")
        elif parts[1] in PUBLIC_MODULES and len(parts) > 2 and parts[2] not in _sub_public(parts[1]):
            bad.append(f"{path.name}:{line}: pgpgm.{parts[1]}.{parts[2]} is not public")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top == "pgpgm":
                    check_dotted(a.name, node.lineno)
                elif (BENCH / f"{top}.py").exists() and top not in LOCAL:
                    bad.append(f"{path.name}:{node.lineno}: imports the script {top}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod.split(".")[0] == "pgpgm":
                check_dotted(mod, node.lineno)
                for a in node.names:
                    check_dotted(f"{mod}.{a.name}", node.lineno)
            elif (BENCH / f"{mod.split('.')[0]}.py").exists() and mod not in LOCAL:
                bad.append(f"{path.name}:{node.lineno}: imports from the script {mod}")
        elif isinstance(node, ast.Attribute):
            chain, v = [node.attr], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name):
                dotted = ".".join([v.id, *reversed(chain)])
                if v.id == "pgpgm":
                    check_dotted(dotted, node.lineno)
                if dotted in ("sys.path.insert", "sys.path.append"):
                    bad.append(f"{path.name}:{node.lineno}: edits sys.path")
                if dotted == "importlib.import_module" and path.name != "harness.py":
                    bad.append(f"{path.name}:{node.lineno}: imports by name (use harness.private)")
        elif isinstance(node, ast.Name) and node.id == "__import__":
            bad.append(f"{path.name}:{node.lineno}: imports by name (use harness.private)")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and not re.fullmatch(r"pgpgm(\.\w+)+", node.value)):  # a module name alone: harness.private's
            # code run in child processes: the same rules for the pgpgm names it uses
            for m in re.finditer(r"\bpgpgm(?:\.[A-Za-z_]\w*)+", node.value):
                check_dotted(m.group(0), node.lineno)
            if "sys.path.insert" in node.value:
                bad.append(f"{path.name}:{node.lineno}: child code edits sys.path")
    return sorted(set(bad))


def test_the_checker_finds_private_access(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Doc: pgpgm.pipeline is fine here."""\nimport sys\nimport pgpgm\nimport pgpgm.pipeline\n'
                     "from pgpgm.data import as_observations\nfrom pgpgm.gp import fit_gp, _private\n"
                     "sys.path.insert(0, 'x')\nx = pgpgm.density.fit_gps\ny = pgpgm.fit\nz = pgpgm.gp.fit_gp\n"
                     "code = 'import pgpgm; pgpgm.sampling.stopping'\n"
                     "import importlib\nm = importlib.import_module('pgpgm.refine')\n")
    found = violations(probe, _public())
    assert found == sorted({
        "probe.py:4: pgpgm.pipeline is not public", "probe.py:5: pgpgm.data is not public",
        "probe.py:6: pgpgm.gp._private is not public", "probe.py:7: edits sys.path",
        "probe.py:8: pgpgm.density is not public", "probe.py:11: pgpgm.sampling is not public",
        "probe.py:13: imports by name (use harness.private)"}), found


def test_about_ten_standing_benchmarks_use_only_the_public_api():
    public = _public()
    standing = [p for p in SCRIPTS if p.name != "harness.py" and not p.stem.endswith("_reference")]
    assert 8 <= len(standing) <= 15 and BENCH / "harness.py" in SCRIPTS, [p.name for p in standing]
    found = [v for p in SCRIPTS for v in violations(p, public)]
    assert found == [], "\n".join(found)


def test_private_access_is_listed_in_the_harness():
    """Every ``harness.private(module, name)`` call names an entry of ``PRIVATE_NAMES``."""
    sys.path.insert(0, str(BENCH))
    try:
        import harness
    finally:
        sys.path.remove(str(BENCH))
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "private"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "harness"):
                args = tuple(a.value for a in node.args)
                assert (args + (None,))[:2] in harness.PRIVATE_NAMES, (path.name, node.lineno, args)
    with pytest.raises(KeyError, match="PRIVATE_NAMES"):
        harness.private("pgpgm.pipeline", "fit")


def test_every_benchmark_starts():
    """``python benchmarks/NAME.py --help`` (what ``./run.sh bench NAME --help`` runs) imports the
    script and the harness without path tricks: every script, each as ``__main__`` with ``--help``, in
    one fresh interpreter started in the benchmarks' folder's parent (one import of pgpgm for all)."""
    names = [p.stem for p in SCRIPTS if p.stem not in LOCAL]
    probe = ("import runpy, sys, io, contextlib, json\n"
             "sys.path.insert(0, %r)\n" % str(BENCH)  # what `python benchmarks/NAME.py` puts first
             + "out = {}\n"
             "for name in %r:\n" % names
             + "    sys.argv = [%r + '/' + name + '.py', '--help']\n" % str(BENCH)
             + "    buf = io.StringIO()\n"
             "    try:\n"
             "        with contextlib.redirect_stdout(buf):\n"
             "            runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "        out[name] = 'no exit'\n"
             "    except SystemExit as e:\n"
             "        out[name] = 'usage' if e.code in (0, None) and 'usage' in buf.getvalue() else repr(e.code)\n"
             "print(json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         cwd=BENCH.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {n: "usage" for n in names}, got


def test_side_by_side_interleaves_and_reports_ratios_to_the_first():
    sys.path.insert(0, str(BENCH))
    try:
        import harness
    finally:
        sys.path.remove(str(BENCH))
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b", "c")}
    res = harness.side_by_side(fns, rounds=3, warmup=1)
    # warm-up a, b, c; then rounds in rotated order: abc, bca, cab
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert {k: len(v) for k, v in res.seconds.items()} == {"a": 3, "b": 3, "c": 3}
    assert res.baseline == "a" and res.ratio("a") == 1.0
    assert res.ratio("b") == pytest.approx(res.median("b") / res.median("a"))
    assert [r["side"] for r in res.rows()] == ["a", "b", "c"]

"""The package reads as the pipeline: no import circle between its modules."""

import ast
from pathlib import Path

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

"""Every fenced ```python block of README.md and docs/*.md runs as written.

A page's blocks share one namespace, in order, as a reader runs them one after the other; each page runs in a
fresh interpreter (cwd: a scratch folder with the repository's entries linked in, ``MPLBACKEND=Agg``,
``CI=true``, one BLAS thread, a timeout). Fast settings: step 4's NUTS in ``pgpgm.fit``, ``fit_study`` and
``fit_petab`` runs 2 chains of 50 + 50 iterations within 20,000 gradient evaluations (the page's other
arguments, and its other step-4 fields, as written); everything else runs as the page writes it. A block that
raises fails its page's test, naming the page, the block's line and its first line; a traceback's
line numbers are the page's. A DeprecationWarning of pgpgm's is an error there: the docs write the current
call.

A block is left out only where the page says so on the line before its fence,
``<!-- not run in CI: <why> -->``, and is then listed here (at most :data:`MOST_NOT_RUN`; their code is still
checked for the flat keywords of earlier releases). None is at present. A page whose shell block starts a dask
scheduler with ``--scheduler-file sched.json`` runs after the test has started that scheduler and one worker in
its folder, as the reader would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import dask_cluster

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: the marker, on the line before a fence, of a block CI does not run
NOT_RUN = re.compile(r"^<!--\s*not run in CI:\s*(.+?)\s*-->\s*$")
#: blocks left out in all (each is listed in this module's docstring)
MOST_NOT_RUN = 5
#: seconds a page may take (the slowest, getting-started.md's fits, takes about a minute on a 2-core machine)
TIMEOUT = 300
#: the flat step-4 keywords and options of earlier releases, which the docs no longer write
LEGACY = re.compile(r"\b(posterior_(draws|tune|chains|rounds|budget)|nuts_sampler|fit_kwargs|x0_observed)\s*=")

#: runs a page's blocks (a JSON list of {page, line, code}) in one namespace; prints a marker before each
DRIVER = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("error", category=DeprecationWarning,
                            message=r".*(deprecated and will be removed|is deprecated: pass)")
    import dataclasses, functools
    import pgpgm
    # fast settings: step 4 (NUTS) of fit, fit_study and fit_petab capped at a fixed number of gradient
    # evaluations; every other argument as the page writes it
    CAP = dict(draws=50, tune=50, chains=2, rounds=1, sd_error=None,
               budget=pgpgm.PosteriorBudget(seconds=None, gradient_evaluations=20000))

    def capped(entry):
        @functools.wraps(entry)
        def run(*args, **kwargs):
            step4 = kwargs.get("posterior", "nuts")
            if isinstance(step4, str) and step4 == "nuts":
                kwargs["posterior"] = pgpgm.NUTS(**CAP)
            elif isinstance(step4, pgpgm.NUTS):
                kwargs["posterior"] = dataclasses.replace(step4, **CAP)
            return entry(*args, **kwargs)
        return run

    for name in ("fit", "fit_study", "fit_petab"):
        setattr(pgpgm, name, capped(getattr(pgpgm, name)))
    namespace = {"__name__": "__main__"}
    for block in json.load(sys.stdin):
        print(f"@@ block at line {block['line']}", flush=True)
        # padded so that a traceback names the page's own line numbers
        code = compile("\\n" * (block["line"] - 1) + block["code"], block["page"], "exec")
        exec(code, namespace)
""")


@dataclass(frozen=True)
class Block:
    """One fenced python block: its page (relative to the repository root), the line of its first code line,
    its code, and why it is not run (None: it is)."""

    page: str
    line: int
    code: str
    not_run: str | None

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.code.splitlines() if ln.strip()), "")


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of the Markdown file ``path``, in order (fences at the start of a line)."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].rstrip() == "```python":
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            assert end is not None, f"{path.name}:{i + 1}: a ```python block without its closing fence"
            marker = NOT_RUN.match(lines[i - 1]) if i else None
            found.append(Block(str(path.relative_to(ROOT)), i + 2, "\n".join(lines[i + 1:end]) + "\n",
                               marker.group(1) if marker else None))
            i = end
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in blocks(p)]


RUN_PAGES = [p for p in PAGES if any(b.not_run is None for b in blocks(p))]


def _scratch(folder: Path) -> Path:
    """``folder`` as a reader's working copy: the repository's top-level entries linked in (the pages name files
    such as ``tests/data/...``; ``results/`` and the package left out), so that what a page writes
    (``result.save("lv.nc")``, ``results/...``) lands here."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("results", "pgpgm") and \
                not (folder / entry.name).exists():
            (folder / entry.name).symlink_to(entry)
    return folder


def run_page(path: Path, timeout: float = TIMEOUT, *, workdir: Path | None = None) -> None:
    """Run the blocks of ``path`` that are not marked, in one fresh interpreter whose working folder is
    ``workdir`` (default: the repository root); fail naming the block that raised or ran out of time."""
    page = [b for b in blocks(path) if b.not_run is None]
    env = {**os.environ, "MPLBACKEND": "Agg", "CI": "true", "OMP_NUM_THREADS": "1"}
    payload = json.dumps([{"page": b.page, "line": b.line, "code": b.code} for b in page])
    try:
        run = subprocess.run([sys.executable, "-c", DRIVER], input=payload, cwd=workdir or ROOT, env=env,
                             capture_output=True, text=True, timeout=timeout)
        out, err, failed = run.stdout, run.stderr, run.returncode != 0
        why = "raised"
    except subprocess.TimeoutExpired as stop:
        out = stop.stdout.decode() if isinstance(stop.stdout, bytes) else (stop.stdout or "")
        err = stop.stderr.decode() if isinstance(stop.stderr, bytes) else (stop.stderr or "")
        failed, why = True, f"ran past {timeout:.0f} s"
    if failed:
        started = [int(n) for n in re.findall(r"^@@ block at line (\d+)$", out, flags=re.MULTILINE)]
        at = next((b for b in page if started and b.line == started[-1]), None)
        where = f"the block at line {at.line}, `{at.first_line}`" if at else "before its first block"
        pytest.fail(f"{page[0].page}: {where} {why}:\n{err[-6000:]}", pytrace=False)


# ----------------------------------------------------------------------------- the pages' blocks run
@pytest.mark.parametrize("path", RUN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_s_python_blocks_run(path, tmp_path):
    workdir = _scratch(tmp_path / "reader")
    # a page whose shell block starts a scheduler and a worker: the test starts them as the reader would
    with dask_cluster(workdir) if "--scheduler-file sched.json" in path.read_text() else contextlib.nullcontext():
        run_page(path, workdir=workdir)


# ----------------------------------------------------------------------------- the rules of the pages
def test_few_blocks_are_left_out_and_each_says_why():
    left_out = [(b.page, b.line, b.not_run) for b in all_blocks() if b.not_run is not None]
    assert len(left_out) <= MOST_NOT_RUN, left_out
    assert all(len(why) >= 10 for _, _, why in left_out), left_out
    listed = __doc__ or ""
    missing = [(page, line) for page, line, _ in left_out if page not in listed]
    assert not missing, f"list the blocks left out in this module's docstring: {missing}"


def test_the_docs_write_no_flat_keyword_of_earlier_releases():
    old = [(b.page, b.line + k, ln.strip()) for b in all_blocks() for k, ln in enumerate(b.code.splitlines())
           if LEGACY.search(ln)]
    assert not old, f"write posterior=pgpgm.NUTS(...) / pgpgm.Laplace(...), x0=, fit_study(draws=...): {old}"


def test_a_raising_block_fails_naming_its_page_and_first_line(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\n```\n\n<!-- not run in CI: needs the reader's own cluster -->\n"
                    "```python\nraise SystemExit(3)\n```\n\n```python\n\ny = x + 1\nassert y == 3, y\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = blocks(page)
    assert [(b.line, b.first_line, b.not_run) for b in found] == [
        (4, "x = 1", None), (9, "raise SystemExit(3)", "needs the reader's own cluster"), (13, "y = x + 1", None)]
    with pytest.raises(pytest.fail.Exception, match=r"page.md: the block at line 13, `y = x \+ 1` raised") as info:
        run_page(page)
    assert 'File "page.md", line 15' in str(info.value) and "AssertionError: 2" in str(info.value)


def test_a_deprecated_call_in_a_block_fails(tmp_path, monkeypatch):
    page = tmp_path / "old.md"
    page.write_text("```python\nimport warnings\n"
                    "warnings.warn('posterior_draws of fit() are deprecated and will be removed: write ...', "
                    "DeprecationWarning)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="old.md: the block at line 2, `import warnings` raised"):
        run_page(page)

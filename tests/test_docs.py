"""The documentation: the site builds with --strict, the README stays short, the API pages cover the public
API, and every relative link points at a file that exists."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pgpgm

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
API_PAGES = sorted((DOCS / "api").glob("*.md"))
# [text](target) and [text]: target, outside code spans and fenced blocks (stripped first)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def _prose(markdown: str) -> str:
    """The text without fenced code blocks and inline code, where a bracket is not a link."""
    markdown = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", markdown)


def _relative_links(path: Path) -> list[str]:
    targets = [a or b for a, b in LINK.findall(_prose(path.read_text()))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", t)]


def test_the_site_builds_strictly(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    fit_page = (tmp_path / "site" / "api" / "fit" / "index.html").read_text()
    # the API pages are generated from the docstrings, not empty headings
    assert "Infer the parameters and latent states" in fit_page
    assert "Everything" in fit_page and "FitResult" in fit_page


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 130, len(lines)
    commands = [ln.split("#")[0].strip() for ln in lines[:12] if ln.startswith("./run.sh")]
    assert commands == ["./run.sh experiment", "./run.sh test"], lines[:12]


def _documented_names() -> set[str]:
    """The last component of every ``::: identifier`` on the API pages."""
    names = set()
    for page in API_PAGES:
        for ident in re.findall(r"^:::\s*([\w.]+)", page.read_text(), flags=re.MULTILINE):
            names.add(ident.rsplit(".", 1)[-1])
    return names


def test_every_public_name_has_an_api_entry():
    missing = sorted(set(pgpgm.__all__) - _documented_names())
    assert not missing, f"public names without an API entry (add a ::: line to a page in docs/api/): {missing}"


def test_the_public_names_of_gp_and_solve_have_api_entries():
    import pgpgm.gp
    import pgpgm.solve

    missing = sorted((set(pgpgm.gp.__all__) | set(pgpgm.solve.__all__)) - _documented_names())
    assert not missing, missing


def test_the_api_identifiers_are_only_on_the_api_pages():
    # one place to remap them when modules move
    elsewhere = [p.name for p in PAGES if p.parent != DOCS / "api" and re.search(r"^:::", p.read_text(), re.MULTILINE)]
    assert not elsewhere, elsewhere


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file(path):
    links = _relative_links(path)
    broken = [t for t in links if not (path.parent / t.split("#")[0]).exists()]
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files {broken}"


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) and [gone](nothing.md#x), `[code](skip.md)`, [web](https://example.org)\n"
                    "```\n[fenced](skip2.md)\n```\n[ref]: other.md\n")
    assert _relative_links(page) == ["page.md", "nothing.md#x", "other.md"]

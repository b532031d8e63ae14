"""Every notebook runs top to bottom (with PGPGM_FAST=1: a few hundred iterations) and checks a number."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
#: run in full only with ``./run.sh test --slow`` (their features have fast tests of their own): CI runs
#: the published systems' notebooks and the hierarchical study's
SLOW_NOTEBOOKS = {"goodwin", "influenza", "lynx_hare"}


def _run(nb, folder: Path, monkeypatch) -> None:
    monkeypatch.setenv("PGPGM_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()


def test_all_systems_have_a_notebook():
    assert {"fitzhugh_nagumo", "lotka_volterra", "protein_transduction"} <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_executed_with_its_figures(path):
    """A reader on the web sees what the full run (PGPGM_FAST unset) printed and drew."""
    assert path.stat().st_size < 1.5e6, f"{path.name}: {path.stat().st_size / 1e6:.1f} MB"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{path.name} has cells that did not run"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "run top to bottom, once"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"], f"{path.name} was committed with an error"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} has no figure"


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW_NOTEBOOKS else p
                                  for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_runs_and_its_checks_hold(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)  # in memory: the committed file (with its full-mode outputs) stays as is
    checks = [c for c in nb.cells if c.cell_type == "code" and "\nassert " in "\n" + c.source]
    assert checks, f"{path.name} asserts no number"
    for c in checks:
        c.outputs = []  # the committed outputs of the full run must not stand in for this run's
    _run(nb, path.parent, monkeypatch)  # raises CellExecutionError when a cell (e.g. a check) fails
    assert all(c.get("outputs") for c in checks)  # the checks ran and printed what they compared


def test_a_failing_notebook_check_fails_the_run(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("cost = 2.0\nassert cost <= 1.0, cost")])
    with pytest.raises(CellExecutionError, match="AssertionError"):
        _run(nb, tmp_path, monkeypatch)

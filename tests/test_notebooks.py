"""Every notebook runs top to bottom (with PGPGM_FAST=1: a few hundred iterations) and checks a number."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _run(nb, folder: Path, monkeypatch) -> None:
    monkeypatch.setenv("PGPGM_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()


def test_all_systems_have_a_notebook():
    assert {"fitzhugh_nagumo", "lotka_volterra", "protein_transduction"} <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_its_checks_hold(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and "\nassert " in "\n" + c.source]
    assert checks, f"{path.name} asserts no number"
    _run(nb, path.parent, monkeypatch)  # raises CellExecutionError when a cell (e.g. a check) fails
    assert all(c.get("outputs") for c in checks)  # the checks ran and printed what they compared


def test_a_failing_notebook_check_fails_the_run(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("cost = 2.0\nassert cost <= 1.0, cost")])
    with pytest.raises(CellExecutionError, match="AssertionError"):
        _run(nb, tmp_path, monkeypatch)

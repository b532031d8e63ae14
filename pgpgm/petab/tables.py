"""The PEtab v1 files: the problem's YAML and its tab-separated tables, read and checked.

Every table is read as text (nothing converted by pandas), so that each bad cell is reported
as ``file, line N, column 'name'`` with what to do, before any model is built or compiled.
Line numbers count the header as line 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError, ModelDefinitionError

#: Parameter scales PEtab defines (``parameterScale``).
SCALES = ("lin", "log", "log10")
#: Observable transformations (``observableTransformation``).
TRANSFORMATIONS = ("lin", "log", "log10")
#: Noise distributions (``noiseDistribution``).
DISTRIBUTIONS = ("normal", "laplace")
#: Prior types of ``objectivePriorType``.
PRIOR_TYPES = ("uniform", "normal", "laplace", "logNormal", "logLaplace", "parameterScaleUniform",
               "parameterScaleNormal", "parameterScaleLaplace")


def cell_error(file: Path | str, line: int | None, column: str | None, message: str) -> DataError:
    """A :class:`DataError` that names the file, the line (header = line 1) and the column."""
    where = str(file)
    if line is not None:
        where += f", line {line}"
    if column is not None:
        where += f", column {column!r}"
    return DataError(f"{where}: {message}")


@dataclass(frozen=True)
class Table:
    """One PEtab table as text.

    Attributes
    ----------
    path : the file
    frame : every cell as a string ('' where empty), the file's column order
    """

    path: Path
    frame: pd.DataFrame

    @classmethod
    def read(cls, path: Path, required: Sequence[str], kind: str) -> Table:
        """Read ``path``; a missing file or a missing required column is a :class:`DataError`."""
        if not path.is_file():
            raise DataError(f"the {kind} file {path} does not exist; fix its name in the problem's YAML file")
        try:
            frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_filter=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise DataError(f"the {kind} file {path} is not a tab-separated table: {exc}") from exc
        frame.columns = [str(c).strip() for c in frame.columns]
        missing = [c for c in required if c not in frame.columns]
        if missing:
            raise cell_error(path, 1, None, f"the {kind} table lacks the column(s) {missing}; it has "
                                            f"{list(frame.columns)}")
        return cls(path, frame.apply(lambda c: c.str.strip()))

    def lines(self) -> range:
        """The file's line number of each row (the header is line 1)."""
        return range(2, 2 + len(self.frame))

    def text(self, column: str) -> list[str]:
        """The column's cells ('' for every row when the column is absent)."""
        if column not in self.frame.columns:
            return [""] * len(self.frame)
        return list(self.frame[column])

    def numbers(self, column: str, *, default: float | None = None, finite: bool = True) -> np.ndarray:
        """The column as floats; an empty cell is ``default`` (an error where None), text that is no
        number is an error, and so is inf or NaN where ``finite``."""
        out = np.empty(len(self.frame))
        for i, (line, cell) in enumerate(zip(self.lines(), self.text(column))):
            if cell == "":
                if default is None:
                    raise cell_error(self.path, line, column, "the cell is empty; give a number")
                out[i] = default
                continue
            try:
                out[i] = float(cell)
            except ValueError:
                raise cell_error(self.path, line, column, f"{cell!r} is not a number") from None
            if finite and not math.isfinite(out[i]):
                raise cell_error(self.path, line, column, f"{cell!r} is not a finite number")
        return out

    def ids(self, column: str, *, unique: bool = False) -> list[str]:
        """The column as PEtab identifiers (letters, digits, '_', not starting with a digit); with
        ``unique``, each at most once."""
        out = self.text(column)
        for line, cell in zip(self.lines(), out):
            if not cell.isidentifier() or not cell.isascii():
                raise cell_error(self.path, line, column, f"{cell!r} is not a valid PEtab identifier "
                                                          "(letters, digits and '_', not starting with a digit)")
        dupes = sorted({c for c in out if out.count(c) > 1})
        if unique and dupes:
            line = next(ln for ln, c in zip(self.lines(), out) if c in dupes)
            raise cell_error(self.path, line, column, f"the identifiers {dupes} are defined more than once")
        return out

    def choice(self, column: str, allowed: Sequence[str], default: str) -> list[str]:
        """The column's cells, each one of ``allowed`` (an empty cell is ``default``)."""
        out = []
        for line, cell in zip(self.lines(), self.text(column)):
            cell = cell or default
            if cell not in allowed:
                raise cell_error(self.path, line, column, f"{cell!r} is not supported; use one of {list(allowed)}")
            out.append(cell)
        return out


def concat(tables: Sequence[Table]) -> tuple[pd.DataFrame, list[tuple[Path, int]]]:
    """The rows of several tables of one kind, and (file, line) of each row for messages."""
    frame = pd.concat([t.frame for t in tables], ignore_index=True).fillna("")
    where = [(t.path, line) for t in tables for line in t.lines()]
    return frame, where


# ------------------------------------------------------------------------------------------- YAML
@dataclass(frozen=True)
class PetabFiles:
    """The files of one PEtab v1 problem, from its YAML file (paths resolved against its folder)."""

    yaml: Path
    sbml: Path
    parameters: Path
    conditions: tuple[Path, ...]
    observables: tuple[Path, ...]
    measurements: tuple[Path, ...]

    @classmethod
    def read(cls, path: str | Path) -> PetabFiles:
        """Read and check the problem's YAML file.

        Raises
        ------
        DataError
            A missing or unreadable YAML file, a missing key, a listed file that does not exist.
        ModelDefinitionError
            A PEtab version or layout pgpgm does not read (v2, several models or problems).
        """
        import yaml

        path = Path(path)
        if not path.is_file():
            raise DataError(f"the PEtab problem file {path} does not exist")
        try:
            spec = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise DataError(f"{path} is not a YAML file: {exc}") from exc
        if not isinstance(spec, Mapping):
            raise DataError(f"{path}: a PEtab problem file is a mapping with 'format_version', 'parameter_file' and "
                            "'problems'")
        version = str(spec.get("format_version", "")).strip()
        if version.split(".")[0] != "1":
            raise ModelDefinitionError(
                f"{path}: format_version {version or 'missing'}: pgpgm reads PEtab v1 problems (format_version: 1); "
                "convert a v2 problem to v1 first (the petab library's petab.v2 module)")
        problems = spec.get("problems")
        if not isinstance(problems, list) or len(problems) != 1 or not isinstance(problems[0], Mapping):
            raise ModelDefinitionError(f"{path}: 'problems' must list exactly one problem (pgpgm reads one model "
                                       f"per PEtab problem), got {problems!r:.200}")
        problem = problems[0]
        base = path.parent

        def files(key: str, mapping: Mapping = problem, one: bool = False) -> tuple[Path, ...]:
            value = mapping.get(key)
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise DataError(f"{path}: {key!r} must name {'a file' if one else 'one or more files'}, got {value!r}")
            if one and len(value) != 1:
                raise ModelDefinitionError(f"{path}: {key!r} names {len(value)} files; pgpgm reads one")
            out = tuple(base / v for v in value)
            for f in out:
                if not f.is_file():
                    raise DataError(f"{path}: {key!r} names {f.name}, which does not exist in {base}; fix the "
                                    "file name")
            return out

        return cls(path, files("sbml_files", one=True)[0], files("parameter_file", spec, one=True)[0],
                   files("condition_files"), files("observable_files"), files("measurement_files"))

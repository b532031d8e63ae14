"""The installation: declared dependencies, SUNDIALS discovery and its fallback warning,
``pgpgm.show_versions`` / ``pgpgm info``."""

from __future__ import annotations

import ast
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import pgpgm
from pgpgm.cli import main
from pgpgm.errors import BackendWarning
from pgpgm.solve import sundials
from pgpgm.solve import Integrator, available_solvers


def available_backends():
    return [cls.name for cls in available_solvers()]
from pgpgm.versions import OPTIONAL_MODULES, version_info

PACKAGE = Path(pgpgm.__file__).resolve().parent
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "models").glob("*.py")])  # pgpgm, pgpgm.models
PYPROJECT = PACKAGE.parent / "pyproject.toml"


# -- declared dependencies -------------------------------------------------------------------

def _requirements() -> tuple[set[str], dict[str, set[str]]]:
    """Core requirement names and each extra's requirement names, from the installed metadata."""
    reqs = [Requirement(r) for r in importlib.metadata.requires("pgpgm") or []]
    extras = importlib.metadata.metadata("pgpgm").get_all("Provides-Extra") or []
    core = {canonicalize_name(r.name) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})}
    by_extra = {e: {canonicalize_name(r.name) for r in reqs
                    if r.marker is not None and "extra" in str(r.marker) and r.marker.evaluate({"extra": e})}
                for e in extras}
    return core, by_extra


def _third_party_imports() -> dict[str, list[tuple[str, int, bool]]]:
    """{top-level module: [(file, line, guarded)]} for every absolute import outside the stdlib.

    ``guarded`` is True when the import runs only on demand: inside a function or a
    ``try`` block, so that pgpgm imports without the module.
    """
    found: dict[str, list[tuple[str, int, bool]]] = {}

    def visit(node, guarded):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                if isinstance(child, ast.ImportFrom):
                    names = [child.module] if child.level == 0 and child.module else []
                else:
                    names = [a.name for a in child.names]
                for n in names:
                    top = n.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("pgpgm", "__future__"):
                        found.setdefault(top, []).append((str(path.relative_to(PACKAGE.parent)), child.lineno,
                                                          guarded))
            inner = guarded or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Try)
            visit(child, inner)

    for path in SOURCES:
        visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def test_the_import_walk_sees_known_imports():
    imports = _third_party_imports()
    # what the walk must find, by construction of the package
    assert {"numpy", "scipy", "sympy", "numba", "pymc", "pytensor", "xarray", "pandas", "arviz"} <= set(imports)
    assert not {"os", "json", "ctypes", "pgpgm"} & set(imports)
    assert all(guarded for _, _, guarded in imports["tabulate"])  # cli.py imports it inside a try


def test_every_imported_third_party_module_is_a_declared_requirement():
    core, by_extra = _requirements()
    dist_of = importlib.metadata.packages_distributions()
    problems = []
    for module, places in sorted(_third_party_imports().items()):
        dists = {canonicalize_name(d) for d in dist_of.get(module, [])}
        where = ", ".join(f"{f}:{ln}" for f, ln, _ in places)
        if module in OPTIONAL_MODULES:
            extra = OPTIONAL_MODULES[module]
            declared = by_extra.get(extra, set())
            if not (dists or {canonicalize_name(module)}) & declared:
                problems.append(f"{module} ({where}) is optional but not in the extra pgpgm[{extra}]")
            unguarded = [f"{f}:{ln}" for f, ln, g in places if not g]
            if unguarded:
                problems.append(f"optional {module} is imported unconditionally at {unguarded}")
        elif not dists:
            problems.append(f"{module} ({where}) is imported but not installed")
        elif not dists & core:
            problems.append(f"{module} ({where}) comes from {sorted(dists)}, not a core requirement")
    assert not problems, "\n".join(problems)


def test_every_extra_is_documented_and_every_documented_extra_exists():
    _, by_extra = _requirements()
    # docs: the site; reference: benchmarks/posterior_reference.py's independent sampler (no module of pgpgm)
    assert set(OPTIONAL_MODULES.values()) | {"dev", "docs", "reference"} == set(by_extra)
    assert by_extra["tables"] == {"tabulate"}
    assert by_extra["dask"] == {"dask"}
    assert by_extra["reference"] == {"jax", "numpyro", "diffrax"}
    assert not by_extra["reference"] & by_extra["dev"]  # the tests never need the benchmark's sampler
    assert by_extra["docs"] == {"mkdocs", "mkdocs-material", "mkdocstrings"}
    assert {"pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "nbclient", "nbformat", "ipykernel"} <= by_extra["dev"]


def test_no_direct_h5py_requirement_and_sundae_is_capped():
    reqs = {canonicalize_name(Requirement(r).name): Requirement(r) for r in importlib.metadata.requires("pgpgm")
            if "extra" not in r}
    assert "h5py" not in reqs and reqs["h5netcdf"].extras == {"h5py"}
    sundae = reqs["scikit-sundae"].specifier
    assert sundae.contains("1.2.0") and not sundae.contains("1.3.0") and not sundae.contains("2.0.0")
    assert "pandas" in reqs


@pytest.mark.skipif(not PYPROJECT.exists(), reason="not a source checkout")
def test_installed_metadata_matches_pyproject():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = {str(Requirement(r)) for r in project["dependencies"]}
    for extra, reqs in project["optional-dependencies"].items():
        declared |= {str(Requirement(f'{r}; extra == "{extra}"')) for r in reqs}
    installed = {str(Requirement(r)) for r in importlib.metadata.requires("pgpgm")}
    assert installed == declared, "the installed metadata is stale: reinstall with `pip install -e .`"


def test_installed_versions_meet_every_declared_bound():
    for r in map(Requirement, importlib.metadata.requires("pgpgm")):
        if r.marker is not None:
            continue
        version = importlib.metadata.version(r.name)
        assert r.specifier.contains(version, prereleases=True), f"{r.name} {version} does not meet {r}"


def test_pip_check_is_clean():
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


# -- SUNDIALS discovery ----------------------------------------------------------------------

@pytest.fixture
def fresh_search(monkeypatch):
    """Search again in this test, and again after it (so later tests see the real libraries)."""
    monkeypatch.setattr(sundials, "_fallback_warned", False)
    sundials._clear_caches()
    yield
    sundials._clear_caches()


@pytest.fixture(scope="module")
def real_libs() -> dict[str, Path]:
    st = sundials.status()
    if not st.found:
        pytest.skip(f"no SUNDIALS 7 here: {st.reason}")
    return {n: sundials._find(Path(st.directory), n).resolve() for n in sundials.LIBRARIES}


@pytest.fixture(scope="module")
def tiny_system():
    return pgpgm.ODESystem.from_equations({"x": "-k * x"}, ["k"], name="decay")


@pytest.mark.parametrize("name, lib, matches", [
    ("libsundials_cvode-cf29dc23.so.7.9.0", "cvode", True),   # manylinux wheel (auditwheel)
    ("libsundials_cvode.so", "cvode", True),                  # conda-forge, Linux
    ("libsundials_cvode.so.7.1.1", "cvode", True),
    ("libsundials_cvode.7.dylib", "cvode", True),             # conda-forge / delocate, macOS
    ("libsundials_cvode.7.1.1.dylib", "cvode", True),
    ("sundials_cvode.dll", "cvode", True),                    # conda-forge, Windows
    ("sundials_cvode-0a1b2c3d.dll", "cvode", True),           # delvewheel, Windows
    ("libsundials_cvodes.so.7", "cvode", False),              # CVODES is another library
    ("libsundials_cvode.a", "cvode", False),                  # static archive
    ("libsundials_cvode.so.7.9.0.debug", "cvode", False),
    ("libsundials_sunlinsollapackdense-779ad982.so.5.9.0", "sunlinsoldense", False),
    ("libsundials_sunlinsoldense-9a8418e7.so.5.9.0", "sunlinsoldense", True),
    ("libsundials_core.so.7", "core", True),
])
def test_library_file_names_on_every_platform(name, lib, matches):
    assert bool(sundials._pattern(lib).match(name)) is matches


def test_the_installed_sundials_is_found_and_is_version_7(real_libs):
    st = sundials.status()
    assert st.found and st.reason is None and st.version.split(".")[0] == "7"
    assert Path(st.directory) in [Path(d) for d in st.searched]
    # independent of the loader: a versioned file name (libsundials_core...so.7.9.0) states the version
    m = re.search(r"\.so\.(\d+\.\d+\.\d+)$", real_libs["core"].name)
    if m:
        assert st.version == m.group(1)
    if importlib.metadata.files("scikit-sundae") and any("sundials_cvode" in f.name
                                                         for f in importlib.metadata.files("scikit-sundae")):
        assert Path(st.directory) in sundials._distribution_dirs()  # found through the wheel's file list
    lib = sundials.library()
    assert lib is sundials.library()  # cached
    assert lib.directory == st.directory and lib.version == st.version


def _fake_dist_files(monkeypatch, files: list[Path]):
    class Entry:
        def __init__(self, p):
            self.name, self._p = p.name, p

        def locate(self):
            return self._p

    monkeypatch.setattr(sundials.importlib.metadata, "files", lambda dist: [Entry(p) for p in files])


def test_found_in_any_folder_of_the_distribution(tmp_path, monkeypatch, real_libs, fresh_search):
    # a wheel that keeps its libraries elsewhere (as macOS wheels do) and names them differently
    folder = tmp_path / "sksundae" / ".dylibs"
    folder.mkdir(parents=True)
    links = []
    for n, real in real_libs.items():
        links.append(folder / f"libsundials_{n}-0123abcd.so.7")
        links[-1].symlink_to(real)
    _fake_dist_files(monkeypatch, [tmp_path / "sksundae" / "__init__.py", *links])
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    st = sundials.status()
    assert st.found and Path(st.directory) == folder.resolve(), st


def test_found_in_a_conda_prefix(tmp_path, monkeypatch, real_libs, fresh_search):
    lib = tmp_path / "env" / "lib"
    lib.mkdir(parents=True)
    for n, real in real_libs.items():  # conda-forge sundials: libsundials_cvode.so -> .so.7 -> .so.7.x.y
        (lib / f"libsundials_{n}.so.7").symlink_to(real)
        (lib / f"libsundials_{n}.so").symlink_to(lib / f"libsundials_{n}.so.7")
    monkeypatch.setattr(sundials, "_distribution_dirs", lambda: [])
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path / "env"))
    st = sundials.status()
    assert st.found and Path(st.directory) == lib.resolve() and st.searched[0] == str(lib.resolve())
    assert st.version == sundials.status().version and st.version.startswith("7.")


def test_a_folder_missing_one_library_is_named(tmp_path, monkeypatch, real_libs, fresh_search):
    for n, real in real_libs.items():
        if n != "sunlinsoldense":
            (tmp_path / f"libsundials_{n}.so.7").symlink_to(real)
    monkeypatch.setattr(sundials, "_candidate_dirs", lambda: [tmp_path])
    st = sundials.status()
    assert not st.found and sundials.library() is None
    assert "libsundials_sunlinsoldense" in st.reason and str(tmp_path) in st.reason
    assert "scikit-sundae" in st.reason  # says what to install


def _backend_warnings(record):
    return [w for w in record if issubclass(w.category, BackendWarning)]


def test_hidden_libraries_fall_back_with_one_warning(monkeypatch, tiny_system, fresh_search):
    monkeypatch.setattr(sundials, "_candidate_dirs", lambda: [])
    st = sundials.status()
    assert not st.found and st.directory is None and st.version is None
    assert "no libsundials_cvode" in st.reason
    assert sundials.library() is None and "cvode" not in available_backends()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        solver = Integrator(tiny_system, [0.0, 1.0])
        Integrator(tiny_system, [0.0, 2.0])  # once per process: no second warning
    ws = _backend_warnings(record)
    assert len(ws) == 1
    msg = str(ws[0].message)
    assert f"'{solver.solver.name}'" in msg and solver.solver.name == "sksundae"
    assert "no libsundials_cvode" in msg
    assert ws[0].filename == __file__  # points at the code that asked for the solve
    # the fallback still solves correctly: x(t) = exp(-k t) (a new system: compiled without CVODE)
    decay = pgpgm.ODESystem.from_equations({"x": "-k * x"}, ["k"], name="decay_fallback")
    x = Integrator(decay, np.linspace(0, 2, 5)).solve([0.7], [1.0])[:, 0]
    np.testing.assert_allclose(x, np.exp(-0.7 * np.linspace(0, 2, 5)), rtol=1e-6)


def test_present_libraries_give_no_warning(tiny_system, real_libs, fresh_search):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        solver = Integrator(tiny_system, [0.0, 1.0])
        sundials.warn_fallback("scipy")  # nothing to warn about while CVODE is usable
    assert solver.solver.name == "cvode" and not _backend_warnings(record)


@pytest.mark.parametrize("version", [(6, 7, 0, ""), (8, 0, 0, "dev")])
def test_another_sundials_major_version_is_refused(monkeypatch, tiny_system, real_libs, fresh_search, version):
    monkeypatch.setattr(sundials, "_read_version", lambda core: version)
    st = sundials.status()
    text = f"{version[0]}.{version[1]}.{version[2]}" + (f"-{version[3]}" if version[3] else "")
    assert not st.found and st.version == text and st.directory is not None
    assert f"SUNDIALS {text}" in st.reason and "SUNDIALS 7 ABI" in st.reason
    assert sundials.library() is None and available_backends()[0] != "cvode"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        Integrator(tiny_system, [0.0, 1.0])
    assert len(_backend_warnings(record)) == 1 and text in str(_backend_warnings(record)[0].message)


# -- show_versions and `pgpgm info` -----------------------------------------------------------

LABELS = ["python", "platform", "pgpgm", "pymc", "pytensor", "arviz", "numpy", "scipy", "sympy", "numba",
          "xarray", "pandas", "dask", "nutpie", "SUNDIALS", "SUNDIALS library", "ODE backend", "numba cache"]


def _lines(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, _, v in (ln.partition(": ") for ln in text.splitlines()) if _}


def test_show_versions_prints_every_line(real_libs):
    buf = io.StringIO()
    pgpgm.show_versions(file=buf)
    lines = _lines(buf.getvalue())
    assert all(label in lines for label in LABELS), set(LABELS) - set(lines)
    import numba
    import pymc
    import pytensor
    import xarray

    for mod in (np, pymc, pytensor, numba, xarray):  # the modules' own idea of their version
        assert lines[mod.__name__] == mod.__version__
    assert lines["python"].startswith(".".join(map(str, sys.version_info[:3])))
    assert lines["SUNDIALS"] == sundials.status().version
    assert lines["SUNDIALS library"] == sundials.status().directory
    assert lines["ODE backend"].startswith("cvode")
    assert version_info()["pgpgm"].startswith(importlib.metadata.version("pgpgm"))


def test_show_versions_says_why_cvode_is_not_used(monkeypatch, fresh_search):
    monkeypatch.setattr(sundials, "_candidate_dirs", lambda: [])
    lines = _lines(_capture(pgpgm.show_versions))
    assert lines["SUNDIALS"] == "not found"
    assert lines["ODE backend"].startswith("sksundae, because") and "no libsundials_cvode" in lines["ODE backend"]


def _capture(fn) -> str:
    buf = io.StringIO()
    fn(file=buf)
    return buf.getvalue()


def test_cli_info_exits_0_and_reports_the_cache_folder(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    out = subprocess.run([sys.executable, "-m", "pgpgm.cli", "info"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = _lines(out.stdout)
    assert all(label in lines for label in LABELS)
    assert lines["numba cache"] == f"{tmp_path / 'numba-cache'} (NUMBA_CACHE_DIR)"


def test_cli_info_in_process(capsys):
    assert main(["info"]) == 0
    assert "ODE backend" in capsys.readouterr().out

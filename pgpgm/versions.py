"""What pgpgm runs on: versions, the ODE backend and cache folders, for bug reports.

``pgpgm.show_versions()`` and the CLI's ``pgpgm info`` print the same lines.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from .codegen.cache import cache_dir
from .solve import available_solvers, sundials

#: Modules pgpgm imports only when they are installed, and the extra that installs each
#: (``pip install "pgpgm[tables]"``). Every other third-party module pgpgm imports is a
#: core requirement (tests/test_install.py checks both against the package metadata).
OPTIONAL_MODULES = MappingProxyType({
    "tabulate": "tables",    # Markdown tables in the CLI summary
    "dask": "dask",          # fits on a dask cluster
    "distributed": "dask",
    "petab": "petab",        # PEtab problems (pgpgm.load_petab): the tables and formulas
    "libsbml": "petab",      # their SBML models
    "sbmlmath": "petab",     # SBML math to sympy
    "yaml": "petab",         # the problem's YAML file
})

#: Distributions reported, in order (optional ones say how to install them when absent).
_CORE = ("pymc", "pytensor", "arviz", "numpy", "scipy", "sympy", "numba", "llvmlite", "xarray", "pandas",
         "h5netcdf", "h5py", "scikit-sundae", "matplotlib", "nutpie")
_OPTIONAL = (("tabulate", "tables"), ("dask", "dask"), ("distributed", "dask"), ("petab", "petab"),
             ("python-libsbml", "petab"), ("sbmlmath", "petab"))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _numba_cache_dir() -> str:
    """Where numba writes its on-disk cache (``cache=True`` functions)."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return f"{env} (NUMBA_CACHE_DIR)"
    from numba.misc.appdirs import AppDirs

    user = AppDirs(appname="numba", appauthor=False).user_cache_dir
    return f"default: __pycache__ beside each module, or {user} where that is not writable (NUMBA_CACHE_DIR unset)"


def version_info() -> dict[str, str]:
    """The lines of :func:`show_versions` as ``{label: text}``, in order.

    Labels: ``python``, ``executable``, ``platform``, ``pgpgm``, one per core dependency
    (``pymc``, ``pytensor``, ``arviz``, ``numpy``, ``scipy``, ``sympy``, ``numba``,
    ``llvmlite``, ``xarray``, ``pandas``, ``h5netcdf``, ``h5py``, ``scikit-sundae``,
    ``matplotlib``, ``nutpie``), the optional ``tabulate``, ``dask``, ``distributed``, ``petab``,
    ``python-libsbml``, ``sbmlmath``,
    then ``SUNDIALS``, ``SUNDIALS library``, ``ODE backend``, ``numba cache`` and
    ``PyTensor compiledir``.
    """

    info = {
        "python": sys.version.replace("\n", " "),
        "executable": sys.executable,
        "platform": f"{platform.platform()} ({platform.machine()})",
        "pgpgm": f"{_version('pgpgm') or 'not installed'} ({Path(__file__).resolve().parent})",
    }
    for dist in _CORE:
        info[dist] = _version(dist) or "MISSING (a required dependency)"
    for dist, extra in _OPTIONAL:
        info[dist] = _version(dist) or f"not installed (optional: pip install \"pgpgm[{extra}]\")"
    st = sundials.status()
    if st.found:
        info["SUNDIALS"] = st.version
        info["SUNDIALS library"] = st.directory
    else:
        info["SUNDIALS"] = f"{st.version} (refused)" if st.version else "not found"
        info["SUNDIALS library"] = st.directory or f"none in {', '.join(st.searched) or 'the searched folders'}"
    backend = available_solvers()[0].name
    info["ODE backend"] = ("cvode (SUNDIALS CVODE with compiled callbacks)" if backend == "cvode"
                           else f"{backend}, because the compiled CVODE backend is unusable: {st.reason}")
    info["numba cache"] = _numba_cache_dir()
    info["model kernel cache"] = f"{cache_dir()} (PGPGM_CACHE_DIR to move; safe to delete)"
    import pytensor

    info["PyTensor compiledir"] = str(pytensor.config.compiledir)
    return info


def show_versions(file: TextIO | None = None) -> None:
    """Print Python, platform, pgpgm and dependency versions, the SUNDIALS library, the ODE
    backend a fit will use (and why, when it is not CVODE) and the cache folders.

    Paste the output into bug reports. ``pgpgm info`` prints the same.

    Parameters
    ----------
    file : text stream, optional
        Where to print (default ``sys.stdout``).
    """
    info = version_info()
    width = max(map(len, info))
    out = file if file is not None else sys.stdout
    print("pgpgm installation", file=out)
    print("-" * 19, file=out)
    for key, value in info.items():
        print(f"{key + ':':<{width + 1}} {value}", file=out)

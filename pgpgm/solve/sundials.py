"""ctypes bindings to the SUNDIALS 7 CVODE shared libraries.

Where the libraries are looked for, in this order:

1. the files of the installed ``scikit-sundae`` distribution (its wheel vendors SUNDIALS:
   ``scikit_sundae.libs/`` on Linux and Windows, ``sksundae/.dylibs/`` on macOS; any folder
   of the distribution that holds a ``libsundials_cvode*`` is tried);
2. ``$CONDA_PREFIX/lib`` and ``sys.prefix/lib`` (conda-forge ``sundials``), and
   ``Library/bin`` below both on Windows.

The seven libraries (``core``, ``nvecserial``, ``sunmatrixdense``, ``sunlinsoldense``,
``sunmatrixband``, ``sunlinsolband``, ``cvode``) must all lie in one folder; their names may
carry a wheel's hash suffix and a version (``libsundials_cvode-cf29dc23.so.7.9.0``, ``libsundials_cvode.7.dylib``,
``sundials_cvode.dll``). The SUNDIALS version is read from ``libsundials_core`` when it is
loaded and any major version other than 7 is refused: the signatures below are SUNDIALS 7's.

Only the handful of functions the BDF driver needs (dense and band Newton matrices) are bound.
Index arguments are passed as 64-bit integers, which is correct for both 32- and 64-bit ``sunindextype`` builds
under the x86-64 and AArch64 calling conventions.

:func:`status` says what was found (and why nothing usable was); :func:`warn_fallback`
tells the user, once per process, that a slower backend is used instead.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace

from ..errors import BackendWarning

LIBRARIES = ("core", "nvecserial", "sunmatrixdense", "sunlinsoldense", "sunmatrixband", "sunlinsolband", "cvode")
SUPPORTED_MAJOR = 7
INSTALL_HINT = "install scikit-sundae>=1.1,<1.3 (pip) or sundials>=7,<8 (conda-forge)"

_vp, _int, _long, _idx, _real = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int64, ctypes.c_double
_SIGNATURES = {
    "SUNContext_Create": (_int, [_int, ctypes.POINTER(_vp)]),
    "SUNContext_Free": (_int, [ctypes.POINTER(_vp)]),
    "SUNContext_ClearErrHandlers": (_int, [_vp]),
    "N_VNew_Serial": (_vp, [_idx, _vp]),
    "N_VDestroy": (None, [_vp]),
    "N_VGetArrayPointer": (ctypes.POINTER(_real), [_vp]),
    "SUNDenseMatrix": (_vp, [_idx, _idx, _vp]),
    "SUNDenseMatrix_Data": (ctypes.POINTER(_real), [_vp]),
    "SUNMatDestroy": (None, [_vp]),
    "SUNLinSol_Dense": (_vp, [_vp, _vp, _vp]),
    "SUNBandMatrix": (_vp, [_idx, _idx, _idx, _vp]),
    "SUNBandMatrix_Data": (ctypes.POINTER(_real), [_vp]),
    "SUNBandMatrix_LDim": (_idx, [_vp]),
    "SUNBandMatrix_StoredUpperBandwidth": (_idx, [_vp]),
    "SUNLinSol_Band": (_vp, [_vp, _vp, _vp]),
    "SUNLinSolFree": (_int, [_vp]),
    "CVodeCreate": (_vp, [_int, _vp]),
    "CVodeInit": (_int, [_vp, _vp, _real, _vp]),
    "CVodeReInit": (_int, [_vp, _real, _vp]),
    "CVodeSStolerances": (_int, [_vp, _real, _real]),
    "CVodeSetUserData": (_int, [_vp, _vp]),
    "CVodeSetLinearSolver": (_int, [_vp, _vp, _vp]),
    "CVodeSetJacFn": (_int, [_vp, _vp]),
    "CVodeSetMaxNumSteps": (_int, [_vp, _long]),
    "CVodeSetStopTime": (_int, [_vp, _real]),
    "CVodeSetMinStep": (_int, [_vp, _real]),
    "CVodeSetMaxHnilWarns": (_int, [_vp, _int]),
    "CVode": (_int, [_vp, _real, _vp, ctypes.POINTER(_real), _int]),
    "CVodeGetNumSteps": (_int, [_vp, ctypes.POINTER(_long)]),
    "CVodeGetReturnFlagName": (ctypes.c_char_p, [_long]),
    "CVodeFree": (None, [ctypes.POINTER(_vp)]),
}
CV_BDF = 2
CV_NORMAL = 1
CV_TOO_MUCH_WORK = -1  # CVode return flag: max_steps internal steps taken before the output time


@dataclass(frozen=True)
class SundialsStatus:
    """What the search for the SUNDIALS libraries found.

    Attributes
    ----------
    found : bool
        True when SUNDIALS 7 was loaded and the compiled CVODE backend can be used.
    directory : str or None
        Folder of the loaded libraries; when not found, the folder of refused libraries
        (e.g. a SUNDIALS 6 or 8 copy), else None.
    version : str or None
        SUNDIALS version of those libraries, e.g. ``"7.1.1"`` (None when none were read).
    reason : str or None
        Why the compiled backend cannot be used and what to install (None when found).
    searched : tuple of str
        The folders searched, in order.
    """

    found: bool
    directory: str | None
    version: str | None
    reason: str | None
    searched: tuple[str, ...]


def _pattern(name: str) -> re.Pattern:
    """File names of one SUNDIALS library on Linux, macOS and Windows, plain or vendored."""
    return re.compile(rf"^(?:lib)?sundials_{name}(?:-[0-9A-Za-z]+)?(?:\.\d+)*\.(?:so|dylib|dll)(?:\.\d+)*$")


def _distribution_dirs() -> list[Path]:
    """Folders of the installed scikit-sundae distribution that hold a CVODE library."""
    try:
        files = importlib.metadata.files("scikit-sundae") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    cvode = _pattern("cvode")
    return [Path(f.locate()).parent for f in files if cvode.match(f.name)]


def _candidate_dirs() -> list[Path]:
    """Existing folders to search, best first, without repeats."""
    dirs = _distribution_dirs()
    for prefix in (os.environ.get("CONDA_PREFIX"), sys.prefix):
        if prefix:
            dirs.append(Path(prefix) / "lib")
            if sys.platform == "win32":
                dirs.append(Path(prefix) / "Library" / "bin")
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in out:
            out.append(d.resolve())
    return out


def _find(directory: Path, name: str) -> Path | None:
    """The library file ``name`` in ``directory`` (the first in sorted order), or None."""
    pat = _pattern(name)
    hits = sorted(p for p in directory.iterdir() if pat.match(p.name))
    return hits[0] if hits else None


def _read_version(core: ctypes.CDLL) -> tuple[int, int, int, str]:
    """(major, minor, patch, label) from ``SUNDIALSGetVersionNumber`` in libsundials_core."""
    f = core.SUNDIALSGetVersionNumber
    f.restype = _int
    f.argtypes = [ctypes.POINTER(_int)] * 3 + [ctypes.c_char_p, _int]
    major, minor, patch = _int(), _int(), _int()
    label = ctypes.create_string_buffer(64)
    if f(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch), label, len(label)) != 0:
        raise OSError("SUNDIALSGetVersionNumber failed")
    return major.value, minor.value, patch.value, label.value.decode(errors="replace")


def _bind(handles: list[ctypes.CDLL]) -> dict:
    """The functions of ``_SIGNATURES`` with their argument and return types set."""
    funcs = {}
    for name, (res, args) in _SIGNATURES.items():
        f = next((getattr(h, name) for h in handles if hasattr(h, name)), None)
        if f is None:
            raise AttributeError(name)
        f.restype, f.argtypes = res, args
        funcs[name] = f
    return funcs


@cache
def load() -> tuple[SundialsStatus, dict | None, tuple[ctypes.CDLL, ...]]:
    """Search, load, check the version and bind: the status, the bound functions and the
    loaded libraries (kept referenced here)."""
    dirs = _candidate_dirs()
    searched = tuple(str(d) for d in dirs)
    problems: list[str] = []
    seen_dir = seen_version = None
    for d in dirs:
        paths = {n: _find(d, n) for n in LIBRARIES}
        missing = [f"libsundials_{n}" for n, p in paths.items() if p is None]
        if len(missing) == len(LIBRARIES):
            continue
        seen_dir, seen_version = str(d), None
        if missing:
            problems.append(f"{d} lacks {', '.join(missing)} (SUNDIALS 7 has all of them)")
            continue
        try:
            if hasattr(os, "add_dll_directory"):  # Windows: let the DLLs find each other
                os.add_dll_directory(str(d))
            handles = [ctypes.CDLL(str(paths[n]), mode=ctypes.RTLD_GLOBAL) for n in LIBRARIES]
            major, minor, patch, label = _read_version(handles[0])
        except (OSError, AttributeError) as exc:
            problems.append(f"the libraries in {d} could not be loaded ({exc})")
            continue
        seen_version = f"{major}.{minor}.{patch}" + (f"-{label}" if label else "")
        if major != SUPPORTED_MAJOR:
            problems.append(f"{d} has SUNDIALS {seen_version}, but pgpgm's binding is written for the "
                            f"SUNDIALS {SUPPORTED_MAJOR} ABI")
            continue
        try:
            funcs = _bind(handles)
        except AttributeError as exc:
            problems.append(f"SUNDIALS {seen_version} in {d} lacks the function {exc}")
            continue
        return SundialsStatus(True, str(d), seen_version, None, searched), funcs, tuple(handles)
    if not problems:
        problems.append(f"no libsundials_cvode in {', '.join(searched) or 'any searched folder'}")
    reason = "; ".join(problems) + f"; {INSTALL_HINT}"
    return SundialsStatus(False, seen_dir, seen_version, reason, searched), None, ()


def status() -> SundialsStatus:
    """Where the SUNDIALS libraries are, their version, or why none are usable (cached)."""
    return load()[0]


@cache
def library() -> SimpleNamespace | None:
    """Load SUNDIALS CVODE (version 7) once; None when no usable copy exists (see :func:`status`).

    The namespace holds the bound functions (``lib.CVodeInit`` ...), ``directory``,
    and ``version``.
    """
    st, funcs, _ = load()
    if funcs is None:
        return None
    return SimpleNamespace(directory=st.directory, version=st.version, **funcs)


def _clear_caches() -> None:
    """Forget what was found, so that the next call searches again (for tests)."""
    library.cache_clear()
    load.cache_clear()


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_fallback_warned = False  # the fallback warning is given once per process


def warn_fallback(fallback_name: str) -> None:
    """Warn, once per process, that the slower backend ``fallback_name`` replaces CVODE.

    Does nothing when the compiled CVODE backend is usable. The warning is a
    :class:`pgpgm.errors.BackendWarning` that names the fallback and the reason.
    """
    global _fallback_warned
    st = status()
    if st.found or _fallback_warned:
        return
    _fallback_warned = True
    warnings.warn(f"pgpgm: the compiled CVODE backend is unavailable, so ODE solves use the slower "
                  f"{fallback_name!r} backend (a Python call per right-hand-side evaluation). Reason: {st.reason}. "
                  "`pgpgm info` shows what was found.", BackendWarning,
                  skip_file_prefixes=(_PACKAGE_DIR,))  # point at the user's code that asked for a solve

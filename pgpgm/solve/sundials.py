"""ctypes bindings to the SUNDIALS 7 CVODE shared libraries.

The libraries come from the ``scikit-sundae`` wheel (``scikit_sundae.libs``), or from
the active conda environment's ``lib/`` (conda-forge ``sundials``, pulled in by
``sunode``). Only the handful of functions the dense BDF driver needs are bound.
Index arguments are passed as 64-bit integers, which is correct for both 32- and
64-bit ``sunindextype`` builds under the x86-64 and AArch64 calling conventions.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from functools import cache
from types import SimpleNamespace

_LIBS = ("core", "nvecserial", "sunmatrixdense", "sunlinsoldense", "cvode")

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
    "CVodeSetMaxHnilWarns": (_int, [_vp, _int]),
    "CVode": (_int, [_vp, _real, _vp, ctypes.POINTER(_real), _int]),
    "CVodeGetNumSteps": (_int, [_vp, ctypes.POINTER(_long)]),
    "CVodeGetReturnFlagName": (ctypes.c_char_p, [_long]),
    "CVodeFree": (None, [ctypes.POINTER(_vp)]),
}
CV_BDF = 2
CV_NORMAL = 1


def _candidate_dirs() -> list[str]:
    dirs = []
    try:
        import sksundae

        dirs.append(os.path.join(os.path.dirname(sksundae.__file__), os.pardir, "scikit_sundae.libs"))
    except ImportError:
        pass
    for prefix in (os.environ.get("CONDA_PREFIX"), sys.prefix):
        if prefix:
            dirs.append(os.path.join(prefix, "lib"))
    return dirs


def _find(directory: str, name: str) -> str | None:
    hits = sorted(glob.glob(os.path.join(directory, f"libsundials_{name}*.so*")))
    hits += sorted(glob.glob(os.path.join(directory, f"libsundials_{name}*.dylib")))
    return hits[0] if hits else None


@cache
def library() -> SimpleNamespace | None:
    """Load SUNDIALS CVODE (version 7) once; None when no usable copy exists."""
    for d in _candidate_dirs():
        paths = [_find(d, n) for n in _LIBS]
        if not all(paths):
            continue
        try:
            handles = [ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL) for p in paths]
            funcs = {}
            for name, (res, args) in _SIGNATURES.items():
                f = next(getattr(h, name) for h in handles if hasattr(h, name))
                f.restype, f.argtypes = res, args
                funcs[name] = f
        except (OSError, StopIteration):
            continue
        return SimpleNamespace(directory=os.path.realpath(d), drive=_make_driver(funcs), **funcs)
    return None


def _make_driver(funcs):
    """A numba loop over the output times: CVode and the copy-out run without Python."""
    import numba

    addr = ctypes.cast(funcs["CVode"], ctypes.c_void_p).value
    cvode = ctypes.CFUNCTYPE(_int, _vp, _real, _vp, _vp, _int)(addr)
    get_data = funcs["N_VGetArrayPointer"]

    @numba.njit(cache=False)
    def drive(mem, y, times, out, tret):
        """Fill out[1:] with the solution at times[1:]; returns (flag, index reached)."""
        n = out.shape[1]
        yv = numba.carray(get_data(y), (n,))
        for i in range(1, times.shape[0]):
            flag = cvode(mem, times[i], y, tret.ctypes.data, CV_NORMAL)
            if flag < 0:
                return flag, i
            for j in range(n):
                out[i, j] = yv[j]
        return 0, times.shape[0]

    return drive

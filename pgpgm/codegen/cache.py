"""Where the compiled kernels of each ODE system live on disk, so a new process reuses them.

The kernels of a system (:mod:`pgpgm.ode.functions`) are written as Python source to a module
file named by a hash of that source - which holds the equations, their derivatives and the
state and parameter positions - and of the versions of pgpgm's compiled code, numba and
Python. The module's functions are compiled with numba's ``cache=True``, so numba stores the
machine code beside the file (``__pycache__``) and a later process that builds the same
system loads it instead of compiling. A changed model has other source, so another file: it
never gets the old kernels. The folder is ``$PGPGM_CACHE_DIR`` if set, else the user cache
folder (``platformdirs.user_cache_dir("pgpgm")``) with a ``kernels`` subfolder; deleting it is
always safe (it is rebuilt).

Concurrent processes (e.g. Dask workers building the same model at once) are safe: a module
file is written under a temporary name and linked into place only when complete and absent,
so every reader sees either no file or the whole file, and an existing file is never
rewritten (numba's own cache files are written the same way by numba).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numba

#: pgpgm source files whose code is compiled into (or called from) the cached kernels; a
#: change in any of them gives every system new keys.
_COMPILED_SOURCES = ("codegen/printer.py", "codegen/templates.py", "ode/functions.py", "solve/native.py",
                     "solve/cvode.py", "solve/dopri5.py", "solve/numba_op.py", "matching/compiled.py")
_PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """The folder of the cached kernel modules (created when missing): ``$PGPGM_CACHE_DIR/kernels``,
    else the user cache folder's ``pgpgm/kernels``; where that cannot be created or written (a
    read-only home), ``pgpgm-<user>/kernels`` in the temporary folder."""
    env = os.environ.get("PGPGM_CACHE_DIR")
    if env:
        base = Path(env)
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("pgpgm", appauthor=False))
    path = base / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(path)
    except OSError:
        import getpass

        path = Path(tempfile.gettempdir()) / f"pgpgm-{getpass.getuser()}" / "kernels"
        path.mkdir(parents=True, exist_ok=True)
    return path


def _code_version() -> str:
    h = hashlib.sha256()
    for rel in _COMPILED_SOURCES:
        h.update((_PACKAGE / rel).read_bytes())
    h.update(f"{numba.__version__} {sys.version_info[:3]} {sys.platform}".encode())
    return h.hexdigest()


_CODE_VERSION = _code_version()


def source_key(source: str) -> str:
    """The cache key (hex) of generated kernel source: its text and the compiled code's version."""
    return hashlib.sha256((_CODE_VERSION + "\n" + source).encode()).hexdigest()[:24]


def _write_once(path: Path, text: str) -> None:
    """Create ``path`` holding ``text`` unless it exists already with that text; atomic."""
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process put the (same) file there first
        except FileExistsError:
            if path.read_bytes() != data:  # damaged by hand: replace it
                os.replace(tmp, path)
                tmp = None
        except OSError:  # no hard links on this file system
            os.replace(tmp, path)
            tmp = None
    finally:
        if tmp is not None:
            os.unlink(tmp)


def load_module(source: str, key: str) -> ModuleType:
    """Import the generated ``source`` from its cache file ``pgpgm_kernels_<key>.py`` (written
    first if absent) as the module ``pgpgm_kernels_<key>`` (the same object when imported
    already in this process). Its numba functions load their machine code from numba's cache when
    present."""
    name = f"pgpgm_kernels_{key}"
    if name in sys.modules:
        return sys.modules[name]
    path = cache_dir() / f"{name}.py"
    _write_once(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # numba finds the module by name when it loads cached C callbacks (their environment)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module

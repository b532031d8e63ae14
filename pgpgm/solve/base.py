"""ODE solving: the latent-state solve and its forward sensitivities.

Backends (all integrate the same :class:`~pgpgm.ode.system.ODESystem`):

``"cvode"``
    SUNDIALS CVODE (BDF, dense Newton) called through ctypes with numba-compiled
    C callbacks for f and df/dx: no Python between the solver and the model. Uses
    the SUNDIALS libraries shipped in the ``scikit-sundae`` wheel (or a conda
    ``sundials`` 7). The default.
``"sksundae"``
    scikit-sundae's own CVODE wrapper, which calls a Python right-hand side (slower;
    kept as a fallback where the libraries cannot be bound directly).
``"scipy"``
    :func:`scipy.integrate.solve_ivp` (LSODA), the reference implementation.

Sensitivities with respect to q = (theta, x0) come from integrating the augmented
system ``[x, dx/dq_1, ..., dx/dq_K]`` (see :mod:`pgpgm.ode.codegen`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..data import check_times
from ..errors import DataError, ODESolveError
from ..ode.system import ODESystem
from . import sundials as _sundials

BACKENDS = ("cvode", "sksundae", "scipy")


@dataclass(frozen=True)
class SolverOptions:
    """Integration settings.

    rtol, atol : relative and absolute tolerances (applied to states and sensitivities).
    max_steps : most internal steps between two output times before the solve is
        declared failed (this bounds the work of a diverging solve).
    """

    rtol: float = 1e-8
    atol: float = 1e-8
    max_steps: int = 20_000

    def __post_init__(self):
        if not (self.rtol > 0 and self.atol > 0 and self.max_steps > 0):
            raise ValueError(f"tolerances and max_steps must be positive: {self}")


def available_backends() -> list[str]:
    """Backends usable on this machine, best first."""
    from . import sundials as _sundials

    out = []
    if _sundials.library() is not None:
        out.append("cvode")
    try:
        import sksundae  # noqa: F401

        out.append("sksundae")
    except ImportError:
        pass
    return out + ["scipy"]


class ODESolver:
    """Solve one system at fixed output times; x0 is the state at ``times[0]``.

    Parameters
    ----------
    system : ODESystem
    times : array (N,)
        Strictly increasing output times; the solve starts at ``times[0]``.
    backend : {"auto", "cvode", "sksundae", "scipy"}
    options : SolverOptions

    Attributes
    ----------
    n_solves : int
        Number of solves done so far (with or without sensitivities).
    """

    def __init__(self, system: ODESystem, times, *, backend: str = "auto", options: SolverOptions | None = None):
        self.system = system
        self.times = check_times(times)
        self.options = options or SolverOptions()
        if backend == "auto":
            backend = available_backends()[0]
            _sundials.warn_fallback(backend)  # once per process; nothing when CVODE is usable
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS} or 'auto'")
        if backend not in available_backends():
            raise ValueError(f"backend {backend!r} is not available here; available: {available_backends()}")
        self.backend = backend
        self.n_solves = 0
        S, P = system.n_states, system.n_parameters
        self._sizes = {False: S, True: S * (1 + P + S)}
        self._engines: dict[bool, object] = {}
        self._last: tuple[bytes, np.ndarray] | None = None  # the latest plain solve, reused on a repeat


    # -- public
    def solve(self, theta, x0) -> np.ndarray:
        """States at ``times``: array (N, S). Raises :class:`ODESolveError` on failure."""
        theta, x0 = self._check(theta, x0)
        key = theta.tobytes() + x0.tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1].copy()
        out = self._run(False, theta, x0)
        self._last = (key, out.copy())
        return out

    def solve_sensitivities(self, theta, x0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """States and forward sensitivities at ``times``.

        Returns
        -------
        x : (N, S)
        dx_dtheta : (N, S, P)   d x_i(t_n) / d theta_k
        dx_dx0 : (N, S, S)      d x_i(t_n) / d x0_j
        """
        theta, x0 = self._check(theta, x0)
        S, P = self.system.n_states, self.system.n_parameters
        y0 = np.zeros(self._sizes[True])
        y0[:S] = x0
        for j in range(S):  # d x(t0) / d x0_j = e_j
            y0[S + (P + j) * S + j] = 1.0
        out = self._run(True, theta, y0)
        N = out.shape[0]
        sens = out[:, S:].reshape(N, P + S, S).transpose(0, 2, 1)
        return out[:, :S], sens[:, :, :P], sens[:, :, P:]

    # -- internals
    def _check(self, theta, x0):
        S, P = self.system.n_states, self.system.n_parameters
        theta = np.asarray(theta, dtype=float).reshape(-1)
        x0 = np.asarray(x0, dtype=float).reshape(-1)
        if theta.shape != (P,):
            raise DataError(f"theta must have {P} values {list(self.system.parameters)}, got {theta.shape[0]}")
        if x0.shape != (S,):
            raise DataError(f"x0 must have {S} values {list(self.system.states)}, got {x0.shape[0]}")
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(x0))):
            raise ODESolveError(f"non-finite theta {theta} or x0 {x0}")
        return theta, x0

    def _run(self, aug: bool, theta, y0) -> np.ndarray:
        self.n_solves += 1
        if self.backend == "scipy":
            out = _solve_scipy(self.system, self.times, theta, y0, aug, self.options)
        else:
            engine = self._engines.get(aug)
            if engine is None:
                cls = _CompiledCvode if self.backend == "cvode" else _SksundaeCvode
                engine = self._engines[aug] = cls(self.system, self._sizes[aug], aug, self.options)
            out = engine.solve(self.times, theta, y0)
        if not np.all(np.isfinite(out)):
            raise ODESolveError("the ODE solution became non-finite")
        return out


class _CompiledCvode:
    """CVODE with compiled callbacks, driven through ctypes; one instance per size."""

    def __init__(self, system: ODESystem, n: int, aug: bool, opts: SolverOptions):
        from . import sundials as _sundials

        lib = self._lib = _sundials.library()
        cb = system.compiled.cvode
        self._ctx = ctypes.c_void_p()
        if lib.SUNContext_Create(0, ctypes.byref(self._ctx)) != 0:
            raise ODESolveError("could not create a SUNDIALS context")
        lib.SUNContext_ClearErrHandlers(self._ctx)  # errors come back as flags; we raise
        self._y = lib.N_VNew_Serial(n, self._ctx)
        self._yv = np.ctypeslib.as_array(lib.N_VGetArrayPointer(self._y), (n,))
        self._p = np.zeros(max(system.n_parameters, 1))
        self._mem = ctypes.c_void_p(lib.CVodeCreate(_sundials.CV_BDF, self._ctx))
        self._A = lib.SUNDenseMatrix(n, n, self._ctx)
        self._LS = lib.SUNLinSol_Dense(self._y, self._A, self._ctx)
        rhs, jac = (cb.aug_rhs, cb.aug_jac) if aug else (cb.rhs, cb.jac)
        flags = [
            lib.CVodeInit(self._mem, rhs, 0.0, self._y),
            lib.CVodeSStolerances(self._mem, opts.rtol, opts.atol),
            lib.CVodeSetUserData(self._mem, self._p.ctypes.data),
            lib.CVodeSetLinearSolver(self._mem, self._LS, self._A),
            lib.CVodeSetJacFn(self._mem, jac),
            lib.CVodeSetMaxNumSteps(self._mem, opts.max_steps),
            lib.CVodeSetMaxHnilWarns(self._mem, -1),  # no "t + h = t" chatter on stderr
        ]
        if any(flags):
            raise ODESolveError(f"CVODE set-up failed with flags {flags}")
        self._tret = np.zeros(1)
        self._keep = cb  # the callbacks must outlive the solver

    def solve(self, times, theta, y0) -> np.ndarray:
        lib = self._lib
        self._p[: theta.size] = theta
        self._yv[:] = y0
        lib.CVodeReInit(self._mem, times[0], self._y)
        lib.CVodeSetStopTime(self._mem, times[-1])
        out = np.empty((times.size, y0.size))
        out[0] = y0
        flag, i = lib.drive(self._mem.value, self._y, times, out, self._tret)
        if flag < 0:
            name = lib.CVodeGetReturnFlagName(flag).decode()
            raise ODESolveError(
                f"CVODE failed with {name} at t = {self._tret[0]:.6g} "
                f"(target t = {times[i]:.6g}, theta = {theta.tolist()})"
            )
        return out

    def __del__(self):
        lib = getattr(self, "_lib", None)
        if lib is None or not getattr(self, "_ctx", None):
            return
        lib.CVodeFree(ctypes.byref(self._mem))
        lib.SUNLinSolFree(self._LS)
        lib.SUNMatDestroy(self._A)
        lib.N_VDestroy(self._y)
        lib.SUNContext_Free(ctypes.byref(self._ctx))


class _SksundaeCvode:
    """scikit-sundae's CVODE with a Python callback into the compiled right-hand side."""

    def __init__(self, system: ODESystem, n: int, aug: bool, opts: SolverOptions):
        from sksundae.cvode import CVODE

        k = system.compiled
        self._p = np.zeros(max(system.n_parameters, 1))
        f = k.aug_rhs if aug else k.rhs
        p = self._p

        def rhsfn(t, y, yp):
            f(t, y, p, yp)

        self._solver = CVODE(rhsfn, rtol=opts.rtol, atol=opts.atol, max_num_steps=opts.max_steps, method="BDF")

    def solve(self, times, theta, y0) -> np.ndarray:
        self._p[: theta.size] = theta
        sol = self._solver.solve(times, y0)
        if not sol.success or sol.y.shape[0] != times.size:
            raise ODESolveError(f"scikit-sundae CVODE failed: {sol.message}")
        return np.asarray(sol.y)


def _solve_scipy(system: ODESystem, times, theta, y0, aug: bool, opts: SolverOptions) -> np.ndarray:
    from scipy.integrate import solve_ivp

    k = system.compiled
    p = np.zeros(max(system.n_parameters, 1))
    p[: theta.size] = theta
    f = k.aug_rhs if aug else k.rhs

    budget = [opts.max_steps * 10 * times.size]  # LSODA can crawl forever towards a blow-up

    def fun(t, y):
        budget[0] -= 1
        if budget[0] < 0:
            raise ODESolveError(f"solve_ivp exceeded its right-hand-side budget near t = {t:.6g}")
        out = np.empty_like(y)
        f(t, y, p, out)
        return out

    sol = solve_ivp(fun, (times[0], times[-1]), y0, method="LSODA", t_eval=times, rtol=opts.rtol, atol=opts.atol)
    if sol.status != 0 or sol.y.shape[1] != times.size:
        raise ODESolveError(f"solve_ivp failed: {sol.message}")
    return sol.y.T

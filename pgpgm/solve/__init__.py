"""ODE solving: solver objects (one module per backend), the integrator, the PyTensor Op."""

from __future__ import annotations

from . import sundials
from .base import Integrator, Solver
from .cvode import CVODE
from .lsoda import LSODA
from .sksundae import SksundaeCVODE

#: Every backend, fastest first.
SOLVERS: tuple[type[Solver], ...] = (CVODE, SksundaeCVODE, LSODA)


def available_solvers() -> list[type[Solver]]:
    """The solver classes usable on this machine, fastest first."""
    return [cls for cls in SOLVERS if cls.available()]


def default_solver() -> Solver:
    """The fastest available solver with default tolerances (:class:`CVODE` where SUNDIALS loads;
    otherwise a :class:`~pgpgm.errors.BackendWarning`, once per process, names the fallback and why)."""
    solver = available_solvers()[0]()
    sundials.warn_fallback(solver.name)  # nothing when CVODE is usable
    return solver


__all__ = ["CVODE", "LSODA", "SOLVERS", "Integrator", "SksundaeCVODE", "Solver", "available_solvers",
           "default_solver"]

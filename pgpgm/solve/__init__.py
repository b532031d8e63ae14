"""ODE solving: solver objects (one module per backend: ``cvode``, ``dopri5``, ``sksundae``, ``lsoda``, on the
protocol of ``base``), the :class:`Integrator` with the default solver (``integrator``), and the
PyTensor Op (``op``, compiled by ``numba_op``)."""

from __future__ import annotations

from .base import Solver
from .cvode import CVODE
from .dopri5 import DOPRI5
from .integrator import SOLVERS, Integrator, available_solvers, default_solver
from .lsoda import LSODA
from .sksundae import SksundaeCVODE

__all__ = ["CVODE", "DOPRI5", "LSODA", "SOLVERS", "Integrator", "SksundaeCVODE", "Solver", "available_solvers",
           "default_solver"]

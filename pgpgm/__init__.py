"""pgpgm: parameter inference for partially observed nonlinear ODE systems."""

from .errors import DataError, ModelDefinitionError, ODESolveError, PgpgmError
from .ode import ODESolver, SolverOptions, available_backends
from .op import ODEOp
from .sensitivity import sensitivity_index
from .simulate import simulate
from .spec import Experiment, ModelSpec, available_models, load_model
from .system import ODESystem

__all__ = [
    "Experiment",
    "ModelSpec",
    "ODEOp",
    "available_models",
    "load_model",
    "sensitivity_index",
    "simulate",
    "DataError",
    "ModelDefinitionError",
    "ODESolveError",
    "ODESolver",
    "ODESystem",
    "PgpgmError",
    "SolverOptions",
    "available_backends",
]

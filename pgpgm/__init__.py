"""pgpgm: parameter inference for partially observed nonlinear ODE systems."""

from .density import DensitySetup, build_model
from .errors import DataError, ModelDefinitionError, ODESolveError, PgpgmError
from .solve.base import ODESolver, SolverOptions, available_backends
from .pipeline import fit
from .result import FitResult, load_result
from .solve.op import ODEOp
from .sampling import GradientMatchingSampler, GradientMatchingStep, sample
from .sensitivity import sensitivity_index
from .simulate import simulate
from .ode.spec import Experiment, ModelSpec, available_models, load_model
from .ode.system import ODESystem
from .versions import show_versions

__all__ = [
    "FitResult",
    "fit",
    "load_result",
    "DensitySetup",
    "GradientMatchingSampler",
    "GradientMatchingStep",
    "build_model",
    "sample",
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
    "show_versions",
]

"""pgpgm: parameter inference for partially observed nonlinear ODE systems.

The pipeline, in the order of the package layout: ``ode`` (model definition) ->
``solve`` (ODE solvers, the PyTensor Op) -> ``gp`` (step 1) -> ``density`` (step 2a) ->
``sampling`` (step 2b) -> ``refine`` (step 3) -> ``pipeline`` (:func:`fit`) -> ``result``.
"""

from .batch import FitJob, fit_many, jobs_from_folder, jobs_from_tidy_csv, product_jobs
from .data import Observations
from .density import GradientMatchingDensity, build_model, gradient_matching_density
from .errors import (BackendWarning, BoundWarning, ConvergenceWarning, DataError, IdentifiabilityWarning,
                     ModelDefinitionError, ODESolveError, PgpgmError, ResultFileError, SamplingError)
from .ode.spec import Experiment, ModelSpec, available_models, load_model
from .ode.system import ODESystem
from .ode.transform import LogScale, log_transform
from . import datasets
from .pipeline import fit
from .posterior import build_ode_model, sample_posterior
from .priors import Priors
from .refine import LeastSquaresProblem, Refinement, refine
from .result import FitResult, load_result
from .sampling import GradientMatchingStep, GradientMatchingTarget, sample
from .sampling.schemes import Block, Elementwise
from .sensitivity import sensitivity_index
from .simulate import simulate
from .solve import CVODE, LSODA, Integrator, SksundaeCVODE, Solver, available_solvers, default_solver
from .solve.op import ODEOp
from .versions import show_versions

__all__ = [
    "Block",
    "Elementwise",
    "BackendWarning",
    "BoundWarning",
    "ConvergenceWarning",
    "IdentifiabilityWarning",
    "ResultFileError",
    "CVODE",
    "LSODA",
    "DataError",
    "Experiment",
    "FitJob",
    "FitResult",
    "GradientMatchingDensity",
    "GradientMatchingStep",
    "GradientMatchingTarget",
    "Integrator",
    "LeastSquaresProblem",
    "LogScale",
    "ModelDefinitionError",
    "ModelSpec",
    "ODEOp",
    "ODESolveError",
    "ODESystem",
    "Observations",
    "PgpgmError",
    "Priors",
    "Refinement",
    "SamplingError",
    "SksundaeCVODE",
    "Solver",
    "available_models",
    "available_solvers",
    "build_model",
    "build_ode_model",
    "default_solver",
    "fit",
    "fit_many",
    "gradient_matching_density",
    "jobs_from_folder",
    "jobs_from_tidy_csv",
    "load_model",
    "log_transform",
    "datasets",
    "load_result",
    "product_jobs",
    "refine",
    "sample",
    "sample_posterior",
    "sensitivity_index",
    "show_versions",
    "simulate",
]

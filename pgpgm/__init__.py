"""pgpgm: parameter inference for partially observed nonlinear ODE systems.

The pipeline, in the order of the package layout: ``ode`` (model definition) ->
``solve`` (ODE solvers, the PyTensor Op) -> ``gp`` (step 1) -> ``density`` (step 2a) ->
``sampling`` (step 2b) -> ``refine`` (step 3) -> ``posterior`` (step 4) -> ``pipeline``
(:func:`fit`) -> ``result``; ``batch`` runs many fits on dask.

The public API below is loaded on first use (SPEC 1, ``lazy_loader``): ``import pgpgm`` and
``pgpgm --help`` do not import PyMC, ArviZ and SymPy (~3 s); the first ``pgpgm.fit`` (or any
name below) does. Set ``EAGER_IMPORT=1`` to import everything at ``import pgpgm``.
"""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submodules=["batch", "codegen", "data", "datasets", "errors", "gp", "matching", "ode", "pipeline", "posterior",
                "priors", "refinement", "result", "sensitivity", "solve", "spec", "stopping"],
    submod_attrs={
        "batch": ["FitJob", "fit_many", "jobs_from_folder", "jobs_from_tidy_csv", "product_jobs"],
        "data": ["Observations"],
        "matching": ["Block", "Elementwise", "GradientMatchingStep", "GradientMatchingTarget", "MatchingRun", "run_chains",
                     "sample"],
        "matching.density": ["GradientMatchingDensity", "build_model", "gradient_matching_density"],
        "errors": ["BackendWarning", "BoundWarning", "ConvergenceWarning", "DataError", "IdentifiabilityWarning",
                   "ModelDefinitionError", "ODESolveError", "PgpgmError", "ResultFileError", "SamplingError"],
        "ode.system": ["ODESystem"],
        "ode.transform": ["LogScale", "log_transform"],
        "pipeline": ["Laplace", "NUTS", "fit"],
        "posterior": ["PosteriorBudget", "build_ode_model", "sample_posterior"],
        "priors": ["Priors"],
        "refinement": ["LeastSquaresProblem", "Refinement", "refine"],
        "result": ["FitResult", "load_result"],
        "sensitivity": ["sensitivity_index"],
        "simulate": ["simulate"],
        "spec": ["Experiment", "ModelSpec", "available_models", "load_model"],
        "stopping": ["RefinedAgreement"],
        "solve": ["CVODE", "LSODA", "Integrator", "SksundaeCVODE", "Solver", "available_solvers", "default_solver"],
        "solve.op": ["ODEOp"],
        "versions": ["show_versions"],
    },
)

"""pgpgm: parameter inference for partially observed nonlinear ODE systems.

The package reads as the pipeline, each layer importing only the ones above it in this list
(``tests/test_layout.py`` checks it):

- ``errors``, ``checks`` (input checks), ``progress``, ``processes`` - leaves;
- ``codegen/`` - sympy to numba source, templates specialised per model, the disk cache;
- ``ode/`` - the model: equation language, :class:`ODESystem`, its compiled kernels, log transforms;
- ``solve/`` - solver objects (one module per backend), the :class:`Integrator`, the PyTensor Op;
- ``data``, ``priors``, ``noise``, ``observables`` - measurements, prior specifications, noise models,
  measured functions of the states (:class:`Observables`);
- ``gp/`` - step 1, a Gaussian process per observed state;
- ``matching/`` - step 2, the gradient-matching density and its sampler (:func:`sample`);
- ``refinement/`` - step 3, least squares of the ODE solution (:func:`refine`), bound checks;
- ``posterior/`` - step 4, NUTS on the ODE model within a budget, diagnostics;
- ``stopping`` - step 2's default stop rule, which runs step 3's refinement;
- the application: ``plots``, ``result``, ``logscale``, ``simulate``, ``spec`` (model files),
  ``pipeline`` (:func:`fit`, a composition of the steps), ``study`` (many experiments in one fit,
  hierarchical parameters: :func:`fit_study`), ``petab`` (PEtab problems: :func:`load_petab`),
  ``batch`` (many fits), ``cli``.

The public API below is loaded on first use (SPEC 1, ``lazy_loader``): ``import pgpgm`` and
``pgpgm --help`` do not import PyMC, ArviZ and SymPy (~3 s); the first ``pgpgm.fit`` (or any
name below) does. Set ``EAGER_IMPORT=1`` to import everything at ``import pgpgm``.
"""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submodules=["batch", "codegen", "data", "datasets", "errors", "gp", "matching", "observables", "ode", "petab",
                "pipeline", "posterior", "priors", "refinement", "result", "sensitivity", "solve", "spec", "stopping", "study"],
    submod_attrs={
        "batch": ["FitJob", "fit_many", "jobs_from_folder", "jobs_from_tidy_csv", "product_jobs"],
        "data": ["Observations"],
        "matching": ["Block", "Elementwise", "GradientMatchingStep", "GradientMatchingTarget", "MatchingRun", "run_chains",
                     "sample"],
        "matching.density": ["GradientMatchingDensity", "build_model", "gradient_matching_density"],
        "errors": ["BackendWarning", "BoundWarning", "CompetingOptimaWarning", "ConvergenceWarning", "DataError",
                   "IdentifiabilityWarning",
                   "ModelDefinitionError", "ODESolveError", "PgpgmError", "PrecisionWarning", "ResultFileError",
                   "SamplingError"],
        "ode.system": ["ODESystem"],
        "ode.transform": ["LogScale", "log_transform"],
        "petab": ["PetabProblem", "load_petab"],
        "pipeline": ["Laplace", "NUTS", "fit"],
        "posterior": ["PosteriorBudget", "build_ode_model", "sample_posterior"],
        "priors": ["Priors"],
        "observables": ["Observables"],
        "refinement": ["LeastSquaresProblem", "ObservablesProblem", "Refinement", "refine"],
        "result": ["FitResult", "load_result"],
        "sensitivity": ["sensitivity_index"],
        "simulate": ["simulate"],
        "spec": ["Experiment", "ModelSpec", "available_models", "load_model"],
        "stopping": ["RefinedAgreement"],
        "study": ["Study", "StudyExperiment", "StudyResult", "fit_study", "load_study"],
        "solve": ["CVODE", "DOPRI5", "LSODA", "Integrator", "SksundaeCVODE", "Solver", "available_solvers",
                  "default_solver"],
        "solve.op": ["ODEOp"],
        "versions": ["show_versions"],
    },
)

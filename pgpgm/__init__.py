"""pgpgm: parameter inference for partially observed nonlinear ODE systems.

The package reads as the pipeline, each layer importing only the ones above it in this list
(``tests/test_layout.py`` checks it):

- ``errors``, ``checks`` (input checks), ``progress``, ``processes`` - leaves;
- ``codegen/`` - sympy to numba source, templates specialised per model, the disk cache;
- ``ode/`` - the model: equation language, :class:`ODESystem`, its compiled functions, log transforms;
- ``solve/`` - solver objects (one module per backend), the :class:`Integrator`, the PyTensor Op;
- ``data``, ``priors``, ``noise``, ``observables`` - measurements, prior specifications, noise models,
  measured functions of the states (:class:`Observables`);
- ``petab/`` - problems written by others: PEtab's SBML and tables (:func:`load_petab`);
- ``refinement/`` - least squares of the ODE solution (:func:`refine`): step 3, and step 2's stop rule's tool;
- ``gp/`` - step 1, a Gaussian process per observed state;
- ``matching/`` - step 2, the gradient-matching density, its sampler (:func:`sample`) and stop rules;
- ``posterior/`` - step 4, NUTS on the ODE model within a budget, diagnostics;
- ``plots``, ``fit_result``, ``petab_result``, ``logscale``, ``simulate``, ``spec`` (model files), ``datasets``;
- ``study/`` (many experiments: design, joint least squares, joint model), ``study_result``;
- ``steps/`` - the steps of a fit (options, prepare, match, refine, posterior, report);
- ``fitting`` - :func:`fit`, :func:`fit_study` and :func:`fit_petab`, compositions of the steps;
- ``batch`` (many fits), ``versions``, ``cli``.

The package map, docs/architecture.md, draws the tree.

The public API below is loaded on first use (SPEC 1, ``lazy_loader``): ``import pgpgm`` and
``pgpgm --help`` do not import PyMC, ArviZ and SymPy (~3 s); the first ``pgpgm.fit`` (or any
name below) does. Set ``EAGER_IMPORT=1`` to import everything at ``import pgpgm``.
"""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submodules=["batch", "codegen", "data", "datasets", "errors", "fit_result", "fitting", "gp", "matching", "noise", "observables",
                "ode", "petab", "petab_result", "posterior", "priors", "refinement", "sensitivity", "solve", "spec", "steps", "study",
                "study_result"],
    submod_attrs={
        "batch": ["FitJob", "fit_many", "jobs_from_folder", "jobs_from_tidy_csv", "product_jobs"],
        "data": ["Observations"],
        "matching": ["Block", "Elementwise", "GradientMatchingStep", "GradientMatchingTarget", "MatchingRun", "run_chains",
                     "sample"],
        "matching.density": ["GradientMatchingDensity", "build_model", "gradient_matching_density"],
        "errors": ["BackendWarning", "BoundWarning", "CompetingOptimaWarning", "ConvergenceWarning", "DataError",
                   "IdentifiabilityWarning",
                   "ModelDefinitionError", "ODESolveError", "PgpgmError", "PrecisionWarning", "ResultFileError",
                   "SamplingError", "StartError", "UnknownNameError", "LaplaceError", "MissingFileError"],
        "ode.system": ["ODESystem"],
        "ode.transform": ["LogScale", "log_transform"],
        "fitting": ["fit", "fit_petab", "fit_study"],
        "steps.options": ["Laplace", "NUTS"],
        "petab": ["PetabProblem", "load_petab"],
        "posterior": ["PosteriorBudget", "build_ode_model", "sample_posterior"],
        "posterior.calibration": ["calibration_record", "calibration_table"],
        "priors": ["Priors"],
        "observables": ["Observables"],
        "refinement": ["LeastSquaresProblem", "ObservablesProblem", "Refinement", "refine"],
        "refinement.multistart": ["MultiStart"],
        "fit_result": ["FitResult", "load_result"],
        "petab_result": ["PetabResult"],
        "sensitivity": ["sensitivity_index"],
        "simulate": ["simulate"],
        "spec": ["Experiment", "ModelSpec", "available_models", "load_model"],
        "matching.agreement": ["RefinedAgreement"],
        "study": ["Study", "StudyExperiment"],
        "study_result": ["StudyResult", "load_study"],
        "solve": ["CVODE", "DOPRI5", "LSODA", "Integrator", "SksundaeCVODE", "Solver", "available_solvers",
                  "default_solver"],
        "solve.op": ["ODEOp"],
        "versions": ["show_versions"],
    },
)

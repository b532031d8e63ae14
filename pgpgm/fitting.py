"""The entry points, each a composition of the same steps (:mod:`pgpgm.steps`):

- :func:`fit`: options -> prepare -> match (steps 1-2: GPs, gradient-matching chains) -> refine (step 3) ->
  posterior (step 4) -> report (the :class:`~pgpgm.fit_result.FitResult`);
- :func:`fit_study`: options -> prepare the study -> steps 1-3 per experiment (:func:`fit` with step 4 off) ->
  refine the experiments jointly -> the joint model's posterior -> report (the
  :class:`~pgpgm.study_result.StudyResult`).

Each step is a function taking what the steps before it returned (small frozen dataclasses) and the options
validated once (:class:`~pgpgm.steps.options.FitOptions`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .errors import CompetingOptimaWarning, ConvergenceWarning
from .fit_result import FitResult
from .ode.system import ODESystem
from .priors import PriorSpec
from .solve import Solver, default_solver
from .steps.match import match
from .steps.options import (
    NUTS,
    STUDY_BUDGET,
    Laplace,
    fit_options,
    legacy_fit_kwargs,
    posterior_option,
)
from .steps.posterior import posterior_petab, posterior_step, posterior_study
from .steps.prepare import prepare, prepare_petab, prepare_study
from .steps.refine import refine_petab, refine_step, refine_study
from .steps.report import report, report_petab, report_study, warn_competing_experiments
from .study.design import Study
from .petab_result import PetabResult
from .refinement.multistart import MultiStart
from .study_result import StudyResult


# ----------------------------------------------------------------------------- fit
def fit(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
    t0: float | None = None,
    kernel: str = "rbf",
    gamma: float = 0.3,
    priors: Mapping[str, PriorSpec] | PriorSpec | None = None,
    noise_sd: float | Sequence[float] | None = None,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int | None = 0,
    init="spread",
    scheme="block",
    refine_x0: bool = True,
    true_theta=None,
    solver: Solver | None = None,
    posterior: str | NUTS | Laplace | None = "nuts",
    progressbar: bool = True,
    stop="agree",
    noise: str | Mapping[str, str] | None = None,
    transform: Mapping[str, str] | None = None,
    grid=None,
    fixed: Mapping[str, float] | None = None,
    x0_observed: Mapping[str, float] | None = None,
    observables: Mapping[str, str] | None = None,
    **legacy,
) -> FitResult:
    """Infer the parameters and latent states of ``system`` from partial observations.

    Runs the method's three steps (README, "How it works") - GP fit per observed state, ``tune + draws``
    Metropolis-within-Gibbs iterations per chain on the gradient-matching density
    (chains start apart, see ``init`` of :func:`pgpgm.sample`), least-squares refinement
    from the pooled posterior mean and from each chain's mean (or, when ``stop="agree"`` stopped
    the chains, from the best optimum the last check refined them to: the same refinements),
    keeping the lowest cost (bounded by the uniform prior bounds when priors are given as bounds;
    ``result.estimates["nll_per_start"]`` names the starts) - and a fourth:
    the posterior of the ODE model itself (:mod:`pgpgm.posterior`), started at the
    refined optimum.

    ``posterior`` : how step 4 runs, its one argument: a :class:`NUTS` (the default ``"nuts"`` is ``NUTS()``:
    4 chains of 500 tuning and 500 drawn NUTS iterations on the engine ``NUTS.sampler`` chooses, nutpie where
    every value variable is a scalar - every fit of one experiment - else PyMC's rounds, until R-hat <= 1.01, ESS
    >= 400 and no divergences, within ``NUTS.budget``, a :class:`pgpgm.PosteriorBudget`, by default 60 s and
    3000000 gradient evaluations; once it is spent the fit returns the draws it has with a ConvergenceWarning
    saying so; chains that sit in separate modes are named, each with the optimum its mean refines to, instead of
    pooled; see :class:`NUTS` for every setting), a :class:`Laplace` (``"laplace"``: draws from the Gaussian
    approximation at the refined optimum) or None (the gradient-matching chains are the result's posterior). A
    :class:`~pgpgm.posterior.diagnostics.ConvergenceWarning` names every parameter of the main posterior with
    R-hat > 1.01, ESS < 400, and any divergences. The flat keywords of earlier releases (``posterior_draws``,
    ``posterior_tune``, ``posterior_chains``, ``posterior_rounds``, ``posterior_budget``, ``nuts_sampler``,
    ``cores``) still set those fields, with a DeprecationWarning that names the ``NUTS(...)`` to write.

    Parameters are those of :func:`pgpgm.gradient_matching_density` and :func:`pgpgm.sample`;
    ``solver`` (default :func:`pgpgm.default_solver`) does every ODE solve of the fit;
    ``scheme`` is the gradient-matching step's (``"block"``, the paper's ``"elementwise"``, or a
    scheme object such as ``pgpgm.Block(n_moves=8)``); step 2 runs its chains in this process;
    ``stop`` : ``"agree"`` (default) ends step 2 once the best least-squares optimum
    refined from the chains' running means has settled (checked at 100 iterations and every
    50 after; one interval when every chain refines to it, two when they differ; or at an
    early probe at 50 iterations, when every chain and least squares from two points spread over
    the prior box (at most 4 tried) refine to the same optimum, none better; the best is that of
    every check so far, including optima a chain has left since) and fits the
    data as well as the GPs do (residual sd at most twice the noise level of each observed
    state) off the prior box's bounds; while it does not, least squares from points spread
    over the prior box search beside the chains, and such an optimum stops the chains only
    once 20 of those points found nothing better
    (:class:`pgpgm.matching.agreement.RefinedAgreement`: the chains have found the basin);
    ``"never"`` runs the whole budget ``tune + draws`` per chain (the published setting);
    a stop rule object is used as given. When and why step 2 stopped:
    ``result.estimates.attrs["sampling_stop_reason"]``, ``["sampling_iterations"]`` and
    ``result.gradient_matching.attrs["pgpgm_stopping"]`` (JSON, every check).
    ``noise`` : the MEASUREMENT noise model of each observed state (:mod:`pgpgm.noise`): ``"normal"``
    (default), ``"lognormal"`` (log y ~ N(log x, sd^2): y > 0 where measured, the state itself may be 0
    where it is not measured, e.g. a concentration before an oral dose), ``"poisson"``, ``"negbin"``
    (PyMC's NB(mu, alpha)), one name for every state or a mapping observed state -> a name or a
    :mod:`pgpgm.noise` object (its parameter then known, e.g. ``pgpgm.noise.NegativeBinomial(5.0)``).
    Steps 3 and 4 use its likelihood (step 3: the model's residuals - deviance residuals for counts -
    with the chain-rule sensitivity Jacobian, its noise parameter estimated by maximum likelihood
    unless given, ``refinement_nll`` its negative log likelihood; step 4: ``pm.LogNormal``,
    ``pm.Poisson`` or ``pm.NegativeBinomial`` on the measured values, ``sigma_<state>`` /
    ``alpha_<state>`` ~ LogNormal(log start, 2)); steps 1-2 (which only find the basin) fit the GP and
    match gradients on the data as given, with the GP's Gaussian noise. ``noise_sd`` gives the sds
    of normal and lognormal states (lognormal: of log y); ``result.trajectories["noise_sd"]`` holds
    each state's noise parameter (sd; alpha for negbin; 1 for Poisson, which has none), named in its
    ``parameter`` attribute. ``transform`` (mapping state -> ``"log"``) puts a state itself on the log
    scale: see :mod:`pgpgm.logscale` (with normal noise: GP fit and gradient matching only; with
    lognormal noise: every step on the log scale). ``refine_x0`` also refines the observed
    states' initial values (started at their posterior means) in the least-squares step; ``true_theta`` (P,) (or ``data.attrs["theta"]`` from :func:`pgpgm.simulate`) adds
    the ground truth to tables and figures. ``seed=None`` draws a fresh seed; the seed used is
    recorded in ``json.loads(result.gradient_matching.attrs["pgpgm_settings"])["seed"]``.

    ``observables`` (mapping data column -> expression, :mod:`pgpgm.observables`): the data measure
    these functions of the states, e.g. ``{"y_C": "C", "y_total": "A + C", "y_blot": "s * A"}``; names
    that are neither states nor parameters (``s``) are observation parameters, appended to the
    system's parameters (the result's ``system``) with the default prior box unless ``priors`` names
    them. Steps 3-4 fit h(t, x, theta, phi) (chain-rule Jacobian; ``noise``, ``noise_sd`` per
    observable). Steps 1-2 fit a GP to the identity observables (``"y_C": "C"``: C observed) and to
    the observables affine in one state, y = a * P + c with a scale and offset of parameters
    (``"s * A"``, ``"A / s"``, ``"s * A + b"``): the GP is on the measurement y, gradient matching
    works on P = (y_gp - c) / a with dP/dt = (dy_gp/dt) / a (gamma in y's units), and the parameters of
    a and c are sampled with theta (their priors from ``priors`` like theta's; the step-2 chains hold
    them and the GP-smoothed y, named after the observable). Every other state is latent there (``x0``
    as for latent states; ``kernel``/``gamma`` mappings by directly measured state or scaled
    observable). A state measured up to a scale is latent in steps 3-4 (its initial value known
    from ``x0``, or a prior there): step 2 does not use its initial value, so when the equations are
    unchanged by P -> P / s with the parameters rescaled (e.g. Lotka-Volterra's t2 / s), step 2's
    chains lie along that ridge and step 3 pins s from the known initial value. Functions of several
    states, observables not affine in their state or with a scale or offset in t, and a second
    observable of a state with a GP are refused in steps 1-2 and enter at step 3
    (``result.estimates.attrs["observables_in_steps_1_2"]`` says which and why); with none matched,
    steps 1-2 are skipped and step 3 starts from a Latin hypercube over the prior boxes
    (:func:`refine_from_box`). ``result.trajectories["h"]`` (estimate, time_dense, observable) holds
    the fitted observables. ``transform`` is refused with them.

    Data: each observed state may have its own times and missing values (a tidy long
    DataFrame ``time, state, value``, a wide one with NaN, or a simulated Dataset with NaN;
    at least 3 measurements per state). Each state's GP is fitted to its own measurements;
    the density, the refinement's solve and the posterior live on one grid, the union of the
    observation times or ``grid`` (e.g. denser; it must span the data); the observation
    terms (sampling, refinement residuals, posterior likelihood) count measured values only.
    ``kernel`` and ``gamma`` may be mappings observed state -> value.

    ``fixed={"t6": 0.3}`` holds parameters at known values: they are substituted into the
    equations (:meth:`pgpgm.ODESystem.fix`) and take no part in sampling, refinement and the
    posterior; the result keeps every parameter (``estimates["fixed"]`` marks them, with
    standard error 0, and ``parameter_table()`` reports them as fixed). Priors and ``init``
    values given for fixed parameters are ignored.

    Initial values, ``x0``: one entry per state, each held where it is a number and free where it is a prior;
    a mapping state -> value (or a vector (S,), NaN for an observed state whose value is free):

    - a number: known and held at the start ``t0`` in every step that fits (steps 3 and 4; step 2 samples an
      observed state's value at t0 as it does its other values), for latent and observed states alike;
    - ``(lower, upper)`` (a Uniform prior) or a callable ``name -> PyMC variable``, for a latent state: unknown,
      ``<state>_0`` a free variable: sampled with the parameters in step 2, refined by least squares with a
      standard error (``estimates["x0_stderr"]``; held inside a Uniform prior's box, and a
      :class:`~pgpgm.errors.BoundWarning` says where the data would put it outside), free in the step-4 model;
    - an observed state left out: estimated (refined in step 3 with ``refine_x0``, free in step 4 with a Normal
      prior about its first measurement), as a latent state needs a number or a prior.

    ``x0=None`` with a Dataset of :func:`pgpgm.simulate` takes the latent states' values from its attributes.
    ``result.x0`` gives the refined initial value of every state. ``x0_observed`` (earlier releases' argument
    for the observed states' known values) still holds them, with a DeprecationWarning: write them in ``x0``.

    ``t0``: the time the initial values hold at, before or at the first measurement (default: the first
    measured time, which a :class:`~pgpgm.errors.StartTimeWarning` names when ``x0`` gives known values and it
    is not 0): an oral dose at t = 0 whose first sample is taken at 0.25 h is ``x0={"A": dose}, t0=0.0``. The
    fit's grid (``grid`` or the measurement times) gains ``t0`` as its first point.

    A refined estimate on a bound of its Uniform prior within its own uncertainty (2 standard
    errors), or a posterior (step 4's or the Laplace draws, not step 2's chains) with more than 10 %
    of its draws within half their sd (at most 1 % of the box width) of a bound, gives a
    :class:`~pgpgm.errors.BoundWarning` naming the parameter and the bound, with a hint to
    widen the prior; ``result.at_bounds`` and the ``at_bound`` column of
    ``result.parameter_table()`` record it (:mod:`pgpgm.refinement.bounds`).

    Raises
    ------
    DataError
        before any computation, for unusable data (see :func:`pgpgm.data.as_observations`),
        ``x0``, ``noise_sd``, ``gamma``, ``priors``, ``kernel``, ``true_theta``, or counts
        (``draws``, ``tune``, ``chains``, ``seed``, ``posterior_*``) that are not whole numbers
        in range.
    ODESolveError
        when every refinement start fails.
    SamplingError
        when no chain start that ``init`` chooses has a finite density.
    """
    timings, started = {}, time.perf_counter()
    options = fit_options(kernel=kernel, gamma=gamma, priors=priors, noise_sd=noise_sd, draws=draws, tune=tune,
                          chains=chains, seed=seed, init=init, scheme=scheme, refine_x0=refine_x0, solver=solver,
                          posterior=posterior_option(posterior, legacy), progressbar=progressbar, stop=stop, grid=grid)
    if x0_observed is not None:
        warnings.warn(f"x0_observed is deprecated and will be removed: give the observed states' known initial "
                      f"values in x0 (x0={{..., {', '.join(f'{k!r}: {v!r}' for k, v in dict(x0_observed).items())}}})",
                      DeprecationWarning, stacklevel=2)
    prepared = prepare(system, data, observed, options, x0=x0, t0=t0, noise=noise, transform=transform, fixed=fixed,
                       true_theta=true_theta, x0_observed=x0_observed, observables=observables)
    matched = match(prepared, options, timings, started)  # steps 1-2 (None: no state measured directly)
    refined = refine_step(prepared, matched, options, timings)  # step 3
    post = posterior_step(prepared, matched, refined, options, timings)  # step 4
    if post.stand_in:  # step 4 could not start (warned): reported as the fit with posterior=None
        options = replace(options, posterior=None)
    return report(prepared, matched, refined, post, options, timings, started)



def fit_study(system: ODESystem, study: Study, *, varying: Sequence[str] = (), hierarchical: Mapping[str, str] | None = None,
              population_priors: Mapping[str, Any] | None = None, centred: bool = False,
              noise: str | Mapping[str, Any] | None = None, noise_per_experiment: bool | Sequence[str] = False,
              priors=None, noise_sd: float | Mapping[str, float] | None = None, kernel="rbf", gamma=0.3,
              draws: int = 2000, tune: int = 1500, chains: int = 2, seed: int | None = 0, init="spread",
              scheme="block", refine_x0: bool = True, solver: Solver | None = None,
              posterior: str | NUTS | None = "nuts", progressbar: bool = False, stop="agree", grid=None,
              fit_kwargs: Mapping[str, Any] | None = None, **legacy) -> StudyResult:
    """Fit every experiment of ``study`` together: steps 1-3 per experiment (:func:`fit` with step 4 off, its
    known inputs given: each finds its experiment's basin), each experiment refined alone with every known
    input held, step 3 jointly (:mod:`pgpgm.study.joint`: shared parameters once, ``varying`` and
    ``hierarchical`` ones per experiment, one noise parameter per observed state shared by the experiments
    unless ``noise_per_experiment``), step 4 NUTS on one joint ``pm.Model`` (``result.model``,
    :func:`pgpgm.study.build_study_model`). Options are :func:`fit`'s, with the same meaning; ``posterior``:
    ``"nuts"`` (``NUTS(budget=PosteriorBudget(300, None))``), a :class:`NUTS` or None.

    ``varying``: parameters with an unknown value per experiment; ``hierarchical``: parameter ->
    ``"lognormal"`` (log p[e] = mu_p + sigma_p z_p[e], ``centred=True``: log p[e] ~ Normal(mu_p, sigma_p));
    ``population_priors``: name -> PyMC variable for ``mu_<p>`` / ``sigma_<p>`` (default Normal(0, 3),
    HalfNormal(1)); ``noise_sd``: one number or one per observed state; ``fit_kwargs`` (deprecated): more of
    :func:`fit`'s options. See docs/studies.md. Returns a :class:`~pgpgm.study_result.StudyResult`.

    Raises DataError before any computation for a study that is not a :class:`Study`, unusable data, unknown
    names in ``varying``, ``hierarchical``, ``noise`` or ``noise_per_experiment``, or bad options.
    """
    timings, started = {}, time.perf_counter()
    fit_kwargs = dict(fit_kwargs or {})
    options = fit_options(**{**dict(kernel=kernel, gamma=gamma, priors=priors, noise_sd=noise_sd, draws=draws,
                                    tune=tune, chains=chains, seed=seed, init=init, scheme=scheme, refine_x0=refine_x0,
                                    solver=solver, progressbar=progressbar, stop=stop, grid=grid),
                             **legacy_fit_kwargs(fit_kwargs)},
                          posterior=posterior_option(posterior, legacy, who="fit_study", laplace=False,
                                                     default=NUTS(budget=STUDY_BUDGET)))
    design = prepare_study(system, study, options, varying=varying, hierarchical=hierarchical, noise=noise,
                           population_priors=population_priors, centred=centred,
                           noise_per_experiment=noise_per_experiment)
    with warnings.catch_warnings():  # step 2's chains stop early by design: only the basin matters here
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", CompetingOptimaWarning)  # one warning for the study, below
        fits = tuple(fit(system, e.data, study.observed, x0=dict(e.x0), t0=e.t0, fixed=dict(e.fixed) or None,
                         **{**options.keywords(), "posterior": None, "noise": design.experiment_noise(j)[0],
                            "noise_sd": design.experiment_noise(j)[1], "solver": options.solver or default_solver()})
                     for j, e in enumerate(study.experiments))
    timings["steps 1-2"] = time.perf_counter() - started
    warn_competing_experiments(study.names, fits)
    refined = refine_study(design, fits, options, timings)
    timings["steps 1-3"] = time.perf_counter() - started
    post = posterior_study(design, refined, options, timings) if options.posterior is not None else None
    timings["total"] = time.perf_counter() - started
    return report_study(design, fits, refined, post, options, timings)


def fit_petab(problem, *, search: MultiStart | None = None, posterior: str | NUTS | Laplace | None = "nuts",
              seed: int | None = 0, progressbar: bool = True) -> PetabResult:
    """Fit a PEtab problem (:func:`load_petab`'s :class:`~pgpgm.petab.PetabProblem`, or its YAML file's path):
    step 3's search over the estimated parameters' bounds on their scales - local fits from starts spread over
    the box (scrambled Sobol, seeded by ``seed``), least squares where every noise is normal, until ``search.agree``
    starts reach the best (:class:`~pgpgm.refinement.multistart.MultiStart`, default ``MultiStart()``; a failed
    start is discarded and counted) - and step 4 on the posterior (``posterior``: ``"nuts"`` / :class:`NUTS`,
    ``"laplace"`` / :class:`Laplace`, or None), as :func:`fit` runs them. Steps 1-2 (GPs on directly measured
    states) do not run: PEtab's observables are functions of the states on their own scales.

    Returns a :class:`~pgpgm.petab_result.PetabResult`: ``nll`` (PEtab's), ``petab_parameters`` (estimated ids ->
    linear values), ``parameter_table()``, ``plot()``, ``to_petab(folder)``, step 4's ``posterior`` on the
    parameters' scales. See docs/petab.md.
    """
    timings, started = {}, time.perf_counter()
    options = fit_options(seed=seed, progressbar=progressbar, posterior=posterior_option(posterior, {}, who="fit_petab"))
    design = prepare_petab(problem, options, MultiStart() if search is None else search)
    refined = refine_petab(design, options, timings)  # step 3
    post = posterior_petab(design, refined, options, timings)  # step 4
    return report_petab(design, refined, post, options, timings, started)

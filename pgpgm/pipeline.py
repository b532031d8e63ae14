"""The whole method as a composition of its steps: ``fit`` = prepare -> GPs (step 1) ->
gradient-matching chains (step 2) -> least-squares refinement (step 3) -> the ODE model's
posterior (step 4) -> the result (:func:`pgpgm.result.assemble`).

Each step is a function taking what the steps before it returned (small frozen dataclasses) and
the validated options (:class:`FitOptions`, :class:`NUTS`, :class:`Laplace`).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xarray as xr

from .checks import as_float_array, check_count, check_gamma, noise_levels
from .data import Observations, as_observations, initial_value_priors, initial_values
from .errors import BoundWarning, CompetingOptimaWarning, DataError, IdentifiabilityWarning, ODESolveError
from .gp import GPFit
from .gp.kernels import KERNELS
from .logscale import MeasurementNoise, Problem, Scales, measurement_noise, plan_scales
from .matching import MatchingRun, get_scheme, run_chains
from .matching.density import (
    GradientMatchingDensity,
    fit_gps,
    gradient_matching_density,
    per_state,
)
from .observables import Observables, ScaledState
from .ode.system import ODESystem
from .posterior.diagnostics import (
    ESS_MIN,
    SD_ERROR,
    causes_of_poor_mixing,
    check_ess,
    check_sd_error,
    diagnose,
    mixing_problems,
    warn_if_unconverged,
)
from .posterior.nuts import (
    MAX_ROUNDS,
    METRICS,
    NUTS_SAMPLERS,
    POSTERIOR_RTOL,
    NUTSRun,
    PosteriorBudget,
    build_ode_model,
    initial_value_name,
    laplace_posterior,
    log_scale_names,
    positive_initial_values,
    posterior_notes,
    run_nuts,
    warn_if_imprecise,
)
from .posterior.scales import choose_scales
from .priors import Priors, PriorSpec
from .refinement import LeastSquaresProblem, ObservablesProblem, Refinement, refine
from .refinement.bounds import bound_report, outside_prior_boxes, warn_at_bounds
from .refinement.optima import (CompetingOptimum, competing_optima, describe, outside_boxes, refine_from_loose_bounds,
                                refine_inside_boxes)
from .result import FitResult, assemble
from .solve import CVODE, DOPRI5, Integrator, Solver
from .stopping import RefinedAgreement

_DENSE = 400  # points of the plotted trajectories


#: most steps between two output times of step 4's explicit solves (:class:`NUTS` ``solver="auto"``) before
#: CVODE redoes the solve: a non-stiff stretch takes tens of Dormand-Prince steps, a stiff one thousands
EXPLICIT_STEPS = 1000


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class NUTS:
    """Step 4 by NUTS on the ODE model (:func:`pgpgm.posterior.nuts.run_nuts`).

    draws, tune, chains : per chain; rounds : most NUTS rounds while R-hat, ESS or divergences
    fail; budget : a :class:`PosteriorBudget`, seconds, or None (no limit); sampler : ``"auto"``
    (default: nutpie where every value variable is a scalar, else PyMC), ``"nutpie"`` or ``"pymc"``;
    cores : processes (default: one per chain, at most the CPUs); metric : the first
    round's mass matrix, ``"adapt"`` or ``"laplace"`` (see :func:`pgpgm.posterior.nuts.run_nuts`);
    rtol : the relative tolerance of step 4's ODE solves (default
    :data:`~pgpgm.posterior.nuts.POSTERIOR_RTOL`, 1e-6: 1.4-2x cheaper gradients than the solver's
    1e-8, errors far below a posterior sd; None: the fit's solver's); solver : step 4's ODE solver,
    ``"auto"`` (default: where the fit's solver is :class:`~pgpgm.solve.cvode.CVODE`, the explicit
    :class:`~pgpgm.solve.dopri5.DOPRI5` at its tolerances with :data:`EXPLICIT_STEPS` steps between two
    output times and its stiffness test, the CVODE redoing any solve it gives up - a stiff stretch -
    and CVODE alone where DOPRI5 gives up at the refined point, :meth:`solver_at`; 2-4x cheaper gradients on the shipped
    models, ``benchmarks/RESULTS.md``), ``"fit"`` (the fit's solver) or a solver object; ess : the bulk and tail
    ESS every variable must reach (default 400, :data:`~pgpgm.posterior.diagnostics.ESS_MIN`; the sampling goes on
    until it does, within the budget): an sd's Monte Carlo error is ~sd / sqrt(2 ESS) for a Gaussian posterior
    and more with heavy tails (~10 % at ESS 400 on Lotka-Volterra x1 observed with x2(0) unknown, kurtosis 14);
    ask for more (with a budget to match) where the sds must be sharper; sd_error : once R-hat and ESS pass,
    the chains go on while some variable's sd has a Monte Carlo error above this fraction of the sd and 3/4 of
    the budget affords it (default 5 %, :data:`~pgpgm.posterior.diagnostics.SD_ERROR`: heavy-tailed posteriors
    draw 2-8x more, Gaussian ones nothing; None: stop where R-hat and ESS pass; the errors reached are in
    ``result.diagnostics["sd_error"]``).
    """

    draws: int = 500
    tune: int = 500
    chains: int = 4
    rounds: int = MAX_ROUNDS
    budget: PosteriorBudget | float | None = PosteriorBudget()
    sampler: str = "auto"
    cores: int | None = None
    metric: str = "adapt"
    rtol: float | None = POSTERIOR_RTOL
    solver: str | Solver = "auto"
    ess: float = ESS_MIN
    sd_error: float | None = SD_ERROR

    def solver_for(self, solver: Solver) -> Solver:
        """Step 4's solver given the fit's ``solver``: :attr:`solver` (see the class), at :attr:`rtol` (the
        solver's own when rtol is None)."""
        if isinstance(self.solver, Solver):
            solver = self.solver
        at = solver if self.rtol is None else replace(solver, rtol=float(self.rtol))
        if self.solver == "auto" and isinstance(solver, CVODE):
            return DOPRI5(rtol=at.rtol, atol=at.atol, max_steps=EXPLICIT_STEPS, fallback=at, stiffness=True)
        return at

    def solver_at(self, solver: Solver, system: ODESystem, times: np.ndarray, theta, x0) -> Solver:
        """:meth:`solver_for`, and where that is DOPRI5 with a fallback, the fallback instead when DOPRI5
        gives up the solve with sensitivities at the refined point ``theta`` (P,), ``x0`` (S,) on
        ``times`` (N,): a system stiff at its optimum would have every gradient begin with a wasted
        explicit attempt."""
        chosen = self.solver_for(solver)
        if not (isinstance(chosen, DOPRI5) and chosen.fallback is not None):
            return chosen
        try:
            Integrator(system, times, replace(chosen, fallback=None)).solve_sensitivities(theta, x0)
        except ODESolveError:
            return chosen.fallback
        return chosen

    def __post_init__(self):
        set_ = object.__setattr__
        if not (isinstance(self.solver, Solver) or self.solver in ("auto", "fit")):
            raise DataError(f"NUTS solver must be 'auto', 'fit' or a solver object such as pgpgm.CVODE(), got "
                            f"{self.solver!r}")
        if self.rtol is not None and not (isinstance(self.rtol, (int, float)) and 0 < self.rtol < 1):
            raise DataError(f"NUTS rtol must be a number in (0, 1) or None (the fit's solver's), got {self.rtol!r}")
        if self.metric not in METRICS:
            raise DataError(f"NUTS metric must be one of {METRICS}, got {self.metric!r}")
        set_(self, "draws", check_count(self.draws, "posterior_draws", minimum=1))
        set_(self, "tune", check_count(self.tune, "posterior_tune", minimum=0))
        set_(self, "chains", check_count(self.chains, "posterior_chains", minimum=1))
        set_(self, "rounds", check_count(self.rounds, "posterior_rounds", minimum=1))
        set_(self, "ess", check_ess(self.ess, "NUTS ess"))
        set_(self, "sd_error", check_sd_error(self.sd_error, "NUTS sd_error"))
        set_(self, "budget", PosteriorBudget.of(self.budget))
        if self.sampler not in NUTS_SAMPLERS:
            raise DataError(f"nuts_sampler must be one of {NUTS_SAMPLERS}, got {self.sampler!r}")
        if self.cores is not None:
            set_(self, "cores", check_count(self.cores, "cores", minimum=1))


@dataclass(frozen=True)
class Laplace:
    """Step 4 by the Gaussian approximation at the refined optimum: ``draws`` draws in all."""

    draws: int = 2000

    def __post_init__(self):
        object.__setattr__(self, "draws", check_count(self.draws, "posterior_draws", minimum=1))


@dataclass(frozen=True)
class FitOptions:
    """Every option of :func:`fit` but the data, validated (see :func:`fit` for their meaning)."""

    kernel: Any
    gamma: Any
    priors: Any
    noise_sd: Any
    draws: int
    tune: int
    chains: int
    seed: int
    init: Any
    scheme: Any
    refine_x0: bool
    solver: Solver | None
    posterior: NUTS | Laplace | None
    progressbar: bool
    stop: Any
    grid: Any


# ----------------------------------------------------------------------------- step results
@dataclass(frozen=True, eq=False)
class Prepared:
    """The problem a fit solves: ``full`` the system as given; ``system``, ``data``, ``obs``, ``x0`` those
    of the likelihood (fixed parameters substituted, lognormal states on the log scale); ``matching``
    the problem of steps 1-2 (the data as given or on the log scale); ``scales`` the log-scale plan
    (None: none); ``fixed`` the fixed parameters' values; ``priors`` and ``init`` without them;
    ``noise`` the measurement noise models of steps 3-4 (None: Gaussian throughout); with observables
    (``observables``, of the fitted system; ``observables_full`` of the full one; ``likelihood_priors``
    the priors of theta and phi) ``matching`` is None when no state is measured directly (steps 1-2
    skipped, :func:`refine_from_box`); ``scaled`` the observables affine in one state whose GP is on
    the measurement in steps 1-2 (:class:`~pgpgm.observables.ScaledState`; ``matching.system`` then
    has the measurement in the state's place, :meth:`~pgpgm.observables.Observables.matching_system`)."""

    full: ODESystem
    system: ODESystem
    data: Any
    obs: Observations
    x0: Any
    matching: Problem
    scales: Scales | None
    fixed: dict[str, float]
    priors: Any
    init: Any
    kernel: Any
    gamma: Any
    true_theta: Any
    noise: MeasurementNoise | None = None
    x0_observed: dict[str, float] | None = None
    observables: Observables | None = None
    observables_full: Observables | None = None
    likelihood_priors: Priors | None = None
    scaled: tuple[ScaledState, ...] = ()

    @property
    def direct(self) -> tuple[str, ...]:
        """The states measured directly (the observed states; with observables, those of the identity
        observables, in the data's order)."""
        if self.observables is None:
            return tuple(self.obs.states)
        ident = self.observables.identity
        return tuple(ident[n] for n in self.obs.states if n in ident)

    @property
    def on_log_for_matching(self) -> bool:
        """Whether steps 1-2 work on another scale than the likelihood (``transform="log"``)."""
        return self.scales is not None and self.matching is not self.scales.likelihood


@dataclass(frozen=True, eq=False)
class Matched:
    """Steps 1-2: the GP fits, the gradient-matching density, the chains' run, the integrators, and
    whether the stop rule is fit's own (its checks refined step 3's problem)."""

    gps: tuple[GPFit, ...]
    density: GradientMatchingDensity
    run: MatchingRun
    integrator: Integrator
    matching_integrator: Integrator
    own_rule: bool
    n_solves: int


@dataclass(frozen=True, eq=False)
class Refined:
    """Step 3: the best refinement ``best`` of those from every start (``starts`` name -> (Q,)), the
    chains' pooled means (``theta_sampled`` (P,), ``x0_sampled`` (S,)), the least-squares problem,
    the GPs' noise sds carried to the likelihood's scale (``noise_start`` (M,)), the latent states
    with unknown initial values, and the optima that compete with the best (``competing``)."""

    best: Refinement
    refinements: tuple[Refinement, ...]
    starts: dict[str, np.ndarray]
    problem: LeastSquaresProblem
    theta_sampled: np.ndarray
    x0_sampled: np.ndarray
    noise_start: np.ndarray
    unknown: tuple[str, ...]
    priors: Priors | None = None
    x0_priors: dict | None = None
    competing: tuple[CompetingOptimum, ...] = ()


@dataclass(frozen=True, eq=False)
class Posterior:
    """Step 4: the main posterior tree (NUTS, Laplace, or step 2's chains), the NUTS run (None
    otherwise), the free variables of the model, and the gradient evaluations it took."""

    tree: Any
    nuts: NUTSRun | None
    free: tuple[str, ...]
    solves: int


# ----------------------------------------------------------------------------- fit
def fit(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
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
    posterior_draws: int = 500,
    posterior_tune: int = 500,
    posterior_chains: int = 4,
    posterior_rounds: int = MAX_ROUNDS,
    posterior_budget: PosteriorBudget | float | None = PosteriorBudget(),
    nuts_sampler: str = "auto",
    cores: int | None = None,
    progressbar: bool = True,
    stop="agree",
    noise: str | Mapping[str, str] | None = None,
    transform: Mapping[str, str] | None = None,
    grid=None,
    fixed: Mapping[str, float] | None = None,
    x0_observed: Mapping[str, float] | None = None,
    observables: Mapping[str, str] | None = None,
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

    ``posterior`` : a :class:`NUTS` or :class:`Laplace` object, or None; the names ``"nuts"``
    (default) and ``"laplace"`` build one from the flat ``posterior_*`` arguments. ``"nuts"``:
    ``posterior_chains`` chains of ``posterior_tune``
    + ``posterior_draws`` NUTS iterations, in parallel, with ``nuts_sampler`` ``"auto"`` (default:
    nutpie where every value variable is a scalar - every fit of one experiment - else PyMC,
    :func:`pgpgm.posterior.nuts.auto_sampler`), ``"nutpie"`` (chains as threads, whitened by the Laplace
    approximation, with nutpie's low-rank adaptation) or ``"pymc"`` (chains as processes, ``cores``);
    with ``"pymc"``, up to ``posterior_rounds``
    rounds while the draws fail R-hat <= 1.01, ESS >= 400 or have divergences, see
    :func:`pgpgm.posterior.nuts.sample_posterior`'s ``max_rounds``; with ``"nutpie"`` one run that ends
    when R-hat and ESS pass (up to ``posterior_draws * 2 ** (posterior_rounds - 1)`` draws per chain);
    all rounds within ``posterior_budget``:
    a :class:`pgpgm.PosteriorBudget`, default 60 s and 3000000 gradient evaluations, a number of
    seconds, or None for no limit; once it is spent the fit returns the draws it has with a
    ConvergenceWarning saying so; chains that sit in separate modes are named, each with the optimum
    its mean refines to, instead of pooled), ``"laplace"`` (draws from the Gaussian
    approximation at the refined optimum) or None (the gradient-matching chains are the
    result's posterior). A :class:`~pgpgm.posterior.diagnostics.ConvergenceWarning` names every
    parameter of the main posterior with R-hat > 1.01, ESS < 400, and any divergences.

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
    (:class:`pgpgm.stopping.RefinedAgreement`: the chains have found the basin);
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
    lognormal noise: every step on the log scale, the path ``noise="lognormal"`` alone took before
    issue 31). ``x0_observed={"C": 0.0}`` holds known initial values of observed states fixed in
    steps 3 and 4 (step 2 still samples the state's value at the first time as a start). ``refine_x0`` also refines the observed
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
    the fitted observables. ``transform`` and ``x0_observed`` are refused with them.

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

    Unknown initial values: ``x0={"H": (0, 50)}`` (a Uniform prior) or ``x0={"H": callable}``
    for a latent state makes ``H_0`` a free variable: sampled with the parameters in step 2,
    refined by least squares with a standard error (``estimates["x0_stderr"]``; the Jacobian
    from the sensitivity solve; free there, so a value outside a Uniform prior's box is named in a
    :class:`~pgpgm.errors.BoundWarning`), free in the step-4 model. ``result.x0`` gives the refined
    initial value of every state. Known initial values keep the fast path.

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
    timings, t0 = {}, time.perf_counter()
    options = fit_options(kernel=kernel, gamma=gamma, priors=priors, noise_sd=noise_sd, draws=draws, tune=tune,
                          chains=chains, seed=seed, init=init, scheme=scheme, refine_x0=refine_x0, solver=solver,
                          posterior=posterior, posterior_draws=posterior_draws, posterior_tune=posterior_tune,
                          posterior_chains=posterior_chains, posterior_rounds=posterior_rounds,
                          posterior_budget=posterior_budget, nuts_sampler=nuts_sampler, cores=cores,
                          progressbar=progressbar, stop=stop, grid=grid)
    if observables is not None:  # measured functions of the states (pgpgm.observables)
        prepared = prepare_observables(system, data, observed, options, observables=observables, x0=x0, noise=noise,
                                       transform=transform, fixed=fixed, true_theta=true_theta,
                                       x0_observed=x0_observed)
    else:
        prepared = prepare(system, data, observed, options, x0=x0, noise=noise, transform=transform, fixed=fixed,
                           true_theta=true_theta, x0_observed=x0_observed)
    t2 = time.perf_counter()
    if prepared.matching is None:  # observables only, no state measured directly: no steps 1-2
        matched = None
        refined = refine_from_box(prepared, options)  # step 3 from starts spread over the prior box
    else:
        matched = match(prepared, options, timings, t0)  # steps 1-2
        t2 = time.perf_counter()
        refined = refine_step(prepared, matched, options)  # step 3
    timings["refinement"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    post = posterior_step(prepared, matched, refined, options)  # step 4
    timings["posterior"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    result = report(prepared, matched, refined, post, options, timings)
    if prepared.observables is not None:
        _add_observables(result, prepared, refined)
    if prepared.noise is not None:  # which likelihood, and what noise_sd holds per state
        plan = prepared.noise
        result.estimates.attrs["noise"] = json.dumps(dict(zip(prepared.obs.states, plan.names)))
        result.trajectories["noise_sd"].attrs["parameter"] = "; ".join(
            f"{s}: {n} " + {"normal": "sd (state units)", "lognormal": "sd of log y", "negbin": "alpha",
                            "poisson": "none (1)"}[n] for s, n in zip(prepared.obs.states, plan.names))
    return result if prepared.scales is None else prepared.scales.back(result)  # on the original scale


def fit_options(*, kernel, gamma, priors, noise_sd, draws, tune, chains, seed, init, scheme, refine_x0, solver,
                posterior, posterior_draws, posterior_tune, posterior_chains, posterior_rounds, posterior_budget,
                nuts_sampler, cores, progressbar, stop, grid) -> FitOptions:
    """:func:`fit`'s options, checked before any GP fit, compiled kernel or sampler runs."""
    if seed is None:  # a fresh seed, recorded in the sampler's settings (result.tree attrs)
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    seed = check_count(seed, "seed", minimum=0)
    draws, tune, chains = (check_count(draws, "draws", minimum=1), check_count(tune, "tune", minimum=0),
                           check_count(chains, "chains", minimum=1))
    if isinstance(posterior, str) and posterior == "nuts":
        posterior = NUTS(posterior_draws, posterior_tune, posterior_chains, posterior_rounds, posterior_budget,
                         nuts_sampler, cores)
    elif isinstance(posterior, str) and posterior == "laplace":
        posterior = Laplace(check_count(posterior_draws, "posterior_draws", minimum=1)
                            * check_count(posterior_chains, "posterior_chains", minimum=1))
    elif posterior is not None and not isinstance(posterior, (NUTS, Laplace)):
        raise DataError(f"posterior must be 'nuts', 'laplace', None, pgpgm.NUTS(...) or pgpgm.Laplace(...), "
                        f"got {posterior!r}")
    scheme = get_scheme(scheme)
    if isinstance(stop, str) and stop not in ("agree", "never"):
        raise DataError(f"stop must be 'agree' (stop when the chains agree), 'never' (the whole budget) or a stop "
                        f"rule object, got {stop!r}")
    for k in (kernel.values() if isinstance(kernel, Mapping) else [kernel]):
        if isinstance(k, str) and k not in KERNELS:
            raise DataError(f"unknown kernel {k!r}; built-in kernels are {sorted(KERNELS)}")
    return FitOptions(kernel, gamma, priors, noise_sd, draws, tune, chains, seed, init, scheme, refine_x0, solver,
                      posterior, progressbar, stop, grid)


def prepare(system: ODESystem, data, observed, options: FitOptions, *, x0, noise, transform, fixed,
            true_theta, x0_observed=None) -> Prepared:
    """The problem :func:`fit` solves, every input checked: the observations, the log-scale plan, the
    fixed parameters substituted (see :func:`fit`)."""
    kernel, gamma, noise_sd, grid = options.kernel, options.gamma, options.noise_sd, options.grid
    obs = as_observations(data, observed, system, grid=grid)
    per_state(kernel, obs.states, "kernel")  # a mapping names observed states only
    for v in per_state(gamma, obs.states, "gamma"):
        check_gamma(v)
    scales = plan_scales(system, data, observed, x0, noise_sd, noise, transform, grid=grid)  # None: no log scale
    measurement = measurement_noise(noise, obs, noise_sd, scales)  # None: Gaussian in steps 3-4
    if x0_observed is not None:
        x0_observed = _known_observed_x0(x0_observed, obs.states, scales)
    if scales is not None:  # fit the likelihood problem (lognormal states as log_<state>); scales.back maps back
        system, data, obs, x0 = (scales.likelihood.system, scales.likelihood.data, scales.likelihood.obs,
                                 scales.likelihood.x0)
    # the problem of the GP fit and gradient matching (steps 1-2): the data as given, or on the log scale
    gm = scales.matching if scales is not None else Problem(system, data, obs, x0, noise_sd)
    if scales is not None:  # per-state kernels and gammas by the matching problem's state names
        kernel, gamma = scales.matching_keys(kernel), scales.matching_keys(gamma)
    if measurement is not None and noise_sd is not None and "lognormal" in measurement.names:
        # the GP of steps 1-2 is on the data's scale: a lognormal sd (of log y) as sd * median y there
        sd = np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)).copy()
        for m, n in enumerate(measurement.names):
            if n == "lognormal" and gm.obs.states[m] == obs.states[m]:
                sd[m] *= float(np.nanmedian(np.abs(gm.obs.values[:, m])))
        gm = replace(gm, noise_sd=sd)
    initial_values(system, data, x0, system.index_of_states(obs.states))
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (system.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {system.n_parameters} finite numbers {list(system.parameters)}, "
                            f"got {true_theta!r}")
    full, fixed, priors, init = system, dict(fixed or {}), options.priors, options.init
    if fixed:  # fixed parameters become numbers in the equations: the fit runs on the others
        system = full.fix(fixed)
        gm = replace(gm, system=system if gm.system is full else gm.system.fix(fixed))
        fixed = {k: float(v) for k, v in fixed.items()}
        priors, init = _without_fixed(priors, init, fixed, full.parameters, system.parameters)
    Priors.from_user(system.parameters, priors)
    return Prepared(full, system, data, obs, x0, gm, scales, fixed, priors, init, kernel, gamma, true_theta,
                    measurement, x0_observed)


# ----------------------------------------------------------------------------- observables
def prepare_observables(system: ODESystem, data, observed, options: FitOptions, *, observables, x0, noise, transform,
                        fixed, true_theta, x0_observed=None) -> Prepared:
    """The problem :func:`fit` solves when the data measure ``observables`` (:mod:`pgpgm.observables`),
    every input checked before anything is compiled.

    Steps 3-4 fit the system extended by the observation parameters (``system``, ``full``) to the
    observables' data (``obs``, columns the observable names). Steps 1-2 (``matching``) fit a GP to each
    observable of :meth:`~pgpgm.observables.Observables.for_matching`: an identity observable (a state
    measured directly, the GP on that state) and an observable y = a * P + c affine in one state P with
    a scale a and an offset c of parameters (``s * P``, ``P / s``, ``s * P + b``: the GP on y; the
    matching system, :meth:`~pgpgm.observables.Observables.matching_system`, has the state y in P's
    place, and the parameters of a and c are sampled with theta, ``scaled``); every other state is
    latent. A sum or any other function of several states, or one not affine in its state, cannot be
    read as one state's values, so it enters at step 3. With no observable matched ``matching`` is
    None: steps 1-2 are skipped (:func:`refine_from_box`), which needs a (lower, upper) box for every
    parameter and unknown initial value and a step 4."""
    if transform is not None:
        raise DataError("transform is not available with observables (it puts states on the log scale, and "
                        "observables are functions of the states on their own scale); leave transform out - "
                        "noise={'<observable>': 'lognormal'} gives lognormal measurement noise on an observable")
    if x0_observed is not None:
        raise DataError("x0_observed is not available with observables; give known initial values of the states "
                        "in x0 (a state measured only through observables is latent)")
    spec = Observables.parse(observables, system)
    measured = ODESystem.from_equations({n: "0" for n in spec.names}, [], name="the observables")
    if not (isinstance(data, xr.Dataset) or _is_table(data)):
        raise DataError("data must be a Dataset from pgpgm.simulate(..., observables=...), or a DataFrame/dict with "
                        "a 'time' column and one column per observable")
    columns = _data_columns(data)
    states_given = [c for c in columns if c in system.states]
    if states_given:
        raise DataError(f"with observables, data columns name observables; {states_given} are states: add an identity "
                        f"observable for each (e.g. observables={{'y_{states_given[0]}': '{states_given[0]}', ...}}) "
                        "and name the column after it")
    obs = as_observations(data, observed, measured, grid=options.grid)
    missing = [n for n in spec.names if n not in obs.states]
    if missing:
        raise DataError(f"observables {missing} have no data (data has {list(obs.states)}); give a column for each "
                        "observable or leave it out of observables")
    spec = Observables.parse({n: observables[n] for n in obs.states}, system)  # in the data's order
    ident = spec.identity
    direct = [n for n in obs.states if n in ident]
    twice = sorted({ident[n] for n in direct if [ident[k] for k in direct].count(ident[n]) > 1})
    if twice:
        raise DataError(f"states {twice} are each measured by several identity observables; give one column per state")
    noise_sd = options.noise_sd
    if noise_sd is not None:
        noise_levels(noise_sd, len(obs.states))
    measurement = measurement_noise(noise, obs, noise_sd, None)  # None: Gaussian on every observable
    if x0 is None and isinstance(data, xr.Dataset) and "x0" in data.attrs:
        x0 = np.asarray(data.attrs["x0"], float)
    full = spec.extend(system)
    if true_theta is not None:
        tt = as_float_array(true_theta, "true_theta")
        if tt.shape != (full.n_parameters,) or not np.all(np.isfinite(tt)):
            raise DataError(f"true_theta must be {full.n_parameters} finite numbers {list(full.parameters)} (the "
                            f"parameters, then the observation parameters), got {true_theta!r}")
    fixed, priors, init = dict(fixed or {}), options.priors, options.init
    fit_system, gm_system, fit_spec = full, system, spec
    if fixed:
        fit_system = full.fix(fixed)  # checks the names (parameters and observation parameters) and values
        fixed = {k: float(v) for k, v in fixed.items()}
        gm_system = system.fix({k: v for k, v in fixed.items() if k in system.parameters})
        fit_spec = spec.fix(fixed)
    # the observables of steps 1-2: the identity ones and those affine in one state (the GP on y)
    matched = fit_spec.for_matching()[0]
    scaled = tuple(v for v in matched.values() if not v.identity)
    if not matched and options.posterior is None:
        raise DataError(f"no state is measured directly or as a * state + c (the observables {dict(spec.texts())} "
                        "are functions of several states, or not affine in their state), so steps 1-2 (a GP per observed state, "
                        "gradient matching) do not run and there are no chains to be the posterior: use "
                        "posterior='nuts' or 'laplace', or add an identity observable such as "
                        f"{{'y_{system.states[0]}': '{system.states[0]}'}} if a state is measured directly")
    cols = [obs.states.index(n) for n in matched]
    gm_names = [v.state if v.identity else v.observable for v in matched.values()]  # the matching system's states
    gm_sd = None
    if noise_sd is not None:  # the GP's sd, in the data's units (a lognormal sd of log y times the median y)
        sd = np.broadcast_to(np.asarray(noise_sd, float).reshape(-1), (len(obs.states),)).copy()
        if measurement is not None:
            for m, n in enumerate(measurement.names):
                if n == "lognormal":
                    sd[m] *= float(np.nanmedian(np.abs(obs.values[:, m])))
        gm_sd = sd[cols]
    if scaled:  # the states measured up to a scale: the measurement y is a state of steps 1-2, in P's place
        gm_system = fit_spec.matching_system(gm_system, scaled)
        names = [*gm_system.parameters, *gm_system.states, *(f"y_{g}" for g in gm_names)]  # step 2's variables
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise DataError(f"in steps 1-2 the observables {[v.observable for v in scaled]} are states beside the "
                            f"likelihood terms y_<state>, and {clash} would name two variables; rename the observable")
    gm_data = {"time": obs.times, **{g: obs.values[:, m] for g, m in zip(gm_names, cols)}}
    gm_obs = as_observations(gm_data, gm_names, gm_system, grid=obs.times) if matched else None
    per_state(options.kernel, gm_obs.states if matched else (), "kernel")  # names direct states, scaled observables
    for v in per_state(options.gamma, gm_obs.states if matched else (), "gamma"):
        check_gamma(v)
    theta_names = [p for p in fit_system.parameters if p in system.parameters]
    if fixed:
        priors, init = _without_fixed(priors, init, fixed, system.parameters, theta_names)
    likelihood_priors = Priors.from_user(fit_system.parameters, priors)
    if scaled and not isinstance(init, str):  # init gives theta: the sampled observation parameters start mid-box
        values = as_float_array(init, "init")
        if values.shape == (len(theta_names),):
            b = likelihood_priors.bounds
            mid = {p: (float(np.mean(b[k])) if b is not None and np.all(np.isfinite(b[k])) else 1.0)
                   for k, p in enumerate(fit_system.parameters)}
            init = np.concatenate([values, [mid[p] for p in gm_system.parameters[len(theta_names):]]])
    gm_priors = ({k: v for k, v in priors.items() if k in gm_system.parameters} if isinstance(priors, Mapping)
                 else priors)
    gm_x0 = x0
    if scaled and isinstance(x0, Mapping):  # a scaled state's initial value is no part of steps 1-2
        gm_x0 = {k: v for k, v in x0.items() if k not in {v_.state for v_ in scaled}}
    initial_values(gm_system, gm_data, gm_x0, gm_system.index_of_states(gm_obs.states) if matched else [])
    if scaled:  # the scaled states are latent in steps 3-4: a known initial value or a prior there
        initial_values(system, None, x0, system.index_of_states([ident[n] for n in direct]))
    if not matched:  # step 3 from the prior box: every box must be finite
        unbounded = [p for p, sp_ in zip(likelihood_priors.names, likelihood_priors.specs) if callable(sp_)]
        unbounded += [s for s, v in initial_value_priors(system, x0, []).items() if callable(v)]
        if unbounded:
            raise DataError(f"no state is measured directly or as a * state + c, so step 3 starts from points "
                            f"spread over the prior boxes; {unbounded} have no box: give them (lower, upper) priors")
    gm = Problem(gm_system, gm_data, gm_obs, gm_x0, gm_sd) if matched else None
    return Prepared(full, fit_system, data, obs, x0, gm, None, fixed, gm_priors, init, options.kernel, options.gamma,
                    true_theta, measurement, None, fit_spec, spec, likelihood_priors, scaled)


def _is_table(data) -> bool:
    import pandas as pd

    return isinstance(data, (pd.DataFrame, Mapping))


def _data_columns(data) -> list[str]:
    """The measured names of ``data`` (a simulated Dataset's ``observed``, a long table's ``state``
    values, a wide table's columns but ``time``)."""
    import pandas as pd

    if isinstance(data, xr.Dataset):
        return [str(v) for v in data["observed"].values] if "observed" in data.coords else []
    if isinstance(data, pd.DataFrame) and {"time", "state", "value"} <= set(data.columns):
        return [str(v) for v in pd.unique(data["state"])]
    return [str(k) for k in data if k != "time"]


def profile_phi(spec: Observables, integrator: Integrator, y: np.ndarray, theta: np.ndarray, x0: np.ndarray,
                bounds: np.ndarray | None, n_theta: int, given: np.ndarray | None = None) -> np.ndarray:
    """(F,) start of the observation parameters for the start (theta (P,), x0 (S,)): with the trajectory
    solved once, least squares over phi alone of the observables' residuals, each observable scaled by
    the sd of its data, from the middle of phi's prior box (from 1 without a box). The observation
    parameters (scales, offsets) enter h directly, so this cheap fit puts them where the chains' theta
    explains the data best; step 3 then refines everything jointly. ``given`` (F,): values held (the
    observation parameters step 2 sampled, NaN for those fitted here)."""
    from scipy import optimize

    F = len(spec.parameters) - n_theta
    if F == 0:
        return np.zeros(0)
    held = np.full(F, np.nan) if given is None else np.asarray(given, float).reshape(F)
    sub = np.flatnonzero(np.isnan(held))  # the entries fitted here
    lo, hi = ((bounds[n_theta:, 0], bounds[n_theta:, 1]) if bounds is not None else (np.full(F, -np.inf),
                                                                                   np.full(F, np.inf)))
    phi0 = np.where(np.isnan(held), np.where(np.isfinite(lo) & np.isfinite(hi), (lo + hi) / 2, 1.0), held)
    if sub.size == 0:
        return phi0
    try:
        x = integrator.solve(np.concatenate([theta, phi0]), x0)
    except ODESolveError:
        return phi0
    t, mask = integrator.times, np.isfinite(y)
    scale = np.array([float(np.std(y[mask[:, o], o])) or 1.0 for o in range(y.shape[1])])

    def phi_of(v):
        out = phi0.copy()
        out[sub] = v
        return out

    def res(v):
        with np.errstate(all="ignore"):
            r = (spec.values(t, x, np.concatenate([theta, phi_of(v)])) - y) / scale
        return np.where(np.isfinite(r), r, 1e6)[mask]

    def jac(v):
        _, dp = spec.jacobians(t, x, np.concatenate([theta, phi_of(v)]))
        return (dp[:, :, n_theta + sub] / scale[None, :, None])[mask]

    try:
        return phi_of(optimize.least_squares(res, phi0[sub], jac=jac, bounds=(lo[sub], hi[sub]), method="trf",
                                             max_nfev=100).x)
    except (ValueError, np.linalg.LinAlgError):
        return phi0


def refine_observables(prepared: Prepared, matched: Matched, options: FitOptions) -> Refined:
    """Step 3 with observables: least squares of the observables' residuals
    (:class:`~pgpgm.refinement.ObservablesProblem`) over (theta, phi, free initial values) from the
    chains' pooled mean and each chain's mean: theta and the observation parameters step 2 sampled (the
    scales and offsets of ``prepared.scaled``) at the chains' means, the other observation parameters
    started by :func:`profile_phi`; the best by likelihood. A state measured up to a scale starts at its
    known initial value, else at (y0 - c) / a from the chains' means. The noise sds start at the GP's
    for the observables with a GP and at the residual sd of the pooled start for the others."""
    system, density, run, spec, obs = prepared.system, matched.density, matched.run, prepared.observables, prepared.obs
    post = run.tree.posterior
    gm_params = prepared.matching.system.parameters  # theta, then the observation parameters step 2 sampled
    n_theta = len(spec.parameters) - len(spec.observation_parameters)
    prior = prepared.likelihood_priors
    bounds = prior.bounds
    sampled_unknown = tuple(system.states[i] for i in density.unknown_x0_idx)  # unknown latent x0 in step 2
    unknown, x0_priors = sampled_unknown, None
    free_x0 = (density.observed_idx if options.refine_x0 else ()) + density.unknown_x0_idx
    if prepared.scaled:  # the scaled states are latent here: their initial value known, or free with its prior
        direct_idx = tuple(system.index_of_states(prepared.direct))
        priors_x0 = initial_value_priors(system, prepared.x0, direct_idx)
        unknown = tuple(s for s in system.states if s in priors_x0)
        x0_priors = {s: priors_x0[s] for s in unknown}
        known = initial_values(system, None, prepared.x0, direct_idx)
        free_x0 = (direct_idx if options.refine_x0 else ()) + tuple(system.states.index(s) for s in unknown)

    def start(sel) -> tuple[np.ndarray, np.ndarray]:  # (step 2's parameters, x0 (S,)) the chains' means
        mean = lambda s: float(post[s].isel(time=0).sel(**sel).mean())
        theta = np.array([float(post[p].sel(**sel).mean()) for p in gm_params])
        x0 = np.array(density.initial_state([mean(s) for s in density.obs.states], [mean(s) for s in sampled_unknown]),
                      dtype=float)
        for sc in prepared.scaled:  # the matching state is the measurement y: P = (y - c) / a at t0
            i = system.states.index(sc.state)
            x0[i] = known[i] if np.isfinite(known[i]) else sc.state_value(x0[i], dict(zip(gm_params, theta)))
        return theta, x0

    def parameters(theta_gm: np.ndarray, x0: np.ndarray) -> np.ndarray:  # (P + F,) the other phi profiled
        given = dict(zip(gm_params, theta_gm))
        theta = np.array([given[p] for p in spec.parameters[:n_theta]])
        held = np.array([given.get(p, np.nan) for p in spec.observation_parameters])
        return np.concatenate([theta, profile_phi(spec, integrator, obs.values, theta, x0, bounds, n_theta, held)])

    integrator = matched.integrator
    theta_s, x0_full = start({})
    p_s = parameters(theta_s, x0_full)
    sels = {"pooled mean": {}} | ({f"chain {c} mean": {"chain": c} for c in post.chain.values}
                                  if post.sizes["chain"] > 1 else {})
    starts = {}
    for name, sel in sels.items():
        if not sel:
            p, x0 = p_s, x0_full
        else:
            theta, x0 = start(sel)
            p = parameters(theta, x0)
        starts[name] = np.concatenate([p, x0[list(free_x0)]])
    # noise sds: the GP's for the observables with a GP (steps 1-2), the residual sd at the pooled start for the others
    O = len(obs.states)
    noise_start = np.empty(O)
    try:
        resid = spec.values(integrator.times, integrator.solve(p_s, x0_full), p_s) - obs.values
    except ODESolveError:
        resid = np.full(obs.values.shape, np.nan)
    gp_sd = dict(zip(density.obs.states, density.noise_sd))  # matching state (a state, or a scaled observable)
    for o, n in enumerate(obs.states):
        y = obs.state_values(o)
        floor = 1e-3 * (float(np.std(y)) or float(np.max(np.abs(y))) or 1.0)
        if spec.identity.get(n, n) in gp_sd:
            noise_start[o] = gp_sd[spec.identity.get(n, n)]
        else:
            r = resid[obs.mask[:, o], o]
            noise_start[o] = max(float(np.sqrt(np.mean(r**2))), floor) if np.all(np.isfinite(r)) else 100 * floor
    if options.noise_sd is not None:  # known sds (normal and lognormal: of log y, set from plan.known below)
        noise_start = np.broadcast_to(np.asarray(options.noise_sd, float).reshape(-1), (O,)).copy()
    problem, noise_start, starts, refinements, k, competing = _refine_observables_from(
        prepared, options, integrator, spec, noise_start, x0_full, free_x0, starts, bounds,
        x0_priors if x0_priors is not None else dict(zip(sampled_unknown, density.x0_priors.specs)))
    return Refined(refinements[k], refinements, starts, problem, p_s, x0_full, noise_start, unknown, prior, x0_priors,
                   competing)


#: starts of step 3 spread over the prior box when no state is measured directly (refine_from_box)
BOX_STARTS = 20
#: step 3's start (``result.nll_per_start``) of the best held to the boxes of the unknown initial values
INSIDE_BOXES = "the best held inside the initial values' prior boxes"


def _unknown_x0_priors(refined: Refined, density: GradientMatchingDensity | None) -> dict[str, PriorSpec]:
    """The unknown initial values' priors by state: step 3's own (``refined.x0_priors``: with observables)
    or step 2's ``density``'s (None where steps 1-2 did not run, and then ``refined.x0_priors`` is set)."""
    return dict(zip(refined.unknown, density.x0_priors.specs)) if refined.x0_priors is None else refined.x0_priors


def _x0_boxes(unknown: Sequence[str], specs: Sequence[PriorSpec]) -> dict[str, tuple[float, float]]:
    """Step 3's q name ``"x0[<state>]"`` -> the (lower, upper) of each unknown initial value's Uniform prior
    (``unknown`` (U,) states, ``specs`` (U,) their priors; other priors have no box)."""
    return {f"x0[{st}]": (float(spec[0]), float(spec[1])) for st, spec in zip(unknown, specs) if not callable(spec)}


def refine_from_box(prepared: Prepared, options: FitOptions, n_starts: int = BOX_STARTS) -> Refined:
    """Step 3 when no state is measured directly (observables only, so no steps 1-2): least squares of
    the observables' residuals from ``n_starts`` points of a Latin hypercube (seeded by the fit's seed)
    over the prior boxes of theta, phi and the unknown latent initial values; the best by likelihood.
    Noise sds start at the given ones, else at 10 % of each observable's data sd, and are estimated.
    ``theta_sampled`` and ``x0_sampled`` are the best refinement's start."""
    from scipy.stats import qmc

    system, spec, obs = prepared.system, prepared.observables, prepared.obs
    prior = prepared.likelihood_priors
    x0_priors = {s: v for s, v in initial_value_priors(system, prepared.x0, []).items()}
    unknown = tuple(s for s in system.states if s in x0_priors)
    free_x0 = tuple(system.states.index(s) for s in unknown)
    x0_full = initial_values(system, None, prepared.x0, [])
    box = np.vstack([prior.bounds.reshape(-1, 2)] + [np.array([x0_priors[s]], float) for s in unknown])
    x0_full[list(free_x0)] = box[len(prior.names):].mean(axis=1)
    u = qmc.LatinHypercube(d=box.shape[0], seed=options.seed).random(n_starts)
    inner = box[:, 0] + (box[:, 1] - box[:, 0]) * (0.02 + 0.96 * u)  # inside the box, off its faces
    starts = {f"box start {i}": q for i, q in enumerate(inner)}
    O = len(obs.states)
    if options.noise_sd is not None:
        noise_start = np.broadcast_to(np.asarray(options.noise_sd, float).reshape(-1), (O,)).copy()
    else:
        noise_start = np.array([0.1 * (float(np.std(obs.state_values(o))) or 1.0) for o in range(O)])
    integrator = Integrator(system, obs.times, options.solver)
    problem, noise_start, starts, refinements, k, competing = _refine_observables_from(
        prepared, options, integrator, spec, noise_start, x0_full, free_x0, starts, prior.bounds, x0_priors)
    theta0, x0_start = problem.split(list(starts.values())[k])
    return Refined(refinements[k], refinements, starts, problem, theta0, x0_start, noise_start, unknown, prior,
                   x0_priors, competing)


def _add_observables(result: FitResult, prepared: Prepared, refined: Refined) -> None:
    """The observables' trajectories ``h`` (estimate, time_dense, observable) beside the states' ``x``,
    integrated from each estimate (NaN where a solve failed), and the observables' expressions
    (``trajectories.attrs["observables"]``, JSON) and observation parameters
    (``estimates.attrs["observation_parameters"]``, JSON), and how steps 1-2 used each observable or
    why they did not (``estimates.attrs["observables_in_steps_1_2"]``, JSON, observable -> a sentence)."""
    traj, est = result.trajectories, result.estimates
    spec, full_spec = prepared.observables, prepared.observables_full
    t = traj["time_dense"].values
    theta = {"sampled": refined.theta_sampled, "refined": refined.best.theta}
    rows = []
    for label in traj["estimate"].values:
        x = traj["x"].sel(estimate=label).values
        if label == "truth":
            rows.append(full_spec.values(t, x, est["truth"].values) if np.all(np.isfinite(x)) else
                        np.full((t.size, spec.n), np.nan))
            continue
        rows.append(spec.values(t, x, theta[str(label)]) if np.all(np.isfinite(x)) else np.full((t.size, spec.n), np.nan))
    result.trajectories["h"] = (("estimate", "time_dense", "observable"), np.stack(rows))
    result.trajectories.coords["observable"] = list(spec.names)
    result.trajectories.attrs["observables"] = json.dumps(full_spec.texts())
    result.estimates.attrs["observation_parameters"] = json.dumps(list(full_spec.observation_parameters))
    matched, refused = spec.for_matching()  # what steps 1-2 made of each observable, and why not
    result.estimates.attrs["observables_in_steps_1_2"] = json.dumps(
        {n: (matched[n].describe() if n in matched else
             "refused in steps 1-2 (fitted in steps 3-4 only): " + refused[n]) for n in spec.names})


def match(prepared: Prepared, options: FitOptions, timings: dict, t0: float) -> Matched:
    """Steps 1-2: a GP per observed state, the gradient-matching density, its chains (in this process:
    worker processes would each compile the model again), stopped by ``options.stop``."""
    gm, system, obs = prepared.matching, prepared.system, prepared.obs
    gps = fit_gps(gm.obs, prepared.kernel, noise_sd=gm.noise_sd, seed=options.seed)
    timings["gp"] = time.perf_counter() - t0
    integrator = Integrator(system, obs.times, options.solver)
    gm_integrator = integrator if gm.system is system else Integrator(gm.system, obs.times, integrator.solver)
    density = gradient_matching_density(gm.system, gm.data, gm.obs.states, x0=gm.x0, kernel=prepared.kernel,
                                        gamma=prepared.gamma, priors=prepared.priors, noise_sd=gm.noise_sd,
                                        gp_fits=gps, solver=gm_integrator, seed=options.seed,
                                        grid=options.grid if prepared.observables is None else obs.times)
    t1 = time.perf_counter()
    stop, own_rule = options.stop, isinstance(options.stop, str) and options.stop == "agree"
    if own_rule:  # its checks refine step 3's problem
        stop = RefinedAgreement(density, gm_integrator, density.priors.bounds, refine_x0=options.refine_x0,
                                estimate_noise=gm.noise_sd is None, seed=options.seed)
    run = run_chains(density, draws=options.draws, tune=options.tune, chains=options.chains, seed=options.seed,
                     init=prepared.init, scheme=options.scheme, cores=1, progressbar=options.progressbar, stop=stop)
    timings["sampling"] = time.perf_counter() - t1
    return Matched(tuple(gps), density, run, integrator, gm_integrator, own_rule, gm_integrator.n_solves)


def refine_step(prepared: Prepared, matched: Matched, options: FitOptions) -> Refined:
    """Step 3: least squares of the ODE solution from the chains' pooled mean and each chain's mean (or,
    when fit's stop rule stopped the chains, from the best optimum its last check refined them to),
    and from the stop rule's box search; the best by likelihood."""
    if prepared.observables is not None:
        return refine_observables(prepared, matched, options)
    system, density, run, scales = prepared.system, matched.density, matched.run, prepared.scales
    post = run.tree.posterior
    theta_s = np.array([float(post[p].mean()) for p in system.parameters])
    unknown = tuple(system.states[i] for i in density.unknown_x0_idx)  # latent states with unknown initial values
    noise_start = density.noise_sd  # the GP's noise sds: the refinement's start and step 4's prior centre
    on_log = prepared.on_log_for_matching

    def start_x0(sel) -> np.ndarray:  # (S,) the chains' mean initial state (sel: all chains or one)
        mean = lambda s: float(post[s].isel(time=0).sel(**sel).mean())
        x = np.array(density.initial_state([mean(s) for s in density.obs.states], [mean(s) for s in unknown]))
        return scales.matching_to_likelihood(x, noise_start)[0] if on_log else x

    x0_full = start_x0({})
    if on_log:
        noise_start = scales.matching_to_likelihood(x0_full, noise_start)[1]
    bounds = density.priors.bounds  # the uniform priors' support, None for other priors
    free_x0 = (density.observed_idx if options.refine_x0 else ()) + density.unknown_x0_idx  # unknown ones always
    if prepared.x0_observed:  # known initial values of observed states: held, not refined
        for st, v in prepared.x0_observed.items():
            x0_full[system.states.index(st)] = v
        free_x0 = tuple(i for i in free_x0 if system.states[i] not in prepared.x0_observed)
    plan = prepared.noise
    if plan is None:
        problem = LeastSquaresProblem(matched.integrator, prepared.obs.values, density.observed_idx, noise_start,
                                      x0_full, free_x0=free_x0)
    else:  # the measurement noise models: each state's noise parameter, given or started from the GP
        noise_start = noise_parameters_start(plan, prepared.obs, noise_start)
        problem = LeastSquaresProblem(matched.integrator, prepared.obs.values, density.observed_idx, noise_start,
                                      x0_full, free_x0=free_x0, noise=plan.names)
    # multi-start: from the pooled posterior mean and from every chain's mean (its parameters and its
    # free initial values, as the stop checks refine them); keep the best
    starts = {"pooled mean": np.concatenate([theta_s, x0_full[list(free_x0)]])}
    last = run.last
    same_problem = (matched.own_rule and last is not None and prepared.matching.system is system and not on_log
                    and plan is None)
    if plan is not None and matched.own_rule and last is not None and not on_log:
        # the stop rule refined a Gaussian problem: its optima start this likelihood's refinement too
        def fit_q(q: np.ndarray) -> np.ndarray:  # the stop rule's q, or its theta where x0 is held here
            return q if q.size == len(problem.q_names) else q[:system.n_parameters]

        starts["Gaussian optimum"] = fit_q(np.array(last.best_q))
        if last.box_q:
            starts["box search's Gaussian optimum"] = fit_q(np.array(last.box_q))
    if same_problem and run.stopped:
        # the chains stopped at a check whose windows are the kept draws: that check refined every
        # chain's mean (and any box start) already (this problem, these bounds); go on from the best
        starts["last check's best optimum"] = np.array(last.best_q)
    elif post.sizes["chain"] > 1:
        starts |= {f"chain {c} mean": np.concatenate([[float(post[p].sel(chain=c).mean()) for p in system.parameters],
                                                     start_x0({"chain": c})[list(free_x0)]])
                   for c in post.chain.values}
    if same_problem and not run.stopped and last.box_q:  # the stop rule's search of the prior box
        starts["box search's best optimum"] = np.array(last.box_q)
    if same_problem and not run.stopped and last.kept_q:  # a chain's optimum it has left since
        starts["an earlier check's best optimum"] = np.array(last.kept_q)
    # noise sds the user did not give are estimated with theta (maximum likelihood); the GP's are the start
    estimate_noise = options.noise_sd is None if plan is None else plan.estimated
    # the stop rule's optima (each chain's, the box search's best): it compares likelihoods, not points, so
    # they may lie in another optimum as good as the best (a symmetry): candidates of competing optima
    others = {}
    if matched.own_rule and last is not None and prepared.matching.system is system and not on_log:
        P = system.n_parameters
        others = {f"chain {c}'s optimum at the stop rule's last check": np.array(th, float)[:P]
                  for c, th in enumerate(last.theta)}
        if last.box_q:
            others["the stop rule's box search's best optimum"] = np.array(last.box_q, float)[:P]
    starts, refinements, k, competing = _refine_from(problem, starts, bounds, estimate_noise, others,
                                                     _x0_boxes(unknown, density.x0_priors.specs))
    return Refined(refinements[k], refinements, starts, problem, theta_s, x0_full, noise_start, unknown,
                   competing=competing)


def _without_fixed(priors, init, fixed: Mapping[str, float], parameters: Sequence[str], kept: Sequence[str]):
    """The user's ``priors`` (a mapping loses the fixed names) and ``init`` (an array over ``parameters``
    keeps the ``kept`` entries) once the ``fixed`` parameters are numbers in the equations."""
    if isinstance(priors, Mapping):
        priors = {k: v for k, v in priors.items() if k not in fixed}
    if not isinstance(init, str):
        values = as_float_array(init, "init")
        if values.shape == (len(parameters),):
            init = values[[list(parameters).index(p) for p in kept]]
    return priors, init


def _refine_observables_from(prepared: Prepared, options: FitOptions, integrator: Integrator, spec: Observables,
                             noise_start: np.ndarray, x0_full: np.ndarray, free_x0, starts: dict[str, np.ndarray],
                             bounds: np.ndarray, x0_priors: Mapping[str, PriorSpec] | None):
    """Step 3 of a fit with observables from every start: the problem (the observables' likelihood with
    the fit's noise models), the noise parameters' start (O,), every start (``starts`` and the loose
    parameters' bound starts), the refinements and the best's index. ``x0_priors``: the unknown initial
    values' priors by state (their boxes hold the best: :func:`_refine_from`), or None."""
    plan = prepared.noise
    if plan is not None:
        noise_start = noise_parameters_start(plan, prepared.obs, noise_start)
    problem = ObservablesProblem.of(integrator, spec, prepared.obs.values, noise_start, x0_full, free_x0=free_x0,
                                    noise=None if plan is None else plan.names)
    estimate_noise = options.noise_sd is None if plan is None else plan.estimated
    boxes = _x0_boxes(list(x0_priors), list(x0_priors.values())) if x0_priors else {}
    starts, refinements, k, competing = _refine_from(problem, starts, bounds, estimate_noise, x0_boxes=boxes)
    return problem, noise_start, starts, refinements, k, competing


def _refine_from(problem: LeastSquaresProblem, starts: dict[str, np.ndarray], bounds: np.ndarray,
                 estimate_noise, others: Mapping[str, np.ndarray] | None = None,
                 x0_boxes: Mapping[str, tuple[float, float]] | None = None
                 ) -> tuple[dict[str, np.ndarray], tuple[Refinement, ...], int, tuple[CompetingOptimum, ...]]:
    """Step 3 from every start (``starts``: name -> (Q,) point of ``problem``) and, where the best leaves
    a parameter loose across its box, from that optimum with the parameter at each bound
    (:func:`~pgpgm.refinement.optima.refine_from_loose_bounds`): every start (``starts`` and those), the
    refinements in their order, the index of the best (the lowest negative log likelihood; the first of
    equals), and the optima that compete with it (:func:`~pgpgm.refinement.optima.competing_optima`:
    among the refinements, ``others`` (name -> (P,) or (Q,) points, e.g. the stop rule's optima) and the
    best with two parameters exchanged). The free initial values are refined unbounded; where the best
    has some outside its box in ``x0_boxes`` (q name ``"x0[<state>]"`` -> its Uniform prior's (lower,
    upper)), it is refined once more held to those boxes
    (:func:`~pgpgm.refinement.optima.refine_inside_boxes`: from its point and every given start, each moved
    into the boxes), and the best is the best of the refinements inside them (the report names what the data
    said outside). Raises :class:`ODESolveError` when every
    start failed; warns when the data do not determine some parameters at the best."""
    refinements = tuple(refine(problem, q, bounds, estimate_noise=estimate_noise, warn=False)
                        for q in starts.values())
    given = starts  # the loose parameters' and the boxes' starts come after these
    usable = [k for k, r in enumerate(refinements) if np.isfinite(r.nll)]
    if not usable:
        raise ODESolveError("every refinement start failed: " + "; ".join(r.message for r in refinements))
    k = min(usable, key=lambda j: refinements[j].nll)
    loose = refine_from_loose_bounds(problem, refinements[k], bounds, estimate_noise)
    if loose:  # the best's loose parameters from their bounds: kept if better
        starts = {**starts, **{name: q for name, (q, _) in loose.items()}}
        refinements += tuple(r for _, r in loose.values())
        k = min((j for j, r in enumerate(refinements) if np.isfinite(r.nll)), key=lambda j: refinements[j].nll)
    boxes = x0_boxes or {}
    points = {INSIDE_BOXES: refinements[k].q,
              **{f"{name}, inside the initial values' prior boxes": q for name, q in given.items()}}
    inside = refine_inside_boxes(problem, refinements[k], points, bounds, boxes, estimate_noise)
    if inside:  # the best and the starts held to the initial values' boxes
        starts = {**starts, **{name: q for name, (q, _) in inside.items()}}
        refinements += tuple(r for _, r in inside.values())
    within = [j for j, r in enumerate(refinements) if not outside_boxes(r.q, r.q_names, boxes)]
    if inside:  # the best of those inside them (where none succeeded, the best outside stays)
        k = min((j for j in within if np.isfinite(refinements[j].nll)), key=lambda j: refinements[j].nll, default=k)
    best = refinements[k]
    names = best.q_names[:best.theta.size]
    competing = competing_optima(problem, best, [refinements[j] for j in within], others or {}, bounds, names,
                                 estimate_noise=estimate_noise, labels=[list(starts)[j] for j in within])
    if refinements[k].undetermined:
        names = refinements[k].undetermined
        what = "its standard error is" if len(names) == 1 else "their standard errors are"
        which = "it" if len(names) == 1 else "some of them"
        warnings.warn(f"the data do not determine {', '.join(names)}: {what} infinite; fix or give a tighter prior "
                      f"to {which}, or measure more states", IdentifiabilityWarning, stacklevel=4)
    return starts, refinements, k, competing


def posterior_step(prepared: Prepared, matched: Matched, refined: Refined, options: FitOptions) -> Posterior:
    """Step 4: NUTS on the ODE model from the refined optimum (each separate mode's mean refined: which
    optimum it belongs to), the Laplace approximation, or step 2's chains (``options.posterior`` None)."""
    system, obs, ref = prepared.system, prepared.obs, refined.best
    density = matched.density if matched is not None else None  # None: no steps 1-2 (refine_from_box)
    spec = options.posterior
    prior = density.priors if refined.priors is None else refined.priors  # with observables: phi's too
    x0_priors = _unknown_x0_priors(refined, density)
    t = obs.times
    solver = refined.problem.integrator.solver  # step 3's (matched.integrator's)
    dense = Integrator(system, np.linspace(t[0], t[-1], _DENSE), solver)
    if isinstance(spec, NUTS):
        plan = prepared.noise
        if plan is None:
            noise_args = {"noise_sd": options.noise_sd, "noise_center": refined.noise_start}
        else:  # sds' priors about their starts (as the Gaussian ones), alpha's about its refined value
            noise_args = {"noise": plan.names, "noise_sd": plan.known,
                          "noise_center": np.where(np.array(plan.names) == "negbin", ref.noise_sd, refined.noise_start)}
        refined_x0 = {s: (ref.x0[system.states.index(s)], ref.q_stderr.get(f"x0[{s}]", np.nan))
                      for s in prepared.direct if s not in (prepared.x0_observed or {})}
        started = time.perf_counter()  # the budget counts building the model (compiling its solve) too
        own = _own_scale(refined.problem, ref, prior, x0_priors)
        model, layout = build_ode_model(system, obs, x0=ref.x0, priors=prior, **noise_args,
                                        solver=spec.solver_at(solver, system, t, ref.theta, ref.x0),
                                        dense_times=dense.times, x0_priors=x0_priors,
                                        log_scale=tuple(n for n in log_scale_names(prior) if n not in own),
                                        own_scale=own,
                                        positive_x0=positive_initial_values(system, refined_x0),
                                        **({"x0_observed": prepared.x0_observed} if prepared.x0_observed else {}),
                                        **({"observables": prepared.observables} if prepared.observables else {}))
        initial = tuple(s for s in (*prepared.direct, *refined.unknown) if s not in (prepared.x0_observed or {}))
        center, sd = _refined_point(layout, ref, obs, initial)
        names = {**{p: p for p in layout.parameters},
                 **{f"x0[{s}]": n for s, n in zip(initial, layout.initial)}}
        covariance = ([names[q] for q in ref.q_names], ref.q_covariance)
        run = run_nuts(model, center, sd, covariance=covariance, draws=spec.draws, tune=spec.tune, chains=spec.chains,
                       cores=spec.cores, seed=options.seed, nuts_sampler=spec.sampler, max_rounds=spec.rounds,
                       progressbar=options.progressbar, budget=spec.budget, warn=False, metric=spec.metric,
                       started=started, ess=spec.ess, sd_error=spec.sd_error)
        modes = [m.record() for m in run.modes]
        for mode in modes:  # each mode's mean refined: which optimum it belongs to, and how well it fits
            m = mode["mean"]
            q0 = np.array([m[p] for p in layout.parameters]
                          + [m[names[q]] for q in ref.q_names[len(layout.parameters):]])
            r = refine(refined.problem, q0, prior.bounds, warn=False,
                       estimate_noise=options.noise_sd is None if prepared.noise is None else prepared.noise.estimated)
            mode["refined"], mode["nll"] = dict(zip(layout.parameters, map(float, r.theta))), float(r.nll)
        run.tree.attrs["pgpgm_modes"] = json.dumps(modes)
        run.tree.attrs["pgpgm_own_scale"] = json.dumps(sorted(own))  # the rest of log_scale_names: log scale
        if run.gradient_evaluations:  # every round's draws, not just those kept
            solves = sum(run.gradient_evaluations)
        elif "n_steps" in run.tree.sample_stats:
            solves = int(run.tree.sample_stats["n_steps"].sum())
        else:
            solves = 0
        return Posterior(run.tree, run, tuple(layout.free), solves)
    if isinstance(spec, Laplace):
        return Posterior(laplace_posterior(dense, ref, draws=spec.draws, seed=options.seed), None, (), 0)
    return Posterior(matched.run.tree, None, (), 0)


def report(prepared: Prepared, matched: Matched, refined: Refined, post: Posterior, options: FitOptions,
           timings: dict) -> FitResult:
    """Diagnostics and warnings (convergence, bounds), then the :class:`FitResult`
    (:func:`pgpgm.result.assemble`)."""
    system, spec = prepared.system, options.posterior
    run = matched.run if matched is not None else None  # None: no steps 1-2 (refine_from_box)
    diagnostics = {}
    if run is not None:
        sampled = system.parameters if prepared.observables is None else prepared.matching.system.parameters  # no phi
        diagnostics["gradient_matching"] = diagnose(run.tree, sampled)
    if isinstance(spec, NUTS):
        diagnostics["posterior"] = diagnose(post.tree, post.free, spec.ess)
    # the bound checks use the exact posterior's draws, not step 2's chains (they only locate the basin)
    draws = ({p: post.tree.posterior[p].values for p in system.parameters if p in post.tree.posterior}
             if spec is not None else None)
    prior = refined.priors if refined.priors is not None else matched.density.priors
    at_bounds = bound_report(prior, refined.best.theta, draws, stderr=refined.best.stderr)
    if not isinstance(spec, Laplace):
        label = "posterior" if isinstance(spec, NUTS) else "gradient_matching"
        notes = posterior_notes(post.tree) if isinstance(spec, NUTS) else []
        if isinstance(spec, NUTS) and mixing_problems(diagnostics[label]):
            notes += causes_of_poor_mixing(refined.best.undetermined, at_bounds)
        warn_if_unconverged(diagnostics[label], "NUTS" if isinstance(spec, NUTS) else
                            "gradient-matching" + (" (its chains stopped early, stop='agree'; stop='never' runs them "
                                                   "to the end)" if run.stopped else ""),
                            notes=notes, stacklevel=4)
        if isinstance(spec, NUTS) and not mixing_problems(diagnostics[label]):
            warn_if_imprecise(post.tree, stacklevel=4)
    warn_at_bounds(at_bounds, stacklevel=4)
    if INSIDE_BOXES in refined.starts:  # unknown initial values the data put outside their boxes: held there
        best = refined.best
        free = min((r for r in refined.refinements if np.isfinite(r.nll)), key=lambda r: r.nll)
        x0_priors = _unknown_x0_priors(refined, matched.density if matched is not None else None)
        boxed = [st for st, spec in x0_priors.items() if not callable(spec)]
        index = [system.states.index(st) for st in boxed]
        held = [r for r, name in zip(refined.refinements, refined.starts) if name == INSIDE_BOXES]
        outside = outside_prior_boxes([initial_value_name(st) for st in boxed], [x0_priors[st] for st in boxed],
                                      best.x0[index], free.x0[index],
                                      [free.q_stderr.get(f"x0[{st}]", np.nan) for st in boxed], best.nll - free.nll,
                                      failed="" if best is not free else held[0].message if held else "")
        if outside:
            warnings.warn("; ".join(outside), BoundWarning, stacklevel=4)
    if refined.competing:  # another optimum as good: a symmetry, or a mode the estimates do not describe
        best = refined.best
        warnings.warn(describe(refined.competing, best, best.q_names[:best.theta.size]), CompetingOptimaWarning,
                      stacklevel=3)  # report <- fit <- the caller
    data, true_theta = prepared.data, prepared.true_theta
    if true_theta is None and isinstance(data, xr.Dataset) and "theta" in data.attrs:
        true_theta = data.attrs["theta"]
    x0_true = (np.asarray(data.attrs["x0"], float) if isinstance(data, xr.Dataset) and "x0" in data.attrs
               else refined.x0_sampled)
    solves = {"sampling": matched.n_solves if matched is not None else 0,
              "refinement": sum(r.n_solves for r in refined.refinements), "posterior": post.solves}
    stopping = ((run.stopped, run.reason, list(run.iterations)) if run is not None else
                (False, f"no state measured directly or as a * state + c: steps 1-2 skipped, step 3 from "
                 f"{len(refined.starts)} starts spread over the prior box", []))
    return assemble(full=prepared.full, system=system, obs=prepared.obs, fixed=prepared.fixed,
                    tree=run.tree if run is not None else None,
                    main=post.tree, has_posterior=spec is not None, theta_sampled=refined.theta_sampled,
                    x0_sampled=refined.x0_sampled, best=refined.best, refinements=refined.refinements,
                    starts=tuple(refined.starts), unknown=refined.unknown, at_bounds=at_bounds,
                    stopping=stopping,
                    noise_given=(options.noise_sd is not None if prepared.noise is None
                                 else not refined.best.noise_estimated.any()),
                    noise_gp=matched.density.noise_sd if prepared.observables is None else refined.noise_start,
                    true_theta=true_theta, x0_true=x0_true,
                    solver=refined.problem.integrator.solver, dense_points=_DENSE, timings=timings, solves=solves,
                    diagnostics=diagnostics, competing=refined.competing)


def _known_observed_x0(values, states, scales) -> dict[str, float]:
    """``x0_observed`` of :func:`fit` checked: observed state -> a finite number."""
    if not isinstance(values, Mapping):
        raise DataError(f"x0_observed must be a mapping observed state -> its known initial value, got {values!r}")
    unknown = [k for k in values if k not in states]
    if unknown:
        raise DataError(f"x0_observed names {unknown}, which are not observed states {list(states)}; give latent "
                        "states' initial values in x0")
    on_log = [k for k in values if scales is not None and k in scales.likelihood_scale.states]
    if on_log:
        raise DataError(f"x0_observed names {on_log}, whose likelihood is on the log scale (lognormal noise with "
                        "transform='log'); give the measurement noise model alone (noise={state: 'lognormal'})")
    out = {}
    for k, v in values.items():
        a = as_float_array(v, f"x0_observed[{k}]")
        if a.size != 1 or not np.isfinite(a).all():
            raise DataError(f"x0_observed[{k}] must be one finite number, got {v!r}")
        out[k] = float(a.reshape(-1)[0])
    return out


def noise_parameters_start(plan: MeasurementNoise, obs, gp_sd) -> np.ndarray:
    """(M,) the start of each observed state's noise parameter in step 3: the given one, else from the
    GP's noise sd ``gp_sd`` (M,) (state units, steps 1-2 work on the data's scale): normal sd as is,
    lognormal sd / median y (the delta method: the sd of log y), negbin alpha by the moments
    mean(y)^2 / (sd^2 - mean(y)) (Var = mu + mu^2/alpha; 100 when the GP sees no overdispersion),
    clipped to [0.1, 1e4]; 1 (unused) for Poisson."""
    out = np.ones(len(plan.names))
    for m, name in enumerate(plan.names):
        y = obs.state_values(m)
        if np.isfinite(plan.known[m]):
            out[m] = plan.known[m]
        elif name == "normal":
            out[m] = gp_sd[m]
        elif name == "lognormal":
            out[m] = gp_sd[m] / float(np.median(np.abs(y)))
        elif name == "negbin":
            excess = gp_sd[m] ** 2 - float(np.mean(y))
            out[m] = float(np.clip(np.mean(y) ** 2 / excess, 0.1, 1e4)) if excess > 0 else 100.0
    return out


def _own_scale(problem: LeastSquaresProblem, ref: Refinement, prior: Priors,
               x0_priors: Mapping[str, PriorSpec]) -> dict[str, float]:
    """The Uniform(0, upper) parameters and unknown latent initial values step 4 samples on their own
    scale, with their soft wall's width, by step 4's variable names
    (:func:`~pgpgm.posterior.scales.choose_scales` on the refinement's log likelihood and Fisher
    information, noise held at its refined parameters); the parameters left stay on the log scale, the
    initial values on the log-odds of their box."""
    initial = {f"x0[{s}]": initial_value_name(s) for s in x0_priors}  # refinement name -> step 4's
    boxes = Priors((*prior.names, *initial), (*prior.specs, *x0_priors.values()))
    box = dict(zip(boxes.names, boxes.specs))
    uppers = {n: box[n][1] for n in log_scale_names(boxes) if n in prior.names or n in ref.q_names}
    if not uppers:
        return {}
    scaled = problem.with_noise_sd(ref.noise_sd)

    def logp(q: np.ndarray) -> float:
        return -problem.nll(q, ref.noise_sd)

    def conditional_sd(q: np.ndarray) -> np.ndarray:
        J = scaled.jacobian(q)
        with np.errstate(divide="ignore"):
            return 1.0 / np.sqrt(np.einsum("kq,kq->q", J, J))

    choices = choose_scales(logp, ref.q, ref.q_covariance, ref.q_names, uppers, conditional_sd)
    return {initial.get(c.name, c.name): c.width for c in choices if c.own}


def _refined_point(layout, ref: Refinement, obs, initial_states) -> tuple[dict[str, float], dict[str, float]]:
    """The refined optimum by the ODE model's variable names, and a spread for each: the
    refinement's standard errors of theta and the free initial values (10 % of the value
    where undetermined), sigma/sqrt(2N) for a noise sd."""
    se = ref.q_stderr
    center, sd = {}, {}
    idx = [list(layout.states).index(s) for s in initial_states]
    for name, key, v in [*zip(layout.parameters, layout.parameters, ref.theta),
                         *((n, f"x0[{s}]", ref.x0[i]) for n, s, i in zip(layout.initial, initial_states, idx))]:
        s = se.get(key, np.nan)
        center[name] = float(v)
        sd[name] = float(s) if np.isfinite(s) and s > 0 else 0.1 * max(abs(float(v)), 1e-3)
    for name, m in zip(layout.noise, layout.noise_states):
        sig, n = ref.noise_sd[m], obs.n_obs[m]
        center[name], sd[name] = float(sig), float(sig) / np.sqrt(2 * n)
    return center, sd



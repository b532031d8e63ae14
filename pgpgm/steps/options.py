"""Every option of a fit, validated once where it is built: :class:`FitOptions`, step 4's :class:`NUTS` and
:class:`Laplace`, and :func:`fit_options`."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..checks import check_count, check_gamma
from ..errors import DataError, ODESolveError
from ..gp.kernels import KERNELS
from ..matching import get_scheme
from ..ode.system import ODESystem
from ..posterior.budget import PosteriorBudget
from ..posterior.diagnostics import (
    ESS_MIN,
    SD_ERROR,
    check_ess,
    check_sd_error,
)
from ..posterior.rounds import MAX_ROUNDS, METRICS, NUTS_SAMPLERS, POSTERIOR_RTOL
from ..solve import CVODE, DOPRI5, Integrator, Solver

#: most steps between two output times of step 4's explicit solves (:class:`NUTS` ``solver="auto"``) before
#: CVODE redoes the solve: a non-stiff stretch takes tens of Dormand-Prince steps, a stiff one thousands
EXPLICIT_STEPS = 1000


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class NUTS:
    """Step 4 by NUTS on the ODE model (:func:`pgpgm.posterior.rounds.run_nuts`).

    draws, tune, chains : per chain; rounds : most NUTS rounds while R-hat, ESS or divergences
    fail; budget : a :class:`PosteriorBudget`, seconds, or None (no limit); sampler : ``"auto"``
    (default: nutpie where every value variable is a scalar, else PyMC), ``"nutpie"`` or ``"pymc"``;
    cores : processes (default: one per chain, at most the CPUs); metric : the first
    round's mass matrix, ``"adapt"`` or ``"laplace"`` (see :func:`pgpgm.posterior.rounds.run_nuts`);
    rtol : the relative tolerance of step 4's ODE solves (default
    :data:`~pgpgm.posterior.rounds.POSTERIOR_RTOL`, 1e-6: 1.4-2x cheaper gradients than the solver's
    1e-8, errors far below a posterior sd; None: the fit's solver's); solver : step 4's ODE solver,
    ``"auto"`` (default: where the fit's solver is :class:`~pgpgm.solve.cvode.CVODE`, the explicit
    :class:`~pgpgm.solve.dopri5.DOPRI5` at its tolerances with :data:`EXPLICIT_STEPS` steps between two
    output times and its stiffness test, the CVODE redoing any solve it gives up - a stiff stretch -
    and CVODE alone where DOPRI5 gives up at the refined point, :meth:`solver_at`; 2-4x cheaper gradients on the
    shipped models), ``"fit"`` (the fit's solver) or a solver object; ess : the bulk and tail
    ESS every variable must reach (default 400, :data:`~pgpgm.posterior.diagnostics.ESS_MIN`; the sampling goes on
    until it does, within the budget): an sd's Monte Carlo error is ~sd / sqrt(2 ESS) for a Gaussian posterior
    and more with heavy tails (~10 % at ESS 400 with kurtosis 14);
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
        set_(self, "draws", check_count(self.draws, "NUTS draws", minimum=1))
        set_(self, "tune", check_count(self.tune, "NUTS tune", minimum=0))
        set_(self, "chains", check_count(self.chains, "NUTS chains", minimum=1))
        set_(self, "rounds", check_count(self.rounds, "NUTS rounds", minimum=1))
        set_(self, "ess", check_ess(self.ess, "NUTS ess"))
        set_(self, "sd_error", check_sd_error(self.sd_error, "NUTS sd_error"))
        set_(self, "budget", PosteriorBudget.of(self.budget))
        if self.sampler not in NUTS_SAMPLERS:
            raise DataError(f"NUTS sampler must be one of {NUTS_SAMPLERS}, got {self.sampler!r}")
        if self.cores is not None:
            set_(self, "cores", check_count(self.cores, "NUTS cores", minimum=1))


@dataclass(frozen=True)
class Laplace:
    """Step 4 by the Gaussian approximation at the refined optimum: ``draws`` draws in all."""

    draws: int = 2000

    def __post_init__(self):
        object.__setattr__(self, "draws", check_count(self.draws, "Laplace draws", minimum=1))


#: step 4's default budget in a study: a joint model costs one solve per experiment per gradient
STUDY_BUDGET = PosteriorBudget(300.0, None)

#: the flat step-4 keywords of earlier releases, each the :class:`NUTS` field it set (kept one release, with a
#: DeprecationWarning that says what to write instead)
LEGACY_POSTERIOR = {"posterior_draws": "draws", "posterior_tune": "tune", "posterior_chains": "chains",
                    "posterior_rounds": "rounds", "posterior_budget": "budget", "nuts_sampler": "sampler",
                    "cores": "cores"}


def posterior_option(posterior, legacy: Mapping[str, Any], *, who: str = "fit", default: NUTS | None = None,
                     laplace: bool = True) -> NUTS | Laplace | None:
    """Step 4's option: a :class:`NUTS`, a :class:`Laplace` (where ``laplace``) or None; the names ``"nuts"``
    (``default``, else ``NUTS()``) and ``"laplace"`` build one. ``legacy``: the other keywords ``who`` was
    called with - each a flat step-4 keyword of :data:`LEGACY_POSTERIOR`, which sets its field with a
    DeprecationWarning naming the call to write instead; any other name is a TypeError, as Python gives."""
    unknown = [k for k in legacy if k not in LEGACY_POSTERIOR]
    if unknown:
        raise TypeError(f"{who}() got an unexpected keyword argument {unknown[0]!r}")
    fields = {LEGACY_POSTERIOR[k]: v for k, v in legacy.items()}
    if legacy:
        if isinstance(posterior, NUTS | Laplace):
            raise DataError(f"{sorted(legacy)} and posterior={posterior!r} both set step 4: give its settings in "
                            f"posterior=pgpgm.NUTS(...) alone")
        call = ("pgpgm.Laplace(draws=...)" if posterior == "laplace" else
                "pgpgm.NUTS(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")")
        warnings.warn(f"{', '.join(sorted(legacy))} of {who}() are deprecated and will be removed: write "
                      f"posterior={call}", DeprecationWarning, stacklevel=4)
    if isinstance(posterior, str) and posterior == "nuts":
        base = default if default is not None else NUTS()
        return replace(base, **fields) if fields else base
    if laplace and isinstance(posterior, str) and posterior == "laplace":
        if not fields:
            return Laplace()
        return Laplace(check_count(fields.get("draws", 500), "posterior_draws", minimum=1)
                       * check_count(fields.get("chains", 4), "posterior_chains", minimum=1))
    if posterior is None or isinstance(posterior, NUTS) or (laplace and isinstance(posterior, Laplace)):
        return posterior
    allowed = "'nuts', 'laplace', None, pgpgm.NUTS(...) or pgpgm.Laplace(...)" if laplace else \
        "'nuts', None or pgpgm.NUTS(...)"
    raise DataError(f"posterior must be {allowed}, got {posterior!r}")


@dataclass(frozen=True)
class FitOptions:
    """Every option of :func:`pgpgm.fit` but the data and the problem's own inputs (initial values, noise models,
    fixed parameters, observables), validated by :func:`fit_options` (see :func:`pgpgm.fit` for their meaning):
    ``gamma`` is a number or a mapping observed state -> number, each checked; ``posterior`` a :class:`NUTS`, a
    :class:`Laplace` or None; ``seed`` a whole number (a fresh one drawn for None)."""

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

    def keywords(self) -> dict[str, Any]:
        """These options as :func:`pgpgm.fit`'s keyword arguments (each field is one of them)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def legacy_fit_kwargs(fit_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`pgpgm.fit_study`'s ``fit_kwargs`` of earlier releases, checked: options of :func:`pgpgm.fit` that
    :func:`pgpgm.fit_study` now takes itself (a DeprecationWarning says to pass them so)."""
    if not fit_kwargs:
        return {}
    names = {f.name for f in fields(FitOptions)} - {"posterior"}
    clash = {"x0", "fixed", "posterior", "observed", "noise"} & set(fit_kwargs)
    if clash:
        raise DataError(f"fit_kwargs must not hold {sorted(clash)}: the study gives them")
    bad = sorted(set(fit_kwargs) - names)
    if bad:
        raise DataError(f"fit_kwargs holds {bad}, which fit_study does not pass on; its options are {sorted(names)}")
    warnings.warn(f"fit_kwargs is deprecated: pass {', '.join(f'{k}={v!r}' for k, v in fit_kwargs.items())} to "
                  "fit_study itself", DeprecationWarning, stacklevel=3)
    return dict(fit_kwargs)


def fit_options(*, kernel="rbf", gamma=0.3, priors=None, noise_sd=None, draws=2000, tune=1500, chains=2, seed=0,
                init="spread", scheme="block", refine_x0=True, solver=None, posterior=None, progressbar=True,
                stop="agree", grid=None) -> FitOptions:
    """The options of a fit, each checked once, before any GP fit, compiled kernel or sampler runs (names that
    depend on the data, such as the observed states a ``kernel`` mapping names, are checked where the data are
    read, :func:`pgpgm.steps.prepare.prepare`). ``posterior``: from :func:`posterior_option`. The defaults are
    :func:`pgpgm.fit`'s (but ``posterior``: None), so that an entry point that has no use for an option leaves
    it out."""
    if seed is None:  # a fresh seed, recorded in the sampler's settings (result.tree attrs)
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    seed = check_count(seed, "seed", minimum=0)
    draws, tune, chains = (check_count(draws, "draws", minimum=1), check_count(tune, "tune", minimum=0),
                           check_count(chains, "chains", minimum=1))
    if posterior is not None and not isinstance(posterior, NUTS | Laplace):
        raise DataError(f"posterior must be None, pgpgm.NUTS(...) or pgpgm.Laplace(...), got {posterior!r}")
    scheme = get_scheme(scheme)
    if isinstance(stop, str) and stop not in ("agree", "never"):
        raise DataError(f"stop must be 'agree' (stop when the chains agree), 'never' (the whole budget) or a stop "
                        f"rule object, got {stop!r}")
    for k in (kernel.values() if isinstance(kernel, Mapping) else [kernel]):
        if isinstance(k, str) and k not in KERNELS:
            raise DataError(f"unknown kernel {k!r}; built-in kernels are {sorted(KERNELS)}")
    for g in (gamma.values() if isinstance(gamma, Mapping) else [gamma]):
        check_gamma(g)  # each value checked here, kept as given (the density reads it again)
    return FitOptions(kernel, gamma, priors, noise_sd, draws, tune, chains, seed, init, scheme, refine_x0, solver,
                      posterior, progressbar, stop, grid)

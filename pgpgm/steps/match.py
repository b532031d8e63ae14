"""Steps 1-2: a GP per observed state, the gradient-matching density and its chains (:func:`match` -> :class:`Matched`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..gp import GPFit
from ..matching import MatchingRun, run_chains
from ..matching.agreement import RefinedAgreement
from ..matching.density import GradientMatchingDensity, fit_gps, gradient_matching_density
from ..solve import Integrator
from .options import FitOptions
from .prepare import Prepared


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


def match(prepared: Prepared, options: FitOptions, timings: dict, started: float) -> Matched | None:
    """Steps 1-2: a GP per observed state, the gradient-matching density, its chains (in this process:
    worker processes would each compile the model again), stopped by ``options.stop``; None where no state is
    measured directly (observables of several states only: step 3 starts from the prior box). ``timings``
    gains ``"gp"`` (seconds since ``started``, the fit's start) and ``"sampling"``."""
    if prepared.matching is None:
        return None
    gm, system, obs = prepared.matching, prepared.system, prepared.obs
    gps = fit_gps(gm.obs, prepared.kernel, noise_sd=gm.noise_sd, seed=options.seed)
    timings["gp"] = time.perf_counter() - started
    integrator = Integrator(system, obs.times, options.solver)
    gm_integrator = integrator if gm.system is system else Integrator(gm.system, obs.times, integrator.solver)
    density = gradient_matching_density(gm.system, gm.data, gm.obs.states, x0=gm.x0, kernel=prepared.kernel,
                                        gamma=prepared.gamma, priors=prepared.priors, noise_sd=gm.noise_sd,
                                        gp_fits=gps, solver=gm_integrator, seed=options.seed,
                                        grid=prepared.grid if prepared.observables is None else obs.times)
    t1 = time.perf_counter()
    stop, own_rule = options.stop, isinstance(options.stop, str) and options.stop == "agree"
    if own_rule:  # its checks refine step 3's problem
        held = () if prepared.on_log_for_matching else tuple(  # known initial values: held as in step 3
            (gm.system.states.index(s), v) for s, v in (prepared.x0_observed or {}).items())
        stop = RefinedAgreement(density, gm_integrator, density.priors.refinement_bounds, refine_x0=options.refine_x0,
                                estimate_noise=gm.noise_sd is None, seed=options.seed, held_x0=held)
    run = run_chains(density, draws=options.draws, tune=options.tune, chains=options.chains, seed=options.seed,
                     init=prepared.init, scheme=options.scheme, cores=1, progressbar=options.progressbar, stop=stop)
    timings["sampling"] = time.perf_counter() - t1
    return Matched(tuple(gps), density, run, integrator, gm_integrator, own_rule, gm_integrator.n_solves)

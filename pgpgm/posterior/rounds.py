"""Step 4: the exact posterior of the ODE model, sampled from the refined optimum.

Steps 1-3 find the basin of the global optimum without a good initial guess; this step
explores it with an exact sampler. :func:`build_ode_model` writes the ODE model itself as
a ``pm.Model``:

    theta ~ priors (the specs of :func:`pgpgm.gradient_matching_density`)
    x_k(t_0) ~ Normal(first observation of k, sd of k's observations)   observed states
    sigma_k ~ LogNormal(log sigma_k^GP, 2)           unless the noise sd is given
    x(t) = CVODE solve from (x(t_0), theta)          on the observation grid (and, for the
                                                     trajectories of the draws, the plotting grid)
    y_k(t_i) ~ Normal(x_k(t_i), sigma_k)

or, with measurement noise models (``build_ode_model(..., noise=(...))``, :mod:`pgpgm.noise`), per
observed state: ``y_k ~ LogNormal(log x_k, sigma_k)`` (sigma_k of log y), ``Poisson(x_k)`` or
``NegativeBinomial(mu=x_k, alpha=alpha_k)`` on the measured entries, with
``alpha_k ~ LogNormal(log alpha_k^refined, 2)`` and ``sigma_k ~ LogNormal(log sigma_k^start, 2)``
like the Gaussian sds, unless given; a prediction x_k <= 0 at a measured value has zero likelihood.

and :func:`sample_posterior` runs NUTS on it, every chain started near the refined
optimum (dispersed by the refinement covariance, which also seeds the diagonal mass
matrix), chains in parallel processes.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr
from pymc.step_methods.hmc.quadpotential import (
    QuadPotentialFull,
)

from ..errors import DataError
from .budget import MIN_SAMPLING_SHARE, SHARPEN_SHARE, BudgetMeter, PosteriorBudget
from .diagnostics import (
    ESS_MIN,
    SD_ERROR,
    Mode,
    check_ess,
    check_sd_error,
    diagnose,
    find_modes,
    mixing_problems,
    posterior_notes,
    problems,
    warn_if_imprecise,
    warn_if_unconverged,
)
from .nutpie_engine import sample_nutpie
from .pymc_engine import (
    MAX_TREEDEPTH,
    TARGET_ACCEPT_MAX,
    budgeted_sample,
    extend_chains,
    kept_draws,
    leapfrog_steps,
)
from .space import (
    ValueSpace,
    continuing_starts,
    dispersed_starts,
    pooled_covariance,
    seed_metric,
    seeded_potential,
)

#: :func:`run_nuts`'s engines: PyMC's NUTS in rounds, nutpie in whitened coordinates, or ``"auto"``
#: (nutpie where every value variable is a scalar, PyMC's rounds elsewhere: :func:`auto_sampler`)
NUTS_SAMPLERS = ("pymc", "nutpie", "auto")


def _may_extend(chains: int, draws: int) -> bool:
    """Whether step 4 may draw more than the ``draws`` per chain asked for (PyMC's further rounds, nutpie's
    longer run): not for one chain or fewer than ``2 * ESS_MIN`` draws in all - a short run asked for
    stays short."""
    return chains > 1 and chains * draws >= 2 * ESS_MIN


def auto_sampler(model: pm.Model) -> str:
    """The engine ``nuts_sampler="auto"`` (the default) runs on ``model``: ``"nutpie"`` (whitened by the
    refinement's Laplace approximation, :data:`pgpgm.posterior.nutpie_engine.ADAPTATION`) where every
    value variable is a scalar, else ``"pymc"`` (vector-valued variables, which the whitening does not
    cover; and wherever nutpie cannot be imported). :func:`pgpgm.fit_study` runs PyMC's rounds for a
    hierarchical model, whose population-sd funnel no Laplace approximation describes.

    nutpie converges in more fits than PyMC's rounds within the same budget, in about half of their
    time, and keeps costly cases (many states, a broad posterior, a start at a wrong optimum) within a
    few times an ordinary fit. nutpie compiles the model inside the budget; its callbacks are cached by
    the model's structure, so a later fit of the same structure pays 2-8 s, the first one 8-25 s."""
    return "nutpie" if _scalar_values(model) and _has_nutpie() else "pymc"


def _scalar_values(model: pm.Model) -> bool:
    """Whether every value variable of ``model`` is a scalar (what the whitening of nutpie's coordinates
    covers)."""
    return all(v.ndim == 0 for v in model.value_vars)


def _has_nutpie() -> bool:
    """Whether nutpie (a requirement of pgpgm, so absent only from an environment built without it) can be
    imported."""
    import importlib.util

    return importlib.util.find_spec("nutpie") is not None


#: the mass-matrix choices of :func:`run_nuts`'s first round
METRICS = ("adapt", "laplace")


#: a further round is not started when the budget left allows fewer draws per chain than this (or
#: than ``draws``, when smaller)
MIN_ROUND_DRAWS = 100


#: a round's draws whose R-hat and ESS fail are extended by the next round (each chain continued from
#: its last draw, the draws judged together) - the first round's too, when its chains have met: max R-hat
#: at most this. Dropping such draws starts the count again at each round, so a fit that misses R-hat or
#: ESS in its budget only by a little never gathers enough draws; carried, they add up (a second round
#: alone can have fewer effective draws than the first had), and about three times as many of those fits
#: pass
RHAT_CARRY = 1.05


#: most NUTS rounds of :func:`sample_posterior` (and :func:`pgpgm.fit`'s ``posterior_rounds``): a
#: posterior that spreads over the whole prior box mixes slowly (a min ESS of 60-400 per round of 4 x 2000
#: draws) and can need six rounds to pass R-hat <= 1.01
MAX_ROUNDS = 6

#: relative tolerance of step 4's ODE solves (:class:`pgpgm.NUTS` ``rtol``; the solver's atol is
#: kept). One gradient (states and sensitivities) at rtol 1e-6 against the solver's default 1e-8:
#: 1.4x (Lotka-Volterra), 1.7x (protein transduction), 2.1x (FitzHugh-Nagumo) cheaper, states within
#: 2e-5 and sensitivities within 6e-5 relative of a 1e-12 solve; a change of 1e-5 in a predicted
#: value moves the log likelihood by about 1e-5 (y - mu) / sigma^2 per point, far below a posterior
#: sd. The tolerance Stan's ODE solvers default to.
POSTERIOR_RTOL = 1e-6


def run_nuts(
    model: pm.Model,
    center: Mapping[str, float],
    sd: Mapping[str, float],
    *,
    covariance: tuple[Sequence[str], np.ndarray] | None = None,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    cores: int | None = None,
    seed: int | None = 0,
    nuts_sampler: str = "auto",
    target_accept: float = 0.9,
    max_rounds: int = MAX_ROUNDS,
    progressbar: bool = True,
    budget: PosteriorBudget | float | None = None,
    warn: bool = True,
    starts: Sequence[Mapping[str, float]] | None = None,
    metric: str = "adapt",
    started: float | None = None,
    ess: float = ESS_MIN,
    sd_error: float | None = SD_ERROR,
):
    """NUTS on ``model`` from around ``center`` (constrained values of its free variables), as
    :func:`sample_posterior` (which returns the draws alone); returns the :class:`NUTSRun`.

    Parameters
    ----------
    model : e.g. from :func:`build_ode_model`
    center, sd : the refined estimate and its standard errors, by variable name; chains
        start at draws from Normal(center, sd) (see :func:`dispersed_starts`) and the
        mass matrix starts from sd^2 carried to the transformed space - dense when
        ``covariance`` (names, matrix), e.g. the refinement's, is given and finite
        (see :func:`seeded_potential`)
    draws, tune, chains : per chain; cores : parallel processes (default min(chains, CPUs); with a
        time budget, ``chains``: every chain runs at once - the same draws, as the draws do not depend
        on the number of processes - so that a budget that stops them leaves every chain at the same
        length instead of the first CPUs' worth of chains done and the others not begun). Fewer
        processes than chains with a budget: the chains run in waves of ``cores``, each wave an equal
        share of the budget (what one leaves goes to the next; a wave ends once each of its chains has
        used its part and drawn at least 0.6 times as many iterations as its longest, so that a chain
        whose process started late is not cut short and left out; the last wave may use up to half its
        share beyond a gradient budget for that), the same draws as in one call
    seed : seeds the starts and the sampler
    nuts_sampler : ``"auto"`` (default: :func:`auto_sampler`), ``"nutpie"`` or ``"pymc"``
        (:data:`NUTS_SAMPLERS`). ``"nutpie"`` (:func:`pgpgm.posterior.nutpie_engine.sample_nutpie`): every
        chain a thread of this process, in coordinates whitened by the Laplace approximation of
        :func:`seed_metric` (where every value variable is a scalar), started within
        :data:`pgpgm.posterior.nutpie_engine.START_JITTER` whitened sds of ``center``, with nutpie's own
        adaptation (:data:`pgpgm.posterior.nutpie_engine.ADAPTATION`); instead of rounds, one run of up to
        ``draws * 2 ** (max_rounds - 1)`` draws per chain (``draws`` where PyMC's rounds would not run a
        second round: one chain, or fewer than ``2 * ESS_MIN`` draws in all) that ends once R-hat
        and ESS pass, the chains sit in separate modes, or the budget is spent - the same budget, result and
        warnings as ``"pymc"``. Where the draws that pass hold divergences and the budget left affords
        :data:`DIVERGENCE_RUN_COST` times that run, one more runs at :data:`TARGET_ACCEPT_MAX` (smaller steps, into
        the regions where the first diverged) and its draws replace the first's when they pass too (as PyMC's
        round for divergences does; not with ``max_rounds=1``): ``pgpgm_rounds`` = 2.
        ``tree.attrs["pgpgm_sampler"]`` names the engine that ran
    target_accept : NUTS step-size target of the first round
    max_rounds : with ``"pymc"``, run at most this many rounds of ``tune + draws`` per chain.
        After a round whose draws fail a check of :func:`pgpgm.posterior.diagnostics.problems`
        (R-hat > 1.01, ESS < 400, divergences), the next round continues every chain from
        its last draw with a fixed dense mass matrix, the covariance of the chains' draws so
        far (pooled, in the transformed space), a step-size target raised halfway to 1 but not
        above :data:`TARGET_ACCEPT_MAX` = 0.99 (fewer divergences; a target that kept climbing shrank the
        step size without bound), and ``max(tune // 2, 100)`` tuning iterations (step size only).
        Each chain alone adapts its mass matrix from its own few effective draws; pooled, the
        chains' draws cover a long ridge (the banana of Lotka-Volterra with one state
        observed) that none covers alone. A further round run because R-hat or ESS failed
        *extends* the chains: its draws are appended to those kept from the rounds before it
        (one continued Markov chain per chain, every kernel - each chain's own adapted one in
        round 1, the pooled one later - leaving the posterior invariant), and the checks judge
        all of them together, so a slowly mixing posterior accumulates ESS instead of starting
        over. Only the first round's draws are dropped when its chains have not met (max R-hat >
        :data:`RHAT_CARRY` = 1.05: draws on the way from the starts). Divergences are carried and
        counted (the warning names them); a round run because of divergences alone (R-hat and
        ESS pass) draws afresh at the raised target, and its draws replace the earlier ones only
        when they pass R-hat and ESS too. A round runs ``draws``
        to 4x ``draws`` iterations, as many as the kept draws' min ESS per draw says reach
        2 x 400 (:func:`next_round_draws`), and no more than the budget left allows. No further
        round runs when the chains sit in separate modes (:func:`pgpgm.posterior.diagnostics.find_modes`):
        a mass matrix pooled across modes fits neither; the modes are named instead.
        Default :data:`MAX_ROUNDS`.
        ``tree.attrs["pgpgm_rounds"]`` says how many rounds ran,
        ``json.loads(tree.attrs["pgpgm_round_draws"])`` the draws per chain of each round,
        ``json.loads(tree.attrs["pgpgm_kept_rounds"])`` the rounds (1 = first) whose draws the
        result holds, ``json.loads(tree.attrs["pgpgm_round_gradient_evaluations"])`` each
        round's leapfrog steps after tuning (one ODE solve with sensitivities each), and
        ``json.loads(tree.attrs["pgpgm_round_problems"])`` why further rounds ran: for every
        round followed by another, the failed checks of the draws kept up to it. Only when
        ``chains * draws >= 800`` (draws that could reach ESS 400) and ``chains > 1``. A posterior
        that converges in the first round (FitzHugh-Nagumo) costs nothing more.
    progressbar : PyMC's progress bar
    budget : a :class:`PosteriorBudget`, a number of seconds, or None (no limit: the default of
        this function; :func:`pgpgm.fit`'s default is ``PosteriorBudget()``, 60 s and 3000000
        gradient evaluations). ``json.loads(tree.attrs["pgpgm_budget"])`` records the budget, what
        was used and what ran out (``"exhausted"``: ``""``, ``"seconds"``, ``"gradient evaluations"``);
        a round the budget cut short keeps the draws it made (all chains at the length of the
        shortest; chains run one after the other (``cores=1``) each get an equal share of the budget; a round that stopped while tuning keeps the latter half of its tuning iterations,
        ``tree.attrs["pgpgm_tuning_draws"] = 1``).
    starts : (chains,) starting points, constrained values of every free variable by name, one per
        chain, instead of draws around ``center`` (e.g. chains started in several basins); PyMC's
        engine only (``"auto"`` then runs it)
    metric : the first round's mass matrix: ``"adapt"`` (default) starts from the refinement's
        covariance (see :func:`seeded_potential`) and adapts it from the chains' tuning draws (PyMC's
        windowed dense adaptation, weight 10 on the seed); ``"laplace"`` keeps that seed fixed and tunes
        the step size only, so that a short ``tune`` (e.g. 200) serves where the Laplace covariance fits
        the posterior (then with fewer gradient evaluations per effective draw; a posterior far from
        Gaussian at the optimum, e.g. one spread to a prior bound, needs ``"adapt"`` or the later rounds'
        pooled matrix)
    started : the :func:`time.perf_counter` time at which the work of this step began (e.g. before
        :func:`build_ode_model`, whose ODE solve compiles on a cold cache: 10-20 s): the budget's seconds count
        from it, but at least :data:`MIN_SAMPLING_SHARE` of them are left for sampling (default: now)
    warn : warn (:class:`~pgpgm.errors.ConvergenceWarning`) when the result fails the checks, the
        budget stopped it or the chains sit in separate modes (:func:`pgpgm.fit` passes False and
        warns once for the whole fit)
    ess : the bulk and tail ESS every variable must reach (default :data:`ESS_MIN`, 400): the chains go on
        (within the budget and ``max_rounds``) until it does. An sd's Monte Carlo error is about
        sd / sqrt(2 ESS) for a Gaussian posterior but grows with the tails' weight (kurtosis 14: ~10 % at
        ESS 400); ask for more where the sds must be sharper
    sd_error : once R-hat and ESS pass, the chains go on while some variable's sd has a Monte Carlo error
        (:func:`~pgpgm.posterior.diagnostics.sd_errors`) above this fraction of the sd (default
        :data:`~pgpgm.posterior.diagnostics.SD_ERROR`, 5 %) and the budget's :data:`SHARPEN_SHARE` (3/4)
        affords it (:class:`SharperSds`; PyMC's engine: one more round that extends the chains by the draws
        the errors ask for, as far as that share affords); a check that fails on the way ends it with the draws
        that passed. A Gaussian posterior's sds reach 5 % at ESS ~200, so only heavy tails draw more.
        ``json.loads(tree.attrs["pgpgm_sd_error"])``: the goal and each variable's error at the end. None: stop
        where R-hat and ESS pass

    Returns
    -------
    arviz DataTree with ``posterior``, ``sample_stats`` (``diverging``, ...), ``observed_data``;
    attrs as above and ``pgpgm_modes`` (JSON: a list, one entry per mode when the chains sit in
    more than one - ``chains``, ``mean`` by variable, ``log_density`` - else empty).
    """
    import os

    if nuts_sampler not in NUTS_SAMPLERS:
        raise DataError(f"nuts_sampler must be one of {NUTS_SAMPLERS}, got {nuts_sampler!r}")
    if not (isinstance(max_rounds, int | np.integer) and max_rounds >= 1):
        raise DataError(f"max_rounds must be a whole number >= 1, got {max_rounds!r}")
    if metric not in METRICS:
        raise DataError(f"metric must be one of {METRICS}, got {metric!r}")
    ess, sd_error = check_ess(ess), check_sd_error(sd_error)
    meter = BudgetMeter(PosteriorBudget.of(budget))
    if started is not None and meter.budget.seconds is not None:  # the model's building counts, up to a share
        meter.start = max(started, meter.start - (1.0 - MIN_SAMPLING_SHARE) * meter.budget.seconds)
    if cores is None:  # with a time budget every chain runs at once, so that a stop leaves all at the same length
        cores = chains if meter.budget.seconds is not None else min(chains, os.cpu_count() or 1)
    rng = np.random.default_rng(seed)
    space = ValueSpace(model)
    names = [rv.name for rv in space.rvs if rv.ndim == 0]
    common = dict(draws=draws, tune=tune, chains=chains, cores=cores, random_seed=seed, progressbar=progressbar,
                  compute_convergence_checks=False, model=model)
    if nuts_sampler == "auto":  # chains from given starts: PyMC's (nutpie starts every chain around one point)
        nuts_sampler = "pymc" if starts is not None else auto_sampler(model)
    if nuts_sampler == "nutpie" and starts is not None:
        raise DataError("starts (one point per chain) need nuts_sampler='pymc' or 'auto': nutpie starts every "
                        "chain around center")
    if nuts_sampler == "nutpie":  # a watched run until R-hat and ESS pass (one more for divergences) or the budget ends
        return _run_nutpie(model, center, sd, covariance, meter, space, names, draws=draws, tune=tune, chains=chains,
                           seed=seed, target_accept=target_accept, max_rounds=max_rounds, warn=warn, ess=ess,
                           sd_error=sd_error)
    if starts is None:
        starts = dispersed_starts(space, center, sd, chains, rng)
    else:
        free = [rv.name for rv in space.rvs]
        if len(starts) != chains or any(set(free) - set(p) for p in starts):
            raise DataError(f"starts must hold {chains} points (one per chain), each with a value of {free}")
        starts = [{n: np.asarray(p[n], float) for n in free} for p in starts]
    step = pm.NUTS(model=model, potential=seeded_potential(space, center, sd, covariance, adapt=metric == "adapt"),
                   target_accept=target_accept, max_treedepth=MAX_TREEDEPTH, logp_dlogp_func=space.logp_dlogp)
    t_round = time.perf_counter()
    tree = budgeted_sample(meter, step=step, initvals=starts, **common)
    last, last_tune, seconds = tree, tune, time.perf_counter() - t_round  # the last round and its cost
    rounds, reasons, round_draws, kept = 1, [], [tree.posterior.sizes["draw"]], [1]
    evaluations = [leapfrog_steps(tree)]
    passed = None  # (draws, kept rounds) that passed R-hat and ESS with divergences, while a round tries without
    sharpened = None  # (draws, kept rounds) that passed every check, while a round extends them for sharper sds
    while rounds < max_rounds and _may_extend(chains, draws) and not meter.exhausted:
        diag = diagnose(tree, names, ess)
        found = problems(diag)
        if find_modes(tree, names):  # more rounds would pool separate modes
            break
        worst = float(np.nanmax(diag["sd_error"].values, initial=0.0))
        if not found and (sd_error is None or not worst > sd_error or sharpened is not None):
            break  # converged (one round for sharper sds at most)
        least = float(np.nanmin(np.minimum(diag["ess_bulk"].values, diag["ess_tail"].values)))
        mixing = mixing_problems(diag)
        if found and not mixing:  # divergences only: a round at a higher target replaces these draws if it passes
            passed = (tree, kept)
        carry = not found or bool(mixing) and (rounds > 1 or bool(np.nanmax(diag["rhat"].values) <= RHAT_CARRY))
        n_kept = int(tree.posterior.sizes["draw"])
        n_draws = (next_round_draws(n_kept, least, draws, extends=carry, ess_min=ess) if found else
                   int(np.ceil(n_kept * ((worst / sd_error) ** 2 - 1))))  # the draws the sd errors ask for
        n_tune = max(tune // 2, 100)
        # what the budget left affords (for sharper sds: up to its SHARPEN_SHARE): the last round's seconds per
        # iteration (per chain) and leapfrog steps per iteration; a round that cannot reach MIN_ROUND_DRAWS
        # draws is not started
        iterations = max(int(last.sample_stats.sizes["draw"]) + last_tune, 1)
        steps = float(np.mean(last.sample_stats["n_steps"])) if "n_steps" in last.sample_stats else 1.0
        if found:
            left, grads_left = 0.9 * meter.seconds_left(), 0.9 * meter.gradients_left()
        else:
            left, grads_left = meter.share_left(SHARPEN_SHARE)
        by_time = left / max(seconds / iterations, 1e-9)
        by_gradients = grads_left / max(steps * chains, 1.0)
        affordable = min(by_time, by_gradients)
        if affordable - n_tune < min(draws, MIN_ROUND_DRAWS):
            if found:
                meter.exhausted = "seconds" if by_time <= by_gradients else "gradient evaluations"
            break
        if not found:
            sharpened = (tree, kept)
        n_draws = int(min(n_draws, affordable - n_tune))
        reasons.append(found or [f"sd errors up to {worst:.1%} (goal {sd_error:.0%})"])
        post = tree.posterior
        starts = continuing_starts(space, post)
        if found:  # (sharper sds alone: the same target)
            target_accept = max(target_accept, min(1.0 - (1.0 - target_accept) / 2, TARGET_ACCEPT_MAX))
        step = pm.NUTS(model=model, potential=QuadPotentialFull(pooled_covariance(space, post)),
                       target_accept=target_accept, max_treedepth=MAX_TREEDEPTH, logp_dlogp_func=space.logp_dlogp)
        t_round = time.perf_counter()
        more = budgeted_sample(meter, step=step, initvals=starts,
                                **{**common, "draws": n_draws, "tune": n_tune, "chains": len(starts),
                                   "random_seed": None if seed is None else seed + 1000 * rounds})
        last, last_tune, seconds = more, n_tune, time.perf_counter() - t_round
        evaluations.append(leapfrog_steps(more))
        rounds += 1
        round_draws.append(int(more.posterior.sizes["draw"]))
        if more.posterior.sizes["chain"] < post.sizes["chain"] or more.attrs.get("pgpgm_tuning_draws"):
            break  # cut short by the budget before every chain drew: the kept draws stay the result
        tree = extend_chains(tree, more) if carry else more
        kept = [*kept, rounds] if carry else [rounds]
    if passed is not None and mixing_problems(diagnose(tree, names, ess)):
        tree, kept = passed  # the round that was to remove the divergences did not pass R-hat and ESS
    if sharpened is not None:
        if problems(diagnose(tree, names, ess)) or find_modes(tree, names):
            tree, kept = sharpened  # the extension for sharper sds failed a check: the draws that passed
        meter.exhausted = ""  # a budget that ended it cut draws that had passed
    return _finish(tree, names, meter, rounds, round_draws, kept, evaluations, reasons, warn, "pymc", ess,
                   sd_error)


#: a nutpie run whose draws pass R-hat and ESS with divergences is followed by one run at
#: :data:`TARGET_ACCEPT_MAX` (PyMC's engine raises the target round by round), whose draws replace the first
#: run's when they pass too - where the budget left is at least this many times what the first run took (the
#: higher target's smaller steps cost 1.5x (0.95) to 2.6x (0.99) the leapfrog steps per draw at 0.9). Its
#: draws are worth the cost: with divergences the draws at the adapted step size stop short of a tail that
#: narrows along a ridge, and a posterior sd can come out 10-30 % below an independent reference's, the
#: less the higher the target and the fewer the divergences
DIVERGENCE_RUN_COST = 3.0


def _run_nutpie(model, center, sd, covariance, meter: BudgetMeter, space: ValueSpace, names: list[str], *,
                draws: int, tune: int, chains: int, seed: int | None, target_accept: float, max_rounds: int,
                warn: bool, ess: float, sd_error: float | None) -> NUTSRun:
    """:func:`run_nuts` with nutpie (its ``nuts_sampler="nutpie"``): one run until the draws pass R-hat and ESS
    (and then on while :class:`SharperSds` says so), the chains sit in separate modes or the budget is spent;
    then, where the draws that passed hold divergences and the budget affords it (:data:`DIVERGENCE_RUN_COST`),
    one more at :data:`TARGET_ACCEPT_MAX` whose draws replace them when they pass too."""
    start = {n: np.asarray(v, float) for n, v in center.items() if n in {rv.name for rv in space.rvs}}
    before = [0]  # gradient evaluations of the runs before this one

    def spent(steps: int, ahead: float = 0.0) -> bool:
        meter.gradients = before[0] + steps
        return bool(meter.check(ahead))

    last = {}  # the last check's draws and their diagnosis (read by converged and then by SharperSds)

    def diagnosed(so_far) -> xr.Dataset:
        if last.get("tree") is not so_far:
            last.update(tree=so_far, diag=diagnose(so_far, names, ess))
        return last["diag"]

    def converged(so_far) -> bool:
        return not mixing_problems(diagnosed(so_far)) or bool(find_modes(so_far, names))

    whiten = None
    if _scalar_values(model):  # the Laplace approximation whitens nutpie's coordinates
        mean, matrix, _ = seed_metric(space, center, sd, covariance)
        whiten = (mean, matrix)
    extends = _may_extend(chains, draws)  # more draws than asked for only where PyMC's rounds would run them

    def run(accept: float, seed_: int | None):
        t0 = time.perf_counter()
        # draws with divergences are followed by a run at TARGET_ACCEPT_MAX that replaces them: not sharpened
        sharper = None if sd_error is None or not extends else SharperSds(
            meter, sd_error, diagnosed=diagnosed, stop_at_divergences=lambda: (accept < TARGET_ACCEPT_MAX and max_rounds > 1
                                         and affords_rerun(time.perf_counter() - t0)))
        tree = sample_nutpie(model, start, draws=draws, tune=tune, chains=chains, seed=seed_,
                             target_accept=accept, max_treedepth=MAX_TREEDEPTH,
                             max_draws=draws * 2 ** (max_rounds - 1) if extends else draws, spent=spent,
                             converged=converged, whiten=whiten, seconds_left=meter.seconds_left, watched=names,
                             extend=sharper)
        if sharper is not None and sharper.went_on and meter.exhausted and "posterior" in tree.children \
                and not mixing_problems(diagnose(tree, names, ess)):
            meter.exhausted = ""  # the budget ended a run past draws that passed, which it returned
        return kept_draws(tree, stopped=bool(meter.exhausted)), time.perf_counter() - t0  # stopped tuning: half

    def affords_rerun(seconds: float) -> bool:  # a run at TARGET_ACCEPT_MAX after one of these seconds
        return (not meter.exhausted and meter.seconds_left() >= DIVERGENCE_RUN_COST * seconds
                and meter.gradients_left() >= DIVERGENCE_RUN_COST * meter.gradients)

    tree, seconds = run(target_accept, seed)
    n = int(tree.posterior.sizes["draw"])
    diag = diagnose(tree, names, ess)
    found = problems(diag)
    divergences_alone = bool(found) and not mixing_problems(diag) and not find_modes(tree, names)
    if not (divergences_alone and affords_rerun(seconds) and target_accept < TARGET_ACCEPT_MAX and max_rounds > 1):
        return _finish(tree, names, meter, 1, [n], [1], [meter.gradients], [], warn, "nutpie", ess, sd_error)
    before[0] = first = meter.gradients
    again, _ = run(TARGET_ACCEPT_MAX, None if seed is None else seed + 1000)
    n_again = int(again.posterior.sizes["draw"])
    passes = not meter.exhausted and not mixing_problems(diagnose(again, names, ess)) and not find_modes(again, names)
    if not passes:  # the first run's draws, which passed R-hat and ESS, are the result: a budget that cut the run
        meter.exhausted = ""  # at the higher target did not cut them (their warning names the divergences)
    return _finish(again if passes else tree, names, meter, 2, [n, n_again], [2] if passes else [1],
                   [first, meter.gradients - first], [found], warn, "nutpie", ess, sd_error)


class SharperSds:
    """Whether a run whose draws passed R-hat and ESS goes on to its next check: while some variable's sd has
    a Monte Carlo error above ``sd_error`` of the sd (:func:`~pgpgm.posterior.diagnostics.sd_errors`) and
    the budget's :data:`SHARPEN_SHARE` affords reaching that check at the pace of the draws so far. Draws with
    divergences are not sharpened where ``stop_at_divergences()`` (a run at a higher target will replace them); a
    check that fails (``None``) after one passed goes on while affordable; draws that passed as separate modes
    end it (``diagnosed``: the draws' :func:`~pgpgm.posterior.diagnostics.diagnose`, cached by the caller),
    the draws of the last check that passed being kept. The extension's end depends on the machine's speed
    only where the budget ends it. The :func:`~pgpgm.posterior.nutpie_engine.sample_nutpie` ``extend``
    callable."""

    def __init__(self, meter: BudgetMeter, sd_error: float, *, stop_at_divergences: Callable[[], bool],
                 diagnosed: Callable[[Any], xr.Dataset]):
        self.meter, self.sd_error = meter, float(sd_error)
        self.stop_at_divergences, self.diagnosed = stop_at_divergences, diagnosed
        self.last: tuple[float, int, int] | None = None  # (seconds, gradient evaluations, draws) at the last call
        self.went_on = False  # whether it went on past draws that passed

    def __call__(self, so_far, at: int, following: int) -> bool:
        now, grads = self.meter.elapsed(), self.meter.gradients
        # the pace since the last call (the first: none known - the run's time holds its compilation - so it
        # goes on to the next check, GROWTH^(1/2) ~ 1.12x the draws, where the pace is measured)
        pace = (0.0, 0.0) if self.last is None else (
            (now - self.last[0]) / max(at - self.last[2], 1), (grads - self.last[1]) / max(at - self.last[2], 1))
        self.last = (now, grads, at)
        if so_far is not None:
            diag = self.diagnosed(so_far)
            if mixing_problems(diag):
                return False  # passed as separate modes: named, not sharpened
            if not np.nanmax(diag["sd_error"].values, initial=0.0) > self.sd_error:
                return False
            if diag.attrs["divergences"] and self.stop_at_divergences():
                return False
        ahead, (seconds_left, gradients_left) = following - at, self.meter.share_left(SHARPEN_SHARE)
        affords = pace[0] * ahead <= seconds_left and pace[1] * ahead <= gradients_left
        self.went_on = self.went_on or affords
        return affords


@dataclass(frozen=True)
class NUTSRun:
    """Step 4's outcome: the draws, and how the rounds went.

    tree : the posterior (see :func:`sample_posterior`); rounds : how many NUTS rounds ran;
    round_draws : (rounds,) draws per chain of each; kept : the rounds (1 = first) whose draws
    ``tree`` holds; gradient_evaluations : (rounds,) each round's; problems : why each further round
    ran (the failed checks of :func:`~pgpgm.posterior.diagnostics.problems`); budget : what the
    :class:`PosteriorBudget` allowed and what was used (:meth:`BudgetMeter.record`); modes : the
    separate modes the chains sit in (:func:`~pgpgm.posterior.diagnostics.find_modes`; empty for one).
    The same facts are in ``tree.attrs`` (``pgpgm_rounds`` ...) so that a saved result keeps them.
    """

    tree: Any
    rounds: int
    round_draws: tuple[int, ...]
    kept: tuple[int, ...]
    gradient_evaluations: tuple[int, ...]
    problems: tuple
    budget: Mapping
    modes: tuple[Mode, ...]


def _finish(tree, names, meter: BudgetMeter, rounds, round_draws, kept, evaluations, reasons, warn: bool,
            engine: str, ess: float, sd_error: float | None) -> NUTSRun:
    """The :class:`NUTSRun`, its facts also recorded in ``tree.attrs``; warns when asked."""
    modes = find_modes(tree, names)
    drawn = "posterior" in tree.children and tree.posterior.sizes.get("draw", 0) > 3
    diag = diagnose(tree, names, ess) if drawn or warn else None
    errors = diag["sd_error"].values if drawn else np.full(len(names), np.nan)
    tree.attrs["pgpgm_sd_error"] = json.dumps({"goal": sd_error, "errors": dict(zip(names, map(float, errors)))})
    tree.attrs["pgpgm_sampler"] = engine
    tree.attrs["pgpgm_rounds"] = rounds
    tree.attrs["pgpgm_round_draws"] = json.dumps(round_draws)
    tree.attrs["pgpgm_kept_rounds"] = json.dumps(kept)
    tree.attrs["pgpgm_round_gradient_evaluations"] = json.dumps(evaluations)
    tree.attrs["pgpgm_round_problems"] = json.dumps(reasons)
    tree.attrs["pgpgm_budget"] = json.dumps(meter.record())
    tree.attrs["pgpgm_modes"] = json.dumps([m.record() for m in modes])
    if warn:
        warn_if_unconverged(diag, "NUTS", notes=posterior_notes(tree), stacklevel=4)
        if not mixing_problems(diag):
            warn_if_imprecise(tree, stacklevel=4)
    return NUTSRun(tree, rounds, tuple(round_draws), tuple(kept), tuple(map(int, evaluations)), tuple(reasons),
                   meter.record(), tuple(modes))


def sample_posterior(model, center, sd, **kwargs):
    """NUTS on ``model`` from around ``center``: the draws of :func:`run_nuts`, which takes the same
    arguments (an ArviZ DataTree; its ``Returns``)."""
    return run_nuts(model, center, sd, **kwargs).tree


sample_posterior.__signature__ = inspect.signature(run_nuts)


#: a further round aims at this multiple of ESS_MIN: R-hat and ESS are themselves noisy near the
#: thresholds: a round aimed at ESS_MIN itself can fail R-hat <= 1.01 or tail ESS >= 400 by chance, just
#: above or below, several times in a row
ROUND_ESS_MARGIN = 2.0


def next_round_draws(last_draws: int, last_ess: float, draws: int, extends: bool = False,
                     ess_min: float = ESS_MIN) -> int:
    """Draws per chain of a further round of :func:`sample_posterior`: the min ESS per draw of the
    last ``last_draws`` draws per chain carried to ``ROUND_ESS_MARGIN x ess_min`` - less those
    draws when the round ``extends`` them (a round after the second whose kept draws have no
    divergence) - between ``draws`` and
    ``4 * draws`` (a long round that fails by a single divergence can be followed by one of just
    ``draws``, which then falls short of the ESS)."""
    want = last_draws * ROUND_ESS_MARGIN * ess_min / max(float(last_ess), 1.0) - (last_draws if extends else 0)
    return int(np.ceil(np.clip(want, draws, 4 * draws * max(ess_min / ESS_MIN, 1.0))))



"""The report: diagnostics and warnings (convergence, bounds, competing optima), then the :class:`~pgpgm.fit_result.FitResult`."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from ..errors import BoundWarning, CompetingOptimaWarning, ConvergenceWarning
from ..fit_result import FitResult, assemble
from ..posterior.diagnostics import (
    causes_of_poor_mixing,
    diagnose,
    mixing_problems,
    posterior_notes,
    warn_if_imprecise,
    warn_if_unconverged,
)
from ..posterior.model import initial_value_name
from ..refinement.bounds import bound_report, outside_prior_boxes, warn_at_bounds
from ..refinement.optima import describe
from ..solve import default_solver
from ..petab_result import PetabResult, petab_estimates
from ..study_result import StudyResult
from .match import Matched
from .options import NUTS, FitOptions, Laplace
from .posterior import DENSE_POINTS, STUDY_DENSE_POINTS, Posterior
from .prepare import PetabDesign, Prepared, StudyDesign
from .refine import INSIDE_BOXES, PetabRefined, Refined, StudyRefined, unknown_x0_priors


def add_observables(result: FitResult, prepared: Prepared, refined: Refined) -> None:
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


def report(prepared: Prepared, matched: Matched | None, refined: Refined, post: Posterior, options: FitOptions,
           timings: dict, started: float) -> FitResult:
    """Diagnostics and warnings (convergence, bounds, competing optima), then the :class:`FitResult`
    (:func:`pgpgm.fit_result.assemble`; ``timings["total"]``: seconds since ``started``, the fit's start), on the
    data's own scale."""
    timings["total"] = time.perf_counter() - started
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
        nuts = isinstance(spec, NUTS)
        warn_about_posterior(diagnostics["posterior" if nuts else "gradient_matching"], post.tree,
                             "NUTS" if nuts else "gradient-matching" + (
                                 " (its chains stopped early, stop='agree'; stop='never' runs them to the end)"
                                 if run.stopped else ""),
                             nuts=nuts, undetermined=refined.best.undetermined, at_bounds=at_bounds, stacklevel=4)
    warn_at_bounds(at_bounds, stacklevel=4)
    if INSIDE_BOXES in refined.starts:  # unknown initial values the data put outside their boxes: held there
        best = refined.best
        free = min((r for r in refined.refinements if np.isfinite(r.nll)), key=lambda r: r.nll)
        x0_priors = unknown_x0_priors(refined, matched.density if matched is not None else None)
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
        true_theta = simulated_truth(data.attrs, prepared.full.parameters)
    x0_true = (np.asarray(data.attrs["x0"], float) if isinstance(data, xr.Dataset) and "x0" in data.attrs
               else refined.x0_sampled)
    solves = {"sampling": matched.n_solves if matched is not None else 0,
              "refinement": sum(r.n_solves for r in refined.refinements), "posterior": post.solves}
    stopping = ((run.stopped, run.reason, list(run.iterations)) if run is not None else
                (False, f"no state measured directly or as a * state + c: steps 1-2 skipped, step 3 from "
                 f"{len(refined.starts)} starts spread over the prior box", []))
    result = assemble(full=prepared.full, system=system, obs=prepared.obs, fixed=prepared.fixed,
                    tree=run.tree if run is not None else None,
                    main=post.tree, has_posterior=spec is not None, theta_sampled=refined.theta_sampled,
                    x0_sampled=refined.x0_sampled, best=refined.best, refinements=refined.refinements,
                    starts=tuple(refined.starts), unknown=refined.unknown, at_bounds=at_bounds,
                    stopping=stopping,
                    noise_given=(options.noise_sd is not None if prepared.noise is None
                                 else not refined.best.noise_estimated.any()),
                    noise_gp=matched.density.noise_sd if prepared.observables is None else refined.noise_start,
                    true_theta=true_theta, x0_true=x0_true,
                    solver=refined.problem.integrator.solver, dense_points=DENSE_POINTS, timings=timings, solves=solves,
                    diagnostics=diagnostics, competing=refined.competing)
    if prepared.observables is not None:
        add_observables(result, prepared, refined)
    if prepared.noise is not None:  # which likelihood, and what noise_sd holds per state
        plan = prepared.noise
        result.estimates.attrs["noise"] = json.dumps(dict(zip(prepared.obs.states, plan.names)))
        result.trajectories["noise_sd"].attrs["parameter"] = "; ".join(
            f"{s}: {n} " + {"normal": "sd (state units)", "lognormal": "sd of log y", "negbin": "alpha",
                            "poisson": "none (1)"}[n] for s, n in zip(prepared.obs.states, plan.names))
    return result if prepared.scales is None else prepared.scales.back(result)  # on the original scale


def warn_about_posterior(diag, tree, label: str, *, nuts: bool, undetermined, at_bounds, stacklevel: int) -> None:
    """The warnings on a posterior, a fit's and a study's in one order: not converged (R-hat, ESS, divergences:
    a :class:`~pgpgm.errors.ConvergenceWarning`) with its notes - for NUTS the budget that stopped it and separate
    modes, and where it mixes poorly the parameters the data leave open (``undetermined``) or that sit on a bound
    (``at_bounds``) - or else, for NUTS, sds known less precisely than asked (a PrecisionWarning). ``diag``: the
    draws' :func:`~pgpgm.posterior.diagnostics.diagnose`; ``stacklevel``: the caller's, as for
    :func:`warnings.warn`."""
    notes = posterior_notes(tree) if nuts else []
    if nuts and mixing_problems(diag):
        notes += causes_of_poor_mixing(undetermined, at_bounds)
    warn_if_unconverged(diag, label, notes=notes, stacklevel=stacklevel + 1)
    if nuts and not mixing_problems(diag):
        warn_if_imprecise(tree, label, stacklevel=stacklevel + 1)


def simulated_truth(attrs: Mapping, parameters: Sequence[str]) -> np.ndarray | None:
    """(P,) the parameters' true values from :func:`pgpgm.simulate`'s ``attrs`` (``theta`` by ``parameters``,
    the simulated system's names), in the order of ``parameters`` (the fitted system's); None where the data
    were simulated with parameters other than these (e.g. a system with some of them fixed: no truth to show)."""
    theta = np.asarray(attrs["theta"], float).reshape(-1)
    names = list(attrs.get("parameters", parameters))
    if len(names) != theta.size or set(names) != set(parameters):
        return None
    return np.array([theta[names.index(p)] for p in parameters])


# ----------------------------------------------------------------------------- studies
def report_study(design: StudyDesign, fits: Sequence[FitResult], refined: StudyRefined, post: Posterior | None,
                 options: FitOptions, timings: dict) -> StudyResult:
    """A study's warnings (the posterior's, as a fit's: :func:`warn_about_posterior`), then the
    :class:`~pgpgm.study_result.StudyResult`."""
    best, diag = refined.best, None
    if post is not None:
        diag = diagnose(post.tree, list(post.free), options.posterior.ess)
        warn_about_posterior(diag, post.tree, "NUTS (study)", nuts=True, at_bounds=(), stacklevel=4,
                             undetermined=[n for n, se in zip(best.names, best.stderr) if not np.isfinite(se)])
    solves = {"steps 1-3 per experiment": int(sum(sum(r.n_ode_solves.values()) for r in fits)),
              "separate refinement": int(sum(s.n_solves for s in refined.separate)),
              "joint refinement": int(sum(r.n_solves for r in refined.refinements.values()))}
    return StudyResult.assemble(system=design.system, names=design.study.names, observations=design.observations,
                                fits=tuple(fits), separate=refined.separate, joint=best,
                                refinements=refined.refinements, layout=refined.layout,
                                hierarchical=design.hierarchical, varying=design.varying,
                                tree=None if post is None else post.tree, model=None if post is None else post.model,
                                diagnostics=diag, solver=options.solver or default_solver(),
                                dense_points=STUDY_DENSE_POINTS, timings=timings, n_ode_solves=solves)


def warn_competing_experiments(names: Sequence[str], fits: Sequence[FitResult]) -> None:
    """One :class:`CompetingOptimaWarning` for the experiments whose own fit found another optimum as good
    as its refined point (``FitResult.competing_optima``): which experiments, and which parameters appear
    exchanged there."""
    hit = [(n, r.competing_optima) for n, r in zip(names, fits) if not r.competing_optima.empty]
    if not hit:
        return
    swaps = sorted({x for _, table in hit for x in table["exchanged"] if x})
    what = (f"with {' or '.join(swaps)} exchanged" if swaps else "at another point")
    warnings.warn(f"in {len(hit)} of {len(fits)} experiments ({', '.join(n for n, _ in hit)}) the data fit about as "
                  f"well {what} as at the experiment's refined point: each experiment's estimate, the joint fit and "
                  "step 4 describe one of the optima, and experiments may sit on different ones; narrow the prior "
                  "box to the branch you mean (pgpgm.fit on one experiment lists them in result.competing_optima)",
                  CompetingOptimaWarning, stacklevel=3)


# ----------------------------------------------------------------------------- PEtab problems
def report_petab(design: PetabDesign, refined: PetabRefined, post: Posterior | None, options: FitOptions,
                 timings: dict, started: float) -> PetabResult:
    """A PEtab fit's warnings (the posterior's, as a fit's; the search's when it stopped at its budget before
    enough starts agreed), then the :class:`~pgpgm.petab_result.PetabResult`."""
    timings["total"] = time.perf_counter() - started
    found, diag = refined.search, None
    if found.reason != "agreed":
        warnings.warn(f"the multi-start search stopped at its budget ({found.reason}) after {len(found.nlls)} starts, "
                      f"{found.agreeing} of which reached the best nll {found.nll:.6g} (it asks for "
                      f"{design.search.agree}): the optimum may not be the global one; give the search more starts "
                      "or seconds (pgpgm.MultiStart(max_starts=..., seconds=...))", ConvergenceWarning, stacklevel=3)
    if post is not None and isinstance(options.posterior, NUTS):
        diag = diagnose(post.tree, list(post.free), options.posterior.ess)
        names = [p.id for p in design.problem.estimated]
        warn_about_posterior(diag, post.tree, "NUTS", nuts=True, at_bounds=(), stacklevel=4,
                             undetermined=[n for n, se in zip(names, refined.stderr) if not np.isfinite(se)])
    tree = None if post is None else post.tree
    return PetabResult(design.problem, petab_estimates(design.problem, found, refined.stderr, tree), found, tree,
                       diag, dict(timings))

"""When the gradient-matching chains may stop: they have found the basin.

Step 2 exists to start the least-squares refinement (step 3) in the right basin. A stop
rule looks at the chains every ``check_every`` iterations (from ``min_iterations`` on,
tuning iterations included) through one :class:`Checkpoint` per chain - the mean of the
latter half of the chain so far - and returns a :class:`Decision`.

:class:`RefinedAgreement` (``stop="agree"``, :func:`pgpgm.fit`'s default) refines every
chain's mean by least squares (:func:`pgpgm.refine`, the code of step 3) and stops once
the best refined negative log likelihood has not dropped by more than ``tol`` for one
check interval while every chain's refinement reaches it (all chains found the same
optimum), or for ``patience`` intervals while they differ (a chain held in a worse mode of
the gradient-matching density: the full budget would refine from every chain and keep
the same best). The best is that of every check so far: an optimum a chain's mean was
refined to is kept when the chain leaves it for a worse mode of the gradient-matching
density (:meth:`RefinedAgreement._kept`), and step 3 starts from it. Before those checks,
one probe (``probe_at``, 50 iterations) can stop the chains on other evidence than
settling: every chain's mean and least squares from ``probe_agree`` (2) points spread over
the prior box (the box search below; up to ``probe_starts`` points, one at a time) refine
to the same optimum, none better, and it fits the data and lies on no bound - starts from
different regions agree. A probe that does not stop the chains leaves the checks from
``min_iterations`` on as they are without it (its box points stay searched, its chains'
best optimum kept).

Agreement is not evidence of the data's basin in two cases, which hold the chains:

- **The optimum fits the data worse than the GPs do.** Each observed state's residual sd
  at the best optimum, sqrt(RSS_k / N_k), is compared with its noise level: the sd the user
  gave, or else the larger of the GP's estimate and a model-free one from the measurements
  alone (:meth:`pgpgm.data.Observations.difference_noise_sd`; a GP on a few points can take
  noise for signal and estimate a noise sd several times too small). The chains may stop
  early only while every ratio is at most ``fit_ratio`` (default 2). Chains still travelling
  through the box can refine to a wrong optimum at two checks in a row, both agreeing on it;
  such an optimum leaves residuals several times the noise level, where the data's optimum
  leaves a ratio near 1.
- **The optimum lies on a bound of a Uniform prior** (:func:`pgpgm.refinement.bounds.bound_report`):
  chains started apart can sit together in a mode against the box for thousands of
  iterations before they find the data's optimum, their means refining to a point on the
  bound far worse than the optimum at every check.

While the best is held, the chains' means are refined at growing intervals, and each such
check also refines least squares from new points spread over the prior box (a scrambled
Sobol sequence, two per 50 iterations run; ``box_starts``): a multi-start beside the chains,
whose best competes with theirs. A held optimum stops the chains once that box search has
refined ``box_release`` (20) points without finding a better one - chains and multi-start
agree that the box holds nothing better (an optimum that really lies on a bound; a model
that fits less well than a GP can, as on real data) - or else at the whole budget.

Chains that would stop apart (the best settled for ``patience`` checks while their means refine
to different optima) where another chain's optimum fits the data too (residual ratios within
``fit_ratio``) are evidence of several candidate optima, not of the data's one: before they stop,
least squares runs from the ``screen_starts`` (16) next of ``screen_points`` (256) box points ranked
by the gradient-matching density itself (at the GPs' means: one latent solve per point). A better
optimum found there resets the settling count and the chains go on; otherwise they stop. The
density is the method's cheap proxy of the likelihood: ranking by it concentrates the few starts
where the data's optimum lies, so that an optimum that random least-squares starts reach only rarely
(a wide box, sparse noisy data) is still found by a handful of ranked ones.

``stop="never"`` runs the whole budget (``tune + draws``), as published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar, NamedTuple

import numpy as np
from scipy.stats import qmc

from ..errors import DataError
from ..refinement.bounds import bound_report
from ..refinement.least_squares import SEARCH_FAILURES, SHORT_NFEV, LeastSquaresProblem, failed_refinement, refine
from ..solve import Integrator
from .density import GradientMatchingDensity
from .stop import Checkpoint, Decision
from .target import GradientMatchingTarget

#: the noise sds' relative tolerance of the rule's refinements when several observed states' sds are
#: estimated (their alternation's rounds; :func:`pgpgm.refine`'s ``noise_rtol``, 1e-7); None: refine's own.
#: The rule compares optima to ``tol`` nats, which an sd off by d relative moves by about N d^2; step 3
#: refines from the rule's best to refine's tolerance. With one observed state the alternation ends at its
#: second round anyway (left as it was). Against 1e-7, fits with 2-4 observed states stop at the same
#: optima and iterations with the rule's time about 0.8x and the fit's CPU about 0.9x.
RULE_NOISE_RTOL: float | None = 1e-4


class Standing(NamedTuple):
    """Where the best optimum stands at one check (:meth:`RefinedAgreement.decide`): its negative log
    likelihood, unknowns (Q,), residual ratios (M,) and the states it fits poorly (in words); whether the chains'
    refinements reach it and agree; the checks it has held and the checks it must hold (inf: it cannot stop the
    chains yet); the prior bounds it lies on (in words); whether the box search is done; why it holds the chains."""

    nll: float
    q: tuple[float, ...]
    ratio: np.ndarray
    poor: list[str]
    from_chains: bool
    agree: bool
    settled: int
    need: float
    at_bound: list[str]
    searched: bool
    held: list[str]


@dataclass(frozen=True, eq=False)
class RefinedAgreement:
    """Stop when the best least-squares optimum refined from the chains' means has settled.

    Parameters
    ----------
    density : the gradient-matching density (data, observed states, noise sds, x0)
    integrator : the ODE solves of the refinements (the density's system at the data's times)
    bounds : (P, 2) bounds of theta for the refinement (the uniform priors' support) or None
    refine_x0 : refine the observed states' initial values too (started at the chain's mean)
    held_x0 : (state index, value) pairs: observed states whose initial value is known, held in every
        refinement (:func:`pgpgm.fit` passes those its ``x0`` gives)
    estimate_noise : estimate the noise sds with theta (as :func:`pgpgm.fit` does when
        no ``noise_sd`` is given)
    tol : nats; the chains agree when their refined negative log likelihoods are within
        ``tol`` of the best, and the best has settled when it dropped by at most ``tol``
    check_every : iterations between checks
    min_iterations : iterations before the first check
    patience : checks the best must stay settled while the chains disagree
    bound_patience : checks the best must stay settled when it lies on a bound of a Uniform
        prior (:func:`pgpgm.refinement.bounds.bound_report`), whether the chains agree or not; None
        (default): such an optimum does not stop the chains early until the box search
        (``box_starts``, ``box_release``) has found no better one, and while it lies there the
        chains' means are refined at growing intervals (``bound_growth``), not at every check
    bound_growth : while the best lies on a bound (and ``bound_patience`` is None) or fits
        poorly (``fit_ratio``), the chains are refined again at the first check once they
        have run ``1 + bound_growth`` times as long as at the last refinement (default 0.5:
        at 150 iterations, then 250, 400, 600, 900, ...); 0 refines at every check
    fit_ratio : the chains stop early only when every observed state's residual sd at the
        best refined optimum, sqrt(RSS_k / N_k), is at most ``fit_ratio`` times its noise
        level (:meth:`noise_level`); None switches the check off
    box_starts : while the best optimum fits poorly (``fit_ratio``) or lies on a bound of a
        Uniform prior, every refinement check also refines least squares from this many new
        points per ``check_every`` iterations run since the last refinement (at least one),
        spread over the Uniform priors' box
        (a scrambled Sobol sequence seeded by ``seed``; the observed states' initial values at
        the GPs' means); the best of them competes with the chains' optima. A chain held in a
        wrong mode of the gradient-matching density for the whole budget (as in a wide prior
        box) then still ends at the data's optimum. 0, or priors that are not all Uniform,
        switch it off
    box_release : an optimum held on a bound or by a poor fit may stop the chains (after
        ``patience`` settled checks) once the box search has refined this many points without
        finding a better one: chains and a multi-start agree that the data have no better
        optimum in the box (an optimum that really lies on a bound; a model that fits the data
        less well than a GP can, as on real data)
    seed : seeds the box points
    probe_at : an early check (below ``min_iterations``; None: none), a probe: the chains' means
        are refined (a short refinement first, as the box search's: a chain that does not fit the
        data after it rules the stop out), and when they agree on an optimum that fits the data (``fit_ratio``) and lies
        on no prior bound, least squares also from points spread over the prior box (the box
        search's first points, each refined fully where a short refinement fits the data), one at a time
        until ``probe_agree`` reach that
        optimum (within ``tol``) or one a better one, at most ``probe_starts``. The chains stop there
        when ``probe_agree`` dispersed starts reach the chains' optimum and none found a better one:
        independent starts agree. Otherwise the probe is forgotten by the settling count (its box
        points stay searched, its chains' best optimum is kept) and the rule goes on from
        ``min_iterations`` as without it
    probe_starts : most dispersed least-squares starts of the probe (0 switches the probe off, as do
        priors that are not all finite Uniform ones: no box to spread them over)
    probe_agree : dispersed starts that must reach the chains' optimum for the probe to stop them
        (default 2: where a worse optimum draws most box starts, a single start that reaches it can
        confirm chains that agree on it; a second start lowers that risk and, where the probe stops,
        costs a few per cent more CPU)
    screen_points : box points (a scrambled Sobol sequence of their own) ranked by the gradient-matching
        log density with the observed states at the GPs' means (:attr:`screened_points`); 0, or priors
        that are not all finite Uniform ones, switch the ranked search off
    screen_starts : ranked points refined (best first, as the box search refines its points) each time the
        chains would stop while their means refine to different optima and one other than the best fits
        the data (``fit_ratio``; a chain held in a mode that does not fit costs no search); a better
        optimum among them keeps the chains going. 0 switches it off

    The defaults - first check at 100 iterations, then every 50, so a stop at 150 at the
    earliest - leave the chains time to leave a local optimum: chains can sit together in
    one for their first 50-100 iterations and agree there, so one check would not do, and
    checks every 25 from 25 on stop some fits in a wrong optimum. Checks every 50 from 100 on
    reach the optimum that checks every 100 reach, at 0.8-0.9x the CPU time. The probe at 50
    therefore needs more than one check's agreement of the chains (a dispersed least-squares
    start reaching their optimum, its fit, no bound); with it about half of fits stop at
    about half their CPU time, at the same optimum, and fits it does not stop cost the same.
    """

    density: GradientMatchingDensity
    integrator: Integrator
    bounds: np.ndarray | None = None
    refine_x0: bool = True
    estimate_noise: bool = True
    tol: float = 0.01
    check_every: int = 50
    min_iterations: int = 100
    patience: int = 2
    bound_patience: int | None = None
    bound_growth: float = 0.5
    fit_ratio: float | None = 2.0
    box_starts: float = 2.0
    box_release: int = 20
    seed: int = 0
    probe_at: int | None = 50
    probe_starts: int = 4
    probe_agree: int = 2
    screen_points: int = 256
    screen_starts: int = 16
    held_x0: tuple[tuple[int, float], ...] = ()
    name: ClassVar[str] = "agree"

    def __post_init__(self):
        counts = (self.check_every, self.min_iterations, self.patience) + (
            () if self.bound_patience is None else (self.bound_patience,))
        if not (self.tol > 0 and self.bound_growth >= 0 and all(int(v) == v >= 1 for v in counts)):
            raise DataError(f"tol > 0, bound_growth >= 0 and positive whole check_every, min_iterations, patience, "
                            f"bound_patience are required, got {self.tol}, {self.bound_growth}, {self.check_every}, "
                            f"{self.min_iterations}, {self.patience}, {self.bound_patience}")
        if not (np.isfinite(self.box_starts) and self.box_starts >= 0
                and int(self.box_release) == self.box_release >= 0):
            raise DataError(f"box_starts must be a number >= 0 and box_release a whole number >= 0, got "
                            f"{self.box_starts!r}, {self.box_release!r}")
        if self.probe_at is not None and not (int(self.probe_at) == self.probe_at and 1 <= self.probe_at
                                              < self.min_iterations):
            raise DataError(f"probe_at must be None or a whole number from 1 to min_iterations - 1 "
                            f"({self.min_iterations - 1}), got {self.probe_at!r}")
        if not int(self.probe_starts) == self.probe_starts >= 0:
            raise DataError(f"probe_starts must be a whole number >= 0, got {self.probe_starts!r}")
        if not all(int(v) == v >= 0 for v in (self.screen_points, self.screen_starts)):
            raise DataError(f"screen_points and screen_starts must be whole numbers >= 0, got {self.screen_points!r}, "
                            f"{self.screen_starts!r}")
        if not int(self.probe_agree) == self.probe_agree >= 1:
            raise DataError(f"probe_agree must be a whole number >= 1, got {self.probe_agree!r}")
        if self.fit_ratio is not None and not (np.isfinite(self.fit_ratio) and self.fit_ratio >= 1):
            raise DataError(f"fit_ratio must be a number >= 1 (residual sd over the GP's noise sd) or None, "
                            f"got {self.fit_ratio!r}")

    @classmethod
    def for_density(cls, density: GradientMatchingDensity, **kwargs) -> RefinedAgreement:
        """The rule on ``density`` with its defaults: the density's latent-state integrator (or one on
        the data's times), the Uniform priors' bounds, noise sds estimated; ``kwargs`` as the class."""
        integrator = density.integrator or Integrator(density.system, density.obs.times)
        return cls(density, integrator, density.priors.refinement_bounds, **kwargs)

    def problem(self, x0: np.ndarray) -> LeastSquaresProblem:
        """The least-squares problem of step 3 started at the initial state ``x0`` (S,): the
        observed states' initial values free when ``refine_x0`` (but those ``held_x0`` gives, (state index,
        known value) pairs: held at their values), unknown latent ones always."""
        d = self.density
        held = dict(self.held_x0)
        free = tuple(i for i in (d.observed_idx if self.refine_x0 else ()) + d.unknown_x0_idx if i not in held)
        x0 = np.array(x0, float)
        x0[list(held)] = list(held.values())
        return LeastSquaresProblem(self.integrator, d.obs.values, d.observed_idx, d.noise_sd, x0, free_x0=free)

    def next_refinement(self, refined_at: int) -> int:
        """The first check at which held chains (an optimum on a prior bound or fitting poorly)
        are refined again after a refinement at ``refined_at``: the first on the check grid once
        they have run ``bound_growth`` as long again."""
        due = refined_at + max(self.check_every, int(np.ceil(self.bound_growth * refined_at)))
        return self.min_iterations + -(-(due - self.min_iterations) // self.check_every) * self.check_every

    @property
    def first_checks(self) -> tuple[int, ...]:
        """Checks before ``min_iterations`` (the probe's, when it is on); the driver adds them to its grid."""
        return () if self.probe_at is None or self.probe_starts == 0 or self.box() is None else (int(self.probe_at),)

    def decide(self, checkpoints: Sequence[Checkpoint], previous: Decision | None) -> Decision:
        it = checkpoints[0].iteration
        if it < self.min_iterations:
            return self._probe(checkpoints, previous)
        if previous is not None and previous.iteration < self.min_iterations:
            # after the probe: its box points stay searched and its chains' best optimum is kept; its verdict
            # counts for nothing else
            kept = self._kept(previous)
            previous = Decision(previous.iteration, False, "", box_nll=previous.box_nll, box_q=previous.box_q,
                                box_starts=previous.box_starts, box_fit_ratio=previous.box_fit_ratio,
                                kept_nll=kept[0], kept_q=kept[1], kept_fit_ratio=kept[2], screened=previous.screened)
            fresh = True
        else:
            fresh = previous is None
        if previous is not None and previous.held and it < self.next_refinement(previous.refined_at):
            # held (on a bound, or a poor fit), which never stops the chains: look again once they have run longer
            return replace(previous, iteration=it, stop=False, reason=(
                f"not refined here: the best refined optimum (negative log likelihood {previous.best_nll:.6g}, "
                f"at {previous.refined_at} iterations) {'; '.join(previous.held)}; "
                f"the chains go on and are refined again at {self.next_refinement(previous.refined_at)} iterations"))
        problems = [self.problem(c.x0) for c in checkpoints]
        refs = [self._refine(pr, np.concatenate([c.theta, pr.x0[list(pr.free_x0)]]), self.bounds,
                       estimate_noise=self.estimate_noise, warn=False) for pr, c in zip(problems, checkpoints)]
        nll = tuple(float(r.nll) for r in refs)
        theta = tuple(tuple(float(v) for v in r.theta) for r in refs)
        i_best = int(np.argmin(nll))
        chains_best = self._judge(problems[i_best], refs[i_best])
        box = ((previous.box_nll, previous.box_q, np.asarray(previous.box_fit_ratio), previous.box_starts)
               if previous is not None else (np.inf, (), np.array([]), 0))
        kept = self._kept(previous)
        judged = lambda b: (b[0], b[1], np.asarray(b[2]), self._poor(b[2]))
        best_of = lambda: min((chains_best, judged(box), judged(kept)), key=lambda b: b[0])  # the chains' on ties
        P = self.density.system.n_parameters
        best_now = best_of()
        if (best_now[3] or self._at_bound(best_now[1][:P])) and self.box_starts > 0:
            # the best fits poorly or lies on a bound: least squares from new points spread over the box too
            since = it - (0 if fresh else previous.refined_at)
            box = self._box_search(box, max(1, round(self.box_starts * since / self.check_every)))[0]
        screened, screen_note = (0 if previous is None else previous.screened), ""
        standing = self._assess(nll, chains_best, box, kept, best_of(), previous, fresh)
        # another optimum a chain's mean refines to fits the data too (residual ratios within fit_ratio): the data
        # leave more than one candidate, so the best need not be the global one (judged only where it matters)
        rival = lambda: any(v > standing.nll + self.tol and not self._poor(self.residual_ratio(pr, r))
                            for v, pr, r in zip(nll, problems, refs))
        if (standing.settled >= standing.need and not standing.agree and self.screen_starts > 0 and rival()
                and screened < len(self.screened_points)):
            # the chains would stop apart: least squares first from the box points the density ranks highest
            n = min(self.screen_starts, len(self.screened_points) - screened)
            box = self._box_search(box, n, points=self.screened_points[screened:screened + n])[0]
            screened += n
            before, standing = standing.nll, self._assess(nll, chains_best, box, kept, best_of(), previous, fresh)
            screen_note = (f"; least squares from the {screened} of {len(self.screened_points)} points spread over the "
                           "prior box that the gradient-matching density ranks highest (at the GPs' means): "
                           + (f"a better optimum ({standing.nll:.6g} against {before:.6g}), so the chains go on"
                              if standing.settled < standing.need else "none better"))
        best_nll, best_q, ratio, poor, from_chains, agree, settled, need, at_bound, searched, held = standing
        bound_note = "" if not at_bound else f"; it lies on a prior bound ({'; '.join(at_bound)}), so " + (
            f"it must hold for {need * self.check_every} iterations" if self.bound_patience is not None else
            "the chains go on until it leaves the bound, the box search has refined "
            f"{self.box_release} points or to the whole budget" if not searched else
            f"it must hold for {need * self.check_every} iterations (the box search found no better optimum)")
        if poor:
            bound_note += (f"; it fits the data worse than the GPs ({', '.join(poor)} times the noise sd), so the "
                           + (f"chains go on until it fits, the box search has refined {self.box_release} points "
                              "or to the whole budget" if not searched else
                              f"best must hold for {need * self.check_every} iterations (the box search found no "
                              "better optimum)"))
        if box[3]:
            bound_note += (f"; least squares from {box[3]} points spread over the prior box: best negative log "
                           f"likelihood {box[0]:.6g}")
        bound_note += screen_note
        chains_note = ("the chains' means refine to " + (
            f"different optima ({_fmt(nll)})" if from_chains else f"{_fmt(nll)}, worse than the box search's"
            if box[0] <= kept[0] else f"{_fmt(nll)}, worse than the optimum a chain reached at an earlier check"))
        if settled >= need:
            reason = (f"the chains' means refine to the same optimum (negative log likelihoods {_fmt(nll)}) as "
                      f"{settled * self.check_every} iterations before" if agree and len(nll) > 1 else
                      f"the chain's mean refines to the same optimum ({_fmt(nll)}) as {settled * self.check_every} "
                      "iterations before" if agree else
                      f"the best refined optimum (negative log likelihood {best_nll:.6g}) has not changed for "
                      f"{settled * self.check_every} iterations; " + chains_note)
        else:
            reason = (f"the best refined negative log likelihood {best_nll:.6g} is "
                      + ("the first" if fresh else "new" if settled == 0 else "unchanged")
                      + f" ({'chains agree' if agree else chains_note})")
        return Decision(it, settled >= need, reason + bound_note, nll, theta, settled, it, tuple(at_bound),
                        tuple(tuple(float(v) for v in r.q) for r in refs), tuple(float(v) for v in ratio), tuple(held),
                        float(box[0]), tuple(float(v) for v in box[1]), int(box[3]), tuple(float(v) for v in box[2]),
                        *kept, screened)

    def _assess(self, nll: tuple[float, ...], chains_best: tuple, box: tuple, kept: tuple, best: tuple,
                previous: Decision | None, fresh: bool) -> Standing:
        """The :class:`Standing` of the best optimum ``best`` (nll, q, residual ratio, poor fits) of the chains'
        (``chains_best``), the box search's (``box``) and the kept one (``kept``) after ``previous``."""
        P = self.density.system.n_parameters
        best_nll, best_q, ratio, poor = best
        from_chains = chains_best[0] <= min(box[0], kept[0]) + self.tol  # the chains reach the best (within tol)
        agree = bool(np.isfinite(min(nll)) and max(nll) - min(nll) <= self.tol and from_chains)
        # checks the best has stayed within tol of its current value (0: it dropped just now)
        settled = 0 if fresh else (previous.settled + 1 if previous.best_nll - best_nll <= self.tol else 0)
        need = 1 if agree else self.patience
        at_bound = self._at_bound(best_q[:P]) if np.isfinite(best_nll) else []
        searched = self.box_starts > 0 and self.box() is not None and box[3] >= self.box_release
        held = []
        if at_bound:
            if self.bound_patience is not None:
                need = max(need, self.bound_patience)
            elif not searched:
                need = np.inf
                held.append(f"lies on a prior bound ({'; '.join(at_bound)})")
        if poor and not searched:
            need = np.inf
            held.append(f"fits the data worse than the GPs (residual sd / noise sd: {', '.join(poor)}; at most "
                        f"{self.fit_ratio:g} stops early)")
        return Standing(best_nll, best_q, ratio, poor, from_chains, agree, settled, need, at_bound, searched, held)

    @staticmethod
    def _kept(previous: Decision | None) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        """(nll, q, residual ratios) of the best optimum the chains' means were refined to at the checks up to
        ``previous`` (a chain may have left it since, for a worse mode of the gradient-matching density:
        a chain's mean can refine to the optimum at the probe and to a worse one at every later check);
        ``(inf, (), ())`` if none."""
        if previous is None:
            return np.inf, (), ()
        kept = (float(previous.kept_nll), tuple(previous.kept_q), tuple(previous.kept_fit_ratio))
        here = min(previous.nll, default=np.inf)
        if here < kept[0] and here <= previous.box_nll:  # that check's chains held the best: its ratios are theirs
            kept = (float(here), tuple(previous.q[int(np.argmin(previous.nll))]), tuple(previous.fit_ratio))
        return kept

    def _probe(self, checkpoints: Sequence[Checkpoint], previous: Decision | None) -> Decision:
        """The early check (``probe_at``): the chains' means refined, and least squares from
        ``probe_starts`` points spread over the prior box; a stop only when they all agree."""
        it = checkpoints[0].iteration
        problems = [self.problem(c.x0) for c in checkpoints]
        # short refinements first (as the box search's probes): a chain whose mean does not fit the data
        # after them rules the stop out at little cost; otherwise every chain's is refined fully from there
        refs = [self._refine(pr, np.concatenate([c.theta, pr.x0[list(pr.free_x0)]]), self.bounds,
                       estimate_noise=self.estimate_noise, warn=False, max_nfev=SHORT_NFEV, max_rounds=2)
                for pr, c in zip(problems, checkpoints)]
        short = any(self._poor(self.residual_ratio(pr, r)) for pr, r in zip(problems, refs))
        if not short:
            refs = [self._refine(pr, r.q, self.bounds, estimate_noise=self.estimate_noise, warn=False)
                    for pr, r in zip(problems, refs)]
        nll = tuple(float(r.nll) for r in refs)
        i_best = int(np.argmin(nll))
        best_nll, best_q, ratio, poor = self._judge(problems[i_best], refs[i_best])
        box = ((previous.box_nll, previous.box_q, np.asarray(previous.box_fit_ratio), previous.box_starts)
               if previous is not None else (np.inf, (), np.array([]), 0))
        P = self.density.system.n_parameters
        at_bound = self._at_bound(best_q[:P]) if np.isfinite(best_nll) else []
        chains_agree = bool(np.isfinite(best_nll) and max(nll) - best_nll <= self.tol)
        if short:
            why = (f"probe at {it} iterations: no early stop (a chain's mean fits the data worse than the GPs after "
                   f"a short refinement; chains {_fmt(nll)}); the checks go on from {self.min_iterations} iterations")
            return Decision(it, False, why, nll, tuple(tuple(float(v) for v in r.theta) for r in refs), 0, it,
                            q=tuple(tuple(float(v) for v in r.q) for r in refs),
                            fit_ratio=tuple(float(v) for v in ratio),
                            box_nll=float(box[0]),
                            box_q=tuple(float(v) for v in box[1]), box_starts=int(box[3]),
                            box_fit_ratio=tuple(float(v) for v in box[2]))
        reached = 0  # box points refined to the chains' optimum
        if chains_agree and not poor and not at_bound:  # only then can the probe stop: the box starts' turn
            # one at a time, until probe_agree reach the chains' optimum or one beats it
            for _ in range(self.probe_starts):
                box, (point,) = self._box_search(box, 1, full=True)
                reached += abs(point - best_nll) <= self.tol
                if reached >= self.probe_agree or box[0] < best_nll - self.tol:
                    break
        # the dispersed starts reach it, none better
        box_agrees = bool(reached >= self.probe_agree and abs(box[0] - best_nll) <= self.tol)
        stop = chains_agree and box_agrees and not poor and not at_bound
        why = ("every chain's mean and least squares from {r} of {n} point(s) spread over the prior box refine to "
               "the same optimum, none to a better one (negative log likelihoods {c}; box {b:.6g})").format(
            r=reached, n=box[3], c=_fmt(nll), b=box[0])
        if not stop:
            missing = ([] if chains_agree else ["the chains' means refine to different optima"]) + (
                [] if box_agrees or not box[3] else [f"the box starts' best ({box[0]:.6g}) is not the chains' best"
                                                     if abs(box[0] - best_nll) > self.tol else
                                                     f"{reached} of {box[3]} box starts reach the chains' best"]) + (
                [f"it fits the data worse than the GPs ({', '.join(poor)})"] if poor else []) + (
                [f"it lies on a prior bound ({'; '.join(at_bound)})"] if at_bound else [])
            why = (f"probe at {it} iterations: no early stop ({'; '.join(missing)}; chains {_fmt(nll)}); the checks "
                   f"go on from {self.min_iterations} iterations")
        else:
            why = f"probe at {it} iterations: " + why
        return Decision(it, stop, why, nll, tuple(tuple(float(v) for v in r.theta) for r in refs), 0, it,
                        tuple(at_bound), tuple(tuple(float(v) for v in r.q) for r in refs),
                        tuple(float(v) for v in ratio), (), float(box[0]), tuple(float(v) for v in box[1]), int(box[3]),
                        tuple(float(v) for v in box[2]))

    def _refine(self, problem: LeastSquaresProblem, q0, bounds, **kwargs):
        """:func:`pgpgm.refine` of one of the rule's refinements (``kwargs`` as refine's), with the noise
        tolerance :data:`RULE_NOISE_RTOL` where several observed states' sds are estimated; a refinement that
        raises (a solve failing at a box point) is a failed one (infinite nll): the rule goes on without it."""
        if RULE_NOISE_RTOL is not None and self.estimate_noise and len(problem.observed_idx) > 1:
            kwargs.setdefault("noise_rtol", RULE_NOISE_RTOL)
        try:
            return refine(problem, q0, bounds, **kwargs)
        except (*SEARCH_FAILURES, ValueError) as err:  # a candidate the rule cannot refine is discarded, never fatal
            return failed_refinement(problem, q0, f"the refinement failed ({type(err).__name__}: {err})")

    def noise_level(self) -> np.ndarray:
        """(M,) the noise sd each observed state's residuals are judged against (state units):
        the density's when the noise sds are given (``estimate_noise=False``), else the larger of
        the GP's estimate and the measurements' model-free one."""
        gp = np.asarray(self.density.noise_sd, float)
        return gp if not self.estimate_noise else np.maximum(gp, self.density.obs.difference_noise_sd())

    def residual_ratio(self, problem: LeastSquaresProblem, ref) -> np.ndarray:
        """(M,) each observed state's residual sd sqrt(RSS_k / N_k) at the refined optimum
        ``ref`` over its :meth:`noise_level` (inf where the refinement failed)."""
        if not np.isfinite(ref.nll):
            return np.full(len(self.density.obs.states), np.inf)
        sd = np.where(ref.noise_estimated, ref.noise_sd, np.sqrt(problem.rss(ref.q) / problem.n_obs))
        return sd / self.noise_level()

    def _judge(self, problem: LeastSquaresProblem, ref) -> tuple[float, tuple, np.ndarray, list[str]]:
        """(nll, q, residual ratio (M,), the states that fit poorly) of one refinement."""
        ratio = self.residual_ratio(problem, ref)
        return float(ref.nll), tuple(ref.q), ratio, self._poor(ratio)

    def _at_bound(self, theta) -> list[str]:
        """The Uniform-prior bounds ``theta`` (P,) lies on, in words."""
        return [f"{b.parameter} at its {b.side} bound {b.bound:g}" for b in bound_report(self.density.priors, theta)]

    def _poor(self, ratio) -> list[str]:
        """The observed states (with their ratios, in words) whose residual ratio exceeds ``fit_ratio``."""
        return [f"{s} {v:.3g}" for s, v in zip(self.density.obs.states, ratio)
                if self.fit_ratio is not None and not v <= self.fit_ratio]

    def box(self) -> np.ndarray | None:
        """(P + K, 2) the box the box search draws from (the parameters' Uniform priors, then the
        unknown latent initial values'), or None when some prior is not a finite Uniform."""
        d = self.density
        if self.bounds is None:
            return None
        b0 = d.x0_priors.bounds if d.unknown_x0_idx else np.empty((0, 2))
        if b0 is None:
            return None
        box = np.vstack([self.bounds, b0])
        return box if np.all(np.isfinite(box)) else None

    @cached_property
    def screened_points(self) -> np.ndarray:
        """(K, P + U) ``screen_points`` points spread over :meth:`box` (a scrambled Sobol sequence of its own),
        ordered by the gradient-matching log density at each with the observed states at the GPs' means,
        highest first (K = 0 when :meth:`box` is None). Computed on first use, once per rule: K density
        evaluations, each one solve of the latent states (a few hundredths of a second for 256 points on
        small systems)."""
        bounds = self.box()
        if bounds is None or self.screen_points == 0:
            return np.empty((0, 0 if bounds is None else bounds.shape[0]))
        m = int(np.ceil(np.log2(self.screen_points)))
        unit = qmc.Sobol(bounds.shape[0], scramble=True, seed=np.random.default_rng([self.seed, 1])).random_base2(m)
        z = bounds[:, 0] + unit[: self.screen_points] * np.ptp(bounds, axis=1)
        d = self.density
        target, X = GradientMatchingTarget(d), d.gp_states()
        lp = np.array([target.evaluate(q, X)[0] for q in z])
        return z[np.argsort(-np.where(np.isfinite(lp), lp, -np.inf), kind="stable")]

    def _box_search(self, box: tuple, n: int, *, full: bool = False,
                    points: np.ndarray | None = None) -> tuple[tuple, list[float]]:
        """The box search's (best nll, its q, its residual ratio (M,), points used) after ``n``
        more points (unchanged when :meth:`box` is None), and each new point's refined nll (N,)
        (a short refinement's unless it beat the best so far or, with ``full``, fits the data after
        it (:meth:`residual_ratio` within ``fit_ratio``): then refined fully). ``points`` (n, P + U):
        refine these instead of the sequence's next ``n`` (the points used stay as they were)."""
        bounds = self.box()
        if bounds is None:
            return box, []
        used = box[3]
        if points is None:
            # the sequence's first 2^m points (a power of two keeps Sobol's balance), of which these are the next n
            m = int(np.ceil(np.log2(used + n)))
            unit = qmc.Sobol(bounds.shape[0], scramble=True, seed=self.seed).random_base2(m)[used:used + n]
            points = bounds[:, 0] + unit * np.ptp(bounds, axis=1)  # parameters, then unknown latent initial values
            used += n
        d = self.density
        P, first = d.system.n_parameters, list(d.gp_posterior_means()[0])
        nlls = []
        for z in points:
            problem = self.problem(np.asarray(d.initial_state(first, list(z[P:])), float))
            # a short probe (most box points lie in basins that a full refinement would crawl through);
            # one that beats the best so far is refined fully from where it stopped
            r = self._refine(problem, np.concatenate([z[:P], problem.x0[list(problem.free_x0)]]), self.bounds,
                       estimate_noise=self.estimate_noise, warn=False, max_nfev=SHORT_NFEV, max_rounds=2)
            if r.nll < box[0] or full and not self._poor(self.residual_ratio(problem, r)):
                r = self._refine(problem, r.q, self.bounds, estimate_noise=self.estimate_noise, warn=False)
            if r.nll < box[0]:
                box = (*self._judge(problem, r)[:3], used)
            nlls.append(float(r.nll))
        return (*box[:3], used), nlls


def _fmt(values) -> str:
    return ", ".join(f"{v:.6g}" for v in values)

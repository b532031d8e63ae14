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
the same best). An optimum on a bound of a Uniform prior (:func:`pgpgm.bounds.bound_report`)
does not stop the chains early by default: chains started apart can sit together in a mode
against the box for thousands of iterations before they find the data's optimum
(Lotka-Volterra, x2 observed, data and sampler seed 4: both chains' means refined to a
bound, 38 nats above the optimum, at every check up to 2600 iterations, and to the optimum
from 2700 on), and no check tells such a mode from an optimum that really lies on the box;
while the best lies there the means are refined at growing intervals, not at every check.

Nor does an optimum that fits the data worse than the GP of step 1 does: agreement between
chains is evidence of the data's basin only when the optimum they agree on explains the
measurements. Each observed state's residual sd at the best refined optimum,
sqrt(RSS_k / N_k), is compared with that state's noise level: the sd the user gave, or else the
larger of the GP's estimate and a model-free one from the measurements alone
(:meth:`pgpgm.data.Observations.difference_noise_sd`; a GP on 15 points can take noise for
signal: protein transduction, data seed 1, the GP's sd of S is 0.0028 where the data's is 0.01);
the chains may stop early only while every ratio is at most ``fit_ratio`` (default 2). Chains still travelling through the box can refine to a wrong
optimum at two checks in a row, both agreeing on it: FitzHugh-Nagumo, R observed, default
box (0, 10), data seed 0 - both chains' means refined at 100 and 150 iterations to theta
(1.52, 2.42, 1.64), whose residual sd is 8.7 times the GP's noise sd; at the global optimum
(0.217, 0.245, 2.96), which the chains reach at 200-250 iterations, the ratio is 1.03. While the best does not fit, the chains go on and are
refined at growing intervals, as on a bound.
``stop="never"`` runs the whole budget (``tune + draws``), as published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import numpy as np

from ..bounds import bound_report
from ..density import GradientMatchingDensity
from ..errors import DataError
from ..refine import LeastSquaresProblem, refine
from ..solve import Integrator


@dataclass(frozen=True)
class Checkpoint:
    """One chain at a check.

    chain : chain number; iteration : iterations done (tuning included);
    start : first iteration of the window the means are taken over, the latter half of
    the chain so far (``min(iteration // 2, tune)``); theta : (P,) mean of the parameters
    over the window; x0 : (S,) mean of every state's value at ``times[0]`` over the window
    (state units; a latent state with a known initial value has it in every draw).
    """

    chain: int
    iteration: int
    start: int
    theta: np.ndarray
    x0: np.ndarray


@dataclass(frozen=True)
class Decision:
    """A stop rule's verdict at one check.

    iteration : iterations done by every chain; stop : whether the chains stop here;
    reason : why (or why not), in words; nll : (chains,) the refined negative log
    likelihood from each chain's mean (empty for rules that do not refine); theta :
    (chains, P) the refined parameters; settled : checks for which the best ``nll`` has
    not dropped; refined_at : the iteration whose chain means ``nll`` and ``theta`` were
    refined from (this check's, or an earlier one's when this check did not refine; None
    for rules that do not refine); at_bound : the prior bounds the best refined optimum
    lies on, in words (e.g. ``"theta1 at its upper bound 10"``); q : (chains, Q) every
    refined unknown (the parameters, then the free initial values of
    :meth:`RefinedAgreement.problem`), from which step 3 goes on.
    """

    iteration: int
    stop: bool
    reason: str
    nll: tuple[float, ...] = ()
    theta: tuple[tuple[float, ...], ...] = ()
    settled: int = 0
    refined_at: int | None = None
    at_bound: tuple[str, ...] = ()
    q: tuple[tuple[float, ...], ...] = ()
    fit_ratio: tuple[float, ...] = ()
    held: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"iteration": self.iteration, "stop": self.stop, "reason": self.reason, "nll": list(self.nll),
                "theta": [list(t) for t in self.theta], "settled": self.settled, "refined_at": self.refined_at,
                "at_bound": list(self.at_bound), "q": [list(v) for v in self.q], "fit_ratio": list(self.fit_ratio),
                "held": list(self.held)}


class StopRule(Protocol):
    """What :func:`pgpgm.sample` needs of a stop rule."""

    name: ClassVar[str]
    check_every: int
    min_iterations: int

    def decide(self, checkpoints: Sequence[Checkpoint], previous: Decision | None) -> Decision:
        """The verdict at one check, given every chain's checkpoint and the previous verdict."""


@dataclass(frozen=True, eq=False)
class RefinedAgreement:
    """Stop when the best least-squares optimum refined from the chains' means has settled.

    Parameters
    ----------
    density : the gradient-matching density (data, observed states, noise sds, x0)
    integrator : the ODE solves of the refinements (the density's system at the data's times)
    bounds : (P, 2) bounds of theta for the refinement (the uniform priors' support) or None
    refine_x0 : refine the observed states' initial values too (started at the chain's mean)
    estimate_noise : estimate the noise sds with theta (as :func:`pgpgm.fit` does when
        no ``noise_sd`` is given)
    tol : nats; the chains agree when their refined negative log likelihoods are within
        ``tol`` of the best, and the best has settled when it dropped by at most ``tol``
    check_every : iterations between checks
    min_iterations : iterations before the first check
    patience : checks the best must stay settled while the chains disagree
    bound_patience : checks the best must stay settled when it lies on a bound of a Uniform
        prior (:func:`pgpgm.bounds.bound_report`), whether the chains agree or not; None
        (default): such an optimum never stops the chains early (they run the whole budget
        unless it leaves the bound), and while it lies there the chains' means are refined
        at growing intervals (``bound_growth``), not at every check
    bound_growth : while the best lies on a bound (and ``bound_patience`` is None) or fits
        poorly (``fit_ratio``), the chains are refined again at the first check once they
        have run ``1 + bound_growth`` times as long as at the last refinement (default 0.5:
        at 150 iterations, then 250, 400, 600, 900, ...); 0 refines at every check
    fit_ratio : the chains stop early only when every observed state's residual sd at the
        best refined optimum, sqrt(RSS_k / N_k), is at most ``fit_ratio`` times its noise
        level (:meth:`noise_level`); None switches the check off

    The defaults - first check at 100 iterations, then every 50, so a stop at 150 at the
    earliest - follow the published cases: every chain's mean refined to the global optimum
    by 150 iterations on FitzHugh-Nagumo (R observed, seeds 0-2), after sitting in a local
    optimum for the first 50-100 (both chains agreeing there at 50: one check would not do;
    checks every 25 from 25 on stopped 2 of 5 such fits in a wrong optimum). Checks at 100,
    150, ... reached the optimum of checks at 100, 200, ... in 60 of 60 fits (the six
    published cases, data and sampler seeds 0-9) at 0.8-0.9x the CPU time.
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
    name: ClassVar[str] = "agree"

    def __post_init__(self):
        counts = (self.check_every, self.min_iterations, self.patience) + (
            () if self.bound_patience is None else (self.bound_patience,))
        if not (self.tol > 0 and self.bound_growth >= 0 and all(int(v) == v >= 1 for v in counts)):
            raise DataError(f"tol > 0, bound_growth >= 0 and positive whole check_every, min_iterations, patience, "
                            f"bound_patience are required, got {self.tol}, {self.bound_growth}, {self.check_every}, "
                            f"{self.min_iterations}, {self.patience}, {self.bound_patience}")
        if self.fit_ratio is not None and not (np.isfinite(self.fit_ratio) and self.fit_ratio >= 1):
            raise DataError(f"fit_ratio must be a number >= 1 (residual sd over the GP's noise sd) or None, "
                            f"got {self.fit_ratio!r}")

    def problem(self, x0: np.ndarray) -> LeastSquaresProblem:
        """The least-squares problem of step 3 started at the initial state ``x0`` (S,): the
        observed states' initial values free when ``refine_x0``, unknown latent ones always."""
        d = self.density
        free = (d.observed_idx if self.refine_x0 else ()) + d.unknown_x0_idx
        return LeastSquaresProblem(self.integrator, d.obs.values, d.observed_idx, d.noise_sd, np.asarray(x0, float),
                                   free_x0=free)

    def next_refinement(self, refined_at: int) -> int:
        """The first check at which chains held at a prior bound are refined again after a
        refinement at ``refined_at``: the first on the check grid once they have run half as
        long again."""
        due = refined_at + max(self.check_every, int(np.ceil(self.bound_growth * refined_at)))
        return self.min_iterations + -(-(due - self.min_iterations) // self.check_every) * self.check_every

    def decide(self, checkpoints: Sequence[Checkpoint], previous: Decision | None) -> Decision:
        it = checkpoints[0].iteration
        if previous is not None and previous.held and it < self.next_refinement(previous.refined_at):
            # held (on a bound, or a poor fit), which never stops the chains: look again once they have run longer
            return replace(previous, iteration=it, stop=False, reason=(
                f"not refined here: the best refined optimum (negative log likelihood {min(previous.nll):.6g}, "
                f"at {previous.refined_at} iterations) {'; '.join(previous.held)}; "
                f"the chains go on and are refined again at {self.next_refinement(previous.refined_at)} iterations"))
        problems = [self.problem(c.x0) for c in checkpoints]
        refs = [refine(pr, np.concatenate([c.theta, pr.x0[list(pr.free_x0)]]), self.bounds,
                       estimate_noise=self.estimate_noise, warn=False) for pr, c in zip(problems, checkpoints)]
        nll = tuple(float(r.nll) for r in refs)
        theta = tuple(tuple(float(v) for v in r.theta) for r in refs)
        best = min(nll)
        agree = bool(np.isfinite(best) and max(nll) - best <= self.tol)
        # checks the best has stayed within tol of its current value (0: it dropped just now)
        settled = 0 if previous is None else (previous.settled + 1 if min(previous.nll) - best <= self.tol else 0)
        need = 1 if agree else self.patience
        i_best = int(np.argmin(nll))
        at_bound = [f"{b.parameter} at its {b.side} bound {b.bound:g}" for b in
                    bound_report(self.density.priors, theta[i_best])] if np.isfinite(best) else []
        ratio = self.residual_ratio(problems[i_best], refs[i_best]) if np.isfinite(best) else np.full(
            len(self.density.obs.states), np.inf)
        held = []
        if at_bound:
            need = np.inf if self.bound_patience is None else max(need, self.bound_patience)
            if self.bound_patience is None:
                held.append(f"lies on a prior bound ({'; '.join(at_bound)})")
        poor = [f"{s} {v:.3g}" for s, v in zip(self.density.obs.states, ratio)
                if self.fit_ratio is not None and not v <= self.fit_ratio]
        if poor:
            need = np.inf
            held.append(f"fits the data worse than the GPs (residual sd / noise sd: {', '.join(poor)}; at most "
                        f"{self.fit_ratio:g} stops early)")
        bound_note = "" if not at_bound else f"; it lies on a prior bound ({'; '.join(at_bound)}), so " + (
            "the chains go on until it leaves the bound or to the whole budget" if self.bound_patience is None else
            f"it must hold for {need * self.check_every} iterations")
        if poor:
            bound_note += (f"; it fits the data worse than the GPs ({', '.join(poor)} times the noise sd), so the "
                           "chains go on until it fits or to the whole budget")
        if settled >= need:
            reason = (f"the chains' means refine to the same optimum (negative log likelihoods {_fmt(nll)}) as "
                      f"{settled * self.check_every} iterations before" if agree and len(nll) > 1 else
                      f"the chain's mean refines to the same optimum ({_fmt(nll)}) as {settled * self.check_every} "
                      "iterations before" if agree else
                      f"the best refined optimum (negative log likelihood {best:.6g}) has not changed for "
                      f"{settled * self.check_every} iterations; the chains' means refine to different optima "
                      f"({_fmt(nll)})")
        else:
            reason = (f"the best refined negative log likelihood {best:.6g} is "
                      + ("the first" if previous is None else "new" if settled == 0 else "unchanged")
                      + f" ({'chains agree' if agree else 'chains differ: ' + _fmt(nll)})")
        return Decision(it, settled >= need, reason + bound_note, nll, theta, settled, it, tuple(at_bound),
                        tuple(tuple(float(v) for v in r.q) for r in refs), tuple(float(v) for v in ratio), tuple(held))

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


def _fmt(values) -> str:
    return ", ".join(f"{v:.6g}" for v in values)


def stop_rule(stop, density: GradientMatchingDensity) -> StopRule | None:
    """The rule for ``stop``: None for ``"never"``; for ``"agree"`` a :class:`RefinedAgreement`
    on ``density`` with its defaults (the density's latent-state integrator, the uniform
    priors' bounds, noise sds estimated); a rule object as is."""
    if isinstance(stop, str) and stop == "never":
        return None
    if isinstance(stop, str) and stop == "agree":
        integrator = density.integrator or Integrator(density.system, density.obs.times)
        return RefinedAgreement(density, integrator, density.priors.bounds)
    if all(hasattr(stop, a) for a in ("decide", "check_every", "min_iterations", "name")):
        return stop
    raise DataError(f"stop must be 'agree', 'never' or a stop rule object such as RefinedAgreement(...), "
                    f"got {stop!r}")

"""What step 2 asks of a stop rule, and what one answers.

The driver (:func:`pgpgm.sample`) runs the chains and, every ``check_every`` iterations from
``min_iterations`` on (and at the iterations of the rule's optional ``first_checks`` tuple before
that), hands a :class:`StopRule` one :class:`Checkpoint` per chain; the rule returns
a :class:`Decision`. Rules are passed in: the default one refines the chains' means by least
squares (step 3's code) and so lives above both steps (:class:`pgpgm.RefinedAgreement`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from ..errors import DataError


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
    :meth:`RefinedAgreement.problem`), from which step 3 goes on; fit_ratio : (M,) each observed
    state's residual sd over its noise level at the best optimum; held : why the best cannot stop
    the chains yet, in words; box_nll, box_q, box_fit_ratio, box_starts : the best of the least
    squares from points spread over the prior box so far, its unknowns and residual ratios, and
    the points refined; kept_nll, kept_q, kept_fit_ratio : the best optimum that earlier checks
    refined the chains' means to (a chain can leave the data's basin for a worse mode of the
    gradient-matching density between checks: the optimum it found is kept, not forgotten);
    screened : the box points ranked by the gradient-matching density that were refined so far
    (their best counts as the box search's: ``box_nll``, ``box_q``).
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
    box_nll: float = np.inf
    box_q: tuple[float, ...] = ()
    box_starts: int = 0
    box_fit_ratio: tuple[float, ...] = ()
    kept_nll: float = np.inf
    kept_q: tuple[float, ...] = ()
    kept_fit_ratio: tuple[float, ...] = ()
    screened: int = 0

    @property
    def best_nll(self) -> float:
        """The lowest negative log likelihood found so far: the chains' refinements at this check and
        at every earlier one, and the best box start of every check up to here."""
        return min(min(self.nll, default=np.inf), self.box_nll, self.kept_nll)

    @property
    def best_q(self) -> tuple[float, ...]:
        """(Q,) the unknowns of :attr:`best_nll`'s optimum (empty when nothing was refined)."""
        here = min(self.nll, default=np.inf)
        if self.kept_q and self.kept_nll < min(here, self.box_nll):
            return self.kept_q
        if self.box_q and self.box_nll < here:
            return self.box_q
        return self.q[int(np.argmin(self.nll))] if self.nll else ()

    def as_dict(self) -> dict:
        return {"iteration": self.iteration, "stop": self.stop, "reason": self.reason, "nll": list(self.nll),
                "theta": [list(t) for t in self.theta], "settled": self.settled, "refined_at": self.refined_at,
                "at_bound": list(self.at_bound), "q": [list(v) for v in self.q], "fit_ratio": list(self.fit_ratio),
                "held": list(self.held), "box_nll": self.box_nll, "box_q": list(self.box_q),
                "box_starts": self.box_starts, "box_fit_ratio": list(self.box_fit_ratio), "kept_nll": self.kept_nll,
                "kept_q": list(self.kept_q), "kept_fit_ratio": list(self.kept_fit_ratio), "screened": self.screened,
                "best_nll": self.best_nll, "best_q": list(self.best_q)}


class StopRule(Protocol):
    """What :func:`pgpgm.sample` needs of a stop rule."""

    name: ClassVar[str]
    check_every: int
    min_iterations: int

    def decide(self, checkpoints: Sequence[Checkpoint], previous: Decision | None) -> Decision:
        """The verdict at one check, given every chain's checkpoint and the previous verdict."""


def check_stop_rule(stop) -> StopRule | None:
    """``stop`` as the driver uses it: None for ``"never"`` (the whole budget), a rule object as is.

    Raises
    ------
    DataError
        for anything else (the message names the rule objects to pass).
    """
    if isinstance(stop, str) and stop == "never":
        return None
    if all(hasattr(stop, a) for a in ("decide", "check_every", "min_iterations", "name")):
        return stop
    raise DataError(f"stop must be 'never' or a stop rule object such as pgpgm.RefinedAgreement.for_density(density) "
                    f"(pgpgm.fit's stop='agree' builds one), got {stop!r}")

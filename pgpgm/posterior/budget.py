"""Step 4's budget: :class:`PosteriorBudget` (seconds and gradient evaluations) and the :class:`BudgetMeter`
that stops the samplers once it is spent, sharing it among chains run one after another or in waves."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import DataError

#: the least share of a budget's seconds left for sampling when the time before it (``run_nuts(started=...)``:
#: building the model, compiling its solve) counts too
MIN_SAMPLING_SHARE = 0.25


@dataclass(frozen=True)
class PosteriorBudget:
    """How much step 4 (:func:`sample_posterior`) may spend before it returns what it has.

    Attributes
    ----------
    seconds : wall-clock seconds of sampling, all rounds together (None: no limit); in :func:`pgpgm.fit` they
        count from the start of step 4, building its model (its solve's compilation on a cold cache)
        included, with at least :data:`MIN_SAMPLING_SHARE` of them left to sampling
    gradient_evaluations : leapfrog steps (one ODE solve with sensitivities each) of all chains
        and rounds, tuning included (None: no limit); unlike seconds, it does not depend on the
        machine or its load. The default, 3000000, leaves the 60 s to bind on a 2-core machine
        (a tenth of it stops ordinary fits within the 60 s, short of convergence, and a third of it
        can stop a hard one before the seconds do).
        Chains in waves (``cores < chains``) may exceed it by up to a quarter while the last wave's
        late-started chain catches up, and a wave's evaluations before its last chain started are
        not counted (see :class:`BudgetMeter`). Chains that run at once whose budget is spent before
        each has drawn (their processes' start) run on to their first draws, up to 1.5 times the
        seconds and 1.25 times the gradient evaluations

    The rounds loop sizes each further round to what is left (from the last round's seconds and
    leapfrog steps per iteration) and starts none that cannot run ``min(draws, 100)`` draws; inside a
    round, a callback of :func:`pymc.sample` stops the chains once either limit is spent (the
    draws made so far are kept). When it stops sampling, the result says so
    (``tree.attrs["pgpgm_budget"]``) and a :class:`~pgpgm.errors.ConvergenceWarning` names it.
    """

    seconds: float | None = 60.0
    gradient_evaluations: int | None = 3_000_000

    def __post_init__(self):
        for name in ("seconds", "gradient_evaluations"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating)
                                  or not np.isfinite(v) or v <= 0):
                raise DataError(f"posterior budget {name} must be a positive number or None, got {v!r}")

    @classmethod
    def of(cls, value) -> PosteriorBudget:
        """The budget a user gave: a :class:`PosteriorBudget`, a number of seconds (no limit on
        gradient evaluations), or None (no budget at all)."""
        if isinstance(value, PosteriorBudget):
            return value
        if value is None:
            return cls(None, None)
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise DataError(f"the posterior budget (NUTS(budget=...)) must be a number of seconds, a pgpgm.PosteriorBudget or None, "
                            f"got {value!r}")
        return cls(float(value), None)

    def describe(self) -> str:
        parts = ([f"{self.seconds:g} s"] if self.seconds is not None else []) + (
            [f"{self.gradient_evaluations} gradient evaluations"] if self.gradient_evaluations is not None else [])
        return " / ".join(parts) or "no limit"


#: a wave of chains (:func:`_sample_in_waves`) ends on its share only once its shortest chain has drawn
#: this fraction of its longest chain's iterations: PyMC, stopped, keeps the chains that maximise (chains
#: x shortest length), leaving out one with fewer than half the longest's; a process started 0.5 s late
#: on a loaded 2-core machine (a fast model: 380 iterations per second) lost its chain at the share alone
WAVE_BALANCE = 0.6


#: when the budget stops chains that run at once (or waves of them, :func:`join_waves`), chains behind
#: the longest are kept (the others cut to the shortest's iterations) when the shortest has drawn at
#: least this fraction of the longest's iterations; PyMC's own rule for a stopped call keeps the chains that maximise
#: (chains x shortest length), leaving out, of four chains, one with under 3/4 of the others' iterations:
#: a chain that ran slower (its process started late, or had less of a loaded machine's CPU, or its
#: trajectories were longer) was judged without, and R-hat lost what it would have said about it
KEEP_CHAINS = 0.25


class BudgetMeter:
    """What step 4 has spent of a :class:`PosteriorBudget` since it was made; as the ``callback`` of
    :func:`pymc.sample` it counts every iteration's leapfrog steps and stops the sampling (PyMC's
    ``KeyboardInterrupt`` convention: the draws made so far are returned) once the budget is spent.

    Chains that PyMC runs one after the other (one process) would leave the last chains undrawn; for
    them, :meth:`begin_round` gives every chain an equal share of what is left, and a chain that has
    used its share (and any time its predecessors left) ends, as PyMC ends the current chain only
    on ``KeyboardInterrupt`` there, and the next one starts. Chains run in waves (fewer processes
    than chains, :func:`_sample_in_waves`: one :func:`pymc.sample` call per wave) share it alike, a
    wave at a time (:meth:`begin_waves`, :meth:`begin_wave`): the callback's ``KeyboardInterrupt``
    ends the current wave's call. A wave's share of gradient evaluations is shared among its chains:
    the wave ends once *every* chain has used its part and has drawn at least ``WAVE_BALANCE`` times as
    many iterations as the wave's longest chain (PyMC, when stopped, leaves out a chain with fewer than
    half the longest's: a chain whose process started late, 0.5 s on a loaded 2-core machine, would be
    lost) - or, should one lag more than that, once the wave has used its share and half of what the
    later waves' shares would be (the last wave: half of its own share beyond the budget). A wave's
    share of seconds likewise ends once its chains are balanced, or once half of the later waves' time
    is spent too (the last wave ends with the budget): starting its processes may take most of a short
    share. A wave's gradient evaluations made before its last chain's first draw (its processes start
    one after the other: seconds apart on a loaded machine, thousands of gradients of a fast model) are
    its ``lag``: neither its cap nor the budget counts them, up to the wave's share (``late``: their
    sum), so that a chain started late is not left out for it. Chains the stop left out anyway are
    counted (``dropped``) and named in the warning."""

    def __init__(self, budget: PosteriorBudget):
        self.budget = budget
        self.start = time.perf_counter()
        self.gradients = 0
        self.exhausted = ""  # what ran out: "" (nothing), "seconds", "gradient evaluations"
        self.shares: tuple[int, float, float] | None = None  # parts, seconds, gradients at a round's start
        self.wave: int | None = None  # the wave running now (None: the shares are by chain)
        self.wave_gradients: dict[int, int] = {}  # the current wave's gradient evaluations by chain
        self.wave_start = 0  # gradient evaluations used when the current wave began
        self.overrun = 0.0  # gradient evaluations the last wave may use beyond the budget
        self.late = 0  # gradient evaluations of earlier waves made before their last chain started
        self.wave_lag: int | None = None  # the current wave's, once its last chain has started
        self.dropped = 0  # chains that a budget stop left out (PyMC drops the short ones)
        self.cut = ""  # what a sequential chain's (or a wave's) share ran out of (the round was cut short)
        self.stops = 0  # how many times the callback stopped sampling
        self.traces: dict[int, object] = {}  # the current call's chains' PyMC traces (the callback's trace=)
        self.call_chains = 0  # how many chains the current pymc.sample call (or wave) runs
        self.call_draws: dict[int, int] = {}  # the current call's iterations by chain
        self.first_draws: dict[int, float] = {}  # when (elapsed s) each chain of the current call first drew

    def begin_round(self, chains: int, sequential: bool) -> None:
        """Before a :func:`pymc.sample` call: with ``sequential`` chains, share the budget left among them."""
        self.shares = (chains, self.elapsed(), self.gradients) if sequential and chains > 1 else None
        self.wave, self.traces = None, {}
        self.call_chains, self.call_draws, self.first_draws = chains, {}, {}

    def begin_waves(self, waves: int) -> None:
        """Before a round of ``waves`` :func:`pymc.sample` calls: share the budget left among them, wave
        ``self.wave`` (set before each call) ending once (wave + 1) / waves of it is spent."""
        self.shares = (waves, self.elapsed(), self.gradients) if waves > 1 else None
        self.wave = 0

    def begin_wave(self, wave: int, chains: int) -> None:
        """Before wave ``wave`` (of :meth:`begin_waves`), which runs ``chains`` chains."""
        self.wave, self.wave_gradients, self.wave_start = wave, {}, self.gradients
        self.wave_lag, self.traces = None, {}
        self.call_chains, self.call_draws, self.first_draws = chains, {}, {}
        g = self.budget.gradient_evaluations
        last = self.shares is None or wave == self.shares[0] - 1
        self.overrun = 0.5 * (g + self.late - self.gradients) if last and g is not None else 0.0

    def end_waves(self) -> None:
        """After the last wave (and its :meth:`end_wave`): the shares, and the last wave's overrun, end."""
        self.wave, self.overrun, self.wave_lag = None, 0.0, None

    def end_wave(self) -> None:
        """After a wave: its lag is the later waves' to leave out."""
        self.late += self._lag()
        self.wave_lag = 0

    def _wave_share(self) -> float:
        """The current wave's share of gradient evaluations (what was left at its start when it is the
        last wave; infinite without a gradient budget)."""
        g = self.budget.gradient_evaluations
        if g is None:
            return np.inf
        if self.shares is None:
            return g + self.late - self.wave_start
        waves, _, g0 = self.shares
        return g0 + (self.wave + 1) / waves * (g - g0) + self.late - self.wave_start

    def _lag(self) -> int:
        """The current wave's gradient evaluations before its last chain's first draw, up to its share
        (0 outside waves); still growing while a chain has not started."""
        if self.wave is None:
            return 0
        lag = self.wave_lag if self.wave_lag is not None else self.gradients - self.wave_start
        return int(min(lag, max(self._wave_share(), 0.0)))

    @property
    def wave_draws(self) -> dict[int, int]:
        """The current wave's iterations (tuning included) by chain."""
        return self.call_draws

    def _balanced(self) -> bool:
        """Whether every chain of the current wave has drawn at least ``WAVE_BALANCE`` times the
        iterations of its longest chain (then a stop keeps them all)."""
        draws = [self.wave_draws.get(c, 0) for c in range(self.call_chains)]
        return min(draws) >= WAVE_BALANCE * max(draws)

    def _share_spent(self, chain: int) -> str:
        """What ``chain`` of a sequential round (or the current wave) has used its share of ("" when
        nothing): part c ends once (c + 1) / parts of what was left at the round's start is spent."""
        chains, t0, g0 = self.shares
        part = (min(chain if self.wave is None else self.wave, chains - 1) + 1) / chains
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        if s is not None:
            ends = t0 + part * (s - t0)  # where this part's time ends
            # a wave's time: once its chains are balanced, or half of the later waves' time is spent
            # too (the chain processes' start, several seconds, may take much of a short share)
            if self.elapsed() >= ends and (self.wave is None or self._balanced()
                                           or self.elapsed() >= ends + 0.5 * (s - ends)):
                return "seconds"
        if g is None:
            return ""
        end = g0 + part * (g - g0)  # where this part's share ends
        if self.wave is None:
            return "gradient evaluations" if self.gradients >= end else ""
        # a wave: each chain's part of what the wave had left at its start; every chain must use it,
        # and the chains be balanced (PyMC keeps them all); the earlier waves' lags are not counted
        end, g = end + self.late, g + self.late
        left = end - self.wave_start
        counts = self.wave_gradients
        each = all(counts.get(c, 0) >= left / self.call_chains for c in range(self.call_chains))
        # the later waves keep at least half of their shares; the last may overrun by half its own
        cap = end + (0.5 * (g - end) if g > end else self.overrun)
        used = self.gradients - self._lag()  # nor this wave's lag
        return "gradient evaluations" if (each and self._balanced()) or used >= cap else ""

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def seconds_left(self) -> float:
        return np.inf if self.budget.seconds is None else self.budget.seconds - self.elapsed()

    def gradients_left(self) -> float:
        g = self.budget.gradient_evaluations
        return np.inf if g is None else g + self.overrun + self.late + self._lag() - self.gradients

    def share_left(self, share: float) -> tuple[float, float]:
        """(seconds, gradient evaluations) left before ``share`` of the budget is spent (inf where it has no limit)."""
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        return (np.inf if s is None else share * s - self.elapsed(),
                np.inf if g is None else share * g - self.gradients)

    def check(self, ahead: float = 0.0) -> str:
        """What has run out now ("" when nothing has); remembered in ``exhausted``. ``ahead``: seconds
        that ending takes (e.g. reading the draws back), counted as spent already."""
        if not self.exhausted:
            self.exhausted = ("seconds" if self.seconds_left() <= ahead else
                              "gradient evaluations" if self.gradients_left() <= 0 else "")
        return self.exhausted

    def __call__(self, trace=None, draw=None):
        stats = getattr(draw, "stats", None)
        stats = stats[0] if isinstance(stats, list | tuple) and stats else stats
        chain = int(getattr(draw, "chain", 0))
        if isinstance(stats, Mapping):
            steps = int(stats.get("tree_size", 0) or 0)
            self.gradients += steps
            if self.wave is not None:
                self.wave_gradients[chain] = self.wave_gradients.get(chain, 0) + steps
        self.call_draws[chain] = self.call_draws.get(chain, 0) + 1
        self.first_draws.setdefault(chain, self.elapsed())
        if self.wave is not None and self.wave_lag is None and len(self.first_draws) == self.call_chains:
            self.wave_lag = self.gradients - self.wave_start  # the wave's last chain has started
        if trace is not None:
            self.traces[chain] = trace
        if self.check():
            if self._waits_for_chains():
                return
            self.stops += 1
            self._even_out()
            raise KeyboardInterrupt  # pm.sample ends the chains and returns what they drew
        spent = self._share_spent(chain) if self.shares is not None else ""
        if spent:
            self.cut = self.cut or spent
            self.stops += 1
            self._even_out()
            raise KeyboardInterrupt  # sequential chains: this one ends, the next one starts

    def _waits_for_chains(self) -> bool:
        """Whether a spent budget waits before it stops chains that run at once: while one of them has
        not drawn yet (its process is still starting: a budget shorter than the start kept 1 chain of 1
        draw), and then while the shortest has under ``KEEP_CHAINS`` of the longest's iterations, for as
        long again as the chains' first draws were apart (a chain that started late catches up to a
        quarter in a third of that; one that runs slower is not waited for) - never past 1.5 times the
        budget's seconds or 1.25 times its gradient evaluations."""
        if (self.shares is not None and self.wave is None) or self.call_chains < 2:
            return False
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        now = self.elapsed()
        # the waves' late starts are not counted (as by their caps); the last wave's overrun is (counting it
        # out, a chain lagging in the last wave could be waited for up to 1.5 times the budget)
        counted = self.gradients - self.late - self._lag()
        if (s is not None and now >= 1.5 * s) or (g is not None and counted >= 1.25 * g):
            return False
        if len(self.first_draws) < self.call_chains:
            return True
        counts = self.call_draws.values()
        if min(counts) >= KEEP_CHAINS * max(counts):
            return False
        starts = self.first_draws.values()
        return now < 2 * max(starts) - min(starts)

    def _even_out(self) -> None:
        """Before a stop of chains that run at once: when the shortest has drawn at least ``KEEP_CHAINS``
        times the longest's iterations, the longer chains' traces end at its length, so that PyMC keeps
        every chain (its rule would leave the shorter out; see ``KEEP_CHAINS``). Chains run one after
        another (their shares) are left as they are."""
        if self.shares is not None and self.wave is None:
            return
        traces = [t for t in self.traces.values() if isinstance(getattr(t, "draw_idx", None), int)]
        if len(traces) < 2:
            return
        shortest = min(t.draw_idx for t in traces)
        if shortest >= KEEP_CHAINS * max(t.draw_idx for t in traces):
            for t in traces:
                t.draw_idx = shortest  # PyMC's NDArray trace: close() keeps the first draw_idx draws

    def record(self) -> dict:
        return {"seconds": self.budget.seconds, "gradient_evaluations": self.budget.gradient_evaluations,
                "used_seconds": round(self.elapsed(), 3), "used_gradient_evaluations": int(self.gradients),
                "exhausted": self.exhausted, "dropped_chains": self.dropped,
                "late_start_gradient_evaluations": int(self.late + self._lag())}


#: the share of a budget (its seconds and gradient evaluations) up to which step 4 goes on towards sharper sds
#: (:data:`~pgpgm.posterior.diagnostics.SD_ERROR`) once R-hat and ESS pass: a default fit that converged in
#: 20 s ends by 45 s of its 60, never at the budget
SHARPEN_SHARE = 0.75

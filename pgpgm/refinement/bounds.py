"""Estimates at a prior bound: the refined value or much of a posterior on the edge of a Uniform prior.

A Uniform prior (lower, upper) is also the box of the least-squares refinement. When the
best fit lies outside it, the refinement stops on the bound and the posterior piles up
against it; the numbers then describe the box, not the data. :func:`bound_report` finds
such parameters, :func:`warn_at_bounds` says so with a :class:`~pgpgm.errors.BoundWarning`.

"On a bound" is judged against the estimate's own uncertainty, not the box: a value small in
absolute terms (0.020 +- 0.005 in a box (0, 30)) is determined by the data and is not at the
bound 0; one within ``REFINED_SE`` standard errors of it is. A posterior piles up against a
bound when more than ``POSTERIOR_FRACTION`` of its draws lie within ``POSTERIOR_SD_BAND`` of
its own sd (and at most ``POSTERIOR_BAND`` of the box width) of the bound: a posterior whose
density is still high at the bound, not one that decays before it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import BoundWarning
from ..priors import Priors

#: without a standard error (or with an infinite one), a refined estimate within this fraction of
#: the box width of a bound is "on" it
REFINED_RTOL = 1e-3
#: with a finite standard error se, a refined estimate within REFINED_SE * se of a bound is on it
#: (its own uncertainty reaches the bound) ...
REFINED_SE = 2.0
#: ... and so is one within this fraction of the box width (the optimizer stopped on the bound)
ACTIVE_RTOL = 1e-6
#: a posterior is "at" a bound when more than POSTERIOR_FRACTION of its draws lie within
#: POSTERIOR_SD_BAND of the draws' sd, and at most POSTERIOR_BAND of the box width, of it
POSTERIOR_BAND = 0.01
POSTERIOR_SD_BAND = 0.5
POSTERIOR_FRACTION = 0.10


@dataclass(frozen=True)
class AtBound:
    """One parameter at a bound of its Uniform prior.

    Attributes
    ----------
    parameter : its name; side : ``"lower"`` or ``"upper"``; bound : the bound's value;
    prior : (lower, upper) of the prior; refined : whether the refined estimate is on it;
    fraction : fraction of the posterior draws within ``band`` of it (NaN without draws)
    band : the distance from the bound that ``fraction`` counts (NaN without draws)
    stderr : the refined estimate's standard error (NaN when not given)
    active : whether the refined estimate is on the bound itself (within 1e-6 of the box width: the
        optimizer stopped there)
    """

    parameter: str
    side: str
    bound: float
    prior: tuple[float, float]
    refined: bool
    fraction: float
    band: float = np.nan
    stderr: float = np.nan
    active: bool = False

    @property
    def spans_box(self) -> bool:
        """Whether the refined estimate's uncertainty (``REFINED_SE`` standard errors) is wider than the
        box: the data hardly determine the parameter within its prior, whichever bound is nearer."""
        lo, hi = self.prior
        return bool(np.isfinite(self.stderr) and REFINED_SE * self.stderr >= hi - lo)

    @property
    def message(self) -> str:
        lo, hi = self.prior
        piled = np.isfinite(self.fraction) and self.fraction > POSTERIOR_FRACTION
        if self.refined and self.spans_box and not self.active and not piled:
            return (f"{self.parameter} is hardly determined within its Uniform prior ({lo:g}, {hi:g}): "
                    f"{REFINED_SE:g} standard errors of the refined estimate ({REFINED_SE * self.stderr:.3g}) are "
                    f"wider than the box, and it is nearest its {self.side} bound {self.bound:g}; fix it, "
                    "reparametrise, or add data that inform it (a wider prior only widens the posterior)")
        what = []
        if self.refined:
            what.append("the refined estimate is on it" + (
                f" (within {REFINED_SE:g} standard errors, se {self.stderr:.3g})" if np.isfinite(self.stderr) else ""))
        if piled:
            what.append(f"{100 * self.fraction:.0f} % of the posterior draws lie within {self.band:.3g} of it "
                        f"(half the draws' sd, at most {100 * POSTERIOR_BAND:g} % of the prior's width)")
        if self.side == "lower" and lo == 0:
            hint = "the parameter may be near 0 (or another one compensates it); check the model, or lower the bound"
        else:
            # ten times the bound where the box starts at 0 or above (a box from 0 is sampled on the log scale, where
            # a wider box costs little): a value many times the bound, e.g. Goodwin's a = 360 in (0, 10), is then one
            # retry away; else doubled
            wider = ((lo, 10 * hi if lo >= 0 else hi + (hi - lo)) if self.side == "upper"
                     else (lo / 10 if lo > 0 else lo - (hi - lo), hi))
            hint = f"widen the prior, e.g. priors={{{self.parameter!r}: ({wider[0]:g}, {wider[1]:g})}}"
        return (f"{self.parameter} is at the {self.side} bound {self.bound:g} of its Uniform prior ({lo:g}, {hi:g}): "
                + " and ".join(what) + f"; {hint}")


def bound_report(priors: Priors, refined: Sequence[float], draws: Mapping[str, np.ndarray] | None = None,
                 stderr: Sequence[float] | None = None) -> tuple[AtBound, ...]:
    """Parameters whose refined estimate or posterior sits on a Uniform prior bound.

    Parameters
    ----------
    priors : the parameter priors (only ``(lower, upper)`` specs are checked)
    refined : (P,) refined estimates, in ``priors.names`` order
    draws : posterior draws by parameter name (any shape), or None (the draws of an exact
        posterior: not step 2's chains, which only locate the basin)
    stderr : (P,) standard errors of ``refined``, or None

    Returns
    -------
    tuple of AtBound (empty when nothing is at a bound). A refined estimate is on a bound
    when within ``REFINED_SE`` (2) standard errors of it or within 1e-6 of the prior's width
    (the optimizer's active bound) - of the nearer bound only, when those standard errors are wider
    than the box (:attr:`AtBound.spans_box`: its message then says the data hardly determine it);
    without a finite standard error, when within 1e-3 of the
    prior's width. A posterior is at a bound when more than 10 % of its draws lie within half
    their sd (at most 1 % of the prior's width) of it.
    """
    out = []
    ses = np.full(len(priors.names), np.nan) if stderr is None else np.asarray(stderr, float)
    for name, spec, value, se in zip(priors.names, priors.specs, refined, ses):
        if callable(spec):
            continue
        lo, hi = float(spec[0]), float(spec[1])
        width = hi - lo
        tol = (max(REFINED_SE * se, ACTIVE_RTOL * width) if np.isfinite(se) and se >= 0 else REFINED_RTOL * width)
        d = None if draws is None or name not in draws else np.asarray(draws[name], float).ravel()
        d = None if d is None else d[np.isfinite(d)]
        band = min(POSTERIOR_SD_BAND * float(np.std(d)), POSTERIOR_BAND * width) if d is not None and d.size else np.nan
        nearer = "lower" if float(value) - lo <= hi - float(value) else "upper"
        for side, b in (("lower", lo), ("upper", hi)):
            # an uncertainty wider than the box reaches both bounds: the nearer one is named
            active = bool(abs(float(value) - b) <= ACTIVE_RTOL * width)
            on = bool(abs(float(value) - b) <= tol) and (side == nearer or active)
            frac = float(np.mean(np.abs(d - b) <= band)) if d is not None and d.size else np.nan
            if on or (np.isfinite(frac) and frac > POSTERIOR_FRACTION):
                out.append(AtBound(name, side, b, (lo, hi), on, frac, band, float(se), active))
    return tuple(out)


def outside_prior_boxes(names: Sequence[str], boxes: Sequence[tuple[float, float]], held: Sequence[float],
                        free: Sequence[float], stderr: Sequence[float], gain: float, failed: str = ""
                        ) -> tuple[str, ...]:
    """One sentence per unknown initial value the data put outside its Uniform prior's box: ``names`` (K,),
    their ``boxes`` (K,) (lower, upper), the values ``held`` (K,) inside them (step 3's refined point) and
    ``free`` (K,) with ``stderr`` (K,) where the initial values are left unbounded, whose negative log
    likelihood is ``gain`` nats lower. Step 3 refines the initial values unbounded first, then, where they
    leave their boxes, held to them (FitzHugh-Nagumo, R observed, ``x0={"V": (-0.3, 0.3)}``: V(0) refined to
    -0.91 +- 0.05 unbounded, -0.3 held; before, the unbounded value was returned). ``failed``: why no
    refinement inside the boxes succeeded (then ``held`` is ``free``, outside them)."""
    out = []
    for name, (lo, hi), h, v, se in zip(names, boxes, held, free, stderr):
        if lo <= v <= hi:
            continue
        if failed:
            out.append(f"{name} is refined to {v:.4g} (standard error {se:.3g}), outside its prior ({lo:g}, {hi:g}): "
                       f"no refinement held inside it succeeded ({failed}); widen the prior, or start elsewhere "
                       f"(init=)")
            continue
        out.append(f"{name} is held at {h:.4g} by its prior ({lo:g}, {hi:g}): the data fit better outside it, at "
                   f"{v:.4g} (standard error {se:.3g}; the negative log likelihood lower by {gain:.3g}); widen the "
                   f"prior if such values are plausible")
    return tuple(out)


def warn_at_bounds(report: Sequence[AtBound], stacklevel: int = 3) -> None:
    """One :class:`~pgpgm.errors.BoundWarning` naming every parameter of ``report``."""
    if report:
        warnings.warn("; ".join(a.message for a in report), BoundWarning, stacklevel=stacklevel)

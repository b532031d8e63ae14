"""Competing optima: other points where the data fit (nearly) as well as at the refined one.

Step 3 keeps the best of its refinements. When the likelihood has a second optimum about as
high - a symmetry of the model, such as the "flip-flop" of a one-compartment model after an
oral dose, whose concentration is the same function of the absorption and elimination rates
exchanged, or a second mode the data cannot rule out - the estimates, their standard errors and
step 4's posterior (whose chains start at the refined point) describe one of them only.
:func:`competing_optima` looks for such optima at little cost, among points the fit has anyway:

- step 3's refinements from its other starts (already refined);
- extra starts: the stop rule's refinements of each chain and its box search's best, which
  may sit in another optimum of equal likelihood (the rule compares likelihoods, not points);
- the refined point with two parameters exchanged (one solve per pair; a refinement only where
  that point fits within ``screen`` nats of the best): exchangeable rate constants are the most
  common exact symmetry of ODE models.

An optimum competes when its negative log likelihood is within ``window`` nats of the best (a
likelihood ratio of e^2 ~ 7.4 by default: the exact posterior then holds a comparable mass
there under a flat prior) and it is distinct: some parameter differs by more than ``z``
standard errors of either optimum (the smaller; and by more than 0.1 % of its value): each lies
outside the other's confidence region. Parameters the data do not
determine (infinite standard errors) do not count: their ridge is reported as such.
Nothing here changes the refined point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ODESolveError
from .bounds import ACTIVE_RTOL
from .least_squares import SHORT_NFEV, LeastSquaresProblem, Refinement, refine

#: nats: an optimum within this of the best negative log likelihood competes with it
COMPETING_NLL = 2.0
#: standard errors (the smaller of the two optima's) by which some parameter of a competing optimum
#: differs from the best
DISTINCT_SE = 5.0
#: nats: a start (an exchange of two parameters, a chain's optimum) is refined only when the
#: likelihood there is within this of the best (at the best's noise parameters)
SCREEN_NLL = 30.0


@dataclass(frozen=True, eq=False)
class CompetingOptimum:
    """An optimum about as good as the refined one.

    Attributes
    ----------
    refinement : the refinement that reached it (its ``theta`` (P,), ``nll``, ``stderr`` ...).
    origin : where its start came from, in words (e.g. ``"ka <-> ke exchanged"``).
    delta_nll : its negative log likelihood minus the best's (nats; may be slightly negative
        within the refinement's tolerance).
    exchanged : the two parameters whose values it holds exchanged with the best's (within 5 %),
        or None.
    on_bounds : its parameters that lie on a bound of the box, in words (``"ke on its upper bound
        0.5"``): an optimum the box cuts off, where the posterior piles up against the bound.
    """

    refinement: Refinement
    origin: str
    delta_nll: float
    exchanged: tuple[str, str] | None = None
    on_bounds: tuple[str, ...] = ()


def loose_bound_starts(best: Refinement, bounds: np.ndarray | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Starts at the bounds of the parameters the data leave loose at ``best``: name -> ((Q,) point,
    (P, 2) bounds that hold the parameter at that bound).

    A parameter is loose when its standard error is finite and exceeds the width of its finite box
    (``bounds`` (P, 2)): the likelihood is nearly flat across the box in it, and a separate optimum,
    often on the box's boundary, may be as good or slightly better than the one the chains found. An
    infinite standard error is a direction the data do not see at all (pk-infusion's ke0 with C alone
    measured; a rate that only enters with an unknown initial value): the likelihood is the same along
    it, so no start there can be better. Each loose parameter gives two starts, the best's unknowns
    with it at each bound, to be refined with it held there (the held bounds) and then freed: from the best's point with it merely
    moved to the bound the others would pull it back (on a long flat ridge every chain and box start can
    end in its interior while the data's optimum, slightly better, lies at the ridge's end on a bound).
    Empty without finite bounds or loose parameters."""
    if bounds is None:
        return {}
    bounds = np.asarray(bounds, float)
    names = best.q_names[:best.theta.size]
    out = {}
    for j, (lo, hi) in enumerate(bounds):
        se = float(best.stderr[j])
        if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo and np.isfinite(se) and se > hi - lo):
            continue
        for side, value in (("lower", lo), ("upper", hi)):
            q = np.array(best.q, float)
            q[j] = value
            held = bounds.copy()
            held[j] = (lo, lo + 1e-9 * (hi - lo)) if side == "lower" else (hi - 1e-9 * (hi - lo), hi)
            out[f"{names[j]} at its {side} bound (loose at the best)"] = (q, held)
    return out


def refine_from_loose_bounds(problem: LeastSquaresProblem, best: Refinement, bounds: np.ndarray | None,
                             estimate_noise, screen: float = SCREEN_NLL) -> dict[str, tuple[np.ndarray, Refinement]]:
    """Refinements from :func:`loose_bound_starts`: each start refined briefly (``SHORT_NFEV``) with its
    parameter held at the bound, then, where that fits within ``screen`` nats of ``best``, freed and
    refined fully. name -> (the free refinement's start (Q,), the refinement); empty when no parameter
    is loose."""
    out = {}
    for name, (q, held_bounds) in loose_bound_starts(best, bounds).items():
        held = refine(problem, q, held_bounds, estimate_noise=estimate_noise, warn=False, max_nfev=SHORT_NFEV,
                      max_rounds=2)
        if held.nll <= best.nll + screen:
            out[name] = (held.q, refine(problem, held.q, bounds, estimate_noise=estimate_noise, warn=False))
    return out


def outside_boxes(q: np.ndarray, names: Sequence[str], boxes: Mapping[str, tuple[float, float]]) -> tuple[str, ...]:
    """The names among ``names`` (Q,) whose values in ``q`` (Q,) lie outside their box in ``boxes``
    (name -> (lower, upper); names not in it have none)."""
    return tuple(n for n, v in zip(names, q) if n in boxes and not boxes[n][0] <= v <= boxes[n][1])


def refine_inside_boxes(problem: LeastSquaresProblem, best: Refinement, points: Mapping[str, np.ndarray],
                        bounds: np.ndarray | None, boxes: Mapping[str, tuple[float, float]], estimate_noise
                        ) -> dict[str, tuple[np.ndarray, Refinement]]:
    """Refinements held to the boxes of the free initial values, where ``best`` has some outside them: where
    an unknown named in ``boxes`` (a q name, e.g. ``"x0[R]"`` -> the (lower, upper) of its Uniform prior) lies
    outside its box at ``best``, each of ``points`` (name -> (Q,): ``best``'s point first, then other starts)
    moved into the boxes and refined within ``bounds`` ((P, 2) of theta, or None) and those boxes. name ->
    (its start (Q,), the refinement); empty when every one is inside at ``best``.

    Step 3 leaves the free initial values unbounded (the data may say they lie outside the user's box,
    which the fit then reports, far above its prior's box or just below 0), while steps 2 and 4 keep to
    their priors; the refined point, step 4's start, is the best of these. ``best``'s point alone is not
    enough: moved into the box it may be where the ODE cannot be solved (one initial value clipped to its
    box while another stays negative), a point then tried again with the other free initial values at the
    problem's starting values (``problem.q0``: the observed states' from the data), or in another basin."""
    names = best.q_names
    if not outside_boxes(best.q, names, boxes):
        return {}
    Q, P = len(names), best.theta.size
    held = np.tile([-np.inf, np.inf], (Q, 1))
    if bounds is not None:
        held[:P] = np.asarray(bounds, float)
    for j, n in enumerate(names):
        if n in boxes:
            held[j] = boxes[n]
    others = np.array([n not in boxes for n in names[P:]])  # the free initial values without a box
    out, seen = {}, []
    for name, point in points.items():
        q = np.clip(np.asarray(point, float), held[:, 0], held[:, 1])
        if any(np.array_equal(q, other) for other in seen):
            continue  # a start that is the best's point (the stop rule's best optimum)
        seen.append(q)
        r = refine(problem, q, held, estimate_noise=estimate_noise, warn=False)
        if not np.isfinite(r.nll) and others.any():  # unsolvable there: the other initial values at their starts
            q2 = q.copy()
            q2[P:][others] = np.asarray(problem.q0, float)[others]
            r2 = refine(problem, q2, held, estimate_noise=estimate_noise, warn=False)
            if np.isfinite(r2.nll):
                q, r = q2, r2
        out[name] = (q, r)
    return out


def on_bounds(theta: np.ndarray, bounds: np.ndarray | None, names: Sequence[str], rtol: float = ACTIVE_RTOL
              ) -> tuple[str, ...]:
    """The entries of ``theta`` (P,) on a bound of ``bounds`` (P, 2) (within ``rtol`` of the box's
    width: :data:`pgpgm.refinement.bounds.ACTIVE_RTOL`, the refined estimate's "on the bound itself"),
    in words; () without bounds."""
    if bounds is None:
        return ()
    out = []
    for name, v, (lo, hi) in zip(names, theta, np.asarray(bounds, float)):
        tol = rtol * (hi - lo) if np.isfinite(hi - lo) else rtol * max(abs(v), 1.0)
        for side, b in (("lower", lo), ("upper", hi)):
            if np.isfinite(b) and abs(v - b) <= tol:
                out.append(f"{name} on its {side} bound {b:g}")
    return tuple(out)


def distinct(a: np.ndarray, b: np.ndarray, se: np.ndarray, z: float = DISTINCT_SE) -> bool:
    """Whether parameter vectors ``a`` and ``b`` (P,) differ by more than ``z`` standard errors
    ``se`` (P,) in some parameter with a finite, positive one (and by more than 0.1 % of it)."""
    a, b, se = (np.asarray(v, float) for v in (a, b, se))
    d = np.abs(a - b)
    ok = np.isfinite(se) & (se > 0)
    return bool(np.any(ok & (d > z * np.where(ok, se, 0.0)) & (d > 1e-3 * np.maximum(np.abs(a), np.abs(b)))))


def exchanged_pair(theta: np.ndarray, best: np.ndarray, names: Sequence[str], rtol: float = 0.05):
    """The pair of parameter names (i, j) whose values in ``theta`` are those of ``best`` exchanged
    (each within ``rtol``; the other parameters may differ), or None."""
    for i in range(len(best)):
        for j in range(i + 1, len(best)):
            if (not np.isclose(best[i], best[j], rtol=rtol) and np.isclose(theta[i], best[j], rtol=rtol)
                    and np.isclose(theta[j], best[i], rtol=rtol)):
                return names[i], names[j]
    return None


def competing_optima(problem: LeastSquaresProblem, best: Refinement, refinements: Sequence[Refinement],
                     starts: Mapping[str, np.ndarray], bounds: np.ndarray | None, names: Sequence[str], *,
                     estimate_noise, window: float = COMPETING_NLL, z: float = DISTINCT_SE,
                     screen: float = SCREEN_NLL, exchange: bool = True,
                     labels: Sequence[str] | None = None) -> tuple[CompetingOptimum, ...]:
    """Optima distinct from ``best`` whose negative log likelihood is within ``window`` nats of it.

    Parameters
    ----------
    problem : step 3's least-squares problem
    best : the refined optimum kept (its ``q`` (Q,) = theta (P,) then the free initial values)
    refinements : step 3's other refinements (tested as they are); ``labels`` name them
    starts : name -> (P,) or (Q,) points to refine from when they are distinct from ``best`` and
        fit within ``screen`` nats of it (a (P,) point takes ``best``'s free initial values)
    bounds : (P, 2) the parameters' bounds, or None
    names : (P,) the parameter names
    estimate_noise : as :func:`pgpgm.refine`'s
    exchange : also start from ``best`` with each pair of parameters exchanged (within ``bounds``)

    Returns
    -------
    The competing optima, best first, each distinct from ``best`` and from each other.
    """
    P = len(best.theta)
    if not np.isfinite(best.nll):
        return ()
    se = best.stderr
    found: list[CompetingOptimum] = []

    def consider(r: Refinement, origin: str) -> None:
        if not np.isfinite(r.nll) or r.nll - best.nll > window:
            return
        smaller = lambda other: np.fmin(se, other.stderr)  # outside either optimum's own uncertainty
        if not distinct(r.theta, best.theta, smaller(r), z):
            return
        if any(not distinct(r.theta, o.refinement.theta, smaller(o.refinement), z) for o in found):
            return
        found.append(CompetingOptimum(r, origin, float(r.nll - best.nll), exchanged_pair(r.theta, best.theta, names),
                                      on_bounds(r.theta, bounds, names)))

    for k, r in enumerate(refinements):
        if r is not best:
            consider(r, labels[k] if labels is not None else f"refinement start {k}")
    points = {}
    for name, q in starts.items():
        q = np.asarray(q, float)
        q = np.concatenate([q[:P], best.q[P:]]) if q.size != best.q.size else q
        points[name] = q
    if exchange:
        for i in range(P):
            for j in range(i + 1, P):
                q = best.q.copy()
                q[[i, j]] = q[[j, i]]
                inside = bounds is None or all(bounds[k, 0] <= q[k] <= bounds[k, 1] for k in (i, j))
                if inside:
                    points[f"{names[i]} <-> {names[j]} exchanged"] = q
    for name, q in points.items():
        if not distinct(q[:P], best.theta, se, z):
            continue
        try:
            near = problem.nll(q, best.noise_sd) - best.nll <= screen
        except ODESolveError:
            near = False
        if near:
            consider(refine(problem, q, bounds, estimate_noise=estimate_noise, warn=False), name)
    return tuple(sorted(found, key=lambda o: o.delta_nll))


def describe(optima: Sequence[CompetingOptimum], best: Refinement, names: Sequence[str]) -> str:
    """The warning's text for ``optima`` (not empty) around the refined point ``best``."""
    point = lambda theta: ", ".join(f"{n} {v:.4g}" for n, v in zip(names, theta))
    parts = []
    for o in optima:
        notes = ([f"{o.exchanged[0]} and {o.exchanged[1]} exchanged"] if o.exchanged else []) + list(o.on_bounds)
        why = f" ({'; '.join(notes)})" if notes else ""
        parts.append(f"{point(o.refinement.theta)}{why}: negative log likelihood {o.refinement.nll:.6g}, "
                     f"{o.delta_nll:+.3g} nats from the refined point")
    hint = ("; a symmetry of the model: narrow the prior box to the branch you mean (e.g. an upper bound of one "
            "parameter below the other's lower bound)" if any(o.exchanged for o in optima) else
            "; the posterior may have a mode there: fit with narrower priors around each, or measure more")
    return (f"the data fit about as well at {len(optima)} other point(s) as at the refined one ({point(best.theta)}, "
            f"negative log likelihood {best.nll:.6g}): " + "; ".join(parts)
            + ". The estimates, standard errors and step 4's posterior describe the refined point's optimum only"
            + hint + " (result.competing_optima)")

"""Convergence diagnostics that speak: R-hat, bulk and tail ESS, divergences, and warnings."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import arviz_stats
import numpy as np
import xarray as xr

from ..errors import ConvergenceWarning, DataError, PrecisionWarning
from .budget import SHARPEN_SHARE, PosteriorBudget

#: The thresholds of a converged posterior (Vehtari et al. 2021).
RHAT_MAX, ESS_MIN = 1.01, 400
#: the Monte Carlo error of every variable's posterior sd, relative to the sd, that step 4 goes on towards
#: once R-hat and ESS pass, as far as its budget affords (:func:`pgpgm.posterior.rounds.run_nuts`). At ESS 400
#: a Gaussian posterior's sd is uncertain by ~3.5 %, a heavy-tailed one's (kurtosis ~14, as ODE posteriors
#: with lognormal noise or an unknown initial value can be) by 7-14 %, too much for an sd that should be right
#: within 10 %; 5 % asks those posteriors for ~2-8x the draws and a Gaussian one for none
SD_ERROR = 0.05
#: the fewest draws per chain whose R-hat and ESS :func:`mixing_problems` judges (split R-hat halves each chain)
MIN_DRAWS = 4


def check_sd_error(sd_error, name: str = "sd_error") -> float | None:
    """``sd_error`` as a float (None: no such goal), or a :class:`~pgpgm.errors.DataError` naming ``name``
    unless it is a number in (0, 1)."""
    if sd_error is None:
        return None
    if isinstance(sd_error, bool) or not (isinstance(sd_error, int | float | np.integer | np.floating)
                                          and 0 < sd_error < 1):
        raise DataError(f"{name} must be a number in (0, 1) (the Monte Carlo error of each posterior sd, relative "
                        f"to the sd, that step 4 goes on towards) or None, got {sd_error!r}")
    return float(sd_error)


def sd_errors(tree, var_names: Sequence[str]) -> np.ndarray:
    """(variables,) each variable's posterior sd's Monte Carlo standard error (ArviZ's ``mcse``, method
    ``"sd"``: from the chains' autocorrelation and the draws' kurtosis) over the sd; NaN where the sd is 0."""
    names = list(var_names)
    if not names:
        return np.zeros(0)
    post = tree.posterior if hasattr(tree, "posterior") else tree["posterior"]
    mcse = arviz_stats.mcse(tree, var_names=names, method="sd")
    sd = np.array([float(np.asarray(post[n].values, float).std(ddof=1)) for n in names])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.array([float(mcse[n]) for n in names]) / np.where(sd > 0, sd, np.nan)


def check_ess(ess, name: str = "ess") -> float:
    """``ess`` as a float, or a :class:`~pgpgm.errors.DataError` naming ``name`` unless it is a number >= 1."""
    if isinstance(ess, bool) or not (isinstance(ess, int | float | np.integer | np.floating) and 1 <= ess < np.inf):
        raise DataError(f"{name} must be a number >= 1 (the bulk and tail ESS each variable must reach), got {ess!r}")
    return float(ess)


def diagnose(tree, var_names: Sequence[str], ess_min: float = ESS_MIN) -> xr.Dataset:
    """R-hat (rank-normalised), bulk and tail ESS per variable, and the divergence count.

    ``ess_min`` is the ESS (bulk and tail) the checks of :func:`mixing_problems` ask of every variable.

    Returns
    -------
    xarray.Dataset
        ``rhat``, ``ess_bulk``, ``ess_tail``, ``sd_error`` (the sd's Monte Carlo error over the sd,
        :func:`sd_errors`) (variable); attrs ``divergences``, ``chains``, ``draws``, ``ess_min``.
    """
    names = list(var_names)
    post = tree.posterior if hasattr(tree, "posterior") else tree["posterior"]
    div = 0
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"].data_vars:
        div = int(np.asarray(tree["sample_stats"]["diverging"]).sum())
    values = {"rhat": [], "ess_bulk": [], "ess_tail": [], "sd_error": []}  # empty without variables
    if names:
        values = {"rhat": arviz_stats.rhat(tree, var_names=names),
                  "ess_bulk": arviz_stats.ess(tree, var_names=names, method="bulk"),
                  "ess_tail": arviz_stats.ess(tree, var_names=names, method="tail")}
        values = {k: [float(v[n]) for n in names] for k, v in values.items()}
        values["sd_error"] = list(sd_errors(tree, names))
    return xr.Dataset(
        {k: ("variable", np.asarray(v, float)) for k, v in values.items()},
        coords={"variable": np.asarray(names, dtype=str)},
        attrs={"divergences": div, "chains": int(post.sizes["chain"]), "draws": int(post.sizes["draw"]),
               "ess_min": float(ess_min)},
    )


def problems(diag: xr.Dataset) -> list[str]:
    """Plain-language findings: variables with R-hat > 1.01 or ESS below ``diag.attrs["ess_min"]`` (400), and
    divergences."""
    out = mixing_problems(diag)
    if diag.attrs.get("divergences", 0):
        out.append(f"{diag.attrs['divergences']} divergent transitions")
    return out


def mixing_problems(diag: xr.Dataset) -> list[str]:
    """The findings of :func:`problems` that more draws can resolve: R-hat > 1.01, ESS below
    ``diag.attrs["ess_min"]`` (400 by default; not divergences)."""
    draws = int(diag.attrs.get("draws", MIN_DRAWS))
    if draws < MIN_DRAWS:  # R-hat and ESS of so few draws are nan or noise: say what happened instead
        return [f"only {draws} draws per chain, too few to judge R-hat and ESS" if draws else "no draws"]
    out = []
    ess_min = float(diag.attrs.get("ess_min", ESS_MIN))
    rhat = diag["rhat"].to_series()
    ess = np.minimum(diag["ess_bulk"].values, diag["ess_tail"].values)
    bad = rhat[~(rhat <= RHAT_MAX)]
    if len(bad):
        out.append("R-hat > 1.01 for " + ", ".join(f"{k} ({v:.3f})" for k, v in bad.items()))
    low = [f"{n} ({e:.0f})" for n, e in zip(diag["variable"].values, ess) if not e >= ess_min]
    if low:
        out.append(f"ESS < {ess_min:g} for " + ", ".join(low))
    return out


def warn_if_unconverged(diag: xr.Dataset, label: str, notes: Sequence[str] = (), stacklevel: int = 3) -> None:
    """Warn (:class:`ConvergenceWarning`) naming every failed check of the ``label`` posterior, and
    ``notes`` (e.g. a budget that stopped it, separate modes: :func:`pgpgm.posterior.diagnostics.posterior_notes`)."""
    found = problems(diag)
    if found and not notes and not mixing_problems(diag):  # divergences alone: R-hat and ESS hold
        warnings.warn(f"the {label} posterior has {found[0]} (R-hat <= {RHAT_MAX:g} and ESS >= "
                      f"{diag.attrs.get('ess_min', ESS_MIN):g} hold): "
                      "its draws may miss a region where the posterior bends sharply. See where they are "
                      "(posterior.sample_stats['diverging']); a parameter against a prior bound or one that "
                      "spans orders of magnitude on its own scale is the usual cause.",
                      ConvergenceWarning, stacklevel=stacklevel)
    elif found or notes:
        warnings.warn(f"the {label} posterior is not converged: " + "; ".join([*found, *notes])
                      + (". Run longer chains (draws=, tune=) or check the model." if not notes else "."),
                      ConvergenceWarning, stacklevel=stacklevel)


def causes_of_poor_mixing(undetermined: Sequence[str], at_bounds: Sequence) -> list[str]:
    """Notes for a ConvergenceWarning of step 4 whose chains mix poorly: the refined point's
    ``undetermined`` unknowns (infinite standard errors) and the parameters on a prior bound
    (``at_bounds``: :class:`pgpgm.refinement.AtBound`, or anything with ``parameter`` and ``side``)."""
    out = []
    if undetermined:
        out.append(f"the data do not determine {', '.join(undetermined)} (infinite standard errors at the refined "
                   "point): such a posterior spreads over the prior's whole range, which the chains cross slowly; "
                   "fix it (fixed=) or give it a tighter prior")
    if at_bounds:
        named = ", ".join(f"{a.parameter} ({a.side})" for a in at_bounds)
        out.append(f"{named} at a bound of the prior box: chains pile up against a bound and mix slowly there; "
                   "widen the box (see the BoundWarning)")
    return out


#: two chains sit in separate modes when, for some variable, their means differ by more than this
#: many within-chain sds (the root mean square of the two chains' sds); one posterior mode puts
#: chain means within a few Monte-Carlo errors (a fraction of an sd) of each other
MODE_SEPARATION = 4.0
#: a chain is settled when the means of its two halves differ by at most this many of its own sds
#: (a chain still travelling between regions is not a mode of its own)
SETTLED_SDS = 1.0
#: a chain is stuck - settled where it is, however its halves differ - when its sd in every variable is at
#: most this fraction of the largest chain sd of that variable: a chain whose step size collapsed (e.g. at
#: a prior's bound, ~1000 leapfrog steps per draw) has sds of 1e-14 to 1e-8 and drifts by more than that,
#: where the other chains' sds are of order 0.1-1
STUCK_FRACTION = 1e-4


@dataclass(frozen=True)
class Mode:
    """Chains that sit together in one mode of a posterior, apart from the other chains.

    Attributes
    ----------
    chains : the chain indices; mean : each variable's mean over their draws;
    log_density : the mean log density of their draws (PyMC's ``lp`` or nutpie's ``logp``: the model's
        log density in the sampler's space, nutpie's whitened by a constant shift; NaN when the tree has none)
    """

    chains: tuple[int, ...]
    mean: Mapping[str, float]
    log_density: float

    def record(self) -> dict:
        return {"chains": list(self.chains), "mean": dict(self.mean), "log_density": self.log_density}


def find_modes(tree, var_names: Sequence[str], separation: float = MODE_SEPARATION) -> tuple[Mode, ...]:
    """The separate modes the chains of ``tree`` sit in (empty when they sit in one).

    Chains are grouped by linking every two whose means differ by at most ``separation``
    within-chain sds in every variable of ``var_names``; there are modes when more than one group
    forms and every group holds a settled chain (its halves' means within ``SETTLED_SDS`` of its
    sd: a chain that stays where it is, not one on its way; or a stuck chain, see
    :data:`STUCK_FRACTION`). Sorted by ``log_density``, highest first.
    """
    post = tree.posterior if hasattr(tree, "posterior") else tree["posterior"]
    names = [n for n in var_names if n in post]
    C, D = int(post.sizes["chain"]), int(post.sizes["draw"])
    if C < 2 or D < 4 or not names:
        return ()
    X = np.stack([np.asarray(post[n].values, float).reshape(C, D) for n in names], axis=-1)  # (C, D, V)
    mean, sd = X.mean(1), X.std(1)
    half = D // 2
    stuck = np.all(sd <= STUCK_FRACTION * sd.max(0), axis=1) & np.any(sd.max(0) > 0)
    settled = np.all(np.abs(X[:, :half].mean(1) - X[:, half:].mean(1)) <= SETTLED_SDS * sd, axis=1) | stuck
    group = list(range(C))

    def root(i):
        while group[i] != i:
            i = group[i]
        return i

    for i in range(C):
        for j in range(i + 1, C):
            scale = np.sqrt((sd[i] ** 2 + sd[j] ** 2) / 2)
            if np.all(np.abs(mean[i] - mean[j]) <= separation * scale):
                group[root(j)] = root(i)
    members: dict[int, list[int]] = {}
    for c in range(C):
        members.setdefault(root(c), []).append(c)
    if len(members) < 2 or not all(any(settled[c] for c in m) for m in members.values()):
        return ()
    lp = None
    stats = tree["sample_stats"] if "sample_stats" in tree.children else None
    key = next((k for k in ("lp", "logp") if stats is not None and k in stats.data_vars), None)
    if key is not None:
        lp = np.asarray(stats[key].values, float).reshape(C, -1)
    modes = [Mode(tuple(m), {n: float(X[m, :, k].mean()) for k, n in enumerate(names)},
                  float(lp[m].mean()) if lp is not None else float("nan")) for m in members.values()]
    return tuple(sorted(modes, key=lambda m: -m.log_density if np.isfinite(m.log_density) else np.inf))


def modes_note(modes: Sequence[Mapping]) -> str:
    """One sentence naming every mode of ``modes`` (records of :meth:`Mode.record`, optionally with
    ``refined`` (the optimum the mode's mean refines to, by parameter) and ``nll`` (its negative log
    likelihood), as :func:`pgpgm.fit` adds them)."""
    parts = []
    for m in modes:
        chains = ", ".join(str(c) for c in m["chains"])
        where = ", ".join(f"{k}={v:.4g}" for k, v in m["mean"].items())
        text = (f"chain{'s' if len(m['chains']) > 1 else ''} {chains} at {where} "
                f"(mean log density {m['log_density']:.1f}")
        if "refined" in m:
            text += (", refines to " + ", ".join(f"{k}={v:.4g}" for k, v in m["refined"].items())
                     + f" with negative log likelihood {m['nll']:.2f}")
        parts.append(text + ")")
    return (f"the chains sit in {len(modes)} separate modes, so their pooled draws are not one posterior: "
            + "; ".join(parts) + ". The first has the highest mean log density; fit again from the best one "
            "(init=, narrower priors) or give each mode its own run")


def warn_if_imprecise(tree, label: str = "NUTS", stacklevel: int = 3) -> None:
    """Warn (:class:`~pgpgm.errors.PrecisionWarning`) naming every variable whose posterior sd has a Monte
    Carlo error above the goal recorded in ``tree.attrs["pgpgm_sd_error"]`` (:func:`run_nuts`'s ``sd_error``;
    none recorded or a goal of None: no warning). For draws that passed R-hat and ESS (the callers check)."""
    record = json.loads(tree.attrs.get("pgpgm_sd_error", "{}"))
    goal, errors = record.get("goal"), record.get("errors", {})
    over = sorted(((e, n) for n, e in errors.items() if goal is not None and np.isfinite(e) and e > goal),
                  reverse=True)
    if not over:
        return
    named = ", ".join(f"{n} ({e:.1%})" for e, n in over)
    warnings.warn(f"the {label} posterior's sds of {named} are known less precisely than sd_error={goal:g} asks "
                  f"(Monte Carlo error over the sd; R-hat and ESS hold): the chains go on for sharper sds within "
                  f"{SHARPEN_SHARE:.0%} of the budget and up to their most draws, and draws with divergences are not "
                  "extended. The error falls as 1/sqrt(draws): a larger NUTS(budget=...) or more draws sharpen them "
                  "(heavy-tailed marginals need the most); NUTS(sd_error=None) stops once R-hat and ESS pass.",
                  PrecisionWarning, stacklevel=stacklevel)


def posterior_notes(tree) -> list[str]:
    """Plain-language notes on a step-4 posterior beyond R-hat, ESS and divergences: the budget
    that stopped it (what ran out, what was used, what to try) and the separate modes its chains
    sit in (from ``tree.attrs``, see :func:`sample_posterior`)."""
    out = []
    spent = json.loads(tree.attrs.get("pgpgm_budget", "{}"))
    if spent.get("exhausted"):
        limit = PosteriorBudget(spent.get("seconds"), spent.get("gradient_evaluations"))
        more = PosteriorBudget(None if limit.seconds is None else 4 * limit.seconds,
                               None if limit.gradient_evaluations is None else 4 * limit.gradient_evaluations)
        out.append(f"step 4 stopped at its budget ({spent['exhausted']} ran out: {spent['used_seconds']:.0f} s and "
                   f"{spent['used_gradient_evaluations']} gradient evaluations used of {limit.describe()}) after "
                   f"{tree.attrs.get('pgpgm_rounds', 1)} round(s)"
                   + (", while tuning (these draws are tuning iterations)" if tree.attrs.get("pgpgm_tuning_draws")
                      else "")
                   + (f"; it stopped {spent['dropped_chains']} chain(s) before they had drawn a quarter as much "
                      "as the others (they ran slower or started late), and they were left out"
                      if spent.get("dropped_chains") else "")
                   + f"; these draws are what it had. Try posterior=pgpgm.NUTS(budget=pgpgm.PosteriorBudget({more.seconds!r}, "
                   f"{more.gradient_evaluations!r})), posterior='laplace' (seconds), or check the model and its "
                   "priors (a posterior that is hard to sample often has a second mode or a wall)")
    modes = json.loads(tree.attrs.get("pgpgm_modes", "[]"))
    if len(modes) > 1:
        out.append(modes_note(modes))
    return out

"""Simulation-based calibration (SBC, Talts et al. 2018): is a posterior as wide as it says?

Draw the parameters from the prior, simulate data, fit, and record where the truth falls among the posterior's
draws. For a calibrated posterior every rank is equally likely and an interval of probability p holds the truth
in a share p of the data sets. :func:`rank` gives one data set's ranks, :func:`uniformity` tests a collection
of them, :func:`coverage` counts how often central intervals hold the truth, with the binomial band it should
lie in; :func:`calibration_record` keeps one data set's, :func:`calibration_table` puts them together per parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from ..errors import DataError

#: draws a rank is taken among (thinned evenly from the posterior's): ranks run 0..RANK_DRAWS
RANK_DRAWS = 99


def rank(draws: np.ndarray, truth: float, thin_to: int = RANK_DRAWS) -> int:
    """The number of ``thin_to`` posterior draws (taken evenly from ``draws``, any shape) below ``truth``: 0 to
    ``thin_to``; ties (a draw equal to the truth) are split at random as SBC prescribes."""
    d = np.asarray(draws, float).reshape(-1)
    d = d[np.isfinite(d)]
    if d.size < thin_to:
        raise DataError(f"a rank needs at least {thin_to} finite draws, got {d.size}")
    d = d[np.linspace(0, d.size - 1, thin_to).astype(int)]
    below, equal = int(np.sum(d < truth)), int(np.sum(d == truth))
    return below + (int(np.random.default_rng(int(below)).integers(0, equal + 1)) if equal else 0)


def uniformity(ranks: Sequence[int], thin_to: int = RANK_DRAWS, bins: int = 10) -> float:
    """The p-value of a chi-square test that ``ranks`` (0..``thin_to``) are uniform, over ``bins`` equal bins."""
    r = np.asarray(ranks, int)
    if r.size < 2 * bins:
        raise DataError(f"a uniformity test over {bins} bins needs at least {2 * bins} ranks, got {r.size}")
    counts = np.bincount(np.minimum(r * bins // (thin_to + 1), bins - 1), minlength=bins)
    return float(stats.chisquare(counts).pvalue)


def coverage(lower: Sequence[float], upper: Sequence[float], truth: Sequence[float]) -> float:
    """The share of data sets whose interval [``lower``, ``upper``] holds the ``truth`` (each (K,))."""
    lo, hi, t = (np.asarray(v, float) for v in (lower, upper, truth))
    return float(np.mean((lo <= t) & (t <= hi)))


def binomial_band(n: int, p: float, level: float = 0.99) -> tuple[float, float]:
    """The central ``level`` band of the share of ``n`` data sets an interval of probability ``p`` covers."""
    lo, hi = stats.binom.interval(level, n, p)
    return float(lo / n), float(hi / n)


def calibration_table(records: Sequence[Mapping], names: Sequence[str], alpha: float = 0.01) -> pd.DataFrame:
    """Per parameter of ``names``: the data sets, the ranks' uniformity p-value and whether it passes ``alpha``
    after Bonferroni over the parameters, the 50 % and 90 % central intervals' coverage and whether the 90 % one
    lies in its 99 % binomial band. ``records``: one per data set, with ``truth`` (name -> value), ``rank``
    (name -> rank) and ``q05``, ``q25``, ``q75``, ``q95`` (name -> the posterior's quantiles)."""
    rows = []
    for n in names:
        rs = [r for r in records if n in r.get("rank", {})]
        truth = [r["truth"][n] for r in rs]
        c50 = coverage([r["q25"][n] for r in rs], [r["q75"][n] for r in rs], truth)
        c90 = coverage([r["q05"][n] for r in rs], [r["q95"][n] for r in rs], truth)
        band = binomial_band(len(rs), 0.9)
        p = uniformity([r["rank"][n] for r in rs]) if len(rs) >= 20 else np.nan
        rows.append({"parameter": n, "sets": len(rs), "uniformity_p": p,
                     "uniform": bool(p > alpha / len(names)), "coverage_50": c50, "coverage_90": c90,
                     "band_90": f"[{band[0]:.2f}, {band[1]:.2f}]", "covers": bool(band[0] <= c90 <= band[1])})
    return pd.DataFrame(rows).set_index("parameter")


def calibration_record(posterior, truth: Mapping[str, float]) -> dict:
    """One data set's record for :func:`calibration_table` from a posterior's draws (an ArviZ DataTree or a
    mapping name -> draws) and the truth (name -> value); ``rank_of``: the draws each rank is among."""
    post = posterior.posterior if hasattr(posterior, "posterior") else posterior
    out = {"truth": {k: float(v) for k, v in truth.items()}, "rank": {}, "rank_of": RANK_DRAWS}
    for q in ("q05", "q25", "q75", "q95"):
        out[q] = {}
    for name, value in truth.items():
        d = np.asarray(post[name], float).reshape(-1)
        out["rank"][name] = rank(d, float(value))
        for q, level in (("q05", 0.05), ("q25", 0.25), ("q75", 0.75), ("q95", 0.95)):
            out[q][name] = float(np.quantile(d, level))
    return out

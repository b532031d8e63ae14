"""Convergence diagnostics that speak: R-hat, bulk and tail ESS, divergences, and warnings."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import arviz_stats
import numpy as np
import xarray as xr

from .errors import ConvergenceWarning

#: The thresholds of a converged posterior (Vehtari et al. 2021).
RHAT_MAX, ESS_MIN = 1.01, 400


def diagnose(tree, var_names: Sequence[str]) -> xr.Dataset:
    """R-hat (rank-normalised), bulk and tail ESS per variable, and the divergence count.

    Returns
    -------
    xarray.Dataset
        ``rhat``, ``ess_bulk``, ``ess_tail`` (variable); attrs ``divergences``, ``chains``, ``draws``.
    """
    names = list(var_names)
    post = tree.posterior if hasattr(tree, "posterior") else tree["posterior"]
    div = 0
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"].data_vars:
        div = int(np.asarray(tree["sample_stats"]["diverging"]).sum())
    values = {"rhat": [], "ess_bulk": [], "ess_tail": []}  # empty without variables (a fit with no free parameter)
    if names:
        values = {"rhat": arviz_stats.rhat(tree, var_names=names),
                  "ess_bulk": arviz_stats.ess(tree, var_names=names, method="bulk"),
                  "ess_tail": arviz_stats.ess(tree, var_names=names, method="tail")}
        values = {k: [float(v[n]) for n in names] for k, v in values.items()}
    return xr.Dataset(
        {k: ("variable", np.asarray(v, float)) for k, v in values.items()},
        coords={"variable": np.asarray(names, dtype=str)},
        attrs={"divergences": div, "chains": int(post.sizes["chain"]), "draws": int(post.sizes["draw"])},
    )


def problems(diag: xr.Dataset) -> list[str]:
    """Plain-language findings: variables with R-hat > 1.01 or ESS < 400, and divergences."""
    out = []
    rhat = diag["rhat"].to_series()
    ess = np.minimum(diag["ess_bulk"].values, diag["ess_tail"].values)
    bad = rhat[~(rhat <= RHAT_MAX)]
    if len(bad):
        out.append("R-hat > 1.01 for " + ", ".join(f"{k} ({v:.3f})" for k, v in bad.items()))
    low = [f"{n} ({e:.0f})" for n, e in zip(diag["variable"].values, ess) if not e >= ESS_MIN]
    if low:
        out.append("ESS < 400 for " + ", ".join(low))
    if diag.attrs.get("divergences", 0):
        out.append(f"{diag.attrs['divergences']} divergent transitions")
    return out


def warn_if_unconverged(diag: xr.Dataset, label: str) -> None:
    """Warn (:class:`ConvergenceWarning`) naming every failed check of the ``label`` posterior."""
    found = problems(diag)
    if found:
        warnings.warn(f"the {label} posterior is not converged: " + "; ".join(found)
                      + ". Run longer chains (draws=, tune=) or check the model.", ConvergenceWarning, stacklevel=3)

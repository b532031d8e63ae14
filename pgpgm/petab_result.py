"""What :func:`pgpgm.fit_petab` found: :class:`PetabResult`, in PEtab's conventions.

Estimates are on the estimated parameters' ``parameterScale`` (as a fitter and step 4 work) and, for
:attr:`PetabResult.petab_parameters`, on the linear scale; :attr:`PetabResult.nll` is PEtab's negative
log-likelihood (minus the PEtab test suite's ``llh``); :meth:`PetabResult.to_petab` writes a simulation table and
the parameter table with the estimates, in PEtab's forms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from .petab import PetabProblem
from .refinement.multistart import SearchResult

#: how many of step 4's draws the figures simulate for their bands
BAND_DRAWS = 100


@dataclass(frozen=True, eq=False)
class PetabResult:
    """Everything :func:`pgpgm.fit_petab` produced.

    Attributes
    ----------
    problem : the :class:`~pgpgm.petab.PetabProblem`
    estimates : xarray.Dataset over ``parameter`` (V_e,), the estimated parameters in the problem's order:
        ``refined`` and ``stderr`` on the parameters' scales (the standard error from the curvature of the nll at
        the optimum; NaN where it does not determine one), ``refined_linear``, ``lower``, ``upper`` (on the
        scales), ``nominal`` (the table's nominalValue, linear), and with step 4 ``posterior_mean``,
        ``posterior_sd`` (on the scales); coordinate ``scale``; attrs ``nll``, ``search`` (which search ran)
    search : the :class:`~pgpgm.refinement.multistart.SearchResult` of step 3
    posterior : ArviZ DataTree of step 4 on the parameters' scales (NUTS or the Laplace approximation), or None
    diagnostics : step 4's R-hat, ESS, divergences (xarray.Dataset), or None
    timings : seconds per step
    """

    problem: PetabProblem
    estimates: xr.Dataset
    search: SearchResult
    posterior: Any = None
    diagnostics: xr.Dataset | None = None
    timings: Mapping[str, float] | None = None

    @property
    def nll(self) -> float:
        """PEtab's negative log-likelihood at the refined optimum (nats; minus the test suite's ``llh``)."""
        return float(self.estimates.attrs["nll"])

    @property
    def z(self) -> np.ndarray:
        """(V_e,) the refined estimated parameters on their scales."""
        return self.estimates["refined"].values

    @property
    def petab_parameters(self) -> dict[str, float]:
        """Every estimated parameterId -> its refined value on the linear scale."""
        return {str(p): float(v) for p, v in zip(self.estimates["parameter"].values,
                                                 self.estimates["refined_linear"].values)}

    def parameters(self) -> dict[str, float]:
        """Every parameter of the table (linear scale): the estimates and the others' nominal values, as
        :meth:`~pgpgm.petab.PetabProblem.nll` and :meth:`~pgpgm.petab.PetabProblem.simulate` take them."""
        return self.problem.from_scale(self.z)

    def parameter_table(self) -> pd.DataFrame:
        """One row per estimated parameter: scale, bounds, nominal, refined (scale and linear), stderr and, with
        step 4, the posterior mean and sd (on the scale)."""
        columns = [c for c in ("scale", "lower", "upper", "nominal", "refined", "stderr", "refined_linear",
                               "posterior_mean", "posterior_sd") if c in self.estimates or c == "scale"]
        table = pd.DataFrame({c: (self.estimates.coords["scale"].values if c == "scale" else self.estimates[c].values)
                              for c in columns}, index=pd.Index(self.estimates["parameter"].values, name="parameter"))
        return table

    def simulate(self) -> pd.DataFrame:
        """PEtab's simulation table at the refined optimum."""
        return self.problem.simulate(self.parameters())

    def to_petab(self, folder: str | Path) -> dict[str, Path]:
        """Write ``simulation.tsv`` (the simulation table at the refined optimum) and ``parameters.tsv`` (the
        problem's parameter table with each estimated parameter's ``nominalValue`` set to its estimate) into
        ``folder`` (created); returns their paths by name."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = {"simulation": folder / "simulation.tsv", "parameters": folder / "parameters.tsv"}
        self.simulate().to_csv(out["simulation"], sep="\t", index=False)
        table = pd.read_csv(self.problem.files.parameters, sep="\t", dtype={"parameterId": str})
        estimates = self.petab_parameters
        hit = table["parameterId"].isin(list(estimates))
        table.loc[hit, "nominalValue"] = table.loc[hit, "parameterId"].map(estimates)
        table.to_csv(out["parameters"], sep="\t", index=False)
        return out

    def plot(self, *, bands: bool = True):
        """One panel per observable and condition: the measurements, the fit at the refined optimum and, with
        step 4's draws (``bands``), their 94 % band at the measurement times (PEtab's values, untransformed).
        Returns the matplotlib Figure."""
        import matplotlib.pyplot as plt

        table = self.simulate()
        times, values = self.problem.measurements.time, self.problem.measurements.value  # (D,), the rows' order
        simulated = table["simulation"].to_numpy(float)
        keys = list(dict.fromkeys(zip(table["observableId"], table["simulationConditionId"])))
        band = self._bands(table) if bands and self.posterior is not None else None
        cols = min(3, len(keys))
        rows = -(-len(keys) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        for ax, (obs, cond) in zip(axes.flat, keys):
            sel = ((table["observableId"] == obs) & (table["simulationConditionId"] == cond)).to_numpy()
            t = times[sel]
            order = np.argsort(t, kind="stable")
            if band is not None:
                ax.fill_between(t[order], band[0][sel][order], band[1][sel][order], alpha=0.3, label="94 % band")
            ax.plot(t[order], simulated[sel][order], "-" if np.unique(t).size > 1 else "s", label="fit")
            ax.plot(t, values[sel], "o", ms=3, color="k", label="data")
            ax.set_title(f"{obs}, {cond}", fontsize=9)
            ax.set_xlabel("time")
        for ax in list(axes.flat)[len(keys):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=8)
        fig.tight_layout()
        return fig

    def _bands(self, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(3 %, 97 %) quantiles (D,) of the simulated values over up to :data:`BAND_DRAWS` of step 4's draws."""
        post = self.posterior.posterior
        names = [str(p) for p in self.estimates["parameter"].values]
        draws = np.stack([post[n].values.reshape(-1) for n in names], 1)
        pick = np.unique(np.linspace(0, draws.shape[0] - 1, min(BAND_DRAWS, draws.shape[0])).astype(int))
        sims = []
        for z in draws[pick]:
            try:
                sims.append(self.problem.simulate(self.problem.from_scale(z))["simulation"].to_numpy())
            except Exception:  # noqa: BLE001  (a draw whose solve fails leaves the band)
                continue
        if not sims:
            n = len(table)
            return np.full(n, np.nan), np.full(n, np.nan)
        return tuple(np.quantile(np.array(sims), [0.03, 0.97], axis=0))

    def summary(self) -> str:
        """A few lines: the search, the optimum and step 4's convergence."""
        lines = [f"{self.problem!r}", f"search: {self.estimates.attrs['search']}",
                 f"nll at the refined optimum: {self.nll:.6g}"]
        if self.diagnostics is not None:
            lines.append(f"step 4: max R-hat {float(self.diagnostics['rhat'].max()):.3f}, min ESS "
                         f"{float(self.diagnostics['ess_bulk'].min()):.0f}, "
                         f"{int(self.diagnostics.attrs.get('divergences', 0))} divergences")
        return "\n".join(lines)


def petab_estimates(problem: PetabProblem, search: SearchResult, stderr: np.ndarray, posterior=None) -> xr.Dataset:
    """The estimates Dataset of a :class:`PetabResult` (see its attributes)."""
    est = problem.estimated
    lower, upper = problem.bounds()
    names = [p.id for p in est]
    linear = problem.from_scale(search.best)
    data = {"refined": ("parameter", search.best), "stderr": ("parameter", np.asarray(stderr, float)),
            "refined_linear": ("parameter", [linear[n] for n in names]), "lower": ("parameter", lower),
            "upper": ("parameter", upper), "nominal": ("parameter", [p.nominal for p in est])}
    if posterior is not None:
        post = posterior.posterior
        data["posterior_mean"] = ("parameter", [float(post[n].mean()) for n in names])
        data["posterior_sd"] = ("parameter", [float(post[n].std()) for n in names])
    out = xr.Dataset(data, coords={"parameter": names, "scale": ("parameter", [p.scale for p in est])})
    out.attrs.update(nll=float(search.nll), search=search.describe(),
                     nll_per_start=json.dumps([float(v) if np.isfinite(v) else None for v in search.nlls]))
    return out

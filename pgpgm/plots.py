"""Figures of a fit: state trajectories and parameter estimates (matplotlib)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .result import FitResult

_COLORS = {"truth": "black", "sampled": "tab:orange", "refined": "tab:blue"}


def plot_states(result: FitResult, *, figsize_per_state=(4.0, 3.0)):
    """One panel per state: ground truth (if known), the observations, the sampling step's
    posterior mean with its 90 % band at the observation times, and the trajectories
    integrated from the sampled and refined parameters."""
    import matplotlib.pyplot as plt

    traj, post = result.trajectories, result.posterior.posterior
    states = list(result.system.states)
    fig, axes = plt.subplots(1, len(states), figsize=(figsize_per_state[0] * len(states), figsize_per_state[1]),
                             squeeze=False, layout="constrained")
    t = traj["time"].values
    for ax, s in zip(axes[0], states):
        for est in traj["estimate"].values:
            style = "--" if est == "truth" else "-"
            ax.plot(traj["time_dense"], traj["x"].sel(estimate=est, state=s), style, color=_COLORS[str(est)],
                    lw=1.5, label=f"{est} trajectory" if est != "truth" else "ground truth")
        if s in post:
            q = post[s].quantile([0.05, 0.5, 0.95], dim=("chain", "draw")).values
            ax.fill_between(t, q[0], q[2], color=_COLORS["sampled"], alpha=0.25, label="sampling 90 %")
        if s in traj["observed"].values:
            ax.plot(t, traj["y"].sel(observed=s), "o", ms=3.5, color="tab:red", label="observations")
            ax.set_title(f"{s} (observed)")
        else:
            ax.set_title(f"{s} (latent)")
        ax.set_xlabel("time")
    axes[0][0].legend(fontsize=7)
    return fig


def plot_parameters(result: FitResult):
    """Each parameter: its posterior (violin), the sampled and refined (+-2 se) estimates,
    and the truth when known, relative to the truth (or to the refined value)."""
    import matplotlib.pyplot as plt

    est = result.estimates
    params = list(result.system.parameters)
    ref = est["truth"].values if "truth" in est else est["theta"].sel(estimate="refined").values
    scale = np.where(ref != 0, np.abs(ref), 1.0)
    fig, ax = plt.subplots(figsize=(1.2 * len(params) + 2, 3.2), layout="constrained")
    post = result.posterior.posterior
    x = np.arange(len(params))
    samples = [post[p].values.ravel() / scale[j] for j, p in enumerate(params)]
    vp = ax.violinplot(samples, positions=x, showextrema=False)
    for b in vp["bodies"]:
        b.set_facecolor(_COLORS["sampled"])
        b.set_alpha(0.3)
    ax.plot(x - 0.1, est["theta"].sel(estimate="sampled") / scale, "s", color=_COLORS["sampled"], label="sampled (mean)")
    ax.errorbar(x + 0.1, est["theta"].sel(estimate="refined") / scale, yerr=2 * est["stderr"] / scale, fmt="o",
                color=_COLORS["refined"], label="refined (+-2 se)")
    if "truth" in est:
        ax.axhline(1.0, color="black", ls="--", lw=1, label="truth")
        ax.set_ylabel("estimate / true value")
    else:
        ax.set_ylabel("estimate / refined value")
    ax.set_xticks(x, params)
    ax.legend(fontsize=7)
    return fig

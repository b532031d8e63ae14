"""Figures of a fit: state trajectories with posterior bands, and parameter estimates (matplotlib)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np


class Fitted(Protocol):
    """What the figures read of a fit (a :class:`pgpgm.FitResult` has it): the system, the
    trajectories and estimates (xarray Datasets), the main posterior and step 2's chains (DataTrees,
    the latter possibly None)."""

    system: Any
    trajectories: Any
    estimates: Any
    posterior: Any
    gradient_matching: Any

_COLORS = {"truth": "black", "sampled": "tab:orange", "refined": "tab:blue", "posterior": "tab:green"}
BAND = 0.94  # central probability of the posterior bands


def _band(post, name: str):
    """(times, lower, upper) of the central 94 % band of a state in a posterior group, or None."""
    if name not in post or post[name].ndim != 3:
        return None
    da = post[name]
    tdim = da.dims[-1]
    lo, hi = (1 - BAND) / 2, 1 - (1 - BAND) / 2
    q = da.quantile([lo, hi], dim=("chain", "draw")).values
    return da[tdim].values, q[0], q[1]


def plot_states(result: Fitted, *, figsize_per_state=(4.0, 3.0)):
    """One panel per state (then one per observable of ``fit(observables=...)``, with its data): the
    ground truth (if known), the observations, the trajectories
    integrated from the sampled, refined and posterior-mean parameters, the 94 % band of the
    main posterior (every state, latent ones included) and of the gradient-matching chains."""
    import matplotlib.pyplot as plt

    traj = result.trajectories
    states = list(result.system.states)
    # observables (fit(observables=...)): a panel each after the states', with their data
    measures = [str(o) for o in traj["observable"].values] if "h" in traj else []
    texts = json.loads(traj.attrs.get("observables", "{}"))
    direct = {e: o for o, e in texts.items() if e in states}  # state -> its identity observable
    n = len(states) + len(measures)
    fig, axes = plt.subplots(1, n, figsize=(figsize_per_state[0] * n, figsize_per_state[1]),
                             squeeze=False, layout="constrained")
    t = traj["time"].values
    gm = result.gradient_matching.posterior if result.gradient_matching is not None else None
    main = result.posterior.posterior
    for ax, s in zip(axes[0], states):
        for est in traj["estimate"].values:
            style = "--" if est == "truth" else "-"
            ax.plot(traj["time_dense"], traj["x"].sel(estimate=est, state=s), style, color=_COLORS[str(est)],
                    lw=1.5, label=f"{est} trajectory" if est != "truth" else "ground truth")
        if gm is not None and gm is not main and (b := _band(gm, s)) is not None:
            ax.fill_between(b[0], b[1], b[2], color=_COLORS["sampled"], alpha=0.2, label="gradient matching 94 %")
        if (b := _band(main, s)) is not None:
            kind = "posterior" if gm is not main else "sampled"
            ax.fill_between(b[0], b[1], b[2], color=_COLORS[kind], alpha=0.3, label=f"{kind} 94 %")
        if s in traj["observed"].values:
            y = traj["y"].sel(observed=s).values
            seen = np.isfinite(y)  # markers only where the state is measured
            ax.plot(t[seen], y[seen], "o", ms=3.5, color="tab:red", label="observations")
            ax.set_title(f"{s} (observed)")
        elif s in direct:
            ax.set_title(f"{s} (observed as {direct[s]})")
        else:
            ax.set_title(f"{s} (latent)")
        ax.set_xlabel("time")
    for ax, o in zip(axes[0][len(states):], measures):
        for est in traj["estimate"].values:
            style = "--" if est == "truth" else "-"
            ax.plot(traj["time_dense"], traj["h"].sel(estimate=est, observable=o), style, color=_COLORS[str(est)],
                    lw=1.5, label=f"{est} trajectory" if est != "truth" else "ground truth")
        if gm is not None and gm is not main and (b := _band(gm, o)) is not None:  # its GP in steps 1-2
            ax.fill_between(b[0], b[1], b[2], color=_COLORS["sampled"], alpha=0.2, label="gradient matching 94 %")
        if (b := _band(main, o)) is not None:
            ax.fill_between(b[0], b[1], b[2], color=_COLORS["posterior"], alpha=0.3, label="posterior 94 %")
        y = traj["y"].sel(observed=o).values
        seen = np.isfinite(y)
        ax.plot(t[seen], y[seen], "o", ms=3.5, color="tab:red", label="observations")
        ax.set_title(f"{o} (observable)")
        ax.set_xlabel("time")
    axes[0][0].legend(fontsize=7)
    return fig


def plot_parameters(result: Fitted):
    """Each parameter relative to the truth (or to the refined value): the main posterior and
    the gradient-matching chains (violins), the sampled and posterior means, and the refined
    estimate with +-2 standard errors."""
    import matplotlib.pyplot as plt

    est = result.estimates
    params = list(result.system.parameters)
    ref = est["truth"].values if "truth" in est else est["theta"].sel(estimate="refined").values
    scale = np.where(ref != 0, np.abs(ref), 1.0)
    fig, ax = plt.subplots(figsize=(1.4 * len(params) + 2, 3.4), layout="constrained")
    x = np.arange(len(params))
    groups = [("sampled", result.gradient_matching.posterior if result.gradient_matching is not None else None, -0.2)]
    if "posterior" in est["estimate"].values:
        groups.append(("posterior", result.posterior.posterior, 0.2))
    for kind, post, dx in groups:
        if post is None:
            continue
        drawn = [j for j, p in enumerate(params) if p in post]  # a fixed parameter (fit(fixed=...)) has no draws
        vp = ax.violinplot([post[params[j]].values.ravel() / scale[j] for j in drawn], positions=x[drawn] + dx,
                           widths=0.35, showextrema=False)
        for b in vp["bodies"]:
            b.set_facecolor(_COLORS[kind])
            b.set_alpha(0.3)
        ax.plot(x + dx, est["theta"].sel(estimate=kind) / scale, "s", color=_COLORS[kind], ms=4,
                label=f"{'gradient matching' if kind == 'sampled' else 'posterior'} (mean)")
    ax.errorbar(x, est["theta"].sel(estimate="refined") / scale, yerr=2 * est["stderr"] / scale, fmt="o",
                color=_COLORS["refined"], label="refined (+-2 se)")
    if "truth" in est:
        ax.axhline(1.0, color="black", ls="--", lw=1, label="truth")
        ax.set_ylabel("estimate / true value")
    else:
        ax.set_ylabel("estimate / refined value")
    ax.set_xticks(x, params)
    ax.legend(fontsize=7)
    return fig

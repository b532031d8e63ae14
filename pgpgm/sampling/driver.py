"""The sampling driver: chains of the element-wise step, burn-in adaptation, an ArviZ DataTree."""

from __future__ import annotations

import json
import time

import arviz as az
import numpy as np
from tqdm.auto import tqdm

from ..density import GradientMatchingDensity
from ..errors import DataError, PgpgmError
from . import adapt
from . import kernel
from .kernel import ChainState, StepParams, anchor, step
from .start import Starts, chain_strategy
from .target import GradientMatchingTarget

#: Iterations at which the running log density is re-evaluated from scratch.
_ANCHOR_FIRST, _ANCHOR_EVERY = 3, 100


def initial_params(target: GradientMatchingTarget, state: ChainState, state_scale=None,
                   param_scale=None) -> StepParams:
    """Starting proposal sds: states 1.5 x their conditional sd (or ``state_scale``), parameters
    5 % of the starting value, at least 0.01 (or ``param_scale``, scalar or (P,))."""
    a = target.arrays
    N, M = target.density.obs.values.shape
    P = target.density.system.n_parameters
    sx = 1.5 * a.conditional_sd() if state_scale is None else np.full((N, M), float(state_scale))
    sp = np.maximum(0.05 * np.abs(state.q), 0.01) if param_scale is None else param_scale
    return StepParams(sx, np.broadcast_to(np.asarray(sp, float), (P,)).copy(), np.ones(M, bool), np.ones(P, bool))


def run_chain(target: GradientMatchingTarget, theta0, draws: int, tune: int, rng: np.random.Generator,
              progress=None, state_scale=None, param_scale=None) -> dict:
    """One chain from parameters theta0 (P,): ``tune`` adapted burn-in iterations, then ``draws``."""
    d = target.density
    N, M = d.obs.values.shape
    P = d.system.n_parameters
    state = kernel.init(target, theta0)
    params = initial_params(target, state, state_scale, param_scale)
    counts = adapt.AdaptationState.empty(params)
    kept_x, kept_p = np.zeros((N, M)), np.zeros(P)
    out = {"theta": np.empty((draws, P)), "X": np.empty((draws, N, d.system.n_states)), "lp": np.empty(draws),
           "accept_x": np.empty(draws), "accept_theta": np.zeros((draws, P), dtype=bool)}
    for it in range(tune + draws):
        state, info = step(rng, state, params, target)
        if it < _ANCHOR_FIRST or it % _ANCHOR_EVERY == _ANCHOR_EVERY - 1:
            state = anchor(state, target)
        if it < tune:
            params, counts = adapt.update(params, counts, info)
        else:
            k = it - tune
            out["theta"][k], out["X"][k], out["lp"][k] = state.theta, state.X, state.logp
            out["accept_x"][k] = info.accepted_x.sum() / max(N * M, 1)
            out["accept_theta"][k] = info.moved
            kept_x += info.accepted_x
            kept_p += info.moved
        if progress is not None:
            progress.update(1)
    out.update({"state_scale": params.state_scale, "param_scale": params.param_scale,
                "accept_rate_x": float(kept_x.sum() / max(draws * N * M, 1)),
                "accept_rate_theta": (kept_p / max(draws, 1)).tolist()})
    return out


def sample(
    density: GradientMatchingDensity | GradientMatchingTarget,
    *,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int | None = 0,
    init="spread",
    state_scale: float | None = None,
    param_scale=None,
    progressbar: bool = True,
):
    """Run the element-wise Metropolis-within-Gibbs sampler (step 2 of the method).

    Parameters
    ----------
    density : the density (:func:`pgpgm.gradient_matching_density`), or a
        :class:`GradientMatchingTarget` (a density with a user-extended ``pm.Model``; reuse
        one target to compile the model once for several runs)
    draws, tune : kept iterations and burn-in iterations per chain (burn-in is
        dropped; proposal scales adapt during it)
    chains : independent chains, run one after another
    seed : seeds every chain (via :class:`numpy.random.SeedSequence`)
    init : ``"spread"`` (default: the first chain at the priors' initial point, e.g.
        Uniform midpoints, every further chain at a random prior draw - a multi-start),
        ``"prior-median"``, ``"map"`` (the density's mode over theta with x_M at the GP
        means, jittered by 2 % per chain; it can land in a poor mode), ``"prior"`` (a
        random prior draw per chain) or P starting values
    state_scale, param_scale : initial proposal sds (state units; parameter units, scalar or (P,))

    Returns
    -------
    arviz DataTree
        ``posterior``: every parameter (chain, draw), observed and latent states
        (chain, draw, time); ``sample_stats``: ``lp``, ``accept_x`` (fraction of state
        proposals accepted per iteration), ``accept_theta`` (chain, draw, parameter);
        ``observed_data``: ``y_<state>``; attributes: settings, GP fits, tuned scales.
    """
    if draws < 1 or tune < 0 or chains < 1:
        raise DataError(f"draws >= 1, tune >= 0 and chains >= 1 are required, got {draws}, {tune}, {chains}")
    target = density if isinstance(density, GradientMatchingTarget) else GradientMatchingTarget(density)
    starts = Starts(target)
    seeds = np.random.SeedSequence(seed).spawn(chains)
    results = []
    n0 = target.n_logp_evals
    t0 = time.perf_counter()
    with tqdm(total=chains * (tune + draws), disable=not progressbar, desc="pgpgm sampling", unit="it") as bar:
        for c in range(chains):
            rng = np.random.default_rng(seeds[c])
            strategy = chain_strategy(init, c)
            for _ in range(20):  # a random start may sit where the latent solve fails
                theta0 = starts.theta(strategy, rng)
                if strategy == "prior" and not np.isfinite(target.evaluate(theta0, _gp_start(target))[0]):
                    continue
                results.append(run_chain(target, theta0, draws, tune, rng, bar, state_scale, param_scale))
                break
            else:
                raise PgpgmError("20 prior draws gave no finite density to start a chain from; pass init=...")
    elapsed = time.perf_counter() - t0
    return _to_datatree(target.density, results, {
        "draws": draws, "tune": tune, "chains": chains, "seed": -1 if seed is None else seed,
        "init": init if isinstance(init, str) else list(map(float, init)), "sampling_time_s": elapsed,
        "n_logp_evals": target.n_logp_evals - n0,
    })


def _gp_start(target: GradientMatchingTarget) -> np.ndarray:
    d = target.density
    X = np.zeros((d.obs.times.size, d.system.n_states))
    X[:, list(d.observed_idx)] = d.gp_posterior_means()
    return X


def _to_datatree(s: GradientMatchingDensity, results: list[dict], settings: dict):
    post = {p: np.stack([r["theta"][:, j] for r in results]) for j, p in enumerate(s.system.parameters)}
    for k, name in enumerate(s.system.states):
        post[name] = np.stack([r["X"][:, :, k] for r in results])
    stats = {
        "lp": np.stack([r["lp"] for r in results]),
        "accept_x": np.stack([r["accept_x"] for r in results]),
        "accept_theta": np.stack([r["accept_theta"] for r in results]),
    }
    obs = {f"y_{n}": s.obs.values[:, m] for m, n in enumerate(s.obs.states)}
    dims = {n: ["time"] for n in s.system.states}
    dims.update({f"y_{n}": ["time"] for n in s.obs.states})
    dims["accept_theta"] = ["parameter"]
    attrs = {
        "pgpgm_settings": json.dumps({
            **settings, "system": s.system.name, "observed": list(s.obs.states), "latent": list(s.latent),
            "gamma": s.gamma, "kernel": s.kernel, "x0": [None if not np.isfinite(v) else float(v) for v in s.x0],
            "noise_sd": s.noise_sd.tolist(),
        }),
        "pgpgm_gp_fits": json.dumps([k.gp.as_dict() for k in s.terms]),
        "pgpgm_tuned_scales": json.dumps([
            {"state": r["state_scale"].tolist(), "param": r["param_scale"].tolist(),
             "accept_rate_x": r["accept_rate_x"], "accept_rate_theta": r["accept_rate_theta"]} for r in results
        ]),
    }
    tree = az.from_dict(
        {"posterior": post, "sample_stats": stats, "observed_data": obs},
        coords={"time": s.obs.times, "parameter": list(s.system.parameters)},
        dims=dims,
    )
    tree.attrs.update(attrs)
    return tree

"""The sampling driver: chains of a scheme, burn-in tuning, worker processes, an ArviZ DataTree.

Chain c draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(chains)[c])``:
its start (``init``) and then every step. Starts are chosen in the calling process and
the chains run there (``cores=1``) or in ``cores`` worker processes (fresh interpreters
running :mod:`pgpgm.sampling.worker`, as the "spawn" start method makes them but without
re-importing the caller's script, so no ``if __name__ == "__main__"`` guard is needed;
each rebuilds the target from the pickled density and model, compiles it once and runs
its share of the chains), so the draws do not depend on ``cores``.
BLAS runs single-threaded while chains run (threadpoolctl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait

import arviz as az
import cloudpickle
import numpy as np
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ..density import GradientMatchingDensity
from ..errors import DataError, PgpgmError
from .kernel import anchor, init as init_state
from .schemes import Block, Elementwise, get_scheme, initial_params
from .start import Starts, chain_strategy
from .target import GradientMatchingTarget

__all__ = ["initial_params", "run_chain", "sample"]

#: Iterations at which the running log density is re-evaluated from scratch.
_ANCHOR_FIRST, _ANCHOR_EVERY = 3, 100


def run_chain(target: GradientMatchingTarget, theta0, draws: int, tune: int, rng: np.random.Generator,
              progress=None, state_scale=None, param_scale=None, scheme: Elementwise | Block | str = "elementwise"
              ) -> dict:
    """One chain from parameter coordinates theta0 (P,): ``tune`` tuned burn-in iterations, then
    ``draws`` kept ones. ``progress(n)`` is called with finished iterations."""
    scheme = get_scheme(scheme)
    d = target.density
    N = d.obs.times.size
    P = d.system.n_parameters
    state = init_state(target, theta0)
    params, tuning = scheme.start(target, state, tune, state_scale, param_scale)
    out = {"theta": np.empty((draws, P)), "X": np.empty((draws, N, d.system.n_states)), "lp": np.empty(draws)}
    stats: dict[str, np.ndarray] = {}
    for it in range(tune + draws):
        state, info = scheme.step(rng, state, params, target)
        if it < _ANCHOR_FIRST or it % _ANCHOR_EVERY == _ANCHOR_EVERY - 1:
            state = anchor(state, target)
        if it < tune:
            params, tuning = scheme.adapt(params, tuning, state, info, target)
        else:
            k = it - tune
            out["theta"][k], out["X"][k], out["lp"][k] = state.theta, state.X, state.logp
            for name, v in scheme.stats(info).items():
                if name not in stats:
                    stats[name] = np.empty((draws, *np.shape(v)), dtype=np.asarray(v).dtype)
                stats[name][k] = v
        if progress is not None:
            progress(1)
    out["stats"] = stats
    out["tuned"] = {**scheme.tuned(params), **{f"accept_rate_{n[7:]}": np.mean(v, axis=0).tolist()
                                               for n, v in stats.items() if n.startswith("accept_")}}
    return out


def sample(
    density: GradientMatchingDensity | GradientMatchingTarget,
    *,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int | None = 0,
    init="spread",
    scheme: str | Block | Elementwise = "block",
    cores: int | None = None,
    state_scale: float | None = None,
    param_scale=None,
    progressbar: bool = True,
):
    """Sample the gradient-matching density (step 2 of the method).

    Parameters
    ----------
    density : the density (:func:`pgpgm.gradient_matching_density`), or a
        :class:`GradientMatchingTarget` in the constrained space (a density with a
        user-extended ``pm.Model``; reuse one target to compile the model once for
        several runs in this process)
    draws, tune : kept iterations and burn-in iterations per chain (burn-in is
        dropped; proposals are tuned during it)
    chains : independent chains
    seed : seeds every chain (via :class:`numpy.random.SeedSequence`); the draws depend on
        ``seed`` and not on ``cores``
    init : ``"spread"`` (default: the first chain at the priors' initial point, e.g.
        Uniform midpoints, every further chain at a random prior draw - a multi-start),
        ``"prior-median"``, ``"map"`` (the density's mode over theta with x_M at the GP
        means, jittered by 2 % per chain; it can land in a poor mode), ``"prior"`` (a
        random prior draw per chain) or P starting values
    scheme : ``"block"`` (default; :class:`pgpgm.sampling.schemes.Block`: the parameters and
        the initial values moved jointly with an adaptive covariance, the observed states
        redrawn from their Gaussian given the proposal), ``"elementwise"`` (the paper's
        Metropolis-within-Gibbs scheme) or a scheme object, e.g. ``Block(n_moves=4)``
    cores : worker processes for the chains (default: one per chain, at most the
        machine's CPUs); 1 runs every chain in this process. Each worker compiles the
        model once (a few seconds)
    state_scale, param_scale : initial proposal sds (state units; parameter units, scalar or (P,))

    Returns
    -------
    arviz DataTree
        ``posterior``: every parameter (chain, draw), observed and latent states
        (chain, draw, time); ``sample_stats``: ``lp``, ``accept_x`` (fraction of state
        proposals accepted per iteration), and ``accept_theta`` (chain, draw, parameter;
        element-wise) or ``accept_block`` (fraction of the iteration's block moves
        accepted; block); ``observed_data``: ``y_<state>``; attributes: settings, GP
        fits, tuned proposals and acceptance rates.
    """
    if draws < 1 or tune < 0 or chains < 1:
        raise DataError(f"draws >= 1, tune >= 0 and chains >= 1 are required, got {draws}, {tune}, {chains}")
    if cores is not None and (int(cores) != cores or cores < 1):
        raise DataError(f"cores must be a positive integer or None, got {cores!r}")
    scheme = get_scheme(scheme)
    target = density if isinstance(density, GradientMatchingTarget) else GradientMatchingTarget(density)
    if target.space != "constrained":
        raise PgpgmError("sample() needs a GradientMatchingTarget in the constrained space (the default)")
    cores = min(chains, os.cpu_count() or 1) if cores is None else min(int(cores), chains)
    n0 = target.n_logp_evals
    t0 = time.perf_counter()
    with threadpool_limits(limits=1):
        jobs = _chain_starts(target, init, chains, seed)
        kwargs = {"draws": draws, "tune": tune, "state_scale": state_scale, "param_scale": param_scale,
                  "scheme": scheme}
        with tqdm(total=chains * (tune + draws), disable=not progressbar, desc="pgpgm sampling", unit="it") as bar:
            if cores == 1:
                results = [run_chain(target, theta0, rng=rng, progress=bar.update, **kwargs) for _, theta0, rng in jobs]
            else:
                results = _run_in_workers(target, jobs, cores, kwargs, bar)
    elapsed = time.perf_counter() - t0
    return _to_datatree(target.density, results, {
        "draws": draws, "tune": tune, "chains": chains, "seed": -1 if seed is None else seed,
        "init": init if isinstance(init, str) else list(map(float, init)), "scheme": scheme.name, "cores": cores,
        "sampling_time_s": elapsed, "n_logp_evals": target.n_logp_evals - n0,
    })


def _chain_starts(target: GradientMatchingTarget, init, chains: int, seed) -> list:
    """(chain, theta0 (P,), its generator after choosing the start) for every chain."""
    starts = Starts(target)
    seeds = np.random.SeedSequence(seed).spawn(chains)
    jobs = []
    for c in range(chains):
        rng = np.random.default_rng(seeds[c])
        strategy = chain_strategy(init, c)
        for _ in range(20):  # a random start may sit where the latent solve fails
            theta0 = starts.theta(strategy, rng)
            if strategy == "prior" and not np.isfinite(target.evaluate(theta0, _gp_start(target))[0]):
                continue
            jobs.append((c, theta0, rng))
            break
        else:
            raise PgpgmError("20 prior draws gave no finite density to start a chain from; pass init=...")
        if strategy != "prior" and not np.isfinite(target.evaluate(theta0, _gp_start(target))[0]):
            raise DataError(f"the density is not finite at the start {theta0.tolist()} of chain {c} (init={init!r}): "
                            + target.explain(theta0, _gp_start(target)) + "; pass other init values")
    return jobs


def _run_in_workers(target: GradientMatchingTarget, jobs: list, cores: int, kwargs: dict, bar) -> list[dict]:
    """Run ``jobs`` in ``cores`` worker processes (chain c in worker c mod cores; see
    :mod:`pgpgm.sampling.worker`)."""
    procs, channels = [], []
    results: dict[int, dict] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the modules this process sees
    try:
        for _ in range(cores):
            p = subprocess.Popen([sys.executable, "-m", "pgpgm.sampling.worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env)
            procs.append(p)
            channels.append(Connection(os.dup(p.stdout.fileno()), writable=False))
        for w, p in enumerate(procs):
            try:
                p.stdin.write(cloudpickle.dumps((target.density, target.model, kwargs, jobs[w::cores])))
                p.stdin.close()
            except BrokenPipeError:
                pass  # the worker died; reported below
        open_channels = list(channels)
        while len(results) < len(jobs):
            if not open_channels:
                raise PgpgmError("sampling worker processes ended before their chains finished (exit codes "
                                 f"{[p.wait() for p in procs]}); their error output is above")
            for ch in wait(open_channels, timeout=5.0):
                try:
                    kind, chain, value = ch.recv()
                except EOFError:  # the worker closed its channel (finished or died)
                    open_channels.remove(ch)
                    continue
                if kind == "progress":
                    bar.update(value)
                elif kind == "done":
                    results[chain] = value
                else:
                    raise PgpgmError(f"chain {chain} failed in its worker process:\n{value}")
    finally:
        for ch in channels:
            ch.close()
        for p in procs:
            if p.poll() is None and len(results) < len(jobs):
                p.kill()
            p.wait()
            p.stdout.close()
    return [results[c] for c, _, _ in jobs]


def _gp_start(target: GradientMatchingTarget) -> np.ndarray:
    d = target.density
    X = np.zeros((d.obs.times.size, d.system.n_states))
    X[:, list(d.observed_idx)] = d.gp_posterior_means()
    return X


def _to_datatree(s: GradientMatchingDensity, results: list[dict], settings: dict):
    post = {p: np.stack([r["theta"][:, j] for r in results]) for j, p in enumerate(s.system.parameters)}
    for k, name in enumerate(s.system.states):
        post[name] = np.stack([r["X"][:, :, k] for r in results])
    stats = {"lp": np.stack([r["lp"] for r in results])}
    stats.update({n: np.stack([r["stats"][n] for r in results]) for n in results[0]["stats"]})
    obs = {f"y_{n}": s.obs.values[:, m] for m, n in enumerate(s.obs.states)}
    dims = {n: ["time"] for n in s.system.states}
    dims.update({f"y_{n}": ["time"] for n in s.obs.states})
    if "accept_theta" in stats:  # per coordinate: parameters, then unknown latent initial values
        dims["accept_theta"] = ["parameter"] if not s.x0_priors.names else ["coordinate"]
    attrs = {
        "pgpgm_settings": json.dumps({
            **settings, "system": s.system.name, "observed": list(s.obs.states), "latent": list(s.latent),
            "gamma": s.gamma, "kernel": s.kernel, "x0": [None if not np.isfinite(v) else float(v) for v in s.x0],
            "noise_sd": s.noise_sd.tolist(),
        }),
        "pgpgm_gp_fits": json.dumps([k.gp.as_dict() for k in s.terms]),
        "pgpgm_tuned_scales": json.dumps([r["tuned"] for r in results]),
    }
    tree = az.from_dict(
        {"posterior": post, "sample_stats": stats, "observed_data": obs},
        coords={"time": s.obs.times, "parameter": list(s.system.parameters),
                **({"coordinate": [*s.system.parameters, *s.x0_priors.names]} if s.x0_priors.names else {})},
        dims=dims,
    )
    tree.attrs.update(attrs)
    return tree

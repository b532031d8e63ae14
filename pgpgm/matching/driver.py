"""The sampling driver: chains of a scheme, burn-in tuning, worker processes, an ArviZ DataTree.

Chain c draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(chains)[c])``:
its start (``init``) and then every step. Starts are chosen in the calling process and
the chains run there (``cores=1``) or in ``cores`` worker processes (fresh interpreters
running :mod:`pgpgm.matching.worker`, as the "spawn" start method makes them but without
re-importing the caller's script, so no ``if __name__ == "__main__"`` guard is needed;
each rebuilds the target from the pickled density (and model, when a user extended it),
compiles it once and runs its share of the chains), so the draws do not depend on ``cores``.
BLAS runs single-threaded while chains run (threadpoolctl).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle
import numpy as np
from arviz_base import from_dict
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ..errors import DataError, PgpgmError, SamplingError
from ..progress import compiling
from .density import GradientMatchingDensity
from .elementwise import init as init_state
from .schemes import Block, Elementwise, get_scheme, initial_params
from .start import Starts, chain_strategy
from .stop import Checkpoint, Decision, StopRule, check_stop_rule
from .target import GradientMatchingTarget

__all__ = ["initial_params", "run_chain", "sample"]

#: Iterations at which the running log density is re-evaluated from scratch.
_ANCHOR_FIRST, _ANCHOR_EVERY = 3, 100


def run_chain(target: GradientMatchingTarget, theta0, draws: int, tune: int, rng: np.random.Generator,
              progress=None, state_scale=None, param_scale=None, scheme: Elementwise | Block | str = "elementwise"
              ) -> dict:
    """One chain from parameter coordinates theta0 (P,): ``tune`` tuned burn-in iterations, then
    ``draws`` kept ones. ``progress(n)`` is called with finished iterations."""
    run = chain_iterations(target, theta0, draws, tune, rng, progress, state_scale, param_scale, scheme)
    try:
        while True:
            next(run)
    except StopIteration as done:
        return done.value


def chain_iterations(target: GradientMatchingTarget, theta0, draws: int, tune: int, rng: np.random.Generator,
                     progress=None, state_scale=None, param_scale=None, scheme: Elementwise | Block | str = "block",
                     checks: Sequence[int] = (), chain: int = 0) -> Generator[Checkpoint, bool | None, dict]:
    """One chain as a generator: after each iteration count in ``checks`` (ascending, below
    ``tune + draws``) it yields a :class:`~pgpgm.matching.agreement.Checkpoint` (means over
    the latter half of the chain so far, ``min(n // 2, tune)`` to n) and is resumed with
    ``send(True)`` to stop there or ``send(False)`` / ``next`` to go on. It returns the
    chain's result: the kept draws are iterations ``tune`` to ``tune + draws`` when it runs
    to the end, and the last checkpoint's window when stopped (``"stopped_at"``: iterations
    done)."""
    scheme = get_scheme(scheme)
    d = target.density
    N = d.obs.times.size
    P = d.system.n_parameters
    total = tune + draws
    state = scheme.begin(target, init_state(target, theta0))
    params, tuning = scheme.start(target, state, tune, state_scale, param_scale)
    out = {"theta": np.empty((total, P)), "X": np.empty((total, N, d.system.n_states)), "lp": np.empty(total)}
    stats: dict[str, np.ndarray] = {}
    pending = iter(sorted(set(int(c) for c in checks if 0 < c < total)))
    check = next(pending, None)
    kept = slice(tune, total)
    for it in range(total):
        state, info = scheme.step(rng, state, params, target)
        if it < _ANCHOR_FIRST or it % _ANCHOR_EVERY == _ANCHOR_EVERY - 1:
            state = scheme.anchor(state, target)
        if it < tune:
            params, tuning = scheme.adapt(params, tuning, state, info, target)
        out["theta"][it], out["X"][it], out["lp"][it] = state.theta, state.X, state.logp
        for name, v in scheme.stats(info).items():
            if name not in stats:
                stats[name] = np.empty((total, *np.shape(v)), dtype=np.asarray(v).dtype)
            stats[name][it] = v
        if progress is not None:
            progress(1)
        if it + 1 == check:
            start = min(check // 2, tune)
            stop = yield Checkpoint(chain, check, start, out["theta"][start:check].mean(axis=0),
                                    out["X"][start:check, 0, :].mean(axis=0))
            if stop:
                kept = slice(start, check)
                break
            check = next(pending, None)
    result = {k: v[kept].copy() for k, v in out.items()}
    result["stats"] = {k: v[kept].copy() for k, v in stats.items()}
    result["stopped_at"] = kept.stop
    result["tuned"] = {**scheme.tuned(params),
                       **{f"accept_rate_{n[7:]}": np.mean(v, axis=0).tolist() for n, v in result["stats"].items()
                          if n.startswith("accept_")}}
    return result


@dataclass(frozen=True)
class MatchingRun:
    """Step 2's outcome: the chains and why they ended.

    tree : the draws (see :func:`sample`); stopped : whether the stop rule ended the chains before
    ``tune + draws``; reason : why they ended, in words; iterations : (chains,) iterations each
    ran, tuning included; decisions : the stop rule's :class:`~pgpgm.matching.stop.Decision` at
    every check (empty without a rule).
    """

    tree: Any
    stopped: bool
    reason: str
    iterations: tuple[int, ...]
    decisions: tuple[Decision, ...]

    @property
    def last(self) -> Decision | None:
        """The last check's decision, None when there was no check."""
        return self.decisions[-1] if self.decisions else None


def run_chains(
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
    stop: str | StopRule = "never",
):
    """Sample the gradient-matching density (step 2 of the method); :func:`sample` returns the
    draws alone, this function the :class:`MatchingRun` with the stop rule's decisions.

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
        Uniform midpoints - or at a random prior draw where the density is not finite
        there -, every further chain at a random prior draw - a multi-start),
        ``"prior-median"``, ``"map"`` (the density's mode over theta with x_M at the GP
        means, jittered by 2 % per chain; it can land in a poor mode), ``"prior"`` (a
        random prior draw per chain) or P starting values
    scheme : ``"block"`` (default; :class:`pgpgm.matching.schemes.Block`: the parameters and
        the initial values moved jointly with an adaptive covariance, the observed states
        redrawn from their Gaussian given the proposal), ``"elementwise"`` (the paper's
        Metropolis-within-Gibbs scheme) or a scheme object, e.g. ``Block(n_moves=4)``
    cores : worker processes for the chains (default: one per chain, at most the
        machine's CPUs); 1 runs every chain in this process. Each worker compiles the
        model once (a few seconds)
    state_scale, param_scale : initial proposal sds (state units; parameter units, scalar or (P,))
    stop : ``"never"`` (default: every chain runs ``tune + draws`` iterations, the published
        budget) or a stop rule object (:class:`~pgpgm.matching.stop.StopRule`), such as
        ``pgpgm.RefinedAgreement.for_density(density)`` (stop once the best least-squares
        optimum refined from the chains' means has settled, checked at 100 iterations and every
        50 after, and at the rule's ``first_checks`` (its early probe) if it has that attribute;
        :func:`pgpgm.fit`'s ``stop="agree"``).
        The chains then advance together, check by check, in this process or in the
        workers; a stopped chain keeps the latter half of its iterations (tuning included)
        as its draws.

    Returns
    -------
    arviz DataTree
        ``posterior``: every parameter (chain, draw), observed and latent states
        (chain, draw, time); ``sample_stats``: ``lp``, ``accept_x`` (fraction of state
        proposals accepted per iteration), and ``accept_theta`` (chain, draw, parameter;
        element-wise) or ``accept_block`` (fraction of the iteration's block moves
        accepted; block); ``observed_data``: ``y_<state>``; attributes: settings, GP
        fits, tuned proposals and acceptance rates; ``pgpgm_stopping``: JSON with the
        rule (``"never"``, ``"agree"``), ``stopped`` (bool), ``iterations`` (per chain,
        tuning included), ``reason`` and every check's decision.
    """
    if draws < 1 or tune < 0 or chains < 1:
        raise DataError(f"draws >= 1, tune >= 0 and chains >= 1 are required, got {draws}, {tune}, {chains}")
    if cores is not None and (int(cores) != cores or cores < 1):
        raise DataError(f"cores must be a positive integer or None, got {cores!r}")
    scheme = get_scheme(scheme)
    rule = check_stop_rule(stop)
    with compiling("the gradient-matching density", progressbar and not isinstance(density, GradientMatchingTarget)):
        target = density if isinstance(density, GradientMatchingTarget) else GradientMatchingTarget(density)
        if isinstance(scheme, Block):  # its parameter moves use this function: compiled now, not at 0 %
            target.parameter_function
    if target.space != "constrained":
        raise PgpgmError("sample() needs a GradientMatchingTarget in the constrained space (the default)")
    cores = min(chains, os.cpu_count() or 1) if cores is None else min(int(cores), chains)
    n0 = target.n_logp_evals
    t0 = time.perf_counter()
    with threadpool_limits(limits=1):
        jobs = _chain_starts(target, init, chains, seed)
        checks = () if rule is None else (tuple(getattr(rule, "first_checks", ()))
                                           + tuple(range(rule.min_iterations, tune + draws, rule.check_every)))
        kwargs = {"draws": draws, "tune": tune, "state_scale": state_scale, "param_scale": param_scale,
                  "scheme": scheme, "checks": checks}
        with tqdm(total=chains * (tune + draws), disable=not progressbar, desc="pgpgm sampling", unit="it") as bar:
            if cores == 1:
                results, decisions = _run_in_process(target, jobs, kwargs, bar, rule)
            else:
                results, decisions = _run_in_workers(target, jobs, cores, kwargs, bar, rule)
            if decisions and decisions[-1].stop:
                bar.total = bar.n  # the bar ends where the chains stopped
                bar.refresh()
    elapsed = time.perf_counter() - t0
    stopping = {"rule": "never" if rule is None else rule.name, "stopped": bool(decisions and decisions[-1].stop),
                "iterations": [int(r["stopped_at"]) for r in results],
                "reason": (decisions[-1].reason if decisions and decisions[-1].stop else
                           f"the whole budget ran (tune + draws = {tune + draws} iterations per chain)"
                           + (f"; last check: {decisions[-1].reason}" if decisions else "")),
                "checks": [dec.as_dict() for dec in decisions]}
    tree = _to_datatree(target.density, results, {
        "draws": draws, "tune": tune, "chains": chains, "seed": -1 if seed is None else seed,
        "init": init if isinstance(init, str) else list(map(float, init)), "scheme": scheme.name, "cores": cores,
        "sampling_time_s": elapsed, "n_logp_evals": target.n_logp_evals - n0,
    }, stopping)
    return MatchingRun(tree, stopping["stopped"], stopping["reason"], tuple(stopping["iterations"]),
                       tuple(decisions))


def advance(run: Generator, stop: bool | None) -> tuple[str, Checkpoint | dict]:
    """Resume a chain generator: ("checkpoint", checkpoint) or ("done", result)."""
    try:
        return "checkpoint", (next(run) if stop is None else run.send(stop))
    except StopIteration as done:
        return "done", done.value


def _run_in_process(target: GradientMatchingTarget, jobs: list, kwargs: dict, bar,
                    rule: StopRule | None) -> tuple[list[dict], list[Decision]]:
    """Every chain in this process, advanced together from check to check."""
    runs = [chain_iterations(target, theta0, rng=rng, progress=bar.update, chain=c, **kwargs) for c, theta0, rng in jobs]
    current = [advance(r, None) for r in runs]
    decisions: list[Decision] = []
    while current[0][0] == "checkpoint":
        decisions.append(rule.decide([v for _, v in current], decisions[-1] if decisions else None))
        current = [advance(r, decisions[-1].stop) for r in runs]
    return [v for _, v in current], decisions


def _chain_starts(target: GradientMatchingTarget, init, chains: int, seed) -> list:
    """(chain, theta0 (P,), its generator after choosing the start) for every chain."""
    starts, x_start = Starts(target), target.density.gp_states()
    seeds = np.random.SeedSequence(seed).spawn(chains)
    jobs = []
    for c in range(chains):
        rng = np.random.default_rng(seeds[c])
        strategy = chain_strategy(init, c)
        for _ in range(20):  # a random start may sit where the latent solve fails
            theta0 = starts.theta(strategy, rng)
            if np.isfinite(target.evaluate(theta0, x_start)[0]):
                jobs.append((c, theta0, rng))
                break
            if strategy == "prior":
                continue
            if isinstance(init, str) and init == "spread" and strategy == "prior-median":
                strategy = "prior"  # the box's centre can be where the density is not finite: a prior draw instead
                continue
            where = (f"the density is not finite at the start {theta0.tolist()} of chain {c} (init={init!r}): "
                     + target.explain(theta0, x_start))
            if not isinstance(init, str):  # the user's values: bad input
                raise DataError(where + "; pass other init values")
            raise SamplingError(where + "; pass init values (init=[...]) where the density is finite")
        else:
            raise SamplingError(f"20 prior draws gave no finite density to start chain {c} from (the last, "
                                f"{theta0.tolist()}: {target.explain(theta0, x_start)}); pass init values "
                                "(init=[...]) or narrower priors")
    return jobs


def _run_in_workers(target: GradientMatchingTarget, jobs: list, cores: int, kwargs: dict, bar,
                    rule: StopRule | None) -> tuple[list[dict], list[Decision]]:
    """Run ``jobs`` in ``cores`` worker processes (chain c in worker c mod cores; see
    :mod:`pgpgm.matching.worker`); at every check the workers send their chains'
    checkpoints and wait for the decision."""
    procs, channels, controls = [], [], []
    results: dict[int, dict] = {}
    pending: dict[int, dict[int, Checkpoint]] = {}
    decisions: list[Decision] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the modules this process sees
    try:
        for _ in range(cores):
            p = subprocess.Popen([sys.executable, "-m", "pgpgm.matching.worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env)
            procs.append(p)
            channels.append(Connection(os.dup(p.stdout.fileno()), writable=False))
            controls.append(Connection(os.dup(p.stdin.fileno()), readable=False))
            p.stdin.close()
        for w, ctl in enumerate(controls):
            try:
                ctl.send_bytes(cloudpickle.dumps((target.density, target.user_model, kwargs, jobs[w::cores])))
            except (BrokenPipeError, ConnectionError):
                pass  # the worker died; reported below
        open_channels = list(channels)
        while len(results) < len(jobs):
            if not open_channels:
                raise SamplingError("sampling worker processes ended before their chains finished (exit codes "
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
                elif kind == "checkpoint":
                    at = pending.setdefault(value.iteration, {})
                    at[chain] = value
                    if len(at) == len(jobs):  # every chain reached this check
                        del pending[value.iteration]
                        decisions.append(rule.decide([at[c] for c, _, _ in jobs], decisions[-1] if decisions else None))
                        for ctl in controls:
                            ctl.send(decisions[-1].stop)
                else:
                    raise SamplingError(f"chain {chain} failed in its worker process:\n{value}")
    finally:
        for conn in (*channels, *controls):
            conn.close()
        for p in procs:
            if p.poll() is None and len(results) < len(jobs):
                p.kill()
            p.wait()
            p.stdout.close()
    return [results[c] for c, _, _ in jobs], decisions


def _to_datatree(s: GradientMatchingDensity, results: list[dict], settings: dict, stopping: dict):
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
        "pgpgm_stopping": json.dumps(stopping),
    }
    tree = from_dict(
        {"posterior": post, "sample_stats": stats, "observed_data": obs},
        coords={"time": s.obs.times, "parameter": list(s.system.parameters),
                **({"coordinate": [*s.system.parameters, *s.x0_priors.names]} if s.x0_priors.names else {})},
        dims=dims,
    )
    tree.attrs.update(attrs)
    return tree


def sample(density, **kwargs):
    """Sample the gradient-matching density (step 2 of the method): the draws of
    :func:`run_chains`, which takes the same arguments (an ArviZ DataTree; its ``Returns``)."""
    return run_chains(density, **kwargs).tree


sample.__signature__ = inspect.signature(run_chains)

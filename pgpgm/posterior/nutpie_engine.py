"""Step 4 by nutpie under pgpgm's budget: sample until the chains pass the checks, or the budget ends.

nutpie (the PyMC team's NUTS in Rust, the model's log density compiled by numba) runs every chain
as a thread of this process - no chain process starts - and spends about a third of PyMC's time
per leapfrog step around the same log density. It cannot extend a
finished chain, so instead of PyMC's rounds (:func:`pgpgm.posterior.rounds.run_nuts`) one run is
asked for up to ``max_draws`` draws per chain and watched from here:

- every :data:`POLL` seconds the leapfrog steps so far (nutpie's progress callback) go to
  ``spent``; once it says the budget is spent the run is aborted and keeps what it drew;
- at fixed draw counts per chain (:func:`check_points`: ``draws``, then :data:`GROWTH` times the last, and
  :data:`BETWEEN` counts between two of those), once the slowest
  chain has them, exactly that many draws of every chain go to ``converged`` (R-hat, ESS and
  divergences in :func:`pgpgm.posterior.rounds.run_nuts`); when they pass, the run ends there. A check
  reads only the watched scalars and a few statistics (:func:`checked_draws`).

With the whitening below, nutpie's trace holds z and the free variables only; the model's deterministics
(every state on the plotting grid: 800 numbers a draw on Lotka-Volterra) are computed after sampling for
the draws kept (:func:`add_after`, a numba loop in threads without the GIL). The trace each check reads
is then small (0.01-0.02 s a check against 0.2-0.45 s with the trajectories, at 9000 draws per chain), and
the tuning iterations and the draws after a pass cost no trajectories.

With ``whiten=(mean, covariance)`` (the refinement's Laplace approximation in the transformed space,
:func:`pgpgm.posterior.space.seed_metric`) nutpie samples z in u = mean + L z (L L^T = covariance, u the
model's value variables): :func:`whitened_model`. nutpie's own metric is diagonal (adapted from the
draws' and the gradients' spread) plus, with :data:`ADAPTATION`, a low-rank correction; on the
correlated, ridge-shaped posteriors of ODE parameters it needs long trajectories in the original
coordinates, and in the whitened ones what is left to adapt is what the Laplace approximation
misses (a posterior that needs ~10 leapfrog steps per draw whitened can give only a handful of draws in
a minute unwhitened).

The whitened model is compiled into nutpie's two C callbacks inside the budget
(:func:`compile_whitened`): PyTensor's functions of the log density and of a draw, and two small
callbacks around them that read the data and the whitening from nutpie's ``user_data``. Their code
depends on the model's structure alone, so numba caches it: a fit of a model of the same structure
(new data, a new optimum, a new process) loads both callbacks, and what is left is PyTensor's graph
rewriting: a few seconds in a new process, against 10-30 s when numba links the callbacks afresh
for every run; the first fit of a new structure still compiles them (8-25 s). Within
a process the compiled model of each structure is kept (:func:`compiled_for_structure`): a later model of
that structure - new data, a new optimum, step 4's next round - compiles nothing, not even PyTensor's
rewriting.

A run that passed returns the draws that passed (not the few more drawn before the abort, which can
take R-hat back above its threshold). Otherwise the
draws returned are those every chain has (a chain the abort caught ahead of the others is cut
to the shortest), and the tuning iterations apart (the caller keeps their latter half, as PyMC's
engine does, when the budget ended the run while tuning, as a larger model can compile and tune for
the whole budget); ``sample_stats`` holds nutpie's ``n_steps`` and ``diverging``, and
``observed_data`` the model's data, as with PyMC.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import xarray as xr

from ..errors import StartError
from ..processes import exact_math
from ..solve.numba_op import cache_key
from ..solve.op import ODEOp

#: the name of the whitened model's one free variable (see :func:`whitened_model`)
WHITE = "pgpgm_z"

#: nutpie's mass-matrix adaptation: a diagonal plus a low-rank correction learnt from the draws and the
#: gradients (nutpie's ``adaptation="low_rank"``). In the whitened coordinates it adapts what the Laplace
#: approximation misses - a posterior wider or turned along a ridge that reaches the prior bound. More
#: fits converge within the budget than with the diagonal alone, most of all the broad, ridge-shaped
#: posteriors of large noise, which the diagonal leaves mostly unconverged.
ADAPTATION = "low_rank"
#: each draw's step size is the adapted one times U(1 - j, 1 + j) (nutpie's ``step_size_jitter``; its own
#: default, kept). A larger jitter, 0.5 (Stan's recommended value), helps posteriors made of a broad bulk
#: with a thin curved ridge out of it (large noise) mix between the two, but elsewhere it throws chains
#: past a soft wall of the density during tuning, where they stay with collapsed step sizes, and costs
#: effective draws per gradient on other models: it loses more fits than it gains.
STEP_SIZE_JITTER = 0.1
#: seconds between two looks at the budget while nutpie samples
POLL = 0.1
#: the draws are checked at fixed counts per chain - ``draws``, then GROWTH times the last count (rounded
#: up) - each check on exactly that many draws of every chain, so that a run that passes returns the
#: same draws whenever the checks happen (nutpie's chains are threads, each with its own random stream)
GROWTH = 1.25
#: further checks between two of those counts (geometrically spaced), since a check reads only a few scalars
#: (:func:`checked_draws`; the trajectories are not in nutpie's trace): every count of GROWTH alone is still
#: checked, so no run passes later than with those alone. A run that would pass between two counts of
#: GROWTH alone ends up to 1 - GROWTH^(-1/2) (~11 %) sooner with one count between
BETWEEN = 1
#: half-width of the uniform jitter of each chain's start in the whitened coordinates (nutpie's own: 1).
#: Where the Laplace approximation is far wider than the posterior (a refined value on its bound, standard
#: errors of 3 in log theta), a start 1 whitened sd out lies deep in a stiff tail: the chains' step sizes
#: collapse and their first tuning draws can take tens of thousands of leapfrog steps each. With 0.1 no
#: chain starts stuck there and more fits converge; the chains still separate during tuning (500 draws).
START_JITTER = 0.1


@contextlib.contextmanager
def _starting():
    """nutpie's failure to find a finite initial point, as a :class:`~pgpgm.errors.StartError`."""
    try:
        yield
    except RuntimeError as failed:
        if "initialization points failed" not in str(failed).lower():
            raise
        raise StartError(f"NUTS (nutpie) could not start: {str(failed).splitlines()[0]}") from failed


@_starting()  # nutpie reports a failed start from any call on its background run
def sample_nutpie(model, start: Mapping[str, np.ndarray], *, draws: int, tune: int, chains: int, seed: int | None,
                  target_accept: float, max_treedepth: int, max_draws: int, spent: Callable[[int], bool],
                  converged: Callable[[xr.DataTree], bool],
                  whiten: tuple[np.ndarray, np.ndarray] | None = None,
                  seconds_left: Callable[[], float] | None = None, watched: Sequence[str] = (),
                  extend: Callable[[xr.DataTree | None, int, int], bool] | None = None) -> xr.DataTree:
    """Sample ``model`` with nutpie from ``start`` until ``converged`` or ``spent``.

    Parameters
    ----------
    model : the step-4 ``pm.Model``
    start : the constrained value of every free variable (chains start there, jittered by nutpie)
    draws : draws per chain before the first convergence check; tune : tuning iterations per chain
    chains : chains, all running at once (threads); seed : nutpie's seed
    target_accept, max_treedepth : NUTS's step-size target and tree depth
    max_draws : most draws per chain (>= ``draws``)
    spent : called with the leapfrog steps so far (all chains, tuning included) and the seconds that ending
        the run will take (reading the trace back: the last check's duration); True ends the run
    converged : called with the draws so far (a DataTree like the result); True ends the run
    whiten : ``(mean (d,), covariance (d, d))`` of the model's d scalar value variables (``model.value_vars``
        order) to sample in whitened coordinates (:func:`whitened_model`; chains start at ``mean``
        jittered by U(-:data:`START_JITTER`, :data:`START_JITTER`) in each whitened coordinate), or None
        (``start``, nutpie's own jitter)
    seconds_left : the budget's seconds left (None: no limit); a check is not begun when twice the last
        one's duration (it, and the final read of the trace after it) is longer than that (each reads the
        whole trace while the chains sample: 0.4-3.3 s on Lotka-Volterra, and the one begun at 58 s of a
        60 s budget ended at 61.5 s) - the draws returned at the end are judged anyway
    watched : the scalar variables ``converged`` reads: a check then reads only these and :data:`CHECK_STATS`
        (:func:`checked_draws`), and the whole trace once it passed; empty: every check reads the whole trace
    extend : whether the run goes on after a check passed (e.g. towards sharper sds): called at every check
        from the first that passed on, with its draws where they pass ``converged`` too (None where they do not),
        its draw count per chain and the next check's; True goes on to that check, False ends the run. The draws
        returned are then those of the last check that passed (also where the budget or ``max_draws`` ends
        the run first); None: the first check that passes ends the run

    Returns
    -------
    DataTree : the draws (``posterior`` (chain, draw), ``sample_stats``) and the tuning iterations
    (``warmup_posterior``, ``warmup_sample_stats``: a run the budget stopped while tuning has no other
    draws); whether the budget ended the run is what ``spent`` last said (its caller's meter keeps it).
    """
    import nutpie  # imported on first use: it loads pyarrow and its Rust core

    if whiten is None:
        with exact_math():
            compiled = nutpie.compile_pymc_model(model, initial_points=dict(start), backend="numba")
    else:  # the trace holds z and the free variables; the deterministics are computed after (add_after)
        white, outputs = whitened_model(model, *whiten)
        free = {rv.name for rv in model.free_RVs}
        whitened = compile_whitened(white, [n for n in outputs if n in free],
                                    after=[n for n in outputs if n not in free], reuse=True)
        compiled = whitened.model
    n_tune = max(int(tune), 1)  # nutpie needs at least one tuning iteration
    steps, drawn = [0], [0]  # leapfrog steps of all chains; draws after tuning of the slowest chain

    def progress(chain_progress) -> None:
        steps[0] = int(sum(p.total_num_steps for p in chain_progress))
        drawn[0] = max(min(int(p.finished_draws) for p in chain_progress) - n_tune, 0)

    run = nutpie.sample(compiled, draws=int(max_draws), tune=n_tune, chains=chains, cores=chains,
                        seed=seed, save_warmup=True, progress_bar=False, blocking=False, progress_callback=progress,
                        progress_rate=int(POLL * 1000), target_accept=target_accept, maxdepth=max_treedepth,
                        adaptation=ADAPTATION, step_size_jitter=STEP_SIZE_JITTER)
    points = iter(check_points(int(draws), int(max_draws)))
    check = next(points)  # the next check: at this many draws of every chain
    passed = None  # the draws that passed the check (the chains run on a little before the abort)
    done = False  # True once a check ended the run
    check_seconds = 0.0  # how long the last check took (reading the trace grows with the draws)
    while not _finished(run) and not done:
        time.sleep(POLL)
        if spent(steps[0], check_seconds):  # ending reads the trace back, as long as the last check did
            break
        while not done and check <= min(drawn[0], max_draws):
            if seconds_left is not None and seconds_left() < 2 * check_seconds:
                break  # it, and reading the trace back after it, would end past the budget
            if spent(steps[0], check_seconds):
                break  # the budget ran out while the checks before it ran (the loop above ends the run)
            began = time.perf_counter()
            so_far = checked_draws(run, watched, check) if watched else equal_chains(_quietly(run.inspect), check)
            if so_far is None or so_far.posterior.sizes["draw"] < check:  # the progress report ran ahead
                break
            ok = converged(so_far)
            if ok:
                passed = so_far if not watched else equal_chains(_quietly(run.inspect), check)
            following = next(points, np.iinfo(np.int64).max)
            if passed is not None:
                done = extend is None or following > max_draws or not extend(so_far if ok else None, check, following)
            check = following
            check_seconds = time.perf_counter() - began
    tree = _quietly(run.wait if _finished(run) else run.abort)
    spent(steps[0])
    out = passed if passed is not None else equal_chains(tree)
    if whiten is not None:
        out = add_after(out, whitened, white, threads=min(chains, os.cpu_count() or 1))
        if "observed_data" not in out.children:
            out["observed_data"] = xr.DataTree(observed_data(model))  # the whitened model holds no data
    return out


def add_after(tree: xr.DataTree, whitened: Whitened, white, threads: int = 1) -> xr.DataTree:
    """``tree`` (nutpie's draws of ``white``: z and the kept variables) with the variables ``whitened.after``
    of each draw (:meth:`Whitened.expand`), by ``white``'s dims and coords: in ``posterior``, and in
    ``warmup_posterior`` where the draws after tuning are fewer than the tuning iterations (the caller may
    then keep the tuning's latter half: :func:`pgpgm.posterior.rounds.run_nuts`)."""
    if not whitened.after:
        return tree
    out = tree.copy()
    coords = _coords(white)
    n_post = tree["posterior"].sizes.get("draw", 0) if "posterior" in tree.children else 0
    for group in ("posterior", "warmup_posterior"):
        if group not in tree.children or WHITE not in tree[group].data_vars:
            continue
        if group != "posterior" and n_post >= tree[group].sizes.get("draw", 0):
            continue
        data = tree[group].to_dataset()
        values = whitened.expand(np.asarray(data[WHITE], float), threads)
        new = {}
        for name, value in values.items():
            dims = tuple(white.named_vars_to_dims.get(name) or (f"{name}_dim_{i}" for i in range(value.ndim - 2)))
            new[name] = xr.DataArray(value, dims=("chain", "draw", *dims),
                                     coords={d: coords[d] for d in dims if d in coords})
        out[group] = xr.DataTree(data.assign(new))
    return out


def check_points(first: int, last: int) -> list[int]:
    """The draw counts per chain at which the draws are checked, up to the first >= ``last``: ``first``, then
    :data:`GROWTH` times the last of these (rounded up), with :data:`BETWEEN` more between two of them,
    spaced geometrically (rounded; repeats dropped)."""
    major = [max(int(first), 1)]
    while major[-1] < last:
        major.append(int(np.ceil(major[-1] * GROWTH)))
    points = [major[0]]
    for a, b in zip(major, major[1:]):
        inner = np.rint(a * (b / a) ** (np.arange(1, BETWEEN + 1) / (BETWEEN + 1))).astype(int)
        points += sorted({int(n) for n in inner if a < n < b}) + [b]
    return points


def observed_data(model) -> xr.Dataset:
    """The observed data of ``model``'s likelihood terms by name (with their dims, where named), as the
    ``observed_data`` group of a :func:`pymc.sample` tree holds them."""
    data = {}
    for rv in model.observed_RVs:
        values = np.asarray(model.rvs_to_values[rv].eval())
        dims = model.named_vars_to_dims.get(rv.name) or tuple(f"{rv.name}_dim_{i}" for i in range(values.ndim))
        data[rv.name] = (dims, values)
    return xr.Dataset(data)


def whitened_model(model, mean: np.ndarray, covariance: np.ndarray):
    """``model``'s log density in whitened coordinates: a ``pm.Model`` with one free variable
    :data:`WHITE` = z (d,) of flat prior and the potential log p(u), u = mean + L z (L the lower
    Cholesky factor of ``covariance``; the Jacobian of the linear map is a constant, left out), and as
    deterministics every free variable of ``model`` (constrained) and every deterministic of ``model``,
    by their names and dims - what a draw of ``model`` holds. Returns the model and those names.

    ``model``'s value variables must all be scalars (d of them, ``model.value_vars`` order)."""
    import pymc as pm
    import pytensor
    from pytensor.graph.replace import graph_replace

    values = list(model.value_vars)
    if any(v.ndim for v in values) or len(values) != len(mean):
        raise ValueError(f"whitening needs {len(mean)} scalar value variables, the model has "
                         f"{[(v.name, v.ndim) for v in values]}")
    chol = np.linalg.cholesky(np.asarray(covariance, float))
    outputs = [*model.free_RVs, *model.deterministics]
    graphs = model.replace_rvs_by_values([model.logp(), *outputs])
    with pm.Model(coords=model.coords) as white:
        z = pm.Flat(WHITE, shape=len(values))
        # shared, not constants: the log density of every optimum is one graph (PyTensor's numba cache serves it)
        # static shapes: PyTensor then checks no shape at run time (a SpecifyShape: 2 s of numba's compilation)
        shift = pytensor.shared(np.asarray(mean, float), name="pgpgm_white_mean", shape=(len(values),))
        chol_ = pytensor.shared(chol, name="pgpgm_white_chol", shape=chol.shape)
        # an elementwise product and sum, not a matrix product: numba compiles PyTensor's Dot (BLAS) in seconds
        u = shift + (chol_ * z[None, :]).sum(axis=1)
        swap = {v: u[i] for i, v in enumerate(values)}
        pm.Potential("pgpgm_log_density", graph_replace(graphs[0], swap, strict=False))
        for var, graph in zip(outputs, graphs[1:]):
            pm.Deterministic(var.name, graph_replace(graph, swap, strict=False),
                             dims=model.named_vars_to_dims.get(var.name))
    return white, [var.name for var in outputs]


#: nutpie's log-density callback: 0, or why the point is rejected; ``{args}`` reads the function's shared
#: values from nutpie's ``user_data`` (one float64 buffer ``buf``, :func:`_shared_layout`)
_LOGP_SOURCE = """
def logp_c(dim, x_, out_, logp_, user_data_):
    if dim != {n_dim}:
        return -1
    buf = numba.carray(user_data_, ({n_buf},), np.float64)
    try:
        value, gradient = core(numba.carray(x_, ({n_dim},)){args})
    except Exception:  # a C callback cannot raise
        return 1
    logp_[0] = value[()]
    for i in range({n_dim}):
        out_[i] = gradient[i]
        if not np.isfinite(gradient[i]):
            return 3
    return 0 if np.isfinite(value[()]) else 4
"""
#: nutpie's callback filling a draw of the trace
_EXPAND_SOURCE = """
def expand_c(dim, expanded, x_, out_, user_data_):
    if dim != {n_dim} or expanded != {n_expanded}:
        return -1
    buf = numba.carray(user_data_, ({n_buf},), np.float64)
    try:
        (values,) = core(numba.carray(x_, ({n_dim},)){args})
    except Exception:  # a C callback cannot raise
        return -2
    for i in range({n_expanded}):
        out_[i] = values[i]
    return 0
"""
#: the loop computing the variables kept out of the trace (``after``) at many draws z (n, d) into out (n, m)
_AFTER_SOURCE = """
def after_c(zs, buf, out):
    for k in range(zs.shape[0]):
        failed = False
        try:
            (values,) = core(zs[k]{args})
        except Exception:  # the draw's variables cannot be computed: NaN
            failed = True
        for i in range({n_after}):
            out[k, i] = np.nan if failed else values[i]
    return 0
"""
#: part of the callbacks' cache key: a new value never loads callbacks compiled from an older template
CALLBACK_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class Whitened:
    """:func:`compile_whitened`'s result: nutpie's compiled model ``model`` (its trace: z and the kept
    variables) and what computes the variables ``after`` (shapes ``after_shapes``) from draws of z once
    sampling has ended: ``loop(zs (n, d), buffer, out (n, m))``, numba-compiled, reading the data and the
    whitening from ``model.user_data`` (None without such variables)."""

    model: object
    after: tuple[str, ...] = ()
    after_shapes: tuple[tuple[int, ...], ...] = ()
    loop: Callable | None = None

    def expand(self, z: np.ndarray, threads: int = 1) -> dict[str, np.ndarray]:
        """The ``after`` variables at the draws ``z`` (..., d) of the whitened coordinates: ``{name: (...,
        *shape)}``, NaN for a draw where they cannot be computed; ``threads`` threads share the draws."""
        z = np.ascontiguousarray(z, dtype=np.float64)
        flat = z.reshape(-1, z.shape[-1])
        sizes = [int(np.prod(shape)) for shape in self.after_shapes]
        out = np.full((flat.shape[0], sum(sizes)), np.nan)
        if self.loop is not None and flat.shape[0]:
            bounds = np.linspace(0, flat.shape[0], max(1, min(int(threads), flat.shape[0])) + 1).astype(int)
            with ThreadPoolExecutor(len(bounds) - 1) as pool:
                list(pool.map(lambda ab: self.loop(flat[ab[0]:ab[1]], self.model.user_data, out[ab[0]:ab[1]]),
                              zip(bounds[:-1], bounds[1:])))
        ends = np.cumsum([0, *sizes])
        return {name: out[:, a:b].reshape(*z.shape[:-1], *shape)
                for name, shape, a, b in zip(self.after, self.after_shapes, ends[:-1], ends[1:])}


def compile_whitened(white, keep: Sequence[str], *, after: Sequence[str] = (), reuse: bool = False) -> Whitened:
    """nutpie's compiled model of :func:`whitened_model`'s ``white``: its log density and gradient in z,
    and z followed by the variables ``keep`` (flattened, in that order) for the trace, each a C callback
    of nutpie's signature; and the variables ``after``, computed from the kept draws' z once sampling has
    ended (:meth:`Whitened.expand`). Chains start at z ~ U(-:data:`START_JITTER`, :data:`START_JITTER`) in
    every coordinate (nutpie's own jitter of z = 0 is U(-1, 1)).

    Built here rather than by ``nutpie.compile_pymc_model`` for the time it takes (nutpie 0.16): the two
    PyTensor functions are loaded from PyTensor's numba
    cache (the whitening and the data are shared variables, so a fit of new data or a new optimum
    finds the functions compiled for the last one), and each callback is a few lines around them
    (:func:`_callback`) that read the shared values from nutpie's ``user_data``, one float64 buffer
    (:func:`_shared_layout`). The callbacks' compiled code therefore depends on the model's structure
    alone, and numba caches it beside PyTensor's functions: a later fit of a model of the same
    structure, in any process, loads them instead of compiling them again (typing and linking the
    cached functions into the callbacks is most of the compilation, about four fifths of it).

    With ``reuse`` (step 4's), a model whose graph has the structure of one compiled before in this
    process (:func:`graph_structure`: the same operations, constants and shapes; only the shared values -
    data, whitening - differ) gets that one's callbacks with its own shared values in a new
    ``user_data`` (:func:`compiled_for_structure`), and PyTensor's rewriting is skipped too (0.1-0.3 s
    instead of 2-8 s); its ``logp_func`` and ``expand_func`` then call the callbacks.

    Returns
    -------
    Whitened : nutpie's compiled model (``.model``, a ``nutpie.compile_pymc.CompiledPyMCModel``) and the
    expansion of draws into the ``after`` variables
    """
    import pytensor.tensor as pt
    from pytensor.graph import clone_replace

    keep, after = list(keep), list(after)
    if not reuse:
        return _compile(white, keep, after)[0]
    z = white.rvs_to_values[white[WHITE]]
    x = pt.TensorType("float64", shape=z.type.shape)("x")
    kept = [pt.as_tensor(v) for v in white.replace_rvs_by_values([white[name] for name in [*keep, *after]])]
    structure = graph_structure(clone_replace([white.logp(), *kept], {z: x}), x, (tuple(keep), tuple(after)))
    try:
        found = compiled_for_structure(ByStructure(structure, white, keep, after))
    except TypeError:  # an Op that cannot be hashed: compiled for this model alone
        return _compile(white, keep, after)[0]
    if found[0] is structure.shared:  # compiled just now, for this model
        return found[1]
    reused = _with_shared_values(found, structure, coords=_coords(white), dims=dict(white.named_vars_to_dims))
    return reused if reused is not None else _compile(white, keep, after)[0]


def _coords(white) -> dict:
    """The coordinates of a draw of ``white`` (its model's, and the whitened coordinates')."""
    import pandas as pd

    coords = {name: pd.Index(values if values is not None else range(int(white.dim_lengths[name].eval())))
              for name, values in white.coords.items()}
    z = white.rvs_to_values[white[WHITE]]
    coords["unconstrained_parameter"] = pd.Index([f"{WHITE}_{i}" for i in range(int(z.type.shape[0]))])
    return coords


def _compile(white, keep: list[str], after: list[str]) -> tuple[Whitened, dict]:
    """:func:`compile_whitened`'s work: the compiled model, and where its functions read each shared variable
    (compiled without fast-math flags: :func:`exact_math`)."""
    with exact_math():
        return _compile_exactly(white, keep, after)


def _compile_exactly(white, keep: list[str], after: list[str]) -> tuple[Whitened, dict]:
    import numba
    import pytensor
    import pytensor.tensor as pt
    from nutpie.compile_pymc import CompiledPyMCModel
    from pymc.pytensorf import compile as compile_pymc
    from pytensor.graph import clone_replace

    z = white.rvs_to_values[white[WHITE]]
    n_dim = int(z.type.shape[0])
    x = pt.TensorType("float64", shape=(n_dim,))("x")
    logp = white.logp()
    outputs = [pt.as_tensor(v) for v in white.replace_rvs_by_values([white[name] for name in [*keep, *after]])]
    logp, grad, *outputs = clone_replace([logp, pt.grad(logp, z), *outputs], {z: x})
    kept, later = outputs[:len(keep)], outputs[len(keep):]
    with white:
        logp_fn = compile_pymc([x], [logp, grad], mode="NUMBA")
        expand_fn = compile_pymc([x], [pt.concatenate([x, *[v.ravel() for v in kept]])], mode="NUMBA")
        after_fn = compile_pymc([x], [pt.concatenate([v.ravel() for v in later])], mode="NUMBA") if later else None
    names = [WHITE, *keep]
    shapes = [v.type.shape for v in outputs]
    if any(n is None for shape in shapes for n in shape):  # a length from the coords: known once evaluated
        shapes = pytensor.function([x], [v.shape for v in outputs], mode="FAST_COMPILE",
                                   on_unused_input="ignore")(np.zeros(n_dim))
    shapes = [tuple(int(n) for n in shape) for shape in shapes]
    shapes, after_shapes = [(n_dim,), *shapes[:len(keep)]], shapes[len(keep):]
    ends = np.cumsum([int(np.prod(shape)) for shape in shapes])
    n_expanded = int(ends[-1])
    buffer, where = _shared_layout([logp_fn, expand_fn, *([after_fn] if after_fn is not None else [])])
    types = numba.types
    pointer = types.CPointer(types.double)
    logp_cfunc = _callback(_LOGP_SOURCE, "logp_c", logp_fn, where, buffer.size,
                           types.int64(types.uint64, pointer, pointer, pointer, types.voidptr), n_dim=n_dim)
    expand_cfunc = _callback(_EXPAND_SOURCE, "expand_c", expand_fn, where, buffer.size,
                             types.int64(types.uint64, types.uint64, pointer, pointer, types.voidptr),
                             n_dim=n_dim, n_expanded=n_expanded)

    def initial_point(seed) -> np.ndarray:
        return np.random.default_rng(seed).uniform(-START_JITTER, START_JITTER, n_dim)

    loop = None
    if after_fn is not None:  # a loop over draws, not a callback: numba-compiled, without the GIL
        n_after = int(sum(int(np.prod(shape)) for shape in after_shapes))
        loop = _callback(_AFTER_SOURCE, "after_c", after_fn, where, buffer.size, None, n_after=n_after)
        # compiled (or loaded from the cache) now, for the argument types of Whitened.expand: on a cold cache
        # its compilation (12 s on Michaelis-Menten) then falls ahead of sampling, inside step 4's budget,
        # instead of after the budget has ended the sampling
        loop(np.zeros((0, n_dim)), buffer, np.zeros((0, n_after)))
    compiled = CompiledPyMCModel(
        _n_dim=n_dim, dims=dict(white.named_vars_to_dims), _coords=_coords(white), _shapes=dict(zip(names, shapes)),
        compiled_logp_func=logp_cfunc, compiled_expand_func=expand_cfunc, initial_point_func=initial_point,
        shared_data={}, shared_var_keys={}, user_data=buffer, n_expanded=n_expanded,
        shape_info=(names, [slice(int(a), int(b)) for a, b in zip([0, *ends[:-1]], ends)], shapes),
        logp_func=logp_fn, expand_func=expand_fn, reparameterized_names=[])
    return Whitened(compiled, tuple(after), tuple(after_shapes), loop), where


@dataclasses.dataclass(frozen=True)
class GraphStructure:
    """What :func:`graph_structure` reads from a graph: ``key`` (hashable; equal keys mean graphs that
    compile to the same code) and ``shared``, the graph's shared variables in the order the key meets them."""

    key: tuple
    shared: tuple


def graph_structure(outputs, x, names) -> GraphStructure:
    """The structure of the graph of ``outputs`` (of the one input ``x``; ``names`` name the outputs after
    the first): every operation in topological order with its inputs, each constant by its type and
    value, each shared variable by its type and its value's shape and dtype (not its value), ``x`` by
    its type. Two whitened models of one ODE model on two data sets, or at two optima, have equal keys.
    An operation is compared by PyTensor's equality of Ops (its parameters), an ODE solve by what
    identifies its compiled code (:func:`pgpgm.solve.numba_op.cache_key`: system, times, solver); an Op
    compared by identity makes the key unequal to every other graph's (nothing is reused)."""
    from pytensor.compile import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import toposort

    index: dict = {}
    key: list = [tuple(names)]
    shared: list = []

    def ref(v) -> int:
        if v not in index:
            if isinstance(v, SharedVariable):
                value = np.asarray(v.get_value(borrow=True))
                key.append(("shared", v.type, value.shape, value.dtype.str))
                shared.append(v)
            elif isinstance(v, Constant):
                data = np.asarray(v.data)
                value = repr(v.data) if data.dtype == object else \
                    (data.shape, data.dtype.str, hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest())
                key.append(("constant", v.type, value))
            else:  # x (anything else is a second input, equal to itself alone: no other graph's key is equal)
                key.append(("input", v.type) if v is x else ("other", v))
            index[v] = len(index)
        return index[v]

    for node in toposort(outputs):
        op = ("ode", cache_key(node.op)) if isinstance(node.op, ODEOp) else node.op
        key.append((op, tuple(ref(i) for i in node.inputs), tuple(o.type for o in node.outputs)))
        for o in node.outputs:
            index[o] = len(index)
    key.append(("outputs", tuple(ref(o) for o in outputs)))
    return GraphStructure(tuple(key), tuple(shared))


#: how many compiled whitened models :func:`compiled_for_structure` keeps (the least recently used is dropped)
COMPILED_KEPT = 16


class ByStructure:
    """A whitened model (``white``, ``keep``, ``after``: :func:`compile_whitened`'s) to compile, equal to any
    other of the same :class:`GraphStructure`: the key under which :func:`compiled_for_structure` keeps its
    compiled model. Hashing raises TypeError when an Op of the graph cannot be hashed (then nothing is kept)."""

    def __init__(self, structure: GraphStructure, white, keep: list[str], after: list[str]):
        self.structure, self.white, self.keep, self.after = structure, white, keep, after

    def __eq__(self, other) -> bool:
        return isinstance(other, ByStructure) and self.structure.key == other.structure.key

    def __hash__(self) -> int:
        return hash(self.structure.key)


@lru_cache(maxsize=COMPILED_KEPT)
def compiled_for_structure(model: ByStructure) -> tuple[tuple, object, dict]:
    """nutpie's compiled model of the first whitened model of ``model``'s structure in this process, kept
    (at most :data:`COMPILED_KEPT`; ``compiled_for_structure.cache_info()``, ``.cache_clear()``) for later
    models of that structure - a second data set of a study, a fit on a worker that fitted such a model
    before, step 4's next round (a new whitening): the graph's shared variables in the structure's order,
    the compiled model, and where its functions read each shared variable (:func:`_shared_layout`)."""
    compiled, where = _compile(model.white, model.keep, model.after)
    return model.structure.shared, compiled, where


def _with_shared_values(found: tuple, structure: GraphStructure, *, coords: dict, dims: dict):
    """The kept compiled model ``found`` (:func:`compiled_for_structure`) with ``structure.shared``'s present
    values as its ``user_data`` and the given ``coords`` and ``dims``; its ``logp_func`` and ``expand_func``
    call its C callbacks. None when the kept functions read a shared variable the structure does not name."""
    kept_shared, whitened, where = found
    compiled = whitened.model
    if set(where) != set(kept_shared):
        return None
    buffer = np.zeros_like(compiled.user_data)
    for var, kept in zip(structure.shared, kept_shared):
        start, end, shape, dtype = where[kept]
        value = np.asarray(var.get_value(borrow=True))
        if value.shape != shape or value.dtype != dtype:  # the structure holds both: cannot happen
            raise RuntimeError(f"shared variable {var.name!r}: {value.shape} {value.dtype}, kept {shape} {dtype}")
        buffer[start:end] = value.ravel()
    reused = dataclasses.replace(compiled, user_data=buffer, _coords=coords, dims=dims)
    callbacks = _Callbacks(reused)
    return dataclasses.replace(whitened, model=dataclasses.replace(reused, logp_func=callbacks.logp,
                                                                   expand_func=callbacks.expand))


class _Callbacks:
    """A reused model's :meth:`logp` (log density and gradient at z) and :meth:`expand` (z and the kept
    variables, flattened), by its C callbacks and its own ``user_data``: what the kept PyTensor functions
    would give with this model's shared values."""

    def __init__(self, compiled):
        self.compiled = compiled

    def _call(self, callback, *sizes_and_arrays) -> None:
        import ctypes

        p = ctypes.POINTER(ctypes.c_double)
        args = [a.ctypes.data_as(p) if isinstance(a, np.ndarray) else a for a in sizes_and_arrays]
        callback.ctypes(*args, self.compiled.user_data.ctypes.data)

    def logp(self, z) -> tuple[float, np.ndarray]:
        c = self.compiled
        grad, value = np.zeros(c.n_dim), np.zeros(1)
        self._call(c.compiled_logp_func, c.n_dim, np.ascontiguousarray(z, dtype=np.float64), grad, value)
        return float(value[0]), grad

    def expand(self, z) -> list[np.ndarray]:
        c = self.compiled
        draw = np.zeros(c.n_expanded)
        self._call(c.compiled_expand_func, c.n_dim, c.n_expanded, np.ascontiguousarray(z, dtype=np.float64), draw)
        return [draw]


def _shared_layout(fns) -> tuple[np.ndarray, dict]:
    """The present values of the shared variables of PyTensor functions ``fns``, each once, flattened into
    one float64 buffer (n,) - nutpie hands its address to both callbacks as ``user_data`` - and where each
    lies: ``{variable: (start, end, shape, dtype)}``. Integer and boolean values are carried as floats
    (exactly, or a ValueError)."""
    where, parts, n = {}, [], 0
    for fn in fns:
        for var in fn.get_shared():
            if var in where:
                continue
            value = np.asarray(var.get_value())
            flat = value.ravel().astype(np.float64)
            if value.dtype != np.float64 and not np.array_equal(flat.astype(value.dtype), value.ravel()):
                raise ValueError(f"shared variable {var.name!r} ({value.dtype}) is not exact as float64")
            where[var] = (n, n + value.size, value.shape, value.dtype)
            parts.append(flat)
            n += value.size
    buffer = np.concatenate(parts) if parts else np.zeros(1)
    return np.ascontiguousarray(buffer), where


def _callback(source: str, name: str, fn, where: dict, n_buffer: int, signature, **sizes):
    """The C callback ``name`` of ``source`` around PyTensor function ``fn``'s jitted core (called with x
    and then ``fn``'s shared values, read from the buffer of :func:`_shared_layout` at ``where``),
    compiled by numba for ``signature`` (None: a jitted function that releases the GIL) - and cached, under
    a key of PyTensor's key for ``fn`` and the callback's source (its sizes and the shared values' places),
    where PyTensor caches ``fn``."""
    import numba
    from pytensor.link.numba.cache import (
        CACHED_SRC_FUNCTIONS,
        compile_numba_function_src,
    )

    args = ""
    for var in fn.get_shared():
        start, end, shape, dtype = where[var]
        piece = f"buf[{start}:{end}]" if dtype == np.float64 else f"buf[{start}:{end}].astype(np.{dtype.name})"
        args += f", {piece}.reshape({tuple(int(n) for n in shape)!r})"
    text = source.format(args=args, n_buf=max(int(n_buffer), 1), **sizes)
    core = fn.vm.jit_fn
    inner = CACHED_SRC_FUNCTIONS.get(core.py_func)  # None when PyTensor does not cache fn
    key = None if inner is None else hashlib.sha256(f"{CALLBACK_VERSION}|{inner}|{text}".encode()).hexdigest()
    # __name__: numba rebuilds a cached function's globals from this (importable) module
    py_func = compile_numba_function_src(text, name, {"__name__": __name__, "numba": numba, "np": np, "core": core},
                                         cache_key=key)
    if signature is None:
        return numba.njit(nogil=True, cache=key is not None)(py_func)
    return numba.cfunc(signature, cache=key is not None)(py_func)


#: the sample statistics a convergence check reads besides the draws (divergences, the modes' log density)
CHECK_STATS = ("diverging", "logp", "n_steps", "step_size")


def checked_draws(run, names: Sequence[str], at: int) -> xr.DataTree | None:
    """The first ``at`` draws after tuning of every chain of nutpie's background ``run``, of the scalar
    variables ``names`` and the statistics :data:`CHECK_STATS` only, read from nutpie's Arrow trace; None
    while a chain has fewer.

    nutpie's own ``inspect`` converts every column of every draw, a draw's trajectories too (800 numbers
    a draw on Lotka-Volterra with its 400 dense times): a long run's checks then spend tens of seconds on
    the main thread, taken from the chains where cores are few, against a few scalars and statistics
    here."""
    def column(batch, name: str) -> np.ndarray:
        return np.asarray(batch.column(name))  # an Arrow array (arro3) by the array protocol

    trace = run._sampler.inspect()  # nutpie's inspect without its conversion of every column
    if trace is None:  # its results were taken (a run ended by wait or abort)
        return None
    draw_batches, stat_batches = trace.get_arrow_trace()
    post: dict[str, list[np.ndarray]] = {n: [] for n in names}
    stats: dict[str, list[np.ndarray]] = {n: [] for n in CHECK_STATS}
    for draws, stat in zip(draw_batches, stat_batches):
        first = int(np.asarray(column(stat, "tuning"), bool).sum())
        if draws.num_rows - first < at:
            return None
        for n in names:
            post[n].append(np.asarray(column(draws, n), float)[first:first + at])
        for n in CHECK_STATS:
            if n in stat.column_names:
                stats[n].append(np.asarray(column(stat, n))[first:first + at])
    dims = ("chain", "draw")
    return xr.DataTree.from_dict({
        "posterior": xr.Dataset({n: (dims, np.stack(v)) for n, v in post.items()}),
        "sample_stats": xr.Dataset({n: (dims, np.stack(v)) for n, v in stats.items() if v}),
    })


def _quietly(get: Callable[[], xr.DataTree]) -> xr.DataTree:
    """nutpie's trace so far, without ArviZ's warning that a trace of fewer draws than chains (a run
    stopped early) may have its dimensions swapped: they are not."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Found chain dimension to be longer than draw dimension")
        return get()


def _finished(run) -> bool:
    """Whether nutpie's background run has ended (nutpie 0.16 raises TimeoutError while it runs)."""
    try:
        return bool(run.is_finished)
    except TimeoutError:
        return False


def equal_chains(tree: xr.DataTree, at_most: int | None = None) -> xr.DataTree:
    """``tree``'s ``posterior`` and ``sample_stats`` cut to the draws every chain has (nutpie pads a
    chain that has fewer with NaN, in its step size too), and to the first ``at_most`` where given; the
    ``warmup_`` groups likewise (without ``at_most``); the other groups unchanged."""
    out = tree.copy()
    for prefix, limit in (("", at_most), ("warmup_", None)):
        if f"{prefix}sample_stats" not in tree.children:
            continue
        stats = tree[f"{prefix}sample_stats"].to_dataset()
        drawn = np.isfinite(np.asarray(stats["step_size"], float))  # (chain, draw)
        n = int(drawn.cumprod(axis=1).sum(axis=1).min()) if drawn.size else 0
        if limit is not None:
            n = min(n, int(limit))
        for group in (f"{prefix}posterior", f"{prefix}sample_stats"):
            if group in tree.children:
                out[group] = xr.DataTree(tree[group].to_dataset().isel(draw=slice(0, n)))
    return out

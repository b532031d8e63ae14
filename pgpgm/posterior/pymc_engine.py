"""PyMC's NUTS within a budget: one :func:`pymc.sample` call (or a wave of calls) whose draws survive a stop
while tuning, and the joining of rounds and waves."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import pymc as pm
import xarray as xr

from ..errors import StartError
from ..processes import exact_math, sample_in_processes
from .budget import KEEP_CHAINS, BudgetMeter

#: the step-size target of a further round is raised halfway to 1 (0.9 -> 0.95 -> 0.975 -> 0.9875) but
#: not above this: each raise shrinks the step size and lengthens every trajectory, and divergences that a
#: smaller step does not remove (a solver failure as -inf, a wall) made an uncapped target climb towards 1
#: round after round (from a wrong mode: past 0.99 by round 5, a step size near 0 and 1023 leapfrog steps
#: per draw, over ten minutes of sampling). A cap of 0.95 leaves divergences where a ridge meets a prior
#: bound, which the later raises remove, in less time than the capped rounds take: the later raises help
#: there, so the cap is 0.99 and the budget bounds the rest.
TARGET_ACCEPT_MAX = 0.99


#: NUTS trees stop at 2^10 - 1 = 1023 leapfrog steps per draw (PyMC's default, stated here)
MAX_TREEDEPTH = 10


def budgeted_sample(meter: BudgetMeter, **kwargs):
    """:func:`pymc.sample` with ``meter`` as its callback; the tuning iterations are kept in the
    sampler and dropped here, so that a run the budget stopped while tuning still returns draws (the
    latter half of its tuning iterations, ``attrs["pgpgm_tuning_draws"] = 1``). With a budget and
    fewer processes than chains (``1 < cores < chains``), the chains run in waves of ``cores``
    (:func:`_sample_in_waves`), each wave a share of the budget."""
    chains, cores = int(kwargs["chains"]), int(kwargs["cores"])
    limited = meter.budget.seconds is not None or meter.budget.gradient_evaluations is not None
    if limited and 1 < cores < chains:
        return _sample_in_waves(meter, **kwargs)
    meter.begin_round(chains, sequential=cores == 1)
    stops = meter.stops
    # in this process (cores=1) the chains run the code compiled here: without fast math, the same code
    # as a later process loads from the cache; chain processes always load it (exact_math)
    with exact_math() if cores == 1 else contextlib.nullcontext(), _starting():
        tree = sample_in_processes(pm.sample, callback=meter, discard_tuned_samples=False, **kwargs)
    meter.exhausted = meter.exhausted or meter.cut  # a chain cut at its share: the budget stopped this round
    tree = kept_draws(tree, stopped=meter.stops > stops)
    meter.dropped += chains - int(tree.posterior.sizes["chain"])
    return tree


@contextlib.contextmanager
def _starting():
    """PyMC's failure to evaluate the model at a chain's start, as a :class:`~pgpgm.errors.StartError`."""
    try:
        yield
    except pm.exceptions.SamplingError as failed:
        raise StartError(f"NUTS (PyMC) could not start: {str(failed).splitlines()[0]}") from failed


def kept_draws(tree, stopped: bool = True):
    """The draws of a :func:`pymc.sample` tree made with the tuning iterations kept: its draws after
    tuning, or, when it stopped while tuning, the latter half of its tuning iterations
    (``attrs["pgpgm_tuning_draws"] = 1``) - and also when it stopped just after tuning, with fewer
    draws than that half: then that half and the draws (a budget that stops a run a draw after tuning
    would leave 1 draw per chain and no diagnostics). ``stopped``: whether the budget stopped it (else
    its draws are kept however few)."""
    n_post = tree.posterior.sizes.get("draw", 0) if "posterior" in tree.children else 0
    n_tune = tree["warmup_posterior"].sizes.get("draw", 0) if "warmup_posterior" in tree.children else 0
    out = xr.DataTree()
    if n_post >= n_tune - n_tune // 2 or (n_post and not stopped):
        out["posterior"], out["sample_stats"] = tree["posterior"], tree["sample_stats"]
    else:  # stopped while or just after tuning: the latter half of the tuning iterations (and the draws)
        for group in ("posterior", "sample_stats"):
            parts = [tree[f"warmup_{group}"].to_dataset().isel(draw=slice(n_tune // 2, None))]
            if n_post:
                parts.append(tree[group].to_dataset())
            part = xr.concat(parts, dim="draw", data_vars="all", coords="minimal", compat="override", join="outer",
                             combine_attrs="override") if len(parts) > 1 else parts[0]
            out[group] = xr.DataTree(part.assign_coords(draw=np.arange(part.sizes["draw"])))
        out.attrs["pgpgm_tuning_draws"] = 1
    for name, child in tree.children.items():
        if not name.startswith("warmup_") and name not in out.children:
            out[name] = child
    out.attrs = {**tree.attrs, **out.attrs}
    return out


def chain_seeds(seed: int | None, first: int):
    """The ``random_seed`` of :func:`pymc.sample` that gives its chains 0, 1, ... the random streams
    that ``pymc.sample(random_seed=seed)`` gives its chains ``first``, ``first + 1``, ... (PyMC spawns
    one child of ``numpy.random.SeedSequence(seed)`` per chain: a sequence that has spawned ``first``
    children already spawns those next), so that chains sampled in waves draw as in one call."""
    if seed is None or first == 0:
        return seed
    return np.random.default_rng(np.random.SeedSequence(int(seed), n_children_spawned=int(first)))


def _sample_in_waves(meter: BudgetMeter, **kwargs):
    """:func:`budgeted_sample` of ``chains`` chains on ``cores`` < ``chains`` processes: one
    :func:`pymc.sample` call per wave of ``cores`` chains (the last may be smaller), each started with
    its chains' own starting points and random streams (:func:`chain_seeds`: the draws are those of
    one call), each ending once its share of the budget is spent (:meth:`BudgetMeter.begin_waves`).
    PyMC's own scheduling of more chains than processes in one call starts a chain when another
    ends, so that a budget stop there leaves the last chains undrawn.

    Returns the waves' draws joined by :func:`join_waves`."""
    chains, cores, seed = int(kwargs["chains"]), int(kwargs["cores"]), kwargs.get("random_seed")
    initvals = kwargs.get("initvals")
    waves = [list(range(i, min(i + cores, chains))) for i in range(0, chains, cores)]
    meter.begin_waves(len(waves))
    parts = []
    for w, idx in enumerate(waves):
        if w and meter.check():  # the first wave runs (a budget spent before it: its first draws)
            break
        meter.begin_wave(w, len(idx))
        args = {**kwargs, "chains": len(idx), "cores": len(idx), "random_seed": chain_seeds(seed, idx[0]),
                "initvals": None if initvals is None else [initvals[i] for i in idx]}
        stops = meter.stops
        tree = sample_in_processes(pm.sample, callback=meter, discard_tuned_samples=False, **args)
        parts.append(kept_draws(tree, stopped=meter.stops > stops))
        meter.end_wave()
    meter.end_waves()
    meter.exhausted = meter.exhausted or meter.cut
    tree = join_waves(parts)
    meter.dropped += chains - int(tree.posterior.sizes["chain"])
    return tree


def join_waves(parts: Sequence):
    """The draws of :func:`_sample_in_waves`'s waves (``parts``: the trees of :func:`kept_draws`, in
    wave order) as one tree: chains joined along ``chain`` (renumbered 0, 1, ...), every chain cut to
    the shortest. Waves stopped while tuning are left out when another wave has draws after tuning; of
    the rest, a wave is kept when it has at least ``KEEP_CHAINS`` times the longest wave's draws, as
    chains stopped together are kept (:meth:`BudgetMeter._even_out`): a wave stopped after 1 draw (its
    share spent while its processes started) is left out rather than cutting the others to 1 draw, and
    a wave shorter than another for a slower process (a loaded 2-core machine: wave 0's second chain
    ran 1.8x slower, wave 0 used its share and half of wave 1's, and wave 1 drew 271 draws to wave 0's
    740) is kept - PyMC's rule, maximising chains x shortest length, had left out its chains, and R-hat
    what they would have said."""
    sampled = [p for p in parts if not p.attrs.get("pgpgm_tuning_draws")]
    keep = sampled or list(parts)
    longest = max(int(p.posterior.sizes["draw"]) for p in keep)
    keep = [p for p in keep if int(p.posterior.sizes["draw"]) >= KEEP_CHAINS * longest]
    if len(keep) == 1:
        return keep[0]
    n = min(p.posterior.sizes["draw"] for p in keep)
    out = keep[0].copy()
    for group in ("posterior", "sample_stats"):
        joined = xr.concat([p[group].to_dataset().isel(draw=slice(0, n)) for p in keep], dim="chain",
                           data_vars="all", coords="minimal", compat="override", join="outer",
                           combine_attrs="override")
        out[group] = xr.DataTree(joined.assign_coords(chain=np.arange(joined.sizes["chain"])))
    return out


def leapfrog_steps(tree) -> int:
    """Leapfrog steps (one ODE solve with sensitivities each) of the draws of ``tree``."""
    return int(tree.sample_stats["n_steps"].sum()) if "n_steps" in tree.sample_stats else 0


def extend_chains(tree, more):
    """``more`` (a DataTree from :func:`pymc.sample`) with the draws of ``tree`` before its own:
    ``posterior`` and ``sample_stats`` joined along ``draw`` (renumbered 0, 1, ...), chain by
    chain; ``more``'s other groups and attributes. ``more`` must continue ``tree``'s chains
    (each chain started at ``tree``'s last draw of that chain)."""
    out = more.copy()
    for group in ("posterior", "sample_stats"):
        joined = xr.concat([tree[group].to_dataset(), more[group].to_dataset()], dim="draw",
                           data_vars="all", coords="minimal", compat="override", join="exact",
                           combine_attrs="override")
        out[group] = xr.DataTree(joined.assign_coords(draw=np.arange(joined.sizes["draw"])))
    return out

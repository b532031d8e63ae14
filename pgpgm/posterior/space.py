"""The model's value space: where step 4's chains start and the mass matrix they start from (the refinement's
uncertainty carried to PyMC's transformed space), and the chains' pooled covariance for a further round."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import pymc as pm
from pymc.step_methods.hmc.quadpotential import (
    QuadPotentialDiag,
    QuadPotentialDiagAdapt,
    QuadPotentialFull,
    QuadPotentialFullAdapt,
)

from ..processes import exact_math


class ValueSpace:
    """Carries constrained values of a model's free scalar variables to PyMC's value space
    (one compiled function of the transforms), and evaluates the model's log density there with
    :attr:`logp_dlogp`, the one compiled log density and gradient of a :func:`run_nuts` call: every
    round's NUTS step takes it (``pymc.NUTS(logp_dlogp_func=...)``) instead of compiling its own
    (3-5 s a round on the published models)."""

    def __init__(self, model: pm.Model):
        import pytensor

        self.model = model
        self.rvs = list(model.free_RVs)
        inputs = [rv.type() for rv in self.rvs]
        outputs = []
        for rv, x in zip(self.rvs, inputs):
            tr = model.rvs_to_transforms.get(rv)
            outputs.append(x if tr is None else tr.forward(x, *rv.owner.inputs))
        with exact_math():  # the same code whether compiled here or loaded from the cache
            self._forward = pytensor.function(inputs, outputs, on_unused_input="ignore")

    @cached_property
    def logp_dlogp(self):
        """PyMC's ``ValueGradFunction`` of the model: (log density, gradient) of the raveled values of
        ``model.continuous_value_vars`` (compiled on first use; nutpie's engine never asks for it), compiled
        without fast math (:func:`~pgpgm.processes.exact_math`): PyMC's chains in this process
        and in later ones then run the same code, whether compiled or loaded from the cache."""
        with exact_math():
            func = self.model.logp_dlogp_function(ravel_inputs=True)
        func.trust_input = True
        return func

    def point(self, values: Mapping[str, float]) -> dict[str, np.ndarray]:
        """The value-space point of constrained ``values`` (one per free variable)."""
        out = self._forward(*[np.asarray(values[rv.name], dtype=rv.dtype) for rv in self.rvs])
        return {self.model.rvs_to_values[rv].name: np.asarray(u) for rv, u in zip(self.rvs, out)}

    def logp(self, values: Mapping[str, float]) -> float:
        moved = self.point(values)
        x = np.concatenate([np.ravel(moved[v.name]) for v in self.model.continuous_value_vars]).astype(np.float64)
        return float(self.logp_dlogp(x)[0])

    def off_support(self, values: Mapping[str, float]) -> frozenset[str]:
        """The names of the free variables whose constrained value in ``values`` has no finite
        transformed value: outside its prior's support, or on a bound the transform sends to infinity."""
        moved = self.point(values)
        return frozenset(rv.name for rv in self.rvs
                         if not np.all(np.isfinite(moved[self.model.rvs_to_values[rv].name])))


def dispersed_starts(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float], chains: int,
                     rng: np.random.Generator, scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    """``chains`` starting points around ``center`` (a value per free variable), each
    coordinate drawn from Normal(center, scale * sd) and kept where the model's log density
    is finite (redrawn with half the spread otherwise; the centre itself as a last resort). A
    coordinate drawn outside its prior's support (a centre on a bound of the box: half its draws) is
    mirrored about the centre, so that a centre on the bound - where the log density itself is not
    finite - is not the start of a chain ("Bad initial energy")."""
    names = [rv.name for rv in space.rvs]
    starts = []
    for _ in range(chains):
        point, s = dict(center), scale
        for _attempt in range(8):
            dev = {n: s * float(sd.get(n, 0.0)) * rng.standard_normal() for n in names}
            off = space.off_support({n: float(center[n]) + dev[n] for n in names})
            cand = {n: float(center[n]) + (-dev[n] if n in off else dev[n]) for n in names}
            if np.isfinite(space.logp(cand)):
                point = cand
                break
            s /= 2
        starts.append({n: np.asarray(point[n], float) for n in names})
    return starts


def continuing_starts(space: ValueSpace, post) -> list[dict[str, np.ndarray]]:
    """Each chain's last draw in ``post`` (chain, draw), as the start of the next round.

    A draw whose transformed value is not finite - a parameter far out on the log scale's soft wall
    comes back from it as exactly its upper bound in floating point (10.0 in Uniform(0, 10)), where
    PyMC's start is log(0): "Bad initial
    energy" and a failed fit - moves 1e-9 of the way towards the chain's mean, inside the box; the
    chain's per-variable median draw is the last resort."""
    names = [rv.name for rv in space.rvs]
    starts = []
    for c in range(post.sizes["chain"]):
        last = {n: np.asarray(post[n].values[c, -1], float) for n in names}
        if not np.isfinite(space.logp(last)):
            off = space.off_support(last)
            last = {n: last[n] + 1e-9 * (np.mean(post[n].values[c]) - last[n]) if n in off else last[n]
                    for n in names}
            if not np.isfinite(space.logp(last)):
                last = {n: np.asarray(np.median(post[n].values[c]), float) for n in names}
        starts.append(last)
    return starts


def seed_metric(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float],
                covariance: tuple[Sequence[str], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """The refinement's uncertainty carried to PyMC's transformed space by central differences of
    the transforms: ``(mean, matrix, dense)``, mean (d,) the transformed ``center`` of the model's d value
    variables (in ``model.value_vars`` order) and matrix (d, d) their covariance - dense when
    ``covariance`` = (names, (K, K) matrix) is finite (a banana-shaped posterior of correlated
    parameters then needs short trajectories from the first draw; ``dense`` True), else diagonal from ``sd``.
    Variables without an sd, or whose transform has no finite derivative at ``center`` (e.g. a refined
    value on a bound of its box), get variance 1 and, when their transformed centre is infinite, a mean
    just inside the box."""
    at = space.point(center)
    names, mean, du = [], [], []
    for v in space.model.value_vars:
        name = space.model.values_to_rvs[v].name
        sdv = float(sd.get(name, np.nan))
        h = 1e-4 * sdv if np.isfinite(sdv) and sdv > 0 else 1e-6 * max(abs(float(center[name])), 1.0)
        up, down = (float(space.point({**center, name: center[name] + s})[v.name]) for s in (h, -h))
        du.append((up - down) / (2 * h))
        names.append(name)
        # a centre on a bound of its box is infinite in the transformed space: the adaptation's running
        # mean starts just inside instead (an infinite one made numpy warn "invalid value" at every tuning
        # draw of the first window - PyMC discards that window's estimate, so only the warnings differ)
        mean.append(next((u for u in (float(at[v.name]), up, down) if np.isfinite(u)), 0.0))
    du = np.array(du)
    var = np.array([(d * float(sd[n])) ** 2 if np.isfinite(sd.get(n, np.nan)) and sd.get(n, 0) > 0 else 1.0
                    for n, d in zip(names, du)])
    var = np.where(np.isfinite(var), np.maximum(var, 1e-10), 1.0)  # a centre on a bound: no derivative there
    full = np.diag(var)
    if covariance is not None:
        cnames, cmat = list(covariance[0]), np.asarray(covariance[1], float)
        idx = [names.index(n) for n in cnames if n in names]
        sub = cmat[np.ix_([cnames.index(names[i]) for i in idx], [cnames.index(names[i]) for i in idx])]
        if idx and np.all(np.isfinite(sub)):
            seeded = full.copy()
            d = du[idx]
            seeded[np.ix_(idx, idx)] = d[:, None] * sub * d[None, :]
            if np.all(np.isfinite(seeded)) and np.all(np.linalg.eigvalsh(seeded) > 0):
                return np.array(mean), seeded, True
    return np.array(mean), full, False


def seeded_potential(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float],
                     covariance: tuple[Sequence[str], np.ndarray] | None = None, weight: float = 10.0,
                     adapt: bool = True):
    """A mass-matrix adaptation for NUTS seeded with the refinement's uncertainty
    (:func:`seed_metric`) - or, with ``adapt=False``, that seed as a fixed mass matrix
    (``QuadPotentialFull`` / ``QuadPotentialDiag``: NUTS's tuning then adapts the step size only).
    A dense seed gives PyMC's full adaptation (weight ``weight`` on the seed), a diagonal one its
    diagonal adaptation."""
    mean, full, dense = seed_metric(space, center, sd, covariance)
    if dense:
        if not adapt:
            return QuadPotentialFull(full)
        with warnings.catch_warnings():  # PyMC flags the class as experimental; pgpgm chose it (tested)
            warnings.filterwarnings("ignore", "QuadPotentialFullAdapt is an experimental feature", UserWarning)
            return QuadPotentialFullAdapt(len(mean), mean, full, weight)
    var = np.diag(full).copy()
    return QuadPotentialDiagAdapt(len(mean), mean, var, weight) if adapt else QuadPotentialDiag(var)


def pooled_covariance(space: ValueSpace, posterior, max_points: int = 2000) -> np.ndarray:
    """(K, K) covariance of the draws of every chain in ``posterior`` in PyMC's transformed
    (value) space, in the order of ``space.model.value_vars``, shrunk towards 1e-3 I as
    Stan does (n / (n + 5) C + 1e-3 5 / (n + 5) I) so that it stays positive definite. Draws whose
    transformed value is not finite (a parameter on the log scale's soft wall that came back as
    exactly its bound, see :func:`continuing_starts`) are left out."""
    names = [space.model.values_to_rvs[v].name for v in space.model.value_vars]
    vals = {n: np.asarray(posterior[n].values, float).reshape(-1) for n in names}
    n_all = vals[names[0]].size
    keep = np.unique(np.linspace(0, n_all - 1, min(n_all, max_points)).astype(int))
    U = np.array([[float(pt_[v.name]) for v in space.model.value_vars]
                  for pt_ in (space.point({n: vals[n][i] for n in names}) for i in keep)])
    U = U[np.all(np.isfinite(U), axis=1)]
    n = U.shape[0]
    return n / (n + 5.0) * np.atleast_2d(np.cov(U.T)) + 1e-3 * 5.0 / (n + 5.0) * np.eye(U.shape[1])

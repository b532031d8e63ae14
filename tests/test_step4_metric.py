"""Step 4's first-round mass matrix: ``metric="laplace"`` holds the seeded covariance fixed.

A Gaussian target with a known, correlated and badly scaled covariance: NUTS with the known covariance as
its fixed mass matrix reaches the target's moments with a fraction of the leapfrog steps (gradient
evaluations) that a fixed identity metric needs, and with more effective draws.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pgpgm
from pgpgm.errors import DataError
from pgpgm.posterior.diagnostics import diagnose
from pgpgm.posterior.rounds import run_nuts

K = 4
NAMES = [f"x{i}" for i in range(K)]


def _covariance() -> np.ndarray:
    """(K, K): sds 0.1 to 10 (condition number 1e4), rotated so that every pair correlates."""
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((K, K)))
    return q @ np.diag(np.array([0.1, 1.0, 3.0, 10.0]) ** 2) @ q.T


def _gaussian_model(cov: np.ndarray) -> pm.Model:
    prec = np.linalg.inv(cov)
    with pm.Model() as model:
        x = pt.stack([pm.Flat(n) for n in NAMES])
        pm.Potential("gaussian", -0.5 * pt.dot(x, pt.dot(prec, x)))
    return model


def _run(model, cov_seed: np.ndarray, metric: str = "laplace"):
    sd = {n: float(np.sqrt(cov_seed[i, i])) for i, n in enumerate(NAMES)}
    return run_nuts(model, {n: 0.0 for n in NAMES}, sd, covariance=(NAMES, cov_seed), draws=300, tune=100,
                    chains=2, cores=1, seed=1, max_rounds=1, budget=None, progressbar=False, warn=False,
                    metric=metric, nuts_sampler="pymc")  # PyMC's metric


def test_a_known_covariance_as_fixed_metric_needs_far_fewer_gradients_than_identity():
    cov = _covariance()
    model = _gaussian_model(cov)
    known, identity = _run(model, cov), _run(model, np.eye(K))
    g_known = known.budget["used_gradient_evaluations"]
    g_identity = identity.budget["used_gradient_evaluations"]
    # the identity metric's step size is set by the narrowest direction (sd 0.1) and its trajectories must
    # cross the widest (sd 10): ~100 leapfrog steps per draw against a few with the known covariance
    assert g_known * 5 < g_identity, (g_known, g_identity)
    d_known, d_identity = diagnose(known.tree, NAMES), diagnose(identity.tree, NAMES)
    ess_known = float(np.minimum(d_known["ess_bulk"], d_known["ess_tail"]).min())
    ess_identity = float(np.minimum(d_identity["ess_bulk"], d_identity["ess_tail"]).min())
    assert ess_known / g_known > 5 * ess_identity / g_identity
    assert float(d_known["rhat"].max()) < 1.02 and ess_known > 200
    # the draws are the target's: means within 4 Monte Carlo standard errors, variances within 25 %
    draws = np.stack([known.tree.posterior[n].values.ravel() for n in NAMES], axis=1)
    se = np.sqrt(np.diag(cov) / ess_known)
    assert np.all(np.abs(draws.mean(axis=0)) < 4 * se)
    np.testing.assert_allclose(np.diag(np.cov(draws.T)), np.diag(cov), rtol=0.25)


def test_laplace_metric_is_held_fixed_while_adapt_adapts():
    """The "laplace" seed is the given covariance as a fixed dense mass matrix (carried to the value
    space: here the identity transform); "adapt" is PyMC's dense adaptation started from it."""
    cov = _covariance()
    model = _gaussian_model(cov)
    from pymc.step_methods.hmc.quadpotential import (
        QuadPotentialFull,
        QuadPotentialFullAdapt,
    )

    from pgpgm.posterior.space import ValueSpace, seeded_potential

    space = ValueSpace(model)
    center = {n: 0.0 for n in NAMES}
    sd = {n: float(np.sqrt(cov[i, i])) for i, n in enumerate(NAMES)}
    fixed = seeded_potential(space, center, sd, (NAMES, 16 * cov), adapt=False)
    adapting = seeded_potential(space, center, sd, (NAMES, 16 * cov))
    assert type(fixed) is QuadPotentialFull and isinstance(adapting, QuadPotentialFullAdapt)
    np.testing.assert_allclose(fixed._cov, 16 * cov, rtol=1e-6)  # Flat: the identity transform


def test_metric_is_checked():
    model = _gaussian_model(np.eye(K))
    with pytest.raises(DataError, match="metric"):
        run_nuts(model, {n: 0.0 for n in NAMES}, {n: 1.0 for n in NAMES}, metric="dense", progressbar=False)
    with pytest.raises(DataError, match="metric"):
        pgpgm.NUTS(metric="identity")

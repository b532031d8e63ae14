"""Simulation-based calibration (issue 74): the checks pass an exact posterior and fail one whose sds are too
small; a short SBC of pgpgm's default posterior on a one-parameter model (slow; the four model classes are
``benchmarks/calibration.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pgpgm
from pgpgm.posterior.calibration import calibration_record as record
from pgpgm.posterior.calibration import calibration_table, rank, uniformity


def _conjugate_records(sets: int, scale: float, seed: int = 0) -> list[dict]:
    """mu ~ N(0, 1), five y ~ N(mu, 1): the exact posterior N(sum y / 6, 1 / 6), its draws' spread times ``scale``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(sets):
        mu = rng.standard_normal()
        y = mu + rng.standard_normal(5)
        mean, sd = y.sum() / 6.0, np.sqrt(1.0 / 6.0)
        draws = mean + scale * sd * rng.standard_normal(1000)
        out.append(record({"mu": draws}, {"mu": mu}))
    return out


def test_an_exact_posterior_passes_and_one_with_sds_times_0_7_fails():
    good = calibration_table(_conjugate_records(200, 1.0), ["mu"]).loc["mu"]
    assert good["uniform"] and good["covers"] and abs(good["coverage_90"] - 0.9) < 0.05
    bad = calibration_table(_conjugate_records(200, 0.7), ["mu"]).loc["mu"]
    assert not bad["uniform"] and not bad["covers"] and bad["coverage_90"] < 0.85


def test_ranks_count_the_draws_below_the_truth():
    draws = np.arange(1000.0)
    assert rank(draws, -1.0) == 0 and rank(draws, 2000.0) == 99
    assert 45 <= rank(draws, 500.0) <= 55
    assert uniformity(list(range(100)) * 2) > 0.99  # every rank twice: as uniform as it gets
    assert uniformity([0] * 100) < 1e-10


DECAY = pgpgm.ODESystem.from_equations({"x": "-k*x"}, ["k"], name="decay")
T = np.linspace(0.0, 4.0, 12)


@pytest.mark.slow
def test_the_default_posterior_of_a_decay_is_calibrated():
    """k ~ Uniform(0.1, 2) (the fit's prior), x(0) = 2 known, noise sd 0.1 known: 60 data sets, the default
    step 4 (NUTS): ranks uniform, 90 % intervals in their binomial band; the same draws squeezed to 0.7 of their
    spread about their mean fail."""
    rng = np.random.default_rng(11)
    records, squeezed = [], []
    for i in range(60):
        k = rng.uniform(0.1, 2.0)
        y = 2.0 * np.exp(-k * T) + 0.1 * rng.standard_normal(T.size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pgpgm.fit(DECAY, {"time": T, "x": y}, ["x"], x0={"x": 2.0}, noise_sd=0.1, priors=(0.1, 2.0),
                          draws=300, tune=200, seed=i, progressbar=False)
        d = r.posterior.posterior["k"].values.reshape(-1)
        records.append(record({"k": d}, {"k": k}))
        squeezed.append(record({"k": d.mean() + 0.7 * (d - d.mean())}, {"k": k}))
    table = calibration_table(records, ["k"]).loc["k"]
    assert table["uniform"] and table["covers"], table
    assert not calibration_table(squeezed, ["k"]).loc["k"]["covers"]

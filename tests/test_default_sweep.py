"""Valid input never ends in an exception (issue 76): the default call on every shipped model and case, data
simulated with three seeds, step 4 on with a small budget - every fit returns (warnings may say what failed to
converge). CI runs seed 0 of one case per model family (:data:`CI_CASES`, ~3 min); ``./run.sh test --slow``
every case and seed (~1 h on 2 cores)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pgpgm

CASES = [(m, c) for m in pgpgm.available_models() for c in pgpgm.load_model(m).cases]
#: a case of each kind of problem whose default fit takes seconds: one or two states measured, a latent start,
#: counts, an epidemic with latent compartments, a predator-prey cycle
CI_CASES = [("lotka-volterra", "x1-observed"), ("fitzhugh-nagumo", "R-observed"), ("protein-transduction", "R-latent"),
            ("sir", "I-observed"), ("seir", "I-observed"), ("rosenzweig-macarthur", "N-observed")]
#: step 4's budget in the sweep: enough to compile and draw, small enough for 21 cases in CI
BUDGET = pgpgm.PosteriorBudget(8.0, None)


def _default_fit(model: str, case: str, seed: int):
    spec = pgpgm.load_model(model)
    c = spec.case(case)
    data = spec.simulate(case, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgpgm.fit(spec.system, data, list(c.observed), priors=spec.priors(case), seed=seed,
                         posterior=pgpgm.NUTS(budget=BUDGET), progressbar=False), spec


@pytest.mark.parametrize("model, case", CI_CASES, ids=[f"{m}-{c}" for m, c in CI_CASES])
def test_the_default_call_returns_on_a_case_of_every_kind(model, case):
    result, spec = _default_fit(model, case, 0)
    assert np.isfinite(result.nll) and result.posterior is not None
    assert set(result.estimates["theta"].coords["parameter"].values) == set(spec.system.parameters)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model, case", CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_the_default_call_returns_on_every_shipped_case_and_seed(model, case, seed):
    result, _ = _default_fit(model, case, seed)
    assert np.isfinite(result.nll) and result.posterior is not None

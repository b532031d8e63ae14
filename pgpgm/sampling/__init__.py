"""Step 2b: sampling the gradient-matching density.

``target`` (what a density offers the sampler) -> ``kernel`` (one pure step) ->
``adapt`` (burn-in proposal scales) -> ``start`` (where chains begin) -> ``driver``
(chains and the DataTree) -> ``pymc_step`` (the same step inside ``pm.sample``).
"""

from .driver import sample
from .kernel import ChainState, StepInfo, StepParams, step
from .pymc_step import GradientMatchingStep
from .target import GradientMatchingTarget

__all__ = ["ChainState", "GradientMatchingStep", "GradientMatchingTarget", "StepInfo", "StepParams", "sample",
           "step"]

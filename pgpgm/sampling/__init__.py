"""Step 2b: sampling the gradient-matching density."""

from .driver import GradientMatchingSampler, GradientMatchingStep, sample

__all__ = ["GradientMatchingSampler", "GradientMatchingStep", "sample"]

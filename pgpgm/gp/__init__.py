"""Step 1: a Gaussian process per observed state and the gradient-matching matrices."""

from .fit import GPFit, GradientMatching, fit_gp, gradient_matching
from .kernels import KERNELS, Kernel, get_kernel

__all__ = ["GPFit", "GradientMatching", "KERNELS", "Kernel", "fit_gp", "get_kernel", "gradient_matching"]

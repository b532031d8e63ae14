"""Step 1: a Gaussian process per observed state (fit) and the gradient-matching matrices (matching)."""

from .hyperparameters import GPFit, fit_gp
from .kernels import KERNELS, Hyperparameter, Kernel, Scaled, TimeGrid, get_kernel
from .matching import GradientMatching, gradient_matching

__all__ = ["GPFit", "GradientMatching", "Hyperparameter", "KERNELS", "Kernel", "Scaled", "TimeGrid", "fit_gp",
           "get_kernel", "gradient_matching"]

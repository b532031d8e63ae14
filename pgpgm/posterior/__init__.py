"""Step 4: the posterior of the ODE model itself. ``nuts`` (the PyMC model, NUTS rounds within a
budget, the Laplace approximation), ``scales`` (each parameter's sampling scale) and ``diagnostics``
(R-hat, ESS, divergences, modes)."""

from .diagnostics import diagnose, find_modes, problems, warn_if_unconverged
from .nuts import (
           NUTSRun,
           PosteriorBudget,
           build_ode_model,
           laplace_posterior,
           run_nuts,
           sample_posterior,
)
from .scales import ScaleChoice, choose_scales

__all__ = ["NUTSRun", "PosteriorBudget", "ScaleChoice", "build_ode_model", "choose_scales", "diagnose", "find_modes",
           "laplace_posterior", "problems", "run_nuts", "sample_posterior", "warn_if_unconverged"]

"""Step 4: the posterior of the ODE model itself.

``model`` (the ODE model as a ``pm.Model``), ``scales`` (each parameter's sampling scale), ``space``
(starts and mass matrices in PyMC's value space), ``budget`` (seconds and gradient evaluations),
``rounds`` (NUTS until R-hat, ESS and the sds' precision pass, :func:`run_nuts`) on the engines
``pymc_engine`` and ``nutpie_engine``, ``laplace`` (the Gaussian approximation) and ``diagnostics``
(R-hat, ESS, divergences, modes, the notes and warnings), ``calibration`` (simulation-based calibration:
ranks, uniformity, coverage)."""

from . import calibration
from .budget import PosteriorBudget
from .diagnostics import diagnose, find_modes, problems, warn_if_unconverged
from .laplace import laplace_posterior
from .model import build_ode_model
from .rounds import NUTSRun, run_nuts, sample_posterior
from .scales import ScaleChoice, choose_scales

__all__ = ["NUTSRun", "PosteriorBudget", "ScaleChoice", "build_ode_model", "calibration", "choose_scales", "diagnose",
           "find_modes", "laplace_posterior", "problems", "run_nuts", "sample_posterior", "warn_if_unconverged"]

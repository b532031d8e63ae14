"""Step 3: least-squares refinement of the ODE solution itself (``least_squares``), the checks
of a refined optimum against the prior's bounds (``bounds``), and other optima about as good
(``optima``)."""

from .bounds import AtBound, bound_report, warn_at_bounds
from .least_squares import LeastSquaresProblem, Refinement, refine
from .observed import ObservablesProblem

__all__ = ["AtBound", "LeastSquaresProblem", "ObservablesProblem", "Refinement", "bound_report", "refine", "warn_at_bounds"]

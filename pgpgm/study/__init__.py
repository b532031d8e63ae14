"""Studies: many experiments of one system in one fit, shared, varying and hierarchical parameters.

- ``design`` - :class:`Study`, :class:`StudyExperiment` (data and known inputs per experiment);
- ``joint`` - step 3 of every experiment together (stacked least-squares problems);
- ``model`` - step 4: one ``pm.Model`` of every experiment, hierarchical (population) parameters;
- ``result`` - :class:`StudyResult`, :func:`load_study`;
- ``fit`` - :func:`fit_study`, the composition.
"""

from .design import Study, StudyExperiment
from .fit import STUDY_BUDGET, fit_study
from .joint import JointLayout, JointProblem, JointRefinement, refine_joint
from .model import build_study_model
from .result import StudyResult, load_study

__all__ = ["STUDY_BUDGET", "JointLayout", "JointProblem", "JointRefinement", "Study", "StudyExperiment",
           "StudyResult", "build_study_model", "fit_study", "load_study", "refine_joint"]

"""Studies: many experiments of one system, shared, varying and hierarchical parameters.

- ``design`` - :class:`Study`, :class:`StudyExperiment` (data and known inputs per experiment);
- ``joint`` - step 3 of every experiment together (stacked least-squares problems);
- ``model`` - step 4: one ``pm.Model`` of every experiment, hierarchical (population) parameters.

:func:`pgpgm.fit_study` (:mod:`pgpgm.fitting`) runs the steps on a study; :class:`pgpgm.StudyResult`
(:mod:`pgpgm.study_result`) holds what it found.
"""

from .design import Study, StudyExperiment
from .joint import JointLayout, JointProblem, JointRefinement, refine_joint
from .model import build_study_model

__all__ = ["JointLayout", "JointProblem", "JointRefinement", "Study", "StudyExperiment", "build_study_model",
           "refine_joint"]

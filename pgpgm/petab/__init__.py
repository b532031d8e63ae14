"""PEtab problems: an SBML model and the tables of conditions, observables, measurements and
parameters (PEtab v1), read into pgpgm's :class:`~pgpgm.ode.system.ODESystem` and scored as PEtab
defines (:func:`load_petab`, :class:`PetabProblem`).

Modules, one concept each: ``tables`` (the YAML file and the tables, checked cell by cell),
``sbml`` (the model's ODEs), ``mapping`` (parameters, conditions, experiments as arrays),
``observables`` (formulas and likelihoods), ``simulation`` (the experiments' solves),
``problem`` (the problem and its scores).
"""

from .problem import PetabProblem, load_petab
from .simulation import SteadyState

__all__ = ["PetabProblem", "SteadyState", "load_petab"]

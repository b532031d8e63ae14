"""An SBML model as ODEs: libsbml reads the file, sbmlmath turns its MathML into sympy.

What is read
------------
Species (as concentrations, or as amounts where ``hasOnlySubstanceUnits``; a concentration's
rate is the reactions' flux over its compartment's volume), reactions with constant
stoichiometry and local parameters, parameters and compartments (constant sizes), assignment
rules (substituted wherever their target is used), rate rules (on species and parameters),
initial assignments, function definitions (expanded by libsbml) and ``piecewise``.

What is refused, at load, naming the element
--------------------------------------------
Events, delays, algebraic rules, fast reactions, rules that change a compartment's size,
variable stoichiometry, and math outside pgpgm's equation language (e.g. ``floor``, ``==``
conditions, a ``piecewise`` without ``otherwise``).

Symbols
-------
Every expression here is in sympy symbols named by the SBML ids (real), and :data:`TIME` for
the time; :meth:`SbmlModel.ode_names` gives the names the :class:`~pgpgm.ode.system.ODESystem`
uses (an id that pgpgm reserves, such as ``t``, ``E`` or ``exp``, gets a trailing ``_``).
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import sympy as sp

from ..errors import DataError, ModelDefinitionError
from ..ode.parse import ALLOWED_CONSTANTS, ALLOWED_FUNCTIONS, check_expression
from ..ode.system import ODESystem

#: The time in the expressions of this module (renamed ``t`` in the ODE system).
TIME = sp.Symbol("time (SBML)", real=True)
_TIME_URL = "http://www.sbml.org/sbml/symbols/time"
#: Names an ODE system may not use for a state or a parameter.
_RESERVED = frozenset({"t", *ALLOWED_FUNCTIONS, *ALLOWED_CONSTANTS})


def symbol(name: str) -> sp.Symbol:
    """The sympy symbol of an SBML or PEtab identifier."""
    return sp.Symbol(name, real=True)


@dataclass(frozen=True, eq=False)
class SbmlModel:
    """The ODEs of an SBML model.

    Attributes
    ----------
    path : the SBML file
    states : ids of the state variables (species, parameters with a rate rule), length S
    rates : d(state)/dt for each state, in the symbols of states, constants and :data:`TIME`
    initial : each state's value at t = 0, in the symbols of the constants (NaN where the
        model gives none)
    constants : ids of the parameters and compartments that stay constant, length M
    values : their values in the file (NaN where the file gives none)
    assignments : id -> expression of every assignment-rule target and reaction rate (by the
        reaction's id), in the symbols of states, constants and :data:`TIME`
    species : ids of the species
    """

    path: Path
    states: tuple[str, ...]
    rates: tuple[sp.Expr, ...]
    initial: tuple[sp.Expr, ...]
    constants: tuple[str, ...]
    values: tuple[float, ...]
    assignments: Mapping[str, sp.Expr]
    species: frozenset[str]

    @cached_property
    def ode_names(self) -> dict[str, str]:
        """SBML id -> its name in the ODE system (the id, with '_' appended where pgpgm reserves it)."""
        taken = set(self.states) | set(self.constants)
        out = {}
        for n in (*self.states, *self.constants):
            new = n
            while new in _RESERVED or keyword.iskeyword(new) or (new != n and new in taken):
                new += "_"
            out[n] = new
            taken.add(new)
        return out

    @cached_property
    def system(self) -> ODESystem:
        """The ODE system: its parameters are the constants its right-hand side uses (in the order
        of :attr:`constants`)."""
        names = self.ode_names
        used = set().union(*(r.free_symbols for r in self.rates)) if self.rates else set()
        parameters = tuple(c for c in self.constants if symbol(c) in used)
        rename = {symbol(n): sp.Symbol(names[n], real=True) for n in (*self.states, *parameters)}
        rename[TIME] = sp.Symbol("t", real=True)
        exprs = tuple(r.xreplace(rename) for r in self.rates)
        return ODESystem(tuple(names[s] for s in self.states), tuple(names[p] for p in parameters), exprs,
                         name=self.path.stem)

    @cached_property
    def parameter_index(self) -> tuple[int, ...]:
        """The position in :attr:`constants` of each parameter of :attr:`system`."""
        names = {v: k for k, v in self.ode_names.items()}
        return tuple(self.constants.index(names[p]) for p in self.system.parameters)

    def expression(self, name: str) -> sp.Expr | None:
        """What the id ``name`` stands for in an observable: a state's or constant's symbol, an
        assignment's expression; None for an id the model does not define."""
        if name in self.assignments:
            return self.assignments[name]
        if name in self.states or name in self.constants:
            return symbol(name)
        return None


# -------------------------------------------------------------------------------------- reading
class _Reader:
    """Reads one libsbml model; ``where(element)`` names an element in messages."""

    def __init__(self, path: Path, model):
        self.path = path
        self.model = model
        self.level = model.getLevel()

    def refuse(self, what: str) -> ModelDefinitionError:
        return ModelDefinitionError(f"{self.path}: {what} is not supported by pgpgm's PEtab import; "
                                    "remove it from the model or simulate the problem with a tool that supports it")

    def math(self, obj, where: str, local: Mapping[str, float] | None = None) -> sp.Expr:
        """The sympy expression of an element's MathML, checked against the equation language."""
        import sbmlmath
        from sbmlmath.csymbol import CSymbol

        if obj.getMath() is None:
            raise DataError(f"{self.path}: {where} has no math")
        try:
            expr = sbmlmath.sbml_math_to_sympy(obj, floats_as_rationals=False, ignore_units=True,
                                               symbol_kwargs={"real": True}, evaluate=True)
        except NotImplementedError as exc:
            raise self.refuse(f"the math of {where} ({exc})") from exc
        except (ValueError, AssertionError, TypeError) as exc:
            raise ModelDefinitionError(f"{self.path}: the math of {where} cannot be read: {exc}") from exc
        if not isinstance(expr, sp.Expr):
            raise self.refuse(f"the math of {where} ({expr}, not a number-valued expression)")
        swap: dict[sp.Basic, sp.Basic] = {}
        for c in expr.atoms(CSymbol):
            if getattr(c, "definition_url", None) != _TIME_URL:
                raise self.refuse(f"the symbol {c} in {where} (only the time csymbol is)")
            swap[c] = TIME
        for f in expr.atoms(sp.Function):
            if isinstance(f, sp.core.function.AppliedUndef):
                raise self.refuse(f"the function {f.func} in {where} (a delay, rateOf or an unknown function)")
        # Floats to 64 bits, as the compiled code computes them; local parameters by value.
        swap.update({f: sp.Float(float(f)) for f in expr.atoms(sp.Float)})
        swap.update({symbol(k): sp.Float(v) for k, v in (local or {}).items()})
        expr = expr.xreplace(swap)
        try:
            check_expression(expr, where=f"{where} of {self.path}")
        except ModelDefinitionError as exc:
            raise self.refuse(f"the math of {where}: {exc}") from exc
        return expr

    def check_supported(self) -> None:
        m = self.model
        if m.getNumEvents():
            raise self.refuse(f"the event {m.getEvent(0).getId() or '(no id)'} (events: {m.getNumEvents()})")
        for r in m.getListOfRules():
            if r.isAlgebraic():
                raise self.refuse("an algebraic rule")
            target = m.getCompartment(r.getVariable())
            if target is not None:
                raise self.refuse(f"the {r.getElementName()} on compartment {target.getId()} (a varying volume)")
        for r in m.getListOfReactions():
            if r.isSetFast() and r.getFast():
                raise self.refuse(f"the fast reaction {r.getId()}")
        for c in m.getListOfConstraints():
            raise self.refuse(f"a constraint ({c.getMessageString()[:80]})")


def read_sbml(path: str | Path, keep: frozenset[str] = frozenset()) -> SbmlModel:
    """Read an SBML file into its ODEs.

    Parameters
    ----------
    path : the SBML file (levels 2 and 3)
    keep : ids of constants that the PEtab tables set: their initial assignments in the model
        are not applied (the tables' values replace them)

    Raises
    ------
    DataError
        The file is missing or is not valid SBML (libsbml's first error and its line are named).
    ModelDefinitionError
        The model uses an element pgpgm does not simulate (see the module text).
    """
    import libsbml

    path = Path(path)
    if not path.is_file():
        raise DataError(f"the SBML file {path} does not exist")
    doc = libsbml.readSBMLFromFile(str(path))
    errors = [doc.getError(i) for i in range(doc.getNumErrors())]
    fatal = [e for e in errors if e.getSeverity() >= libsbml.LIBSBML_SEV_ERROR]
    if fatal or doc.getModel() is None:
        e = fatal[0] if fatal else None
        detail = f"line {e.getLine()}: {e.getShortMessage()}: {e.getMessage().strip()[:300]}" if e else "no model"
        raise DataError(f"{path} is not a valid SBML file ({detail})")
    props = libsbml.ConversionProperties()
    props.addOption("expandFunctionDefinitions", True)
    if doc.convert(props) != libsbml.LIBSBML_OPERATION_SUCCESS:
        raise ModelDefinitionError(f"{path}: libsbml could not expand the model's function definitions")
    reader = _Reader(path, doc.getModel())
    reader.check_supported()
    return _build(reader, keep)


def _build(r: _Reader, keep: frozenset[str]) -> SbmlModel:
    m = r.model
    rules = {x.getVariable(): x for x in m.getListOfRules()}
    assigned = {v for v, x in rules.items() if x.isAssignment()}
    rated = {v for v, x in rules.items() if x.isRate()}
    species = {s.getId(): s for s in m.getListOfSpecies()}
    states = [s for s in species if s not in assigned]
    states += [p.getId() for p in m.getListOfParameters() if p.getId() in rated]
    constants = [p.getId() for p in m.getListOfParameters() if p.getId() not in assigned | rated]
    constants += [c.getId() for c in m.getListOfCompartments() if c.getId() not in assigned]
    values = {p.getId(): p.getValue() if p.isSetValue() else math.nan for p in m.getListOfParameters()}
    values.update({c.getId(): c.getSize() if c.isSetSize() else math.nan for c in m.getListOfCompartments()})

    # reaction rates (by reaction id) and assignment rules, resolved among themselves
    assignments: dict[str, sp.Expr] = {}
    flux: dict[str, list[sp.Expr]] = {s: [] for s in states}
    for rx in m.getListOfReactions():
        law = rx.getKineticLaw()
        if law is None:
            raise r.refuse(f"the reaction {rx.getId()} without a kinetic law")
        local = {p.getId(): p.getValue() for p in (law.getListOfLocalParameters() if r.level > 2
                                                   else law.getListOfParameters())}
        rate = r.math(law, f"the kinetic law of reaction {rx.getId()}", local)
        assignments[rx.getId()] = rate
        for sign, refs in ((-1, rx.getListOfReactants()), (1, rx.getListOfProducts())):
            for ref in refs:
                if (ref.isSetStoichiometryMath() if r.level == 2 else False) or (
                        ref.isSetId() and (ref.getId() in rules or m.getInitialAssignment(ref.getId()))):
                    raise r.refuse(f"the variable stoichiometry of {ref.getSpecies()} in reaction {rx.getId()}")
                n = ref.getStoichiometry()
                if not math.isfinite(n):
                    raise r.refuse(f"the unset stoichiometry of {ref.getSpecies()} in reaction {rx.getId()}")
                s = species[ref.getSpecies()]
                if s.getId() in flux and not s.getBoundaryCondition():
                    flux[s.getId()].append(sign * sp.Float(n) * symbol(rx.getId()))
    for v, x in rules.items():
        if x.isAssignment():
            assignments[v] = r.math(x, f"the assignment rule for {v}")
    initial_assignments = {a.getSymbol(): r.math(a, f"the initial assignment to {a.getSymbol()}")
                           for a in m.getListOfInitialAssignments()}
    constant_values = {symbol(c): initial_assignments[c] for c in constants
                       if c in initial_assignments and c not in keep}
    assignments = {k: _resolve(v, assignments, constant_values, r, k) for k, v in assignments.items()}

    rates = []
    for s in states:
        if s in rated:
            rate = r.math(rules[s], f"the rate rule for {s}")
        elif s in species:
            sp_ = species[s]
            total = sp.Add(*flux[s])
            rate = total if sp_.getHasOnlySubstanceUnits() else total / symbol(sp_.getCompartment())
        rates.append(_resolve(rate, assignments, constant_values, r, s))

    initial = []
    for s in states:
        if s in initial_assignments:
            x0 = initial_assignments[s]
        elif s in species:
            sp_ = species[s]
            volume = symbol(sp_.getCompartment())
            if sp_.isSetInitialConcentration():
                x0 = sp.Float(sp_.getInitialConcentration()) * (volume if sp_.getHasOnlySubstanceUnits() else 1)
            elif sp_.isSetInitialAmount():
                x0 = sp.Float(sp_.getInitialAmount()) / (1 if sp_.getHasOnlySubstanceUnits() else volume)
            else:
                x0 = sp.nan
        else:
            x0 = sp.Float(values[s])
        initial.append(x0)
    initial = _initial_values(initial, states, assignments, constant_values, r)
    return SbmlModel(r.path, tuple(states), tuple(rates), tuple(initial), tuple(constants),
                     tuple(float(values[c]) for c in constants), assignments, frozenset(species))


def _resolve(expr: sp.Expr, assignments: Mapping[str, sp.Expr], constants: Mapping[sp.Symbol, sp.Expr],
             r: _Reader, what: str) -> sp.Expr:
    """``expr`` with every assignment target and every constant with an initial assignment replaced
    by its expression, repeatedly (a cycle is an error)."""
    swap = {symbol(k): v for k, v in assignments.items()} | dict(constants)
    for _ in range(len(swap) + 1):
        if not expr.free_symbols & swap.keys():
            return expr
        expr = expr.xreplace(swap)
    raise r.refuse(f"the circular assignment rules or initial assignments reached from {what}")


def _initial_values(initial: list[sp.Expr], states: list[str], assignments: Mapping[str, sp.Expr],
                    constants: Mapping[sp.Symbol, sp.Expr], r: _Reader) -> list[sp.Expr]:
    """The states' initial values in the constants only: assignments evaluated at t = 0 and other
    states' initial values substituted (initial assignments may name both)."""
    at_zero = {sp.Symbol(k, real=True): v.xreplace({TIME: sp.Integer(0)}) for k, v in assignments.items()}
    values = [_resolve(x.xreplace({TIME: sp.Integer(0)}), {}, at_zero | dict(constants), r, s)
              for x, s in zip(initial, states)]
    swap = {symbol(s): v for s, v in zip(states, values)}
    for _ in range(len(states) + 1):
        if not any(v.free_symbols & swap.keys() for v in values):
            return values
        values = [_resolve(v.xreplace(swap), {}, at_zero | dict(constants), r, "the initial values")
                  for v in values]
        swap = {symbol(s): v for s, v in zip(states, values)}
    raise r.refuse("initial assignments that depend on each other in a circle")

"""The simulations of a PEtab problem: each experiment from t = 0, after preequilibration where
asked, with its steady state where measured, and forward sensitivities on request.

An experiment is a pair (preequilibration condition, simulation condition). Its states start at
t = 0 from the model's initial values for the simulation condition's constants, or - after
preequilibration - from the preequilibration condition's steady state; either way, the states
that the simulation condition's row sets (a number or a parameter, not NaN) start there.

A steady state is found by integrating on the grid :attr:`SteadyState.times` until the
right-hand side is negligible: |f_i(x)| <= atol + rtol |x_i| for every state (the first grid
time where this holds). Its sensitivities are those of the integration to that time.

Switches of the right-hand side at a time set by constants (``t < EGF_end``) are solved for
the time symbolically once, and every solve stops and restarts there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import sympy as sp

from ..errors import ODESolveError
from ..solve.base import Solver
from ..solve.integrator import Integrator
from .mapping import Conditions, Experiments
from .sbml import SbmlModel, symbol


@dataclass(frozen=True)
class SteadyState:
    """When a state counts as steady (see the module text).

    Attributes
    ----------
    rtol, atol : the test |f_i(x)| <= atol + rtol |x_i| (per unit of the model's time)
    times : the grid on which the test is made, from 0 (model time units)
    """

    rtol: float = 1e-10
    atol: float = 1e-12
    times: tuple[float, ...] = (0.0, 1.0, *(10.0 ** k for k in range(2, 11, 2)))


@dataclass(frozen=True)
class States:
    """The stacked simulation points of all experiments.

    Attributes
    ----------
    x : (n_points, S) states
    dx : (n_points, S, V_e) d x / d estimated parameters (linear scale); None without sensitivities
    """

    x: np.ndarray
    dx: np.ndarray | None


@dataclass(frozen=True, eq=False)
class ExperimentInputs:
    """What one experiment's simulation starts from, for given parameter values.

    Attributes
    ----------
    condition : the simulation condition's id
    preequilibration : the preequilibration condition's id, or None
    times : (N,) the output times, from 0 (a steady-state measurement is not among them)
    theta : (P,) the ODE system's parameters in the simulation condition (``system.parameters`` order)
    x0 : (S,) the states at t = 0; NaN where a state starts from the preequilibration's steady state
    theta_preequilibration, x0_preequilibration : the same for the preequilibration (None without)
    steady_state : whether a measurement is at the simulation condition's steady state
    """

    condition: str
    preequilibration: str | None
    times: np.ndarray
    theta: np.ndarray
    x0: np.ndarray
    theta_preequilibration: np.ndarray | None
    x0_preequilibration: np.ndarray | None
    steady_state: bool


@dataclass(eq=False)
class Simulator:
    """Solves the experiments of one problem (holds the compiled initial values and the integrators).

    Parameters
    ----------
    model, conditions, experiments : the problem's parts
    solver : the ODE solver (its tolerances)
    steady : the steady-state test
    """

    model: SbmlModel
    conditions: Conditions
    experiments: Experiments
    solver: Solver
    steady: SteadyState = SteadyState()
    _integrators: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        m = self.model
        constants = [symbol(c) for c in m.constants]
        init = sp.Matrix(m.initial)
        self._initial = sp.lambdify(constants, list(init), modules="numpy", cse=True, dummify=True)
        self._initial_jac = sp.lambdify(constants, init.jacobian(constants) if constants else sp.zeros(len(init), 0),
                                        modules="numpy", cse=True, dummify=True)
        self._param = np.array(m.parameter_index, int)
        self._switches = _switch_times(m)

    def __getstate__(self):  # compiled functions and native integrators are rebuilt, not pickled
        return {k: getattr(self, k) for k in ("model", "conditions", "experiments", "solver", "steady")}

    def __setstate__(self, state):
        self.__dict__.update(state, _integrators={})
        self.__post_init__()

    # ------------------------------------------------------------------------ initial values
    def initial(self, constants: np.ndarray) -> np.ndarray:
        """The model's initial states (S,) for the constants (M,)."""
        return np.asarray(self._initial(*constants), float).reshape(-1)

    def initial_jacobian(self, constants: np.ndarray) -> np.ndarray:
        """d initial states / d constants, (S, M)."""
        return np.asarray(self._initial_jac(*constants), float).reshape(len(self.model.states), -1)

    # ------------------------------------------------------------------------------- solves
    def integrator(self, times: np.ndarray, theta: np.ndarray) -> Integrator:
        """The integrator of ``times`` that stops at the switches for the parameters ``theta``: one is
        kept per output grid, replaced when the switching times move (an estimated switching time)."""
        breaks = tuple(sorted(b for f in self._switches for b in np.atleast_1d(f(*theta)).real
                              if np.isfinite(b) and times[0] < b < times[-1]))
        key = times.tobytes()
        kept = self._integrators.get(key)
        if kept is None or kept[0] != breaks:
            kept = self._integrators[key] = (breaks, Integrator(self.model.system, times, self.solver,
                                                                breakpoints=breaks))
        return kept[1]

    def _solve(self, times, constants, x0, dx0, dconst):
        """States at ``times`` from ``x0`` (and their sensitivities where ``dx0`` is given)."""
        if times.size == 1:  # only the start is measured
            return x0[None], None if dx0 is None else dx0[None]
        theta = constants[self._param]
        integ = self.integrator(times, theta)
        if dx0 is None:
            return integ.solve(theta, x0), None
        x, dtheta, dinit = integ.solve_sensitivities(theta, x0)
        return x, dtheta @ dconst[self._param] + dinit @ dx0

    def _steady(self, constants, x0, dx0, dconst, label: str):
        """The steady state from ``x0`` (and its sensitivities): integrated over one span of
        :attr:`SteadyState.times` after the other (each span's own integrator, whose smallest
        step scales with its end), until the test holds; the sensitivities from the steady state's
        equations (:func:`steady_sensitivities`)."""
        grid = self.steady.times
        theta = constants[self._param]
        x = x0
        for start, stop in pairwise(grid):
            x = self._solve(np.array([start, stop]), constants, x, None, None)[0][-1]
            f = self.model.system.rhs(stop, x, theta)
            if np.all(np.abs(f) <= self.steady.atol + self.steady.rtol * np.abs(x)):
                if dx0 is None:
                    return x, None
                jx, jp = self.model.system.jacobian(stop, x, theta)
                return x, steady_sensitivities(jx, jp @ dconst[self._param], dx0)
        worst = int(np.argmax(np.abs(f) / (self.steady.atol + self.steady.rtol * np.abs(x))))
        raise ODESolveError(f"no steady state for {label} by t = {grid[-1]:g}: d{self.model.states[worst]}/dt "
                            f"is still {f[worst]:.3g} (at {x[worst]:.6g})")

    def run(self, v: np.ndarray, column: np.ndarray | None = None) -> States:
        """Every experiment's states at its times (and steady state), for the parameter table's
        values ``v`` (V,) on the linear scale; with ``column`` (V,) (each parameter's position among
        the estimated ones, -1 for fixed ones), also their sensitivities."""
        c = self.conditions
        consts = c.constants.take(v)
        init = c.initial.take(v)
        sens = column is not None
        dconsts = c.constants.jacobian(column) if sens else None
        dinit = c.initial.jacobian(column) if sens else None
        xs, dxs = [], []
        for e, ((pre, sim), times, steady) in enumerate(zip(self.experiments.pairs, self.experiments.times,
                                                             self.experiments.steady)):
            source = pre if pre >= 0 else sim
            base = self.initial(consts[source])
            dbase = self.initial_jacobian(consts[source]) @ dconsts[source] if sens else None
            if pre >= 0:
                x0 = np.where(c.reset[pre], init[pre], base)
                dx0 = np.where(c.reset[pre][:, None], dinit[pre], dbase) if sens else None
                self._check_start(x0, pre)
                base, dbase = self._steady(consts[pre], x0, dx0, dconsts[pre] if sens else None,
                                           f"the preequilibration condition {c.ids[pre]}")
            x0 = np.where(c.reset[sim], init[sim], base)
            dx0 = np.where(c.reset[sim][:, None], dinit[sim], dbase) if sens else None
            self._check_start(x0, sim)
            x, dx = self._solve(times, consts[sim], x0, dx0, dconsts[sim] if sens else None)
            xs.append(x)
            dxs.append(dx)
            if steady:
                xe, dxe = self._steady(consts[sim], x0, dx0, dconsts[sim] if sens else None,
                                       f"the condition {c.ids[sim]}")
                xs.append(xe[None])
                dxs.append(dxe[None] if sens else None)
        return States(np.concatenate(xs), np.concatenate(dxs) if sens else None)

    def inputs(self, v: np.ndarray) -> list[ExperimentInputs]:
        """Each experiment's parameters and initial states for the parameter table's values ``v`` (V,)."""
        c = self.conditions
        consts, init = c.constants.take(v), c.initial.take(v)
        out = []
        for (pre, sim), times, steady in zip(self.experiments.pairs, self.experiments.times, self.experiments.steady):
            start = self.initial(consts[sim]) if pre < 0 else np.full(len(self.model.states), np.nan)
            pre_x0 = np.where(c.reset[pre], init[pre], self.initial(consts[pre])) if pre >= 0 else None
            out.append(ExperimentInputs(c.ids[sim], c.ids[pre] if pre >= 0 else None, times,
                                        consts[sim][self._param], np.where(c.reset[sim], init[sim], start),
                                        consts[pre][self._param] if pre >= 0 else None, pre_x0, steady))
        return out

    def _check_start(self, x0: np.ndarray, condition: int) -> None:
        bad = ~np.isfinite(x0)
        if bad.any():
            names = [s for s, b in zip(self.model.states, bad) if b]
            raise ODESolveError(f"the initial values of {names} are not finite in condition "
                                f"{self.conditions.ids[condition]} (the model gives none, or they evaluate to "
                                "inf or NaN); set them in the condition table")


def steady_sensitivities(jx: np.ndarray, jq: np.ndarray, dx0: np.ndarray) -> np.ndarray:
    """d(steady state)/dq from f(x*, q) = 0: J_x dx* = -J_q, with each conserved quantity (a left
    null vector l of J_x, l' f = 0 for all x) kept at its start, l' dx* = l' dx0.

    Parameters
    ----------
    jx : (S, S) df/dx at the steady state
    jq : (S, Q) df/dq there (through the parameters)
    dx0 : (S, Q) d(start)/dq

    Returns
    -------
    (S, Q)
    """
    u, sv, _ = np.linalg.svd(jx)  # the columns of u with zero singular values span the left null space
    null = u[:, sv <= sv.max(initial=0.0) * jx.shape[0] * 1e-12]  # (S, L) conservation laws
    a = np.vstack([jx, null.T])
    b = np.vstack([-jq, null.T @ dx0])
    return np.linalg.lstsq(a, b, rcond=None)[0]


def _switch_times(model: SbmlModel) -> list[Callable]:
    """For each switch of the right-hand side at a time that depends on constants only, a function
    of the ODE parameters that returns the switching times."""
    system = model.system
    t, states, params = system.symbols
    out = []
    seen = set()
    for e in system.expressions:
        for node in sp.preorder_traversal(e):
            if not isinstance(node, sp.core.relational.Relational):
                continue
            g = sp.expand(node.lhs - node.rhs)
            free = g.free_symbols
            if t not in free or free == {t} or free & set(states) or g in seen:
                continue
            seen.add(g)
            try:
                roots = sp.solve(g, t)
            except (NotImplementedError, ValueError):  # no closed form: the solver steps over it
                continue
            if roots:
                out.append(sp.lambdify(params, roots, modules="numpy", dummify=True))
    return out

"""The element-wise step as a PyMC step method, for ``pm.sample`` and compound steps."""

from __future__ import annotations

from dataclasses import field
from typing import Any

import numpy as np
import pymc as pm
from pymc.step_methods.compound import BlockedStep, Competence
from pymc.step_methods.state import DataClassState, dataclass_state
from pymc.util import get_random_generator, get_value_vars_from_user_vars

from ..errors import PgpgmError
from . import adapt, elementwise
from .density import GradientMatchingDensity
from .elementwise import ChainState, StepParams
from .schemes import initial_params
from .target import GradientMatchingTarget


@dataclass_state
class GradientMatchingStepState(DataClassState):
    """What :class:`GradientMatchingStep` carries between draws (PyMC's sampling state)."""

    rng: np.random.Generator
    params: Any  # StepParams or None before the first step
    counts: Any  # adapt.AdaptationState or None
    chain: Any  # elementwise.ChainState of the last step, reused when the next point is the same
    tune: bool
    vars_names: list = field(metadata={"tensor_name": True, "frozen": True})


class GradientMatchingStep(BlockedStep):
    """The paper's element-wise scheme (``pgpgm.sample(..., scheme="elementwise")``) as a PyMC step method.

    Parameters
    ----------
    vars : value variables (or their random variables) to update: any of the parameters
        and the observed states of the density; default all of them. Other free
        variables of the model (terms a user added) are left to other step methods.
    density : the density the model was built from (:func:`pgpgm.gradient_matching_density`)
    model : the ``pm.Model`` (from the context by default): ``density.model()``, possibly extended
    state_scale, param_scale : initial proposal sds (see :func:`pgpgm.sample`)

    Example::

        density = pgpgm.gradient_matching_density(system, data, ["x1"], x0={"x2": 3.0})
        with density.model():
            step = pgpgm.GradientMatchingStep(density=density)
            idata = pm.sample(step=step, initvals=density.initial_point(theta0), cores=1)

    Parameter proposals act on PyMC's (transformed) value variables; burn-in adaptation
    and the O(N) sweep are those of the element-wise scheme of :func:`pgpgm.sample`.
    """

    name = "gradient_matching_metropolis"
    default_blocked = True
    _state_class = GradientMatchingStepState
    stats_dtypes_shapes = {
        "accept_x": (np.float64, []),
        "accepted_theta": (np.int64, []),
        "tune": (bool, []),
    }

    def __init__(self, vars=None, *, density: GradientMatchingDensity | None = None, model=None, rng=None,
                 blocked: bool = True, state_scale: float | None = None, param_scale=None):
        if density is None:
            raise PgpgmError("GradientMatchingStep needs density=..., the GradientMatchingDensity the model came from")
        model = pm.modelcontext(model)
        self.target = GradientMatchingTarget(density, model, space="value")
        names = self.target.coordinate_names
        own = {model.rvs_to_values[model[s]]: s for s in density.obs.states}
        own.update({v: v.name for v in model.value_vars if v.name in names})
        vars = list(own) if vars is None else get_value_vars_from_user_vars(vars, model)
        foreign = [v.name for v in vars if v not in own]
        if foreign:
            raise PgpgmError(f"GradientMatchingStep cannot update {foreign}: only the density's parameters "
                             f"{names} and observed states {list(density.obs.states)}")
        self.vars = vars
        chosen = {own[v] for v in vars}
        self._move_states = np.array([s in chosen for s in density.obs.states])
        self._move_params = np.array([n in chosen for n in names])
        self._scales = (state_scale, param_scale)
        self.rng = get_random_generator(rng)
        self.params, self.counts, self.chain, self.tune = None, None, None, True

    def _chain_state(self, point) -> ChainState:
        """The last chain state if ``point`` is where it left off, else a fresh one at ``point``."""
        d, names = self.target.density, self.target.coordinate_names
        q = np.array([float(point[n]) for n in names])
        X0 = np.column_stack([point[n] for n in d.obs.states])
        c = self.chain
        if c is not None and np.array_equal(c.q, q) and np.array_equal(c.X[:, list(d.observed_idx)], X0):
            return c
        return elementwise.init(self.target, q, X0)

    def step(self, point):
        state = self._chain_state(point)
        if self.params is None:
            p = initial_params(self.target, state, *self._scales)
            self.params = StepParams(p.state_scale, p.param_scale, self._move_states, self._move_params)
            self.counts = adapt.AdaptationState.empty(self.params)
        state, info = elementwise.step(self.rng, state, self.params, self.target)
        if self.tune:
            self.params, self.counts = adapt.update(self.params, self.counts, info)
        self.chain = state
        d = self.target.density
        new = dict(point)
        new.update({n: np.asarray(v, dtype=point[n].dtype) for n, v in zip(self.target.coordinate_names, state.q)})
        new.update({n: state.X[:, k].copy() for n, k in zip(d.obs.states, d.observed_idx)})
        stats = {"accept_x": float(info.accepted_x.sum() / max(self._move_states.sum() * d.obs.times.size, 1)),
                 "accepted_theta": int(info.moved.sum()), "tune": self.tune}
        return new, [stats]

    def reset_tuning(self) -> None:
        self.params, self.counts = None, None

    def stop_tuning(self) -> None:
        self.tune = False

    @staticmethod
    def competence(var, has_grad):
        return Competence.INCOMPATIBLE  # only when asked for explicitly

"""What the element-wise sampler needs of a density: its arrays and one compiled function.

A :class:`GradientMatchingTarget` derives, from one :class:`~pgpgm.matching.density.GradientMatchingDensity`
and its ``pm.Model`` (the density's own, or one a user extended), the stacked per-state
matrices of the O(N) state sweep and the model's log density compiled once (returning the
parameters and the latent states too), as PyMC's Metropolis compiles its ``delta_logp``
once. Terms a user adds on parameters are honoured; terms on the observed states are
refused at construction, because the sweep updates the density incrementally.

The parameter moves evaluate the density's terms in the parameters alone
(:class:`ParameterPart`), which depend on no data: for the density's own model they are
compiled once per :class:`~pgpgm.matching.density.ParameterStructure` (equations, observed states,
priors, known initial values, grid, solver) in a process and shared by every target of an
equal structure (:func:`shared_parameter_part`, a bounded memo of a pure builder), so a
second fit of the same model on other data builds and compiles no PyTensor graph. The
shared function computes exactly what a fresh one would; a target of a user-extended
model compiles its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import pymc as pm
import pytensor
from pymc.logprob.transforms import LogTransform
from pymc.model.transform.conditioning import remove_value_transforms
from pymc.pytensorf import compile as compile_pymc
from pymc.pytensorf import reseed_rngs
from pymc.util import _get_seeds_per_chain
from pytensor.compile.mode import get_mode
from pytensor.graph.traversal import ancestors
from pytensor.link.numba.linker import NumbaLinker
from threadpoolctl import threadpool_limits

from ..errors import ODESolveError, PgpgmError
from ..solve.numba_op import compiles, track_solves
from ..solve.op import ODEOp
from .density import (
    GradientMatchingDensity,
    ParameterStructure,
    SweepStatistics,
    state_quadratic,
    state_terms,
)


@dataclass(frozen=True)
class SweepArrays:
    """Stacked per-state matrices of the sweep (M observed states, N times).

    Cinv, Dt (= D^T), P (= (A + gamma I)^-1), PDt (= (P D)^T) : (M, N, N);
    D : (M, N, N); dtpd : (M, N) diag(D^T P D); inv_var : (M,) 1/sigma^2; mu : (M,);
    obs_idx : (M,) state indices. For the block scheme's conditional Gaussian
    (:mod:`pgpgm.matching.conditional`): DtPD : (M, N, N) D^T P D; Y : (N, M) data
    (zero where not measured);
    lin : (M, N) C^-1 mu 1 + y / sigma^2 (the linear term of the GP prior and likelihood);
    Dmu : (M, N) D mu 1; gp_mean : (N, M) GP posterior means of the observed states;
    lat_idx : (L,) latent state indices. obs_precision : (M, N) the observation term's
    precision of each value: 1/sigma_m^2 where state m is measured at time i, 0 where not.
    """

    Cinv: np.ndarray
    D: np.ndarray
    Dt: np.ndarray
    P: np.ndarray
    PDt: np.ndarray
    dtpd: np.ndarray
    inv_var: np.ndarray
    mu: np.ndarray
    obs_idx: np.ndarray
    DtPD: np.ndarray
    Y: np.ndarray
    lin: np.ndarray
    Dmu: np.ndarray
    gp_mean: np.ndarray
    lat_idx: np.ndarray
    obs_precision: np.ndarray

    @classmethod
    def from_density(cls, d: GradientMatchingDensity) -> SweepArrays:
        """The arrays of density ``d``, computed with BLAS on one thread: a multi-threaded
        matrix product may round differently (N >= ~150 here), and a worker process must
        derive the same bits as the calling process whatever its thread setting, so that
        the draws do not depend on ``cores``."""
        with threadpool_limits(limits=1, user_api="blas"):
            return cls._compute(d)

    @classmethod
    def _compute(cls, d: GradientMatchingDensity) -> SweepArrays:
        Cinv = np.ascontiguousarray(np.stack([k.matching.C_precision for k in d.terms]))
        D = np.stack([k.matching.D for k in d.terms])
        P = np.ascontiguousarray(np.stack([k.grad_precision for k in d.terms]))
        PD = P @ D
        Dt = np.ascontiguousarray(D.transpose(0, 2, 1))
        inv_var = 1.0 / d.noise_sd**2
        mu = np.array([k.matching.mean for k in d.terms])
        Y = d.obs.filled(0.0)
        W = np.ascontiguousarray(np.where(d.obs.mask.T, inv_var[:, None], 0.0))  # zero where not measured
        return cls(Cinv, D, Dt, P, np.ascontiguousarray(PD.transpose(0, 2, 1)), np.einsum("mji,mji->mi", D, PD),
                   inv_var, mu, np.array(d.observed_idx, dtype=np.int64), Dt @ PD,
                   Y, mu[:, None] * Cinv.sum(axis=2) + W * Y.T, mu[:, None] * D.sum(axis=2),
                   d.gp_posterior_means(), np.array(d.latent_idx, dtype=np.int64), W)

    def conditional_sd(self) -> np.ndarray:
        """(N, M) sd of each state value given all others (the sweep's default proposal scale / 1.5)."""
        prec = np.diagonal(self.Cinv, axis1=1, axis2=2) + self.obs_precision + self.dtpd
        return (1.0 / np.sqrt(prec)).T.copy()


class ParameterPart:
    """The density's terms in the parameters alone (prior, terms a user added on parameters),
    the parameters and the latent states, compiled from a model, with what the samplers read
    of the model's priors.

    Parameters
    ----------
    model : the ``pm.Model`` (with PyMC's value transforms)
    space_model : ``model`` in the sampler's space (value transforms removed for the
        constrained space, ``model`` itself for the value space)
    structure : the density's :class:`~pgpgm.matching.density.ParameterStructure`

    Attributes
    ----------
    coordinate_names : (Q,) names of the sampler's coordinates in the model point: the P
        parameters, then the U unknown latent initial values ``<state>_0``
    function : the compiled function (on first use)
    initial_point : (Q,) the priors' initial point (e.g. Uniform midpoints)
    lower : (Q,) the lower end of each coordinate's support (-inf when unbounded below)

    Calls of the compiled functions are serialised by a lock: one object may serve several
    threads (a compiled PyTensor function keeps its inputs and outputs in its own storage).
    """

    def __init__(self, model: pm.Model, space_model: pm.Model, structure: ParameterStructure):
        self.model, self.space_model, self.structure = model, space_model, structure
        self._names = (*structure.system.parameters, *structure.x0_priors.names)
        self.coordinate_names = [space_model.rvs_to_values[space_model[p]].name for p in self._names]
        self._lock = threading.Lock()

    @cached_property
    def function(self):
        m, st = self.space_model, self.structure
        own = {"gp_prior", "gradient_matching", *(f"y_{s}" for s in st.observed), *st.observed}
        terms = [v for v in (*m.basic_RVs, *m.potentials) if v.name not in own]
        outs = [m.logp(vars=terms), *m.replace_rvs_by_values([m[p] for p in self._names])]
        if st.latent:
            outs += m.replace_rvs_by_values([m[n] for n in st.latent])
        fn = m.compile_fn(outs, point_fn=True)
        # called once per proposal with float64 arrays built by the target (its ``point``): skip
        # PyTensor's per-call input checks, a third of the call's cost on small models
        fn.f.trust_input = True
        return fn

    @cached_property
    def solve_ops(self) -> tuple[ODEOp, ...]:
        """The ODE Ops of the compiled function (their solves are counted by integrators,
        :func:`~pgpgm.solve.numba_op.track_solves`)."""
        return tuple(n.op for n in self.function.f.maker.fgraph.apply_nodes if isinstance(n.op, ODEOp))

    @cached_property
    def initial_point(self) -> np.ndarray:
        ip = self.space_model.initial_point()
        return np.array([float(ip[n]) for n in self.coordinate_names])

    @cached_property
    def lower(self) -> np.ndarray:
        m = self.model
        out = np.full(len(self._names), -np.inf)
        for j, p in enumerate(self._names):
            rv = m[p]
            tr = m.rvs_to_transforms.get(rv)
            if isinstance(tr, LogTransform):
                out[j] = 0.0
            elif hasattr(tr, "get_a_and_b"):
                lo, _, bounded, _ = tr.get_a_and_b(rv.owner.inputs)
                if bounded:
                    out[j] = float(lo.eval(mode="FAST_COMPILE"))  # a constant: no compiled code needed
        return out

    @cached_property
    def _draw_function(self):
        fn, updates = compile_pymc([], [self.space_model[p] for p in self._names], random_seed=False,
                                   mode="FAST_COMPILE", return_updates=True)
        return fn, list(updates)

    @cached_property
    def _inputs(self) -> tuple[tuple[bool, int], ...]:
        """Where each input of the compiled function comes from, in its order: (True, j) the
        j-th coordinate, (False, k) the column of state k (an observed state: its first value
        starts the latent-state solve)."""
        st = self.structure
        states = dict(zip(st.observed, st.system.index_of_states(st.observed)))
        names = list(self.coordinate_names)
        return tuple((True, names.index(n)) if n in names else (False, states[n])
                     for n in (i.variable.name for i in self.function.f.maker.inputs))

    def evaluate(self, point: dict[str, np.ndarray]) -> tuple[float, np.ndarray, np.ndarray | None]:
        """The terms' log density, the parameters (P,) and the latent states (N, L; None
        without latent states) at the model point ``point`` (float64 arrays)."""
        with self._lock:
            return self._unpack(self.function(point))

    def evaluate_at(self, q: np.ndarray, X: np.ndarray) -> tuple[float, np.ndarray, np.ndarray | None]:
        """:meth:`evaluate` at coordinates q (Q,) and states X (N, S) (the observed states'
        columns are read): the compiled function called with its inputs in order, without
        building a model point - the samplers' path, once per proposal."""
        args = [np.asarray(q[j], dtype=np.float64) if coordinate else np.ascontiguousarray(X[:, j], dtype=np.float64)
                for coordinate, j in self._inputs]
        with self._lock:
            return self._unpack(self.function.f(*args))

    def _unpack(self, out) -> tuple[float, np.ndarray, np.ndarray | None]:
        P, Q = self.structure.system.n_parameters, len(self._names)
        theta = np.array(out[1 : P + 1], dtype=np.float64)
        return float(out[0]), theta, (np.column_stack(out[Q + 1 :]) if self.structure.latent else None)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """A prior draw of the coordinates (Q,): the numbers of ``pm.draw(variables,
        random_seed=rng, mode="FAST_COMPILE")``, from a function compiled once."""
        (seed,) = _get_seeds_per_chain(rng, 1)
        fn, rngs = self._draw_function
        with self._lock:
            reseed_rngs(rngs, seed)
            return np.array([float(v) for v in fn()])

    def compile(self) -> ParameterPart:
        """Compile everything now (the function, the initial point, the bounds); returns self."""
        self.solve_ops, self.initial_point, self.lower
        return self


def _in_space(model: pm.Model, space: str) -> pm.Model:
    return remove_value_transforms(model) if space == "constrained" else model


def _compile_settings() -> tuple:
    """PyTensor's settings that a compiled function depends on."""
    c = pytensor.config
    return str(c.mode), str(c.linker), str(c.floatX), str(c.optimizer)


@lru_cache(maxsize=16)
def _shared(structure: ParameterStructure, space: str, settings: tuple) -> ParameterPart:
    """The parameter part of ``structure`` in ``space``, built and compiled (``settings``:
    :func:`_compile_settings` at the call, so that a change of PyTensor's settings compiles anew)."""
    model = structure.model()
    return ParameterPart(model, _in_space(model, space), structure).compile()


def shared_parameter_part(density: GradientMatchingDensity, space: str = "constrained") -> ParameterPart | None:
    """The parameter part of ``density``'s own model, shared by every density of an equal
    :class:`~pgpgm.matching.density.ParameterStructure` in this process (built on first use, at most
    16 kept, least recently used dropped), or None when it cannot be shared: its latent-state
    solve does not run as compiled code under PyTensor's default (numba) backend - a Python
    solve would count its solves in the first density's integrator - or a prior is not
    hashable. Its solves are counted in ``density.integrator``.

    The shared function's numbers do not depend on which density built it: it reads no data
    (the parameters, the unknown initial values and the observed states' first values are
    its inputs) and carries no state between calls (its random draws are reseeded at each)."""
    st = density.structure
    if st.latent and not (compiles(ODEOp(density.integrator)) and isinstance(get_mode(None).linker, NumbaLinker)):
        return None
    try:
        hash(st)
    except TypeError:
        return None
    part = _shared(st, space, _compile_settings())
    for op in part.solve_ops:
        track_solves(op, density.integrator)
    return part


class GradientMatchingTarget:
    """The density the element-wise sampler moves on.

    Parameters
    ----------
    density : the density description
    model : its ``pm.Model`` (default ``density.model()``); may carry extra terms on the
        parameters
    space : ``"constrained"`` (parameters on their natural scale) or ``"value"`` (PyMC's
        transformed value variables, as :class:`~pgpgm.matching.pymc_step.GradientMatchingStep` uses)

    Attributes
    ----------
    space : ``"constrained"`` or ``"value"``, as given
    coordinate_names : (Q,) names of the sampler's coordinates in the model point: the P
        parameters, then the U unknown latent initial values ``<state>_0`` (Q = P + U)
    arrays : :class:`SweepArrays`
    parameters : the compiled terms in the parameters (:class:`ParameterPart`); for the
        density's own model the one shared by every density of an equal structure
        (:func:`shared_parameter_part`), for a given model its own
    user_model : the model given (None: the density's own, built only when :attr:`model` is read)
    n_logp_evals : full density evaluations so far
    """

    def __init__(self, density: GradientMatchingDensity, model: pm.Model | None = None, *,
                 space: str = "constrained"):
        if space not in ("constrained", "value"):
            raise ValueError("space must be 'constrained' or 'value'")
        self.density = density
        self.space = space
        self.user_model = model
        if model is not None:  # the density's own model has no other terms by construction
            _refuse_state_terms(density, model)
            self.parameters = ParameterPart(model, self.prior_model, density.structure)
        else:  # the density's own terms in the parameters: shared, or compiled for this target
            shared = shared_parameter_part(density, space)
            self.parameters = shared if shared is not None else ParameterPart(self.model, self.prior_model,
                                                                              density.structure)
        self.coordinate_names = self.parameters.coordinate_names
        self.arrays = SweepArrays.from_density(density)
        self.n_logp_evals = 0

    @cached_property
    def model(self) -> pm.Model:
        """The ``pm.Model``: the one given, or ``density.model()`` (built on first use: the
        samplers need only :attr:`parameters` and the density's arrays)."""
        return self.density.model() if self.user_model is None else self.user_model

    @cached_property
    def prior_model(self) -> pm.Model:
        """:attr:`model` in the sampler's space (value transforms removed for ``"constrained"``)."""
        return _in_space(self.model, self.space)

    @property
    def parameter_function(self):
        """The compiled function of :attr:`parameters` (the model's terms in the parameters alone,
        the parameters and the latent states; :meth:`parameter_part`)."""
        return self.parameters.function

    @cached_property
    def log_density_function(self):
        """The model's whole log density, the parameters and the latent states, compiled on
        first use (:meth:`evaluate_model`; the samplers evaluate by parts, :meth:`evaluate`)."""
        m, d = self.prior_model, self.density
        outs = [m.logp(), *m.replace_rvs_by_values([m[p] for p in (*d.system.parameters, *d.x0_priors.names)])]
        if d.latent:
            outs += m.replace_rvs_by_values([m[n] for n in d.latent])
        return m.compile_fn(outs, point_fn=True)

    @cached_property
    def log_normaliser(self) -> float:
        """The constant the model's log density carries beyond :meth:`state_part`'s
        quadratic forms: the Normal likelihood's -N_k/2 log(2 pi sigma_k^2) per observed state
        (N_k its number of measurements)."""
        N = self.density.obs.n_obs
        return float(np.sum(-0.5 * N * np.log(2 * np.pi) - N * np.log(self.density.noise_sd)))

    def parameter_part(self, q, X) -> tuple[float, np.ndarray, np.ndarray | None]:
        """The log density's terms in the parameters alone, the parameters (P,) and the
        latent states (N, L) at coordinates q (Q,): one ODE solve from the observed states'
        values ``X[0]`` (N, S; only row 0 is read). ``parameter_part(q, X)[0] +
        state_part(X, stats)`` equals ``evaluate(q, X)[0]``."""
        self.n_logp_evals += 1
        lp, theta, lat = self.parameters.evaluate_at(q, X)
        if lat is not None and not np.isfinite(lat).all():
            return -np.inf, theta, lat
        return lp, theta, lat

    def state_part(self, X, stats) -> float:
        """The density's terms in the states: GP prior, likelihood and gradient matching,
        from the maintained vectors ``stats`` (:meth:`statistics`) at states X (N, S), in O(N M)."""
        a = self.arrays
        return state_quadratic(X, a.obs_idx, a.mu, a.obs_precision, a.Y, stats.w, stats.r, stats.z) \
            + self.log_normaliser

    def statistics(self, theta, X) -> SweepStatistics:
        """:meth:`pgpgm.matching.density.GradientMatchingDensity.statistics` at parameters ``theta``
        (P,) and states X (N, S), from the stacked matrices of :attr:`arrays`."""
        return self.state_terms(theta, X)[0]

    def state_terms(self, theta, X) -> tuple[SweepStatistics, float]:
        """:meth:`statistics` and :meth:`state_part` at parameters ``theta`` (P,) and states
        X (N, S): f on the grid, then one compiled call."""
        a = self.arrays
        F = self.density.system.rhs_on_grid(self.density.obs.times, X, theta)
        w, r, z, quadratic = state_terms(np.ascontiguousarray(X, dtype=np.float64), F, a.obs_idx, a.mu, a.Cinv, a.D,
                                          a.P, a.obs_precision, a.Y)
        return SweepStatistics(F, w, r, z), quadratic + self.log_normaliser

    def lower_bounds(self) -> np.ndarray:
        """(Q,) the lower end of each coordinate's support (-inf when unbounded below), read
        from the model's value transforms (interval and log transforms)."""
        return self.parameters.lower.copy()

    def point(self, q, X) -> dict[str, Any]:
        """The model point at parameter coordinates q (P,) and states X (N, S)."""
        d = self.density
        pt_ = {n: np.asarray(v, dtype=np.float64) for n, v in zip(self.coordinate_names, q)}
        pt_.update({n: np.array(X[:, k], dtype=np.float64) for n, k in zip(d.obs.states, d.observed_idx)})
        return pt_

    def evaluate(self, q, X) -> tuple[float, np.ndarray, np.ndarray | None]:
        """Full log density, parameters (P,) and latent states (N, L) at q (Q,) and X (N, S; the
        latent columns are not read): :meth:`parameter_part` (one ODE solve) plus
        :meth:`state_part`. It equals :meth:`evaluate_model` up to rounding and needs no
        compiled graph of the N x N terms."""
        lp_par, theta, lat = self.parameter_part(q, X)
        if not np.isfinite(lp_par):
            return -np.inf, theta, lat
        if lat is not None:
            X = X.copy()
            X[:, self.arrays.lat_idx] = lat
        lp = lp_par + self.state_part(X, self.statistics(theta, X))
        return (lp if np.isfinite(lp) else -np.inf), theta, lat

    def evaluate_model(self, q, X) -> tuple[float, np.ndarray, np.ndarray | None]:
        """:meth:`evaluate` through the model's compiled log density (:attr:`log_density_function`)."""
        self.n_logp_evals += 1
        out = self.log_density_function(self.point(q, X))
        P, Q = self.density.system.n_parameters, len(self.coordinate_names)
        theta = np.array([float(v) for v in out[1 : P + 1]])
        lat = np.column_stack(out[Q + 1 :]) if self.density.latent else None
        return float(out[0]), theta, lat


    def explain(self, q, X) -> str:
        """Which terms of the model are not finite at q (P,) and X (N, S), in words."""
        d = self.density
        terms = self.prior_model.point_logps(self.point(q, X))
        bad = {k: v for k, v in terms.items() if not np.isfinite(v)}
        if not bad:
            return "every term is finite (the total overflows); rescale the data or the parameters"
        reasons = []
        for name in bad:
            if name in d.system.parameters or name in d.x0_priors.names:
                what = "parameter" if name in d.system.parameters else "initial value"
                j = list((*d.system.parameters, *d.x0_priors.names)).index(name)
                reasons.append(f"{what} {name} = {q[j]:.6g} is outside its prior's support; change init= or widen "
                               "the prior")
            elif name == "gradient_matching" and d.latent:
                reasons.append("the latent-state solve fails there (or f is not finite)" + self._solve_error(q, X)
                               + "; start elsewhere or check the equations and x0")
            elif name == "gradient_matching":
                reasons.append("the right-hand side f is not finite at the observed states; check the equations")
            elif name.startswith("y_"):
                reasons.append(f"the observations of {name[2:]} are impossible under the noise model; check data "
                               "and noise_sd")
            else:
                reasons.append(f"the term {name} is {bad[name]}")
        return "; ".join(reasons)

    def _solve_error(self, q, X) -> str:
        """The latent-state solve's own error at q (P + U,) and X (N, S), as " (...)" (e.g. a step
        budget too small, ``max_steps``); "" when the solve succeeds or cannot be repeated here."""
        d = self.density
        if d.integrator is None:
            return ""
        P = d.system.n_parameters
        x0 = d.initial_state([float(v) for v in np.asarray(X)[0, list(d.observed_idx)]], [float(v) for v in q[P:]])
        try:
            d.integrator.solve(np.asarray(q[:P], float), np.asarray(x0, float))
        except ODESolveError as exc:
            return f" ({exc})"
        return ""


def _refuse_state_terms(density: GradientMatchingDensity, model: pm.Model) -> None:
    """The sweep tracks exactly the density's own terms in the observed states; refuse a model
    with any other term (potential or random variable) that depends on them."""
    own = {"gp_prior", "gradient_matching", *(f"y_{s}" for s in density.obs.states), *density.obs.states}
    state_values = {model.rvs_to_values[model[s]] for s in density.obs.states}
    others = [v for v in (*model.potentials, *model.basic_RVs) if v.name not in own]
    bad = [v.name for v in others if state_values & set(ancestors([model.logp(vars=[v], jacobian=False)]))]
    if bad:
        raise PgpgmError(f"the model has terms {bad} on the observed states, which the element-wise sampler "
                         "does not track; sample such a model with pm.sample (NUTS)")

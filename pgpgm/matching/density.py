"""Step 2a: the partial-observation gradient-matching density, described once.

    log p(x_M, theta | y) = log p(theta)
        - 1/2 sum_k (x_k - mu_k)^T C_k^-1 (x_k - mu_k)                    "gp_prior"
        + sum_k log N(y_k | x_k, sigma_k^2 I)                              "y_<state>"
        - 1/2 sum_k r_k^T (A_k + gamma I)^-1 r_k,  r_k = f_k - D_k (x_k - mu_k)
                                                                           "gradient_matching"

with f evaluated on the observed states x_M and the latent states x_L(theta, x0)
integrated by CVODE. Additive constants are dropped. With no latent state the density
is exactly FGPGM and no ODE is solved.

:class:`GradientMatchingDensity` is the one description: data, GP fits, per-state
matrices (:class:`StateTerm`), gamma, priors, initial values and the integrator. The
``pm.Model`` (:meth:`GradientMatchingDensity.model`) and the fast sampler
(:mod:`pgpgm.matching`) are both derived from it; the maintained vectors of the
sampler's O(N) updates are defined here (:meth:`GradientMatchingDensity.statistics`).

A state measured up to a scale and an offset (``fit(observables={"y": "s * P + b"})``) is matched
through the system whose state is the measurement y in P's place
(:meth:`pgpgm.observables.Observables.matching_system`): dy/dt = s f_P at P = (y - b) / s, so this
density, unchanged, has the GP on y, the residual s f_P - D (y - mu) (i.e. P = (y_gp - b) / s,
dP/dt = (dy_gp/dt) / s, in y's units) and s, b among the sampled parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numba
import numpy as np
import pymc as pm
import pytensor.tensor as pt

from ..checks import check_gamma, noise_levels, per_state
from ..data import Observations, as_observations, initial_value_priors, initial_values
from ..errors import DataError
from ..gp import GPFit, GradientMatching, fit_gp, gradient_matching
from ..ode.system import ODESystem
from ..priors import Priors, PriorSpec
from ..solve import Integrator, Solver
from ..solve.op import ODEOp


@dataclass(frozen=True, eq=False)
class ParameterStructure:
    """What the density's terms in the parameters alone are built from, and no data.

    The priors of the parameters and of the unknown latent initial values, and the latent
    states integrated from the observed states' first values: the part of
    :meth:`GradientMatchingDensity.model` that the samplers' parameter moves evaluate
    (:class:`~pgpgm.matching.target.ParameterPart`). Two structures are equal, and hash
    alike, when they would build the same graph: same equations (compared by content, not
    by object), observed states, priors, known initial values, grid and solver (:attr:`key`).

    Attributes
    ----------
    system : the ODE system; observed : the M observed state names
    priors, x0_priors : the parameters' and unknown latent initial values' priors
    x0 : (S,) initial values (NaN where they come from the observed states or are unknown)
    times : (N,) the grid; solver : the latent-state solver (None without latent states)
    """

    system: ODESystem
    observed: tuple[str, ...]
    priors: Priors
    x0_priors: Priors
    x0: np.ndarray
    times: np.ndarray
    solver: Solver | None

    @cached_property
    def key(self) -> tuple:
        """Everything the graph depends on, as hashable values (NaN initial values as None)."""
        s = self.system
        return ((s.name, s.states, s.parameters, s.expressions), self.observed, self.priors, self.x0_priors,
                tuple(None if not np.isfinite(v) else float(v) for v in self.x0),
                np.ascontiguousarray(self.times, dtype=np.float64).tobytes(), self.solver)

    def __eq__(self, other) -> bool:
        return isinstance(other, ParameterStructure) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def observed_idx(self) -> tuple[int, ...]:
        return tuple(self.system.index_of_states(self.observed))

    @property
    def latent_idx(self) -> tuple[int, ...]:
        obs = self.observed_idx
        return tuple(i for i in range(self.system.n_states) if i not in obs)

    @property
    def latent(self) -> tuple[str, ...]:
        return tuple(self.system.states[i] for i in self.latent_idx)

    @property
    def unknown_x0_idx(self) -> tuple[int, ...]:
        """State indices (U,) of the latent states whose initial value is unknown (sampled)."""
        return tuple(self.system.states.index(n[:-2]) for n in self.x0_priors.names)

    def initial_state(self, first_values: Sequence, unknown: Sequence = ()) -> list:
        """The initial values of the solve: an observed state starts at its value at
        ``times[0]`` (``first_values``, M entries, numbers or tensors), a latent state at
        ``x0`` or, when unknown, at its entry of ``unknown`` (U entries, in
        :attr:`unknown_x0_idx` order). Returns S entries, to stack with numpy or PyTensor."""
        by_index = dict(zip(self.observed_idx, first_values))
        by_index.update(zip(self.unknown_x0_idx, unknown))
        return [by_index[i] if i in by_index else float(self.x0[i]) for i in range(self.system.n_states)]

    def add_variables(self, integrator: Integrator | None) -> tuple[pt.TensorVariable, dict, dict,
                                                                   pt.TensorVariable | None]:
        """Create, in the current PyMC model (with the coordinate ``time``), the parameters'
        priors, the unknown latent initial values ``<state>_0``, the observed states (Flat,
        over ``time``) and the latent states (Deterministics, one ``integrator`` solve on the
        grid, NaN where it fails). Returns theta (P,), the unknown initial values by index,
        every state by name, and the trajectory (N, S) (None without latent states)."""
        theta = self.priors.variables()
        unknown = self.x0_priors.variables()
        xs = {s: pm.Flat(s, dims="time") for s in self.observed}
        traj = None
        if self.latent:
            x0 = pt.stack(self.initial_state([xs[s][0] for s in self.observed],
                                             [unknown[j] for j in range(len(self.x0_priors.names))]))
            traj = ODEOp(integrator, on_failure="nan")(theta, x0)
            for j, s in zip(self.latent_idx, self.latent):
                xs[s] = pm.Deterministic(s, traj[:, j], dims="time")
        return theta, unknown, xs, traj

    def coords(self) -> dict:
        return {"time": self.times, "parameter": list(self.system.parameters)}

    def model(self) -> pm.Model:
        """The parameter part alone as a ``pm.Model`` (no data, no state terms), its latent
        states solved by an integrator of its own."""
        integrator = Integrator(self.system, self.times, self.solver) if self.latent else None
        with pm.Model(coords=self.coords()) as model:
            self.add_variables(integrator)
        return model


@dataclass(frozen=True)
class StateTerm:
    """The terms of one observed state (N time points).

    Attributes
    ----------
    name : state name; index : its position in the state vector
    gp : the fitted GP; matching : its gradient-matching matrices (mean mu, C^-1, D, A)
    noise_sd : observation noise sd (state units)
    grad_precision : (N, N) (A + gamma I)^-1
    """

    name: str
    index: int
    gp: GPFit
    matching: GradientMatching
    noise_sd: float
    grad_precision: np.ndarray


@dataclass(frozen=True)
class SweepStatistics:
    """The vectors the element-wise sampler maintains, at one (theta, X).

    F : (N, S) f at every time; w : (M, N) C^-1 (x - mu); r : (M, N) gradient-matching
    residuals f_k - D (x - mu); z : (M, N) (A + gamma I)^-1 r.
    """

    F: np.ndarray
    w: np.ndarray
    r: np.ndarray
    z: np.ndarray


@numba.njit(cache=True)
def sweep_statistics(Xo, Fo, mu, Cinv, D, P):
    """w, r, z (M, N) of :class:`SweepStatistics` for the observed states' values Xo (N, M),
    f at them Fo (N, M), GP means mu (M,), C^-1, D and (A + gamma I)^-1 (M, N, N):
    w = C^-1 (x - mu), r = f - D (x - mu), z = (A + gamma I)^-1 r, state by state."""
    N, M = Xo.shape
    w, r, z = np.empty((M, N)), np.empty((M, N)), np.empty((M, N))
    dx = np.empty(N)
    for m in range(M):
        for i in range(N):
            dx[i] = Xo[i, m] - mu[m]
        for i in range(N):
            sw, sr = 0.0, Fo[i, m]
            for k in range(N):
                sw += Cinv[m, i, k] * dx[k]
                sr -= D[m, i, k] * dx[k]
            w[m, i], r[m, i] = sw, sr
        for i in range(N):
            s = 0.0
            for k in range(N):
                s += P[m, i, k] * r[m, k]
            z[m, i] = s
    return w, r, z


@numba.njit(cache=True)
def state_terms(X, F, obs_idx, mu, Cinv, D, P, obs_precision, Y):
    """w, r, z (M, N) of :func:`sweep_statistics` and :func:`state_quadratic`
    at states X (N, S) with f there F (N, S), the observed states' columns ``obs_idx`` (M,)
    gathered here."""
    N, M = Y.shape
    Xo, Fo = np.empty((N, M)), np.empty((N, M))
    for i in range(N):
        for m in range(M):
            Xo[i, m], Fo[i, m] = X[i, obs_idx[m]], F[i, obs_idx[m]]
    w, r, z = sweep_statistics(Xo, Fo, mu, Cinv, D, P)
    return w, r, z, state_quadratic(X, obs_idx, mu, obs_precision, Y, w, r, z)


@numba.njit(cache=True)
def state_quadratic(X, obs_idx, mu, obs_precision, Y, w, r, z):
    """-1/2 [sum (x - mu) w + sum obs_precision (y - x)^2 + sum r z] over the observed states
    (M,) of X (N, S): the state part of the log density without its constant."""
    N, M = Y.shape
    q = 0.0
    for m in range(M):
        k = obs_idx[m]
        for i in range(N):
            x = X[i, k]
            q += (x - mu[m]) * w[m, i] + obs_precision[m, i] * (Y[i, m] - x) ** 2 + r[m, i] * z[m, i]
    return -0.5 * q


@dataclass(frozen=True)
class GradientMatchingDensity:
    """Everything that defines the gradient-matching density (immutable).

    Attributes
    ----------
    system : the ODE system; obs : the data (times (N,), values (N, M))
    terms : one :class:`StateTerm` per observed state, in ``obs.states`` order
    gamma : gradient-matching mismatch variance (state-derivative units^2); a mapping
        observed state -> gamma when given per state
    priors : the parameter priors
    x0 : (S,) initial values; entries of observed states are NaN (they come from x_M), and
        so are those of latent states with unknown initial values
    integrator : the latent-state solve on ``obs.times`` (None without latent states)
    x0_priors : priors of the unknown latent initial values, named ``<state>_0`` (empty
        when every latent initial value is known, the fast path)
    """

    system: ODESystem
    obs: Observations
    terms: tuple[StateTerm, ...]
    gamma: float | Mapping[str, float]
    priors: Priors
    x0: np.ndarray
    integrator: Integrator | None
    x0_priors: Priors = Priors((), ())

    # ------------------------------------------------------------------ derived facts
    @property
    def observed_idx(self) -> tuple[int, ...]:
        return tuple(k.index for k in self.terms)

    @cached_property
    def structure(self) -> ParameterStructure:
        """What the density's terms in the parameters alone are built from (no data)."""
        return ParameterStructure(self.system, tuple(self.obs.states), self.priors, self.x0_priors, self.x0,
                                  self.obs.times, None if self.integrator is None else self.integrator.solver)

    @property
    def latent_idx(self) -> tuple[int, ...]:
        return self.structure.latent_idx

    @property
    def latent(self) -> tuple[str, ...]:
        return self.structure.latent

    @property
    def noise_sd(self) -> np.ndarray:
        """(M,) observation noise sd per observed state."""
        return np.array([k.noise_sd for k in self.terms])

    @property
    def kernel(self) -> str | dict[str, str]:
        """The GP kernel's name, or a mapping state -> name when the states' kernels differ."""
        names = {k.name: k.gp.kernel.name for k in self.terms}
        return next(iter(names.values())) if len(set(names.values())) == 1 else names

    @property
    def unknown_x0_idx(self) -> tuple[int, ...]:
        """State indices (U,) of the latent states whose initial value is unknown (sampled)."""
        return self.structure.unknown_x0_idx

    def initial_state(self, first_values: Sequence, unknown: Sequence = ()) -> list:
        """:meth:`ParameterStructure.initial_state` of this density."""
        return self.structure.initial_state(first_values, unknown)

    def gp_posterior_means(self) -> np.ndarray:
        """GP-smoothed observed states (N, M) on the grid, the sampler's starting values (each
        state's GP conditioned on its own measurements)."""
        t, obs = self.obs.times, self.obs
        if obs.complete:
            return np.column_stack([k.gp.posterior_mean(t, obs.values[:, m]) for m, k in enumerate(self.terms)])
        return np.column_stack([k.gp.posterior_mean(obs.state_times(m), obs.state_values(m), t)
                                for m, k in enumerate(self.terms)])

    def gp_states(self, observed: np.ndarray | None = None) -> np.ndarray:
        """(N, S) every state on the grid: the observed ones' columns at ``observed`` (N, M; default
        :meth:`gp_posterior_means`), the latent ones' 0 (the samplers solve them)."""
        X = np.zeros((self.obs.times.size, self.system.n_states))
        X[:, list(self.observed_idx)] = self.gp_posterior_means() if observed is None else observed
        return X

    def initial_point(self, theta) -> dict[str, np.ndarray]:
        """A start for any PyMC sampler: theta (P,) and the GP-smoothed observed states
        (pass it as ``pm.sample(initvals=...)``)."""
        start = self.gp_posterior_means()
        point = {p: np.asarray(v, float) for p, v in zip(self.system.parameters, theta)}
        point.update({s: start[:, m] for m, s in enumerate(self.obs.states)})
        return point

    def statistics(self, theta, X) -> SweepStatistics:
        """The maintained vectors at parameters ``theta`` (P,) and states ``X`` (N, S)."""
        F = self.system.rhs_on_grid(self.obs.times, X, theta)
        obs = list(self.observed_idx)
        w, r, z = sweep_statistics(np.ascontiguousarray(X[:, obs]), np.ascontiguousarray(F[:, obs]),
                                   np.array([k.matching.mean for k in self.terms], float),
                                   np.stack([k.matching.C_precision for k in self.terms]),
                                   np.stack([k.matching.D for k in self.terms]),
                                   np.stack([k.grad_precision for k in self.terms]))
        return SweepStatistics(F, w, r, z)

    # ------------------------------------------------------------------ the PyMC model
    def model(self) -> pm.Model:
        """The density as a ``pm.Model``.

        Free variables: every parameter (scalar), every unknown latent initial value
        ``<state>_0`` (scalar) and every observed state (vector over ``time``, the grid). Deterministics: the latent states. Log-density terms: Potentials
        ``gp_prior`` and ``gradient_matching``, observed Normals ``y_<state>`` (over
        ``time``, or over ``time_<state>``, the state's own observation times, when some
        values are missing).
        """
        system, t = self.system, self.obs.times
        structure = self.structure
        with pm.Model(coords=structure.coords()) as model:
            # the parameters, unknown latent initial values <state>_0, observed and latent states
            theta, _, xs, traj = structure.add_variables(self.integrator)
            f = system.pytensor_rhs(pt.constant(t), xs, theta)
            gp_terms, gm_terms = [], []
            for m, k in enumerate(self.terms):
                # the data, noise sd and GP matrices enter as pm.Data, not constants: the graph is
                # then the same for every data set of a model (same grid), so its compiled code
                # (PyTensor's numba cache, in memory and on disk) serves them all
                g = k.matching
                mean, C_prec, D, P, sd = (pm.Data(f"_{what}_{k.name}", np.asarray(v, float)) for what, v in (
                    ("gp_mean", g.mean), ("gp_C_precision", g.C_precision), ("gp_D", g.D),
                    ("grad_precision", k.grad_precision), ("noise_sd", k.noise_sd)))
                dx = xs[k.name] - mean
                gp_terms.append(-0.5 * pt.dot(dx, pt.dot(C_prec, dx)))
                if self.obs.complete:
                    y = pm.Data(f"_y_{k.name}", self.obs.values[:, m], dims="time")
                    pm.Normal(f"y_{k.name}", mu=xs[k.name], sigma=sd, observed=y, dims="time")
                else:  # the observation term only where the state is measured
                    rows = self.obs.rows(m)
                    model.add_coord(f"time_{k.name}", t[rows])
                    y = pm.Data(f"_y_{k.name}", self.obs.values[rows, m], dims=f"time_{k.name}")
                    pm.Normal(f"y_{k.name}", mu=xs[k.name][rows], sigma=sd, observed=y, dims=f"time_{k.name}")
                r = f[k.index] - pt.dot(D, dx)
                gm_terms.append(-0.5 * pt.dot(r, pt.dot(P, r)))
            pm.Potential("gp_prior", pt.sum(pt.stack(gp_terms)))
            gm_total = pt.sum(pt.stack(gm_terms))
            if self.latent:  # a failed latent-state solve is a -inf density, i.e. a rejected proposal
                gm_total = pt.switch(pt.all(pt.isfinite(traj)), gm_total, -np.inf)
            pm.Potential("gradient_matching", gm_total)
        return model


def fit_gps(obs: Observations, kernel="rbf", *, noise_sd=None, n_starts: int = 5, seed: int = 0) -> tuple[GPFit, ...]:
    """Step 1: one GP per observed state of ``obs``, each fitted to its own measurements
    (noise sd fitted unless given, scalar or (M,)); ``kernel`` one name/Kernel or a mapping
    state -> kernel."""
    M = len(obs.states)
    nsd = [None] * M if noise_sd is None else noise_levels(noise_sd, M)
    kernels = per_state(kernel, obs.states, "kernel")
    return tuple(fit_gp(obs.state_times(m), obs.state_values(m), kernels[m], state=s, noise_sd=nsd[m],
                        n_starts=n_starts, seed=seed + m)
                 for m, s in enumerate(obs.states))


def gradient_matching_density(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
    kernel="rbf",
    gamma: float = 0.3,
    priors: Mapping[str, PriorSpec] | PriorSpec | None = None,
    noise_sd: float | Sequence[float] | None = None,
    gp_fits: Sequence[GPFit] | None = None,
    solver: Solver | Integrator | None = None,
    gp_starts: int = 5,
    seed: int = 0,
    grid=None,
) -> GradientMatchingDensity:
    """Describe the gradient-matching density (step 2 of the method, see the README) for ``system`` and ``data`` (fits the GPs unless given).

    Parameters
    ----------
    system : ODESystem
    data : Dataset from :func:`pgpgm.simulate`, a tidy long DataFrame (time, state, value), a wide
        DataFrame or dict with NaN where not measured (see :func:`pgpgm.data.as_observations`);
        each observed state may have its own times (at least 3 each)
    observed : names of the measured states (default: every state present in ``data``)
    x0 : initial values of the latent states (mapping by name, or a full (S,) vector whose
        observed entries are ignored); taken from ``data.attrs["x0"]`` when omitted. An
        unknown latent initial value is given a prior instead of a number:
        ``x0={"H": (0, 50)}`` (Uniform) or ``x0={"H": lambda name: pm.HalfNormal(name, 10)}``;
        it becomes the free variable ``H_0``, sampled with the parameters (each move
        re-integrates). Known values keep the fast path.
    kernel : GP kernel name or :class:`~pgpgm.gp.kernels.Kernel`, or a mapping observed state -> kernel
    gamma : gradient-matching mismatch variance (state-derivative units^2), or a mapping
        observed state -> gamma
    priors : per-parameter ``(lower, upper)`` for a Uniform prior, or a callable
        ``name -> PyMC variable``; one spec for all parameters or a mapping by name.
        Default :data:`pgpgm.priors.DEFAULT_BOUNDS`.
    noise_sd : known observation noise sd (scalar or per observed state); fitted by the
        GP step when None
    gp_fits : reuse GP fits (one per observed state) instead of fitting
    solver : the ODE solver of the latent states (or an Integrator on the data's times)
    gp_starts, seed : optimiser starts and seed of the GP fit
    grid : (G,) time grid of the density (default: the union of the observation times); it
        must span the observations, which are added to it (:func:`pgpgm.data.as_observations`).
        Each observed state's GP is fitted to its own measurements and evaluated on the grid;
        the observed states are free at every grid point, the observation term only where
        a state is measured.
    """
    obs = as_observations(data, observed, system, grid=grid)
    gammas = [check_gamma(g) for g in per_state(gamma, obs.states, "gamma")]
    if isinstance(kernel, Mapping):
        per_state(kernel, obs.states, "kernel")
    obs_idx = tuple(system.index_of_states(obs.states))
    lat_idx = tuple(i for i in range(system.n_states) if i not in obs_idx)
    x0_full = initial_values(system, data, x0, obs_idx)
    x0_priors = initial_value_priors(system, x0, obs_idx)
    unknown = [s for s in system.states if s in x0_priors]  # state order
    clash = [f"{s}_0" for s in unknown if f"{s}_0" in system.parameters]
    if clash:
        raise DataError(f"the unknown initial values would be named {clash}, which are parameter names; rename the "
                        "parameters")
    x0_prior = Priors.from_user([f"{s}_0" for s in unknown], {f"{s}_0": x0_priors[s] for s in unknown})
    prior = Priors.from_user(system.parameters, priors)
    M = len(obs.states)
    if gp_fits is None:
        gp_fits = fit_gps(obs, kernel, noise_sd=noise_sd, n_starts=gp_starts, seed=seed)
    gp_fits = tuple(gp_fits)
    if len(gp_fits) != M:
        raise DataError(f"need one GP fit per observed state ({M}), got {len(gp_fits)}")
    nsd = np.array([g.noise_sd for g in gp_fits]) if noise_sd is None else noise_levels(noise_sd, M)
    terms = []
    for m, (s, g) in enumerate(zip(obs.states, gp_fits)):
        gm = gradient_matching(g, obs.times)
        terms.append(StateTerm(s, obs_idx[m], g, gm, float(nsd[m]), gm.gradient_precision(gammas[m])))
    integrator = None
    if lat_idx:
        integrator = solver if isinstance(solver, Integrator) else Integrator(system, obs.times, solver)
        if integrator.system is not system or not np.array_equal(integrator.times, obs.times):
            raise DataError("the integrator given as solver must integrate this system on the data's times")
    gamma_value = dict(zip(obs.states, gammas)) if isinstance(gamma, Mapping) else float(gammas[0])
    return GradientMatchingDensity(system, obs, tuple(terms), gamma_value, prior, x0_full, integrator, x0_prior)


def build_model(system: ODESystem, data, observed: Sequence[str] | None = None, **kwargs) -> pm.Model:
    """The gradient-matching density (step 2 of the method) as a ``pm.Model``.

    Takes the arguments of :func:`gradient_matching_density` and returns
    ``gradient_matching_density(...).model()``. To sample it with pgpgm's element-wise
    sampler, keep the density: ``pgpgm.sample(density)``.
    """
    return gradient_matching_density(system, data, observed, **kwargs).model()

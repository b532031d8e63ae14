"""Step 4: the exact posterior of the ODE model, sampled from the refined optimum.

Steps 1-3 find the basin of the global optimum without a good initial guess; this step
explores it with an exact sampler. :func:`build_ode_model` writes the ODE model itself as
a ``pm.Model``:

    theta ~ priors (the specs of :func:`pgpgm.gradient_matching_density`)
    x_k(t_0) ~ Normal(first observation of k, sd of k's observations)   observed states
    sigma_k ~ LogNormal(log sigma_k^GP, 2)           unless the noise sd is given
    x(t) = CVODE solve from (x(t_0), theta)          on the observation grid (and, for the
                                                     trajectories of the draws, the plotting grid)
    y_k(t_i) ~ Normal(x_k(t_i), sigma_k)

or, with measurement noise models (``build_ode_model(..., noise=(...))``, :mod:`pgpgm.noise`), per
observed state: ``y_k ~ LogNormal(log x_k, sigma_k)`` (sigma_k of log y), ``Poisson(x_k)`` or
``NegativeBinomial(mu=x_k, alpha=alpha_k)`` on the measured entries, with
``alpha_k ~ LogNormal(log alpha_k^refined, 2)`` and ``sigma_k ~ LogNormal(log sigma_k^start, 2)``
like the Gaussian sds, unless given; a prediction x_k <= 0 at a measured value has zero likelihood.

and :func:`sample_posterior` runs NUTS on it, every chain started near the refined
optimum (dispersed by the refinement covariance, which also seeds the diagonal mass
matrix), chains in parallel processes.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import xarray as xr
from pymc.step_methods.hmc.quadpotential import (
    QuadPotentialDiag,
    QuadPotentialDiagAdapt,
    QuadPotentialFull,
    QuadPotentialFullAdapt,
)

from ..data import Observations, as_observations, initial_value_priors, initial_values
from ..errors import DataError, ODESolveError, PrecisionWarning
from ..noise import NOISE_MODELS
from ..observables import Observables
from ..ode.system import ODESystem
from ..priors import Priors, PriorSpec
from ..processes import exact_math, sample_in_processes
from ..solve import Integrator, Solver
from ..solve.op import ODEOp
from .diagnostics import (
    ESS_MIN,
    SD_ERROR,
    Mode,
    check_ess,
    check_sd_error,
    diagnose,
    find_modes,
    mixing_problems,
    modes_note,
    problems,
    warn_if_unconverged,
)
from .nutpie_engine import sample_nutpie

#: sd of log sigma in the noise prior (a factor e^2 ~ 7 per sd around the GP estimate)
NOISE_PRIOR_LOG_SD = 2.0


@dataclass(frozen=True)
class ODEModelLayout:
    """Names and grids of a model from :func:`build_ode_model`.

    parameters : (P,) theta names; initial : (M,) names of the observed states' initial
    values; noise : (M,) names of the noise sds (empty when the sds are given; with noise models,
    the free noise parameters only, ``noise_index`` giving their observed states);
    states : (S,) names of the state trajectories on ``dense_times``; dense_times : (D,)
    """

    parameters: tuple[str, ...]
    initial: tuple[str, ...]
    noise: tuple[str, ...]
    states: tuple[str, ...]
    dense_times: np.ndarray
    noise_index: tuple[int, ...] | None = None

    @property
    def noise_states(self) -> tuple[int, ...]:
        """(len(noise),) the observed state index m of each name in ``noise``."""
        return tuple(range(len(self.noise))) if self.noise_index is None else self.noise_index

    @property
    def free(self) -> tuple[str, ...]:
        """Every sampled quantity with a scalar value: parameters, initial values, noise sds."""
        return self.parameters + self.initial + self.noise


def initial_value_name(state: str) -> str:
    """Name of the free initial value of an observed state in the ODE model."""
    return f"{state}_0"


def noise_name(state: str) -> str:
    """Name of the noise sd of an observed state in the ODE model."""
    return f"sigma_{state}"


def dispersion_name(state: str) -> str:
    """Name of the negative-binomial dispersion alpha of an observed state in the ODE model."""
    return f"alpha_{state}"


def data_name(what: str, state: str) -> str:
    """Name of a ``pm.Data`` input of the ODE model: ``what`` of ``state``, e.g. ``_y_R``."""
    return f"_{what}_{state}"


#: step 4 samples the initial value of a measured state that the equations keep positive on the log scale
#: (its Normal prior restricted to positive values) when the refined value lies within this many standard
#: errors of 0 (:func:`positive_initial_values`): where the posterior reaches towards 0 (SIR's I from
#: I0 ~ 0.3: 1589 divergences on the state's own scale, none on the log scale). Farther out the state's own
#: scale serves (Lotka-Volterra's x2(0) = 3.05 +- 0.04, seed 1: 3x the draws to converge on the log scale,
#: 2026-11-29)
POSITIVE_X0_SE = 5.0


def positive_initial_values(system: ODESystem, refined: Mapping[str, tuple[float, float]]) -> tuple[str, ...]:
    """The states among ``refined`` (state -> (refined initial value, its standard error)) whose initial
    value step 4 samples on the log scale (``build_ode_model(positive_x0=...)``): the equations keep the
    state positive (:meth:`pgpgm.ODESystem.keeps_sign`) and its refined value is positive and within
    :data:`POSITIVE_X0_SE` standard errors of 0 (or its standard error is unknown)."""
    return tuple(s for s, (v, se) in refined.items()
                 if v > 0 and not v > POSITIVE_X0_SE * se and system.keeps_sign(system.states.index(s)))


def initial_value_prior(name: str, mu, sd, positive: bool = False) -> pt.TensorVariable:
    """The prior of a measured state's initial value: Normal(``mu``, ``sd``), restricted to positive values
    when ``positive`` (``pm.TruncatedNormal(lower=0)``, which NUTS moves on the log scale)."""
    if positive:
        return pm.TruncatedNormal(name, mu=mu, sigma=sd, lower=0.0)
    return pm.Normal(name, mu=mu, sigma=sd)


def build_ode_model(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Sequence[float] | Mapping[str, float] | None = None,
    priors: Mapping[str, PriorSpec] | PriorSpec | Priors | None = None,
    noise_sd: Sequence[float] | None = None,
    noise_center: Sequence[float] | None = None,
    solver: Solver | None = None,
    dense_times: np.ndarray | None = None,
    x0_priors: Mapping[str, PriorSpec] | None = None,
    log_scale: Sequence[str] = (),
    noise: Sequence[str] | None = None,
    x0_observed: Mapping[str, float] | None = None,
    observables: Observables | None = None,
    positive_x0: Sequence[str] = (),
    own_scale: Mapping[str, float] | None = None,
) -> tuple[pm.Model, ODEModelLayout]:
    """The ODE model of partial observations as a ``pm.Model``.

    Parameters
    ----------
    system : ODESystem
    data : the measurements: an :class:`~pgpgm.data.Observations`, or anything
        :func:`pgpgm.fit` takes (Dataset of :func:`pgpgm.simulate`, DataFrame, dict)
    observed : the measured states (default: every state in ``data``)
    x0 : initial values of the latent states (mapping by name or (S,) vector; observed
        entries are ignored: they are free variables ``<state>_0``); taken from
        ``data.attrs["x0"]`` when omitted
    priors : parameter priors, as in :func:`pgpgm.gradient_matching_density`
    noise_sd : (M,) known noise sds; when None every sd is a free ``sigma_<state>`` with a
        LogNormal prior centred on ``noise_center`` (M,) (e.g. the GP estimates)
    solver : the ODE solver (default :func:`pgpgm.default_solver`)
    dense_times : (D,) grid of the state deterministics (default 400 points over the data)
    x0_priors : priors of unknown latent initial values ``{state: (lower, upper) or callable}``
        (default: the prior entries of a mapping ``x0``); each is a free variable ``<state>_0``
    log_scale : names of parameters with a Uniform(0, upper) prior that NUTS moves on the
        log scale (:class:`pgpgm.priors.SoftLogTransform`: log theta well below the bound,
        meeting the bound smoothly) instead of the log-odds of the box. The prior is the
        same; the sampling geometry changes: a product or ratio of rates that the data
        determine (the banana of Lotka-Volterra with one state observed) becomes a straight
        ridge, which a dense mass matrix follows; near the bound the scale bends smoothly into
        the bound (:func:`pgpgm.fit` puts every Uniform(0, upper) parameter on it,
        :func:`log_scale_names`). A plain log scale would make the bound a hard wall: a
        NUTS trajectory along a ridge that reaches it (LV x1 observed: theta1 -> 10) ends
        in a divergence.
    noise : None (Gaussian noise) or (M,) :mod:`pgpgm.noise` model names, one per observed state:
        the likelihood of each is its model's PyMC distribution (``pm.Normal``, ``pm.LogNormal`` with
        mu = log x, ``pm.Poisson``, ``pm.NegativeBinomial(mu, alpha)``); ``noise_sd`` (M,) then holds
        known noise parameters (sd, of log y for lognormal; alpha for negbin) with NaN for a free one,
        whose prior is LogNormal(log ``noise_center[m]``, 2) (``sigma_<state>`` or ``alpha_<state>``);
        Poisson has none.
    x0_observed : known initial values of observed states (``{"C": 0.0}``): data (``_x0_<state>``),
        not free ``<state>_0`` (left out of ``layout.initial``)
    observables : measured functions of the states (:class:`pgpgm.observables.Observables`): ``data``
        (an :class:`~pgpgm.data.Observations`) then measures the observables (its ``states`` are
        their names), ``system`` is the extended one (:meth:`~pgpgm.observables.Observables.extend`,
        its parameters theta then the observation parameters phi, all with ``priors``), the
        likelihood of observable o is on mu_o = h_o(t, x(t), theta, phi) (Gaussian ``sigma_<o>`` or
        ``noise``), each observable is a deterministic on ``time_dense`` too, and the free initial
        values ``<state>_0`` are those of the states measured directly (identity observables, prior
        from their data) and the unknown latent ones
    positive_x0 : observed states whose initial value's Normal prior is restricted to positive values
        (``pm.TruncatedNormal(lower=0)``, which NUTS moves on the log scale): states the equations keep
        positive (:meth:`pgpgm.ODESystem.keeps_sign`; :func:`pgpgm.fit` names those whose refined
        initial value is positive and near 0: :func:`positive_initial_values`). A state that grows
        from a small initial value (an epidemic's I) rises the later the smaller it is, by log x0: on
        the state's own scale the posterior's curvature grows without bound towards 0 (divergences),
        on the log scale it does not
    own_scale : parameters and unknown latent initial values (``<state>_0``) with a Uniform(0, upper)
        prior that NUTS moves on their own scale, each with the width (theta units) of a soft wall at 0
        (:class:`pgpgm.priors.SoftplusTransform`): for a posterior that is Gaussian in theta rather than in
        log theta, or whose width stays fixed in theta units where the log scale would narrow into a funnel
        (:func:`pgpgm.fit` chooses them, :func:`pgpgm.posterior.scales.choose_scales`); not also in
        ``log_scale``

    Returns
    -------
    (pm.Model, ODEModelLayout)
        Free: the parameters, ``<state>_0`` per observed state and per unknown latent
        initial value (layout.initial: observed states first), ``sigma_<state>``;
        deterministics: every state on ``time_dense``; observed: ``y_<state>`` (time; or
        ``time_<state>``, the state's own measurement times, when values are missing).
        A failed solve is a -inf log density (a rejected proposal / divergence).
        Data (``pm.Data``, named by :func:`data_name`; change them with ``pm.set_data``):
        ``_y_<state>`` the measurements, ``_x0_mu_<state>`` and ``_x0_sd_<state>`` the prior
        of ``<state>_0`` (first measurement, sd of the measurements), ``_log_noise_center_<state>``
        (or ``_noise_sd_<state>`` when the sds are given), ``_x0_<state>`` per known latent
        initial value. Built again for other data of the same system, grid and options, the
        model is the same graph, so its compiled log density and gradient are reused.
    """
    obs = data if isinstance(data, Observations) else as_observations(data, observed, system)
    if observables is None:
        direct = {s: m for m, s in enumerate(obs.states)}  # state -> its column in obs
    else:
        if not isinstance(data, Observations) or tuple(observables.parameters) != tuple(system.parameters):
            raise DataError("with observables, give data as the observables' Observations and the extended system "
                            "(Observables.extend)")
        ident = observables.identity
        direct = {ident[n]: m for m, n in enumerate(obs.states) if n in ident}
    if not set(positive_x0) <= set(direct):
        raise DataError(f"positive_x0 names {sorted(set(positive_x0) - set(direct))}: only the states measured "
                        f"directly ({list(direct)}) have an initial value with a Normal prior to restrict")
    obs_idx = system.index_of_states(list(direct))
    unknown = initial_value_priors(system, x0, obs_idx) if x0_priors is None else dict(x0_priors)
    unknown = {s: unknown[s] for s in system.states if s in unknown}  # state order
    x0 = initial_values(system, data, x0, obs_idx) if not unknown or x0 is None or isinstance(x0, Mapping) else \
        initial_values(system, data, {s: v for s, v in zip(system.states, np.asarray(x0, float))
                                      if s not in unknown} | unknown, obs_idx)
    prior = priors if isinstance(priors, Priors) else Priors.from_user(system.parameters, priors)
    t, Y = obs.times, obs.values
    M = len(obs.states)
    if noise is not None:
        noise = tuple(noise)
        if len(noise) != M or any(n not in NOISE_MODELS for n in noise):
            raise DataError(f"noise must name one noise model of {list(NOISE_MODELS)} per observed state ({M}), "
                            f"got {noise!r}")
        known = np.full(M, np.nan) if noise_sd is None else np.broadcast_to(np.asarray(noise_sd, float), (M,))
        free = [m for m in range(M) if noise[m] != "poisson" and not np.isfinite(known[m])]
        center = np.full(M, np.nan) if noise_center is None else np.broadcast_to(np.asarray(noise_center, float), (M,))
        if free and (np.any(~np.isfinite(center[free])) or np.any(center[free] <= 0)):
            raise DataError(f"noise_center must be positive for the free noise parameters, got {noise_center}")
        noise_sd = None
    elif noise_sd is None:
        if noise_center is None:
            raise DataError("give noise_sd (known) or noise_center (the centre of the noise prior)")
        center = np.broadcast_to(np.asarray(noise_center, float), (M,))
        if np.any(~np.isfinite(center)) or np.any(center <= 0):
            raise DataError(f"noise_center must be positive, got {noise_center}")
    else:
        noise_sd = np.broadcast_to(np.asarray(noise_sd, float), (M,))
    dense = np.linspace(t[0], t[-1], 400) if dense_times is None else np.asarray(dense_times, float)
    # the likelihood's solve (one per leapfrog step, with sensitivities) outputs at the observation times
    # only (1.2-1.3x cheaper gradients); the plotting grid's states are a separate plain solve, made once
    # per kept draw (PyMC computes deterministics for the trace, not for the log density). Both start
    # from the first time of the union of the grids: CVODE's first step size depends on the first output
    # time and, in its normal mode, on nothing else of the output times
    grid = np.union1d(t, dense)
    solve_times, plot_times = np.union1d(t, grid[:2]), np.union1d(grid[:1], dense)
    rows_obs, rows_dense = np.searchsorted(solve_times, t), as_slice(np.searchsorted(plot_times, dense))
    every_row = as_slice(rows_obs)  # the rows of all observation times (a state measured at every one)
    integrator = Integrator(system, solve_times, solver)
    plotting = Integrator(system, plot_times, solver)
    coords = {"time": t, "time_dense": dense, "parameter": list(system.parameters), "observed": list(obs.states)}
    log_scale, own_scale = tuple(log_scale), dict(own_scale or {})
    boxes = {"log_scale": dict(zip(prior.names, prior.specs))}  # own_scale: unknown latent initial values too
    boxes["own_scale"] = {**boxes["log_scale"], **{initial_value_name(s): v for s, v in unknown.items()}}
    for name, what in [*((n, "log_scale") for n in log_scale), *((n, "own_scale") for n in own_scale)]:
        spec = boxes[what].get(name)
        if spec is None or callable(spec) or spec[0] != 0.0:
            raise DataError(f"{what} names {name!r}: only parameters (own_scale: and unknown latent initial "
                            f"values) with a Uniform(0, upper) prior can be sampled on another scale")
    if set(log_scale) & set(own_scale):
        raise DataError(f"{sorted(set(log_scale) & set(own_scale))} named in both log_scale and own_scale: "
                        "give each parameter one scale")
    with pm.Model(coords=coords) as model:
        # every number that comes from the data (observations, the initial-value and noise priors'
        # centres, known noise sds and initial values) enters as pm.Data, not as a constant: the
        # graph is then the same for every data set of a model on the same grid, so its compiled
        # code (PyTensor's numba cache, memory and disk) serves them all
        theta = prior.variables(log_scale, own_scale)  # same priors; NUTS moves log_scale ones in log theta
        first = {}
        held = dict(x0_observed or {})
        for s, m in direct.items():
            if s in held:  # a known initial value
                first[system.states.index(s)] = pm.Data(data_name("x0", s), float(held[s]))
                continue
            ym = obs.state_values(m)  # its measurements only (the first may come after times[0])
            spread = float(np.std(ym)) or float(abs(ym[0])) or 1.0
            mu, sd = pm.Data(data_name("x0_mu", s), float(ym[0])), pm.Data(data_name("x0_sd", s), spread)
            first[system.states.index(s)] = initial_value_prior(initial_value_name(s), mu, sd, s in positive_x0)
        u = Priors.from_user([initial_value_name(s) for s in unknown],
                             {initial_value_name(s): v for s, v in unknown.items()}).variables(own_scale=own_scale)
        for j, s in enumerate(unknown):  # unknown latent initial values
            first[system.states.index(s)] = u[j]
        x0_vec = pt.stack([first[i] if i in first else pm.Data(data_name("x0", s), float(x0[i]))
                           for i, s in enumerate(system.states)])
        # the gradient needs the sensitivities to the free initial values only (not to the known ones)
        x0_free = tuple(sorted(system.states.index(s) for s in [*unknown, *(s for s in direct if s not in held)]))
        traj = ODEOp(integrator, on_failure="nan", x0_free=x0_free)(theta, x0_vec)
        ok = pt.all(pt.isfinite(traj))
        pm.Potential("solve_failed", pt.switch(ok, np.float64(0.0), np.float64(-np.inf)))
        safe = pt.switch(ok, traj, 0.0)
        states = ODEOp(plotting, on_failure="nan", x0_free=x0_free)(theta, x0_vec)
        for i, s in enumerate(system.states):
            pm.Deterministic(s, states[rows_dense, i], dims="time_dense")
        if observables is None:
            columns = [safe[:, system.states.index(s)] for s in obs.states]
        else:  # mu of each observable on the solve's grid, and its trajectory
            columns = observables.pytensor(solve_times, safe, theta)
            traj_h = observables.pytensor(dense, states[rows_dense], theta)
            for o, name in enumerate(observables.names):
                pm.Deterministic(name, traj_h[o], dims="time_dense")
        for m, s in enumerate(obs.states):
            if noise is not None:
                _likelihood(model, noise[m], s, columns[m], rows_obs, obs, m, known[m], center[m])
                continue
            if noise_sd is None:
                sigma = pm.LogNormal(noise_name(s), mu=pm.Data(data_name("log_noise_center", s), np.log(center[m])),
                                     sigma=np.float64(NOISE_PRIOR_LOG_SD))
            else:
                sigma = pm.Data(data_name("noise_sd", s), float(noise_sd[m]))
            if obs.complete:
                y = pm.Data(data_name("y", s), Y[:, m], dims="time")
                mu = safe[every_row, obs_idx[m]] if observables is None else columns[m][every_row]
                pm.Normal(f"y_{s}", mu=mu, sigma=sigma, observed=y, dims="time")
            else:  # the likelihood only where state s is measured
                rows = obs.rows(m)
                model.add_coord(f"time_{s}", t[rows])
                y = pm.Data(data_name("y", s), Y[rows, m], dims=f"time_{s}")
                mu = safe[rows_obs[rows], obs_idx[m]] if observables is None else columns[m][rows_obs[rows]]
                pm.Normal(f"y_{s}", mu=mu, sigma=sigma, observed=y, dims=f"time_{s}")
    if noise is not None:
        names = tuple((dispersion_name if noise[m] == "negbin" else noise_name)(obs.states[m]) for m in free)
        layout = ODEModelLayout(tuple(system.parameters),
                                tuple(initial_value_name(s) for s in (*direct, *unknown) if s not in held), names,
                                tuple(system.states), dense, tuple(free))
        return model, layout
    layout = ODEModelLayout(tuple(system.parameters),
                            tuple(initial_value_name(s) for s in (*direct, *unknown) if s not in held),
                            tuple(noise_name(s) for s in obs.states) if noise_sd is None else (),
                            tuple(system.states), dense)
    return model, layout


def as_slice(rows: np.ndarray) -> slice | np.ndarray:
    """``rows`` (R,) increasing indices, as a slice where they are evenly spaced (else as they are): the same
    rows by basic indexing, which PyTensor's numba backend compiles in a fraction of the time of advanced
    indexing by an array (step 4's model of a new grid: 1.7 s less, 2026-11-29)."""
    rows = np.asarray(rows)
    if rows.size > 1:
        step = rows[1] - rows[0]
        if step > 0 and np.all(np.diff(rows) == step):
            return slice(int(rows[0]), int(rows[-1]) + 1, int(step))
    return rows


def _likelihood(model: pm.Model, name: str, s: str, x, rows_obs, obs: Observations, m: int, known: float,
                center: float) -> None:
    """The observed RV ``y_<s>`` of observed state s (index m) under the noise model ``name``, on its
    measured entries, from the state's trajectory x (grid,); its noise parameter free (LogNormal prior
    about ``center``) unless ``known`` is finite."""
    rows = np.flatnonzero(obs.mask[:, m])
    if obs.complete:
        dims = "time"
    else:
        dims = f"time_{s}"
        model.add_coord(dims, obs.times[rows])
    mu = x[rows_obs[rows]]
    values = obs.values[rows, m]
    if name in ("poisson", "negbin"):
        values = values.astype("int64")
    y = pm.Data(data_name("y", s), values, dims=dims)
    param = None
    if name != "poisson":
        pname = dispersion_name(s) if name == "negbin" else noise_name(s)
        if np.isfinite(known):
            param = pm.Data(data_name("noise_sd" if name != "negbin" else "alpha", s), float(known))
        else:
            param = pm.LogNormal(pname, mu=pm.Data(data_name("log_noise_center", s), np.log(center)),
                                 sigma=np.float64(NOISE_PRIOR_LOG_SD))
    if name == "normal":
        pm.Normal(f"y_{s}", mu=mu, sigma=param, observed=y, dims=dims)
        return
    # a prediction <= 0 at a measured value: zero likelihood (and a finite placeholder for the RV)
    positive = pt.all(mu > 0)
    pm.Potential(f"{s}_positive", pt.switch(positive, np.float64(0.0), np.float64(-np.inf)))
    mu = pt.switch(mu > 0, mu, 1.0)
    if name == "lognormal":
        pm.LogNormal(f"y_{s}", mu=pt.log(mu), sigma=param, observed=y, dims=dims)
    elif name == "poisson":
        pm.Poisson(f"y_{s}", mu=mu, observed=y, dims=dims)
    else:
        pm.NegativeBinomial(f"y_{s}", mu=mu, alpha=param, observed=y, dims=dims)


class ValueSpace:
    """Carries constrained values of a model's free scalar variables to PyMC's value space
    (one compiled function of the transforms), and evaluates the model's log density there with
    :attr:`logp_dlogp`, the one compiled log density and gradient of a :func:`run_nuts` call: every
    round's NUTS step takes it (``pymc.NUTS(logp_dlogp_func=...)``) instead of compiling its own
    (3-5 s a round on the published models)."""

    def __init__(self, model: pm.Model):
        import pytensor

        self.model = model
        self.rvs = list(model.free_RVs)
        inputs = [rv.type() for rv in self.rvs]
        outputs = []
        for rv, x in zip(self.rvs, inputs):
            tr = model.rvs_to_transforms.get(rv)
            outputs.append(x if tr is None else tr.forward(x, *rv.owner.inputs))
        with exact_math():  # the same code whether compiled here or loaded from the cache
            self._forward = pytensor.function(inputs, outputs, on_unused_input="ignore")

    @cached_property
    def logp_dlogp(self):
        """PyMC's ``ValueGradFunction`` of the model: (log density, gradient) of the raveled values of
        ``model.continuous_value_vars`` (compiled on first use; nutpie's engine never asks for it), compiled
        without fast math (:func:`~pgpgm.processes.exact_math`): PyMC's chains in this process
        and in later ones then run the same code, whether compiled or loaded from the cache."""
        with exact_math():
            func = self.model.logp_dlogp_function(ravel_inputs=True)
        func.trust_input = True
        return func

    def point(self, values: Mapping[str, float]) -> dict[str, np.ndarray]:
        """The value-space point of constrained ``values`` (one per free variable)."""
        out = self._forward(*[np.asarray(values[rv.name], dtype=rv.dtype) for rv in self.rvs])
        return {self.model.rvs_to_values[rv].name: np.asarray(u) for rv, u in zip(self.rvs, out)}

    def logp(self, values: Mapping[str, float]) -> float:
        moved = self.point(values)
        x = np.concatenate([np.ravel(moved[v.name]) for v in self.model.continuous_value_vars]).astype(np.float64)
        return float(self.logp_dlogp(x)[0])

    def off_support(self, values: Mapping[str, float]) -> frozenset[str]:
        """The names of the free variables whose constrained value in ``values`` has no finite
        transformed value: outside its prior's support, or on a bound the transform sends to infinity."""
        moved = self.point(values)
        return frozenset(rv.name for rv in self.rvs
                         if not np.all(np.isfinite(moved[self.model.rvs_to_values[rv].name])))


def dispersed_starts(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float], chains: int,
                     rng: np.random.Generator, scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    """``chains`` starting points around ``center`` (a value per free variable), each
    coordinate drawn from Normal(center, scale * sd) and kept where the model's log density
    is finite (redrawn with half the spread otherwise; the centre itself as a last resort). A
    coordinate drawn outside its prior's support (a centre on a bound of the box: half its draws) is
    mirrored about the centre, so that a centre on the bound - where the log density itself is not
    finite - is not the start of a chain ("Bad initial energy")."""
    names = [rv.name for rv in space.rvs]
    starts = []
    for _ in range(chains):
        point, s = dict(center), scale
        for _attempt in range(8):
            dev = {n: s * float(sd.get(n, 0.0)) * rng.standard_normal() for n in names}
            off = space.off_support({n: float(center[n]) + dev[n] for n in names})
            cand = {n: float(center[n]) + (-dev[n] if n in off else dev[n]) for n in names}
            if np.isfinite(space.logp(cand)):
                point = cand
                break
            s /= 2
        starts.append({n: np.asarray(point[n], float) for n in names})
    return starts


def continuing_starts(space: ValueSpace, post) -> list[dict[str, np.ndarray]]:
    """Each chain's last draw in ``post`` (chain, draw), as the start of the next round.

    A draw whose transformed value is not finite - a parameter far out on the log scale's soft wall
    comes back from it as exactly its upper bound in floating point (Lotka-Volterra x2 with large
    noise, seed 4: theta3 = 10.0 in Uniform(0, 10)), where PyMC's start is log(0): "Bad initial
    energy" and a failed fit - moves 1e-9 of the way towards the chain's mean, inside the box; the
    chain's per-variable median draw is the last resort."""
    names = [rv.name for rv in space.rvs]
    starts = []
    for c in range(post.sizes["chain"]):
        last = {n: np.asarray(post[n].values[c, -1], float) for n in names}
        if not np.isfinite(space.logp(last)):
            off = space.off_support(last)
            last = {n: last[n] + 1e-9 * (np.mean(post[n].values[c]) - last[n]) if n in off else last[n]
                    for n in names}
            if not np.isfinite(space.logp(last)):
                last = {n: np.asarray(np.median(post[n].values[c]), float) for n in names}
        starts.append(last)
    return starts


def seed_metric(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float],
                covariance: tuple[Sequence[str], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """The refinement's uncertainty carried to PyMC's transformed space by central differences of
    the transforms: ``(mean, matrix, dense)``, mean (d,) the transformed ``center`` of the model's d value
    variables (in ``model.value_vars`` order) and matrix (d, d) their covariance - dense when
    ``covariance`` = (names, (K, K) matrix) is finite (a banana-shaped posterior of correlated
    parameters then needs short trajectories from the first draw; ``dense`` True), else diagonal from ``sd``.
    Variables without an sd, or whose transform has no finite derivative at ``center`` (e.g. a refined
    value on a bound of its box), get variance 1 and, when their transformed centre is infinite, a mean
    just inside the box."""
    at = space.point(center)
    names, mean, du = [], [], []
    for v in space.model.value_vars:
        name = space.model.values_to_rvs[v].name
        sdv = float(sd.get(name, np.nan))
        h = 1e-4 * sdv if np.isfinite(sdv) and sdv > 0 else 1e-6 * max(abs(float(center[name])), 1.0)
        up, down = (float(space.point({**center, name: center[name] + s})[v.name]) for s in (h, -h))
        du.append((up - down) / (2 * h))
        names.append(name)
        # a centre on a bound of its box is infinite in the transformed space: the adaptation's running
        # mean starts just inside instead (an infinite one made numpy warn "invalid value" at every tuning
        # draw of the first window - PyMC discards that window's estimate, so only the warnings differ)
        mean.append(next((u for u in (float(at[v.name]), up, down) if np.isfinite(u)), 0.0))
    du = np.array(du)
    var = np.array([(d * float(sd[n])) ** 2 if np.isfinite(sd.get(n, np.nan)) and sd.get(n, 0) > 0 else 1.0
                    for n, d in zip(names, du)])
    var = np.where(np.isfinite(var), np.maximum(var, 1e-10), 1.0)  # a centre on a bound: no derivative there
    full = np.diag(var)
    if covariance is not None:
        cnames, cmat = list(covariance[0]), np.asarray(covariance[1], float)
        idx = [names.index(n) for n in cnames if n in names]
        sub = cmat[np.ix_([cnames.index(names[i]) for i in idx], [cnames.index(names[i]) for i in idx])]
        if idx and np.all(np.isfinite(sub)):
            seeded = full.copy()
            d = du[idx]
            seeded[np.ix_(idx, idx)] = d[:, None] * sub * d[None, :]
            if np.all(np.isfinite(seeded)) and np.all(np.linalg.eigvalsh(seeded) > 0):
                return np.array(mean), seeded, True
    return np.array(mean), full, False


def seeded_potential(space: ValueSpace, center: Mapping[str, float], sd: Mapping[str, float],
                     covariance: tuple[Sequence[str], np.ndarray] | None = None, weight: float = 10.0,
                     adapt: bool = True):
    """A mass-matrix adaptation for NUTS seeded with the refinement's uncertainty
    (:func:`seed_metric`) - or, with ``adapt=False``, that seed as a fixed mass matrix
    (``QuadPotentialFull`` / ``QuadPotentialDiag``: NUTS's tuning then adapts the step size only).
    A dense seed gives PyMC's full adaptation (weight ``weight`` on the seed), a diagonal one its
    diagonal adaptation."""
    mean, full, dense = seed_metric(space, center, sd, covariance)
    if dense:
        if not adapt:
            return QuadPotentialFull(full)
        with warnings.catch_warnings():  # PyMC flags the class as experimental; pgpgm chose it (tested)
            warnings.filterwarnings("ignore", "QuadPotentialFullAdapt is an experimental feature", UserWarning)
            return QuadPotentialFullAdapt(len(mean), mean, full, weight)
    var = np.diag(full).copy()
    return QuadPotentialDiagAdapt(len(mean), mean, var, weight) if adapt else QuadPotentialDiag(var)


#: :func:`run_nuts`'s engines: PyMC's NUTS in rounds, nutpie in whitened coordinates, or ``"auto"``
#: (nutpie where every value variable is a scalar, PyMC's rounds elsewhere: :func:`auto_sampler`)
NUTS_SAMPLERS = ("pymc", "nutpie", "auto")


def _may_extend(chains: int, draws: int) -> bool:
    """Whether step 4 may draw more than the ``draws`` per chain asked for (PyMC's further rounds, nutpie's
    longer run): not for one chain or fewer than ``2 * ESS_MIN`` draws in all - a short run asked for
    stays short."""
    return chains > 1 and chains * draws >= 2 * ESS_MIN


def auto_sampler(model: pm.Model) -> str:
    """The engine ``nuts_sampler="auto"`` (the default) runs on ``model``: ``"nutpie"`` (whitened by the
    refinement's Laplace approximation, :data:`pgpgm.posterior.nutpie_engine.ADAPTATION`) where every
    value variable is a scalar, else ``"pymc"`` (vector-valued variables, which the whitening does not
    cover; and wherever nutpie cannot be imported). :func:`pgpgm.fit_study` runs PyMC's rounds for a
    hierarchical model, whose population-sd funnel no Laplace approximation describes.

    Measured side by side on this project's slower VM (``benchmarks/RESULTS.md``, 2026-11-28): the 40
    published fits converged 31 times with nutpie in a median 30.0 s of step 4, 24 with PyMC's rounds
    in 54.0 s; issue 30's runaway cases (a 6-state repressilator, a 10-state chain, Lotka-Volterra x2
    with large noise, FitzHugh-Nagumo from a wrong optimum) each ended within 3.0x the main job's fit,
    the 10-state chain and the wrong optimum converged in 2 of 2 fits each (PyMC's rounds: 1 of 2 and 2
    of 2). nutpie compiles the model inside the budget; its callbacks are cached by the model's
    structure, so a later fit of the same structure pays 2-8 s, the first one 8-25 s."""
    return "nutpie" if _scalar_values(model) and _has_nutpie() else "pymc"


def _scalar_values(model: pm.Model) -> bool:
    """Whether every value variable of ``model`` is a scalar (what the whitening of nutpie's coordinates
    covers)."""
    return all(v.ndim == 0 for v in model.value_vars)


def _has_nutpie() -> bool:
    """Whether nutpie (a requirement of pgpgm, so absent only from an environment built without it) can be
    imported."""
    import importlib.util

    return importlib.util.find_spec("nutpie") is not None


#: the mass-matrix choices of :func:`run_nuts`'s first round
METRICS = ("adapt", "laplace")
#: the least share of a budget's seconds left for sampling when the time before it (``run_nuts(started=...)``:
#: building the model, compiling its solve) counts too
MIN_SAMPLING_SHARE = 0.25


@dataclass(frozen=True)
class PosteriorBudget:
    """How much step 4 (:func:`sample_posterior`) may spend before it returns what it has.

    Attributes
    ----------
    seconds : wall-clock seconds of sampling, all rounds together (None: no limit); in :func:`pgpgm.fit` they
        count from the start of step 4, building its model (its solve's compilation on a cold cache)
        included, with at least :data:`MIN_SAMPLING_SHARE` of them left to sampling
    gradient_evaluations : leapfrog steps (one ODE solve with sensitivities each) of all chains
        and rounds, tuning included (None: no limit); unlike seconds, it does not depend on the
        machine or its load. The default, 3000000, leaves the 60 s to bind on a 2-core machine
        (300000 stopped every published Lotka-Volterra fit after 33-58 s, short of convergence; with
        step 4's explicit solves 1000000 stopped Lotka-Volterra x2 with large noise at 53 s).
        Chains in waves (``cores < chains``) may exceed it by up to a quarter while the last wave's
        late-started chain catches up, and a wave's evaluations before its last chain started are
        not counted (see :class:`BudgetMeter`). Chains that run at once whose budget is spent before
        each has drawn (their processes' start) run on to their first draws, up to 1.5 times the
        seconds and 1.25 times the gradient evaluations

    The rounds loop sizes each further round to what is left (from the last round's seconds and
    leapfrog steps per iteration) and starts none that cannot run ``min(draws, 100)`` draws; inside a
    round, a callback of :func:`pymc.sample` stops the chains once either limit is spent (the
    draws made so far are kept). When it stops sampling, the result says so
    (``tree.attrs["pgpgm_budget"]``) and a :class:`~pgpgm.errors.ConvergenceWarning` names it.
    """

    seconds: float | None = 60.0
    gradient_evaluations: int | None = 3_000_000

    def __post_init__(self):
        for name in ("seconds", "gradient_evaluations"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating)
                                  or not np.isfinite(v) or v <= 0):
                raise DataError(f"posterior budget {name} must be a positive number or None, got {v!r}")

    @classmethod
    def of(cls, value) -> PosteriorBudget:
        """The budget a user gave: a :class:`PosteriorBudget`, a number of seconds (no limit on
        gradient evaluations), or None (no budget at all)."""
        if isinstance(value, PosteriorBudget):
            return value
        if value is None:
            return cls(None, None)
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise DataError(f"posterior_budget must be a number of seconds, a pgpgm.PosteriorBudget or None, "
                            f"got {value!r}")
        return cls(float(value), None)

    def describe(self) -> str:
        parts = ([f"{self.seconds:g} s"] if self.seconds is not None else []) + (
            [f"{self.gradient_evaluations} gradient evaluations"] if self.gradient_evaluations is not None else [])
        return " / ".join(parts) or "no limit"


#: a wave of chains (:func:`_sample_in_waves`) ends on its share only once its shortest chain has drawn
#: this fraction of its longest chain's iterations: PyMC, stopped, keeps the chains that maximise (chains
#: x shortest length), leaving out one with fewer than half the longest's; a process started 0.5 s late
#: on a loaded 2-core machine (a fast model: 380 iterations per second) lost its chain at the share alone
WAVE_BALANCE = 0.6
#: when the budget stops chains that run at once (or waves of them, :func:`join_waves`), chains behind
#: the longest are kept (the others cut to the shortest's iterations) when the shortest has drawn at
#: least this fraction of the longest's iterations; PyMC's own rule for a stopped call keeps the chains that maximise
#: (chains x shortest length), leaving out, of four chains, one with under 3/4 of the others' iterations:
#: a chain that ran slower (its process started late, or had less of a loaded machine's CPU, or its
#: trajectories were longer) was judged without, and R-hat lost what it would have said about it
KEEP_CHAINS = 0.25


class BudgetMeter:
    """What step 4 has spent of a :class:`PosteriorBudget` since it was made; as the ``callback`` of
    :func:`pymc.sample` it counts every iteration's leapfrog steps and stops the sampling (PyMC's
    ``KeyboardInterrupt`` convention: the draws made so far are returned) once the budget is spent.

    Chains that PyMC runs one after the other (one process) would leave the last chains undrawn; for
    them, :meth:`begin_round` gives every chain an equal share of what is left, and a chain that has
    used its share (and any time its predecessors left) ends, as PyMC ends the current chain only
    on ``KeyboardInterrupt`` there, and the next one starts. Chains run in waves (fewer processes
    than chains, :func:`_sample_in_waves`: one :func:`pymc.sample` call per wave) share it alike, a
    wave at a time (:meth:`begin_waves`, :meth:`begin_wave`): the callback's ``KeyboardInterrupt``
    ends the current wave's call. A wave's share of gradient evaluations is shared among its chains:
    the wave ends once *every* chain has used its part and has drawn at least ``WAVE_BALANCE`` times as
    many iterations as the wave's longest chain (PyMC, when stopped, leaves out a chain with fewer than
    half the longest's: a chain whose process started late, 0.5 s on a loaded 2-core machine, would be
    lost) - or, should one lag more than that, once the wave has used its share and half of what the
    later waves' shares would be (the last wave: half of its own share beyond the budget). A wave's
    share of seconds likewise ends once its chains are balanced, or once half of the later waves' time
    is spent too (the last wave ends with the budget): starting its processes may take most of a short
    share. A wave's gradient evaluations made before its last chain's first draw (its processes start
    one after the other: seconds apart on a loaded machine, thousands of gradients of a fast model) are
    its ``lag``: neither its cap nor the budget counts them, up to the wave's share (``late``: their
    sum), so that a chain started late is not left out for it. Chains the stop left out anyway are
    counted (``dropped``) and named in the warning."""

    def __init__(self, budget: PosteriorBudget):
        self.budget = budget
        self.start = time.perf_counter()
        self.gradients = 0
        self.exhausted = ""  # what ran out: "" (nothing), "seconds", "gradient evaluations"
        self.shares: tuple[int, float, float] | None = None  # parts, seconds, gradients at a round's start
        self.wave: int | None = None  # the wave running now (None: the shares are by chain)
        self.wave_gradients: dict[int, int] = {}  # the current wave's gradient evaluations by chain
        self.wave_start = 0  # gradient evaluations used when the current wave began
        self.overrun = 0.0  # gradient evaluations the last wave may use beyond the budget
        self.late = 0  # gradient evaluations of earlier waves made before their last chain started
        self.wave_lag: int | None = None  # the current wave's, once its last chain has started
        self.dropped = 0  # chains that a budget stop left out (PyMC drops the short ones)
        self.cut = ""  # what a sequential chain's (or a wave's) share ran out of (the round was cut short)
        self.stops = 0  # how many times the callback stopped sampling
        self.traces: dict[int, object] = {}  # the current call's chains' PyMC traces (the callback's trace=)
        self.call_chains = 0  # how many chains the current pymc.sample call (or wave) runs
        self.call_draws: dict[int, int] = {}  # the current call's iterations by chain
        self.first_draws: dict[int, float] = {}  # when (elapsed s) each chain of the current call first drew

    def begin_round(self, chains: int, sequential: bool) -> None:
        """Before a :func:`pymc.sample` call: with ``sequential`` chains, share the budget left among them."""
        self.shares = (chains, self.elapsed(), self.gradients) if sequential and chains > 1 else None
        self.wave, self.traces = None, {}
        self.call_chains, self.call_draws, self.first_draws = chains, {}, {}

    def begin_waves(self, waves: int) -> None:
        """Before a round of ``waves`` :func:`pymc.sample` calls: share the budget left among them, wave
        ``self.wave`` (set before each call) ending once (wave + 1) / waves of it is spent."""
        self.shares = (waves, self.elapsed(), self.gradients) if waves > 1 else None
        self.wave = 0

    def begin_wave(self, wave: int, chains: int) -> None:
        """Before wave ``wave`` (of :meth:`begin_waves`), which runs ``chains`` chains."""
        self.wave, self.wave_gradients, self.wave_start = wave, {}, self.gradients
        self.wave_lag, self.traces = None, {}
        self.call_chains, self.call_draws, self.first_draws = chains, {}, {}
        g = self.budget.gradient_evaluations
        last = self.shares is None or wave == self.shares[0] - 1
        self.overrun = 0.5 * (g + self.late - self.gradients) if last and g is not None else 0.0

    def end_waves(self) -> None:
        """After the last wave (and its :meth:`end_wave`): the shares, and the last wave's overrun, end."""
        self.wave, self.overrun, self.wave_lag = None, 0.0, None

    def end_wave(self) -> None:
        """After a wave: its lag is the later waves' to leave out."""
        self.late += self._lag()
        self.wave_lag = 0

    def _wave_share(self) -> float:
        """The current wave's share of gradient evaluations (what was left at its start when it is the
        last wave; infinite without a gradient budget)."""
        g = self.budget.gradient_evaluations
        if g is None:
            return np.inf
        if self.shares is None:
            return g + self.late - self.wave_start
        waves, _, g0 = self.shares
        return g0 + (self.wave + 1) / waves * (g - g0) + self.late - self.wave_start

    def _lag(self) -> int:
        """The current wave's gradient evaluations before its last chain's first draw, up to its share
        (0 outside waves); still growing while a chain has not started."""
        if self.wave is None:
            return 0
        lag = self.wave_lag if self.wave_lag is not None else self.gradients - self.wave_start
        return int(min(lag, max(self._wave_share(), 0.0)))

    @property
    def wave_draws(self) -> dict[int, int]:
        """The current wave's iterations (tuning included) by chain."""
        return self.call_draws

    def _balanced(self) -> bool:
        """Whether every chain of the current wave has drawn at least ``WAVE_BALANCE`` times the
        iterations of its longest chain (then a stop keeps them all)."""
        draws = [self.wave_draws.get(c, 0) for c in range(self.call_chains)]
        return min(draws) >= WAVE_BALANCE * max(draws)

    def _share_spent(self, chain: int) -> str:
        """What ``chain`` of a sequential round (or the current wave) has used its share of ("" when
        nothing): part c ends once (c + 1) / parts of what was left at the round's start is spent."""
        chains, t0, g0 = self.shares
        part = (min(chain if self.wave is None else self.wave, chains - 1) + 1) / chains
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        if s is not None:
            ends = t0 + part * (s - t0)  # where this part's time ends
            # a wave's time: once its chains are balanced, or half of the later waves' time is spent
            # too (the chain processes' start, several seconds, may take much of a short share)
            if self.elapsed() >= ends and (self.wave is None or self._balanced()
                                           or self.elapsed() >= ends + 0.5 * (s - ends)):
                return "seconds"
        if g is None:
            return ""
        end = g0 + part * (g - g0)  # where this part's share ends
        if self.wave is None:
            return "gradient evaluations" if self.gradients >= end else ""
        # a wave: each chain's part of what the wave had left at its start; every chain must use it,
        # and the chains be balanced (PyMC keeps them all); the earlier waves' lags are not counted
        end, g = end + self.late, g + self.late
        left = end - self.wave_start
        counts = self.wave_gradients
        each = all(counts.get(c, 0) >= left / self.call_chains for c in range(self.call_chains))
        # the later waves keep at least half of their shares; the last may overrun by half its own
        cap = end + (0.5 * (g - end) if g > end else self.overrun)
        used = self.gradients - self._lag()  # nor this wave's lag
        return "gradient evaluations" if (each and self._balanced()) or used >= cap else ""

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def seconds_left(self) -> float:
        return np.inf if self.budget.seconds is None else self.budget.seconds - self.elapsed()

    def gradients_left(self) -> float:
        g = self.budget.gradient_evaluations
        return np.inf if g is None else g + self.overrun + self.late + self._lag() - self.gradients

    def share_left(self, share: float) -> tuple[float, float]:
        """(seconds, gradient evaluations) left before ``share`` of the budget is spent (inf where it has no limit)."""
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        return (np.inf if s is None else share * s - self.elapsed(),
                np.inf if g is None else share * g - self.gradients)

    def check(self, ahead: float = 0.0) -> str:
        """What has run out now ("" when nothing has); remembered in ``exhausted``. ``ahead``: seconds
        that ending takes (e.g. reading the draws back), counted as spent already."""
        if not self.exhausted:
            self.exhausted = ("seconds" if self.seconds_left() <= ahead else
                              "gradient evaluations" if self.gradients_left() <= 0 else "")
        return self.exhausted

    def __call__(self, trace=None, draw=None):
        stats = getattr(draw, "stats", None)
        stats = stats[0] if isinstance(stats, list | tuple) and stats else stats
        chain = int(getattr(draw, "chain", 0))
        if isinstance(stats, Mapping):
            steps = int(stats.get("tree_size", 0) or 0)
            self.gradients += steps
            if self.wave is not None:
                self.wave_gradients[chain] = self.wave_gradients.get(chain, 0) + steps
        self.call_draws[chain] = self.call_draws.get(chain, 0) + 1
        self.first_draws.setdefault(chain, self.elapsed())
        if self.wave is not None and self.wave_lag is None and len(self.first_draws) == self.call_chains:
            self.wave_lag = self.gradients - self.wave_start  # the wave's last chain has started
        if trace is not None:
            self.traces[chain] = trace
        if self.check():
            if self._waits_for_chains():
                return
            self.stops += 1
            self._even_out()
            raise KeyboardInterrupt  # pm.sample ends the chains and returns what they drew
        spent = self._share_spent(chain) if self.shares is not None else ""
        if spent:
            self.cut = self.cut or spent
            self.stops += 1
            self._even_out()
            raise KeyboardInterrupt  # sequential chains: this one ends, the next one starts

    def _waits_for_chains(self) -> bool:
        """Whether a spent budget waits before it stops chains that run at once: while one of them has
        not drawn yet (its process is still starting: a budget shorter than the start kept 1 chain of 1
        draw), and then while the shortest has under ``KEEP_CHAINS`` of the longest's iterations, for as
        long again as the chains' first draws were apart (a chain that started late catches up to a
        quarter in a third of that; one that runs slower is not waited for) - never past 1.5 times the
        budget's seconds or 1.25 times its gradient evaluations."""
        if (self.shares is not None and self.wave is None) or self.call_chains < 2:
            return False
        s, g = self.budget.seconds, self.budget.gradient_evaluations
        now = self.elapsed()
        # the waves' late starts are not counted (as by their caps); the last wave's overrun is (counting it
        # out, a chain lagging in the last wave could be waited for up to 1.5 times the budget)
        counted = self.gradients - self.late - self._lag()
        if (s is not None and now >= 1.5 * s) or (g is not None and counted >= 1.25 * g):
            return False
        if len(self.first_draws) < self.call_chains:
            return True
        counts = self.call_draws.values()
        if min(counts) >= KEEP_CHAINS * max(counts):
            return False
        starts = self.first_draws.values()
        return now < 2 * max(starts) - min(starts)

    def _even_out(self) -> None:
        """Before a stop of chains that run at once: when the shortest has drawn at least ``KEEP_CHAINS``
        times the longest's iterations, the longer chains' traces end at its length, so that PyMC keeps
        every chain (its rule would leave the shorter out; see ``KEEP_CHAINS``). Chains run one after
        another (their shares) are left as they are."""
        if self.shares is not None and self.wave is None:
            return
        traces = [t for t in self.traces.values() if isinstance(getattr(t, "draw_idx", None), int)]
        if len(traces) < 2:
            return
        shortest = min(t.draw_idx for t in traces)
        if shortest >= KEEP_CHAINS * max(t.draw_idx for t in traces):
            for t in traces:
                t.draw_idx = shortest  # PyMC's NDArray trace: close() keeps the first draw_idx draws

    def record(self) -> dict:
        return {"seconds": self.budget.seconds, "gradient_evaluations": self.budget.gradient_evaluations,
                "used_seconds": round(self.elapsed(), 3), "used_gradient_evaluations": int(self.gradients),
                "exhausted": self.exhausted, "dropped_chains": self.dropped,
                "late_start_gradient_evaluations": int(self.late + self._lag())}


#: the step-size target of a further round is raised halfway to 1 (0.9 -> 0.95 -> 0.975 -> 0.9875) but
#: not above this: each raise shrinks the step size and lengthens every trajectory, and divergences that a
#: smaller step does not remove (a solver failure as -inf, a wall) made an uncapped target climb towards 1
#: round after round (FitzHugh-Nagumo R observed from a wrong mode: 0.99375 in round 5, step size 0.000,
#: 1023 leapfrog steps per draw, 846 s). A cap of 0.95 left Lotka-Volterra x1 observed (seed 0) with
#: 15 divergences after 6 rounds (332 s), where the ridge meets the prior bound; uncapped, its rounds had
#: passed (193 s): the later raises help there, so the cap is 0.99 and the budget bounds the rest.
TARGET_ACCEPT_MAX = 0.99
#: NUTS trees stop at 2^10 - 1 = 1023 leapfrog steps per draw (PyMC's default, stated here)
MAX_TREEDEPTH = 10
#: a further round is not started when the budget left allows fewer draws per chain than this (or
#: than ``draws``, when smaller)
MIN_ROUND_DRAWS = 100


#: a round's draws whose R-hat and ESS fail are extended by the next round (each chain continued from
#: its last draw, the draws judged together) - the first round's too, when its chains have met: max R-hat
#: at most this. Measured on 16 published fits (the 15 that missed R-hat or ESS in 60 s, and FHN V seed 4;
#: 2026-11-26, step-4 inputs captured from the default fit, side by side): carrying the first round's
#: draws and those of rounds with divergences (formerly both dropped: each such round started the count
#: again) passed 9 of 16 against 3 of 16 (PT S,R latent seed 2: round 1 ESS 300, round 2 alone 133
#: draws; LV x2 seed 2: R-hat 1.054 -> 1.003)
RHAT_CARRY = 1.05


#: most NUTS rounds of :func:`sample_posterior` (and :func:`pgpgm.fit`'s ``posterior_rounds``): a
#: posterior that spreads over the whole prior box (Lotka-Volterra, x2 observed, noise sd 0.5, seed 3)
#: mixes slowly (min ESS 60-400 per round of 4 x 2000 draws) and passed R-hat <= 1.01 in round 6
MAX_ROUNDS = 6

#: relative tolerance of step 4's ODE solves (:class:`pgpgm.NUTS` ``rtol``; the solver's atol is
#: kept). One gradient (states and sensitivities) at rtol 1e-6 against the solver's default 1e-8:
#: 1.4x (Lotka-Volterra), 1.7x (protein transduction), 2.1x (FitzHugh-Nagumo) cheaper, states within
#: 2e-5 and sensitivities within 6e-5 relative of a 1e-12 solve; a change of 1e-5 in a predicted
#: value moves the log likelihood by about 1e-5 (y - mu) / sigma^2 per point, far below a posterior
#: sd. The tolerance Stan's ODE solvers default to.
POSTERIOR_RTOL = 1e-6


def run_nuts(
    model: pm.Model,
    center: Mapping[str, float],
    sd: Mapping[str, float],
    *,
    covariance: tuple[Sequence[str], np.ndarray] | None = None,
    draws: int = 1000,
    tune: int = 1000,
    chains: int = 4,
    cores: int | None = None,
    seed: int | None = 0,
    nuts_sampler: str = "auto",
    target_accept: float = 0.9,
    max_rounds: int = MAX_ROUNDS,
    progressbar: bool = True,
    budget: PosteriorBudget | float | None = None,
    warn: bool = True,
    starts: Sequence[Mapping[str, float]] | None = None,
    metric: str = "adapt",
    started: float | None = None,
    ess: float = ESS_MIN,
    sd_error: float | None = SD_ERROR,
):
    """NUTS on ``model`` from around ``center`` (constrained values of its free variables), as
    :func:`sample_posterior` (which returns the draws alone); returns the :class:`NUTSRun`.

    Parameters
    ----------
    model : e.g. from :func:`build_ode_model`
    center, sd : the refined estimate and its standard errors, by variable name; chains
        start at draws from Normal(center, sd) (see :func:`dispersed_starts`) and the
        mass matrix starts from sd^2 carried to the transformed space - dense when
        ``covariance`` (names, matrix), e.g. the refinement's, is given and finite
        (see :func:`seeded_potential`)
    draws, tune, chains : per chain; cores : parallel processes (default min(chains, CPUs); with a
        time budget, ``chains``: every chain runs at once - the same draws, as the draws do not depend
        on the number of processes - so that a budget that stops them leaves every chain at the same
        length instead of the first CPUs' worth of chains done and the others not begun). Fewer
        processes than chains with a budget: the chains run in waves of ``cores``, each wave an equal
        share of the budget (what one leaves goes to the next; a wave ends once each of its chains has
        used its part and drawn at least 0.6 times as many iterations as its longest, so that a chain
        whose process started late is not cut short and left out; the last wave may use up to half its
        share beyond a gradient budget for that), the same draws as in one call
    seed : seeds the starts and the sampler
    nuts_sampler : ``"auto"`` (default: :func:`auto_sampler`), ``"nutpie"`` or ``"pymc"``
        (:data:`NUTS_SAMPLERS`). ``"nutpie"`` (:func:`pgpgm.posterior.nutpie_engine.sample_nutpie`): every
        chain a thread of this process, in coordinates whitened by the Laplace approximation of
        :func:`seed_metric` (where every value variable is a scalar), started within
        :data:`pgpgm.posterior.nutpie_engine.START_JITTER` whitened sds of ``center``, with nutpie's own
        adaptation (:data:`pgpgm.posterior.nutpie_engine.ADAPTATION`); instead of rounds, one run of up to
        ``draws * 2 ** (max_rounds - 1)`` draws per chain (``draws`` where PyMC's rounds would not run a
        second round: one chain, or fewer than ``2 * ESS_MIN`` draws in all) that ends once R-hat
        and ESS pass, the chains sit in separate modes, or the budget is spent - the same budget, result and
        warnings as ``"pymc"``. Where the draws that pass hold divergences and the budget left affords
        :data:`DIVERGENCE_RUN_COST` times that run, one more runs at :data:`TARGET_ACCEPT_MAX` (smaller steps, into
        the regions where the first diverged) and its draws replace the first's when they pass too (as PyMC's
        round for divergences does; not with ``max_rounds=1``): ``pgpgm_rounds`` = 2.
        ``tree.attrs["pgpgm_sampler"]`` names the engine that ran
    target_accept : NUTS step-size target of the first round
    max_rounds : with ``"pymc"``, run at most this many rounds of ``tune + draws`` per chain.
        After a round whose draws fail a check of :func:`pgpgm.posterior.diagnostics.problems`
        (R-hat > 1.01, ESS < 400, divergences), the next round continues every chain from
        its last draw with a fixed dense mass matrix, the covariance of the chains' draws so
        far (pooled, in the transformed space), a step-size target raised halfway to 1 but not
        above :data:`TARGET_ACCEPT_MAX` = 0.99 (fewer divergences; a target that kept climbing shrank the
        step size without bound), and ``max(tune // 2, 100)`` tuning iterations (step size only).
        Each chain alone adapts its mass matrix from its own few effective draws; pooled, the
        chains' draws cover a long ridge (the banana of Lotka-Volterra with one state
        observed) that none covers alone. A further round run because R-hat or ESS failed
        *extends* the chains: its draws are appended to those kept from the rounds before it
        (one continued Markov chain per chain, every kernel - each chain's own adapted one in
        round 1, the pooled one later - leaving the posterior invariant), and the checks judge
        all of them together, so a slowly mixing posterior accumulates ESS instead of starting
        over. Only the first round's draws are dropped when its chains have not met (max R-hat >
        :data:`RHAT_CARRY` = 1.05: draws on the way from the starts). Divergences are carried and
        counted (the warning names them); a round run because of divergences alone (R-hat and
        ESS pass) draws afresh at the raised target, and its draws replace the earlier ones only
        when they pass R-hat and ESS too. A round runs ``draws``
        to 4x ``draws`` iterations, as many as the kept draws' min ESS per draw says reach
        2 x 400 (:func:`next_round_draws`), and no more than the budget left allows. No further
        round runs when the chains sit in separate modes (:func:`pgpgm.posterior.diagnostics.find_modes`):
        a mass matrix pooled across modes fits neither; the modes are named instead.
        Default :data:`MAX_ROUNDS`.
        ``tree.attrs["pgpgm_rounds"]`` says how many rounds ran,
        ``json.loads(tree.attrs["pgpgm_round_draws"])`` the draws per chain of each round,
        ``json.loads(tree.attrs["pgpgm_kept_rounds"])`` the rounds (1 = first) whose draws the
        result holds, ``json.loads(tree.attrs["pgpgm_round_gradient_evaluations"])`` each
        round's leapfrog steps after tuning (one ODE solve with sensitivities each), and
        ``json.loads(tree.attrs["pgpgm_round_problems"])`` why further rounds ran: for every
        round followed by another, the failed checks of the draws kept up to it. Only when
        ``chains * draws >= 800`` (draws that could reach ESS 400) and ``chains > 1``. A posterior
        that converges in the first round (FitzHugh-Nagumo) costs nothing more.
    progressbar : PyMC's progress bar
    budget : a :class:`PosteriorBudget`, a number of seconds, or None (no limit: the default of
        this function; :func:`pgpgm.fit`'s default is ``PosteriorBudget()``, 60 s and 3000000
        gradient evaluations). ``json.loads(tree.attrs["pgpgm_budget"])`` records the budget, what
        was used and what ran out (``"exhausted"``: ``""``, ``"seconds"``, ``"gradient evaluations"``);
        a round the budget cut short keeps the draws it made (all chains at the length of the
        shortest; chains run one after the other (``cores=1``) each get an equal share of the budget; a round that stopped while tuning keeps the latter half of its tuning iterations,
        ``tree.attrs["pgpgm_tuning_draws"] = 1``).
    starts : (chains,) starting points, constrained values of every free variable by name, one per
        chain, instead of draws around ``center`` (e.g. chains started in several basins); PyMC's
        engine only (``"auto"`` then runs it)
    metric : the first round's mass matrix: ``"adapt"`` (default) starts from the refinement's
        covariance (see :func:`seeded_potential`) and adapts it from the chains' tuning draws (PyMC's
        windowed dense adaptation, weight 10 on the seed); ``"laplace"`` keeps that seed fixed and tunes
        the step size only, so that a short ``tune`` (e.g. 200) serves where the Laplace covariance fits
        the posterior (measured, benchmarks/RESULTS.md: fewer gradient evaluations per effective draw on
        Lotka-Volterra x2 and FitzHugh-Nagumo V observed; a posterior far from Gaussian at the optimum,
        e.g. one spread to a prior bound, needs ``"adapt"`` or the later rounds' pooled matrix)
    started : the :func:`time.perf_counter` time at which the work of this step began (e.g. before
        :func:`build_ode_model`, whose ODE solve compiles on a cold cache: 10-20 s): the budget's seconds count
        from it, but at least :data:`MIN_SAMPLING_SHARE` of them are left for sampling (default: now)
    warn : warn (:class:`~pgpgm.errors.ConvergenceWarning`) when the result fails the checks, the
        budget stopped it or the chains sit in separate modes (:func:`pgpgm.fit` passes False and
        warns once for the whole fit)
    ess : the bulk and tail ESS every variable must reach (default :data:`ESS_MIN`, 400): the chains go on
        (within the budget and ``max_rounds``) until it does. An sd's Monte Carlo error is about
        sd / sqrt(2 ESS) for a Gaussian posterior but grows with the tails' weight (kurtosis 14, Lotka-Volterra
        x1 observed with x2(0) unknown: ~10 % at ESS 400); ask for more where the sds must be sharper
    sd_error : once R-hat and ESS pass, the chains go on while some variable's sd has a Monte Carlo error
        (:func:`~pgpgm.posterior.diagnostics.sd_errors`) above this fraction of the sd (default
        :data:`~pgpgm.posterior.diagnostics.SD_ERROR`, 5 %) and the budget's :data:`SHARPEN_SHARE` (3/4)
        affords it (:class:`SharperSds`; PyMC's engine: one more round that extends the chains by the draws
        the errors ask for, as far as that share affords); a check that fails on the way ends it with the draws
        that passed. A Gaussian posterior's sds reach 5 % at ESS ~200, so only heavy tails draw more.
        ``json.loads(tree.attrs["pgpgm_sd_error"])``: the goal and each variable's error at the end. None: stop
        where R-hat and ESS pass

    Returns
    -------
    arviz DataTree with ``posterior``, ``sample_stats`` (``diverging``, ...), ``observed_data``;
    attrs as above and ``pgpgm_modes`` (JSON: a list, one entry per mode when the chains sit in
    more than one - ``chains``, ``mean`` by variable, ``log_density`` - else empty).
    """
    import os

    if nuts_sampler not in NUTS_SAMPLERS:
        raise DataError(f"nuts_sampler must be one of {NUTS_SAMPLERS}, got {nuts_sampler!r}")
    if not (isinstance(max_rounds, int | np.integer) and max_rounds >= 1):
        raise DataError(f"max_rounds must be a whole number >= 1, got {max_rounds!r}")
    if metric not in METRICS:
        raise DataError(f"metric must be one of {METRICS}, got {metric!r}")
    ess, sd_error = check_ess(ess), check_sd_error(sd_error)
    meter = BudgetMeter(PosteriorBudget.of(budget))
    if started is not None and meter.budget.seconds is not None:  # the model's building counts, up to a share
        meter.start = max(started, meter.start - (1.0 - MIN_SAMPLING_SHARE) * meter.budget.seconds)
    if cores is None:  # with a time budget every chain runs at once, so that a stop leaves all at the same length
        cores = chains if meter.budget.seconds is not None else min(chains, os.cpu_count() or 1)
    rng = np.random.default_rng(seed)
    space = ValueSpace(model)
    names = [rv.name for rv in space.rvs if rv.ndim == 0]
    common = dict(draws=draws, tune=tune, chains=chains, cores=cores, random_seed=seed, progressbar=progressbar,
                  compute_convergence_checks=False, model=model)
    if nuts_sampler == "auto":  # chains from given starts: PyMC's (nutpie starts every chain around one point)
        nuts_sampler = "pymc" if starts is not None else auto_sampler(model)
    if nuts_sampler == "nutpie" and starts is not None:
        raise DataError("starts (one point per chain) need nuts_sampler='pymc' or 'auto': nutpie starts every "
                        "chain around center")
    if nuts_sampler == "nutpie":  # a watched run until R-hat and ESS pass (one more for divergences) or the budget ends
        return _run_nutpie(model, center, sd, covariance, meter, space, names, draws=draws, tune=tune, chains=chains,
                           seed=seed, target_accept=target_accept, max_rounds=max_rounds, warn=warn, ess=ess,
                           sd_error=sd_error)
    if starts is None:
        starts = dispersed_starts(space, center, sd, chains, rng)
    else:
        free = [rv.name for rv in space.rvs]
        if len(starts) != chains or any(set(free) - set(p) for p in starts):
            raise DataError(f"starts must hold {chains} points (one per chain), each with a value of {free}")
        starts = [{n: np.asarray(p[n], float) for n in free} for p in starts]
    step = pm.NUTS(model=model, potential=seeded_potential(space, center, sd, covariance, adapt=metric == "adapt"),
                   target_accept=target_accept, max_treedepth=MAX_TREEDEPTH, logp_dlogp_func=space.logp_dlogp)
    t_round = time.perf_counter()
    tree = _budgeted_sample(meter, step=step, initvals=starts, **common)
    last, last_tune, seconds = tree, tune, time.perf_counter() - t_round  # the last round and its cost
    rounds, reasons, round_draws, kept = 1, [], [tree.posterior.sizes["draw"]], [1]
    evaluations = [_gradient_evaluations(tree)]
    passed = None  # (draws, kept rounds) that passed R-hat and ESS with divergences, while a round tries without
    sharpened = None  # (draws, kept rounds) that passed every check, while a round extends them for sharper sds
    while rounds < max_rounds and _may_extend(chains, draws) and not meter.exhausted:
        diag = diagnose(tree, names, ess)
        found = problems(diag)
        if find_modes(tree, names):  # more rounds would pool separate modes
            break
        worst = float(np.nanmax(diag["sd_error"].values, initial=0.0))
        if not found and (sd_error is None or not worst > sd_error or sharpened is not None):
            break  # converged (one round for sharper sds at most)
        least = float(np.nanmin(np.minimum(diag["ess_bulk"].values, diag["ess_tail"].values)))
        mixing = mixing_problems(diag)
        if found and not mixing:  # divergences only: a round at a higher target replaces these draws if it passes
            passed = (tree, kept)
        carry = not found or bool(mixing) and (rounds > 1 or bool(np.nanmax(diag["rhat"].values) <= RHAT_CARRY))
        n_kept = int(tree.posterior.sizes["draw"])
        n_draws = (next_round_draws(n_kept, least, draws, extends=carry, ess_min=ess) if found else
                   int(np.ceil(n_kept * ((worst / sd_error) ** 2 - 1))))  # the draws the sd errors ask for
        n_tune = max(tune // 2, 100)
        # what the budget left affords (for sharper sds: up to its SHARPEN_SHARE): the last round's seconds per
        # iteration (per chain) and leapfrog steps per iteration; a round that cannot reach MIN_ROUND_DRAWS
        # draws is not started
        iterations = max(int(last.sample_stats.sizes["draw"]) + last_tune, 1)
        steps = float(np.mean(last.sample_stats["n_steps"])) if "n_steps" in last.sample_stats else 1.0
        if found:
            left, grads_left = 0.9 * meter.seconds_left(), 0.9 * meter.gradients_left()
        else:
            left, grads_left = meter.share_left(SHARPEN_SHARE)
        by_time = left / max(seconds / iterations, 1e-9)
        by_gradients = grads_left / max(steps * chains, 1.0)
        affordable = min(by_time, by_gradients)
        if affordable - n_tune < min(draws, MIN_ROUND_DRAWS):
            if found:
                meter.exhausted = "seconds" if by_time <= by_gradients else "gradient evaluations"
            break
        if not found:
            sharpened = (tree, kept)
        n_draws = int(min(n_draws, affordable - n_tune))
        reasons.append(found or [f"sd errors up to {worst:.1%} (goal {sd_error:.0%})"])
        post = tree.posterior
        starts = continuing_starts(space, post)
        if found:  # (sharper sds alone: the same target)
            target_accept = max(target_accept, min(1.0 - (1.0 - target_accept) / 2, TARGET_ACCEPT_MAX))
        step = pm.NUTS(model=model, potential=QuadPotentialFull(pooled_covariance(space, post)),
                       target_accept=target_accept, max_treedepth=MAX_TREEDEPTH, logp_dlogp_func=space.logp_dlogp)
        t_round = time.perf_counter()
        more = _budgeted_sample(meter, step=step, initvals=starts,
                                **{**common, "draws": n_draws, "tune": n_tune, "chains": len(starts),
                                   "random_seed": None if seed is None else seed + 1000 * rounds})
        last, last_tune, seconds = more, n_tune, time.perf_counter() - t_round
        evaluations.append(_gradient_evaluations(more))
        rounds += 1
        round_draws.append(int(more.posterior.sizes["draw"]))
        if more.posterior.sizes["chain"] < post.sizes["chain"] or more.attrs.get("pgpgm_tuning_draws"):
            break  # cut short by the budget before every chain drew: the kept draws stay the result
        tree = extend_chains(tree, more) if carry else more
        kept = [*kept, rounds] if carry else [rounds]
    if passed is not None and mixing_problems(diagnose(tree, names, ess)):
        tree, kept = passed  # the round that was to remove the divergences did not pass R-hat and ESS
    if sharpened is not None:
        if problems(diagnose(tree, names, ess)) or find_modes(tree, names):
            tree, kept = sharpened  # the extension for sharper sds failed a check: the draws that passed
        meter.exhausted = ""  # a budget that ended it cut draws that had passed
    return _finish(tree, names, meter, rounds, round_draws, kept, evaluations, reasons, warn, "pymc", ess,
                   sd_error)


#: a nutpie run whose draws pass R-hat and ESS with divergences is followed by one run at
#: :data:`TARGET_ACCEPT_MAX` (PyMC's engine raises the target round by round), whose draws replace the first
#: run's when they pass too - where the budget left is at least this many times what the first run took (the
#: higher target's smaller steps cost 1.5-2.6x the leapfrog steps per draw: Lotka-Volterra x1 observed with
#: x2(0) unknown, 9.4 at 0.9, 14.2 at 0.95, 24.0 at 0.99). Measured there (4 x 6000 draws, 2026-11-30): 83, 46
#: and 12 divergences, theta1's sd 0.496, 0.567 and 0.642 against 0.707 from numpyro at 0.99 without a
#: divergence (4 x 10000): the draws at the adapted step size stop short of the tail that narrows along the ridge
DIVERGENCE_RUN_COST = 3.0


def _run_nutpie(model, center, sd, covariance, meter: BudgetMeter, space: ValueSpace, names: list[str], *,
                draws: int, tune: int, chains: int, seed: int | None, target_accept: float, max_rounds: int,
                warn: bool, ess: float, sd_error: float | None) -> NUTSRun:
    """:func:`run_nuts` with nutpie (its ``nuts_sampler="nutpie"``): one run until the draws pass R-hat and ESS
    (and then on while :class:`SharperSds` says so), the chains sit in separate modes or the budget is spent;
    then, where the draws that passed hold divergences and the budget affords it (:data:`DIVERGENCE_RUN_COST`),
    one more at :data:`TARGET_ACCEPT_MAX` whose draws replace them when they pass too."""
    start = {n: np.asarray(v, float) for n, v in center.items() if n in {rv.name for rv in space.rvs}}
    before = [0]  # gradient evaluations of the runs before this one

    def spent(steps: int, ahead: float = 0.0) -> bool:
        meter.gradients = before[0] + steps
        return bool(meter.check(ahead))

    last = {}  # the last check's draws and their diagnosis (read by converged and then by SharperSds)

    def diagnosed(so_far) -> xr.Dataset:
        if last.get("tree") is not so_far:
            last.update(tree=so_far, diag=diagnose(so_far, names, ess))
        return last["diag"]

    def converged(so_far) -> bool:
        return not mixing_problems(diagnosed(so_far)) or bool(find_modes(so_far, names))

    whiten = None
    if _scalar_values(model):  # the Laplace approximation whitens nutpie's coordinates
        mean, matrix, _ = seed_metric(space, center, sd, covariance)
        whiten = (mean, matrix)
    extends = _may_extend(chains, draws)  # more draws than asked for only where PyMC's rounds would run them

    def run(accept: float, seed_: int | None):
        t0 = time.perf_counter()
        # draws with divergences are followed by a run at TARGET_ACCEPT_MAX that replaces them: not sharpened
        sharper = None if sd_error is None or not extends else SharperSds(
            meter, sd_error, diagnosed=diagnosed, stop_at_divergences=lambda: (accept < TARGET_ACCEPT_MAX and max_rounds > 1
                                         and affords_rerun(time.perf_counter() - t0)))
        tree = sample_nutpie(model, start, draws=draws, tune=tune, chains=chains, seed=seed_,
                             target_accept=accept, max_treedepth=MAX_TREEDEPTH,
                             max_draws=draws * 2 ** (max_rounds - 1) if extends else draws, spent=spent,
                             converged=converged, whiten=whiten, seconds_left=meter.seconds_left, watched=names,
                             extend=sharper)
        if sharper is not None and sharper.went_on and meter.exhausted and "posterior" in tree.children \
                and not mixing_problems(diagnose(tree, names, ess)):
            meter.exhausted = ""  # the budget ended a run past draws that passed, which it returned
        return _kept_draws(tree, stopped=bool(meter.exhausted)), time.perf_counter() - t0  # stopped tuning: half

    def affords_rerun(seconds: float) -> bool:  # a run at TARGET_ACCEPT_MAX after one of these seconds
        return (not meter.exhausted and meter.seconds_left() >= DIVERGENCE_RUN_COST * seconds
                and meter.gradients_left() >= DIVERGENCE_RUN_COST * meter.gradients)

    tree, seconds = run(target_accept, seed)
    n = int(tree.posterior.sizes["draw"])
    diag = diagnose(tree, names, ess)
    found = problems(diag)
    divergences_alone = bool(found) and not mixing_problems(diag) and not find_modes(tree, names)
    if not (divergences_alone and affords_rerun(seconds) and target_accept < TARGET_ACCEPT_MAX and max_rounds > 1):
        return _finish(tree, names, meter, 1, [n], [1], [meter.gradients], [], warn, "nutpie", ess, sd_error)
    before[0] = first = meter.gradients
    again, _ = run(TARGET_ACCEPT_MAX, None if seed is None else seed + 1000)
    n_again = int(again.posterior.sizes["draw"])
    passes = not meter.exhausted and not mixing_problems(diagnose(again, names, ess)) and not find_modes(again, names)
    if not passes:  # the first run's draws, which passed R-hat and ESS, are the result: a budget that cut the run
        meter.exhausted = ""  # at the higher target did not cut them (their warning names the divergences)
    return _finish(again if passes else tree, names, meter, 2, [n, n_again], [2] if passes else [1],
                   [first, meter.gradients - first], [found], warn, "nutpie", ess, sd_error)


#: the share of a budget (its seconds and gradient evaluations) up to which step 4 goes on towards sharper sds
#: (:data:`~pgpgm.posterior.diagnostics.SD_ERROR`) once R-hat and ESS pass: a default fit that converged in
#: 20 s ends by 45 s of its 60, never at the budget
SHARPEN_SHARE = 0.75


class SharperSds:
    """Whether a run whose draws passed R-hat and ESS goes on to its next check: while some variable's sd has
    a Monte Carlo error above ``sd_error`` of the sd (:func:`~pgpgm.posterior.diagnostics.sd_errors`) and
    the budget's :data:`SHARPEN_SHARE` affords reaching that check at the pace of the draws so far. Draws with
    divergences are not sharpened where ``stop_at_divergences()`` (a run at a higher target will replace them); a
    check that fails (``None``) after one passed goes on while affordable; draws that passed as separate modes
    end it (``diagnosed``: the draws' :func:`~pgpgm.posterior.diagnostics.diagnose`, cached by the caller),
    the draws of the last check that passed being kept. The extension's end depends on the machine's speed
    only where the budget ends it. The :func:`~pgpgm.posterior.nutpie_engine.sample_nutpie` ``extend``
    callable."""

    def __init__(self, meter: BudgetMeter, sd_error: float, *, stop_at_divergences: Callable[[], bool],
                 diagnosed: Callable[[Any], xr.Dataset]):
        self.meter, self.sd_error = meter, float(sd_error)
        self.stop_at_divergences, self.diagnosed = stop_at_divergences, diagnosed
        self.last: tuple[float, int, int] | None = None  # (seconds, gradient evaluations, draws) at the last call
        self.went_on = False  # whether it went on past draws that passed

    def __call__(self, so_far, at: int, following: int) -> bool:
        now, grads = self.meter.elapsed(), self.meter.gradients
        # the pace since the last call (the first: none known - the run's time holds its compilation - so it
        # goes on to the next check, GROWTH^(1/2) ~ 1.12x the draws, where the pace is measured)
        pace = (0.0, 0.0) if self.last is None else (
            (now - self.last[0]) / max(at - self.last[2], 1), (grads - self.last[1]) / max(at - self.last[2], 1))
        self.last = (now, grads, at)
        if so_far is not None:
            diag = self.diagnosed(so_far)
            if mixing_problems(diag):
                return False  # passed as separate modes: named, not sharpened
            if not np.nanmax(diag["sd_error"].values, initial=0.0) > self.sd_error:
                return False
            if diag.attrs["divergences"] and self.stop_at_divergences():
                return False
        ahead, (seconds_left, gradients_left) = following - at, self.meter.share_left(SHARPEN_SHARE)
        affords = pace[0] * ahead <= seconds_left and pace[1] * ahead <= gradients_left
        self.went_on = self.went_on or affords
        return affords


def _budgeted_sample(meter: BudgetMeter, **kwargs):
    """:func:`pymc.sample` with ``meter`` as its callback; the tuning iterations are kept in the
    sampler and dropped here, so that a run the budget stopped while tuning still returns draws (the
    latter half of its tuning iterations, ``attrs["pgpgm_tuning_draws"] = 1``). With a budget and
    fewer processes than chains (``1 < cores < chains``), the chains run in waves of ``cores``
    (:func:`_sample_in_waves`), each wave a share of the budget."""
    chains, cores = int(kwargs["chains"]), int(kwargs["cores"])
    limited = meter.budget.seconds is not None or meter.budget.gradient_evaluations is not None
    if limited and 1 < cores < chains:
        return _sample_in_waves(meter, **kwargs)
    meter.begin_round(chains, sequential=cores == 1)
    stops = meter.stops
    # in this process (cores=1) the chains run the code compiled here: without fast math, the same code
    # as a later process loads from the cache; chain processes always load it (exact_math)
    with exact_math() if cores == 1 else contextlib.nullcontext():
        tree = sample_in_processes(pm.sample, callback=meter, discard_tuned_samples=False, **kwargs)
    meter.exhausted = meter.exhausted or meter.cut  # a chain cut at its share: the budget stopped this round
    tree = _kept_draws(tree, stopped=meter.stops > stops)
    meter.dropped += chains - int(tree.posterior.sizes["chain"])
    return tree


def _kept_draws(tree, stopped: bool = True):
    """The draws of a :func:`pymc.sample` tree made with the tuning iterations kept: its draws after
    tuning, or, when it stopped while tuning, the latter half of its tuning iterations
    (``attrs["pgpgm_tuning_draws"] = 1``) - and also when it stopped just after tuning, with fewer
    draws than that half: then that half and the draws (Lotka-Volterra x2 observed, large noise, seed
    3: a 60 s budget stopped 1 draw after 500 tuning iterations, leaving 1 draw per chain and no
    diagnostics). ``stopped``: whether the budget stopped it (else its draws are kept however few)."""
    n_post = tree.posterior.sizes.get("draw", 0) if "posterior" in tree.children else 0
    n_tune = tree["warmup_posterior"].sizes.get("draw", 0) if "warmup_posterior" in tree.children else 0
    out = xr.DataTree()
    if n_post >= n_tune - n_tune // 2 or (n_post and not stopped):
        out["posterior"], out["sample_stats"] = tree["posterior"], tree["sample_stats"]
    else:  # stopped while or just after tuning: the latter half of the tuning iterations (and the draws)
        for group in ("posterior", "sample_stats"):
            parts = [tree[f"warmup_{group}"].to_dataset().isel(draw=slice(n_tune // 2, None))]
            if n_post:
                parts.append(tree[group].to_dataset())
            part = xr.concat(parts, dim="draw", data_vars="all", coords="minimal", compat="override", join="outer",
                             combine_attrs="override") if len(parts) > 1 else parts[0]
            out[group] = xr.DataTree(part.assign_coords(draw=np.arange(part.sizes["draw"])))
        out.attrs["pgpgm_tuning_draws"] = 1
    for name, child in tree.children.items():
        if not name.startswith("warmup_") and name not in out.children:
            out[name] = child
    out.attrs = {**tree.attrs, **out.attrs}
    return out


def chain_seeds(seed: int | None, first: int):
    """The ``random_seed`` of :func:`pymc.sample` that gives its chains 0, 1, ... the random streams
    that ``pymc.sample(random_seed=seed)`` gives its chains ``first``, ``first + 1``, ... (PyMC spawns
    one child of ``numpy.random.SeedSequence(seed)`` per chain: a sequence that has spawned ``first``
    children already spawns those next), so that chains sampled in waves draw as in one call."""
    if seed is None or first == 0:
        return seed
    return np.random.default_rng(np.random.SeedSequence(int(seed), n_children_spawned=int(first)))


def _sample_in_waves(meter: BudgetMeter, **kwargs):
    """:func:`_budgeted_sample` of ``chains`` chains on ``cores`` < ``chains`` processes: one
    :func:`pymc.sample` call per wave of ``cores`` chains (the last may be smaller), each started with
    its chains' own starting points and random streams (:func:`chain_seeds`: the draws are those of
    one call), each ending once its share of the budget is spent (:meth:`BudgetMeter.begin_waves`).
    PyMC's own scheduling of more chains than processes in one call starts a chain when another
    ends, so that a budget stop there leaves the last chains undrawn.

    Returns the waves' draws joined by :func:`join_waves`."""
    chains, cores, seed = int(kwargs["chains"]), int(kwargs["cores"]), kwargs.get("random_seed")
    initvals = kwargs.get("initvals")
    waves = [list(range(i, min(i + cores, chains))) for i in range(0, chains, cores)]
    meter.begin_waves(len(waves))
    parts = []
    for w, idx in enumerate(waves):
        if w and meter.check():  # the first wave runs (a budget spent before it: its first draws)
            break
        meter.begin_wave(w, len(idx))
        args = {**kwargs, "chains": len(idx), "cores": len(idx), "random_seed": chain_seeds(seed, idx[0]),
                "initvals": None if initvals is None else [initvals[i] for i in idx]}
        stops = meter.stops
        tree = sample_in_processes(pm.sample, callback=meter, discard_tuned_samples=False, **args)
        parts.append(_kept_draws(tree, stopped=meter.stops > stops))
        meter.end_wave()
    meter.end_waves()
    meter.exhausted = meter.exhausted or meter.cut
    tree = join_waves(parts)
    meter.dropped += chains - int(tree.posterior.sizes["chain"])
    return tree


def join_waves(parts: Sequence):
    """The draws of :func:`_sample_in_waves`'s waves (``parts``: the trees of :func:`_kept_draws`, in
    wave order) as one tree: chains joined along ``chain`` (renumbered 0, 1, ...), every chain cut to
    the shortest. Waves stopped while tuning are left out when another wave has draws after tuning; of
    the rest, a wave is kept when it has at least ``KEEP_CHAINS`` times the longest wave's draws, as
    chains stopped together are kept (:meth:`BudgetMeter._even_out`): a wave stopped after 1 draw (its
    share spent while its processes started) is left out rather than cutting the others to 1 draw, and
    a wave shorter than another for a slower process (a loaded 2-core machine: wave 0's second chain
    ran 1.8x slower, wave 0 used its share and half of wave 1's, and wave 1 drew 271 draws to wave 0's
    740) is kept - PyMC's rule, maximising chains x shortest length, had left out its chains, and R-hat
    what they would have said."""
    sampled = [p for p in parts if not p.attrs.get("pgpgm_tuning_draws")]
    keep = sampled or list(parts)
    longest = max(int(p.posterior.sizes["draw"]) for p in keep)
    keep = [p for p in keep if int(p.posterior.sizes["draw"]) >= KEEP_CHAINS * longest]
    if len(keep) == 1:
        return keep[0]
    n = min(p.posterior.sizes["draw"] for p in keep)
    out = keep[0].copy()
    for group in ("posterior", "sample_stats"):
        joined = xr.concat([p[group].to_dataset().isel(draw=slice(0, n)) for p in keep], dim="chain",
                           data_vars="all", coords="minimal", compat="override", join="outer",
                           combine_attrs="override")
        out[group] = xr.DataTree(joined.assign_coords(chain=np.arange(joined.sizes["chain"])))
    return out


@dataclass(frozen=True)
class NUTSRun:
    """Step 4's outcome: the draws, and how the rounds went.

    tree : the posterior (see :func:`sample_posterior`); rounds : how many NUTS rounds ran;
    round_draws : (rounds,) draws per chain of each; kept : the rounds (1 = first) whose draws
    ``tree`` holds; gradient_evaluations : (rounds,) each round's; problems : why each further round
    ran (the failed checks of :func:`~pgpgm.posterior.diagnostics.problems`); budget : what the
    :class:`PosteriorBudget` allowed and what was used (:meth:`BudgetMeter.record`); modes : the
    separate modes the chains sit in (:func:`~pgpgm.posterior.diagnostics.find_modes`; empty for one).
    The same facts are in ``tree.attrs`` (``pgpgm_rounds`` ...) so that a saved result keeps them.
    """

    tree: Any
    rounds: int
    round_draws: tuple[int, ...]
    kept: tuple[int, ...]
    gradient_evaluations: tuple[int, ...]
    problems: tuple
    budget: Mapping
    modes: tuple[Mode, ...]


def _finish(tree, names, meter: BudgetMeter, rounds, round_draws, kept, evaluations, reasons, warn: bool,
            engine: str, ess: float, sd_error: float | None) -> NUTSRun:
    """The :class:`NUTSRun`, its facts also recorded in ``tree.attrs``; warns when asked."""
    modes = find_modes(tree, names)
    drawn = "posterior" in tree.children and tree.posterior.sizes.get("draw", 0) > 3
    diag = diagnose(tree, names, ess) if drawn or warn else None
    errors = diag["sd_error"].values if drawn else np.full(len(names), np.nan)
    tree.attrs["pgpgm_sd_error"] = json.dumps({"goal": sd_error, "errors": dict(zip(names, map(float, errors)))})
    tree.attrs["pgpgm_sampler"] = engine
    tree.attrs["pgpgm_rounds"] = rounds
    tree.attrs["pgpgm_round_draws"] = json.dumps(round_draws)
    tree.attrs["pgpgm_kept_rounds"] = json.dumps(kept)
    tree.attrs["pgpgm_round_gradient_evaluations"] = json.dumps(evaluations)
    tree.attrs["pgpgm_round_problems"] = json.dumps(reasons)
    tree.attrs["pgpgm_budget"] = json.dumps(meter.record())
    tree.attrs["pgpgm_modes"] = json.dumps([m.record() for m in modes])
    if warn:
        warn_if_unconverged(diag, "NUTS", notes=posterior_notes(tree), stacklevel=4)
        if not mixing_problems(diag):
            warn_if_imprecise(tree, stacklevel=4)
    return NUTSRun(tree, rounds, tuple(round_draws), tuple(kept), tuple(map(int, evaluations)), tuple(reasons),
                   meter.record(), tuple(modes))


def sample_posterior(model, center, sd, **kwargs):
    """NUTS on ``model`` from around ``center``: the draws of :func:`run_nuts`, which takes the same
    arguments (an ArviZ DataTree; its ``Returns``)."""
    return run_nuts(model, center, sd, **kwargs).tree


sample_posterior.__signature__ = inspect.signature(run_nuts)


def warn_if_imprecise(tree, label: str = "NUTS", stacklevel: int = 3) -> None:
    """Warn (:class:`~pgpgm.errors.PrecisionWarning`) naming every variable whose posterior sd has a Monte
    Carlo error above the goal recorded in ``tree.attrs["pgpgm_sd_error"]`` (:func:`run_nuts`'s ``sd_error``;
    none recorded or a goal of None: no warning). For draws that passed R-hat and ESS (the callers check)."""
    record = json.loads(tree.attrs.get("pgpgm_sd_error", "{}"))
    goal, errors = record.get("goal"), record.get("errors", {})
    over = sorted(((e, n) for n, e in errors.items() if goal is not None and np.isfinite(e) and e > goal),
                  reverse=True)
    if not over:
        return
    named = ", ".join(f"{n} ({e:.1%})" for e, n in over)
    warnings.warn(f"the {label} posterior's sds of {named} are known less precisely than sd_error={goal:g} asks "
                  f"(Monte Carlo error over the sd; R-hat and ESS hold): the chains go on for sharper sds within "
                  f"{SHARPEN_SHARE:.0%} of the budget and up to their most draws, and draws with divergences are not "
                  "extended. The error falls as 1/sqrt(draws): a larger posterior_budget or more draws sharpen them "
                  "(heavy-tailed marginals need the most); NUTS(sd_error=None) stops once R-hat and ESS pass.",
                  PrecisionWarning, stacklevel=stacklevel)


def posterior_notes(tree) -> list[str]:
    """Plain-language notes on a step-4 posterior beyond R-hat, ESS and divergences: the budget
    that stopped it (what ran out, what was used, what to try) and the separate modes its chains
    sit in (from ``tree.attrs``, see :func:`sample_posterior`)."""
    out = []
    spent = json.loads(tree.attrs.get("pgpgm_budget", "{}"))
    if spent.get("exhausted"):
        limit = PosteriorBudget(spent.get("seconds"), spent.get("gradient_evaluations"))
        more = PosteriorBudget(None if limit.seconds is None else 4 * limit.seconds,
                               None if limit.gradient_evaluations is None else 4 * limit.gradient_evaluations)
        out.append(f"step 4 stopped at its budget ({spent['exhausted']} ran out: {spent['used_seconds']:.0f} s and "
                   f"{spent['used_gradient_evaluations']} gradient evaluations used of {limit.describe()}) after "
                   f"{tree.attrs.get('pgpgm_rounds', 1)} round(s)"
                   + (", while tuning (these draws are tuning iterations)" if tree.attrs.get("pgpgm_tuning_draws")
                      else "")
                   + (f"; it stopped {spent['dropped_chains']} chain(s) before they had drawn a quarter as much "
                      "as the others (they ran slower or started late), and they were left out"
                      if spent.get("dropped_chains") else "")
                   + f"; these draws are what it had. Try posterior_budget=pgpgm.PosteriorBudget({more.seconds!r}, "
                   f"{more.gradient_evaluations!r}), posterior='laplace' (seconds), or check the model and its "
                   "priors (a posterior that is hard to sample often has a second mode or a wall)")
    modes = json.loads(tree.attrs.get("pgpgm_modes", "[]"))
    if len(modes) > 1:
        out.append(modes_note(modes))
    return out


#: a further round aims at this multiple of ESS_MIN: R-hat and ESS are themselves noisy near the
#: thresholds (FitzHugh-Nagumo V observed, seed 4: rounds of 500-750 draws with min ESS 412-622
#: failed R-hat <= 1.01 or tail ESS >= 400 by chance three times in a row, 1.0101 / 372 / 1.0142,
#: and a fourth round passed with 1.0036)
ROUND_ESS_MARGIN = 2.0


def next_round_draws(last_draws: int, last_ess: float, draws: int, extends: bool = False,
                     ess_min: float = ESS_MIN) -> int:
    """Draws per chain of a further round of :func:`sample_posterior`: the min ESS per draw of the
    last ``last_draws`` draws per chain carried to ``ROUND_ESS_MARGIN x ess_min`` - less those
    draws when the round ``extends`` them (a round after the second whose kept draws have no
    divergence) - between ``draws`` and
    ``4 * draws`` (measured on LV x1 large noise, seed 1: a round of 2000 draws failed by one
    divergence only, and a next round of just ``draws`` = 500 then fell short of the ESS)."""
    want = last_draws * ROUND_ESS_MARGIN * ess_min / max(float(last_ess), 1.0) - (last_draws if extends else 0)
    return int(np.ceil(np.clip(want, draws, 4 * draws * max(ess_min / ESS_MIN, 1.0))))


def _gradient_evaluations(tree) -> int:
    """Leapfrog steps (one ODE solve with sensitivities each) of the draws of ``tree``."""
    return int(tree.sample_stats["n_steps"].sum()) if "n_steps" in tree.sample_stats else 0


def extend_chains(tree, more):
    """``more`` (a DataTree from :func:`pymc.sample`) with the draws of ``tree`` before its own:
    ``posterior`` and ``sample_stats`` joined along ``draw`` (renumbered 0, 1, ...), chain by
    chain; ``more``'s other groups and attributes. ``more`` must continue ``tree``'s chains
    (each chain started at ``tree``'s last draw of that chain)."""
    out = more.copy()
    for group in ("posterior", "sample_stats"):
        joined = xr.concat([tree[group].to_dataset(), more[group].to_dataset()], dim="draw",
                           data_vars="all", coords="minimal", compat="override", join="exact",
                           combine_attrs="override")
        out[group] = xr.DataTree(joined.assign_coords(draw=np.arange(joined.sizes["draw"])))
    return out


def pooled_covariance(space: ValueSpace, posterior, max_points: int = 2000) -> np.ndarray:
    """(K, K) covariance of the draws of every chain in ``posterior`` in PyMC's transformed
    (value) space, in the order of ``space.model.value_vars``, shrunk towards 1e-3 I as
    Stan does (n / (n + 5) C + 1e-3 5 / (n + 5) I) so that it stays positive definite. Draws whose
    transformed value is not finite (a parameter on the log scale's soft wall that came back as
    exactly its bound, see :func:`continuing_starts`) are left out."""
    names = [space.model.values_to_rvs[v].name for v in space.model.value_vars]
    vals = {n: np.asarray(posterior[n].values, float).reshape(-1) for n in names}
    n_all = vals[names[0]].size
    keep = np.unique(np.linspace(0, n_all - 1, min(n_all, max_points)).astype(int))
    U = np.array([[float(pt_[v.name]) for v in space.model.value_vars]
                  for pt_ in (space.point({n: vals[n][i] for n in names}) for i in keep)])
    U = U[np.all(np.isfinite(U), axis=1)]
    n = U.shape[0]
    return n / (n + 5.0) * np.atleast_2d(np.cov(U.T)) + 1e-3 * 5.0 / (n + 5.0) * np.eye(U.shape[1])


def laplace_posterior(dense: Integrator, ref, *, draws: int = 2000, seed: int | None = 0):
    """Draws from the Gaussian approximation N(q_hat, q_covariance) at the refined optimum.

    q are the refinement's unknowns: the parameters and the refined initial values (observed
    states' with ``refine_x0``, unknown latent ones); they are drawn jointly, so a draw's
    trajectories start from its own initial values.

    Parameters
    ----------
    dense : Integrator on the plotting grid (D,); every draw's states are solved on it
    ref : the :class:`~pgpgm.refinement.least_squares.Refinement` (``q`` (Q,), ``q_names`` (Q,), ``q_covariance``
        (Q, Q), ``x0`` (S,))
    draws : number of draws (one chain)

    Returns
    -------
    arviz DataTree with ``posterior``: every parameter and every refined initial value
    (``<state>_0``) (chain, draw), every state (chain, draw, time_dense); a failed solve
    leaves NaN states.
    """
    from arviz_base import from_dict
    cov = np.asarray(ref.q_covariance, float)
    if not np.all(np.isfinite(cov)):
        raise DataError("the refinement covariance is not finite (some parameters are not determined by the data); "
                        "use posterior='nuts'")
    system = dense.system
    P = sum(not name.startswith("x0[") for name in ref.q_names)  # the parameters, then "x0[state]"
    free = [system.states.index(name[3:-1]) for name in ref.q_names[P:]]
    rng = np.random.default_rng(seed)
    q = rng.multivariate_normal(ref.q, cov, size=draws, method="eigh")
    x0 = np.tile(np.asarray(ref.x0, float), (draws, 1))
    x0[:, free] = q[:, P:]
    X = np.full((draws, dense.times.size, system.n_states), np.nan)
    for k in range(draws):
        try:
            X[k] = dense.solve(q[k, :P], x0[k])
        except ODESolveError:
            pass
    post = {p: q[None, :, j] for j, p in enumerate(system.parameters)}
    post.update({initial_value_name(system.states[i]): x0[None, :, i] for i in free})
    post.update({s: X[None, :, :, i] for i, s in enumerate(system.states)})
    tree = from_dict({"posterior": post}, coords={"time_dense": dense.times},
                        dims={s: ["time_dense"] for s in system.states})
    tree.attrs["pgpgm_posterior"] = "laplace"
    return tree


def log_scale_names(priors: Priors) -> tuple[str, ...]:
    """The parameters to sample on the log scale (see :func:`build_ode_model`): every one with a
    Uniform(0, upper) prior.

    Measured on the published Lotka-Volterra cases (20 fits, ``benchmarks/RESULTS.md``): a rule that
    kept on the log-odds scale the parameters whose estimate + 6 standard errors reached the bound left
    exactly the posteriors that spread towards the bound there, where the log-odds scale bends the
    straight log-scale ridge (LV x1 observed, seed 3: R-hat 1.16, ESS 12 after 300000 gradient
    evaluations); on the log scale, whose soft wall meets the bound smoothly, the same fit reached R-hat
    1.008, ESS 343. A posterior cut by the bound samples without divergences there
    (``tests/test_posterior.py``)."""
    return tuple(name for name, spec in zip(priors.names, priors.specs)
                 if not callable(spec) and spec[0] == 0.0 and np.isfinite(spec[1]))

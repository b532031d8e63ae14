"""Step 4's model: the ODE model of the data as a ``pm.Model`` (:func:`build_ode_model`), its variables' names
and the scales its parameters are sampled on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from ..data import Observations, as_observations, initial_value_priors, initial_values
from ..errors import DataError
from ..noise import NOISE_MODELS
from ..observables import Observables
from ..ode.system import ODESystem
from ..priors import Priors, PriorSpec
from ..solve import Integrator, Solver
from ..solve.op import ODEOp

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
#: errors of 0 (:func:`positive_initial_values`): where the posterior reaches towards 0, the state's own
#: scale meets the wall at 0 with thousands of divergences and the log scale with none. Farther out the
#: state's own scale serves (a value many standard errors from 0 can need ~3x the draws to converge on the
#: log scale)
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
    indexing by an array (seconds less for step 4's model of a new grid)."""
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


def log_scale_names(priors: Priors) -> tuple[str, ...]:
    """The parameters to sample on the log scale (see :func:`build_ode_model`): every one with a
    Uniform(0, upper) prior.

    Not the log-odds scale for the parameters whose posterior reaches the upper bound: a rule that kept
    them there (estimate + 6 standard errors past the bound) kept exactly the posteriors that spread towards
    the bound, where the log-odds scale bends a ridge that is straight on the log scale, and NUTS did not
    converge on them; on the log scale, whose soft wall meets the bound smoothly, the same posteriors do.
    A posterior cut by the bound samples without divergences there (``tests/test_posterior.py``)."""
    return tuple(name for name, spec in zip(priors.names, priors.specs)
                 if not callable(spec) and spec[0] == 0.0 and np.isfinite(spec[1]))

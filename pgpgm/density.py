"""Step 2a: the partial-observation gradient-matching density as a PyMC model.

    log p(x_M, theta | y) = log p(theta)
        - 1/2 sum_k (x_k - mu_k)^T C_k^-1 (x_k - mu_k)                    "gp_prior"
        + sum_k log N(y_k | x_k, sigma_k^2 I)                              "y_<state>"
        - 1/2 sum_k r_k^T (A_k + gamma I)^-1 r_k,  r_k = f_k - D_k (x_k - mu_k)
                                                                           "gradient_matching"

with f evaluated on the observed states x_M and the latent states
x_L(theta, x0) integrated by CVODE (exposed as Deterministics). Additive constants
are dropped. With no latent state the model is exactly FGPGM and no ODE is solved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import xarray as xr

from .errors import DataError
from .gp.fit import GPFit, GradientMatching, fit_gp, gradient_matching
from .data import Observations, as_observations
from .solve.base import SolverOptions
from .solve.op import ODEOp
from .ode.system import ODESystem

PriorSpec = tuple[float, float] | Callable[[str], pt.TensorVariable]


@dataclass(frozen=True)
class DensitySetup:
    """Everything the density and the sampler share (attached to the model as ``model.pgpgm``).

    Attributes
    ----------
    system, obs : the ODE system and the data
    observed_idx, latent_idx : state indices of x_M and x_L
    latent : names of the latent states
    x0 : (S,) initial values; entries of observed states are NaN (they come from x_M)
    gp : fitted GP per observed state; gm : gradient-matching matrices per observed state
    noise_sd : (M,) observation noise sd; gamma : mismatch variance
    grad_precision : (M, N, N) (A_k + gamma I)^-1
    op : the ODE Op (None without latent states)
    """

    system: ODESystem
    obs: Observations
    observed_idx: tuple[int, ...]
    latent_idx: tuple[int, ...]
    latent: tuple[str, ...]
    x0: np.ndarray
    gp: tuple[GPFit, ...]
    gm: tuple[GradientMatching, ...]
    noise_sd: np.ndarray
    gamma: float
    grad_precision: np.ndarray
    op: ODEOp | None
    kernel: str
    prior_bounds: np.ndarray | None  # (P, 2) when every prior is a bounded Uniform
    compiled: dict = field(default_factory=dict, repr=False, compare=False)  # compiled functions, by model layout

    def gp_posterior_means(self) -> np.ndarray:
        """GP-smoothed observed states (N, M), the sampler's starting values."""
        t = self.obs.times
        return np.column_stack([g.posterior_mean(t, self.obs.values[:, m]) for m, g in enumerate(self.gp)])

    def initial_point(self, theta) -> dict[str, np.ndarray]:
        """A start for any PyMC sampler: theta (P,) and the GP-smoothed observed states
        (pass it as ``pm.sample(initvals=...)``; the model sets no initial values itself
        so that PyMC's model transformations stay available)."""
        start = self.gp_posterior_means()
        point = {p: np.asarray(v, float) for p, v in zip(self.system.parameters, theta)}
        point.update({s: start[:, m] for m, s in enumerate(self.obs.states)})
        return point


def _prior(name: str, spec: PriorSpec | None) -> pt.TensorVariable:
    if spec is None:
        spec = (0.0, 10.0)
    if callable(spec):
        return spec(name)
    lo, hi = map(float, spec)
    if not lo < hi:
        raise DataError(f"prior bounds of {name} must satisfy lower < upper, got {spec}")
    return pm.Uniform(name, lower=lo, upper=hi)


def build_model(
    system: ODESystem,
    data,
    observed: Sequence[str] | None = None,
    *,
    x0: Mapping[str, float] | Sequence[float] | None = None,
    kernel: str = "rbf",
    gamma: float = 0.3,
    priors: Mapping[str, PriorSpec] | PriorSpec | None = None,
    noise_sd: float | Sequence[float] | None = None,
    gp_fits: Sequence[GPFit] | None = None,
    backend: str = "auto",
    solver_options: SolverOptions | None = None,
    gp_starts: int = 5,
    seed: int = 0,
) -> pm.Model:
    """The partial-observation gradient-matching density of METHOD.md as a ``pm.Model``.

    Parameters
    ----------
    system : ODESystem
    data : Dataset from :func:`pgpgm.simulate`, DataFrame or dict (see :func:`as_observations`)
    observed : names of the measured states (default: every state present in ``data``)
    x0 : initial values of the latent states (mapping by name, or a full (S,) vector whose
        observed entries are ignored); taken from ``data.attrs["x0"]`` when omitted
    kernel : GP kernel name or :class:`~pgpgm.gp.kernels.Kernel`
    gamma : gradient-matching mismatch variance (state-derivative units^2)
    priors : per-parameter ``(lower, upper)`` for a Uniform prior, or a callable
        ``name -> PyMC variable`` (called inside the model); one spec for all
        parameters or a mapping by name. Default Uniform(0, 10).
    noise_sd : known observation noise sd (scalar or per observed state); fitted by the
        GP step when None
    gp_fits : reuse GP fits (one per observed state) instead of fitting
    backend, solver_options : the CVODE backend and tolerances of the latent-state solve
    gp_starts, seed : optimiser starts and seed of the GP fit

    Returns
    -------
    pm.Model
        Free variables: every parameter (scalar) and every observed state (vector over
        ``time``). Deterministics: the latent states. Log-density terms: Potentials
        ``gp_prior`` and ``gradient_matching``, observed Normals ``y_<state>``. The shared
        set-up is ``model.pgpgm`` (:class:`DensitySetup`).
    """
    obs = as_observations(data, observed, system)
    t, M = obs.times, len(obs.states)
    if not np.isfinite(gamma) or gamma < 0:
        raise DataError(f"gamma must be a non-negative number, got {gamma}")
    obs_idx = tuple(system.index_of_states(obs.states))
    lat_idx = tuple(i for i in range(system.n_states) if i not in obs_idx)
    latent = tuple(system.states[i] for i in lat_idx)
    x0_full = np.full(system.n_states, np.nan)
    if x0 is None and isinstance(data, xr.Dataset) and "x0" in data.attrs:
        x0 = list(data.attrs["x0"])
    if isinstance(x0, Mapping):
        for k, v in x0.items():
            x0_full[system.index_of_states([k])[0]] = float(v)
    elif x0 is not None:
        x0_full[:] = np.asarray(x0, float).reshape(system.n_states)
    x0_full[list(obs_idx)] = np.nan
    missing = [system.states[i] for i in lat_idx if not np.isfinite(x0_full[i])]
    if missing:
        raise DataError(f"initial values of the latent states {missing} are required (x0=...)")

    if noise_sd is not None:
        nsd = np.broadcast_to(np.asarray(noise_sd, float), (M,)).copy()
        if np.any(~np.isfinite(nsd)) or np.any(nsd <= 0):
            raise DataError(f"noise_sd must be positive, got {noise_sd}")
    if gp_fits is None:
        gp_fits = tuple(
            fit_gp(t, obs.values[:, m], kernel, state=s, noise_sd=None if noise_sd is None else nsd[m],
                   n_starts=gp_starts, seed=seed + m)
            for m, s in enumerate(obs.states)
        )
    gp_fits = tuple(gp_fits)
    if len(gp_fits) != M:
        raise DataError(f"need one GP fit per observed state ({M}), got {len(gp_fits)}")
    if noise_sd is None:
        nsd = np.array([g.noise_sd for g in gp_fits])
    gms = tuple(gradient_matching(g, t) for g in gp_fits)
    prec = np.stack([g.gradient_precision(gamma) for g in gms])
    op = ODEOp(system, t, backend=backend, options=solver_options, on_failure="nan") if latent else None
    if priors is None or callable(priors) or isinstance(priors, tuple):
        priors = {p: priors for p in system.parameters}
    unknown = set(priors) - set(system.parameters)
    if unknown:
        raise DataError(f"priors given for unknown parameters {sorted(unknown)}")
    specs = [priors.get(p, (0.0, 10.0)) or (0.0, 10.0) for p in system.parameters]
    bounds = None if any(callable(b) for b in specs) else np.array(specs, float).reshape(-1, 2)
    setup = DensitySetup(system, obs, obs_idx, lat_idx, latent, x0_full, gp_fits, gms, nsd, float(gamma),
                         prec, op, gp_fits[0].kernel.name, bounds)
    coords = {"time": t, "parameter": list(system.parameters)}
    with pm.Model(coords=coords, name="") as model:
        theta = pt.stack([_prior(p, priors.get(p)) for p in system.parameters]) if system.parameters else pt.zeros(0)
        xs = {s: pm.Flat(s, dims="time") for s in obs.states}
        gp_terms, gm_terms = [], []
        if latent:
            x0_vec = pt.stack([xs[s][0] if i in obs_idx else pt.constant(x0_full[i])
                               for i, s in enumerate(system.states)])
            traj = op(theta, x0_vec)
            for j, s in zip(lat_idx, latent):
                xs[s] = pm.Deterministic(s, traj[:, j], dims="time")
            ok = pt.all(pt.isfinite(traj))
        f = system.pytensor_rhs(pt.constant(t), xs, theta)
        for m, s in enumerate(obs.states):
            g = gms[m]
            dx = xs[s] - g.mean
            gp_terms.append(-0.5 * pt.dot(dx, pt.dot(pt.constant(g.C_precision), dx)))
            pm.Normal(f"y_{s}", mu=xs[s], sigma=nsd[m], observed=obs.values[:, m], dims="time")
            r = f[obs_idx[m]] - pt.dot(pt.constant(g.D), dx)
            gm_terms.append(-0.5 * pt.dot(r, pt.dot(pt.constant(prec[m]), r)))
        pm.Potential("gp_prior", pt.sum(pt.stack(gp_terms)))
        gm_total = pt.sum(pt.stack(gm_terms))
        if latent:  # a failed latent-state solve is a -inf density, i.e. a rejected proposal
            gm_total = pt.switch(ok, gm_total, -np.inf)
        pm.Potential("gradient_matching", gm_total)
    model.pgpgm = setup
    return model

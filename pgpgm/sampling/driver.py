"""Step 2b: Metropolis-within-Gibbs on the gradient-matching density.

One iteration (METHOD.md):

1. every observed-state value x_k(t_i) in turn gets a Gaussian proposal (sd
   ``sigma_s``, one per element) accepted by the density. The change of the density
   is computed in O(N) from maintained vectors (C^-1 (x - mu), the gradient-matching
   residual r and (A + gamma I)^-1 r), in a numba loop;
2. every parameter in turn gets a Gaussian proposal (sd ``sigma_p``); the latent
   states are re-integrated and the move accepted by the full model density.

Values at the first time of observed states are the latent states' initial
conditions' partners (x0 of the solve), so with latent states they are updated like
parameters (re-integrating), which keeps the chain exact for the model density.
Proposal scales adapt during burn-in toward an acceptance rate of 0.44 and are then
fixed. The result is an ArviZ DataTree.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import arviz as az
import numba
import numpy as np
import pymc as pm
from pymc.model.transform.conditioning import remove_value_transforms
from pymc.step_methods.compound import BlockedStep, Competence
from scipy import optimize
from tqdm.auto import tqdm

from ..density import DensitySetup
from ..errors import PgpgmError

TARGET_ACCEPT = 0.44
_ADAPT_EVERY = 50


@numba.njit(cache=False)
def _sweep(rhs, t, X, theta, obs_idx, i_start, Y, inv_var, Cinv, Dt, P, PDt, dtpd, w, r, z, F,
           scales, normals, log_u, accepted):
    """One pass of single-element proposals over every observed state value.

    Arrays: X (N,S) states (updated in place); Y (N,M); Cinv, Dt (= D^T), P, PDt
    (= (P D)^T) are (M,N,N); dtpd (M,N) = diag(D^T P D); w, r, z (M,N) maintained
    vectors; F (N,S) f at every time. Returns the total change of the log density.
    """
    N, M = Y.shape
    S = X.shape[1]
    fnew = np.empty(S)
    row = np.empty(S)
    total = 0.0
    for m in range(M):
        k = obs_idx[m]
        for i in range(i_start, N):
            delta = scales[i, m] * normals[i, m]
            xi = X[i, k]
            xn = xi + delta
            d = -0.5 * (2.0 * delta * w[m, i] + delta * delta * Cinv[m, i, i])
            d += -0.5 * inv_var[m] * ((Y[i, m] - xn) ** 2 - (Y[i, m] - xi) ** 2)
            for s in range(S):
                row[s] = X[i, s]
            row[k] = xn
            rhs(t[i], row, theta, fnew)
            if not np.all(np.isfinite(fnew)):
                continue
            dz = 0.0
            for n in range(N):
                dz += Dt[m, i, n] * z[m, n]
            for m2 in range(M):
                a = fnew[obs_idx[m2]] - F[i, obs_idx[m2]]
                if m2 == m:
                    b = -delta
                    uz = a * z[m, i] + b * dz
                    upu = a * a * P[m, i, i] + 2.0 * a * b * PDt[m, i, i] + b * b * dtpd[m, i]
                else:
                    uz = a * z[m2, i]
                    upu = a * a * P[m2, i, i]
                d += -0.5 * (2.0 * uz + upu)
            if log_u[i, m] < d:
                total += d
                accepted[i, m] += 1
                X[i, k] = xn
                for n in range(N):
                    w[m, n] += delta * Cinv[m, i, n]
                for m2 in range(M):
                    a = fnew[obs_idx[m2]] - F[i, obs_idx[m2]]
                    r[m2, i] += a
                    for n in range(N):
                        z[m2, n] += a * P[m2, i, n]
                    if m2 == m:
                        for n in range(N):
                            r[m, n] -= delta * Dt[m, i, n]
                            z[m, n] -= delta * PDt[m, i, n]
                for s in range(S):
                    F[i, s] = fnew[s]
    return total


@dataclass
class _ChainState:
    q: np.ndarray  # (P,) the sampler's coordinates of the parameters
    theta: np.ndarray  # (P,) the parameters
    X: np.ndarray  # (N, S)
    F: np.ndarray  # (N, S)
    w: np.ndarray  # (M, N)
    r: np.ndarray
    z: np.ndarray
    logp: float


class GradientMatchingSampler:
    """Element-wise Metropolis-within-Gibbs for a model from :func:`pgpgm.build_model`.

    Parameters
    ----------
    model : pm.Model with ``model.pgpgm`` (built by :func:`pgpgm.build_model`)
    state_scale : initial proposal sd of the state values (scalar, state units); default
        from the conditional precision of each element
    param_scale : initial proposal sd of each parameter (scalar or (P,)); default 5 %
        of the starting value (at least 0.01)
    """

    def __init__(self, model: pm.Model, *, state_scale: float | None = None, param_scale=None,
                 space: str = "constrained"):
        if space not in ("constrained", "value"):
            raise ValueError("space must be 'constrained' or 'value'")
        setup: DensitySetup | None = getattr(model, "pgpgm", None)
        if setup is None:
            raise PgpgmError("this model was not built by pgpgm.build_model (it lacks model.pgpgm)")
        self.model, self.setup = model, setup
        s = setup
        # compiling the model density takes seconds: reuse it while the model is unchanged
        layout = (space, *(v.name for v in (*model.basic_RVs, *model.potentials, *model.deterministics)))
        if layout not in s.compiled:
            m = remove_value_transforms(model) if space == "constrained" else model
            params = [m[p] for p in s.system.parameters]
            outs = [m.logp(), *m.replace_rvs_by_values(params)]
            if s.latent:
                outs += m.replace_rvs_by_values([m[n] for n in s.latent])
            names = [m.rvs_to_values[v].name for v in params]
            s.compiled[layout] = (m, m.compile_fn(outs, point_fn=True), names)
        self._um, self._fn, self.coordinate_names = s.compiled[layout]
        N, M = s.obs.values.shape
        self._Cinv = np.ascontiguousarray(np.stack([g.C_precision for g in s.gm]))
        self._Dt = np.ascontiguousarray(np.stack([g.D.T for g in s.gm]))
        self._D = np.stack([g.D for g in s.gm])
        self._P = np.ascontiguousarray(s.grad_precision)
        PD = self._P @ self._D
        self._PDt = np.ascontiguousarray(PD.transpose(0, 2, 1))
        self._dtpd = np.einsum("mji,mji->mi", self._D, PD)
        self._inv_var = 1.0 / s.noise_sd**2
        self._mu = np.array([g.mean for g in s.gm])
        self._obs_idx = np.array(s.observed_idx, dtype=np.int64)
        if state_scale is None:
            prec = np.diagonal(self._Cinv, axis1=1, axis2=2) + self._inv_var[:, None] + self._dtpd
            self.state_scale0 = (1.5 / np.sqrt(prec)).T.copy()  # (N, M)
        else:
            self.state_scale0 = np.full((N, M), float(state_scale))
        self.param_scale0 = param_scale
        self.n_logp_evals = 0

    # ------------------------------------------------------------------ helpers
    def _point(self, q, X) -> dict:
        s = self.setup
        pt_ = {n: np.asarray(v) for n, v in zip(self.coordinate_names, q)}
        pt_.update({n: X[:, k].copy() for n, k in zip(s.obs.states, s.observed_idx)})
        return pt_

    def _evaluate(self, q, X):
        """Full model log density, parameters (P,) and latent states (N, L) at coordinates q and x_M."""
        self.n_logp_evals += 1
        out = self._fn(self._point(q, X))
        P = self.setup.system.n_parameters
        theta = np.array([float(v) for v in out[1 : P + 1]])
        lat = np.column_stack(out[P + 1 :]) if self.setup.latent else None
        return float(out[0]), theta, lat

    def _refresh(self, st: _ChainState) -> None:
        s = self.setup
        st.F = s.system.rhs_on_grid(s.obs.times, st.X, st.theta)
        dx = st.X[:, self._obs_idx].T - self._mu[:, None]  # (M, N)
        st.w = np.einsum("mij,mj->mi", self._Cinv, dx)
        st.r = st.F[:, self._obs_idx].T - np.einsum("mij,mj->mi", self._D, dx)
        st.z = np.einsum("mij,mj->mi", self._P, st.r)

    def initial_state(self, q0, X0=None) -> _ChainState:
        """Chain state at coordinates q0 (P,) and observed states X0 (N, M) (GP means if None)."""
        s = self.setup
        N = s.obs.times.size
        X = np.zeros((N, s.system.n_states))
        X[:, self._obs_idx] = s.gp_posterior_means() if X0 is None else X0
        q0 = np.asarray(q0, float)
        logp, theta, lat = self._evaluate(q0, X)
        if not np.isfinite(logp):
            raise PgpgmError(f"the density is not finite at the starting point {q0.tolist()}")
        if lat is not None:
            X[:, list(s.latent_idx)] = lat
        st = _ChainState(q0, theta, X, X, X, X, X, logp)
        self._refresh(st)
        return st

    def default_param_scale(self, st: _ChainState) -> np.ndarray:
        P = self.setup.system.n_parameters
        scale = self.param_scale0 if self.param_scale0 is not None else np.maximum(0.05 * np.abs(st.q), 0.01)
        return np.broadcast_to(np.asarray(scale, float), (P,)).copy()

    def iterate(self, st: _ChainState, sx, sp_, rng, acc_x, acc_p, check: bool) -> np.ndarray:
        """One Metropolis-within-Gibbs iteration in place; returns which parameters moved (P,).

        ``sx`` (N, M) and ``sp_`` (P,) are the proposal sds; ``acc_x``, ``acc_p`` count
        acceptances; ``check`` re-evaluates the density after the state sweep (and
        raises if the model has state terms the sweep does not track).
        """
        s = self.setup
        N, M = s.obs.values.shape
        # 1. state values, O(N) each, compiled
        delta = _sweep(s.system.compiled.rhs, s.obs.times, st.X, st.theta, self._obs_idx, 1 if s.latent else 0,
                       s.obs.values, self._inv_var, self._Cinv, self._Dt, self._P, self._PDt, self._dtpd,
                       st.w, st.r, st.z, st.F, sx, rng.standard_normal((N, M)),
                       np.log(rng.uniform(size=(N, M))), acc_x)
        expected = st.logp + delta
        if check:
            fresh = self._evaluate(st.q, st.X)[0]
            if not np.isclose(fresh, expected, rtol=1e-7, atol=1e-6):
                raise PgpgmError(
                    "the model density changed differently from the gradient-matching terms during the "
                    f"state sweep ({fresh} vs {expected}): it has extra terms in the observed states, "
                    "which this element-wise sampler does not track; sample it with pm.sample instead"
                )
            expected = fresh
        # values at t_0 move the latent states' solve: full density
        for m in range(M if s.latent else 0):
            Xp = st.X.copy()
            Xp[0, s.observed_idx[m]] += sx[0, m] * rng.standard_normal()
            lp, _, lat = self._evaluate(st.q, Xp)
            if np.log(rng.uniform()) < lp - expected:
                Xp[:, list(s.latent_idx)] = lat
                st.X, expected = Xp, lp
                acc_x[0, m] += 1
                self._refresh(st)
        st.logp = expected
        # 2. parameters, each with a fresh latent-state solve
        moved = np.zeros(s.system.n_parameters, dtype=bool)
        for j in range(moved.size):
            prop = st.q.copy()
            prop[j] += sp_[j] * rng.standard_normal()
            lp, theta, lat = self._evaluate(prop, st.X)
            if np.log(rng.uniform()) < lp - st.logp:  # -inf (outside prior, failed solve) rejects
                st.q, st.theta, st.logp = prop, theta, lp
                if lat is not None:
                    st.X[:, list(s.latent_idx)] = lat
                self._refresh(st)
                moved[j] = True
        acc_p += moved
        return moved

    # ------------------------------------------------------------------ one chain
    def run_chain(self, theta0, draws: int, tune: int, rng: np.random.Generator, progress=None) -> dict:
        s = self.setup
        N, M = s.obs.values.shape
        P = s.system.n_parameters
        st = self.initial_state(theta0)
        sx, sp_ = self.state_scale0.copy(), self.default_param_scale(st)
        acc_x, acc_p = np.zeros((N, M)), np.zeros(P)
        out_theta = np.empty((draws, P))
        out_X = np.empty((draws, N, s.system.n_states))
        out_lp = np.empty(draws)
        out_ax = np.empty(draws)
        out_ap = np.zeros((draws, P), dtype=bool)
        for it in range(tune + draws):
            acc_before = acc_x.sum()
            moved = self.iterate(st, sx, sp_, rng, acc_x, acc_p, check=it < 3)
            if it % 100 == 99:  # re-anchor the incrementally updated density against round-off
                st.logp = self._evaluate(st.q, st.X)[0]
            if it < tune and (it + 1) % _ADAPT_EVERY == 0:
                adapt(sx, sp_, acc_x, acc_p, _ADAPT_EVERY)
            if it == tune - 1:
                acc_x[:] = 0
                acc_p[:] = 0
            if it >= tune:
                d = it - tune
                out_theta[d], out_X[d], out_lp[d] = st.theta, st.X, st.logp
                out_ax[d] = (acc_x.sum() - acc_before) / max(N * M, 1)
                out_ap[d] = moved
            if progress is not None:
                progress.update(1)
        return {
            "theta": out_theta, "X": out_X, "lp": out_lp, "accept_x": out_ax, "accept_theta": out_ap,
            "state_scale": sx, "param_scale": sp_,
            "accept_rate_x": float(acc_x.sum() / max(draws * N * M, 1)),
            "accept_rate_theta": (acc_p / max(draws, 1)).tolist(),
        }


def adapt(sx, sp_, acc_x, acc_p, window: int) -> None:
    """Scale proposal sds toward an acceptance rate of 0.44 over the last ``window`` iterations
    (in place) and reset the counters."""
    sx *= np.exp(2.0 * (acc_x / window - TARGET_ACCEPT))
    sp_ *= np.exp(2.0 * (acc_p / window - TARGET_ACCEPT))
    acc_x[:] = 0
    acc_p[:] = 0


def _start_theta(sampler: GradientMatchingSampler, init, rng) -> np.ndarray:
    s = sampler.setup
    ip = sampler._um.initial_point()
    median = np.array([float(ip[p]) for p in s.system.parameters])
    if isinstance(init, str) and init == "prior-median":
        return median
    if isinstance(init, str) and init == "prior":
        draws = pm.draw([sampler.model[p] for p in s.system.parameters], random_seed=rng)
        return np.array([float(d) for d in draws])
    if isinstance(init, str) and init == "map":
        mode = _density_mode(sampler, median)
        jittered = mode * np.exp(0.02 * rng.standard_normal(median.size))
        b = s.prior_bounds
        return jittered if b is None else np.clip(jittered, b[:, 0] + 1e-9 * np.ptp(b, 1), b[:, 1] - 1e-9 * np.ptp(b, 1))
    theta = np.asarray(init, float)
    if theta.shape != (s.system.n_parameters,):
        raise ValueError(f"init must be 'map', 'prior-median', 'prior' or {s.system.n_parameters} values")
    return theta


def _density_mode(sampler: GradientMatchingSampler, theta0: np.ndarray) -> np.ndarray:
    """Maximise the density over theta with x_M at the GP means (Powell, from the prior's
    initial point). Gradient matching makes this objective smooth, so a local search is
    a sound starting point for the chain; cached per sampler."""
    if "map" in sampler.setup.compiled:
        return sampler.setup.compiled["map"]
    X = np.zeros((sampler.setup.obs.times.size, sampler.setup.system.n_states))
    X[:, sampler._obs_idx] = sampler.setup.gp_posterior_means()

    def neg(theta):
        lp = sampler._evaluate(theta, X)[0]
        return -lp if np.isfinite(lp) else 1e300

    b = sampler.setup.prior_bounds
    res = optimize.minimize(neg, theta0, method="Powell", bounds=None if b is None else [tuple(r) for r in b],
                            options={"xtol": 1e-4, "ftol": 1e-8, "maxfev": 4000})
    best = res.x if res.fun < neg(theta0) else theta0
    sampler.setup.compiled["map"] = best
    return best


def sample(
    model: pm.Model,
    *,
    draws: int = 2000,
    tune: int = 1500,
    chains: int = 2,
    seed: int | None = 0,
    init="spread",
    state_scale: float | None = None,
    param_scale=None,
    progressbar: bool = True,
):
    """Run the element-wise Metropolis-within-Gibbs sampler (Step 2 of METHOD.md).

    Parameters
    ----------
    model : pm.Model from :func:`pgpgm.build_model`
    draws, tune : kept iterations and burn-in iterations per chain (burn-in is
        dropped; proposal scales adapt during it)
    chains : independent chains, run one after another
    seed : seeds every chain (via :class:`numpy.random.SeedSequence`)
    init : ``"spread"`` (default: the first chain at the priors' initial point, e.g.
        Uniform midpoints, every further chain at a random prior draw - a multi-start),
        ``"prior-median"`` (every chain at the priors' initial point), ``"map"`` (the density's mode over theta with x_M at the GP means,
        by Powell's method from the prior-median, jittered by 2 % per chain; it can
        land in a poor mode, e.g. Lotka-Volterra with x2 observed), ``"prior"`` (a
        random prior draw per chain) or P starting values
    state_scale, param_scale : initial proposal sds (see :class:`GradientMatchingSampler`)

    Returns
    -------
    arviz DataTree
        ``posterior``: every parameter (chain, draw), observed and latent states
        (chain, draw, time); ``sample_stats``: ``lp``, ``accept_x`` (fraction of state
        proposals accepted per iteration), ``accept_theta`` (chain, draw, parameter);
        ``observed_data``: ``y_<state>``; attributes: settings, GP fits, tuned scales.
    """
    if draws < 1 or tune < 0 or chains < 1:
        raise ValueError("draws >= 1, tune >= 0 and chains >= 1 are required")
    sampler = GradientMatchingSampler(model, state_scale=state_scale, param_scale=param_scale)
    s = sampler.setup
    seeds = np.random.SeedSequence(seed).spawn(chains)
    results = []
    t0 = time.perf_counter()
    with tqdm(total=chains * (tune + draws), disable=not progressbar, desc="pgpgm sampling", unit="it") as bar:
        for c in range(chains):
            rng = np.random.default_rng(seeds[c])
            chain_init = init if init != "spread" else ("prior-median" if c == 0 else "prior")
            for attempt in range(20):  # a random start may sit where the latent solve fails
                theta0 = _start_theta(sampler, chain_init, rng)
                try:
                    results.append(sampler.run_chain(theta0, draws, tune, rng, bar))
                    break
                except PgpgmError as exc:
                    if chain_init != "prior" or "not finite at the starting point" not in str(exc):
                        raise
            else:
                raise PgpgmError("20 prior draws gave no finite density to start a chain from; pass init=...")
    elapsed = time.perf_counter() - t0
    return _to_datatree(s, results, {
        "draws": draws, "tune": tune, "chains": chains, "seed": -1 if seed is None else seed,
        "init": init if isinstance(init, str) else list(map(float, init)), "sampling_time_s": elapsed,
        "n_logp_evals": sampler.n_logp_evals,
    })


def _to_datatree(s: DensitySetup, results: list[dict], settings: dict):
    post = {p: np.stack([r["theta"][:, j] for r in results]) for j, p in enumerate(s.system.parameters)}
    for k, name in enumerate(s.system.states):
        post[name] = np.stack([r["X"][:, :, k] for r in results])
    stats = {
        "lp": np.stack([r["lp"] for r in results]),
        "accept_x": np.stack([r["accept_x"] for r in results]),
        "accept_theta": np.stack([r["accept_theta"] for r in results]),
    }
    obs = {f"y_{n}": s.obs.values[:, m] for m, n in enumerate(s.obs.states)}
    dims = {n: ["time"] for n in s.system.states}
    dims.update({f"y_{n}": ["time"] for n in s.obs.states})
    dims["accept_theta"] = ["parameter"]
    attrs = {
        "pgpgm_settings": json.dumps({
            **settings, "system": s.system.name, "observed": list(s.obs.states), "latent": list(s.latent),
            "gamma": s.gamma, "kernel": s.kernel, "x0": [None if not np.isfinite(v) else float(v) for v in s.x0],
            "noise_sd": s.noise_sd.tolist(),
        }),
        "pgpgm_gp_fits": json.dumps([g.as_dict() for g in s.gp]),
        "pgpgm_tuned_scales": json.dumps([
            {"state": r["state_scale"].tolist(), "param": r["param_scale"].tolist(),
             "accept_rate_x": r["accept_rate_x"], "accept_rate_theta": r["accept_rate_theta"]} for r in results
        ]),
    }
    tree = az.from_dict(
        {"posterior": post, "sample_stats": stats, "observed_data": obs},
        coords={"time": s.obs.times, "parameter": list(s.system.parameters)},
        dims=dims,
    )
    tree.attrs.update(attrs)
    return tree


class GradientMatchingStep(BlockedStep):
    """The same Metropolis-within-Gibbs scheme as a PyMC step method, for ``pm.sample``.

    Use it on a model from :func:`pgpgm.build_model`::

        with model:
            idata = pm.sample(step=pgpgm.GradientMatchingStep(), initvals=model.pgpgm.initial_point(theta0),
                              cores=1)

    Parameter proposals act on PyMC's (transformed) value variables; observed-state
    proposals, burn-in adaptation and the O(N) sweep are those of :func:`sample`. It
    takes every free variable of the model.
    """

    name = "gradient_matching_metropolis"
    stats_dtypes_shapes = {
        "accept_x": (np.float64, []),
        "accepted_theta": (np.int64, []),
        "tune": (bool, []),
    }

    def __init__(self, vars=None, *, model=None, rng=None, blocked: bool = True,
                 state_scale: float | None = None, param_scale=None):
        model = pm.modelcontext(model)
        self.vars = list(model.value_vars)
        self._sampler = GradientMatchingSampler(model, state_scale=state_scale, param_scale=param_scale,
                                                space="value")
        self.setup_chain(np.random.default_rng(rng), 1, 1)

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Fresh per-chain state: generator, initial proposal scales, counters."""
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.tune = tune > 0
        self._sx = self._sampler.state_scale0.copy()
        self._sp = None
        N, M = self._sampler.setup.obs.values.shape
        self._acc_x, self._acc_p = np.zeros((N, M)), np.zeros(self._sampler.setup.system.n_parameters)
        self._n = 0

    def reset_tuning(self) -> None:
        self._sx = self._sampler.state_scale0.copy()
        self._sp = None
        self._acc_x[:] = 0
        self._acc_p[:] = 0
        self._n = 0

    def step(self, point):
        smp = self._sampler
        s = smp.setup
        q = np.array([float(point[n]) for n in smp.coordinate_names])
        X0 = np.column_stack([point[n] for n in s.obs.states])
        st = smp.initial_state(q, X0)
        if self._sp is None:
            self._sp = smp.default_param_scale(st)
        before = self._acc_x.sum()
        moved = smp.iterate(st, self._sx, self._sp, self.rng, self._acc_x, self._acc_p, check=self._n < 3)
        self._n += 1
        if self.tune and self._n % _ADAPT_EVERY == 0:
            adapt(self._sx, self._sp, self._acc_x, self._acc_p, _ADAPT_EVERY)
        new = dict(point)
        new.update({n: np.asarray(v, dtype=point[n].dtype) for n, v in zip(smp.coordinate_names, st.q)})
        new.update({n: st.X[:, k].copy() for n, k in zip(s.obs.states, s.observed_idx)})
        stats = {"accept_x": float((self._acc_x.sum() - before) / self._acc_x.size),
                 "accepted_theta": int(moved.sum()), "tune": self.tune}
        return new, [stats]

    def stop_tuning(self):
        self.tune = False
        self._acc_x[:] = 0
        self._acc_p[:] = 0

    @staticmethod
    def competence(var, has_grad):
        return Competence.INCOMPATIBLE  # only when asked for explicitly

"""Step 4 of a study: one ``pm.Model`` of every experiment, shared parameters once.

    shared p           ~ its prior (the fit's priors: Uniform box or a callable)
    varying p[e]       ~ the same prior, one variable per experiment e
    hierarchical p:      mu_p ~ Normal(0, 3),  sigma_p ~ HalfNormal(1),  z_p[e] ~ Normal(0, 1),
                         p[e] = exp(mu_p + sigma_p z_p[e])          (log-normal, non-centred;
                         ``centred=True``: log_p[e] ~ Normal(mu_p, sigma_p), p[e] = exp(log_p[e]))
    <s>_0[e]           ~ Normal(first measurement, sd of the measurements)  observed states of e
                         whose initial value the study does not know (restricted to positive values,
                         on the log scale, where ``positive_x0`` says)
    sigma_<s>          ~ LogNormal(log centre, 2)   one noise sd per observed state, shared
                         (``sigma_<s>[e]`` per experiment for the states in ``noise_per_experiment``)
    x_e(t)             = the ODE solution of experiment e (one :class:`~pgpgm.solve.op.ODEOp` each)
    y_<s>[e]           ~ Normal(x_e(t)_s, sigma_<s>)  where measured

With measurement noise models (``noise={"C": "lognormal", "I": "negbin", ...}``, :mod:`pgpgm.noise`)
a state's term ``y_<s>[e]`` is instead the model's log-likelihood on the measured values
(:meth:`pgpgm.noise.NoiseModel.logp`: ``pm.logp`` of ``pm.LogNormal(log x, sigma)``, ``pm.Poisson(x)``
or ``pm.NegativeBinomial(mu=x, alpha)``) as a ``pm.Potential``, with ``alpha_<s>`` ~ LogNormal(log
centre, 2) for negbin (``alpha_<s>[e]`` per experiment), and zero likelihood where a prediction is
<= 0 at a measured value (as :func:`pgpgm.fit`'s step 4).

The population priors are weakly informative on the log scale: Normal(0, 3) for mu_p puts the
population median between e^-6 and e^6 (95 %), HalfNormal(1) for sigma_p allows from no
variation up to a factor of e^2 ~ 7 between subjects (1 sd); give ``population_priors`` to change
them. Every variable is a scalar (named ``p[e]``) so that the NUTS rounds check each one; a user
can open the model (``with model:``) and add to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from ..data import Observations
from ..errors import DataError
from ..noise import NOISE_MODELS, noise_model
from ..ode.system import ODESystem
from ..posterior.model import NOISE_PRIOR_LOG_SD, initial_value_prior
from ..priors import Priors, prior_variable
from ..solve import Integrator, Solver
from ..solve.op import ODEOp

#: the kinds of population distribution ``hierarchical`` accepts
HIERARCHICAL_KINDS = ("lognormal",)
#: default population priors: mu ~ Normal(0, MU_SD), sigma ~ HalfNormal(SIGMA_SD) (log scale)
MU_SD, SIGMA_SD = 3.0, 1.0


def varying_name(p: str, experiment: str) -> str:
    """Name of experiment ``experiment``'s value of a varying parameter ``p``."""
    return f"{p}[{experiment}]"


def noise_variable(slot: str, model: str = "normal") -> str:
    """Name of a noise parameter in the model: ``sigma_<slot>`` (``alpha_<slot>`` for negbin), ``slot`` a
    state (shared) or ``<state>[<experiment>]`` (per experiment)."""
    return ("alpha_" if model == "negbin" else "sigma_") + slot


def x0_name(state: str, experiment: str) -> str:
    """Name of an experiment's free initial value of ``state``."""
    return f"{state}_0[{experiment}]"


def build_study_model(system: ODESystem, observations: Sequence[Observations], names: Sequence[str],
                      x0s: Sequence[np.ndarray], free_x0: Sequence[Sequence[int]], fixed: Sequence[Mapping],
                      *, varying: Sequence[str] = (), hierarchical: Mapping[str, str] | None = None,
                      priors: Priors, noise_center: Mapping[str, float] | None = None,
                      noise_sd: Mapping[str, float] | None = None, solver: Solver | None = None,
                      population_priors: Mapping[str, Callable[[str], pt.TensorVariable]] | None = None,
                      centred: bool = False, noise: Mapping[str, str] | None = None,
                      noise_per_experiment: Sequence[str] = (),
                      positive_x0: Sequence[Sequence[int]] | None = None) -> pm.Model:
    """The joint ODE model of a study (see the module docstring).

    Parameters
    ----------
    observations : (K,) each experiment's measurements; names : (K,) their names
    x0s : (K,) (S,) initial states (free entries: any value); free_x0 : (K,) state indices whose
        initial values are free variables
    fixed : (K,) known parameter values by name per experiment
    varying : parameters with a value per experiment (flat prior: the parameter's own)
    hierarchical : parameter -> ``"lognormal"``: a value per experiment from a population distribution
    priors : the parameters' priors (:class:`~pgpgm.priors.Priors`)
    noise_center : centre of each free noise parameter's prior by name (an observed state, or
        ``<state>[<experiment>]`` for a state in ``noise_per_experiment``)
    noise_sd : known noise parameters by those names or by state (for every experiment); the others free
    population_priors : callables ``name -> variable`` for ``mu_<p>`` / ``sigma_<p>`` by those names
    centred : sample ``log_<p>[<e>] ~ Normal(mu_p, sigma_p)`` instead of the non-centred ``z_<p>[<e>]``
        (better when every experiment's data determine its value well: then the non-centred z, mu and
        sigma are tightly correlated; the non-centred form is better when they do not)
    noise : the :mod:`pgpgm.noise` model name by observed state (default normal)
    noise_per_experiment : observed states with a noise parameter per experiment
    positive_x0 : (K,) state indices (among ``free_x0``) whose initial value's Normal prior is restricted
        to positive values, sampled on the log scale (see ``pgpgm.build_ode_model(positive_x0=)``);
        default none

    Returns
    -------
    pm.Model with coords ``experiment``; free variables as in the module docstring; deterministics
    ``<p>[<e>]`` for hierarchical parameters; observed ``y_<s>[<e>]``.
    """
    hierarchical = dict(hierarchical or {})
    population_priors = dict(population_priors or {})
    observed = list(dict.fromkeys(s for o in observations for s in o.states))
    spec = dict(zip(priors.names, priors.specs))

    def own_prior(name: str, p: str):
        s = spec[p]
        return prior_variable(name, s) if callable(s) else pm.Uniform(name, lower=np.float64(s[0]),
                                                                      upper=np.float64(s[1]))

    with pm.Model(coords={"experiment": list(names)}) as model:
        shared = {p: own_prior(p, p) for p in system.parameters
                  if p not in varying and p not in hierarchical and not all(p in f for f in fixed)}
        pop = {}
        for p in hierarchical:
            mu = (population_priors[f"mu_{p}"](f"mu_{p}") if f"mu_{p}" in population_priors
                  else pm.Normal(f"mu_{p}", mu=0.0, sigma=MU_SD))
            sigma = (population_priors[f"sigma_{p}"](f"sigma_{p}") if f"sigma_{p}" in population_priors
                     else pm.HalfNormal(f"sigma_{p}", sigma=SIGMA_SD))
            pop[p] = (mu, sigma)
        models = {s: (noise or {}).get(s, "normal") for s in observed}
        bad = {s: m for s, m in models.items() if m not in NOISE_MODELS}
        if bad:
            raise DataError(f"noise names unknown model(s) {bad}; choose from {list(NOISE_MODELS)}")
        sigmas = {}

        def noise_parameter(slot: str, s: str):
            if models[s] == "poisson":
                return None
            known = None if noise_sd is None else noise_sd.get(slot, noise_sd.get(s))
            if known is not None and np.isfinite(known):
                return pt.as_tensor_variable(np.float64(known))
            return pm.LogNormal(noise_variable(slot, models[s]), mu=np.log(noise_center[slot]),
                                sigma=np.float64(NOISE_PRIOR_LOG_SD))

        for s in observed:
            if s not in noise_per_experiment:
                sigmas[s] = noise_parameter(s, s)
        for j, (e, obs) in enumerate(zip(names, observations)):
            theta = []
            for p in system.parameters:
                if p in fixed[j]:
                    theta.append(pt.as_tensor_variable(np.float64(fixed[j][p])))
                elif p in hierarchical:
                    mu, sigma = pop[p]
                    if centred:
                        log_p = pm.Normal(f"log_{p}[{e}]", mu=mu, sigma=sigma)
                    else:
                        log_p = mu + sigma * pm.Normal(f"z_{p}[{e}]", mu=0.0, sigma=1.0)
                    theta.append(pm.Deterministic(varying_name(p, e), pt.exp(log_p)))
                elif p in varying:
                    theta.append(own_prior(varying_name(p, e), p))
                else:
                    theta.append(shared[p])
            x0 = []
            for i, s in enumerate(system.states):
                if i in free_x0[j]:
                    ym = obs.state_values(obs.states.index(s))
                    spread = float(np.std(ym)) or float(abs(ym[0])) or 1.0
                    positive = positive_x0 is not None and i in positive_x0[j]
                    x0.append(initial_value_prior(x0_name(s, e), float(ym[0]), spread, positive))
                else:
                    x0.append(pt.as_tensor_variable(np.float64(x0s[j][i])))
            traj = ODEOp(Integrator(system, obs.times, solver), on_failure="nan",  # sensitivities to free x0 only
                         x0_free=tuple(sorted(free_x0[j])))(pt.stack(theta), pt.stack(x0))
            ok = pt.all(pt.isfinite(traj))
            pm.Potential(f"solve_failed[{e}]", pt.switch(ok, np.float64(0.0), np.float64(-np.inf)))
            safe = pt.switch(ok, traj, 0.0)
            for m, s in enumerate(obs.states):
                rows = obs.rows(m)
                slot = f"{s}[{e}]" if s in noise_per_experiment else s
                if slot not in sigmas:
                    sigmas[slot] = noise_parameter(slot, s)
                mu = safe[rows, system.states.index(s)]
                if models[s] == "normal":
                    pm.Normal(f"y_{s}[{e}]", mu=mu, sigma=sigmas[slot], observed=obs.values[rows, m])
                    continue
                # a prediction <= 0 at a measured value: zero likelihood (and a finite placeholder)
                pm.Potential(f"{s}_positive[{e}]", pt.switch(pt.all(mu > 0), np.float64(0.0), np.float64(-np.inf)))
                mu = pt.switch(mu > 0, mu, 1.0)
                kind = noise_model(models[s], **({"alpha": 1.0} if models[s] == "negbin" else
                                                 {} if models[s] == "poisson" else {"sd": 1.0}))
                params = ({} if sigmas[slot] is None else
                          {("alpha" if models[s] == "negbin" else "sd"): sigmas[slot]})
                pm.Potential(f"y_{s}[{e}]", kind.logp(obs.values[rows, m], mu, **params))
    return model


def check_hierarchical(system: ODESystem, hierarchical, varying) -> dict[str, str]:
    """``hierarchical`` as a dict, checked against the system and ``varying``.

    Raises
    ------
    DataError : not a mapping, an unknown parameter, an unknown kind, or a parameter also in ``varying``.
    """
    if hierarchical is None:
        return {}
    if not isinstance(hierarchical, Mapping):
        raise DataError(f"hierarchical must be a mapping parameter -> 'lognormal', e.g. {{'ka': 'lognormal'}}, "
                        f"got {hierarchical!r}")
    out = {}
    for p, kind in hierarchical.items():
        if p not in system.parameters:
            raise DataError(f"hierarchical names {p!r}, which is not a parameter of {system.name}; its parameters are "
                            f"{list(system.parameters)}")
        if kind not in HIERARCHICAL_KINDS:
            raise DataError(f"hierarchical[{p!r}] = {kind!r}: the population distributions are {HIERARCHICAL_KINDS}")
        if p in varying:
            raise DataError(f"{p!r} is both varying and hierarchical: name it in one of them")
        out[p] = kind
    return out

"""Step 4 by the Laplace approximation: draws from the Gaussian at the refined optimum."""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import ConvergenceWarning, LaplaceError, ODESolveError
from ..solve import Integrator
from .model import initial_value_name


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
    leaves NaN states (a :class:`~pgpgm.errors.ConvergenceWarning` counts them).

    Raises
    ------
    LaplaceError
        when the covariance is not finite (the data do not determine every unknown).
    """
    from arviz_base import from_dict
    cov = np.asarray(ref.q_covariance, float)
    if not np.all(np.isfinite(cov)):
        raise LaplaceError("the refinement covariance is not finite (some parameters are not determined by the "
                           "data); use posterior='nuts'")
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
    failed = int(np.sum(np.all(np.isnan(X), axis=(1, 2))))
    if failed:
        warnings.warn(f"{failed} of {draws} Laplace draws could not be solved (their trajectories of "
                      f"{', '.join(system.states)} are NaN): the Gaussian "
                      "at the optimum reaches parameters where the model cannot be solved, so it is a poor "
                      "approximation there; posterior='nuts' samples the posterior itself", ConvergenceWarning,
                      stacklevel=5)
    post = {p: q[None, :, j] for j, p in enumerate(system.parameters)}
    post.update({initial_value_name(system.states[i]): x0[None, :, i] for i in free})
    post.update({s: X[None, :, :, i] for i, s in enumerate(system.states)})
    tree = from_dict({"posterior": post}, coords={"time_dense": dense.times},
                        dims={s: ["time_dense"] for s in system.states})
    tree.attrs["pgpgm_posterior"] = "laplace"
    return tree


def gaussian_draws(names, mean: np.ndarray, covariance: np.ndarray, draws: int, seed: int | None,
                   lower: np.ndarray | None = None, upper: np.ndarray | None = None):
    """Draws (one chain of ``draws``) from N(``mean``, ``covariance``) of the variables ``names`` (V,), kept
    inside [``lower``, ``upper``] (V,) where given (a draw outside is drawn again, up to 100 times as many):
    the Laplace approximation of a posterior over a box. An ArviZ DataTree with ``posterior``.

    Raises
    ------
    LaplaceError
        when the covariance is not finite (the data do not determine every variable) or the Gaussian lies
        almost wholly outside the bounds.
    """
    from arviz_base import from_dict

    cov = np.asarray(covariance, float)
    if not np.all(np.isfinite(cov)):
        raise LaplaceError("the optimum's covariance is not finite (the data do not determine every parameter): "
                           "use posterior='nuts'")
    rng = np.random.default_rng(seed)
    lo = np.full(len(mean), -np.inf) if lower is None else np.asarray(lower, float)
    hi = np.full(len(mean), np.inf) if upper is None else np.asarray(upper, float)
    kept = np.empty((0, len(mean)))
    for _ in range(100):
        q = rng.multivariate_normal(mean, cov, size=draws, method="eigh")
        kept = np.vstack([kept, q[np.all((q >= lo) & (q <= hi), axis=1)]])
        if len(kept) >= draws:
            break
    if len(kept) < draws:
        raise LaplaceError("the Gaussian at the optimum lies almost wholly outside the bounds: use posterior='nuts'")
    tree = from_dict({"posterior": {n: kept[None, :draws, j] for j, n in enumerate(names)}})
    tree.attrs["pgpgm_posterior"] = "laplace"
    return tree

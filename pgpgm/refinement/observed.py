"""Step 3 on observables: the residuals y - h(t, x(t; theta, x0), theta, phi) and their Jacobian.

The measurements y (N, O) are of observables h (:class:`pgpgm.observables.Observables`), not of the
states. The system solved is the one with the observation parameters phi appended to its parameters
(:meth:`~pgpgm.observables.Observables.extend`), so the unknowns are q = (theta, phi, x0[free_x0])
and every part of :func:`pgpgm.refinement.refine` (the noise models, the alternation of the noise
parameters, bounds on theta and phi, the covariance) applies unchanged. The Jacobian is the chain
rule over the forward sensitivities:

    d mu / d q = dh/dx (N, O, S) . dx/dq (N, S, Q) + [dh/dtheta, dh/dphi, 0] (N, O, Q)

with dh/dx and dh/dp exact (sympy, compiled to numba), then scaled by 1/sd (Gaussian noise) or by
each noise model's d residual / d mu.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import DataError, ODESolveError
from ..observables import Observables
from ..solve import Integrator
from .least_squares import LeastSquaresProblem


@dataclass(frozen=True, eq=False)
class ObservablesProblem(LeastSquaresProblem):
    """:class:`LeastSquaresProblem` whose measurements are observables.

    Build it with :meth:`of`. ``observed_idx`` is ``range(O)`` (the observables' positions);
    ``noise_sd`` (O,), ``noise`` (O,) are per observable; ``integrator`` solves the extended system
    (its parameters are ``observables.parameters``).
    """

    observables: Observables | None = field(default=None, kw_only=True)

    @classmethod
    def of(cls, integrator: Integrator, observables: Observables, y, noise_sd, x0, *, free_x0=(),
           noise=None) -> ObservablesProblem:
        """The problem of ``y`` (N, O) measured on ``integrator.times`` (NaN where not measured)."""
        return cls(integrator, y, tuple(range(observables.n)), noise_sd, x0, free_x0=tuple(free_x0), noise=noise,
                   observables=observables)

    def measured_columns(self) -> tuple[tuple[int, ...], tuple[str, ...], str]:
        """The O columns of ``y`` measure the observables (the integrator must solve their extended
        system); the other checks are :class:`LeastSquaresProblem`'s."""
        obs = self.observables
        if not isinstance(obs, Observables):
            raise DataError(f"observables must be a pgpgm Observables, got {type(obs).__name__}")
        system = self.integrator.system
        if tuple(system.parameters) != tuple(obs.parameters) or tuple(system.states) != tuple(obs.states):
            raise DataError(f"the integrator's system must be the observables' extended system (parameters "
                            f"{list(obs.parameters)}), got {list(system.parameters)}")
        return tuple(range(obs.n)), tuple(obs.names), "observables"

    @property
    def observed_names(self) -> tuple[str, ...]:
        """(O,) the observables' names."""
        return self.observables.names

    def with_noise_sd(self, noise_sd) -> ObservablesProblem:
        """The same problem with other residual scales ``noise_sd`` (O,) (shares the integrator)."""
        return replace(self, noise_sd=noise_sd)

    def predictions(self, q) -> np.ndarray:
        """mu = h(t, x(t; q), p) (N, O); raises :class:`ODESolveError` if the solve fails."""
        p, x0 = self.split(q)
        x = self.integrator.solve(p, x0)
        return self.observables.values(self.integrator.times, x, p)

    def raw_residuals(self, q) -> np.ndarray:
        """Unscaled residuals mu - y (N, O) at q (NaN where not measured)."""
        return self.predictions(q) - self.y

    def prediction_jacobian(self, q) -> tuple[np.ndarray, np.ndarray]:
        """(mu (N, O), d mu / d q (N, O, Q)) at q by the chain rule (module docstring); raises
        :class:`ODESolveError` if the sensitivity solve fails."""
        p, x0 = self.split(q)
        x, dth, dx0 = self.integrator.solve_sensitivities(p, x0)
        hx, hp = self.observables.jacobians(self.integrator.times, x, p)
        dxdq = np.concatenate([dth, dx0[:, :, list(self.free_x0)]], axis=2)  # (N, S, Q)
        d = np.einsum("nos,nsq->noq", hx, dxdq)
        d[:, :, : hp.shape[2]] += hp
        return self.observables.values(self.integrator.times, x, p), d

    def jacobian(self, q, *, strict: bool = False) -> np.ndarray:
        """d residuals / d q (K, Q) (rows of :meth:`residuals`); a failed sensitivity solve raises
        :class:`ODESolveError` if ``strict`` and gives zeros otherwise."""
        try:
            mu, d = self.prediction_jacobian(q)
        except ODESolveError:
            if strict:
                raise
            return np.zeros((int(self.n_obs.sum()), np.size(q)))
        if self.noise is None:
            d = d / self.noise_sd[None, :, None]
        else:
            with np.errstate(all="ignore"):
                g = np.column_stack([m.d_residuals_d_mu(self.y[:, k], mu[:, k]) for k, m in enumerate(self.models())])
            d = d * np.where(np.isfinite(g), g, 0.0)[:, :, None]
        return d.reshape(self.y.size, -1) if self.n_obs.sum() == self.y.size else d[self.mask]

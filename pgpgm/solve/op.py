"""PyTensor Op around the CVODE solve: (theta, x0) -> trajectories, with gradients."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from ..errors import ODESolveError
from .base import ODESolver, SolverOptions
from ..ode.system import ODESystem


class ODEOp(Op):
    """Solve the ODE at fixed times inside a PyTensor graph.

    ``op(theta, x0)`` returns a matrix (N, S): the states at ``times`` (x0 is the
    state at ``times[0]``). The gradient uses forward sensitivities, so the Op works
    under NUTS and :func:`pytensor.gradient.verify_grad`.

    Parameters
    ----------
    system : ODESystem
    times : array (N,)
    backend : see :class:`~pgpgm.solve.base.ODESolver`
    options : SolverOptions
    on_failure : ``"raise"`` (an :class:`ODESolveError`) or ``"nan"`` (a NaN matrix,
        which :func:`pgpgm.build_model` turns into a -inf log-density).
    """

    def __init__(
        self,
        system: ODESystem,
        times,
        *,
        backend: str = "auto",
        options: SolverOptions | None = None,
        on_failure: str = "raise",
    ):
        if on_failure not in ("raise", "nan"):
            raise ValueError("on_failure must be 'raise' or 'nan'")
        self.solver = ODESolver(system, times, backend=backend, options=options)
        self.on_failure = on_failure
        self._sens = _ODESensitivityOp(self.solver, on_failure)

    def make_node(self, theta, x0):
        theta = pt.as_tensor_variable(theta, dtype="float64")
        x0 = pt.as_tensor_variable(x0, dtype="float64")
        return Apply(self, [theta, x0], [pt.dmatrix()])

    def perform(self, node, inputs, outputs):
        theta, x0 = inputs
        try:
            y = self.solver.solve(theta, x0)
        except ODESolveError:
            if self.on_failure == "raise":
                raise
            y = np.full((self.solver.times.size, self.solver.system.n_states), np.nan)
        outputs[0][0] = y

    def infer_shape(self, node, shapes):
        return [(self.solver.times.size, self.solver.system.n_states)]

    def pullback(self, inputs, outputs, cotangents):
        """Vector-Jacobian product from forward sensitivities: (g . dx/dtheta, g . dx/dx0)."""
        _, d_theta, d_x0 = self._sens(*inputs)
        g = cotangents[0]
        return [pt.tensordot(g, d_theta, axes=[[0, 1], [0, 1]]), pt.tensordot(g, d_x0, axes=[[0, 1], [0, 1]])]

    def __str__(self) -> str:
        return f"ODEOp({self.solver.system.name}, {self.solver.backend})"


class _ODESensitivityOp(Op):
    """(theta, x0) -> (x (N,S), dx/dtheta (N,S,P), dx/dx0 (N,S,S)); no gradient of its own."""

    def __init__(self, solver: ODESolver, on_failure: str):
        self.solver = solver
        self.on_failure = on_failure

    def make_node(self, theta, x0):
        theta = pt.as_tensor_variable(theta, dtype="float64")
        x0 = pt.as_tensor_variable(x0, dtype="float64")
        return Apply(self, [theta, x0], [pt.dmatrix(), pt.dtensor3(), pt.dtensor3()])

    def perform(self, node, inputs, outputs):
        try:
            res = self.solver.solve_sensitivities(*inputs)
        except ODESolveError:
            if self.on_failure == "raise":
                raise
            N, S, P = self.solver.times.size, self.solver.system.n_states, self.solver.system.n_parameters
            res = (np.full((N, S), np.nan), np.full((N, S, P), np.nan), np.full((N, S, S), np.nan))
        for o, r in zip(outputs, res):
            o[0] = r


def _register_numba_fallback() -> None:
    """Run the Ops' Python ``perform`` under PyTensor's numba backend without a warning each compile."""
    import warnings

    try:
        from pytensor.link.numba.dispatch.basic import generate_fallback_impl, numba_funcify
    except ImportError:  # other PyTensor layouts: the default fallback (with its warning) applies
        return

    def funcify(op, node=None, storage_map=None, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return generate_fallback_impl(op, node, storage_map, **kwargs)

    for cls in (ODEOp, _ODESensitivityOp):
        numba_funcify.register(cls)(funcify)


_register_numba_fallback()

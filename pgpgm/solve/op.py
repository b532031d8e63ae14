"""The ODE solve inside a PyTensor graph: one Op, one solve for values and gradients.

``ODEOp(integrator)(theta, x0)`` is the state matrix (N, S). Its gradient asks for
``ODEOp(integrator, sensitivities=True)``, whose one augmented solve returns the states
and their forward sensitivities together; a graph rewrite then lets the plain node
reuse that node's states, so a log density and its gradient cost one solve (as
sunode's ``solve_ivp`` returns values and sensitivities from one solve).

Under PyTensor's numba backend (PyMC's default, and nutpie's) an Op whose solver is
:class:`~pgpgm.solve.cvode.CVODE` runs as compiled code (:mod:`.numba_op`), with no
Python between the sampler and CVODE; other solvers run ``perform`` in object mode.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.rewriting.basic import register_canonicalize

from ..errors import ODESolveError
from .integrator import Integrator
from .numba_op import cache_key, numba_ode_function


class ODEOp(Op):
    """Solve the ODE at the integrator's times inside a PyTensor graph.

    ``op(theta, x0)`` takes theta (P,) and x0 (S,), the state at ``times[0]``, and returns
    x (N, S) - or the triple (x, dx/dtheta, dx/dx0) with ``sensitivities=True``.

    Parameters
    ----------
    integrator : Integrator (system, output times, solver)
    sensitivities : also return dx/dtheta (N, S, P) and dx/dx0 (N, S, S)
    on_failure : ``"raise"`` (an :class:`ODESolveError`) or ``"nan"`` (NaN outputs, which
        :mod:`pgpgm.matching.density` turns into a -inf log density, i.e. a rejected proposal)
    x0_free : the entries of x0 whose sensitivities are solved for (sorted state indices), or None
        for all. The others' columns of dx/dx0, and so their gradients, are 0: give it where those
        entries are constants (known initial values), to solve S (1 + P + F) equations for F free
        ones instead of S (1 + P + S) (``build_ode_model`` does)
    """

    __props__ = ("integrator", "sensitivities", "on_failure", "x0_free")

    def __init__(self, integrator: Integrator, *, sensitivities: bool = False, on_failure: str = "raise",
                 x0_free: tuple[int, ...] | None = None):
        if on_failure not in ("raise", "nan"):
            raise ValueError("on_failure must be 'raise' or 'nan'")
        S = integrator.system.n_states
        if x0_free is not None:
            x0_free = tuple(int(j) for j in x0_free)
            if list(x0_free) != sorted(set(x0_free)) or any(not 0 <= j < S for j in x0_free):
                raise ValueError(f"x0_free must be sorted, distinct state indices in [0, {S}), got {x0_free}")
            if len(x0_free) == S:
                x0_free = None  # every entry: the same Op as the default
        self.integrator = integrator
        self.sensitivities = bool(sensitivities)
        self.on_failure = on_failure
        self.x0_free = x0_free

    def make_node(self, theta, x0):
        theta = pt.as_tensor_variable(theta, dtype="float64")
        x0 = pt.as_tensor_variable(x0, dtype="float64")
        outs = [pt.dmatrix()] + ([pt.dtensor3(), pt.dtensor3()] if self.sensitivities else [])
        return Apply(self, [theta, x0], outs)

    def perform(self, node, inputs, outputs):
        it = self.integrator
        try:
            res = it.solve_sensitivities(*inputs) if self.sensitivities else (it.solve(*inputs),)
        except ODESolveError:
            if self.on_failure == "raise":
                raise
            N, S, P = it.times.size, it.system.n_states, it.system.n_parameters
            res = (np.full((N, S), np.nan), np.full((N, S, P), np.nan), np.full((N, S, S), np.nan))
        if self.sensitivities and self.x0_free is not None:  # as the compiled Op: the others' columns are 0
            fixed = np.setdiff1d(np.arange(it.system.n_states), self.x0_free)
            res[2][:, :, fixed] = 0.0
        for o, r in zip(outputs, res):
            o[0] = r

    def infer_shape(self, node, input_shapes):
        N, S, P = self.integrator.times.size, self.integrator.system.n_states, self.integrator.system.n_parameters
        return [(N, S), (N, S, P), (N, S, S)][: len(node.outputs)]

    def pullback(self, inputs, outputs, cotangents):
        """Vector-Jacobian product from the forward sensitivities: (g . dx/dtheta, g . dx/dx0)."""
        if self.sensitivities:
            if not all(isinstance(c.type, DisconnectedType) for c in cotangents[1:]):
                return [grad_not_implemented(self, k, v, "second derivatives of the ODE solution")
                        for k, v in enumerate(inputs)]
            d_theta, d_x0 = outputs[1], outputs[2]
        else:
            _, d_theta, d_x0 = ODEOp(self.integrator, sensitivities=True, on_failure=self.on_failure,
                                     x0_free=self.x0_free)(*inputs)
        g = cotangents[0]
        # an elementwise product and sum, not a tensordot: PyTensor's numba backend compiles its Dot (BLAS)
        # in seconds, this in a fraction (step 4's model of a new system compiles in ~0.6x the time)
        return [(g[:, :, None] * d_theta).sum(axis=(0, 1)), (g[:, :, None] * d_x0).sum(axis=(0, 1))]

    def __str__(self) -> str:
        kind = "ODESensitivityOp" if self.sensitivities else "ODEOp"
        return f"{kind}({self.integrator.system.name}, {self.integrator.solver.name})"


@register_canonicalize
@node_rewriter([ODEOp])
def share_ode_solve(fgraph, node):
    """A plain ODE node whose inputs also feed a sensitivity node of the same integrator
    takes its states from that node: one solve serves the value and the gradient."""
    op = node.op
    if op.sensitivities:
        return None
    for client, _ in fgraph.clients[node.inputs[0]]:
        if (client != "output" and isinstance(client.op, ODEOp) and client.op.sensitivities
                and client.op.integrator is op.integrator and client.op.on_failure == op.on_failure
                and client.op.x0_free == op.x0_free and client.inputs == node.inputs):
            return [client.outputs[0]]
    return None


def _register_numba() -> None:
    """Give PyTensor's numba backend the compiled Op (:mod:`.numba_op`) where the solver is
    CVODE or DOPRI5, with a cache key (:func:`.numba_op.cache_key`) so that PyTensor caches the compiled
    graph on disk and a new process loads it instead of compiling; other solvers run the
    Op's Python ``perform`` in object mode, without a warning at each compile (not cached)."""
    import warnings

    try:
        from pytensor.link.numba.dispatch.basic import (
            generate_fallback_impl,
            register_funcify_and_cache_key,
        )
    except ImportError:  # other PyTensor layouts: the default fallback (with its warning) applies
        return

    @register_funcify_and_cache_key(ODEOp)
    def funcify(op, node=None, storage_map=None, **kwargs):
        compiled = numba_ode_function(op)
        if compiled is not None:
            return compiled, cache_key(op)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return generate_fallback_impl(op, node, storage_map, **kwargs), None


_register_numba()

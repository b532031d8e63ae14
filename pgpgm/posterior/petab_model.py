"""Step 4 of a PEtab problem: its posterior as a ``pm.Model`` over the estimated parameters on their scales.

:func:`build_petab_model` writes one scalar variable per estimated parameter (named by its parameterId, its
value on the parameter's ``parameterScale``) with the parameter's objective prior, and PEtab's log-likelihood
as a ``pm.Potential`` of a PyTensor Op (:class:`PetabLogLikelihood`) whose gradient comes from the problem's
forward sensitivities (:meth:`~pgpgm.petab.PetabProblem.nll_and_gradient`). A solve that fails is a -inf log
density: a rejected proposal, never an exception.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from ..errors import DataError, ODESolveError
from ..petab import PetabProblem

#: the objective priors step 4 writes (on the parameter's scale, as PEtab's ``parameterScale...`` types say);
#: ``parameterScaleUniform`` within the bounds where the table gives none
PRIORS = ("parameterScaleUniform", "parameterScaleNormal", "parameterScaleLaplace")


class _Evaluations:
    """The problem's negative log-likelihood and gradient at the last point asked for: a log density and its
    gradient at one point (the two Ops below) cost one solve of every experiment. A failed solve is an
    infinite negative log-likelihood with a zero gradient."""

    def __init__(self, problem: PetabProblem):
        self.problem = problem
        self.key: bytes | None = None
        self.value: tuple[float, np.ndarray] | None = None

    def __call__(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        key = np.asarray(z, float).tobytes()
        if key != self.key:
            ok = bool(np.all(np.isfinite(z)))  # a proposal at a transform's infinite end: no density there
            try:
                if ok:
                    nll, grad = self.problem.nll_and_gradient(z)
                    ok = np.isfinite(nll) and np.all(np.isfinite(grad))
            except (ODESolveError, FloatingPointError, ZeroDivisionError, OverflowError):
                ok = False
            self.key = key
            self.value = (float(nll), np.asarray(grad, float)) if ok else (np.inf, np.zeros(len(z)))
        return self.value


class PetabLogLikelihood(Op):
    """PEtab's log-likelihood of the estimated parameters ``z`` (V_e,) on their scales, a scalar (-inf where a
    solve fails); its gradient by :class:`PetabGradient` from the same evaluation."""

    def __init__(self, problem: PetabProblem):
        self.evaluations = _Evaluations(problem)
        self.name = problem.files.yaml.name
        self.gradient = PetabGradient(self.evaluations, self.name)

    def make_node(self, z):
        z = pt.as_tensor_variable(z).astype("float64")
        return Apply(self, [z], [pt.dscalar()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.asarray(-self.evaluations(inputs[0])[0], dtype=np.float64)

    def grad(self, inputs, output_grads):
        return [output_grads[0] * self.gradient(inputs[0])]


class PetabGradient(Op):
    """The gradient (V_e,) of :class:`PetabLogLikelihood` at ``z`` (V_e,)."""

    def __init__(self, evaluations: _Evaluations, name: str):
        self.evaluations, self.name = evaluations, name

    def make_node(self, z):
        z = pt.as_tensor_variable(z).astype("float64")
        return Apply(self, [z], [pt.dvector()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = -self.evaluations(inputs[0])[1]


def check_petab_priors(problem: PetabProblem) -> None:
    """A DataError naming every estimated parameter whose objective prior step 4 cannot write (types other
    than :data:`PRIORS`) or whose bounds leave a uniform prior improper."""
    bad = [f"{p.id} ({p.prior})" for p in problem.estimated if p.prior not in PRIORS]
    if bad:
        raise DataError(f"step 4 writes the objective priors {list(PRIORS)}; {bad} have others: fit with "
                        "posterior=None, or give those parameters one of these prior types")
    lower, upper = problem.bounds()
    open_ = [p.id for p, lo, hi in zip(problem.estimated, lower, upper)
             if p.prior == "parameterScaleUniform" and not (np.isfinite(lo) and np.isfinite(hi))]
    if open_:
        raise DataError(f"{open_} have a uniform prior without finite bounds (on their scales): give them "
                        "lowerBound and upperBound, or another objective prior")


def build_petab_model(problem: PetabProblem) -> tuple[pm.Model, tuple[str, ...]]:
    """The posterior of ``problem`` as a ``pm.Model`` and the names of its variables (V_e,): one scalar per
    estimated parameter, its value on the parameter's scale, with its objective prior (uniform within its
    bounds by default; ``parameterScaleNormal`` / ``parameterScaleLaplace`` with their (mean, scale)), and
    PEtab's log-likelihood as the ``pm.Potential`` ``loglikelihood``."""
    check_petab_priors(problem)
    lower, upper = problem.bounds()
    names = tuple(p.id for p in problem.estimated)
    with pm.Model(coords={"parameter": list(names)}) as model:
        z = [_prior(p, lo, hi) for p, lo, hi in zip(problem.estimated, lower, upper)]
        pm.Potential("loglikelihood", PetabLogLikelihood(problem)(pt.stack(z)))
    return model, names


def _prior(p, lower: float, upper: float):
    """The variable of one estimated parameter on its scale, with its objective prior."""
    if p.prior == "parameterScaleUniform":
        return pm.Uniform(p.id, lower=float(lower), upper=float(upper))
    mean, scale = (float(x) for x in p.prior_parameters)
    lo, hi = (float(b) if np.isfinite(b) else None for b in (lower, upper))
    if p.prior == "parameterScaleNormal":
        return pm.TruncatedNormal(p.id, mu=mean, sigma=scale, lower=lo, upper=hi)
    return pm.Truncated(p.id, pm.Laplace.dist(mu=mean, b=scale), lower=lo, upper=hi)

"""A PEtab problem: :func:`load_petab` reads it, :class:`PetabProblem` simulates and scores it.

Values given by a mapping (``nll``, ``chi2``, ``simulate``) are on the linear scale, keyed by the
parameter table's ids; values given as a vector (``nll_and_gradient``, ``residuals``) are the
estimated parameters on their ``parameterScale``, in the order of :attr:`PetabProblem.estimated`
- what a fitter works on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..ode.system import ODESystem
from ..solve.base import Solver
from ..solve.cvode import CVODE
from .mapping import (
    Conditions,
    Experiments,
    Measurements,
    PetabParameter,
    read_conditions,
    read_measurements,
    read_parameters,
)
from .observables import Observable, likelihood_terms, read_observables
from .reference import align_simulation, petab_llh
from .sbml import SbmlModel, read_sbml
from .simulation import ExperimentInputs, Simulator, States, SteadyState
from .tables import PetabFiles, Table

#: The solver tolerances of PEtab problems unless :func:`load_petab` is given a solver: tighter than
#: pgpgm's default, as the benchmark problems' reference simulations are.
DEFAULT_RTOL, DEFAULT_ATOL = 1e-10, 1e-12
#: the constant C of :meth:`PetabProblem.noise_residuals`' sqrt(2 log sigma + C): sigmas down to exp(-25)
SIGMA_OFFSET = 50.0


@dataclass(frozen=True, eq=False)
class _Evaluation:
    """h, sigma and the likelihood terms of every measurement (D,), with their derivatives with
    respect to the estimated parameters (D, V_e) where asked."""

    h: np.ndarray
    sigma: np.ndarray
    nll: np.ndarray
    residual: np.ndarray
    d_nll: np.ndarray | None = None
    d_residual: np.ndarray | None = None
    d_sigma: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class PetabProblem:
    """A PEtab v1 problem, ready to simulate and score.

    Attributes
    ----------
    files : the problem's files
    model : the SBML model's ODEs (:attr:`system` is its :class:`~pgpgm.ode.system.ODESystem`)
    parameters : the parameter table's rows, in order (length V)
    conditions, experiments, measurements, observables : the tables as arrays
    simulator : solves the experiments
    """

    files: PetabFiles
    model: SbmlModel
    parameters: tuple[PetabParameter, ...]
    conditions: Conditions
    experiments: Experiments
    measurements: Measurements
    observables: tuple[Observable, ...]
    simulator: Simulator

    # ------------------------------------------------------------------------------ parameters
    @property
    def system(self) -> ODESystem:
        """The ODE system of the SBML model (states and the constants its right-hand side uses)."""
        return self.model.system

    @property
    def estimated(self) -> tuple[PetabParameter, ...]:
        """The estimated parameters, in the order of a fitter's vector."""
        return tuple(p for p in self.parameters if p.estimate)

    def nominal_parameters(self) -> dict[str, float]:
        """Every parameter of the parameter table at its nominal value (linear scale)."""
        return {p.id: p.nominal for p in self.parameters}

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds of the estimated parameters on their scales, (V_e,) each."""
        est = self.estimated
        with np.errstate(divide="ignore"):
            return (np.array([p.to_scale(p.lower) for p in est], float),
                    np.array([p.to_scale(p.upper) for p in est], float))

    def to_scale(self, parameters: Mapping[str, float]) -> np.ndarray:
        """The estimated parameters' values (linear scale, by id) as a vector on their scales (V_e,)."""
        v = self._vector(parameters)
        return np.array([p.to_scale(v[i]) for i, p in enumerate(self.parameters) if p.estimate], float)

    def from_scale(self, z) -> dict[str, float]:
        """Every parameter (linear scale, by id) for the estimated ones ``z`` on their scales (V_e,);
        the others at their nominal values."""
        z = np.asarray(z, float).reshape(-1)
        est = self.estimated
        if z.shape != (len(est),):
            raise DataError(f"the vector must have {len(est)} values, one per estimated parameter "
                            f"{[p.id for p in est]}, got {z.size}")
        out = self.nominal_parameters()
        out.update({p.id: float(p.from_scale(x)) for p, x in zip(est, z)})
        return out

    def _vector(self, parameters: Mapping[str, float]) -> np.ndarray:
        """The parameter table's values (V,), linear scale: given ones, else nominal for fixed ones."""
        if not isinstance(parameters, Mapping):
            raise DataError(f"parameters must map parameter ids to values, got {type(parameters).__name__}")
        known = {p.id for p in self.parameters}
        unknown = sorted(set(parameters) - known)
        if unknown:
            raise DataError(f"{unknown} are not in the parameter table {self.files.parameters}")
        missing = [p.id for p in self.parameters if p.estimate and p.id not in parameters]
        if missing:
            raise DataError(f"no values for the estimated parameters {missing}; start from nominal_parameters()")
        v = np.array([float(parameters.get(p.id, p.nominal)) for p in self.parameters])
        bad = [p.id for p, x in zip(self.parameters, v) if not np.isfinite(x)]
        if bad:
            raise DataError(f"the parameters {bad} are not finite")
        return v

    @cached_property
    def _column(self) -> np.ndarray:
        est = np.array([p.estimate for p in self.parameters], bool)
        return np.where(est, np.cumsum(est) - 1, -1)

    # ------------------------------------------------------------------------------ evaluation
    def _evaluate(self, v: np.ndarray, derivatives: bool) -> _Evaluation:
        states: States = self.simulator.run(v, self._column if derivatives else None)
        m = self.measurements
        consts = self.conditions.constants.take(v)
        dconsts = self._constant_jacobian if derivatives else None
        sim = np.array([p[1] for p in self.experiments.pairs])[m.experiment]  # (D,) simulation condition
        placeholders = {"o": m.observable_parameters, "n": m.noise_parameters}
        D, Ve = m.value.size, len(self.estimated)
        out = {k: np.empty(D) for k in ("h", "sigma", "nll", "residual")}
        d_nll = np.zeros((D, Ve)) if derivatives else None
        d_res = np.zeros((D, Ve)) if derivatives else None
        d_sig = np.zeros((D, Ve)) if derivatives else None
        for o, obs in enumerate(self.observables):
            rows = np.flatnonzero(m.observable == o)
            if not rows.size:
                continue
            cols, dcols = [], []
            for kind, i in obs.inputs:
                if kind == "t":
                    cols.append(m.time[rows])
                elif kind == "x":
                    cols.append(states.x[m.point[rows], i])
                elif kind == "c":
                    cols.append(consts[sim[rows], i])
                elif kind == "v":
                    cols.append(np.full(rows.size, v[i]))
                else:
                    cols.append(placeholders[kind].take(v)[rows, i])
                if derivatives:
                    dcols.append(self._input_derivative(kind, i, rows, states, dconsts, sim))
            if derivatives:
                h, sigma, dh, dsigma = obs.evaluate(cols, True)
            else:
                h, sigma = obs.evaluate(cols)
            terms = likelihood_terms(m.value[rows], h, sigma, obs.transformation, obs.distribution)
            out["h"][rows], out["sigma"][rows], out["nll"][rows], out["residual"][rows] = \
                h, sigma, terms.nll, terms.residual
            if derivatives:
                dinputs = np.stack(dcols, 1) if dcols else np.zeros((rows.size, 0, Ve))  # (R, I, V_e)
                dh_v = np.einsum("ri,riv->rv", dh, dinputs)
                ds_v = np.einsum("ri,riv->rv", dsigma, dinputs)
                d_nll[rows] = terms.d_h[:, None] * dh_v + terms.d_sigma[:, None] * ds_v
                d_res[rows] = terms.d_residual_h[:, None] * dh_v + terms.d_residual_sigma[:, None] * ds_v
                d_sig[rows] = ds_v
        return _Evaluation(out["h"], out["sigma"], out["nll"], out["residual"], d_nll, d_res, d_sig)

    def _input_derivative(self, kind, i, rows, states, dconsts, sim) -> np.ndarray:
        """d input / d estimated parameters for the measurements ``rows``: (R, V_e)."""
        m = self.measurements
        Ve = len(self.estimated)
        if kind == "t":
            return np.zeros((rows.size, Ve))
        if kind == "x":
            return states.dx[m.point[rows], i]
        if kind == "c":
            return dconsts[sim[rows], i]
        if kind == "v":
            d = np.zeros((rows.size, Ve))
            if self._column[i] >= 0:
                d[:, self._column[i]] = 1.0
            return d
        return self._placeholder_jacobians[kind][rows, i]

    @cached_property
    def _constant_jacobian(self) -> np.ndarray:
        """d constant / d estimated parameters, (C, M, V_e)."""
        return self.conditions.constants.jacobian(self._column)

    @cached_property
    def _placeholder_jacobians(self) -> dict[str, np.ndarray]:
        """d placeholder value / d estimated parameters, (D, K, V_e), for 'o' and 'n'."""
        m = self.measurements
        return {"o": m.observable_parameters.jacobian(self._column), "n": m.noise_parameters.jacobian(self._column)}

    # ------------------------------------------------------------------------------ public scores
    def nll(self, parameters: Mapping[str, float]) -> float:
        """PEtab's negative log-likelihood at ``parameters`` (id -> value, linear scale; fixed
        parameters default to their nominal values): minus the PEtab test suite's ``llh``.

        Raises
        ------
        DataError
            An unknown id, a missing estimated parameter, a value that is not finite.
        ODESolveError
            A solve fails, a steady state is not reached, or an initial value is not finite
            (also raised by the other scores and :meth:`nll_and_gradient`)."""
        return float(self._evaluate(self._vector(parameters), False).nll.sum())

    def chi2(self, parameters: Mapping[str, float]) -> float:
        """The sum of squared residuals (T(h) - T(m)) / sigma on each observable's transformed scale."""
        return float(np.sum(self._evaluate(self._vector(parameters), False).residual ** 2))

    def nll_and_gradient(self, z) -> tuple[float, np.ndarray]:
        """The negative log-likelihood and its gradient with respect to the estimated parameters on
        their scales, at ``z`` (V_e,) on those scales; forward sensitivities, one solve per experiment
        (and preequilibration or steady state)."""
        v = self._vector(self.from_scale(z))
        ev = self._evaluate(v, True)
        grad = ev.d_nll.sum(0) * self._scale_derivative(v)
        return float(ev.nll.sum()), grad

    def experiment_inputs(self, z) -> list[ExperimentInputs]:
        """Each experiment's ODE parameters and initial states (what :attr:`system` is solved with) at
        ``z`` (V_e,) on the parameters' scales; see :class:`~pgpgm.petab.simulation.ExperimentInputs`."""
        return self.simulator.inputs(self._vector(self.from_scale(z)))

    def residuals(self, z, jacobian: bool = False):
        """The weighted residuals (T(h) - T(m)) / sigma of all measurements (D,) at ``z`` (V_e,) on the
        parameters' scales, and with ``jacobian`` their derivatives (D, V_e).

        Half their sum of squares differs from :meth:`nll` by a constant only where every noise
        model is normal and no sigma depends on an estimated parameter (:attr:`least_squares`)."""
        v, ev = self._normal_evaluation(z, jacobian)
        if not jacobian:
            return ev.residual
        return ev.residual, ev.d_residual * self._scale_derivative(v)[None, :]

    def _normal_evaluation(self, z, derivatives: bool) -> tuple[np.ndarray, _Evaluation]:
        """(the parameter table's values (V,), the evaluation) at ``z`` (V_e,), for the sums of squares: a
        DataError where an observable has Laplace noise."""
        laplace = [o.id for o in self.observables if o.distribution != "normal"]
        if laplace:
            raise DataError(f"the observables {laplace} have Laplace noise, whose likelihood is no sum of squares; "
                            "fit with nll_and_gradient")
        v = self._vector(self.from_scale(z))
        return v, self._evaluate(v, derivatives)

    def noise_residuals(self, z, jacobian: bool = False):
        """Least squares of a likelihood with normal noise whose sigmas may be estimated: the weighted residuals
        of :meth:`residuals` followed by ``sqrt(2 log sigma + C)`` per measurement (C =
        :data:`SIGMA_OFFSET`, as AMICI writes them), (2D,) at ``z`` (V_e,) on the parameters' scales, and with
        ``jacobian`` their derivatives (2D, V_e): half their sum of squares is :meth:`nll` up to a constant, so
        that Gauss-Newton methods fit the noise parameters with the others. A sigma below exp(-C / 2) is a
        :class:`ValueError`.

        Raises
        ------
        DataError
            for observables with Laplace noise."""
        v, ev = self._normal_evaluation(z, jacobian)
        with np.errstate(all="ignore"):
            s2 = 2.0 * np.log(ev.sigma) + SIGMA_OFFSET
        if not np.all(s2 > 0):
            raise ValueError(f"a noise sigma below exp(-{SIGMA_OFFSET / 2:g}): no residual form of its likelihood")
        s = np.sqrt(s2)
        r = np.concatenate([ev.residual, s])
        if not jacobian:
            return r
        ds = ev.d_sigma / (ev.sigma * s)[:, None]
        return r, np.vstack([ev.d_residual, ds]) * self._scale_derivative(v)[None, :]

    @property
    def least_squares(self) -> bool:
        """Whether :meth:`residuals` is the whole fit: normal noise everywhere, and no noise formula
        that depends on an estimated parameter or a state."""
        est = [i for i, p in enumerate(self.parameters) if p.estimate]
        for o, obs in enumerate(self.observables):
            if obs.distribution != "normal":
                return False
            noise_symbols = obs.noise.free_symbols
            for (kind, i), s in zip(obs.inputs, obs.symbols):
                if s not in noise_symbols:
                    continue
                if kind == "x" or kind == "v" and i in est or kind == "c" and self._constant_estimated(i):
                    return False
                sources = {"n": self.measurements.noise_parameters, "o": self.measurements.observable_parameters}
                if kind in sources and np.isin(sources[kind].index[self.measurements.observable == o, i], est).any():
                    return False
        return True

    def _constant_estimated(self, k: int) -> bool:
        est = {i for i, p in enumerate(self.parameters) if p.estimate}
        return bool(np.isin(self.conditions.constants.index[:, k], list(est)).any())

    def _scale_derivative(self, v: np.ndarray) -> np.ndarray:
        return np.array([p.derivative(v[i]) for i, p in enumerate(self.parameters) if p.estimate], float)

    def simulate(self, parameters: Mapping[str, float]) -> pd.DataFrame:
        """A PEtab simulation table: the measurement table with the column 'simulation' (the
        observables' simulated values, untransformed) in place of 'measurement'."""
        ev = self._evaluate(self._vector(parameters), False)
        table = self.measurements.frame.copy()
        at = list(table.columns).index("measurement")
        table = table.drop(columns="measurement")
        table.insert(at, "simulation", ev.h)
        table["time"] = self.measurements.time
        return table

    def align(self, table: pd.DataFrame | str | Path) -> np.ndarray:
        """The simulated values of another tool's simulation table (a frame or a TSV file), in the
        order of this problem's measurements (D,); see
        :func:`pgpgm.petab.reference.align_simulation`."""
        path = table if isinstance(table, str | Path) else "the simulation table"
        if isinstance(table, str | Path):
            table = Table.read(Path(table), ["simulation", "time"], "simulation").frame
        return align_simulation(self.measurements.frame, table, path)

    def petab_llh(self, simulation, parameters: Mapping[str, float] | None = None) -> float:
        """The petab library's log-likelihood of simulated values (D,) in the order of this problem's
        measurements, its noise parameters at the table's nominal values or at ``parameters`` (an independent
        check of :meth:`nll`; needs the problem's files)."""
        return petab_llh(self.files.yaml, simulation, parameters)

    def __repr__(self) -> str:
        return (f"PetabProblem({self.files.yaml.name}: {len(self.model.states)} states, "
                f"{len(self.estimated)} of {len(self.parameters)} parameters estimated, "
                f"{len(self.conditions.ids)} condition{'s' * (len(self.conditions.ids) != 1)}, "
                f"{self.measurements.value.size} measurements)")


def load_petab(path: str | Path, *, solver: Solver | None = None,
               steady_state: SteadyState | None = None) -> PetabProblem:
    """Read a PEtab v1 problem from its YAML file.

    Parameters
    ----------
    path : the problem's YAML file
    solver : the ODE solver (default: CVODE with rtol 1e-10, atol 1e-12)
    steady_state : the test of a steady state (preequilibration, ``time = inf`` measurements; default
        :class:`SteadyState`())

    Returns
    -------
    PetabProblem

    Raises
    ------
    DataError
        A missing file, an unreadable table or cell (naming its file, line and column).
    ModelDefinitionError
        A PEtab version or an SBML element that pgpgm does not simulate (named).
    """
    files = PetabFiles.read(path)
    ptable = Table.read(files.parameters, ["parameterId", "parameterScale", "lowerBound", "upperBound",
                                           "nominalValue", "estimate"], "parameter")
    parameters = read_parameters(ptable)
    index = {p.id: i for i, p in enumerate(parameters)}
    ctables = [Table.read(f, ["conditionId"], "condition") for f in files.conditions]
    keep = frozenset(index) | {c for t in ctables for c in t.frame.columns}
    model = read_sbml(files.sbml, keep)
    conditions = read_conditions(ctables, model, index)
    otables = [Table.read(f, ["observableId", "observableFormula", "noiseFormula"], "observable")
               for f in files.observables]
    observables = read_observables(otables, model, index)
    mtables = [Table.read(f, ["observableId", "simulationConditionId", "measurement", "time"], "measurement")
               for f in files.measurements]
    measurements, experiments = read_measurements(
        mtables, {o.id: (o.n_observable, o.n_noise) for o in observables}, conditions, index)
    _check_constants(model, conditions, experiments, parameters)
    solver = CVODE(rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL) if solver is None else solver
    simulator = Simulator(model, conditions, experiments, solver, steady_state or SteadyState())
    return PetabProblem(files, model, parameters, conditions, experiments, measurements, observables, simulator)


def _check_constants(model: SbmlModel, conditions: Conditions, experiments: Experiments,
                     parameters: tuple[PetabParameter, ...]) -> None:
    """Every constant an experiment uses has a value (from the SBML file or the tables)."""
    used = sorted({c for pair in experiments.pairs for c in pair if c >= 0})
    src = conditions.constants
    for c in used:
        bad = np.flatnonzero((src.index[c] < 0) & ~np.isfinite(src.value[c]))
        if bad.size:
            names = [model.constants[k] for k in bad]
            raise DataError(f"{model.path}: the constants {names} have no value in the model, and neither the "
                            f"condition {conditions.ids[c]} nor the parameter table sets them")

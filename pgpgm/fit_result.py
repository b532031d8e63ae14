"""The result of a fit: estimates, posterior, trajectories; save and load (NetCDF)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5netcdf
import numpy as np
import pandas as pd
import xarray as xr

from .errors import ODESolveError, ResultFileError
from .ode.system import ODESystem
from .plots import plot_parameters, plot_states
from .posterior.diagnostics import problems
from .refinement import AtBound, Refinement
from .refinement.optima import CompetingOptimum
from .solve import Integrator, Solver


@dataclass(frozen=True)
class FitResult:
    """Everything :func:`fit` produced.

    Attributes
    ----------
    system : the ODESystem
    posterior : ArviZ DataTree of the main posterior: NUTS on the ODE model (step 4, the
        default), its Laplace approximation, or the gradient-matching chains when the fit
        ran without step 4 (``fit(posterior=None)``)
    estimates : xarray.Dataset, ``x0`` (state) refined initial values; attributes
        ``refinement_nll`` (the negative log likelihood at the refined point, :attr:`nll`) and
        ``refinement_cost`` (1/2 the sum of squared residuals over the given noise sds; NaN
        when the noise sds were estimated, where it is N/2 at every optimum); ``nll_per_start``
        (start: ``"pooled mean"``, then ``"chain <c> mean"`` for each chain, or ``"last check's
        best optimum"`` when step 2 stopped early) negative log likelihood of each refinement
        start, ``theta`` (estimate, parameter) for ``sampled``
        (gradient-matching posterior mean), ``refined`` and, with step 4, ``posterior``
        (its mean); ``stderr`` (parameter) of the refined estimate; ``truth`` (parameter)
        when known
    trajectories : xarray.Dataset, ``x`` (estimate, time_dense, state) integrated from x0
        for each estimate (and ``truth`` when known); ``y`` (time, observed)
    timings : seconds per step; n_ode_solves : solves per step
    gradient_matching : ArviZ DataTree of the gradient-matching chains (step 2)
    diagnostics : xarray.Dataset, ``rhat``, ``ess_bulk``, ``ess_tail`` (sampler, variable)
        and ``divergences`` (sampler) for ``sampler`` in ``gradient_matching`` and, with
        step 4, ``posterior``
    """

    system: ODESystem
    posterior: object
    estimates: xr.Dataset
    trajectories: xr.Dataset
    timings: Mapping[str, float]
    n_ode_solves: Mapping[str, int]
    gradient_matching: object = None
    diagnostics: xr.Dataset | None = None

    @property
    def theta(self) -> np.ndarray:
        """The refined parameter estimate (P,)."""
        return self.estimates["theta"].sel(estimate="refined").values

    @property
    def nll(self) -> float:
        """The negative log likelihood of the data at the refined point (nats; constants
        included; noise sds at their estimates or given values): two fits of the same data
        compare by it, the lower the better (on the original scale of the data for lognormal
        noise)."""
        return float(self.estimates.attrs["refinement_nll"])

    @property
    def nll_per_start(self) -> pd.Series:
        """The negative log likelihood reached from each start of the refinement (step 3), by start."""
        e = self.estimates["nll_per_start"]
        return pd.Series(e.values, index=pd.Index([str(s) for s in e["start"].values], name="start"),
                         name="negative_log_likelihood")

    @property
    def competing_optima(self) -> pd.DataFrame:
        """Other optima where the data fit about as well as at the refined point (within 2 nats of its
        negative log likelihood, some parameter more than 5 standard errors (of either) away;
        :mod:`pgpgm.refinement.optima`): one row each, best first, with every parameter, the
        ``negative_log_likelihood``, ``delta_nll`` (nats above the refined point), ``exchanged``
        (e.g. ``"ka <-> ke"`` when it is the refined point with two parameters exchanged, else ""),
        ``on_bounds`` (its parameters on a bound of the prior box, e.g. ``"ke on its upper bound 0.5"``)
        and ``origin`` (the start that found it). Empty when none was found (a
        :class:`~pgpgm.errors.CompetingOptimaWarning` names them when there are)."""
        e = self.estimates
        columns = [*self.system.parameters, "negative_log_likelihood", "delta_nll", "exchanged", "on_bounds",
                   "origin"]
        if "competing_theta" not in e:
            return pd.DataFrame(columns=columns)
        table = pd.DataFrame(e["competing_theta"].values, columns=list(self.system.parameters))
        table["negative_log_likelihood"] = e["competing_nll"].values
        table["delta_nll"] = e["competing_nll"].values - self.nll
        table["exchanged"] = [str(v) for v in e["competing_exchanged"].values]
        table["on_bounds"] = [str(v) for v in e["competing_on_bounds"].values]
        table["origin"] = [str(v) for v in e["competing_origin"].values]
        return table

    @property
    def x0(self) -> dict[str, float]:
        """The refined initial value of every state, by name."""
        return dict(zip(self.system.states, map(float, self.estimates["x0"].values)))

    @property
    def fixed(self) -> dict[str, float]:
        """The parameters held fixed (``fit(fixed=...)``) and their values."""
        e = self.estimates
        if "fixed" not in e:
            return {}
        ref = e["theta"].sel(estimate="refined").values
        return {p: float(v) for p, v, f in zip(self.system.parameters, ref, e["fixed"].values) if f}

    @property
    def at_bounds(self) -> dict[str, str]:
        """Parameters at a bound of their Uniform prior (refined estimate on it, or > 10 % of
        the posterior within 1 % of the box width of it): name -> the warning's text
        (:mod:`pgpgm.refinement.bounds`); empty when none is."""
        e = self.estimates
        if "at_bound" not in e:
            return {}
        messages = [m for m in str(e.attrs.get("bound_warnings", "")).split("\n") if m]
        return {str(p): next((m for m in messages if m.startswith(f"{p} ")), str(side))
                for p, side in zip(e["parameter"].values, e["at_bound"].values) if side}

    def parameter_table(self) -> pd.DataFrame:
        """Per parameter: true (if known), sampled (gradient-matching mean), refined with its
        standard error, and with step 4 the posterior mean, sd, 94 % interval and R-hat;
        ``at_bound`` (``"lower"``/``"upper"``, when some parameter is at a prior bound). A
        parameter held fixed shows its value in every estimate column, standard error and
        posterior sd 0, and ``fixed`` True (the column is there when some parameter is fixed).
        ``table.attrs["negative_log_likelihood"]`` is the refined point's (:attr:`nll`)."""
        e = self.estimates
        fixed = self.fixed
        params = list(self.system.parameters)
        table = pd.DataFrame({
            "sampled": e["theta"].sel(estimate="sampled").values,
            "refined": e["theta"].sel(estimate="refined").values,
            "refined_stderr": e["stderr"].values,
        }, index=pd.Index(params, name="parameter"))
        if "truth" in e:
            table.insert(0, "true", e["truth"].values)
        if "posterior" in e["estimate"].values:
            post = self.posterior.posterior
            stat = lambda p, f: fixed[p] if p in fixed else float(f(post[p]))
            table["posterior_mean"] = [stat(p, lambda v: v.mean()) for p in params]
            table["posterior_sd"] = [0.0 if p in fixed else float(post[p].std()) for p in params]
            table["hdi_3%"] = [stat(p, lambda v: v.quantile(0.03)) for p in params]
            table["hdi_97%"] = [stat(p, lambda v: v.quantile(0.97)) for p in params]
            if self.diagnostics is not None and "posterior" in self.diagnostics["sampler"].values:
                rhat = self.diagnostics["rhat"].sel(sampler="posterior")
                table["r_hat"] = [np.nan if p in fixed else float(rhat.sel(variable=p)) for p in params]
        if fixed:
            table["fixed"] = [p in fixed for p in params]
        if "at_bound" in e and any(e["at_bound"].values):
            table["at_bound"] = [str(v) for v in e["at_bound"].values]
        table.attrs["negative_log_likelihood"] = self.nll
        return table

    def summary(self, **kwargs) -> pd.DataFrame:
        """ArviZ's summary table of the main posterior's scalar quantities (parameters, and
        with step 4 the observed states' initial values and noise sds)."""
        import arviz as az

        post = self.posterior.posterior
        names = [n for n in post.data_vars if post[n].ndim == 2]
        return az.summary(self.posterior, var_names=names, **kwargs)

    def convergence_problems(self) -> dict[str, list[str]]:
        """Failed convergence checks per posterior (empty lists when every check passes)."""
        if self.diagnostics is None:
            return {}
        return {str(s): problems(_one_sampler(self.diagnostics, s)) for s in self.diagnostics["sampler"].values}

    def plot_states(self, **kwargs):
        """Every state: truth, observations, sampling-step and refined trajectories."""
        return plot_states(self, **kwargs)

    def plot_parameters(self, **kwargs):
        """Parameter estimates (sampled with its posterior, refined with +-2 se) against the truth."""
        return plot_parameters(self, **kwargs)

    def save(self, path: str | Path) -> Path:
        """Write the result to one NetCDF (HDF5) file, atomically and with a checksum.

        The file holds the posterior DataTree's groups plus ``pgpgm_estimates`` and
        ``pgpgm_trajectories``, the system, timings and solve counts as attributes, and a
        SHA-256 digest of all of it (attribute ``pgpgm_sha256``) that :func:`load_result`
        checks. It is written to a hidden temporary file in the same folder; the digest is
        computed by reading that file back (so every stored value has been read from disk
        once), the stored digest is read back once more, the file is flushed to disk and
        then renamed over ``path``: an interrupted save leaves an earlier file at ``path``
        intact (and, at worst, a ``.<name>.<random>.tmp`` file behind). The new file gets the
        default permissions, not those of a file it replaces. Arrays are stored
        uncompressed, in full float64 (a Laplace or NUTS posterior of a fit carries each
        draw's trajectories: 2000 draws x 400 times x 2 states are 12.8 MB).

        Returns
        -------
        pathlib.Path : ``path``

        Raises
        ------
        ResultFileError : ``path`` is a folder or anything else that is not a regular file
            (a device such as ``/dev/full``, a FIFO, a socket, a symbolic link: the rename
            would replace it), or its folder does not exist. Nothing is written then.
        """
        path = Path(path)
        check_replaceable(path, "the result")
        if not path.parent.is_dir():
            raise ResultFileError(f"cannot save the result to {path}: the folder {path.parent} does not exist; "
                                  "create it first")
        tree = _to_tree(self)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            tree.to_netcdf(tmp, engine="h5netcdf")
            with h5netcdf.File(tmp, "a") as f:
                digest = _digest(f)  # reads every value back from the written file
                f.attrs[CHECKSUM_ATTR] = digest
            try:
                _verify(tmp, written=digest)
            except ResultFileError as exc:
                raise ResultFileError(f"saving the result to {path} failed: the written file does not verify "
                                      f"({exc}); any earlier file at {path} is untouched") from exc
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            check_replaceable(path, "the result")  # again: something may have appeared there meanwhile
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_folder(path.parent)
        return path


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def check_replaceable(path: Path, what: str = "the file") -> None:
    """Raise :class:`ResultFileError` unless ``path`` is missing or a regular file: a save writes
    a temporary file and renames it over ``path``, which would replace a folder, a device node
    (``/dev/full``: run as root, the node itself is destroyed), a FIFO, a socket or a symbolic
    link (the link, not its target) silently."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ResultFileError(f"cannot save {what} to {path}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(mode):
        raise ResultFileError(f"cannot save {what} to {path}: it is a folder; give a file name such as "
                              f"{path / 'result.nc'}")
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    hint = (f" (to {os.path.realpath(path)}); save to the target itself or remove the link" if stat.S_ISLNK(mode)
            else "; give the path of a regular file, or of a new one")
    raise ResultFileError(f"cannot save {what} to {path}: it is {kind}, not a regular file, and saving would "
                          f"replace it{hint}")


CHECKSUM_ATTR = "pgpgm_sha256"
_GROUPS = ("pgpgm_estimates", "pgpgm_trajectories")


def _encode_system(system: ODESystem) -> str:
    """The system as the text stored in a result file (read back by :func:`_decode_system`)."""
    return json.dumps(system.to_dict())


def _decode_system(text: str) -> ODESystem:
    """The system stored by :func:`_encode_system`."""
    return ODESystem.from_dict(json.loads(text))


def _to_tree(result: FitResult) -> xr.DataTree:
    tree = result.posterior.copy()
    if result.gradient_matching is not None and result.gradient_matching is not result.posterior:
        tree["pgpgm_gradient_matching"] = result.gradient_matching.copy()
    if result.diagnostics is not None:
        tree["pgpgm_diagnostics"] = xr.DataTree(result.diagnostics)
    tree["pgpgm_estimates"] = xr.DataTree(result.estimates)
    tree["pgpgm_trajectories"] = xr.DataTree(result.trajectories)
    tree.attrs["pgpgm_system"] = _encode_system(result.system)
    tree.attrs["pgpgm_timings"] = json.dumps(dict(result.timings))
    tree.attrs["pgpgm_n_ode_solves"] = json.dumps(dict(result.n_ode_solves))
    return tree


def _plain(value):
    """An attribute or array element as a JSON-able Python value (bytes decoded)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.dtype.kind in "OSU" else value.tolist()
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _digest(f: h5netcdf.File) -> str:
    """SHA-256 of everything stored in an open file: groups, dimensions, attributes and every
    variable's name, dimensions, type, shape and values (the checksum attribute excepted)."""
    h = hashlib.sha256()

    def add(tag: str, value) -> None:
        data = value if isinstance(value, bytes) else json.dumps(_plain(value), sort_keys=True).encode()
        h.update(tag.encode() + len(data).to_bytes(8, "little") + data)

    def walk(group) -> None:
        add("group", group.name)
        add("dimensions", {k: len(v) for k, v in group.dimensions.items()})
        add("attrs", {k: v for k, v in group.attrs.items() if k != CHECKSUM_ATTR})
        for name in sorted(group.variables):
            var = group.variables[name]
            values = np.asarray(var[...])
            add("variable", [name, list(var.dimensions), list(values.shape), dict(var.attrs)])
            if values.dtype.kind in "OSU":  # strings: by value, whatever their storage type
                add("strings", values.reshape(-1))
            else:
                add(values.dtype.str, np.ascontiguousarray(values).tobytes())
        for name in sorted(group.groups):
            walk(group.groups[name])

    walk(f)
    return h.hexdigest()


def _verify(path: Path, *, require_checksum: bool = True, written: str | None = None) -> None:
    """Raise :class:`ResultFileError` unless ``path`` is a readable result file whose content
    matches its stored checksum. With ``written`` (the digest :meth:`FitResult.save` computed by
    reading the file back), the stored checksum must be that digest and the content is not read
    a second time (a second full pass would double the save's cost)."""
    name = path
    try:
        with h5netcdf.File(path, "r") as f:
            stored = f.attrs.get(CHECKSUM_ATTR)
            missing = [g for g in _GROUPS if g not in f.groups]
            actual = written if written is not None else _digest(f) if stored is not None else None
    except Exception as exc:  # any failure to read the HDF5 structure means a damaged file
        raise ResultFileError(f"the result file {name} is damaged or truncated: it cannot be read as HDF5/NetCDF "
                              f"({type(exc).__name__}: {exc}); save the result again or restore a copy") from exc
    if missing:
        raise ResultFileError(f"{name} is not a pgpgm result file: it lacks the group(s) {missing} that "
                              "FitResult.save writes")
    if stored is None and written is None:
        if require_checksum:
            raise ResultFileError(f"the result file {name} has no checksum ({CHECKSUM_ATTR}), so it cannot be "
                                  "verified (it was written by an older pgpgm); load it unverified with "
                                  "load_result(path, verify=False)")
        return
    if _plain(stored) != actual:
        raise ResultFileError(f"the result file {name} is damaged: its content does not match the checksum "
                              f"written when it was saved (stored checksum {str(_plain(stored))[:12]}..., now "
                              f"{actual[:12]}...); save the result again or restore a copy")


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_result(path: str | Path, *, verify: bool = True) -> FitResult:
    """Read a result written by :meth:`FitResult.save`.

    The file is checked against its stored checksum first, and closed before this returns
    (saving back to the same path works).

    Parameters
    ----------
    path : str or Path
    verify : bool
        With False, a file without a checksum (from an older pgpgm) is read unverified; a
        file with a checksum is always checked.

    Raises
    ------
    ResultFileError : the file does not exist, is not a pgpgm result file, is truncated or
        damaged (its content does not match its checksum), or has no checksum and ``verify``
        is True.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultFileError(f"no result file at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    _verify(path, require_checksum=verify)
    try:
        with xr.open_datatree(path, engine="h5netcdf") as opened:
            tree = opened.load()
        system = _decode_system(tree.attrs["pgpgm_system"])
        timings = json.loads(tree.attrs["pgpgm_timings"])
        n_ode_solves = json.loads(tree.attrs["pgpgm_n_ode_solves"])
    except (KeyError, ValueError, OSError) as exc:
        raise ResultFileError(f"{path} is not a readable pgpgm result file ({type(exc).__name__}: {exc})") from exc
    estimates = tree["pgpgm_estimates"].to_dataset()
    trajectories = tree["pgpgm_trajectories"].to_dataset()
    post = tree.copy()
    extra = {g: post[g] for g in ("pgpgm_gradient_matching", "pgpgm_diagnostics") if g in post.children}
    for g in (*_GROUPS, *extra):
        del post[g]
    for key in (CHECKSUM_ATTR, "pgpgm_system", "pgpgm_timings", "pgpgm_n_ode_solves"):
        post.attrs.pop(key, None)
    gm = post
    if "pgpgm_gradient_matching" in extra:
        gm = extra["pgpgm_gradient_matching"].copy()
        gm.name = None  # a root again, as it was saved (not named after its group in the file)
    diag = extra["pgpgm_diagnostics"].to_dataset() if "pgpgm_diagnostics" in extra else None
    return FitResult(system, post, estimates, trajectories, timings, n_ode_solves, gm, diag)


def _one_sampler(diag: xr.Dataset, sampler: str) -> xr.Dataset:
    """The diagnostics of one sampler, as :func:`pgpgm.posterior.diagnostics.diagnose` returns them."""
    one = diag.sel(sampler=sampler).dropna("variable", how="all")
    return one[["rhat", "ess_bulk", "ess_tail"]].assign_attrs(divergences=int(one["divergences"]))


def assemble(*, full: ODESystem, system: ODESystem, obs, fixed: Mapping[str, float], tree, main, has_posterior: bool,
             theta_sampled: np.ndarray, x0_sampled: np.ndarray, best: Refinement, refinements, starts, unknown,
             at_bounds: list[AtBound], stopping: tuple[bool, str, list[int]], noise_given: bool,
             noise_gp: np.ndarray, true_theta, x0_true: np.ndarray, solver: Solver, dense_points: int,
             timings: dict, solves: dict, diagnostics: Mapping[str, xr.Dataset],
             competing: Sequence[CompetingOptimum] = ()) -> FitResult:
    """The :class:`FitResult` of :func:`pgpgm.fit` from its steps' outcomes.

    ``full`` is the system as given, ``system`` the one fitted (fixed parameters substituted); the
    estimates keep every parameter of ``full`` (fixed ones marked, standard error 0). ``tree`` holds
    step 2's chains, ``main`` the main posterior; ``best`` is the refinement kept, ``refinements``
    (one per name of ``starts``) all of them; ``stopping`` is (stopped, reason, iterations per chain).
    Trajectories are solved on ``dense_points`` times over the data's span (NaN where a solve fails).
    ``competing`` (:func:`pgpgm.refinement.optima.competing_optima`) become ``competing_theta``
    (competing, parameter), ``competing_nll`` and ``competing_origin`` (competing) of the estimates.
    """
    free = [full.parameters.index(p) for p in system.parameters]

    def every(values, fill=None):  # free-parameter values (P_free,) to all parameters (P,)
        out = np.array([fixed.get(p, np.nan) if fill is None else fill for p in full.parameters], float)
        out[free] = values
        return out

    estimates = [("sampled", theta_sampled), ("refined", best.theta)]
    if has_posterior:
        estimates.append(("posterior", np.array([float(main.posterior[p].mean()) for p in system.parameters])))
    cov = np.zeros((full.n_parameters, full.n_parameters))
    cov[np.ix_(free, free)] = best.covariance
    stopped, reason, iterations = stopping
    se = best.q_stderr
    est = xr.Dataset(
        {"theta": (("estimate", "parameter"), np.vstack([every(v) for _, v in estimates])),
         "stderr": (("parameter",), every(best.stderr, 0.0)),
         "covariance": (("parameter", "parameter_"), cov),
         "fixed": (("parameter",), np.array([p in fixed for p in full.parameters])),
         "at_bound": (("parameter",), [",".join(a.side for a in at_bounds if a.parameter == p)
                                       for p in full.parameters]),
         "x0": (("state",), best.x0),
         "x0_stderr": (("state",), np.array([se.get(f"x0[{s}]", 0.0) for s in system.states])),
         "x0_unknown": (("state",), np.array([s in unknown for s in system.states])),
         "nll_per_start": (("start",), [r.nll for r in refinements])},
        coords={"estimate": [k for k, _ in estimates], "parameter": list(full.parameters), "start": list(starts),
                "state": list(system.states),
                "parameter_": list(full.parameters)},
        # with estimated noise sds the scaled cost is N/2 at every optimum: only the likelihood compares fits
        attrs={"refinement_cost": best.cost if noise_given else np.nan, "refinement_nll": best.nll,
               "noise_estimated": int(not noise_given),
               "jacobian_rank": best.rank, "undetermined": ", ".join(best.undetermined),
               "refinement_success": int(best.success), "refinement_message": best.message,
               "sampling_stopped": int(stopped), "sampling_stop_reason": reason,
               "sampling_iterations": iterations,
               "bound_warnings": "\n".join(a.message for a in at_bounds)},
    )
    if competing:
        P = len(system.parameters)
        est["competing_theta"] = (("competing", "parameter"),
                                  np.vstack([every(o.refinement.theta[:P]) for o in competing]))
        est["competing_nll"] = (("competing",), np.array([o.refinement.nll for o in competing]))
        est["competing_origin"] = (("competing",), [o.origin for o in competing])
        est["competing_exchanged"] = (("competing",), [" <-> ".join(o.exchanged) if o.exchanged else ""
                                                       for o in competing])
        est["competing_on_bounds"] = (("competing",), ["; ".join(o.on_bounds) for o in competing])
    t = obs.times
    dense = Integrator(system, np.linspace(t[0], t[-1], dense_points), solver)
    rows = [_safe_solve(dense, theta_sampled, x0_sampled), _safe_solve(dense, best.theta, best.x0)]
    labels = ["sampled", "refined"]
    if true_theta is not None:
        true_theta = np.asarray(true_theta, float)
        est["truth"] = ("parameter", true_theta)
        truth_solve = Integrator(full, dense.times, solver) if fixed else dense
        rows.append(_safe_solve(truth_solve, true_theta, x0_true))
        labels.append("truth")
    traj = xr.Dataset(
        {"x": (("estimate", "time_dense", "state"), np.stack(rows)),
         "y": (("time", "observed"), obs.values),
         "noise_sd": (("observed",), best.noise_sd),
         "noise_sd_gp": (("observed",), noise_gp)},
        coords={"estimate": labels, "time_dense": dense.times, "time": t, "state": list(system.states),
                "observed": list(obs.states)},
    )
    return FitResult(full, main, est, traj, timings, solves, tree, _stack_diagnostics(diagnostics) if diagnostics else None)


def _stack_diagnostics(diagnostics: Mapping[str, xr.Dataset]) -> xr.Dataset:
    """One Dataset (sampler, variable) from the per-sampler diagnostics."""
    parts = [d.expand_dims(sampler=[k]).assign(divergences=("sampler", [d.attrs["divergences"]]))
             for k, d in diagnostics.items()]
    return xr.concat(parts, dim="sampler", join="outer", combine_attrs="drop")


def _safe_solve(solver: Integrator, theta, x0) -> np.ndarray:
    try:
        return solver.solve(theta, x0)
    except ODESolveError:
        return np.full((solver.times.size, solver.system.n_states), np.nan)

"""Step 4 (NUTS on the ODE model) against an independent sampler: numpyro NUTS with diffrax solves.

Three cases (``--cases``, default all): ``fhn-R`` (FitzHugh-Nagumo, R observed, V latent),
``lv-x1-lognormal`` (Lotka-Volterra, x1 observed, ``noise="lognormal"``: y = x1(t) times lognormal
noise; steps 1-3 on the log scale, pgpgm.logscale, step 4 on the states' own scale) and ``lv-x1-x2unknown`` (Lotka-Volterra, x1 observed, the latent x2's
initial value unknown, ``x0={"x2": (0, 10)}``, with ``fixed={"theta2": 1.0}``: with x2(0) free,
scaling x2 by k and theta2 by 1/k leaves x1 unchanged, so theta2 and x2(0) would be determined
only through their product; fixed, the case is identified). For each: ``pgpgm.fit`` with a large step-4
budget (``--budget``, default None: no limit, so pgpgm's posterior converges; ``--budget default``
keeps the fit's default), its step-4 model captured at its call of ``run_nuts``
(``harness.private``) only to READ the numbers the model holds (the data, the initial-value
priors' centres and sds, the noise priors' centres, the prior boxes); the reference model is
written anew in numpyro: the ODE right-hand sides by hand in jax (the log-scale one of
Lotka-Volterra too), solved by diffrax (Tsit5, PID controller, rtol = atol = 1e-8), the same
priors and Normal likelihood. The reference runs ``--chains`` chains (default 4) of ``--warmup``
(1000) + ``--draws`` (2000) iterations, one chain after another (the first compiles), dense mass
matrix, target acceptance ``--target-accept`` (default 0.99), started at the simulation's true values; its
own R-hat, ESS and divergences (numpyro.diagnostics). Why 0.99: at numpyro's default 0.8 the reference
of ``lv-x1-x2unknown`` diverged (1343 times in 4 x 10000 draws) and its sds of theta1 and x2(0) were 0.62
and 0.60 against 0.71 and 0.69 without a divergence at 0.99: a reference with divergences under-reaches
the posterior's narrowing tail.

Per free variable: pgpgm's and the reference's mean and sd, |mean difference| / reference sd
(target <= 0.1), sd ratio pgpgm / reference (target 0.9-1.1), and each sd's Monte Carlo standard error
(ArviZ's mcse of the sd): on a heavy-tailed posterior (Lotka-Volterra with x2(0) unknown, kurtosis ~14) an
sd from ESS 400-600 is itself uncertain by ~10 %. ``--ess N`` runs pgpgm's fits with ``pgpgm.NUTS(ess=N)``.
``--fit-seeds 1,2`` adds pgpgm fits of other seeds (the same data, other chains) against the same
reference, one set of rows each (``fit_seed``): on a posterior whose tail is entered through rising
curvature, whether a fit's draws reach it is chance. Wall times: pgpgm's step 4 (its ``run_nuts`` call,
compilation included) and whole fit; numpyro's sampling (4 x the median chain after the first) and whole
(every chain, the first one's compilation included).

``--reference-cache DIR`` keeps each reference's draws in DIR and reads them back in a later run on the same
data, priors and settings (the file name holds the settings and a hash of the data): the reference does not
depend on pgpgm's code, so a change of pgpgm is measured against the same draws without their hour.

Needs the ``reference`` extra: ``pip install "pgpgm[reference]"`` (jax, numpyro, diffrax).
Takes ~15-30 min on the shared 2-core machine.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import statistics
import sys
import time
from typing import Any

import arviz_stats
import harness
import numpy as np

import pgpgm

CASES = ("fhn-R", "lv-x1-lognormal", "lv-x1-x2unknown")
RTOL = ATOL = 1e-8
INSTALL = ('posterior_reference.py needs jax, numpyro and diffrax (the "reference" extra): '
           'python -m pip install "pgpgm[reference]"  (or: python -m pip install jax numpyro diffrax)')


# ------------------------------------------------------------------------------------------
# the pgpgm side
# ------------------------------------------------------------------------------------------
def case_setup(key: str) -> tuple[harness.Published, dict[str, Any]]:
    """The published case behind ``key`` and the extra fit options of this benchmark's case."""
    if key == "fhn-R":
        return harness.published("fhn-R"), {}
    if key == "lv-x1-lognormal":
        return harness.published("lv-x1"), {"noise": "lognormal"}
    if key == "lv-x1-x2unknown":
        return harness.published("lv-x1"), {"x0": {"x2": (0.0, 10.0)}, "fixed": {"theta2": 1.0}}
    raise SystemExit(f"unknown case {key!r}: use {CASES}")


def fit_captured(case: harness.Published, extra: dict[str, Any], budget,
                 seed: int | None = None, ess: float | None = None) -> tuple[Any, Any, float, float]:
    """``(result, step-4 pm.Model, step-4 seconds, whole fit seconds)`` of ``pgpgm.fit`` (``seed``: the fit's
    seed; None: its default; ``ess``: step 4's ESS target, ``pgpgm.NUTS(ess=)``; None: its default)."""
    module = harness.private("pgpgm.steps.posterior")
    real, got = module.run_nuts, {}

    def capture(model, center, sd, **kw):
        got["model"] = model
        t0 = time.perf_counter()
        out = real(model, center, sd, **kw)
        got["seconds"] = time.perf_counter() - t0
        return out

    module.run_nuts = capture
    try:
        kw = dict(extra)
        step4 = ({} if budget == "default" else {"budget": budget}) | ({} if ess is None else {"ess": ess})
        if step4:
            kw["posterior"] = pgpgm.NUTS(**step4)
        if seed is not None:
            kw["seed"] = seed
        t0 = time.perf_counter()
        result = case.fit(**kw)
        whole = time.perf_counter() - t0
    finally:
        module.run_nuts = real
    return result, got["model"], got["seconds"], whole


def model_numbers(model) -> dict[str, Any]:
    """What the step-4 ``pm.Model`` holds: free variables with their prior (distribution name and
    parameters), the ``pm.Data`` values, the observation times and the observed variables."""
    free = {}
    for rv in model.free_RVs:
        op = rv.owner.op
        params = [float(np.asarray(p.eval())) for p in op.dist_params(rv.owner)]
        free[rv.name] = (op.name, params)
    data = {k: np.asarray(v.get_value()) for k, v in model.named_vars.items() if hasattr(v, "get_value")}
    return {"free": free, "data": data, "times": np.asarray(model.coords["time"], float),
            "observed": [v.name for v in model.observed_RVs]}


# ------------------------------------------------------------------------------------------
# the reference: numpyro + diffrax, written independently of pgpgm's code
# ------------------------------------------------------------------------------------------
def rhs_of(key: str):
    """The ODE right-hand side ``f(t, y, theta)`` in jax, on the step-4 model's state scale, and
    its state names."""
    import jax.numpy as jnp

    if key == "fhn-R":
        def f(t, y, th):
            a, b, c = th
            V, R = y
            return jnp.stack([c * (V - V ** 3 / 3 + R), -(V - a + b * R) / c])
        return f, ("V", "R")
    if key == "lv-x1-lognormal":  # the states on their own scale; the lognormal noise is the likelihood's
        def f(t, y, th):
            t1, t2, t3, t4 = th
            x1, x2 = y
            return jnp.stack([t1 * x1 - t2 * x1 * x2, -t3 * x2 + t4 * x1 * x2])
        return f, ("x1", "x2")

    def f(t, y, th):  # theta2 fixed at 1
        t1, t3, t4 = th
        x1, x2 = y
        return jnp.stack([t1 * x1 - x1 * x2, -t3 * x2 + t4 * x1 * x2])
    return f, ("x1", "x2")


def prior(name: str, params: list[float]):
    """The numpyro distribution of a PyMC prior (the ones pgpgm's step 4 uses)."""
    import numpyro.distributions as dist

    if name == "uniform":
        return dist.Uniform(params[0], params[1])
    if name == "normal":
        return dist.Normal(params[0], params[1])
    if name == "lognormal":
        return dist.LogNormal(params[0], params[1])
    raise SystemExit(f"no numpyro counterpart written for the PyMC prior {name!r}")


def reference_model(key: str, numbers: dict[str, Any], parameters: list[str]):
    """The numpyro model of step 4 for ``key`` with the numbers read from pgpgm's model."""
    import diffrax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    f, states = rhs_of(key)
    free, data, times = numbers["free"], numbers["data"], numbers["times"]
    observed = [o.removeprefix("y_") for o in numbers["observed"]]
    known = {s: float(data[f"_x0_{s}"]) for s in states if f"_x0_{s}" in data}
    unknown = [s for s in states if s not in known]
    expected = set(parameters) | {f"{s}_0" for s in unknown} | {f"sigma_{s}" for s in observed}
    if set(free) != expected:
        raise SystemExit(f"{key}: the step-4 model's free variables {sorted(free)} are not {sorted(expected)}")
    ts = jnp.asarray(times)
    ys = {s: jnp.asarray(data[f"_y_{s}"]) for s in observed}
    term = diffrax.ODETerm(lambda t, y, th: f(t, y, th))
    solver, ctrl = diffrax.Tsit5(), diffrax.PIDController(rtol=RTOL, atol=ATOL)

    def model():
        th = jnp.stack([numpyro.sample(p, prior(*free[p])) for p in parameters])
        y0 = jnp.stack([numpyro.sample(f"{s}_0", prior(*free[f"{s}_0"])) if s in unknown else jnp.asarray(known[s])
                        for s in states])
        sol = diffrax.diffeqsolve(term, solver, ts[0], ts[-1], None, y0, args=th,
                                  saveat=diffrax.SaveAt(ts=ts), stepsize_controller=ctrl,
                                  max_steps=100_000, throw=False)
        ok = (sol.result == diffrax.RESULTS.successful) & jnp.all(jnp.isfinite(sol.ys))
        numpyro.factor("solve_failed", jnp.where(ok, 0.0, -jnp.inf))
        traj = jnp.where(ok, sol.ys, 0.0)
        for s in observed:
            sigma = numpyro.sample(f"sigma_{s}", prior(*free[f"sigma_{s}"]))
            mu = traj[:, states.index(s)]
            if key == "lv-x1-lognormal":  # log y ~ Normal(log x, sigma); zero likelihood where x <= 0
                numpyro.factor(f"{s}_positive", jnp.where(jnp.all(mu > 0), 0.0, -jnp.inf))
                numpyro.sample(f"y_{s}", dist.LogNormal(jnp.log(jnp.where(mu > 0, mu, 1.0)), sigma), obs=ys[s])
            else:
                numpyro.sample(f"y_{s}", dist.Normal(mu, sigma), obs=ys[s])

    return model, states, unknown, observed


def run_reference(key: str, numbers: dict[str, Any], parameters: list[str], start: dict[str, float], *,
                  chains: int, warmup: int, draws: int, seed: int, target_accept: float = 0.99) -> dict[str, Any]:
    """Chains of numpyro NUTS, one after another; samples (chains, draws), diagnostics, times."""
    import jax
    import numpyro
    from numpyro.diagnostics import summary
    from numpyro.infer import MCMC, NUTS, init_to_value

    model, *_ = reference_model(key, numbers, parameters)
    kernel = NUTS(model, dense_mass=True, target_accept_prob=target_accept, init_strategy=init_to_value(values=start))
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=1, progress_bar=False)
    samples, seconds, extra = [], [], []
    for c in range(chains):
        t0 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed + c), extra_fields=("diverging", "num_steps"))
        got = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
        seconds.append(time.perf_counter() - t0)
        samples.append(got)
        ex = mcmc.get_extra_fields()
        extra.append((int(np.sum(ex["diverging"])), int(np.sum(ex["num_steps"]))))
        print(f"  reference {key} chain {c}: {seconds[-1]:.1f} s, {extra[-1][0]} divergences, "
              f"{extra[-1][1]} leapfrog steps", flush=True)
    stacked = {k: np.stack([s[k] for s in samples]) for k in samples[0]}
    diag = summary(stacked, group_by_chain=True)
    later = seconds[1:] or seconds
    return {"samples": stacked, "diag": diag, "seconds": seconds, "whole_s": float(sum(seconds)),
            "sampling_s": float(chains * statistics.median(later)), "divergences": sum(e[0] for e in extra),
            "leapfrog": sum(e[1] for e in extra), "numpyro": numpyro.__version__}


def _reference_file(folder: str, key: str, numbers: dict[str, Any], settings: dict[str, Any]):
    """Where the reference of ``key`` with ``settings`` on the data in ``numbers`` is stored in ``folder``: the
    name holds the settings and a hash of the data, the priors and the observation times, so that a reference
    is reused only for the same posterior."""
    digest = hashlib.sha256(repr(sorted(numbers["free"].items())).encode())
    for name in sorted(numbers["data"]):
        digest.update(name.encode() + np.ascontiguousarray(numbers["data"][name], float).tobytes())
    digest.update(np.ascontiguousarray(numbers["times"], float).tobytes())
    tag = "_".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in settings.items())
    return pathlib.Path(folder) / f"{key}_{tag.replace('.', 'p')}_{digest.hexdigest()[:12]}"


def cached_reference(folder: str | None, key: str, numbers: dict[str, Any], settings: dict[str, Any]):
    """The reference stored by :func:`store_reference` for this posterior and these settings, or None."""
    if not folder:
        return None
    path = _reference_file(folder, key, numbers, settings)
    numbers_file, draws_file = path.parent / f"{path.name}.json", path.parent / f"{path.name}.npz"
    if not numbers_file.exists():
        return None
    ref = json.loads(numbers_file.read_text())
    with np.load(draws_file) as samples:
        ref["samples"] = {k: samples[k] for k in samples.files}
    print(f"  reference {key}: read from {path} (the same data, priors and settings)", flush=True)
    return ref


def store_reference(folder: str | None, key: str, numbers: dict[str, Any], settings: dict[str, Any],
                    ref: dict[str, Any]) -> None:
    """Keep ``ref`` (:func:`run_reference`'s draws and numbers) in ``folder`` for a later run on the same
    posterior (``--reference-cache``): the reference does not depend on pgpgm's code."""
    if not folder:
        return
    path = _reference_file(folder, key, numbers, settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path.parent / f"{path.name}.npz", **ref["samples"])
    rest = {k: v for k, v in ref.items() if k != "samples"}
    rest["diag"] = {n: {s: float(np.asarray(v)) for s, v in d.items() if np.asarray(v).size == 1}
                    for n, d in ref["diag"].items()}
    (path.parent / f"{path.name}.json").write_text(json.dumps(rest))


# ------------------------------------------------------------------------------------------
# one case
# ------------------------------------------------------------------------------------------
def _rows(key: str, fit_seed: str, result, numbers: dict[str, Any], ref: dict[str, Any],
          step4_s: float, ess: float | None = None) -> list[dict[str, Any]]:
    """One row per free variable: pgpgm's fit (of seed ``fit_seed``, step 4's ESS target ``ess``; None: the
    default) against the reference's draws."""
    post = result.posterior.posterior
    diag = result.diagnostics
    draws = int(post.sizes["draw"])
    rows = []
    for name in numbers["free"]:
        p = np.asarray(post[name].values, float).ravel()
        r = ref["samples"][name].ravel()
        pm_, psd, rm, rsd = p.mean(), p.std(ddof=1), r.mean(), r.std(ddof=1)
        # the sds' own Monte Carlo errors (ArviZ's mcse of the sd, from each sampler's chains)
        p_mcse = float(arviz_stats.mcse(np.asarray(post[name].values, float), method="sd"))
        r_mcse = float(arviz_stats.mcse(np.asarray(ref["samples"][name], float), method="sd"))
        try:
            pgpgm_rhat = float(diag["rhat"].sel(sampler="posterior", variable=name))
            pgpgm_ess = float(diag["ess_bulk"].sel(sampler="posterior", variable=name))
        except (KeyError, TypeError, ValueError):
            pgpgm_rhat = pgpgm_ess = float("nan")
        rows.append({"case": key, "ess": "default" if ess is None else f"{ess:g}", "fit_seed": fit_seed,
                     "variable": name, "pgpgm_mean": pm_, "ref_mean": rm,
                     "pgpgm_sd": psd, "ref_sd": rsd, "abs_mean_diff_over_ref_sd": abs(pm_ - rm) / rsd,
                     "sd_ratio": psd / rsd, "mean_ok": bool(abs(pm_ - rm) / rsd <= 0.1),
                     "sd_ok": bool(abs(psd / rsd - 1) <= 0.1), "pgpgm_sd_mcse_rel": p_mcse / psd,
                     "ref_sd_mcse_rel": r_mcse / rsd, "sd_diff_z": (psd - rsd) / np.hypot(p_mcse, r_mcse),
                     "pgpgm_rhat": pgpgm_rhat, "pgpgm_ess_bulk": pgpgm_ess,
                     "pgpgm_draws_per_chain": draws, "pgpgm_step4_s": step4_s,
                     "ref_rhat": float(ref["diag"][name]["r_hat"]), "ref_ess": float(ref["diag"][name]["n_eff"])})
    return rows


def run_case(key: str, args) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    case, extra = case_setup(key)
    print(f"{key}: pgpgm.fit (posterior=pgpgm.NUTS(budget={args.budget})) ...", flush=True)
    result, model, step4_s, fit_s = fit_captured(case, extra, args.budget, ess=args.ess[0])
    numbers = model_numbers(model)
    parameters = [p for p in case.spec.system.parameters if p not in extra.get("fixed", {})]
    post = result.posterior.posterior
    print(f"  pgpgm: step 4 {step4_s:.1f} s, whole fit {fit_s:.1f} s; free {numbers['free']}", flush=True)
    # the reference starts at the simulation's truth (theta, x0) and the noise priors' centres
    truth = dict(zip(case.spec.system.parameters, np.asarray(case.data.attrs["theta"], float)))
    truth = {p: truth[p] for p in parameters}
    x0_true = dict(zip(case.spec.system.states, np.asarray(case.data.attrs["x0"], float)))
    start = {**truth}
    for name, (dname, params) in numbers["free"].items():
        if name in start:
            continue
        state = name.removesuffix("_0")
        if name.startswith("sigma_"):
            start[name] = float(np.exp(params[0]))
        elif state in x0_true:
            start[name] = x0_true[state]
        else:
            start[name] = params[0]
    settings = dict(chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed,
                    target_accept=args.target_accept)
    ref = cached_reference(args.reference_cache, key, numbers, settings)
    if ref is None:
        ref = run_reference(key, numbers, parameters, start, **settings)
        store_reference(args.reference_cache, key, numbers, settings, ref)
    rows = _rows(key, "default", result, numbers, ref, step4_s, args.ess[0])
    for ess in args.ess:  # each ESS target's fits against the same reference
        # the same data, other chains: how much of a verdict is the draws' chance
        for fit_seed in ([] if ess == args.ess[0] else [None]) + args.fit_seeds:
            print(f"  pgpgm.fit(seed={fit_seed}, ess={ess}) ...", flush=True)
            other, _, other_s, _ = fit_captured(case, extra, args.budget, seed=fit_seed, ess=ess)
            rows += _rows(key, "default" if fit_seed is None else str(fit_seed), other, numbers, ref, other_s, ess)
    n_pgpgm = int(np.asarray(post[parameters[0]].values).size)
    timing = {"case": key, "budget": str(args.budget), "pgpgm_step4_s": step4_s, "pgpgm_fit_s": fit_s,
              "pgpgm_draws": n_pgpgm, "ref_sampling_s": ref["sampling_s"], "ref_whole_s": ref["whole_s"],
              "ref_draws": args.chains * args.draws, "ratio_step4_over_ref_sampling": step4_s / ref["sampling_s"],
              "ratio_fit_over_ref_whole": fit_s / ref["whole_s"], "ref_divergences": ref["divergences"],
              "ref_leapfrog_steps": ref["leapfrog"],
              "ref_max_rhat": max(float(v["r_hat"]) for v in ref["diag"].values()),
              "ref_min_ess": min(float(v["n_eff"]) for v in ref["diag"].values()),
              "ref_chain_s": " ".join(f"{s:.1f}" for s in ref["seconds"])}
    print(harness.table(rows), "\n", harness.table([timing]), flush=True)
    return rows, timing


def write_partial(out: str) -> int:
    """The result files from the rows a run appended to ``results/OUT.partial.jsonl``."""
    lines = [json.loads(x) for x in (harness.RESULTS / f"{out}.partial.jsonl").read_text().splitlines() if x]
    rows = [r for r in lines if "variable" in r]
    timings = [r for r in lines if "pgpgm_step4_s" in r]
    harness.write(out, rows, "Step 4 against numpyro + diffrax (issue 30)", notes=(
        "Written from the rows of a run cut before its end (`--from-partial`); see the module docstring for the "
        "settings. Targets: abs_mean_diff_over_ref_sd <= 0.1, sd_ratio within 0.9-1.1."),
        sections={"Wall times and the reference's convergence": timings})
    return 0


def main() -> int:
    ap = harness.parser(__doc__, "posterior_reference")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES}")
    ap.add_argument("--budget", default="none",
                    help="pgpgm's step-4 budget, pgpgm.NUTS(budget=): 'none' (no limit, default), 'default' or seconds")
    ap.add_argument("--ess", default="",
                    help="pgpgm's step-4 ESS targets (pgpgm.NUTS(ess=)), comma-separated, each fitted at every fit "
                         "seed; 'default' or nothing: the fit's own (400)")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-accept", type=float, default=0.99,
                    help="the reference's NUTS target acceptance (0.99: no divergences on the three cases)")
    ap.add_argument("--fit-seeds", default="",
                    help="comma-separated seeds of further pgpgm fits of the same data against the same reference")
    ap.add_argument("--reference-cache", default="",
                    help="a folder where each reference's draws are kept and read back by a later run on the same "
                         "data, priors and settings (the reference does not depend on pgpgm's code)")
    ap.add_argument("--from-partial", action="store_true",
                    help="write the result files from results/OUT.partial.jsonl (the cases a cut run finished)")
    args = ap.parse_args()
    if args.from_partial:
        return write_partial(args.out)
    args.budget = None if args.budget == "none" else ("default" if args.budget == "default" else float(args.budget))
    args.fit_seeds = [int(x) for x in args.fit_seeds.split(",") if x.strip()]
    args.ess = [None if x.strip() == "default" else float(x) for x in args.ess.split(",") if x.strip()] or [None]
    try:
        import diffrax
        import jax
        import numpyro
    except ImportError as exc:
        print(f"{INSTALL}\n({exc})", file=sys.stderr)
        return 2
    jax.config.update("jax_enable_x64", True)
    env = harness.environment()
    env["versions"].update({"jax": jax.__version__, "numpyro": numpyro.__version__, "diffrax": diffrax.__version__})
    rows, timings = [], []
    for key in args.cases.split(","):
        r, t = run_case(key, args)
        rows += r
        timings.append(t)
        for row in r:
            harness.append_partial(args.out, row)
        harness.append_partial(args.out, t)
    notes = (f"pgpgm: default `pgpgm.fit` (step 4 NUTS, `posterior=pgpgm.NUTS(budget={args.budget})`"
             + ("; where the ess column is a number N, `posterior=pgpgm.NUTS(ess=N)` with that budget"
                if any(args.ess) else "") + "); reference: numpyro "
             f"{numpyro.__version__} NUTS (dense mass, target accept {args.target_accept}), {args.chains} chains x ({args.warmup} "
             f"warm-up + {args.draws}) draws, one chain after another; the ODE by diffrax {diffrax.__version__} "
             f"Tsit5, PID rtol = atol = {RTOL:g}; jax {jax.__version__}, float64. Targets: "
             "abs_mean_diff_over_ref_sd <= 0.1, sd_ratio within 0.9-1.1. pgpgm_sd_mcse_rel, ref_sd_mcse_rel: each "
             "sd's Monte Carlo standard error (ArviZ's mcse, method sd, from its own chains) over the sd; sd_diff_z: "
             "the difference of the sds over their combined standard error. Times in seconds: pgpgm_step4_s is its "
             "run_nuts call (compilation included), ref_sampling_s = chains x median of the chains after the "
             "first (which compiles), ref_whole_s every chain.")
    harness.write(args.out, rows, "Step 4 against numpyro + diffrax (issue 30)", notes=notes, env=env,
                  sections={"Wall times and the reference's convergence": timings})
    return 0


if __name__ == "__main__":
    sys.exit(main())

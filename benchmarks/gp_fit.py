"""GP hyperparameter fit: the implementation before issue 12 (frozen copy below) against
today's, side by side in one run on the same data.

Table 1: noisy sine (sd 0.1) on [0, 10], N = 20, 100, 1000, kernels rbf, matern52,
sigmoid; 5 optimiser starts (2 at N = 1000), seed 0. Wall and CPU seconds of the fit,
their ratios, the time of D, A and (A + 0.3 I)^-1, and the largest relative difference
of the fitted hyperparameters and noise sd between the two implementations.
Table 2: every observed state of every published case (the case's simulated data,
seed 0; fit settings of the pipeline: 5 starts, seed = state index). Both make exactly the
same starts (``max_starts`` = ``n_starts``: no extra starts, added after issue 12).

Both implementations run with BLAS on one thread (threadpoolctl), the setting the new
fit uses itself: on this 2-core machine shared with other jobs, the default two OpenBLAS
threads make single factorisations up to 300x slower and the timings meaningless.

    ./run.sh bench gp_fit            (or: .venv/bin/python benchmarks/gp_fit.py [--quick])
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import numpy as np
import sympy as sp
from scipy import linalg, optimize
from threadpoolctl import threadpool_limits

from _common import RESULTS, write
import pgpgm
from pgpgm.data import check_times
from pgpgm.gp import KERNELS, fit_gp, gradient_matching

# ---------------------------------------------------------------------------------------
# Frozen "before" reference: pgpgm/gp/kernels.py and pgpgm/gp/fit.py at commit 32e4dfd
# (names dropped, numerics unchanged): one lambdified function per derivative on meshgrids,
# bounds chosen by hyperparameter name, gradient from W = alpha alpha^T - K^-1 with K^-1
# from an identity solve.
# ---------------------------------------------------------------------------------------
_a, _b = sp.symbols("a b", real=True)


def _old_clean(expr):
    expr = expr.replace(sp.DiracDelta, lambda *args: sp.S.Zero)
    if not expr.has(sp.sign):
        return expr
    expr = sp.expand(expr)
    return expr.replace(lambda e: e.is_Pow and e.base.func == sp.sign and e.exp.is_Integer,
                        lambda e: sp.S.One if e.exp.is_even else e.base)


class OldKernel:
    def __init__(self, name, hyperparameters, expr):
        self.name, self.hyperparameters, self.expr = name, hyperparameters, expr
        by_name = {s.name: s for s in expr.free_symbols}
        self._h = tuple(by_name.get(h, sp.Symbol(h, positive=True)) for h in hyperparameters)
        parts = {"k": expr, "dk_da": _old_clean(sp.diff(expr, _a)), "dk_db": _old_clean(sp.diff(expr, _b)),
                 "d2k_dadb": _old_clean(sp.diff(expr, _a, _b))}
        parts.update({f"dk_d{h.name}": _old_clean(sp.diff(expr, h)) for h in self._h})
        self._funcs = {n: sp.lambdify((_a, _b, *self._h), e, "numpy") for n, e in parts.items()}

    def _eval(self, what, ta, tb, hyper):
        A, B = np.meshgrid(np.asarray(ta, float), np.asarray(tb, float), indexing="ij")
        return np.broadcast_to(self._funcs[what](A, B, *hyper), A.shape).astype(float, copy=True)

    def cov(self, ta, tb, hyper):
        return self._eval("k", ta, tb, np.asarray(hyper, float))

    def cov_grad(self, ta, tb, hyper):
        return tuple(self._eval(w, ta, tb, np.asarray(hyper, float)) for w in ("k", "dk_da", "dk_db", "d2k_dadb"))

    def cov_hyper_grads(self, t, hyper):
        return [self._eval(f"dk_d{s.name}", t, t, hyper) for s in self._h]


def _old_kernels():
    v, l, c, d = (sp.Symbol(n, positive=True) for n in ("variance", "lengthscale", "c", "d"))
    r, s5 = sp.Abs(_a - _b), sp.sqrt(5)
    return {
        "rbf": OldKernel("rbf", ("variance", "lengthscale"), v * sp.exp(-((_a - _b) ** 2) / (2 * l**2))),
        "matern52": OldKernel("matern52", ("variance", "lengthscale"),
                              v * (1 + s5 * r / l + 5 * r**2 / (3 * l**2)) * sp.exp(-s5 * r / l)),
        "sigmoid": OldKernel("sigmoid", ("variance", "c", "d"),
                             v * sp.asin((c + d * _a * _b) / sp.sqrt((c + d * _a**2 + 1) * (c + d * _b**2 + 1)))),
    }


def _old_default_bounds(kernel, t):
    span = t[-1] - t[0]
    bounds = []
    for h in kernel.hyperparameters:
        if h == "variance":
            bounds.append((1e-2, 1e2))
        elif h == "lengthscale":
            bounds.append((0.5 * np.min(np.diff(t)), 10 * span))
        else:
            bounds.append((1e-6, 1e4))
    return np.log(np.array(bounds))


def _old_neg_lml(logp, kernel, t, z, fixed_noise):
    H = len(kernel.hyperparameters)
    hyper = np.exp(logp[:H])
    noise = fixed_noise if fixed_noise is not None else np.exp(logp[H])
    K = kernel.cov(t, t, hyper) + (noise**2 + 1e-8) * np.eye(t.size)
    try:
        L = linalg.cholesky(K, lower=True)
    except linalg.LinAlgError:
        return 1e10, np.zeros_like(logp)
    alpha = linalg.cho_solve((L, True), z)
    nll = 0.5 * z @ alpha + np.log(np.diag(L)).sum() + 0.5 * t.size * np.log(2 * np.pi)
    W = np.outer(alpha, alpha) - linalg.cho_solve((L, True), np.eye(t.size))
    grads = [-0.5 * np.sum(W * dK) * h for dK, h in zip(kernel.cov_hyper_grads(t, hyper), hyper)]
    if fixed_noise is None:
        grads.append(-0.5 * np.trace(W) * 2 * noise**2)
    return nll, np.array(grads)


def old_fit_gp(t, y, kernel, *, n_starts=5, seed=0):
    """Returns (hyper (H,), noise_sd, log marginal likelihood), state units."""
    t = check_times(t, min_points=3)
    mean, scale = float(np.mean(y)), float(np.std(y))
    z = (y - mean) / scale
    b = _old_default_bounds(kernel, t)
    b = np.vstack([b, np.log([1e-2, 1.0])])
    rng = np.random.default_rng(seed)
    guess = np.clip(np.log([1.0] + [0.1 * (t[-1] - t[0]) if h == "lengthscale" else 1.0
                                    for h in kernel.hyperparameters[1:]] + [0.1]), b[:, 0], b[:, 1])
    starts = [guess] + [rng.uniform(b[:, 0], b[:, 1]) for _ in range(max(n_starts, 1) - 1)]
    best = None
    for x0 in starts:
        res = optimize.minimize(_old_neg_lml, x0, args=(kernel, t, z, None), jac=True, method="L-BFGS-B", bounds=b)
        if best is None or res.fun < best.fun:
            best = res
    H = len(kernel.hyperparameters)
    hyper = np.exp(best.x[:H])
    hyper[0] *= scale**2
    return hyper, float(np.exp(best.x[H])) * scale, -float(best.fun) - t.size * np.log(scale)


def old_gradient_matching(kernel, hyper, t, min_jitter=1e-6):
    C, dC_da, dC_db, d2C = kernel.cov_grad(t, t, hyper)
    scale, jitter = float(np.mean(np.diag(C))) or 1.0, min_jitter
    while True:
        try:
            L = linalg.cholesky(C + (jitter * scale) * np.eye(t.size), lower=True)
            break
        except linalg.LinAlgError:
            jitter = max(jitter * 10.0, 1e-10)
    D = linalg.cho_solve((L, True), dC_da.T).T
    A = d2C - D @ dC_db
    A = 0.5 * (A + A.T)
    prec = linalg.cho_solve((L, True), np.eye(t.size))
    L2 = linalg.cholesky(A + 0.3 * np.eye(t.size), lower=True)
    return D, A, prec, linalg.cho_solve((L2, True), np.eye(t.size))


# ---------------------------------------------------------------------------------------


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) / np.asarray(b) - 1)))


def compile_seconds() -> tuple[float, float]:
    """Seconds to build the old kernels (lambdify at construction) and to compile the new ones
    (lambdify with shared subexpressions at first use), all three kernels."""
    w0 = time.perf_counter()
    _old_kernels()
    w1 = time.perf_counter()
    t = np.linspace(0, 1, 5)
    for k in KERNELS.values():
        k.cov_with_hyper_grads(t, np.ones(len(k.hyperparameters)))
        k.cov_grad(t, t, np.ones(len(k.hyperparameters)))
    return w1 - w0, time.perf_counter() - w1


def timing_rows(sizes) -> list[dict]:
    old = _old_kernels()
    rows = []
    for n in sizes:
        t = np.linspace(0, 10, n)
        y = np.sin(t) + np.random.default_rng(0).normal(0, 0.1, n)
        for kernel in ("rbf", "matern52", "sigmoid"):
            starts = 5 if n < 1000 else 2
            (oh, on, olml), ow, oc = _timed(lambda: old_fit_gp(t, y, old[kernel], n_starts=starts))
            _, ogw, _ = _timed(lambda: old_gradient_matching(old[kernel], oh, t))
            fit, nw, nc = _timed(lambda: fit_gp(t, y, kernel, n_starts=starts, max_starts=starts))
            _, ngw, _ = _timed(lambda: gradient_matching(fit, t).gradient_precision(0.3))
            rows.append({"N": n, "kernel": kernel, "starts": starts, "old_fit_s": ow, "new_fit_s": nw,
                         "speedup_wall": ow / nw, "old_cpu_s": oc, "new_cpu_s": nc, "speedup_cpu": oc / nc,
                         "old_DA_s": ogw, "new_DA_s": ngw,
                         "max_rel_diff_hyper_noise": _rel(np.r_[fit.hyper, fit.noise_sd], np.r_[oh, on]),
                         "lml_diff": fit.log_marginal_likelihood - olml})
            print(rows[-1], flush=True)
    return rows


def published_rows() -> list[dict]:
    old = _old_kernels()
    rows = []
    for model in ("lotka-volterra", "fitzhugh-nagumo", "protein-transduction"):
        spec = pgpgm.load_model(model)
        for case_name, case in spec.cases.items():
            data = spec.simulate(case_name, seed=0)
            t = np.asarray(data["time"].values, float)
            for m, s in enumerate(case.observed):
                y = np.asarray(data["y"].sel(observed=s).values, float)
                oh, on, olml = old_fit_gp(t, y, old[case.kernel], n_starts=5, seed=m)
                fit = fit_gp(t, y, case.kernel, state=s, n_starts=5, max_starts=5, seed=m)
                rows.append({"model": model, "case": case_name, "state": s, "kernel": case.kernel, "N": t.size,
                             "new_hyper": " ".join(f"{v:.6g}" for v in fit.hyper),
                             "new_noise_sd": fit.noise_sd,
                             "max_rel_diff_hyper_noise": _rel(np.r_[fit.hyper, fit.noise_sd], np.r_[oh, on]),
                             "lml_diff": fit.log_marginal_likelihood - olml})
                print(rows[-1], flush=True)
    return rows


def _table(rows) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    with threadpool_limits(limits=1, user_api="blas"):
        old_compile, new_compile = compile_seconds()
        pub = published_rows()
        rows = timing_rows((20, 100) if quick else (20, 100, 1000))
    cmd = "./run.sh bench gp_fit" + (" --quick" if quick else "")
    header = (f"## GP fit: before (frozen copy of 32e4dfd) vs now, same data, one run\n\n"
              f"Command: `{cmd}`. Date: {datetime.date.today().isoformat()}. BLAS on one thread for both.\n"
              "Noisy sine (sd 0.1) on [0, 10]; old/new fit in wall and CPU seconds; DA = D, A and "
              "(A + 0.3 I)^-1; max_rel_diff = largest relative difference of fitted hyperparameters and "
              "noise sd; lml_diff = new - old log marginal likelihood at the optimum. Kernel compilation is "
              f"outside the timings: old {old_compile:.2f} s, new {new_compile:.2f} s for the three kernels, "
              "once per process.")
    write("gp_fit", rows, header)
    text = (header + "\n\n" + _table(rows) + "\n\n### Published cases (pipeline settings: 5 starts, seed = state "
            "index; simulated data seed 0)\n\n" + _table(pub) + "\n")
    (Path(RESULTS) / "gp_fit.md").write_text(text)
    print(text)

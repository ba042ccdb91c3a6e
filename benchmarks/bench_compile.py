"""Does ``torch.compile`` take a bound's scoring step past the dispatch floor? One thread.

A closed-form bound's step at small ``t`` is bound by per-call overhead (docs/benchmarks.md,
"Against the authors' per-step loops"): ~35 torch calls for ``select``. The lever named there
is a compiled, fused scoring function. This script measures it on the library's own pieces —
the Matérn-5/2 rows of scaled inputs (:class:`torchbandits.kernel_fast.ScaledStationary`), the
whitening ``V = L⁻¹K_SC`` (:func:`torchbandits.models.posterior.whitened_solve`), the mean and
variance (:func:`~torchbandits.models.posterior.score_whitened`) and the UCB ``μ + β ρ`` — run
eagerly, and compiled with ``torch.compile`` at static shapes (one compilation per ``n``: the
best case, as a run's ``n`` grows by one every round) and with dynamic shapes (one compilation
for every ``n``); and, as the compiler's best case, the same math written without in-place
operations (:func:`ucb_pure`), compiled at static shapes. ``t`` stored points (``d = 3``,
ℓ = 0.5, λ = 0.01), 100 fresh candidates.

Process CPU time per call, medians over alternating repeats (the variants in turn).
Needs a C++ compiler for the CPU backend of ``torch.compile``.

    python benchmarks/bench_compile.py [--ns 50 100 200] [--repeats 7] [--out DIR]
    python benchmarks/bench_compile.py --quick        # n = 30, 3 repeats (run by the tests)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from torchbandits.experiments.results import atomic_write_text  # noqa: E402
from torchbandits.kernel_fast import ScaledStationary  # noqa: E402
from torchbandits.models.posterior import score_whitened, whitened_solve  # noqa: E402

DIM, ELL, LAM, N_CAND, BETA = 3, 0.5, 0.01, 100, 2.0
KERNEL = ScaledStationary("matern", 2.5, torch.tensor([5.0 ** 0.5 / ELL], dtype=torch.float64), None)


def ucb(xs: Tensor, xsq: Tensor, cand: Tensor, factor: Tensor, z: Tensor) -> Tensor:
    """``μ + β ρ`` ``[A]`` of candidates ``[A, d]`` against stored scaled points ``xs`` ``[n, d]``
    (squared norms ``xsq`` ``[n]``), lower factor ``L`` of ``K + λI`` ``[n, n]``, ``z = L⁻¹y``."""
    cs = KERNEL.scale(cand)
    k = KERNEL.cross(xs, xsq, cs, KERNEL.sqnorm(cs))
    v = whitened_solve(factor, k)
    mean, var = score_whitened(z, v, KERNEL.diag_value, (v * v).sum(0))
    return mean + BETA * var.sqrt()


def ucb_pure(xs: Tensor, xsq: Tensor, cand: Tensor, factor: Tensor, z: Tensor) -> Tensor:
    """:func:`ucb` written without in-place operations (what the compiler fuses most freely)."""
    cs = cand * KERNEL.weight
    d2 = (xsq[:, None] - 2.0 * xs @ cs.mT + (cs * cs).sum(-1)).clamp_min(0.0)
    u = d2.sqrt()
    k = (1.0 + u + d2 / 3.0) * torch.exp(-u)
    v = torch.linalg.solve_triangular(factor, k, upper=False)
    return z @ v + BETA * (1.0 - (v * v).sum(0)).clamp_min(0.0).sqrt()


def problem(n: int) -> tuple[Tensor, ...]:
    """Stored points, their norms, the factor, ``z`` and a list of candidate sets at size ``n``."""
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, DIM, generator=g, dtype=torch.float64)
    xs = KERNEL.scale(x)
    gram = KERNEL.matrix(x, x) + LAM * torch.eye(n, dtype=torch.float64)
    factor = torch.linalg.cholesky(gram)
    z = whitened_solve(factor, torch.randn(n, generator=g, dtype=torch.float64))
    cands = torch.rand(16, N_CAND, DIM, generator=g, dtype=torch.float64)
    return xs, KERNEL.sqnorm(xs), factor, z, cands


def time_calls(fn: Callable[..., Tensor], args: tuple[Tensor, ...], cands: Tensor, calls: int) -> float:
    """Process CPU µs per call ``fn(xs, xsq, cand, factor, z)`` over ``calls`` calls cycling
    through the candidate sets ``cands`` (``args = (xs, xsq, factor, z)``)."""
    xs, xsq, factor, z = args
    t0 = time.process_time()
    for i in range(calls):
        fn(xs, xsq, cands[i % len(cands)], factor, z)
    return (time.process_time() - t0) / calls * 1e6


def measure(ns: list[int], repeats: int, calls: int) -> list[dict]:
    torch.set_num_threads(1)
    static = torch.compile(ucb, dynamic=False)
    dynamic = torch.compile(ucb, dynamic=True)
    pure = torch.compile(ucb_pure, dynamic=False)
    rows = []
    for n in ns:
        xs, xsq, factor, z, cands = problem(n)
        fns = {"eager": ucb, "static": static, "dynamic": dynamic, "pure": pure}
        compile_s, err = {}, 0.0
        ref = ucb(xs, xsq, cands[0], factor, z)
        for name, f in fns.items():
            t0 = time.perf_counter()
            out = f(xs, xsq, cands[0], factor, z)   # compiles on the first call of a shape
            compile_s[name] = time.perf_counter() - t0
            err = max(err, float((out - ref).abs().max()))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats):
            for name, f in fns.items():
                time_calls(f, (xs, xsq, factor, z), cands, calls // 10)   # warm
                times[name].append(time_calls(f, (xs, xsq, factor, z), cands, calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"n": n, "eager_us": med["eager"], "static_us": med["static"],
                     "dynamic_us": med["dynamic"], "static_speedup": med["eager"] / med["static"],
                     "dynamic_speedup": med["eager"] / med["dynamic"], "pure_us": med["pure"],
                     "pure_speedup": med["eager"] / med["pure"],
                     "compile_s_static": compile_s["static"], "compile_s_dynamic": compile_s["dynamic"],
                     "max_abs_diff": err})
        print(f"n={n:4d}: eager {med['eager']:.1f} µs, compiled static {med['static']:.1f} µs "
              f"(×{med['eager'] / med['static']:.2f}, compile {compile_s['static']:.1f} s), dynamic "
              f"{med['dynamic']:.1f} µs (×{med['eager'] / med['dynamic']:.2f}), out-of-place static "
              f"{med['pure']:.1f} µs (×{med['eager'] / med['pure']:.2f}); UCBs {err:.1e} apart",
              flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| n | eager (µs) | compiled, static shapes (µs) | compiled, dynamic (µs) "
             "| compiled out-of-place, static (µs) | compile s (static) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['eager_us']:.1f} | {r['static_us']:.1f} (×{r['static_speedup']:.2f}) "
                     f"| {r['dynamic_us']:.1f} (×{r['dynamic_speedup']:.2f}) "
                     f"| {r['pure_us']:.1f} (×{r['pure_speedup']:.2f}) | {r['compile_s_static']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 30, 3 repeats, 100 calls")
    parser.add_argument("--ns", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("results/bench_compile"))
    args = parser.parse_args(argv)
    for name in ("repeats", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if any(n < 1 for n in args.ns):
        parser.error("--ns must be >= 1")
    ns, repeats, calls = ([30], 3, 100) if args.quick else (args.ns, args.repeats, args.calls)
    rows = measure(ns, repeats, calls)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "bench.json", json.dumps({"threads": 1, "rows": rows}, indent=2))
    table = markdown(rows)
    atomic_write_text(args.out / "table.md", table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

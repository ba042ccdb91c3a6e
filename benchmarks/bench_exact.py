"""Per-step agent time of K-UCB (incremental exact posterior) against a naive from-scratch baseline.

For each t, a K-UCB policy is loaded with t observations (untimed), then ``--repeats`` consecutive
rounds are timed (select over ``--arms`` candidates + update) and the median is reported. The naive
baseline rebuilds the Gram matrix and refactorises ``K + λI`` every round, then scores the same
candidates. Two candidate regimes: a fresh random set each round (contextual problems: O(n²·A)
scoring) and a fixed arm set (the model's candidate cache: O(n·A) scoring + O(n²) append).

One BLAS/torch thread, medians over repeats, ratios from the same run. Writes JSON and a markdown
table to ``--out`` and prints the table.

    python benchmarks/bench_exact.py            # t = 250, 500, 1000, 2000
    python benchmarks/bench_exact.py --quick    # t = 50, 100, 200 (used by the tests)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gpytorch  # noqa: E402
import torch  # noqa: E402

from torchbandits import KernelUCB, make_kernel  # noqa: E402
from torchbandits.kernels import kernel_diag, kernel_matrix  # noqa: E402


class NaiveKernelUCB:
    """K-UCB that refactorises ``K + λI`` from scratch every round (the baseline)."""

    def __init__(self, kernel, lam: float, beta: float) -> None:
        self.kernel, self.lam, self.beta = kernel, lam, beta
        self.x: torch.Tensor | None = None
        self.y = torch.zeros(0, dtype=torch.float64)

    def scores(self, cand: torch.Tensor) -> torch.Tensor:
        assert self.x is not None
        n = self.x.shape[0]
        gram = kernel_matrix(self.kernel, self.x, self.x) + self.lam * torch.eye(n, dtype=torch.float64)
        chol = torch.linalg.cholesky(gram)
        kq = kernel_matrix(self.kernel, self.x, cand)
        alpha = torch.cholesky_solve(self.y[:, None], chol)[:, 0]
        v = torch.linalg.solve_triangular(chol, kq, upper=False)
        var = (kernel_diag(self.kernel, cand) - (v * v).sum(0)).clamp_min(0) / self.lam
        return kq.T @ alpha + self.beta * var.sqrt()

    def select(self, cand: torch.Tensor) -> int:
        return int(torch.argmax(self.scores(cand)))

    def update(self, x: torch.Tensor, r: float) -> None:
        self.x = x[None] if self.x is None else torch.cat([self.x, x[None]])
        self.y = torch.cat([self.y, torch.tensor([r], dtype=torch.float64)])


def _reward(x: torch.Tensor) -> float:
    return float(torch.sin(5 * x).sum())


def _time_steps(policy, gen: torch.Generator, arms: int, dim: int, repeats: int,
                fixed: torch.Tensor | None) -> float:
    times = []
    if fixed is not None:  # warm the candidate cache once (untimed)
        policy.select(fixed)
    for _ in range(repeats):
        cand = fixed if fixed is not None else torch.rand(arms, dim, generator=gen, dtype=torch.float64)
        t0 = time.perf_counter()
        i = policy.select(cand)
        policy.update(cand[i], _reward(cand[i]))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(
    ts: list[int], arms: int, dim: int, repeats: int, lam: float = 1.0, beta: float = 1.0
) -> list[dict]:
    kernel = make_kernel("matern52", 0.5)
    rows = []
    for t in ts:
        gen = torch.Generator().manual_seed(t)
        x = torch.rand(t, dim, generator=gen, dtype=torch.float64)
        y = torch.tensor([_reward(xi) for xi in x], dtype=torch.float64)
        row: dict = {"t": t}
        for mode in ("fresh", "fixed"):
            pol = KernelUCB(kernel, lam=lam, beta=beta, n_warmup=0)
            pol.model.extend(x, y)
            fixed = torch.rand(arms, dim, generator=gen, dtype=torch.float64) if mode == "fixed" else None
            row[f"incremental_{mode}_ms"] = 1e3 * _time_steps(pol, gen, arms, dim, repeats, fixed)
        naive = NaiveKernelUCB(kernel, lam, beta)
        naive.x, naive.y = x.clone(), y.clone()
        row["naive_ms"] = 1e3 * _time_steps(naive, gen, arms, dim, repeats, None)
        # same choices: incremental and naive scores agree on one candidate set
        check = KernelUCB(kernel, lam=lam, beta=beta, n_warmup=0)
        check.model.extend(x, y)
        cand = torch.rand(arms, dim, generator=gen, dtype=torch.float64)
        naive_ref = NaiveKernelUCB(kernel, lam, beta)
        naive_ref.x, naive_ref.y = x, y
        row["max_score_diff"] = float((check(cand) - naive_ref.scores(cand)).abs().max())
        rows.append(row)
    for prev, row in itertools.pairwise(rows):
        scale = math.log(row["t"] / prev["t"])
        for key in ("incremental_fresh_ms", "incremental_fixed_ms", "naive_ms"):
            row[key.replace("_ms", "_exponent")] = math.log(row[key] / prev[key]) / scale
    return rows


def bench_kernel_eval(n: int = 2000, m: int = 100, dim: int = 3, repeats: int = 9) -> dict:
    """Dense closed form (``kernel_matrix``) vs GPyTorch's own (lazy, then densified) evaluation."""
    kernel = make_kernel("matern52", 0.5)
    x = torch.rand(n, dim, dtype=torch.float64)
    y = torch.rand(m, dim, dtype=torch.float64)

    def med(fn) -> float:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(ts)

    with torch.no_grad():
        dense = med(lambda: kernel_matrix(kernel, x, y))
        lazy = med(lambda: kernel(x, y).to_dense())
        with gpytorch.settings.lazily_evaluate_kernels(False):
            eager = med(lambda: kernel(x, y).to_dense())
    return {"n": n, "m": m, "dense_ms": dense, "gpytorch_lazy_ms": lazy, "gpytorch_eager_ms": eager}


def markdown(rows: list[dict], kev: dict, arms: int, dim: int) -> str:
    lines = [
        f"Per-step agent time of K-UCB (select + update), {arms} candidates, d = {dim}, Matérn-5/2, "
        "1 thread, median of consecutive steps.",
        "",
        "| t | naive refactorise (ms) | incremental, fresh candidates (ms) | speed-up | "
        "incremental, fixed arm set (ms) | speed-up | max score diff |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['t']} | {r['naive_ms']:.2f} | {r['incremental_fresh_ms']:.2f} | "
            f"{r['naive_ms'] / r['incremental_fresh_ms']:.1f}× | {r['incremental_fixed_ms']:.2f} | "
            f"{r['naive_ms'] / r['incremental_fixed_ms']:.1f}× | {r['max_score_diff']:.1e} |"
        )
    exps = [r for r in rows if "naive_exponent" in r]
    if exps:
        lines += ["", "Growth exponent of per-step time between consecutive t (log-log slope):", "",
                  "| t | naive | incremental fresh | incremental fixed |", "|---:|---:|---:|---:|"]
        for r in exps:
            lines.append(f"| {r['t']} | {r['naive_exponent']:.2f} | {r['incremental_fresh_exponent']:.2f}"
                         f" | {r['incremental_fixed_exponent']:.2f} |")
    lines += ["", f"Kernel evaluation {kev['n']}×{kev['m']}: dense closed form {kev['dense_ms']:.2f} ms, "
              f"GPyTorch lazy→dense {kev['gpytorch_lazy_ms']:.2f} ms, "
              f"GPyTorch eager {kev['gpytorch_eager_ms']:.2f} ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ts", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--arms", type=int, default=100)
    parser.add_argument("--dim", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="t = 50, 100, 200 and 5 repeats")
    parser.add_argument("--out", default="results/bench_exact")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ts, repeats = (([50, 100, 200], 5) if args.quick else (args.ts, args.repeats))
    rows = bench(ts, args.arms, args.dim, repeats)
    kev = bench_kernel_eval(n=ts[-1], m=args.arms, dim=args.dim)
    table = markdown(rows, kev, args.arms, args.dim)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_exact.json").write_text(json.dumps({"rows": rows, "kernel_eval": kev}, indent=2))
    (out / "bench_exact.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

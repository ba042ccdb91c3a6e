"""Rates of the compiled scoring call of the exact posterior (``torchbandits/native/exact_step.c``)
against torch's (MKL/LAPACK) triangular solve and matrix product, one thread.

For each ``n`` a Matérn-5/2 factor ``L`` of ``K + λI`` (``n`` points in ``[0, 1]^3``, lengthscale 0.2,
``λ = 1``) is stored as a head ``[n0, n0]`` plus tail rows (``torchbandits.linalg.GrowingCholesky``'s
layout, ``n0 = n // 2``), and ``A`` candidates are scored by one call of
:func:`torchbandits.native.exact.score` with ``R`` factors (``R = 0``: the kernel block ``K_SC``
alone). Reported (medians over ``--repeats``, or minima with ``--stat min``):

* ``kernel_us``: the call with ``R = 0`` (the closed form of ``K_SC [n, A]``);
* ``amm_us`` / ``dmm_us``: the call with ``R = 1`` / ``5`` (``V_r = L_r⁻¹ K_SC``, ``μ_r``,
  ``colsum V_r²``, the bounds);
* ``solve_gfma``: the forward substitution's rate, ``n²A/2`` fused multiply-adds per factor in
  ``amm_us − kernel_us`` (the μ/colsum pass counted in, ``n·A`` more);
* ``torch_trsm_us`` / ``torch_trsm_gfma``: ``torch.linalg.solve_triangular(L, K_SC)``;
* ``torch_mm_us`` / ``torch_mm_gfma``: ``L @ K_SC`` (``n²A`` FMAs: the authors' per-factor GEMM);
* ``cold16_us`` / ``cold1_us``: per factor, one call scoring 16 columns / one column against
  ``M`` copies of the factor, ``M`` large enough that they fill 64 MiB (at most 4096; each copy
  out of the caches when its turn comes): what a batched step meets, whose runs' factors evict each other
  between two steps (16 columns: the group of DMM's pruned select; one column: an append);
  ``cold1_gbs``: the factor's ``n²/2`` doubles over ``cold1_us``, the rate of reading memory.

Also checks ``V`` against torch's solve (``max_rel_err``). Prints a markdown table.

    python benchmarks/exact_solve_rates.py            # n = 50 … 1000, A = 100, 200 repeats
    python benchmarks/exact_solve_rates.py --quick    # n = 5, 50, 3 repeats (run by the tests)
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

from torchbandits.native import exact as nx  # noqa: E402

_F64 = torch.float64


def matern52(a: torch.Tensor, b: torch.Tensor, ell: float) -> torch.Tensor:
    """The Matérn-5/2 kernel matrix ``[len(a), len(b)]`` of lengthscale ``ell``."""
    u = torch.cdist(a / ell, b / ell) * 5.0 ** 0.5
    return (1.0 + u + u * u / 3.0) * torch.exp(-u)


def problem(n: int, a: int, d: int = 3, lam: float = 1.0, seed: int = 0, n0: int | None = None
            ) -> dict:
    """Points ``xs [n, d]``, candidates ``[a, d]``, the factor ``L`` of ``K + λI`` split at ``n0``
    (default ``n // 2``) into a head ``[n0, n0]`` and tail rows ``[n − n0, n + 3]``, and ``z``."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.rand(n, d, generator=g, dtype=_F64)
    cand = torch.rand(a, d, generator=g, dtype=_F64)
    ell = 0.2
    chol = torch.linalg.cholesky(matern52(xs, xs, ell) + lam * torch.eye(n, dtype=_F64))
    n0 = n // 2 if n0 is None else n0
    head = chol[:n0, :n0].contiguous()
    tail = torch.zeros(n - n0, n + 3, dtype=_F64)
    tail[:, :n] = chol[n0:]
    z = torch.randn(n, generator=g, dtype=_F64)
    weight = torch.tensor([5.0 ** 0.5 / ell], dtype=_F64)  # the closed form's u = |x - c| sqrt5 / ell
    return {"xs": (xs * weight).contiguous(), "cand": cand, "weight": weight, "chol": chol,
            "head": head, "tail": tail, "z": z, "n": n, "a": a}


def call(lib, p: dict, count: int, kq: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """One scoring call with ``count`` copies of the factor (``count = 0``: ``K_SC`` only, into
    ``kq``); returns ``(V [count, n, A], μ, colsum V², ρ²)``."""
    n, a = p["n"], p["a"]
    fac = (p["head"].data_ptr(), p["head"].shape[0], p["tail"].data_ptr(), p["tail"].shape[1],
           p["z"].data_ptr())
    v = torch.empty(count, n, a, dtype=_F64)
    mean, sumsq, var = (torch.empty(count, a, dtype=_F64) for _ in range(3))
    bound = ([1.0] * count, [1.0] * count) if count else None
    nx.score(lib, n, p["xs"], p["cand"], p["weight"], nx.KINDS[("matern", 2.5)], None, 1.0,
             [fac] * count, (v, mean, sumsq), (None, kq, var), bound)
    return v, mean, sumsq, var


STAT = {"median": statistics.median, "min": min}


def median_us(fn: Callable[[], object], repeats: int, stat: str = "median") -> float:
    """Median (or ``stat``) wall time of ``fn()`` in µs (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return STAT[stat](times) * 1e6


def cold_us(lib, p: dict, cols: int, repeats: int, stat: str = "median") -> float:
    """Per factor, the wall time in µs of one scoring call on ``cols`` columns against ``M``
    copies of the factor that fill 64 MiB together (median, or ``stat``, over ``repeats``)."""
    n, head, tail = p["n"], p["head"], p["tail"]
    copies = min(4096, max(2, (64 << 20) // (8 * (head.numel() + tail.numel()))))
    heads = head.expand(copies, *head.shape).contiguous()   # one block each: the copies in turn
    tails = tail.expand(copies, *tail.shape).contiguous()
    facs = [(heads[c].data_ptr(), head.shape[0], tails[c].data_ptr(), tail.shape[1],
             p["z"].data_ptr()) for c in range(copies)]
    cand = p["cand"][:cols].contiguous()
    v = torch.empty(copies, n, cols, dtype=_F64)
    mean, sumsq, var = (torch.empty(copies, cols, dtype=_F64) for _ in range(3))

    def run() -> None:
        nx.score(lib, n, p["xs"], cand, p["weight"], nx.KINDS[("matern", 2.5)], None, 1.0, facs,
                 (v, mean, sumsq), (None, None, var), None)

    return median_us(run, repeats, stat) / copies


def row(lib, n: int, a: int, repeats: int, stat: str = "median") -> dict:
    """The timings and rates of one size (see the module docstring)."""
    p = problem(n, a)
    kq = torch.empty(n, a, dtype=_F64)
    v = call(lib, p, 1, kq)[0][0]
    ref = torch.linalg.solve_triangular(p["chol"], kq, upper=False)
    err = float((v - ref).abs().max() / ref.abs().max().clamp_min(1e-300))
    kernel = median_us(lambda: call(lib, p, 0, kq), repeats, stat)
    amm = median_us(lambda: call(lib, p, 1), repeats, stat)
    dmm = median_us(lambda: call(lib, p, 5), repeats, stat)
    chol = p["chol"]
    trsm = median_us(lambda: torch.linalg.solve_triangular(chol, kq, upper=False), repeats, stat)
    mm = median_us(lambda: chol @ kq, repeats, stat)
    cold16 = cold_us(lib, p, 16, max(3, repeats // 10), stat)
    cold1 = cold_us(lib, p, 1, max(3, repeats // 10), stat)
    half = n * n * a / 2.0
    return {"n": n, "a": a, "kernel_us": kernel, "amm_us": amm, "dmm_us": dmm,
            "solve_gfma": half / max(amm - kernel, 1e-3) / 1e3,
            "dmm_solve_gfma": 5 * half / max(dmm - kernel, 1e-3) / 1e3,
            "torch_trsm_us": trsm, "torch_trsm_gfma": half / trsm / 1e3,
            "torch_mm_us": mm, "torch_mm_gfma": 2 * half / mm / 1e3,
            "cold16_us": cold16, "cold1_us": cold1, "cold1_gbs": n * n / 2.0 * 8 / cold1 / 1e3,
            "max_rel_err": err}


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    head = ("| n | A | K_SC µs | AMM call µs | solve GFMA/s | DMM call µs | DMM solve GFMA/s | "
            "torch trsm µs (GFMA/s) | torch mm µs (GFMA/s) | cold 16 columns µs | "
            "cold 1 column µs (GB/s) | max rel err |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['n']} | {r['a']} | {r['kernel_us']:.1f} | {r['amm_us']:.1f} | "
                     f"{r['solve_gfma']:.2f} | {r['dmm_us']:.1f} | {r['dmm_solve_gfma']:.2f} | "
                     f"{r['torch_trsm_us']:.1f} ({r['torch_trsm_gfma']:.2f}) | "
                     f"{r['torch_mm_us']:.1f} ({r['torch_mm_gfma']:.2f}) | "
                     f"{r['cold16_us']:.1f} | {r['cold1_us']:.1f} ({r['cold1_gbs']:.1f}) | "
                     f"{r['max_rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 5, 50; 3 repeats")
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 100, 200, 400, 700, 1000])
    ap.add_argument("--arms", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--stat", choices=sorted(STAT), default="median",
                    help="median, or min (robust on a machine shared with other jobs)")
    ap.add_argument("--out", type=Path, default=None, help="folder for exact_solve_rates.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.ns, args.repeats = [5, 50], 3
    torch.set_num_threads(1)
    lib = nx.available()
    if lib is None:
        print("the compiled library is not available (TORCHBANDITS_NATIVE=0 or no compiler)")
        return 0
    rows = [row(lib, n, args.arms, args.repeats, args.stat) for n in args.ns]
    print(markdown(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "exact_solve_rates.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

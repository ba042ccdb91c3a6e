"""Batched runs against sequential runs: ``R`` seeds as one batch vs ``R`` runs one after another.

    python benchmarks/bench_batch.py               # random: every env; K-UCB, GP-UCB: 3 envs
    python benchmarks/bench_batch.py --quick       # seconds: random only, R = 1, 4; T = 30
    python benchmarks/bench_batch.py --policies kucb,gpucb --learning-horizon 200

For each environment a policy plays ``T`` rounds for ``R`` seeds (R = 1, 8, 64), once through
:func:`~torchbandits.experiments.simulate_batch` (one batch) and once through ``R`` calls of
:func:`~torchbandits.experiments.simulate`; the clock is the process CPU time of the whole call
(environment, policy and bookkeeping: what a user waits for), ``--repeats`` times alternating
A/B, median reported. Both give the same runs (checked: same actions). Throughput is run-steps
per CPU second; the speedup is sequential / batched time. The random policy runs on every
batchable environment (``T = 500``); the learning policies — K-UCB (Zenati et al. 2022,
Algorithm 3, constant β) and GP-UCB with IGP-UCB's radius (Chowdhury & Gopalan 2017) — on
``rkhs`` (d = 3, 100 fresh arms), ``rkhs-fixed`` and ``bump`` (``T = --learning-horizon``).

For the learning policies each row also gives the batched run's arithmetic rate: the posterior
flops ``R · Σ_{n<T} (n²·A + 2·n·A·d)`` (the triangular solve ``L⁻¹K_SC`` and the kernel product
of a round with ``n`` points and ``A`` candidates; with fixed arms the cached solve is cheaper,
so the rate is an upper estimate there) over the batched CPU seconds, against this machine's
float64 GEMM rate on one thread (``gemm_gflops`` in ``bench.json``): far below it, a step is
bound by dispatch; close to it, by arithmetic. Threads are pinned to one. Writes ``bench.json``
and ``table.md`` to ``--out``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from torchbandits.experiments import simulate, simulate_batch  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402

ENVS = {  # registry name -> keyword arguments (the registry's defaults otherwise)
    "rkhs": {},                      # Flynn & Reeb (2024), Section 7: fresh 100 arms, d = 3
    "rkhs-fixed": {"fixed_arms": True},
    "bump": {},                      # Zenati et al. (2022), Section 5
    "chessboard": {},
    "switching-kernel": {},          # Hong, Li & Tewari (2023), Section 6 (Env 1)
    "cosine": {},
    "tv-rotation": {},               # time-varying RKHS benchmark for Zhou & Shroff
    "tv-switch": {},
    "tv-bump": {},
}
QUICK_ENVS = ("rkhs", "chessboard", "tv-rotation")
LEARNING = ("kucb", "gpucb")        # batched learning policies: K-UCB, GP-UCB (IGP radius)
LEARNING_ENVS = ("rkhs", "rkhs-fixed", "bump")
# batched time-varying policies of Zhou & Shroff (2021): SW-GP-UCB (Algorithm 2) with w = 100,
# R-GP-UCB (Algorithm 1) with H = 100, the registry's theory widths (Lemmas 1-2, greedy γ);
# `--policies sw-gpucb,r-gpucb --learning-horizon 500` runs them on TV_ENVS
TV_LEARNING = {"sw-gpucb": {"window": 100}, "r-gpucb": {"period": 100}}
TV_ENVS = ("tv-rotation", "tv-bump")


def _env(name: str, horizon: int):  # type: ignore[no-untyped-def]
    kwargs = dict(ENVS[name])
    registry = "rkhs" if name == "rkhs-fixed" else name
    if registry.startswith("tv-"):
        kwargs["horizon"] = max(horizon, 2)
    return make_env(registry, **kwargs)


def _cpu(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def gemm_gflops(size: int = 256, repeats: int = 20) -> float:
    """This machine's float64 matrix-product rate (GFLOP/s, process CPU time, best of 5)."""
    a = torch.rand(size, size, dtype=torch.float64)
    best = float("inf")
    for _ in range(5):
        c0 = time.process_time()
        for _ in range(repeats):
            a @ a
        best = min(best, (time.process_time() - c0) / repeats)
    return 2.0 * size**3 / best / 1e9 if best > 0 else float("inf")


def posterior_flops(n_runs: int, horizon: int, n_arms: int, dim: int) -> float:
    """``R · Σ_{n<T} (n²·A + 2·n·A·d)``: a run's triangular solves and kernel products."""
    return float(n_runs * sum(n * n * n_arms + 2 * n * n_arms * dim for n in range(horizon)))


def bench_env(name: str, runs: list[int], horizon: int, repeats: int,
              policy: str = "random") -> list[dict]:
    env = _env(name, horizon)
    rows = []
    for n in runs:
        seeds = list(range(n))

        def batched(seeds: list[int] = seeds):  # type: ignore[no-untyped-def]
            return simulate_batch(make_policy(policy, env, **TV_LEARNING.get(policy, {})), env,
                                  horizon, seeds, diagnostics_every=0)

        def sequential(seeds: list[int] = seeds):  # type: ignore[no-untyped-def]
            return [simulate(make_policy(policy, env, **TV_LEARNING.get(policy, {})), env, horizon,
                             s, diagnostics_every=0) for s in seeds]

        tb, ts = [], []
        for _ in range(repeats):  # alternate A/B
            cb, res_b = _cpu(batched)
            cs, res_s = _cpu(sequential)
            tb.append(cb)
            ts.append(cs)
        same = all(a.actions == b.actions for a, b in zip(res_b, res_s, strict=True))
        b, s = statistics.median(tb), statistics.median(ts)
        row = {"policy": policy, "env": name, "R": n, "T": horizon, "batched_s": b,
               "sequential_s": s,
               "batched_steps_per_s": n * horizon / b if b > 0 else float("inf"),
               "sequential_steps_per_s": n * horizon / s if s > 0 else float("inf"),
               "speedup": s / b if b > 0 else float("inf"), "same_actions": same}
        if policy in LEARNING:
            env.reset(0)
            cand = env.candidates()
            flops = posterior_flops(n, horizon, int(cand.shape[0]), int(cand.shape[1]))
            row["batched_gflops"] = flops / b / 1e9 if b > 0 else float("inf")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| policy | env | R | T | batched CPU s | sequential CPU s | batched run-steps/s | "
             "sequential run-steps/s | speedup | batched GFLOP/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{r['batched_gflops']:.3f}" if "batched_gflops" in r else "–"
        lines.append(f"| {r.get('policy', 'random')} | {r['env']} | {r['R']} | {r['T']} | "
                     f"{r['batched_s']:.3f} | {r['sequential_s']:.3f} | "
                     f"{r['batched_steps_per_s']:,.0f} | {r['sequential_steps_per_s']:,.0f} | "
                     f"{r['speedup']:.1f}× | {rate} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, nargs="+", default=None, help="batch sizes R (1 8 64)")
    ap.add_argument("--horizon", type=int, default=None, help="T (500; 30 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="A/B repeats (3; 1 with --quick)")
    ap.add_argument("--envs", default=None, help="comma-separated subset of " + ",".join(ENVS))
    ap.add_argument("--policies", default=None,
                    help="comma-separated: random and/or " + ",".join(LEARNING)
                    + " (random with --quick, all three otherwise)")
    ap.add_argument("--learning-horizon", type=int, default=200,
                    help="T of the learning policies (200)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/bench_batch")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    runs = args.runs or ([1, 4] if args.quick else [1, 8, 64])
    horizon = args.horizon or (30 if args.quick else 500)
    repeats = args.repeats or (1 if args.quick else 3)
    names = args.envs.split(",") if args.envs else list(QUICK_ENVS if args.quick else ENVS)
    unknown = [n for n in names if n not in ENVS]
    if unknown:
        raise SystemExit(f"unknown env(s) {unknown}; choose from {sorted(ENVS)}")
    policies = (args.policies.split(",") if args.policies
                else ["random"] if args.quick else ["random", *LEARNING])
    bad = [p for p in policies if p not in ("random", *LEARNING, *TV_LEARNING)]
    if bad:
        raise SystemExit(f"unknown policies {bad}; choose from random,"
                         f"{','.join((*LEARNING, *TV_LEARNING))}")
    rows = []
    for policy in policies:
        learning = policy != "random"
        envs = names if not learning or args.envs else list(
            TV_ENVS if policy in TV_LEARNING else LEARNING_ENVS)
        for name in envs:
            rows.extend(bench_env(name, runs, args.learning_horizon if learning else horizon,
                                  repeats, policy))
            print("\n".join(table(rows).splitlines()[-len(runs):]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "clock": "process CPU time (time.process_time) of the whole call",
            "gemm_gflops": gemm_gflops()}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"float64 GEMM on {meta['threads']} thread(s): {meta['gemm_gflops']:.2f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

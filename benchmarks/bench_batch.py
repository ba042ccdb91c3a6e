"""Batched runs against sequential runs: ``R`` seeds as one batch vs ``R`` runs one after another.

    python benchmarks/bench_batch.py               # R = 1, 8, 64; T = 500; every batchable env
    python benchmarks/bench_batch.py --quick       # seconds: R = 1, 4; T = 30; three envs

For each environment the random policy (the batched policy of this release) plays ``T`` rounds
for ``R`` seeds, once through :func:`~torchbandits.experiments.simulate_batch` (one batch) and
once through ``R`` calls of :func:`~torchbandits.experiments.simulate`; the clock is the process
CPU time of the whole call (environment, policy and bookkeeping: what a user waits for),
``--repeats`` times alternating A/B, median reported. Both give the same runs (checked: same
actions). Throughput is run-steps per CPU second; the speedup is sequential / batched time.
Threads are pinned to one. Writes ``bench.json`` and ``table.md`` to ``--out``.
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


def bench_env(name: str, runs: list[int], horizon: int, repeats: int) -> list[dict]:
    env = _env(name, horizon)
    rows = []
    for n in runs:
        seeds = list(range(n))

        def batched(seeds: list[int] = seeds):  # type: ignore[no-untyped-def]
            return simulate_batch(make_policy("random", env), env, horizon, seeds,
                                  diagnostics_every=0)

        def sequential(seeds: list[int] = seeds):  # type: ignore[no-untyped-def]
            return [simulate(make_policy("random", env), env, horizon, s, diagnostics_every=0)
                    for s in seeds]

        tb, ts = [], []
        for _ in range(repeats):  # alternate A/B
            cb, res_b = _cpu(batched)
            cs, res_s = _cpu(sequential)
            tb.append(cb)
            ts.append(cs)
        same = all(a.actions == b.actions for a, b in zip(res_b, res_s, strict=True))
        b, s = statistics.median(tb), statistics.median(ts)
        rows.append({"env": name, "R": n, "T": horizon, "batched_s": b, "sequential_s": s,
                     "batched_steps_per_s": n * horizon / b if b > 0 else float("inf"),
                     "sequential_steps_per_s": n * horizon / s if s > 0 else float("inf"),
                     "speedup": s / b if b > 0 else float("inf"), "same_actions": same})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| env | R | T | batched CPU s | sequential CPU s | batched run-steps/s | "
             "sequential run-steps/s | speedup |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['R']} | {r['T']} | {r['batched_s']:.3f} | "
                     f"{r['sequential_s']:.3f} | {r['batched_steps_per_s']:,.0f} | "
                     f"{r['sequential_steps_per_s']:,.0f} | {r['speedup']:.1f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, nargs="+", default=None, help="batch sizes R (1 8 64)")
    ap.add_argument("--horizon", type=int, default=None, help="T (500; 30 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="A/B repeats (3; 1 with --quick)")
    ap.add_argument("--envs", default=None, help="comma-separated subset of " + ",".join(ENVS))
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
    rows = []
    for name in names:
        rows.extend(bench_env(name, runs, horizon, repeats))
        print("\n".join(table(rows).splitlines()[-len(runs):]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "clock": "process CPU time (time.process_time) of the whole call"}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

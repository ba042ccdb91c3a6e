"""Scaling and overhead of ``torchbandits sweep`` on Ray Tune (issue 16).

A sweep of ``--trials`` trials (SW-GP-UCB with the Algorithm-8 radius of Hong, Li & Tewari (2023)
on their one-switch environment, one seed per trial, a different window per trial, so every
trial costs about the same) runs on the local Ray cluster with 1 and with 2 concurrent workers
(Tune's ``max_concurrent_trials``), alternating the order over ``--repeats``. Reported:

* wall time of each sweep (Ray already started; ``ray.init`` timed separately) and the ratio
  ``wall(1 worker) / wall(2 workers)``;
* ``own`` — each trial's own run time, measured inside the trial (``run_trial``'s ``seconds``);
* overhead per trial ``(wall · workers − Σ own) / trials`` — everything that is not the trials'
  own work (Tune start-up, scheduling, actor start, result logging, our markers), shared out per
  trial, and as a percentage of the mean own time;
* the fixed cost of one Tune run (a one-trial sweep of a 1-round trial), and the marginal overhead
  per trial once that fixed cost is paid: ``(wall₁ − fixed − Σ own) / trials`` (1 worker).

Writes ``bench.json`` and ``bench.md`` to ``--out``. Threads are pinned to 1 per trial.

    python benchmarks/bench_sweep.py                 # 16 trials of T = 6000 (≈ 10 s each here)
    python benchmarks/bench_sweep.py --quick         # 4 trials of T = 30 (used by the tests)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


def make_spec(trials: int, horizon: int) -> dict[str, Any]:
    switch = max(1, round(0.3 * horizon))
    return {
        "name": "bench", "horizon": horizon, "seeds": [0],
        "environments": [{"name": "switching-kernel", "kwargs": {"switches": [switch]}}],
        "policies": [{"name": "sw-gpucb-finite", "label": "SW-GP-UCB",
                      "kwargs": {"lam": 0.05, "ucb_scale": 0.01, "convention": "aistats2023_code"},
                      "grid": {"window": [100 * (i + 1) for i in range(trials)]}}],
        "resources": {"cpus_per_trial": 1},
    }


def timed_sweep(spec: dict[str, Any], out: Path, workers: int) -> dict[str, Any]:
    from torchbandits.experiments.sweeps import sweep

    c0, t0 = time.process_time(), time.perf_counter()
    res = sweep(spec, out, workers=workers, verbose=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    own = [r["trial_seconds"] for r in res.rows]
    n = len(own)
    over = (wall * workers - sum(own)) / n
    return {"workers": workers, "trials": n, "wall_s": wall, "driver_cpu_s": cpu, "own_sum_s": sum(own),
            "own_mean_s": statistics.mean(own), "overhead_per_trial_s": over,
            "overhead_pct": 100.0 * over / statistics.mean(own)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 trials of T = 30")
    p.add_argument("--trials", type=int, default=None)
    p.add_argument("--horizon", type=int, default=None)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--out", default="results/bench_sweep")
    args = p.parse_args(argv)
    trials = args.trials or (4 if args.quick else 16)
    horizon = args.horizon or (30 if args.quick else 6000)
    import ray

    t0 = time.perf_counter()
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fixed = timed_sweep(make_spec(1, 1), Path(tmp) / "fixed", 1)["wall_s"]
            for rep in range(args.repeats):
                for workers in ((1, 2) if rep % 2 == 0 else (2, 1)):
                    row = timed_sweep(make_spec(trials, horizon), Path(tmp) / f"w{workers}-r{rep}", workers)
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if started:
            ray.shutdown()
    med = {w: {k: statistics.median(r[k] for r in rows if r["workers"] == w)
               for k in ("wall_s", "own_mean_s", "overhead_per_trial_s", "overhead_pct", "own_sum_s")}
           for w in (1, 2)}
    marginal = (med[1]["wall_s"] - fixed - med[1]["own_sum_s"]) / trials
    summary = {"trials": trials, "horizon": horizon, "repeats": args.repeats, "ray_init_s": init_s,
               "tune_fixed_s": fixed, "speedup_2_vs_1": med[1]["wall_s"] / med[2]["wall_s"],
               "marginal_overhead_per_trial_s": marginal,
               "marginal_overhead_pct": 100.0 * marginal / med[1]["own_mean_s"], "median": med,
               "runs": rows}
    (out / "bench.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# bench_sweep: {trials} trials, T = {horizon}, {args.repeats} repeat(s)", "",
             f"ray.init {init_s:.1f} s; fixed cost of one Tune run (1 trial of 1 round) {fixed:.1f} s", "",
             "| workers | wall s | trial own s (mean) | overhead / trial s | overhead % of own |",
             "|---:|---:|---:|---:|---:|"]
    for w in (1, 2):
        m = med[w]
        lines.append(f"| {w} | {m['wall_s']:.1f} | {m['own_mean_s']:.2f} | {m['overhead_per_trial_s']:.2f} | "
                     f"{m['overhead_pct']:.1f} |")
    lines += ["", f"wall(1) / wall(2) = {summary['speedup_2_vs_1']:.2f}; marginal overhead per trial "
              f"(1 worker, fixed cost removed) {marginal:.2f} s = {summary['marginal_overhead_pct']:.1f}% "
              "of a trial's own time"]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the batch pays on the CPU: whole runs, ``R`` seeds batched against ``R`` sequential runs.

    python benchmarks/bench_batch_crossover.py                 # every batchable family, T = 200
    python benchmarks/bench_batch_crossover.py --quick         # seconds: random, kucb; R = 2; T = 20
    python benchmarks/bench_batch_crossover.py --families amm-ucb,bkb --runs 2 3 4 --repeats 5

For each batchable policy family at the registry defaults on a typical environment (``rkhs``,
d = 3, 100 fresh arms per round; EK-UCB (Zenati et al. 2022, Algorithm 2) on ``chessboard``;
BKB (Calandriello et al. 2019, Algorithm 1) on ``rkhs`` with a fixed set of 1000 arms in
``[0, 1]^2``; R-GP-UCB / SW-GP-UCB (Zhou & Shroff 2021, Algorithms 1 and 2) on ``tv-rotation``
with ``H = w = 100``) and each ``R`` of ``--runs``: the process CPU time of one
:func:`~torchbandits.experiments.simulate_batch` call (``R`` seeds as one batch) and of ``R``
:func:`~torchbandits.experiments.simulate` calls, alternated A/B ``--repeats`` times in this
process, medians; one thread. The speedup is sequential / batched. Both give the same actions
(asserted). A family stops early once the batch pays by ``--stop-at`` (default 1.3×) at some R.

The crossover ("pays from") of a family is the smallest measured ``R`` from which the batch is
at least as fast as the sequential runs at every larger measured ``R``; it is the value a batched
policy class declares as ``batch_pays_from`` (read by ``--batch auto`` on the CPU,
:func:`torchbandits.experiments.batch.auto_batches`). Prints a markdown table and the crossovers.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from torchbandits.experiments import can_batch, simulate, simulate_batch  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402

#: family -> (registry policy, its keyword arguments, registry env, its keyword arguments)
FAMILIES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "random": ("random", {}, "rkhs", {}),
    "kucb": ("kucb", {}, "rkhs", {}),
    "gpucb": ("gpucb", {}, "rkhs", {}),
    "amm-ucb": ("amm-ucb", {}, "rkhs", {}),
    "igp-ucb": ("igp-ucb", {}, "rkhs", {}),
    "dmm-ucb": ("dmm-ucb", {}, "rkhs", {}),
    "r-gpucb": ("r-gpucb", {"period": 100}, "tv-rotation", {}),
    "sw-gpucb": ("sw-gpucb", {"window": 100}, "tv-rotation", {}),
    "ekucb": ("ekucb", {}, "chessboard", {}),
    "bkb": ("bkb", {}, "rkhs", {"fixed_arms": True, "dim": 2, "n_arms": 1000}),
}
QUICK = ("random", "kucb")


def _factories(family: str, horizon: int) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """``(make_env, make_policy(env))`` of a family at horizon ``horizon``."""
    pol, pol_kw, env, env_kw = FAMILIES[family]
    env_kw = {**env_kw, **({"horizon": horizon} if env.startswith("tv-") else {})}
    return (lambda: make_env(env, **env_kw)), (lambda e: make_policy(pol, e, **pol_kw))


def time_pair(family: str, n_runs: int, horizon: int, repeats: int) -> tuple[float, float]:
    """Medians ``(batched, sequential)`` of process CPU seconds for ``n_runs`` seeds."""
    new_env, new_policy = _factories(family, horizon)
    seeds = list(range(n_runs))
    env = new_env()
    if not can_batch(new_policy(env), env):
        raise ValueError(f"--families: {family} does not batch at its registry defaults")
    batched, sequential = [], []
    for rep in range(repeats):
        for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
            env = new_env()
            policy = new_policy(env)
            start = time.process_time()
            if side == 0:
                runs = simulate_batch(policy, env, horizon, seeds)
            else:
                runs = [simulate(policy, env, horizon, s) for s in seeds]
            (batched if side == 0 else sequential).append(time.process_time() - start)
            actions = [r.actions for r in runs]
            if side == 0:
                b_actions = actions
            else:
                s_actions = actions
        if b_actions != s_actions:
            raise AssertionError(f"{family}, R = {n_runs}: batched actions differ from sequential")
    return statistics.median(batched), statistics.median(sequential)


def pays_from(rows: Sequence[tuple[int, float]]) -> int | None:
    """Smallest ``R`` of ``rows = [(R, speedup), …]`` (ascending R) from which every speedup
    is ≥ 1; ``None`` if the batch does not pay at the largest ``R``."""
    best = None
    for n_runs, speedup in reversed(list(rows)):
        if speedup < 1.0:
            break
        best = n_runs
    return best


def main(argv: Sequence[str] | None = None) -> dict[str, int | None]:
    """Run the measurement, print the table; returns ``{family: pays_from}``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--runs", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--horizon", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stop-at", type=float, default=1.3,
                    help="stop a family once the batch pays by this much")
    ap.add_argument("--quick", action="store_true", help="random, kucb; R = 2; T = 20; 1 repeat")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    families = list(QUICK) if args.quick else args.families.split(",")
    runs = [2] if args.quick else sorted(args.runs)
    horizon = 20 if args.quick else args.horizon
    repeats = 1 if args.quick else args.repeats
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"--families: unknown {unknown}; known: {list(FAMILIES)}")
    print(f"T = {horizon}, {repeats} alternating repeats, process CPU s (medians), 1 thread, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| family | R | batched s | sequential s | speedup |\n|---|---:|---:|---:|---:|")
    crossover: dict[str, int | None] = {}
    for family in families:
        time_pair(family, 2, min(horizon, 10), 1)   # warm-up (lazy imports, compiled library)
        rows = []
        for n_runs in runs:
            b, s = time_pair(family, n_runs, horizon, repeats)
            rows.append((n_runs, s / b))
            print(f"| {family} | {n_runs} | {b:.3f} | {s:.3f} | {s / b:.2f}× |", flush=True)
            if s / b >= args.stop_at:
                break
        crossover[family] = pays_from(rows)
    print("\npays from (R):", ", ".join(f"{f} {'>' + str(runs[-1]) if r is None else r}"
                                        for f, r in crossover.items()))
    return crossover


if __name__ == "__main__":
    main()

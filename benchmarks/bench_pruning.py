"""Where the compiled select's pruning pays: pruned against full select on a run's own states,
and whole runs by default, always pruned and always full.

    python benchmarks/bench_pruning.py                  # the tables of docs/benchmarks.md
    python benchmarks/bench_pruning.py --quick          # seconds: K-UCB, 40 candidates
    python benchmarks/bench_pruning.py --settings amm-ucb:6:100 --points 160 250 500 --horizon 0

Each setting ``POLICY:D:A`` is a registry policy (K-UCB, GP-UCB, IGP-UCB, AMM-UCB, DMM-UCB, …:
a closed-form bound, Flynn & Reeb 2024 §5.4–5.5) on ``rkhs`` in ``[0, 1]^D`` with ``A`` fresh
candidates a round, run by the loop of :func:`~torchbandits.experiments.simulate` (the stored
points are the policy's own choices). From each ``n`` of ``--points`` on, ``--steps`` steps are
timed, alternately inside :func:`~torchbandits.models.exact_fused.pruned_select` (pruned wherever
the pruning applies: a one-term bound's rows at any ``n``, ``native/exact_prune.h``) and inside
:func:`~torchbandits.models.exact_fused.full_select` (every candidate solved in full): process
CPU time of ``select`` + ``update`` (the pruned select keeps the chosen candidate's pieces, which
the append then reads), medians, one thread. Both selects choose the same arm (the run is one run
either way). The ratio full / pruned above 1 is the pruning's gain at that ``n``.

Then (``--horizon T`` > 0) whole runs of each setting to ``T`` (``simulate``, seed 0), alternated
``--repeats`` times: by default (the rows pruned from 160 points, from 80 with 500 candidates or
more, and 16 full selects after two that pruned too little), always pruned, always full;
process CPU seconds, medians; the three make the same choices (asserted).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import torch  # noqa: E402

from torchbandits.experiments import simulate  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402
from torchbandits.models.exact_fused import full_select, pruned_select  # noqa: E402
from torchbandits.native import exact as nx  # noqa: E402

SETTINGS = ("kucb:3:5", "kucb:3:10", "kucb:3:20", "kucb:3:100", "kucb:3:300", "kucb:3:1000",
            "amm-ucb:6:100", "amm-ucb:3:100", "dmm-ucb:3:100", "dmm-ucb:3:1000")
POINTS = (60, 80, 100, 130, 160, 250, 500)


def parse_setting(text: str) -> tuple[str, int, int]:
    """``"POLICY:D:A"`` → ``(policy, d, A)``."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"--settings: expected POLICY:D:A (e.g. kucb:3:100), got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def measure(policy_name: str, dim: int, n_arms: int, points: Sequence[int],
            steps: int) -> tuple[dict[int, tuple[float, float]], list[int]]:
    """``({n: (pruned s, full s)}, actions)``: medians of a step's ``select`` + ``update`` over
    ``steps`` steps from ``n`` stored points on (even steps pruned, odd ones in full), and the
    run's arms (those of ``simulate`` with seed 0: the pruning changes no choice)."""
    env = make_env("rkhs", dim=dim, n_arms=n_arms)
    policy = make_policy(policy_name, env)
    env.reset(0)
    policy.reset(seed=0)
    times: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in points}
    actions = []
    for t in range(max(points) + steps):
        cand = env.candidates()
        window = [n for n in points if n <= t < n + steps]
        pruned = t % 2 == 0
        with contextlib.nullcontext() if not window else pruned_select() if pruned else \
                full_select():
            start = time.process_time()
            idx = policy.select(cand)
            chose = time.process_time()
            actions.append(int(idx))
            reward = env.pull(idx)
            resumed = time.process_time()
            policy.update(cand[idx], reward)
            done = time.process_time()
        if window:
            times[window[0]][0 if pruned else 1].append(chose - start + done - resumed)
    return ({n: (statistics.median(p), statistics.median(f)) for n, (p, f) in times.items()},
            actions)


MODES = {"default": contextlib.nullcontext, "pruned": pruned_select, "full": full_select}


def whole_runs(policy_name: str, dim: int, n_arms: int, horizon: int,
               repeats: int) -> dict[str, float]:
    """``{mode: median process seconds}`` of a run to ``horizon`` (seed 0) in each of
    :data:`MODES`, alternated ``repeats`` times; raises if their choices differ."""
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    actions: dict[str, list[int]] = {}
    for rep in range(repeats):
        order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
        for mode in order:
            env = make_env("rkhs", dim=dim, n_arms=n_arms)
            policy = make_policy(policy_name, env)
            with MODES[mode]():
                start = time.process_time()
                run = simulate(policy, env, horizon, 0, diagnostics_every=0)
                seconds[mode].append(time.process_time() - start)
            actions[mode] = run.actions
    if len({tuple(a) for a in actions.values()}) != 1:
        raise AssertionError(f"{policy_name}:{dim}:{n_arms}: the modes chose differently")
    return {mode: statistics.median(v) for mode, v in seconds.items()}


def main(argv: Sequence[str] | None = None) -> list[dict[str, float | int | str]]:
    """Run the measurement and print a markdown table; returns its rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), metavar="POLICY:D:A")
    ap.add_argument("--points", type=int, nargs="+", default=list(POINTS))
    ap.add_argument("--steps", type=int, default=24, help="timed steps from each n (half pruned)")
    ap.add_argument("--horizon", type=int, default=500, help="whole runs to T (0: none)")
    ap.add_argument("--repeats", type=int, default=3, help="whole runs: alternations")
    ap.add_argument("--quick", action="store_true",
                    help="kucb:3:40 at n = 20 and 100, 4 steps; whole runs to T = 110, once")
    args = ap.parse_args(argv)
    settings = ["kucb:3:40"] if args.quick else args.settings
    points = [20, 100] if args.quick else sorted(args.points)
    steps = 4 if args.quick else args.steps
    horizon, repeats = (110, 1) if args.quick else (args.horizon, args.repeats)
    if steps < 2:
        raise ValueError(f"--steps: at least 2 (one pruned, one full), got {steps}")
    if min(points) < 1:
        raise ValueError(f"--points: at least 1, got {min(points)}")
    if horizon < 0 or repeats < 1:
        raise ValueError(f"--horizon: at least 0 and --repeats: at least 1, got {horizon}, "
                         f"{repeats}")
    parsed = [parse_setting(s) for s in settings]
    torch.set_num_threads(1)
    if nx.available() is None:
        print("no compiled library (no C compiler): nothing to compare")
        return []
    print(f"select + update, process CPU ms (medians of {steps // 2} steps each), 1 thread, load "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| policy | d | A | n | pruned ms | full ms | full / pruned |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    rows: list[dict[str, float | int | str]] = []
    for name, dim, n_arms in parsed:
        for n, (p, f) in measure(name, dim, n_arms, points, steps)[0].items():
            rows.append({"policy": name, "d": dim, "A": n_arms, "n": n, "pruned_s": p,
                         "full_s": f})
            print(f"| {name} | {dim} | {n_arms} | {n} | {p * 1e3:.3f} | {f * 1e3:.3f} | "
                  f"{f / p if p > 0 else float('nan'):.2f} |", flush=True)
    if horizon:
        print(f"\nwhole runs to T = {horizon} (seed 0), process CPU s, medians of {repeats}\n")
        print("| policy | d | A | default s | pruned s | full s |\n|---|---:|---:|---:|---:|---:|")
        for name, dim, n_arms in parsed:
            secs = whole_runs(name, dim, n_arms, horizon, repeats)
            rows.append({"policy": name, "d": dim, "A": n_arms, "T": horizon, **{
                f"{mode}_run_s": v for mode, v in secs.items()}})
            print(f"| {name} | {dim} | {n_arms} | {secs['default']:.3f} | {secs['pruned']:.3f} | "
                  f"{secs['full']:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()

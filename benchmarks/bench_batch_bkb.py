"""Batched BKB (Calandriello et al., COLT 2019, Algorithm 1) against ``R`` sequential runs.

    python benchmarks/bench_batch_bkb.py            # A = 1000, d = 2, T = 2000, R = 1, 8, 64
    python benchmarks/bench_batch_bkb.py --quick    # A = 100, T = 40, R = 1, 4 (the tests)
    python benchmarks/bench_batch_bkb.py --max-sequential 8   # time 8 sequential runs, scale
    python benchmarks/bench_batch_bkb.py --device cuda --runs 64 1024 --horizon 1000

The registry's ``bkb`` (Theorem 1's β̃_t, λ = ξ², q̄ = 5) on ``rkhs`` with a fixed arm set of
``A`` arms in ``[0, 1]^d``: ``R`` seeds once through
:func:`~torchbandits.experiments.simulate_batch` (one batch) and once through ``R`` calls of
:func:`~torchbandits.experiments.simulate`; process CPU time of the whole call, one thread,
``--repeats`` times alternating A/B (median). Both must give the same actions (asserted; with
``--max-sequential k < R`` only the first ``k`` runs are compared and the sequential time is
scaled by ``R/k``).

On a float64 CPU both sides use the compiled BKB round (:mod:`torchbandits.native.bkb`; the
batch one call per round for all runs) when the library is available; ``TORCHBANDITS_NATIVE=0``
times both torch paths (the ``compiled`` field of each row says which ran).

Each row also gives the batched round's arithmetic: the scoring product
``W K_ZA`` (half-width ``W = [HᵀP; wᵀP]``: ``(M+1)·M·A`` multiply-adds per run, ``M`` the
largest dictionary of the batch, sampled at the end) and the sequential one (``(m_r+1)·m_r·A``) —
over the measured one-thread
float64 rate of that product's shape (``gemm_gflops``), the time those flops alone take. Writes
``bench.json`` and ``table.md`` to ``--out``.

``--device cuda`` runs the batch (its policy and environment) on the GPU and the sequential runs
on the CPU, as ``bench_batch.py --device cuda`` does: the batch is timed by wall clock between
two ``torch.cuda.synchronize`` calls (CUDA events cross-check it; the larger is kept) after a
warm-up batch of 2 runs and 20 rounds, the sequential runs by process CPU time (default there:
R = 64 and 1024, 8 sequential runs timed and scaled); every batched run must choose the same
arms as its sequential CPU run. The GEMM rate is not measured on a GPU.

    python benchmarks/bench_batch_bkb.py --runs 64 --horizon 1000 --profile 50

profiles instead the last 50 rounds of one batched run (the first ``--runs``) with
``torch.profiler`` (``record_shapes``): self CPU time by operator, and by operator and input
shapes, printed and written to ``profile.txt`` in ``--out``.

    python benchmarks/bench_batch_bkb.py --runs 64 --horizon 2000 --breakdown 8

splits instead the process CPU time of one batched run of ``--runs`` seeds and of 8 sequential
runs (the first 8 seeds) into parts (:func:`breakdown`): the compiled rounds (C), the binomial
draws, the width β̃_t, the rest of ``select``/``update``, ``diagnostics`` and the runner with the
environment, in µs per run-round, and the **ceiling** of the speedup while every batched round
is the sequential compiled round bit for bit: the sequential run-round over the batch's compiled
round, the speedup if nothing but the compiled rounds cost the batch anything. (The same C calls
on the same shapes take less time per run in the batch, back to back with warm caches, than
between the sequential run's Python steps: the sequential ``C round`` is given beside it.)
Prints it and writes ``breakdown.json`` to ``--out``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from torchbandits.experiments import simulate, simulate_batch  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402
from torchbandits.linalg import pivoted_cholesky  # noqa: E402
from torchbandits.native import bkb as native_bkb  # noqa: E402


def _sibling(name: str):  # type: ignore[no-untyped-def]
    """The benchmark script ``benchmarks/<name>.py`` as a module (loaded by path, as the tests
    load these scripts)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_BENCH_BATCH = _sibling("bench_batch")
cpu_time = _BENCH_BATCH.cpu_time
"""``(process CPU seconds of fn(), its result)`` (``bench_batch.cpu_time``)."""
device_time = _BENCH_BATCH.device_time
"""``fn()``'s time on a device: CPU time, or CUDA's synchronised wall clock (``bench_batch.device_time``)."""


def gemm_rate(m: int, a: int, runs: int = 8) -> float:
    """GFLOP/s of the batched scoring product ``[R, m+1, m] @ [R, m, A]`` on this thread."""
    w = torch.randn(runs, m + 1, m, dtype=torch.float64)
    k = torch.randn(runs, m, a, dtype=torch.float64)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        w @ k
        times.append(time.perf_counter() - t0)
    return 2.0 * runs * (m + 1) * m * a / statistics.median(times) / 1e9


def bench_bkb(runs: int, horizon: int, n_arms: int, dim: int, repeats: int,
              max_sequential: int | None, device: str = "cpu") -> dict:
    """One row: R runs of BKB batched (on ``device``) and sequential (CPU; module docstring)."""
    dev = torch.device(device)
    env = make_env("rkhs", dim=dim, n_arms=n_arms, fixed_arms=True)
    benv = env if dev.type == "cpu" else make_env("rkhs", dim=dim, n_arms=n_arms,
                                                  fixed_arms=True, device=str(dev))
    pkw = {} if dev.type == "cpu" else {"device": str(dev)}
    seeds = list(range(runs))
    k = runs if max_sequential is None else min(runs, max_sequential)
    bt, st, batch, seq = [], [], None, None
    # the one-off import of the pivoted Cholesky's LAPACK wrapper (scipy, loaded on first use by
    # a numerically singular K_ZZ) before either side is timed: not charged to whichever runs first
    pivoted_cholesky(torch.eye(2, dtype=torch.float64))
    if dev.type == "cuda":   # warm-up: CUDA context, library handles, kernel loads
        simulate_batch(make_policy("bkb", benv, **pkw), benv, min(horizon, 20), seeds[:2])
    for _ in range(repeats):
        t, batch = device_time(lambda: simulate_batch(make_policy("bkb", benv, **pkw), benv, horizon,
                                                 seeds), dev)
        bt.append(t)
        t, seq = cpu_time(lambda: [simulate(make_policy("bkb", env), env, horizon, s)
                               for s in seeds[:k]])
        st.append(t * runs / k)
    assert batch is not None and seq is not None
    same = all(b.actions == s.actions for b, s in zip(batch, seq))
    assert same, "batched BKB runs differ from the sequential runs"
    sizes = [int(b.diagnostics["dictionary_size"][-1]) for b in batch]
    mx = max(sizes)
    b_s, s_s = statistics.median(bt), statistics.median(st)
    return {"R": runs, "T": horizon, "A": n_arms, "d": dim, "batched_s": b_s,
            "sequential_s": s_s, "speedup": s_s / b_s if b_s > 0 else float("inf"),
            "batched_steps_per_s": runs * horizon / b_s, "sequential_steps_per_s":
            runs * horizon / s_s, "same_actions": same, "m_max": mx,
            "m_mean": sum(sizes) / len(sizes),
            "scoring_mflop_batched": 2e-6 * runs * (mx + 1) * mx * n_arms,
            "scoring_mflop_sequential": 2e-6 * sum((m + 1) * m * n_arms for m in sizes),
            "sequential_runs_timed": k, "device": str(dev),
            "batched_ms_per_round": 1e3 * b_s / horizon,
            "sequential_ms_per_run_round": 1e3 * s_s / (runs * horizon),
            "compiled": native_bkb.available(),
            "memory_bytes_per_run": batch[0].memory_bytes}


def profile_rounds(runs: int, horizon: int, n_arms: int, dim: int, window: int) -> str:
    """``torch.profiler`` tables of the last ``window`` rounds of one batched run of ``runs``
    seeds (the same setting as :func:`bench_bkb`): self CPU time by operator and by operator
    and input shapes (a profiler step per :meth:`select`)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    env = make_env("rkhs", dim=dim, n_arms=n_arms, fixed_arms=True)
    policy = make_policy("bkb", env)
    window = max(1, min(window, horizon - 1))
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   schedule=schedule(wait=max(horizon - window - 1, 0), warmup=1, active=window))
    select = policy.select

    def stepped(candidates):  # type: ignore[no-untyped-def]
        prof.step()
        return select(candidates)

    policy.select = stepped
    with prof:
        simulate_batch(policy, env, horizon, list(range(runs)))
    table = prof.key_averages()
    return (f"R = {runs}, T = {horizon}, A = {n_arms}, d = {dim}: the last {window} rounds\n"
            + table.table(sort_by="self_cpu_time_total", row_limit=30) + "\n"
            + prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=30))


class _Timed:
    """Process CPU seconds spent in named callables, patched in by :meth:`patch` and restored by
    :meth:`restore` (the breakdown's instrumentation)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[object, str, object | None]] = []

    def patch(self, owner: object, name: str, key: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.process_time() - c0

        own = vars(owner).get(name)   # None: found on the class (an instance's method)
        self._saved.append((owner, name, own))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, own in reversed(self._saved):
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
        self._saved.clear()


def breakdown(runs: int, horizon: int, n_arms: int, dim: int, sequential: int) -> dict:
    """Where a batched BKB run's process CPU time goes, in µs per run-round, beside the
    sequential run's (module docstring): ``batch`` (``C round``: the compiled rounds of
    :func:`torchbandits.native.bkb.dtc_rounds` / :func:`~torchbandits.native.bkb.select_rounds`
    (with every run's β̃_t and UCB argmax), a run the C code leaves included; ``C argmax``,
    ``C record``, ``C dictionary``: the other compiled calls; ``binomial``: the draws;
    ``beta``: β̃_t run by run; ``select rest``/``update rest``: the Python and torch glue;
    ``diagnostics``; ``runner + env``: the rest of the loop), ``sequential`` (``total``,
    ``C round``), and ``ceiling`` = sequential total / batched C round (the batch's best
    speedup while its rounds are the sequential compiled rounds)."""
    import torchbandits.native.bkb as nbkb

    env = make_env("rkhs", dim=dim, n_arms=n_arms, fixed_arms=True)
    pivoted_cholesky(torch.eye(2, dtype=torch.float64))
    policy = make_policy("bkb", env)
    clock = _Timed()
    for name, key in (("dtc_rounds", "C round"), ("select_rounds", "C round"),
                      ("ucb_argmax_rounds", "C argmax"),
                      ("record_rounds", "C record"), ("set_dictionary", "C dictionary")):
        if hasattr(nbkb, name):   # (select_rounds: not in older versions of the package)
            clock.patch(nbkb, name, key)
    clock.patch(torch, "binomial", "binomial")
    clock.patch(type(policy.rule), "radius", "beta")
    for name in ("select", "update", "diagnostics"):
        clock.patch(policy, name, name)
    try:
        total, _ = cpu_time(lambda: simulate_batch(policy, env, horizon, list(range(runs))))
    finally:
        clock.restore()
    keys = ("C round", "C argmax", "C record", "C dictionary", "binomial", "beta", "select",
            "update", "diagnostics")
    sec, per = {k: clock.seconds.get(k, 0.0) for k in keys}, 1e6 / (runs * horizon)
    c_select = sec["C round"] + sec["C argmax"]
    c_update = sec["C record"] + sec["C dictionary"] + sec["binomial"]
    batch = {k: sec[k] * per for k in ("C round", "C argmax", "C record", "C dictionary",
                                       "binomial", "beta")}
    batch["select rest"] = (sec["select"] - c_select - sec["beta"]) * per
    batch["update rest"] = (sec["update"] - c_update) * per
    batch["diagnostics"] = sec["diagnostics"] * per
    batch["runner + env"] = (total - sec["select"] - sec["update"] - sec["diagnostics"]) * per
    batch["total"] = total * per
    seq_clock = _Timed()
    seq_clock.patch(nbkb, "dtc_round", "C round")
    try:
        seq_total, _ = cpu_time(lambda: [simulate(make_policy("bkb", env), env, horizon, s)
                                         for s in range(min(sequential, runs))])
    finally:
        seq_clock.restore()
    k = min(sequential, runs) * horizon
    seq = {"total": seq_total * 1e6 / k, "C round": seq_clock.seconds.get("C round", 0.0) * 1e6 / k}
    return {"R": runs, "T": horizon, "A": n_arms, "d": dim, "sequential_runs": min(sequential, runs),
            "batch_us_per_run_round": batch, "sequential_us_per_run_round": seq,
            "ceiling": seq["total"] / batch["C round"] if batch["C round"] else float("inf"),
            "speedup_here": seq["total"] / batch["total"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="A = 100, T = 40, R = 1, 4")
    ap.add_argument("--runs", type=int, nargs="+", default=None)
    ap.add_argument("--horizon", type=int, default=None)
    ap.add_argument("--arms", type=int, default=None)
    ap.add_argument("--dim", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--max-sequential", type=int, default=None)
    ap.add_argument("--out", default="results/bench_batch_bkb")
    ap.add_argument("--profile", type=int, default=None, metavar="W",
                    help="profile the last W rounds of one batched run instead (CPU)")
    ap.add_argument("--breakdown", type=int, default=None, metavar="K",
                    help="split one batched run's CPU time into parts beside K sequential runs")
    ap.add_argument("--device", default="cpu",
                    help="where the batch runs (cuda: R = 64 1024 and --max-sequential 8 by "
                         "default; the sequential runs stay on the CPU)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    on_gpu = args.device.startswith("cuda")
    if on_gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda requested but CUDA is not available on this machine")
        args.runs = args.runs or [64, 1024]
        args.max_sequential = args.max_sequential or 8
    runs = args.runs or ([1, 4] if args.quick else [1, 8, 64])
    horizon = args.horizon or (40 if args.quick else 2000)
    arms = args.arms or (100 if args.quick else 1000)
    out = Path(args.out)
    if args.profile is not None:
        text = profile_rounds(runs[0], horizon, arms, args.dim, args.profile)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.txt").write_text(text)
        print(text, flush=True)
        return 0
    if args.breakdown is not None:
        info = breakdown(runs[0], horizon, arms, args.dim, args.breakdown)
        out.mkdir(parents=True, exist_ok=True)
        (out / "breakdown.json").write_text(json.dumps(info, indent=2))
        print(f"R = {info['R']}, T = {info['T']}, A = {info['A']}: µs per run-round", flush=True)
        for part, us in info["batch_us_per_run_round"].items():
            print(f"  batch {part:14s} {us:8.1f}")
        for part, us in info["sequential_us_per_run_round"].items():
            print(f"  sequential {part:9s} {us:8.1f}")
        print(f"  speedup here {info['speedup_here']:.2f}x, ceiling (sequential / batched C round) "
              f"{info['ceiling']:.2f}x", flush=True)
        return 0
    repeats = args.repeats or 1
    rows = []
    for r in runs:
        row = bench_bkb(r, horizon, arms, args.dim, repeats, args.max_sequential, args.device)
        row["gemm_gflops"] = float("nan") if on_gpu else gemm_rate(max(row["m_max"], 1), arms)
        row["scoring_s_batched"] = row["scoring_mflop_batched"] * 1e-3 * horizon / row["gemm_gflops"]
        rows.append(row)
        print(f"R={r:3d} T={horizon} batched ({args.device}) {row['batched_s']:.3f}s sequential "
              f"{row['sequential_s']:.3f}s speedup {row['speedup']:.2f}x (M = {row['m_max']}, "
              f"GEMM {row['gemm_gflops']:.1f} GFLOP/s; {row['batched_ms_per_round']:.2f} ms/round "
              f"batched, {row['sequential_ms_per_run_round']:.3f} ms/run-round sequential; "
              f"compiled BKB round: {'on' if row['compiled'] else 'off'})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"rows": rows}, indent=2))
    batch_clock = "batched CPU s" if not on_gpu else f"batched s ({args.device}, wall)"
    lines = [f"| R | T | A | {batch_clock} | sequential CPU s | batched run-steps/s | "
             "sequential run-steps/s | speedup | max m | GEMM GFLOP/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['R']} | {r['T']} | {r['A']} | {r['batched_s']:.3f} | {r['sequential_s']:.3f} "
              f"| {r['batched_steps_per_s']:,.0f} | {r['sequential_steps_per_s']:,.0f} | "
              f"{r['speedup']:.1f}× | {r['m_max']} | {r['gemm_gflops']:.1f} |" for r in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

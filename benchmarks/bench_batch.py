"""Batched runs against sequential runs: ``R`` seeds as one batch vs ``R`` runs one after another.

    python benchmarks/bench_batch.py               # random: every env; K-UCB, GP-UCB: 3 envs
    python benchmarks/bench_batch.py --quick       # seconds: random only, R = 1, 4; T = 30
    python benchmarks/bench_batch.py --policies kucb,gpucb --learning-horizon 200
    python benchmarks/bench_batch.py --policies ekucb --max-sequential 8   # Chessboard, T = 2000
    python benchmarks/bench_batch.py --whole-run   # K-UCB, rkhs, T = 1000, R = 64: one row
    python benchmarks/bench_batch.py --device cuda --policies kucb,gpucb,amm-ucb,dmm-ucb,igp-ucb
        # the batches on the GPU (R = 64, 1024) against the CPU sequential loop (8 runs, scaled)

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
# batched confidence rules (issue 13): per-round step times at t = 50, 100, 200 on ``rkhs``
RULES = ("amm-ucb", "dmm-ucb", "igp-ucb", "cmm-ucb", "aygp-ucb", "gpucb-srinivas")
RULE_TS = (50, 100, 200)
#: Nyström policies: EK-UCB (Zenati et al. 2022, Algorithms 2 and 4) on Chessboard, T = 2000
NYSTROM = {"ekucb": ("chessboard",)}
NYSTROM_HORIZON = 2000
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


def cpu_time(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """``(process CPU seconds of fn(), its result)``."""
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def device_time(fn, device: torch.device) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """``fn()``'s time: process CPU time on the CPU; on CUDA the wall-clock time between two
    ``torch.cuda.synchronize`` calls (the GPU's queued work included), cross-checked with CUDA
    events recorded around the call (the larger of the two is returned)."""
    if device.type != "cuda":
        return cpu_time(fn)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return max(wall, start.elapsed_time(end) / 1e3), out


def _device_env(name: str, horizon: int, device: torch.device):  # type: ignore[no-untyped-def]
    """The bench's environment ``name``, on ``device`` where its constructor takes one."""
    if device.type == "cpu":
        return _env(name, horizon)
    import inspect

    from torchbandits.experiments.registry import ENVIRONMENTS, resolve
    registry = "rkhs" if name == "rkhs-fixed" else name
    kwargs = dict(ENVS[name])
    if registry.startswith("tv-"):
        kwargs["horizon"] = max(horizon, 2)
    params = inspect.signature(resolve(ENVIRONMENTS[registry])).parameters
    if "device" in params or registry.startswith("tv-"):   # the tv- envs pass it to their base
        kwargs["device"] = str(device)
    return make_env(registry, **kwargs)


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


#: ``--draw-ahead`` → ``simulate_batch(draw_ahead=...)`` (``both`` times on, then off)
AHEAD: dict[str, bool | None] = {"auto": None, "on": True, "off": False, "both": True}


def posterior_flops(n_runs: int, horizon: int, n_arms: int, dim: int) -> float:
    """``R · Σ_{n<T} (n²·A + 2·n·A·d)``: a run's triangular solves and kernel products."""
    return float(n_runs * sum(n * n * n_arms + 2 * n * n_arms * dim for n in range(horizon)))


def bench_env(name: str, runs: list[int], horizon: int, repeats: int,
              policy: str = "random", max_sequential: int | None = None,
              device: str = "cpu", draw_ahead: str = "auto") -> list[dict]:
    """``max_sequential``: time at most that many sequential runs and scale to ``R`` (the
    sequential runs are independent, so their time is additive; the row says so). ``device``:
    where the batch runs (its policy and, where it takes one, its environment); the sequential
    runs stay on the CPU. On CUDA the batch is timed by wall clock between synchronisations
    (:func:`device_time`), the CPU side by process CPU time. ``draw_ahead``: the batch's
    ``simulate_batch(draw_ahead=...)`` (``auto``: its default, ``on``, ``off``); ``both``: the
    batch timed with and without, alternated (the row's ``batched_s`` with, ``batched_s_no_ahead``
    without)."""
    dev = torch.device(device)
    env = _env(name, horizon)
    benv = env if dev.type == "cpu" else _device_env(name, horizon, dev)
    pkw = {} if dev.type == "cpu" else {"device": str(dev)}
    rows = []
    for n in runs:
        seeds = list(range(n))
        n_seq = n if max_sequential is None else min(n, max_sequential)

        def batched(seeds: list[int] = seeds, ahead: bool | None = AHEAD[draw_ahead]
                    ):  # type: ignore[no-untyped-def]
            return simulate_batch(make_policy(policy, benv, **TV_LEARNING.get(policy, {}), **pkw),
                                  benv, horizon, seeds, diagnostics_every=0, draw_ahead=ahead)

        def sequential(seeds: list[int] = seeds[:n_seq]):  # type: ignore[no-untyped-def]
            return [simulate(make_policy(policy, env, **TV_LEARNING.get(policy, {})), env, horizon,
                             s, diagnostics_every=0) for s in seeds]

        tb, ts, t_off = [], [], []
        if dev.type == "cuda":  # warm-up: CUDA context, cuBLAS/cuSOLVER handles, kernel loads
            simulate_batch(make_policy(policy, benv, **TV_LEARNING.get(policy, {}), **pkw),
                           benv, min(horizon, 20), seeds[:2], diagnostics_every=0)
        for _ in range(repeats):  # alternate A/B
            cb, res_b = device_time(batched, dev)
            if draw_ahead == "both":
                c_off, res_off = device_time(lambda: batched(ahead=False), dev)
                t_off.append(c_off)
                assert all(a.actions == b.actions for a, b in zip(res_b, res_off, strict=True))
            cs, res_s = cpu_time(sequential)
            tb.append(cb)
            ts.append(cs * n / n_seq)
        same = all(a.actions == b.actions for a, b in zip(res_b, res_s, strict=False))
        b, s = statistics.median(tb), statistics.median(ts)
        row = {"policy": policy, "env": name, "R": n, "T": horizon, "batched_s": b,
               "sequential_s": s,
               "batched_steps_per_s": n * horizon / b if b > 0 else float("inf"),
               "sequential_steps_per_s": n * horizon / s if s > 0 else float("inf"),
               "speedup": s / b if b > 0 else float("inf"), "same_actions": same,
               "sequential_runs_timed": n_seq, "device": str(dev),
               "memory_bytes_per_run": res_b[0].memory_bytes, "draw_ahead": draw_ahead}
        if t_off:
            off = statistics.median(t_off)
            row["batched_s_no_ahead"] = off
            row["speedup_no_ahead"] = s / off if off > 0 else float("inf")
        if policy in LEARNING:
            env.reset(0)
            cand = env.candidates()
            flops = posterior_flops(n, horizon, int(cand.shape[0]), int(cand.shape[1]))
            row["batched_gflops"] = flops / b / 1e9 if b > 0 else float("inf")
        rows.append(row)
    return rows


def _rule_flops(policy: str, n_runs: int, n: int, n_arms: int, dim: int) -> float | None:
    """Posterior flops of one batched round with ``n`` points: ``R·(G·n²·A + 2·n·A·d)``, ``G``
    solves (5 for DMM's grid, Flynn & Reeb 2024 §7; 1 otherwise); ``None`` for CMM (an
    ``eigh`` and the α search)."""
    if policy == "cmm-ucb":
        return None
    g = 5 if policy == "dmm-ucb" else 1
    return float(n_runs * (g * n * n * n_arms + 2 * n * n_arms * dim))


def bench_rule_steps(policy: str, runs: list[int], horizon: int, ts: tuple[int, ...] = RULE_TS
                     ) -> list[dict]:
    """Per-round policy step time (``select`` + ``update``, process CPU time) of a batch of
    ``R`` runs against its ``R`` sequential runs on the same rounds of ``rkhs`` (Flynn & Reeb
    2024, §7: d = 3, 100 fresh arms, the registry's kernel), interleaved round by round (the
    batched step, then the ``R`` sequential steps: machine load hits both alike). Each round
    also checks that both chose the same arms. Reported per ``t`` in ``ts``: the median over
    rounds ``t−4..t+5`` of the time per run-step (batched step / R; sequential steps / R)."""
    from torchbandits.envs.batched import BatchedEnv

    env = _env("rkhs", horizon)
    rows = []
    for n_runs in runs:
        seeds = list(range(n_runs))
        benv = BatchedEnv(env, seeds)
        batch = make_policy(policy, env)
        batch.reset(seed=seeds)
        seqs = [make_policy(policy, env) for _ in seeds]
        for pol, sd in zip(seqs, seeds, strict=True):
            pol.reset(seed=sd)
        idx_rows = torch.arange(n_runs)
        tb, tsq, same = [], [], True
        for _ in range(horizon):
            cand = benv.candidates()
            c0 = time.process_time()
            idx = batch.select(cand)
            c1 = time.process_time()
            reward, _ = benv.pull(idx)               # the environment is not timed
            c2 = time.process_time()
            batch.update(cand[idx_rows, idx], reward)
            c3 = time.process_time()
            seq_s = 0.0
            for r, pol in enumerate(seqs):
                s0 = time.process_time()
                i = pol.select(cand[r])
                pol.update(cand[r, i], float(reward[r]))
                seq_s += time.process_time() - s0
                same = same and i == int(idx[r])
            tb.append((c1 - c0) + (c3 - c2))
            tsq.append(seq_s)
        cand = benv.candidates()
        for t in ts:
            if t > horizon:
                continue
            window = slice(max(t - 5, 0), min(t + 5, horizon))
            b = statistics.median(tb[window]) / n_runs
            s_ = statistics.median(tsq[window]) / n_runs
            flops = _rule_flops(policy, n_runs, t - 1, int(cand.shape[1]), int(cand.shape[2]))
            rows.append({"policy": policy, "env": "rkhs", "R": n_runs, "t": t,
                         "batched_ms_per_run_step": 1e3 * b, "sequential_ms_per_run_step": 1e3 * s_,
                         "speedup": s_ / b if b > 0 else float("inf"), "same_actions": same,
                         "batched_gflops": None if flops is None else flops / (b * n_runs) / 1e9})
    return rows


def rule_table(rows: list[dict]) -> str:
    """Markdown table of :func:`bench_rule_steps` rows."""
    lines = ["| policy | R | t | batched ms / run-step | sequential ms / run-step | speedup | "
             "same actions | batched GFLOP/s |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        rate = "–" if r["batched_gflops"] is None else f"{r['batched_gflops']:.2f}"
        lines.append(f"| {r['policy']} | {r['R']} | {r['t']} | {r['batched_ms_per_run_step']:.4f} | "
                     f"{r['sequential_ms_per_run_step']:.4f} | {r['speedup']:.1f}× | "
                     f"{'yes' if r['same_actions'] else 'NO'} | {rate} |")
    return "\n".join(lines)


def bench_whole_run(policy: str, name: str, n_runs: int, horizon: int,
                    repeats: int) -> dict:
    """One whole run of ``policy`` on ``name`` for ``n_runs`` seeds (T = ``horizon``): one
    batch against ``n_runs`` sequential runs, process CPU time, median of ``repeats`` (A/B
    alternating); the batch's peak memory per run (``memory_bytes``) is reported too."""
    env = _env(name, horizon)
    seeds = list(range(n_runs))
    tb, ts = [], []
    for _ in range(repeats):
        cb, res_b = cpu_time(lambda: simulate_batch(make_policy(policy, env), env, horizon, seeds,
                                                diagnostics_every=0))
        cs, res_s = cpu_time(lambda: [simulate(make_policy(policy, env), env, horizon, s,
                                           diagnostics_every=0) for s in seeds])
        tb.append(cb)
        ts.append(cs)
    b, s = statistics.median(tb), statistics.median(ts)
    same = all(a.actions == c.actions for a, c in zip(res_b, res_s, strict=True))
    return {"policy": policy, "env": name, "R": n_runs, "T": horizon, "batched_s": b,
            "sequential_s": s, "batched_steps_per_s": n_runs * horizon / b,
            "sequential_steps_per_s": n_runs * horizon / s, "speedup": s / b,
            "same_actions": same, "memory_bytes_per_run": res_b[0].memory_bytes}


def table(rows: list[dict]) -> str:
    lines = ["| policy | env | R | T | batched CPU s | sequential CPU s | batched run-steps/s | "
             "sequential run-steps/s | speedup | batched GFLOP/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{r['batched_gflops']:.3f}" if "batched_gflops" in r else "–"
        if r.get("sequential_runs_timed", r["R"]) < r["R"]:
            rate += f" (sequential: {r['sequential_runs_timed']} runs timed, scaled)"
        if "batched_s_no_ahead" in r:
            rate += (f" (without drawing ahead: {r['batched_s_no_ahead']:.3f} s, "
                     f"{r['speedup_no_ahead']:.1f}×)")
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
    ap.add_argument("--nystrom-horizon", type=int, default=NYSTROM_HORIZON,
                    help=f"T of the Nyström policies ({', '.join(NYSTROM)}; {NYSTROM_HORIZON})")
    ap.add_argument("--max-sequential", type=int, default=None,
                    help="time at most this many sequential runs per row and scale to R "
                         "(default: all; 8 is plenty for EK-UCB at T = 2000)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draw-ahead", choices=sorted(AHEAD), default="auto",
                    help="the batched environment's draws of the next chunk on a background "
                         "thread (simulate_batch's draw_ahead; auto: on a GPU for large "
                         "draws); both: the batch timed with and without, alternated")
    ap.add_argument("--device", default="cpu",
                    help="where the batches run (cpu; cuda: R = 64 1024 by default, the CPU "
                         "sequential loop timed on --max-sequential runs (8) and scaled; whole "
                         "runs for every policy, the confidence rules included)")
    ap.add_argument("--out", default="results/bench_batch")
    ap.add_argument("--whole-run", action="store_true",
                    help="only K-UCB's whole run: rkhs (d = 3, 100 fresh arms), T = --horizon "
                         "(1000), R = --runs (64), against R sequential runs")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda requested but CUDA is not available on this machine")
        args.runs = args.runs or [64, 1024]
        args.max_sequential = args.max_sequential or 8
    if args.whole_run:
        torch.set_num_threads(max(1, args.threads))
        row = bench_whole_run("kucb", "rkhs", (args.runs or [64])[0], args.horizon or 1000,
                              args.repeats or 1)
        print(json.dumps(row, indent=2))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "whole_run.json").write_text(json.dumps(row, indent=2))
        return 0
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
    known = ("random", *LEARNING, *RULES, *NYSTROM, *TV_LEARNING)
    bad = [p for p in policies if p not in known]
    if bad:
        raise SystemExit(f"unknown policies {bad}; choose from {','.join(known)}")
    rule_rows = []
    on_cpu = args.device == "cpu"
    for policy in [p for p in policies if p in RULES and on_cpu]:
        rule_rows.extend(bench_rule_steps(policy, runs, args.learning_horizon))
        print(rule_table(rule_rows), flush=True)
    policies = [p for p in policies if p not in RULES or not on_cpu]
    rows = []
    for policy in policies:
        if policy in NYSTROM:   # EK-UCB: Chessboard at T = 2000 (Zenati et al. 2022, §5)
            for name in (args.envs.split(",") if args.envs else NYSTROM[policy]):
                rows.extend(bench_env(name, runs, args.nystrom_horizon, repeats, policy,
                                      args.max_sequential, args.device, args.draw_ahead))
                print("\n".join(table(rows).splitlines()[-len(runs):]), flush=True)
            continue
        learning = policy != "random"
        envs = names if not learning or args.envs else list(
            TV_ENVS if policy in TV_LEARNING else ("rkhs",) if policy in RULES else LEARNING_ENVS)
        for name in envs:
            rows.extend(bench_env(name, runs, args.learning_horizon if learning else horizon,
                                  repeats, policy, args.max_sequential, args.device,
                                  args.draw_ahead))
            print("\n".join(table(rows).splitlines()[-len(runs):]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "device": args.device,
            "clock": "process CPU time (time.process_time) of the whole call"
                     + ("" if on_cpu else "; the batch on CUDA: wall clock between "
                        "torch.cuda.synchronize calls"),
            "gemm_gflops": gemm_gflops()}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows, "rule_rows": rule_rows},
                                               indent=2))
    text = table(rows) if rows else ""
    if rule_rows:
        text += ("\n\n" if text else "") + rule_table(rule_rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"float64 GEMM on {meta['threads']} thread(s): {meta['gemm_gflops']:.2f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

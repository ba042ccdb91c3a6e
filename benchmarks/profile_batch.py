"""Where a batched run spends its time: ``torch.profiler`` over one :func:`simulate_batch`.

    python benchmarks/profile_batch.py --policy amm-ucb --env rkhs --runs 1024 --horizon 100 \
        --device cuda
    python benchmarks/profile_batch.py --policy ekucb --env chessboard --runs 64 --horizon 300

Runs the batch once to warm up (CUDA context, library handles, kernel loads), then once under the
profiler (CPU activity, and CUDA activity on a GPU), and prints the wall time, the number of
operator calls per round, and the top operators by self CPU time and, on CUDA, by device time.
Threads are pinned to one.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from torchbandits.experiments import simulate_batch  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="amm-ucb")
    ap.add_argument("--env", default="rkhs")
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    env_kw = {} if device.type == "cpu" else {"device": str(device)}
    env = make_env(args.env, **env_kw)
    seeds = list(range(args.runs))

    def run() -> float:
        policy = make_policy(args.policy, env, device=str(device))
        _sync(device)
        t0 = time.perf_counter()
        simulate_batch(policy, env, args.horizon, seeds, diagnostics_every=0)
        _sync(device)
        return time.perf_counter() - t0

    print(f"warm-up: {run():.3f} s")
    print(f"plain:   {run():.3f} s  ({args.policy}, {args.env}, R = {args.runs}, "
          f"T = {args.horizon}, {device})")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        wall = run()
    events = prof.key_averages()
    calls = sum(e.count for e in events)
    print(f"profiled: {wall:.3f} s; {calls / args.horizon:.0f} profiled events per round")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if device.type == "cuda":
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

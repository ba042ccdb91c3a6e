"""Where a batched run spends its time: ``torch.profiler`` over one :func:`simulate_batch`.

    python benchmarks/profile_batch.py --policy amm-ucb --env rkhs --runs 1024 --horizon 100 \
        --device cuda
    python benchmarks/profile_batch.py --policy ekucb --env chessboard --runs 64 --horizon 300
    python benchmarks/profile_batch.py --setup --runs 1024 --env rkhs,rkhs-fixed,chessboard,bump,tv-rotation

Runs the batch once to warm up (CUDA context, library handles, kernel loads), then once under the
profiler (CPU activity, and CUDA activity on a GPU), and prints the wall time, the number of
operator calls per round, and the top operators by self CPU time and, on CUDA, by device time.
Threads are pinned to one.

``--timeline K`` runs no profiler: after the warm-up batch it prints the batched step's time
(``select`` + ``update``: CUDA events on a GPU) per ``K`` rounds of one plain batch, against the
loop's wall time — where a GPU batch turns from host-bound to device-bound as the state grows.

``--setup`` profiles only the batch's setup (``BatchedEnv(env, seeds)``): per run, the operators
that would run on the device (views excluded; counted under a ``TorchDispatchMode`` on a copy of
the environment moved to PyTorch's ``meta`` device, where every operator with a device output
stands for one launch on CUDA), the host-to-device copies (``_to_copy``/``copy_`` from the CPU
to the device) and the host operators (the runs' generator draws); then the setup's median time
over ``--repeats`` (process time on the CPU; on ``--device cuda`` wall time between
synchronisations) and the wall time of 128 environment rounds (every run pulling arm 0: the
streams' refills dominate at large R) with the refills drawn by one thread, by the default
``draw_threads``, and by those threads ahead of the rounds (``draw_ahead=True``: the next chunk
drawn on a background thread while the rounds use the open one). ``--env`` takes a
comma-separated list there (``rkhs-fixed``: ``rkhs`` with ``fixed_arms=True``); the counts read
``nan`` for a setup that reads a value back to the host (``tv-bump``: its step's bisection, once
per batch).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from torchbandits.experiments import simulate_batch  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_METADATA_OPS = {"squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_", "detach_", "set_"}
_SETUP_ENVS = {"rkhs-fixed": ("rkhs", {"fixed_arms": True})}


def _setup_env(name: str, device: torch.device | None = None) -> object:
    """The environment ``name`` of ``--setup`` (``tv-`` envs at T = 200) on ``device``."""
    base, kw = _SETUP_ENVS.get(name, (name, {}))
    kw = {**kw, **({"horizon": 200} if base.startswith("tv-") else {})}
    return make_env(base, **kw, **({} if device is None else {"device": str(device)}))


def _on_meta(env: object) -> object:
    """A deep copy of ``env`` whose tensors, modules and ``device`` are on ``meta``."""
    import copy

    meta = copy.deepcopy(env)
    for k, v in list(vars(meta).items()):
        if isinstance(v, (torch.Tensor, torch.nn.Module)):
            setattr(meta, k, v.to("meta"))
    meta.device = torch.device("meta")  # type: ignore[attr-defined]
    return meta


def setup_counts(env: object, seeds: list[int]) -> dict[str, float]:
    """Per-run operator counts of ``BatchedEnv(env, seeds)``: ``device_ops`` (would launch on a
    GPU), ``h2d`` (host-to-device copies), ``host_ops`` (CPU operators: generator draws, host
    staging), ``reads`` (device-to-host reads, each a synchronisation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchbandits.envs.batched import BatchedEnv

    def on(x: object, kind: str) -> bool:
        return isinstance(x, torch.Tensor) and x.device.type == kind

    counts = {"device_ops": 0, "h2d": 0, "host_ops": 0, "reads": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ins = [*args, *kwargs.values()]
            outs = out if isinstance(out, (tuple, list)) else (out,)
            name = func.overloadpacket.__name__
            if name in ("_to_copy", "copy_") and any(on(a, "cpu") for a in ins) and \
                    any(on(o, "meta") for o in outs):
                counts["h2d"] += 1
            elif name == "_local_scalar_dense" or (any(on(a, "meta") for a in ins) and
                                                  not any(on(o, "meta") for o in outs)):
                counts["reads"] += 1
            elif any(on(o, "meta") for o in outs):
                if not (func.is_view or name in _METADATA_OPS):   # a view launches nothing
                    counts["device_ops"] += 1
            else:
                counts["host_ops"] += 1
            return out

    meta = _on_meta(env)
    try:
        with torch.no_grad(), Count():
            BatchedEnv(meta, seeds)
    except (RuntimeError, NotImplementedError):   # a host read of a value: not countable on meta
        return {k: float("nan") for k in counts}
    return {k: v / len(seeds) for k, v in counts.items()}


def setup_main(args: argparse.Namespace) -> int:
    """``--setup``: per-run operator counts and CPU time of the batch's setup, per environment."""
    from torchbandits.envs.batched import BatchedEnv

    seeds = list(range(args.runs))
    device = torch.device(args.device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    print(f"batch setup, R = {args.runs}, {device}: per run, then the setup's time (median of "
          f"{args.repeats}, one thread) and 128 rounds' wall time (refills by 1 / default threads / "
          f"default threads drawing ahead)")
    print("| env | device ops / run | H2D copies / run | reads / run | host ops / run | "
          "device ops / batch | H2D / batch | setup s | 128 rounds s (1 thread / default / ahead) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def rounds(env: object, threads: int | None, ahead: bool | None = None) -> float:
        b = BatchedEnv(env, seeds, draw_threads=threads, draw_ahead=ahead)
        idx = torch.zeros(len(seeds), dtype=torch.long, device=b.device)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(128):
            b.pull(idx)
        _sync(device)
        b.close()
        return time.perf_counter() - t0

    for name in args.env.split(","):
        c = setup_counts(_setup_env(name), seeds)
        env = _setup_env(name, device)
        BatchedEnv(env, seeds[:2])   # warm-up
        times, one, auto, ahead = [], [], [], []
        for _ in range(args.repeats):
            _sync(device)
            t0 = clock()
            BatchedEnv(env, seeds)
            _sync(device)
            times.append(clock() - t0)
            one.append(rounds(env, 1))
            auto.append(rounds(env, None, False))
            ahead.append(rounds(env, None, True))
        n = len(seeds)
        med = statistics.median
        print(f"| {name} | {c['device_ops']:.2f} | {c['h2d']:.2f} | {c['reads']:.2f} | "
              f"{c['host_ops']:.2f} | {c['device_ops'] * n:.0f} | {c['h2d'] * n:.0f} | "
              f"{med(times):.3f} | {med(one):.3f} / {med(auto):.3f} / {med(ahead):.3f} |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="amm-ucb")
    ap.add_argument("--env", default="rkhs")
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--setup", action="store_true",
                    help="profile only the batch's setup (operator counts per run, CPU time)")
    ap.add_argument("--repeats", type=int, default=5, help="--setup: timed setups (median)")
    ap.add_argument("--timeline", type=int, default=0, metavar="K",
                    help="no profiler: the batched step's time (select + update) per K rounds "
                         "of the plain run, against the loop's wall time")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.setup:
        return setup_main(args)
    device = torch.device(args.device)
    env_kw = {} if device.type == "cpu" else {"device": str(device)}
    env = make_env(args.env, **env_kw)
    seeds = list(range(args.runs))

    runs: list = []

    def run() -> float:
        policy = make_policy(args.policy, env, device=str(device))
        _sync(device)
        t0 = time.perf_counter()
        runs[:] = simulate_batch(policy, env, args.horizon, seeds, diagnostics_every=0)
        _sync(device)
        return time.perf_counter() - t0

    print(f"warm-up: {run():.3f} s")
    print(f"plain:   {run():.3f} s  ({args.policy}, {args.env}, R = {args.runs}, "
          f"T = {args.horizon}, {device})")
    if args.timeline:
        return _timeline(runs, args.timeline)
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


def _timeline(runs: list, k: int) -> int:
    """The batched step's seconds per ``k`` rounds (a run's ``agent_seconds`` times R: CUDA
    events on a GPU) and the loop's wall time (``wall_seconds`` times R)."""
    step = [s * len(runs) for s in runs[0].agent_seconds]
    wall = runs[0].config["wall_seconds"] * len(runs)
    print(f"loop wall {wall:.3f} s, batched steps {sum(step):.3f} s (select + update)")
    for a in range(0, len(step), k):
        part = step[a:a + k]
        print(f"  rounds {a:5d}-{a + len(part) - 1:5d}: {1e3 * sum(part) / len(part):7.3f} ms a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

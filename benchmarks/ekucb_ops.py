"""Launching operators per round of the batched EK-UCB (Zenati et al. 2022, Algorithms 2 and 4),
by part: the operators that would each launch a kernel on CUDA, counted on the CPU.

    python benchmarks/ekucb_ops.py --runs 64 --start 1000 --rounds 100     # Chessboard, γ = λ = 10

Steps a batch of ``--runs`` seeds on Chessboard to round ``--start`` (unprofiled), then counts the
``aten`` operators of the next ``--rounds`` rounds with a ``TorchDispatchMode`` (the operators as
the backends see them, after the composite ones such as ``matmul`` decomposed), leaving out views
and metadata (``view``, ``slice``, ``select``, ``expand``, ``transpose``, ``unsqueeze``, ``empty``,
…), which launch nothing. The parts: ``score`` (the select's posterior), ``columns`` (the played
candidate's columns), ``append``, ``kors`` (the KORS probabilities), ``grow`` (the dictionary
growth of the posterior and of KORS), ``policy`` (the rest of select/update: coins, statistics,
run order), ``env`` (candidates, rewards, the runner's gathers). Allocations (``empty``,
``new_empty``) launch nothing and are not counted. Also prints the CPU seconds per
round of the same rounds, unprofiled (one thread; with ``--device cuda`` the counts are those
the GPU launches, and the milliseconds the host's CPU time, not the GPU's).

    python benchmarks/ekucb_ops.py --sync-free --chunk-runs 64   # the GPU's path, on the CPU
    python benchmarks/ekucb_ops.py --gpu-path    # the same with the compiled CPU kernels off:
                                                 # the torch program a GPU runs, operator for operator
    python benchmarks/ekucb_ops.py --rates   # + the score's products: compiled vs torch vs GEMM,
                                             # and its RBF block: torch vs compiled

``--device-profile`` also times ``--rounds`` more rounds by wall clock (synchronised) and, under
``torch.profiler``, the device's kernel time per round and the top kernels — on a GPU, whether a
late round is bound by the host (wall above kernel time) or by the device (about equal):

    python benchmarks/ekucb_ops.py --device cuda --runs 1024 --start 1500 --rounds 20 --device-profile

``--rates`` also times, on the state reached (CPU), the posterior's score of one round alone —
with the compiled per-run kernel (:mod:`torchbandits.native.ekucb`) and on the torch path
(chunked batched products) — as dense-equivalent GFLOP/s, ``2·(2A + 1)·Σ_r m_r²`` flops
(``f = P k_Z`` and ``Q [f, g]`` at each run's size; the compiled kernel skips the zeros of the
triangular ``P``, about a quarter of them), against this core's float64 GEMM rate (512 × 512,
one thread). The score also holds the kernel block and the reductions, so this is a lower bound
of the products' own rate.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from torchbandits.batching import deferred_checks  # noqa: E402
from torchbandits.envs.batched import BatchedEnv  # noqa: E402
from torchbandits.experiments.registry import make_env, make_policy  # noqa: E402

#: operators that only make a view or metadata (no kernel on CUDA)
NO_LAUNCH = {"view", "_unsafe_view", "as_strided", "slice", "select", "expand", "transpose", "t",
             "unsqueeze", "squeeze", "permute", "alias", "empty", "empty_like", "empty_strided",
             "detach", "lift_fresh", "_reshape_alias", "reshape", "unbind", "split",
             "split_with_sizes", "chunk", "narrow", "diagonal", "mT", "_conj", "resolve_conj",
             "resolve_neg", "view_as", "unfold", "movedim", "set_", "_local_scalar_dense",
             "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
             "is_nonzero", "result_type", "scalar_tensor",   # a wrapped scalar stays on the host
             "new_empty", "new_empty_strided"}                # an allocation launches nothing


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.part = "env"
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.clock = time.process_time()

    def enter(self, part: str) -> str:
        """Switch the current part to ``part`` (the time so far goes to the previous one)."""
        now = time.process_time()
        self.seconds[self.part] += now - self.clock
        self.clock = now
        outer, self.part = self.part, part
        return outer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name not in NO_LAUNCH:
            self.counts[(self.part, name)] += 1
        return func(*args, **(kwargs or {}))


def _wrap(obj: Any, method: str, part: str, mode: _Count) -> None:
    fn = getattr(obj, method)

    @functools.wraps(fn)
    def wrapped(*a: Any, **k: Any) -> Any:
        outer = mode.enter(part)
        try:
            return fn(*a, **k)
        finally:
            mode.enter(outer)
    setattr(obj, method, wrapped)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--start", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sync-free", action="store_true",
                    help="no compaction on the CPU either (the path a GPU runs)")
    ap.add_argument("--chunk-runs", type=int, default=None,
                    help="runs per chunk (the runs: one padded program, what a GPU runs; "
                         "default: the device's)")
    ap.add_argument("--gpu-path", action="store_true",
                    help="what a GPU runs, on the CPU: --sync-free, one chunk of all runs, the "
                         "compiled CPU kernels off (the torch program)")
    ap.add_argument("--by-op", action="store_true", help="also list the operators of each part")
    ap.add_argument("--device-profile", action="store_true",
                    help="also the wall time of --rounds more rounds (synchronised) and, under "
                         "torch.profiler, the device's kernel time per round and its top kernels")
    ap.add_argument("--rates", action="store_true",
                    help="also time the score's products alone: compiled, torch, GEMM (CPU)")
    args = ap.parse_args(argv)
    if args.gpu_path:
        from torchbandits import native

        args.sync_free, args.chunk_runs = True, args.runs
        with native.disabled():
            return _count(args)
    return _count(args)


def _count(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    env = make_env("chessboard", **({} if args.device == "cpu" else {"device": args.device}))
    policy = make_policy("ekucb", env, device=args.device)
    if args.sync_free:
        policy.cpu_compact_above = None
    seeds = list(range(args.runs))
    benv = BatchedEnv(env, seeds)
    policy.reset(seed=seeds)
    mode = _Count()
    model, kors = policy.batch_model, policy.batch_kors
    if args.chunk_runs is not None:
        model.set_chunk_runs(args.chunk_runs)
    for obj, method, part in ((model, "score", "score"), (model, "scored_columns", "columns"),
                              (model, "kernel_columns", "columns"), (model, "append", "append"),
                              (kors, "probability", "kors"), (model, "add_last", "grow"),
                              (kors, "add", "grow")):
        _wrap(obj, method, part, mode)
    for obj, method in ((policy, "select"), (policy, "update")):
        _wrap(obj, method, "policy", mode)
    if hasattr(model, "grow_masked"):   # the posterior's and KORS's growth in one call
        _wrap(model, "grow_masked", "grow", mode)

    def rounds(count: int, counting: bool) -> float:
        t0 = time.process_time()
        with deferred_checks() as checks, (mode if counting else _nothing()):
            checks.inputs_checked = True
            for _ in range(count):
                cand = benv.candidates()
                checks.flag_finite("candidates must be finite", cand)
                idx = policy.select(cand)
                reward, _ = benv.pull(idx)
                checks.flag_finite("reward must be finite", reward)
                gather = idx[:, None, None].expand(-1, 1, cand.shape[2])
                policy.update(cand.gather(1, gather)[:, 0], reward)
        return time.process_time() - t0

    rounds(args.start, False)
    mode.seconds.clear()
    mode.clock = time.process_time()
    secs = rounds(args.rounds, False)
    mode.enter("env")
    timed = dict(mode.seconds)
    rounds(args.rounds, True)
    per_part: collections.Counter[str] = collections.Counter()
    for (part, _), c in mode.counts.items():
        per_part[part] += c
    total = sum(per_part.values())
    path = ("GPU path: sync-free, native off" if args.gpu_path
            else "sync-free" if args.sync_free else "default") + (
        "" if args.chunk_runs is None else f", {args.chunk_runs} runs a chunk")
    print(f"EK-UCB batched ({path} path), Chessboard, "
          f"R = {args.runs}, rounds {args.start + args.rounds}-"
          f"{args.start + 2 * args.rounds} counted ({args.start}-{args.start + args.rounds} timed:"
          f" {1e3 * secs / args.rounds:.2f} ms CPU a round)")
    print(f"launching ops per round: {total / args.rounds:.1f}")
    for part in ("score", "columns", "append", "kors", "grow", "policy", "env"):
        print(f"  {part:8s} {per_part[part] / args.rounds:7.1f} ops"
              f"  {1e3 * timed.get(part, 0.0) / args.rounds:7.3f} ms")
    if args.by_op:
        for (part, name), c in sorted(mode.counts.items()):
            print(f"  {part:8s} {name:28s} {c / args.rounds:7.2f}")
    if args.rates and args.device == "cpu":
        _rates(model, benv.candidates())
    if args.device_profile:
        _device_profile(rounds, args.rounds, torch.device(args.device), model)
    return 0


def _device_profile(rounds: Any, count: int, device: torch.device, model: Any) -> None:
    """The wall time of ``count`` rounds (synchronised before and after), then the same number
    of rounds under ``torch.profiler``: the device's kernel time per round (on CUDA) and the top
    kernels by it. Wall above kernel time: the host bounds the round; about equal: the device."""
    from torch.profiler import ProfilerActivity, profile

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n0, m0 = model.n, model.max_size
    sync()
    t0 = time.perf_counter()
    rounds(count, False)
    sync()
    wall = (time.perf_counter() - t0) / count
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        rounds(count, False)
        sync()
    events = prof.key_averages()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    kernels = sorted(events, key=lambda e: getattr(e, attr, 0.0), reverse=True)
    busy = sum(getattr(e, attr, 0.0) for e in events if not e.key.startswith("aten::"))
    print(f"window: from n = {n0}, largest dictionary {m0}; wall {1e3 * wall:.2f} ms "
          f"a round; device kernels {busy / 1e3 / count:.2f} ms a round (profiled)")
    for e in kernels[:12]:
        print(f"  {getattr(e, attr, 0.0) / 1e3 / count:8.3f} ms/round  {e.count / count:6.1f}/round"
              f"  {e.key[:90]}")


def _best_ms(fn: Any, repeats: int = 30) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeats)
    return 1e3 * best


def _rates(model: Any, cand: torch.Tensor) -> None:
    """The posterior's score of one round alone on the current state (warm caches, best of 5),
    compiled and on the torch path (``native.disabled()``), and a 512 × 512 float64 GEMM."""
    from torchbandits import native

    sizes = model.sizes
    n_cand = cand.shape[1]
    flops = 2.0 * (2 * n_cand + 1) * float((sizes.double() ** 2).sum())
    lines = []
    if native.library("ekucb_batch") is not None:
        lines.append(("compiled per-run kernel", _best_ms(lambda: model.score(cand))))
    with native.disabled():
        lines.append(("torch chunked bmm", _best_ms(lambda: model.score(cand))))
    _block_rates(cand, int(sizes.max()))
    gemm = torch.rand(512, 512, dtype=torch.float64)
    gemm_rate = 2 * 512**3 / _best_ms(lambda: gemm @ gemm, 5) / 1e6
    print(f"score (kernel block, products, reductions), A = {n_cand}, sizes "
          f"{int(sizes.min())}-{int(sizes.max())} ({flops / 1e6:.1f} MFLOP dense-equivalent):")
    for name, ms in lines:
        print(f"  {name:24s} {ms:7.3f} ms  {flops / ms / 1e6:6.1f} GFLOP/s")
    print(f"  float64 GEMM 512x512     {gemm_rate:6.1f} GFLOP/s (one thread)")


def _block_rates(cand: torch.Tensor, width: int) -> None:
    """The score's RBF block ``[R, A, M]`` (Chessboard's ``ℓ = 0.1``: ``c = −50``) at the
    state's width: torch (``cdist``, ``square_``, ``mul_``, ``exp_``), the compiled exponent (bit
    for bit ``cdist``'s) with torch's ``exp_``, and the compiled block (a vectorised exp)."""
    from torchbandits.native import ekucb as native_ekucb

    z = torch.rand(cand.shape[0], width, cand.shape[2], dtype=cand.dtype)
    lines = [("torch cdist + exp_", lambda: torch.cdist(
        cand, z, compute_mode="donot_use_mm_for_euclid_dist").square_().mul_(-50.0).exp_())]
    if native_ekucb.rbf_exponent(cand, z, -50.0) is not None:
        lines.append(("compiled exponent + exp_",
                      lambda: native_ekucb.rbf_exponent(cand, z, -50.0).exp_()))
    if native_ekucb.rbf_block(cand, z, -50.0) is not None:
        lines.append(("compiled block", lambda: native_ekucb.rbf_block(cand, z, -50.0)))
    print(f"RBF block [{cand.shape[0]}, {cand.shape[1]}, {width}]:")
    for name, fn in lines:
        print(f"  {name:26s} {1e3 * _best_ms(fn):8.1f} µs")


if __name__ == "__main__":
    raise SystemExit(main())

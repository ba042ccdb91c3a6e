"""``batch_reset``: a batch set up at once equals its copies reset one by one (the same fields,
generators and ``repr``), with a number of device operations that does not grow with R."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchbandits.envs import (
    BumpEnv,
    ChessboardEnv,
    CosineBandit,
    LinearRotatingEnv,
    MovingBumpEnv,
    RKHSFunctionEnv,
    RotatingRKHSEnv,
    StationaryRKHSEnv,
    StepDiagonalEnv,
    SwitchingKernelEnv,
    SwitchingRKHSEnv,
)
from torchbandits.envs.batched import BatchedEnv, has_batch_reset

SEEDS = [0, 3, 7, 11, 40]
AT_ONCE = {
    "rkhs-fresh": lambda: RKHSFunctionEnv(dim=2, n_arms=20),
    "rkhs-fixed": lambda: RKHSFunctionEnv("matern52", dim=3, n_arms=15, fixed_arms=True),
    "rkhs-float32": lambda: RKHSFunctionEnv(dim=2, n_arms=10, dtype=torch.float32),
    "bump": lambda: BumpEnv(),
    "chessboard": lambda: ChessboardEnv(),
    "step-diagonal": lambda: StepDiagonalEnv(),
    "tv-rotation": lambda: RotatingRKHSEnv(horizon=50, n_arms=30, budget=3.0),
    "tv-rotation-2d": lambda: RotatingRKHSEnv("matern52", dim=2, horizon=50, n_arms=40),
    "tv-stationary": lambda: StationaryRKHSEnv(dim=2, horizon=50, n_arms=16),
    "tv-linear": lambda: LinearRotatingEnv(horizon=50, n_arms=20),
    "tv-bump": lambda: MovingBumpEnv(horizon=50, n_arms=30, budget=2.0),
    "tv-bump-2d": lambda: MovingBumpEnv("matern52", dim=2, horizon=50, n_arms=25, budget=1.0),
    "switching": lambda: SwitchingKernelEnv(n_arms=30, dim=4, switches=(10, 25)),
    "switching-resample": lambda: SwitchingKernelEnv(n_arms=20, dim=3, switches=(5, 9, 30),
                                                     mode="resample", noise="gaussian"),
    "cosine": lambda: CosineBandit(n_arms=40, dim=5),
    "tv-switch": lambda: SwitchingRKHSEnv(horizon=60, n_switches=3, n_anchors=8, n_arms=25),
    "tv-switch-budget": lambda: SwitchingRKHSEnv("matern52", dim=2, horizon=60, n_switches=2,
                                                 n_anchors=6, n_arms=20, budget=1.5),
    "tv-switch-none": lambda: SwitchingRKHSEnv(horizon=30, n_switches=0, n_anchors=5, n_arms=9),
    "cosine-slow": lambda: CosineBandit(n_arms=25, dim=3, phase="slow", dtype=torch.float32),
}


def _one_by_one(env, seeds):  # type: ignore[no-untyped-def]
    runs = []
    for s in seeds:
        run = copy.deepcopy(env)
        run.reset(s)
        runs.append(run)
    return runs


@pytest.mark.parametrize("name", sorted(AT_ONCE))
def test_batch_reset_equals_the_copies_reset_one_by_one(name: str) -> None:
    env = AT_ONCE[name]()
    assert has_batch_reset(env)
    batch = BatchedEnv(env, SEEDS)
    runs = _one_by_one(env, SEEDS)
    tol = 1e-12 if env.dtype == torch.float64 else 1e-5
    for field in env.batch_fields:
        want = torch.stack([getattr(r, field) for r in runs])
        got = batch.fields[field]
        assert got.shape == want.shape and got.dtype == want.dtype, field
        if field in ("inducing", "_arms", "arms", "_cands", "centres"):   # drawn: exact
            assert torch.equal(got, want), field
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=tol)
    for key, stream in batch.streams.items():   # every generator stands where reset left it
        for g, run in zip(stream.generators, runs, strict=True):
            assert torch.equal(g.get_state(), run.batch_generators()[key].get_state()), key
    for r, run in enumerate(runs):
        assert batch.run_repr(r) == repr(run)
    assert batch._copies is None   # no copy made ...
    for lazy, run in zip(batch.copies, runs, strict=True):   # ... until asked for
        assert lazy.seed == run.seed


def test_a_subclass_that_redraws_falls_back_to_its_copies() -> None:
    class Shifted(RotatingRKHSEnv):
        def _build(self, gen: torch.Generator) -> None:
            super()._build(gen)
            self._fa = self._fa + 1.0

    env = Shifted(horizon=20, n_arms=10)
    assert not has_batch_reset(env)
    batch = BatchedEnv(env, [1, 2])
    env.reset(2)
    torch.testing.assert_close(batch.mean_rewards()[1], env.mean_rewards(), rtol=0, atol=1e-12)


def _device_ops(env, seeds) -> int:  # type: ignore[no-untyped-def]
    """Operators with an output on ``meta`` (a launch each on a GPU) and copies to ``meta``
    while ``BatchedEnv(env on meta, seeds)`` is set up."""
    meta = copy.deepcopy(env)
    for k, v in list(vars(meta).items()):
        if isinstance(v, (torch.Tensor, torch.nn.Module)):
            setattr(meta, k, v.to("meta"))
    meta.device = torch.device("meta")
    count = [0, 0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if any(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in outs):
                count[0] += not func.is_view
                count[1] += func.overloadpacket.__name__ == "_to_copy" and any(
                    isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
            return out

    with torch.no_grad(), Count():
        BatchedEnv(meta, seeds)
    return count


@pytest.mark.parametrize("name", ["rkhs-fresh", "rkhs-fixed", "chessboard", "bump",
                                  "tv-rotation", "switching", "switching-resample", "cosine",
                                  "tv-switch", "tv-switch-budget"])
def test_setup_device_operations_do_not_grow_with_the_batch(name: str) -> None:
    env = AT_ONCE[name]()
    small, large = _device_ops(env, list(range(3))), _device_ops(env, list(range(40)))
    assert small == large
    assert large[1] <= 4   # one host-to-device copy per tensor kind


ON_DEVICE = {
    "rkhs-fresh": lambda dev: RKHSFunctionEnv(dim=2, n_arms=20, device=dev),
    "rkhs-fixed": lambda dev: RKHSFunctionEnv("matern52", dim=3, n_arms=15, fixed_arms=True,
                                              device=dev),
    "chessboard": lambda dev: ChessboardEnv(device=dev),
    "bump": lambda dev: BumpEnv(device=dev),
    "tv-rotation": lambda dev: RotatingRKHSEnv(horizon=50, n_arms=30, budget=3.0, device=dev),
    "switching": lambda dev: SwitchingKernelEnv(n_arms=30, dim=4, switches=(2,), device=dev),
    "cosine": lambda dev: CosineBandit(n_arms=40, dim=5, phase="slow", device=dev),
    "tv-switch": lambda dev: SwitchingRKHSEnv(horizon=60, n_switches=3, n_anchors=8, n_arms=25,
                                              device=dev),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(ON_DEVICE))
def test_cuda_setup_reads_nothing_back_and_equals_the_cpu_batch(name: str) -> None:
    """On CUDA the setup and the first rounds make no host synchronisation (non-blocking copies,
    no reads), and the fields and means equal the CPU batch's."""
    from torchbandits.batching import deferred_checks

    cpu, gpu_env = BatchedEnv(ON_DEVICE[name]("cpu"), SEEDS), ON_DEVICE[name]("cuda")
    idx = torch.zeros(len(SEEDS), dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with deferred_checks():
            gpu = BatchedEnv(gpu_env, SEEDS)
            fields = {k: v.clone() for k, v in gpu.fields.items()}
            for _ in range(3):
                gpu.pull(idx)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for _ in range(3):
        cpu.pull(torch.zeros(len(SEEDS), dtype=torch.long))
    for field, value in fields.items():
        torch.testing.assert_close(value.cpu(), cpu.fields[field], rtol=0, atol=1e-10)
    torch.testing.assert_close(gpu.mean_rewards().cpu(), cpu.mean_rewards(), rtol=0, atol=1e-10)

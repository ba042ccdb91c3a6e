"""Uniform random policy (the baseline every paper plots), sequential or batched."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..batching import (
    RunStreams,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
    to_device,
)
from .base import Policy
from .batch_mode import BatchModeMixin

__all__ = ["RandomPolicy"]


class RandomPolicy(BatchModeMixin, Policy):
    """Plays a uniformly random candidate each round, from its own generator.

    Batched mode (``reset(seed=[s_1, …, s_R])``): ``select(candidates [R, A, d])`` returns a
    ``LongTensor [R]`` on the policy's device and ``update(x [R, d], reward [R])`` checks its
    input; run ``r`` draws from a generator seeded ``s_r``, so it plays exactly what the
    sequential policy reset with ``seed=s_r`` plays. ``reset(seed=int)`` returns to one run.
    A batched step reads nothing back to the host: the draws come on the policy's device (one
    non-blocking copy per chunk of rounds), and inside
    :func:`~torchbandits.batching.deferred_checks` (the runner's trusted path) the input checks
    are device flags instead of host reads.

    Examples:
        >>> import torch
        >>> from torchbandits.policies import RandomPolicy
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> policy = RandomPolicy(seed=0)
        >>> 0 <= policy.select(arms) < 11
        True
        >>> policy.reset(seed=[0, 1, 2])  # three runs at once
        >>> policy.select(arms.expand(3, 11, 1)).shape  # LongTensor [R]
        torch.Size([3])
    """
    batch_pays_from = 3  # --batch auto on the CPU: from 3 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("n_warmup", 0)
        super().__init__(**kwargs)
        self.run_streams: RunStreams | None = None

    def _begin_batch(self, seeds: list[int], prepared: Any) -> None:
        self.run_streams = RunStreams.from_seeds(seeds, device=self.device)

    def forward(self, candidates: Tensor) -> Tensor:
        """Uniform random scores (their argmax is a uniform choice)."""
        cand = self.check_candidates(candidates)
        return torch.rand(cand.shape[0], generator=self.generator, dtype=self.dtype).to(self.device)

    def select(self, candidates: Any) -> Any:
        """One index (single run), or ``LongTensor [R]`` for candidates ``[R, A, d]`` (batch)."""
        if self.run_streams is None:
            cand = self.check_candidates(candidates)
            return int(torch.randint(cand.shape[0], (1,), generator=self.generator))
        cand = check_batched_candidates("candidates", candidates, self.run_streams.n_runs,
                                        dtype=self.dtype, device=self.device, dim=self.dim)
        return to_device(self.run_streams.randint(cand.shape[1]), self.device)

    def update(self, x: Any, reward: Any) -> None:
        """Single run: as :meth:`Policy.update`. Batch: ``x [R, d]``, ``reward [R]`` checked."""
        if self.run_streams is None:
            super().update(x, reward)
            return
        n = self.run_streams.n_runs
        xv = check_batch_points("x", x, n, dtype=self.dtype, device=self.device, dim=self.dim)
        check_batch_rewards("reward", reward, n, dtype=self.dtype, device=self.device)
        self.dim = xv.shape[1]
        self.t += 1

    def _update(self, x: Tensor, reward: float) -> None:
        pass

    def _extra_state(self) -> dict[str, Any]:
        if self.run_streams is None:
            return {"run_rng": None}
        return {"run_rng": self.run_streams.states()}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        rngs = state.get("run_rng")
        if rngs is None:
            self.run_streams = None
            return
        self.run_streams = RunStreams.from_states(rngs, device=self.device)

"""Uniform random policy (the baseline every paper plots)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Policy

__all__ = ["RandomPolicy"]


class RandomPolicy(Policy):
    """Plays a uniformly random candidate each round, from its own generator."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("n_warmup", 0)
        super().__init__(**kwargs)

    def forward(self, candidates: Tensor) -> Tensor:
        """Uniform random scores (their argmax is a uniform choice)."""
        cand = self.check_candidates(candidates)
        return torch.rand(cand.shape[0], generator=self.generator, dtype=self.dtype).to(self.device)

    def select(self, candidates: Any) -> int:
        cand = self.check_candidates(candidates)
        return int(torch.randint(cand.shape[0], (1,), generator=self.generator))

    def _update(self, x: Tensor, reward: float) -> None:
        pass

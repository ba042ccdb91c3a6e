"""Shared fixtures: float64, one thread, deterministic seeds."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, dtype=torch.float64)

"""The environment contract (docs/design.md, "The two contracts") and the ``joint`` helper."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["BanditEnv", "gaussian_reward", "joint"]


@runtime_checkable
class BanditEnv(Protocol):
    """A bandit problem seen round by round.

    ``candidates()`` are this round's joint ``[context; action]`` features (or the fixed arm
    set), ``pull(i)`` returns the noisy reward of candidate ``i`` and advances time, and
    ``mean_rewards()`` the noiseless means of this round's candidates (for pseudo-regret).
    """

    def reset(self, seed: int) -> None:
        """Start a new run from round 1 with the environment's generator seeded ``seed``."""
        ...

    def candidates(self) -> Tensor:
        """This round's candidates ``[A, d]`` (joint ``[context; action]`` rows or the arm set)."""
        ...

    def pull(self, index: int) -> float:
        """Play candidate ``index`` (in ``[0, A)``): its noisy reward; time advances one round."""
        ...

    def mean_rewards(self) -> Tensor:
        """Noiseless mean rewards ``[A]`` of this round's candidates (for pseudo-regret)."""
        ...


def joint(context: Tensor, actions: Tensor) -> Tensor:
    """Joint features ``[x; a]`` of one context with every action: ``[A, d_x + d_a]``.

    ``context`` is ``[d_x]`` (or ``[A, d_x]``, one context per action); ``actions`` is
    ``[A, d_a]`` (a 1-D ``[A]`` is read as scalar actions).
    """
    acts = actions.unsqueeze(-1) if actions.ndim == 1 else actions
    if acts.ndim != 2:
        raise ValueError(f"actions must be [A] or [A, d_a], got shape {tuple(actions.shape)}")
    ctx = context.reshape(1, -1).expand(acts.shape[0], -1) if context.ndim <= 1 else context
    if ctx.shape[0] != acts.shape[0]:
        raise ValueError(f"context has {ctx.shape[0]} rows but there are {acts.shape[0]} actions")
    return torch.cat([ctx.to(acts.dtype), acts], dim=-1)


def gaussian_reward(means: Tensor, index: int, generator: torch.Generator, noise_std: float,
                    dtype: torch.dtype = torch.float64) -> float:
    """``means[index] + N(0, noise_std²)`` with the noise drawn from ``generator``; raises if
    ``index`` is not a valid candidate index (before drawing, so a bad call changes nothing)."""
    if not 0 <= int(index) < means.shape[0]:
        raise ValueError(f"index must lie in [0, {means.shape[0]}), got {index}")
    noise = float(torch.randn((), generator=generator, dtype=dtype)) * noise_std
    return float(means[int(index)]) + noise

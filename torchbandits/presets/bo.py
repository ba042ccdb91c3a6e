"""Policy factory for problems whose kernel is unknown: GP-UCB with marginal-likelihood refits."""

from __future__ import annotations

from typing import Any

from ..policies import GPUCB, Policy
from .from_env import env_kernel, env_noise

__all__ = ["gpucb_fit"]


def gpucb_fit(env: Any, beta: float = 2.0, refit_every: int = 1, refit_warmup: int | None = None,
              lam: float | None = None, **kwargs: Any) -> Policy:
    """GP-UCB with a constant ``beta`` on the GP sd (BoTorch's ``UpperConfidenceBound`` with
    ``beta_botorch = beta²``), the environment's kernel as the template, its hyper-parameters
    and the noise refit every ``refit_every`` rounds after ``refit_warmup`` (default ``2d + 1``)."""
    dim = int(getattr(env, "dim", 1))
    warm = 2 * dim + 1 if refit_warmup is None else refit_warmup
    noise = env_noise(env)
    return GPUCB(env_kernel(env), lam=noise**2 if lam is None else lam, beta=beta,
                 refit_every=refit_every, refit_warmup=max(2, warm), **kwargs)

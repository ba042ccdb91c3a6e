"""Presets of Calandriello, Carratino, Lazaric, Valko, Rosasco, "Gaussian Process Optimization
with Adaptive Sketching: Scalable and No Regret", COLT 2019: BKB and the exact GP-UCB it is
compared with.

BKB's regulariser is ``λ = ξ²`` (the GP derivation of §2.1; the theorems allow any λ > 0 with the
noise level ξ kept separate) and its radius the β̃_t of Theorem 1 (§4) on the **ridge** sd
``σ̃_t/√λ``. The paper has no regret experiment; the reproduction gives BKB and exact GP-UCB the
same constant β = 0.3 on the ridge sd (``bkb-const``, ``gpucb-ridge``), so that only the posterior
differs.
"""

from __future__ import annotations

from typing import Any

from ..confidence import ConstantBeta
from ..policies import BKB, GPUCB, Policy
from .from_env import env_kernel, env_noise, env_norm

__all__ = ["CONSTANT_BETA", "bkb", "bkb_constant", "bkb_sor", "gpucb_ridge"]

#: the constant radius (ridge sd) BKB and GP-UCB share in the reproduction
CONSTANT_BETA = 0.3


def bkb(env: Any, **kwargs: Any) -> Policy:
    """BKB (Algorithm 1) with the environment's kernel, ξ and F, λ = ξ² and β̃_t of Theorem 1."""
    kwargs.setdefault("noise_std", env_noise(env))
    kwargs.setdefault("norm_bound", env_norm(env))
    return BKB(env_kernel(env), **kwargs)


def bkb_constant(env: Any, beta: float = CONSTANT_BETA, **kwargs: Any) -> Policy:
    """BKB with a constant ``beta`` on the ridge sd (the reproduction's convention)."""
    return bkb(env, beta_rule="constant", beta=beta, **kwargs)


def bkb_sor(env: Any, beta: float = CONSTANT_BETA, **kwargs: Any) -> Policy:
    """BKB with the subset-of-regressors variance, the variance-starvation ablation of Fig. 2
    (constant ``beta`` on the ridge sd)."""
    return bkb(env, beta_rule="constant", beta=beta, variance="sor", **kwargs)


def gpucb_ridge(env: Any, beta: float = CONSTANT_BETA, lam: float | None = None,
                **kwargs: Any) -> Policy:
    """Exact GP-UCB with BKB's convention: constant ``beta`` on the **ridge** sd, λ = ξ²."""
    lam = env_noise(env) ** 2 if lam is None else lam
    return GPUCB(env_kernel(env), lam=lam, beta=ConstantBeta(beta, variance="ridge"), **kwargs)

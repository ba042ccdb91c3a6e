"""Presets of Flynn & Reeb, "Tighter Confidence Bounds for Sequential Kernel Regression",
arXiv 2403.12732, 2024: Kernel CMM-UCB, DMM-UCB, AMM-UCB and the baselines AY-GP-UCB, IGP-UCB.

The settings are those of the experiments (§7): the true ``B`` and ``σ`` of the problem
(``env.norm``, ``env.noise_std``), δ = 0.01, the covariance scale ``c = 1`` for an RBF kernel and
``c = T^{−d/(2d+2ν)}`` for a Matérn-ν kernel (:func:`~torchbandits.confidence.mixture.default_c`,
horizon ``T``), AY-GP-UCB at ``λ = σ²/c`` and IGP-UCB with ``η = 2/T``. Every β multiplies the
**GP** posterior sd (Algorithm 1, §5.2).
"""

from __future__ import annotations

from typing import Any

from gpytorch.kernels import Kernel

from ..confidence.mixture import default_c
from ..policies import GPUCB
from ..policies.confidence_presets import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB
from .from_env import env_kernel, env_noise, env_norm

__all__ = ["amm_ucb", "aygp_ucb", "cmm_ucb", "dmm_ucb", "igp_ucb"]


def _env_params(env: Any, horizon: int, c: float | None) -> tuple[Kernel, dict[str, float]]:
    """The environment's kernel and ``(σ, B, c)``; ``c`` from :func:`default_c` when ``None``."""
    kernel = env_kernel(env)
    if c is None:
        c = default_c(kernel, int(getattr(env, "dim", 1)), int(horizon))
    return kernel, {"noise_std": env_noise(env), "norm_bound": env_norm(env), "c": float(c)}


def cmm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> CMMUCB:
    """Kernel CMM-UCB (§5.3): the exact maximum over the confidence set (1-D dual)."""
    kernel, p = _env_params(env, horizon, c)
    return CMMUCB(kernel, **{**p, **kwargs})


def dmm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> DMMUCB:
    """Kernel DMM-UCB (§5.4): min over the grid ``{0.1, 0.3, 1, 3, 10}·σ²/c`` (§7)."""
    kernel, p = _env_params(env, horizon, c)
    return DMMUCB(kernel, **{**p, **kwargs})


def amm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> AMMUCB:
    """Kernel AMM-UCB (§5.5) at ``α = σ²/c``."""
    kernel, p = _env_params(env, horizon, c)
    return AMMUCB(kernel, **{**p, **kwargs})


def aygp_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> GPUCB:
    """AY-GP-UCB (Abbasi-Yadkori 2012, Thm 3.11) at ``λ = σ²/c`` (§7)."""
    kernel, p = _env_params(env, horizon, c)
    return AYGPUCB(kernel, **{**p, **kwargs})


def igp_ucb(env: Any, horizon: int = 1000, eta: float | None = None, **kwargs: Any) -> GPUCB:
    """IGP-UCB (Chowdhury & Gopalan 2017, Thm 2) with the recommended ``η = 2/T`` (§7)."""
    kernel, p = _env_params(env, horizon, 1.0)
    p.pop("c")
    return IGPUCB(kernel, eta=2.0 / horizon if eta is None else eta, **{**p, **kwargs})

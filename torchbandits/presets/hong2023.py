"""Presets of Hong, Li, Tewari, "An Optimization-based Algorithm for Non-stationary Kernel Bandits
without Prior Knowledge", AISTATS 2023: OPKB (Algorithm 2), ADA-OPKB (Algorithms 3–4), OPNN
(Algorithm 5), OPNN0 (App. J.2), ADA-OPNN (Algorithm 7) and the baselines of §6 — GP-UCB in the
form of Algorithm 8, SW-GP-UCB and WGP-UCB on the finite arm set, MASTER + GP-UCB (App. E).

``horizon`` defaults to 10 000 (the experiments' T, §6); the kernel is a private copy of the
environment's. The OPNN family builds its own network features and reads nothing from ``env``.
"""

from __future__ import annotations

from typing import Any

from ..policies import ADAOPKB, ADAOPNN, OPKB, OPNN, OPNN0, Policy, op_baselines
from ..policies.master import MasterGPUCB
from .from_env import env_kernel

__all__ = ["ada_opkb", "ada_opnn", "gp_ucb_alg8", "master_gp_ucb", "opkb", "opnn", "opnn0", "sw_gp_ucb",
           "wgp_ucb"]


def opkb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """OPKB (Algorithm 2) on the environment's kernel."""
    return OPKB(env_kernel(env), horizon, **kwargs)


def ada_opkb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """ADA-OPKB (Algorithms 3–4) on the environment's kernel."""
    return ADAOPKB(env_kernel(env), horizon, **kwargs)


def opnn(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """OPNN (Algorithm 5): OPKB on the trained network's NTK features."""
    return OPNN(horizon, **kwargs)


def opnn0(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """OPNN0 (App. J.2): OPNN with the features frozen at initialisation."""
    return OPNN0(horizon, **kwargs)


def ada_opnn(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """ADA-OPNN (Algorithm 7): ADA-OPKB on the trained network's NTK features."""
    return ADAOPNN(horizon, **kwargs)


def gp_ucb_alg8(env: Any, **kwargs: Any) -> Policy:
    """GP-UCB in the form of Algorithm 8 on the finite arm set (primal model)."""
    return op_baselines.gp_ucb(env_kernel(env), **kwargs)


def sw_gp_ucb(env: Any, **kwargs: Any) -> Policy:
    """SW-GP-UCB with the Algorithm-8 radius on the finite arm set (window 3000, §6)."""
    return op_baselines.sw_gp_ucb(env_kernel(env), **kwargs)


def wgp_ucb(env: Any, **kwargs: Any) -> Policy:
    """WGP-UCB (discount 0.9995, §6) on the finite arm set, stable recursion."""
    return op_baselines.wgp_ucb(env_kernel(env), **kwargs)


def master_gp_ucb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    """MASTER + GP-UCB (App. E; the black-box reduction of Wei & Luo 2021)."""
    return MasterGPUCB(env_kernel(env), horizon, **kwargs)

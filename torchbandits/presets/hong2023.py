"""Presets of Hong, Li, Tewari, "An Optimization-based Algorithm for Non-stationary Kernel Bandits
without Prior Knowledge", AISTATS 2023: OPKB (Algorithm 2), ADA-OPKB (Algorithms 3–4), OPNN
(Algorithm 5), OPNN0 (App. J.2), ADA-OPNN (Algorithm 7) and the baselines of §6 — GP-UCB in the
form of Algorithm 8, SW-GP-UCB and WGP-UCB on the finite arm set, MASTER + GP-UCB (App. E).

``horizon`` defaults to 10 000 (the experiments' T, §6); the kernel is a private copy of the
environment's. The policy modules are imported when a preset is called (the OP solver and the
neural features are the heaviest parts of the library).
"""

from __future__ import annotations

from typing import Any

from ..policies.base import Policy
from .from_env import env_kernel

__all__ = ["ada_opkb", "ada_opnn", "gp_ucb_alg8", "master_gp_ucb", "opkb", "opnn", "opnn0", "sw_gp_ucb",
           "wgp_ucb"]


def opkb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.opkb import OPKB

    return OPKB(env_kernel(env), horizon, **kwargs)


def ada_opkb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.opkb import ADAOPKB

    return ADAOPKB(env_kernel(env), horizon, **kwargs)


def opnn(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.opnn import OPNN

    return OPNN(horizon, **kwargs)


def opnn0(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.opnn import OPNN0

    return OPNN0(horizon, **kwargs)


def ada_opnn(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.opnn import ADAOPNN

    return ADAOPNN(horizon, **kwargs)


def gp_ucb_alg8(env: Any, **kwargs: Any) -> Policy:
    from ..policies.op_baselines import gp_ucb

    return gp_ucb(env_kernel(env), **kwargs)


def sw_gp_ucb(env: Any, **kwargs: Any) -> Policy:
    from ..policies.op_baselines import sw_gp_ucb as make

    return make(env_kernel(env), **kwargs)


def wgp_ucb(env: Any, **kwargs: Any) -> Policy:
    from ..policies.op_baselines import wgp_ucb as make

    return make(env_kernel(env), **kwargs)


def master_gp_ucb(env: Any, horizon: int = 10_000, **kwargs: Any) -> Policy:
    from ..policies.master import MasterGPUCB

    return MasterGPUCB(env_kernel(env), horizon, **kwargs)

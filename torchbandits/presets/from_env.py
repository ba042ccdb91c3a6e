"""What a preset reads from an environment: its kernel, noise level, norm bound and horizon.

The papers hand every algorithm the true kernel, noise level ``σ`` (or ``R``, ``ξ``) and RKHS-norm
bound ``B`` (or ``F``) of the problem; the presets take them from the attributes an environment
declares (``kernel``, ``noise_std``, ``norm``, ``horizon``), with the defaults below when it
declares none.
"""

from __future__ import annotations

import copy
from typing import Any

from gpytorch.kernels import Kernel

from ..kernels import check_kernel

__all__ = ["DEFAULT_NOISE", "DEFAULT_NORM", "env_horizon", "env_kernel", "env_noise", "env_norm"]

#: noise level assumed when an environment declares none (or declares 0, a noiseless problem)
DEFAULT_NOISE = 0.1
#: RKHS-norm bound assumed when an environment declares none
DEFAULT_NORM = 1.0


def env_kernel(env: Any) -> Kernel:
    """A private copy of the environment's kernel (policies never share modules with envs)."""
    kernel = getattr(env, "kernel", None)
    if kernel is None:
        raise ValueError(f"environment {env!r} declares no kernel; pass one to the policy directly")
    return copy.deepcopy(check_kernel(kernel))


def env_noise(env: Any) -> float:
    """The declared noise standard deviation, :data:`DEFAULT_NOISE` when absent or zero.

    A noiseless problem (``noise_std = 0``) still gets a positive value: the regularisers and
    radii of the presets are built from it (``λ = σ²``) and must stay positive.
    """
    return float(getattr(env, "noise_std", DEFAULT_NOISE)) or DEFAULT_NOISE


def env_norm(env: Any) -> float:
    """The declared RKHS-norm bound ``B`` of the reward function, :data:`DEFAULT_NORM` when absent."""
    return float(getattr(env, "norm", DEFAULT_NORM))


def env_horizon(env: Any, horizon: int | None = None) -> int:
    """``horizon`` if given, else the environment's declared ``horizon`` (``ValueError`` if none)."""
    if horizon is not None:
        return int(horizon)
    if getattr(env, "horizon", None) is None:
        raise ValueError(f"environment {env!r} declares no horizon; pass horizon=")
    return int(env.horizon)

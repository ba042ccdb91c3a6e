"""Policy factories ``f(env, **kwargs) -> Policy`` used by the registry and the CLI.

They hand each policy its own copy of the environment's kernel, and the noise level and norm
bound the environment declares (the papers give the true values to every algorithm).
"""

from __future__ import annotations

import copy
from typing import Any

from gpytorch.kernels import Kernel

from ..confidence import AYBeta, KernelUCBTheoryBeta, SrinivasBeta
from ..kernels import check_kernel
from ..policies import GPUCB, KernelUCB, Policy, RandomPolicy

__all__ = ["ay_gpucb", "env_kernel", "gpucb", "gpucb_srinivas", "kucb", "kucb_theory", "random"]


def env_kernel(env: Any) -> Kernel:
    """A private copy of the environment's kernel (policies never share modules with envs)."""
    kernel = getattr(env, "kernel", None)
    if kernel is None:
        raise ValueError(f"environment {env!r} declares no kernel; pass one to the policy directly")
    return copy.deepcopy(check_kernel(kernel))


def _noise(env: Any) -> float:
    return float(getattr(env, "noise_std", 0.1)) or 0.1


def _norm(env: Any) -> float:
    return float(getattr(env, "norm", 1.0))


def kucb(env: Any, lam: float = 1.0, beta: float = 1.0, **kwargs: Any) -> Policy:
    return KernelUCB(env_kernel(env), lam=lam, beta=beta, **kwargs)


def kucb_theory(env: Any, lam: float = 1.0, delta: float = 0.01, **kwargs: Any) -> Policy:
    rule = KernelUCBTheoryBeta(_norm(env), delta=delta, noise_scale=_noise(env))
    return KernelUCB(env_kernel(env), lam=lam, beta=rule, **kwargs)


def gpucb(env: Any, **kwargs: Any) -> Policy:
    kwargs.setdefault("norm_bound", _norm(env))
    kwargs.setdefault("noise_std", _noise(env))
    return GPUCB(env_kernel(env), **kwargs)


def gpucb_srinivas(env: Any, delta: float = 0.1, **kwargs: Any) -> Policy:
    kwargs.setdefault("lam", _noise(env) ** 2)
    return GPUCB(env_kernel(env), beta=SrinivasBeta(delta=delta), **kwargs)


def ay_gpucb(env: Any, delta: float = 0.01, lam: float | None = None, **kwargs: Any) -> Policy:
    lam = _noise(env) ** 2 if lam is None else lam
    rule = AYBeta(_norm(env), _noise(env), lam=lam, delta=delta)
    return GPUCB(env_kernel(env), lam=lam, beta=rule, **kwargs)


def random(env: Any, **kwargs: Any) -> Policy:
    return RandomPolicy(**kwargs)

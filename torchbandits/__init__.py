"""torchbandits: kernel bandits in PyTorch.

Layers, imports running downward only (docs/design.md): ``kernels``, ``linalg`` → ``models``,
``confidence``, ``design`` → ``policies``, ``envs`` → ``presets`` → ``experiments`` →
``reproduce``, ``cli``.

The names below are imported on first use (PEP 562), so ``import torchbandits`` — and the
``torchbandits list`` command — import neither torch nor GPyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers and documentation tools
    from .envs import BanditEnv, RKHSFunctionEnv, joint
    from .fitting import FitResult, fit_kernel
    from .kernels import kernel_diag, kernel_matrix, make_kernel, product_kernel
    from .models import ExactKernelRidge
    from .policies import GPUCB, KernelUCB, Policy, RandomPolicy

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "BanditEnv": "envs", "RKHSFunctionEnv": "envs", "joint": "envs",
    "FitResult": "fitting", "fit_kernel": "fitting",
    "kernel_diag": "kernels", "kernel_matrix": "kernels", "make_kernel": "kernels",
    "product_kernel": "kernels",
    "ExactKernelRidge": "models",
    "GPUCB": "policies", "KernelUCB": "policies", "Policy": "policies", "RandomPolicy": "policies",
}

__all__ = [
    "GPUCB",
    "BanditEnv",
    "ExactKernelRidge",
    "FitResult",
    "KernelUCB",
    "Policy",
    "RKHSFunctionEnv",
    "RandomPolicy",
    "fit_kernel",
    "joint",
    "kernel_diag",
    "kernel_matrix",
    "make_kernel",
    "product_kernel",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

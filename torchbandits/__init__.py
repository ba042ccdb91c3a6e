"""torchbandits: kernel bandits in PyTorch.

Layers, imports running downward only (docs/design.md): ``kernels``, ``linalg`` → ``models``,
``confidence``, ``design`` → ``policies``, ``envs`` → ``presets`` → ``experiments`` →
``reproduce``, ``cli``.

The names below are imported on first use (PEP 562), so ``import torchbandits`` — and the
``torchbandits list`` command — import neither torch nor GPyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_attributes

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

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY)

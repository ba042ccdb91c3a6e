"""torchbandits: kernel bandits in PyTorch.

Layers (DESIGN.md): ``kernels`` → ``linalg`` → ``models`` → ``confidence`` → ``design`` →
``policies`` → ``envs`` → ``experiments`` → ``cli``.
"""

from .envs import BanditEnv, RKHSFunctionEnv, joint
from .fitting import FitResult, fit_kernel
from .kernels import kernel_diag, kernel_matrix, make_kernel, product_kernel
from .models import ExactKernelRidge
from .policies import GPUCB, KernelUCB, Policy, RandomPolicy

__version__ = "0.1.0"

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

"""Bandit policies: each an ``nn.Module`` with ``forward``/``select``/``update``/``reset``."""

from .base import IndexPolicy, Policy
from .ekucb import EKUCB, NystromUCB  # seed 000
from .kernel_ucb import GPUCB, KernelUCB
from .random import RandomPolicy

__all__ = ["GPUCB", "IndexPolicy", "KernelUCB", "Policy", "RandomPolicy"]
__all__ += ["EKUCB", "NystromUCB"]  # seed 000

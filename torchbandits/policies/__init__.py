"""Bandit policies: each an ``nn.Module`` with ``forward``/``select``/``update``/``reset``."""

from .base import IndexPolicy, Policy
from .kernel_ucb import GPUCB, KernelUCB
from .random import RandomPolicy

__all__ = ["GPUCB", "IndexPolicy", "KernelUCB", "Policy", "RandomPolicy"]

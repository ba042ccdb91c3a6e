"""Models: what is known about the reward function."""

from .exact import ExactKernelRidge, exact_posterior_reference
from .nystrom import NystromKernelRidge, nystrom_posterior_reference

__all__ = [
    "ExactKernelRidge",
    "NystromKernelRidge",
    "exact_posterior_reference",
    "nystrom_posterior_reference",
]

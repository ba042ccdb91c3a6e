"""Models: what is known about the reward function."""

from .exact import ExactKernelRidge, exact_posterior_reference

__all__ = ["ExactKernelRidge", "exact_posterior_reference"]

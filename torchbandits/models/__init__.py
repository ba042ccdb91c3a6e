"""Models: what is known about the reward function."""

from .batched_exact import BatchedExactKernelRidge  # R runs stepped together
from .exact import ExactKernelRidge, exact_posterior_reference
from .kors import KORS, kors_leverage_eq41
from .nystrom import NystromKernelRidge, nystrom_posterior_reference
from .rls import RLSResampler, theory_qbar  # BKB (Calandriello et al. 2019)

__all__ = [
    "KORS",
    "BatchedExactKernelRidge",
    "ExactKernelRidge",
    "NystromKernelRidge",
    "RLSResampler",
    "exact_posterior_reference",
    "kors_leverage_eq41",
    "nystrom_posterior_reference",
    "theory_qbar",
]
from .weighted import DiscountedKernelRidge, TimeDecayKernelRidge  # time-varying GP-UCBs
from .window import SlidingWindowKernelRidge  # SW-GP-UCB (Zhou & Shroff 2021)

__all__ += ["DiscountedKernelRidge", "SlidingWindowKernelRidge", "TimeDecayKernelRidge"]

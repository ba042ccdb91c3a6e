"""Models: what is known about the reward function."""

from .exact import ExactKernelRidge, exact_posterior_reference
from .kors import KORS, kors_leverage_eq41
from .nystrom import NystromKernelRidge, nystrom_posterior_reference
from .rls import RLSResampler, theory_qbar  # seed 001 (BKB)

__all__ = [
    "KORS",
    "ExactKernelRidge",
    "NystromKernelRidge",
    "RLSResampler",
    "exact_posterior_reference",
    "kors_leverage_eq41",
    "nystrom_posterior_reference",
    "theory_qbar",
]
from .weighted import DiscountedKernelRidge, TimeDecayKernelRidge  # seed 004
from .window import SlidingWindowKernelRidge  # seed 004

__all__ += ["DiscountedKernelRidge", "SlidingWindowKernelRidge", "TimeDecayKernelRidge"]  # seed 004

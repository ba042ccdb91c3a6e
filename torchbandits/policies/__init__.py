"""Bandit policies: each an ``nn.Module`` with ``forward``/``select``/``update``/``reset``."""

from .base import IndexPolicy, Policy
from .bkb import BKB  # seed 001
from .cbbkb import CBBKB, CBKB  # seed 000
from .confidence_presets import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB  # seed 002
from .ekucb import EKUCB, NystromUCB  # seed 000
from .kernel_ucb import GPUCB, KernelUCB
from .random import RandomPolicy
from .supkernel import SupKernelUCB  # seed 000

__all__ = ["AMMUCB", "AYGPUCB", "BKB", "CMMUCB", "DMMUCB", "GPUCB", "IGPUCB", "IndexPolicy", "KernelUCB",
           "Policy", "RandomPolicy"]
__all__ += ["CBBKB", "CBKB", "EKUCB", "NystromUCB", "SupKernelUCB"]  # seed 000
from .opkb import ADAOPKB, OPKB  # noqa: E402  seed 003
from .opnn import ADAOPNN, OPNN, OPNN0  # noqa: E402  seed 003

__all__ += ["ADAOPKB", "ADAOPNN", "OPKB", "OPNN", "OPNN0"]  # seed 003
from .time_varying import RGPUCB, SWGPUCB, TVGPUCB, WGPUCB  # noqa: E402  seed 004

__all__ += ["RGPUCB", "SWGPUCB", "TVGPUCB", "WGPUCB"]  # seed 004

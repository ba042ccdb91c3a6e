"""Bandit policies: each an ``nn.Module`` with ``forward``/``select``/``update``/``reset``.

By paper: :class:`KernelUCB` (K-UCB), :class:`EKUCB`, :class:`CBKB`, :class:`CBBKB`,
:class:`SupKernelUCB` (Zenati et al. 2022); :class:`BKB` (Calandriello et al. 2019);
:class:`CMMUCB`, :class:`DMMUCB`, :class:`AMMUCB` and the GP-UCB presets :func:`AYGPUCB`,
:func:`IGPUCB` (Flynn & Reeb 2024); :class:`OPKB`, :class:`ADAOPKB`, :class:`OPNN`, :class:`OPNN0`,
:class:`ADAOPNN` (Hong et al. 2023); :class:`RGPUCB`, :class:`SWGPUCB` and the baselines
:class:`TVGPUCB`, :class:`WGPUCB` (Zhou & Shroff 2021). :class:`GPUCB` is GP-UCB / CGP-UCB.
The presets that build them for an environment are in :mod:`torchbandits.presets`.
"""

from .base import IndexPolicy, Policy, check_model
from .bkb import BKB
from .cbbkb import CBBKB, CBKB
from .confidence_presets import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB
from .ekucb import EKUCB, NystromUCB
from .kernel_ucb import GPUCB, KernelUCB
from .opkb import ADAOPKB, OPKB
from .opnn import ADAOPNN, OPNN, OPNN0
from .random import RandomPolicy
from .supkernel import SupKernelUCB
from .time_varying import RGPUCB, SWGPUCB, TVGPUCB, WGPUCB

__all__ = [
    "ADAOPKB",
    "ADAOPNN",
    "AMMUCB",
    "AYGPUCB",
    "BKB",
    "CBBKB",
    "CBKB",
    "CMMUCB",
    "DMMUCB",
    "EKUCB",
    "GPUCB",
    "IGPUCB",
    "OPKB",
    "OPNN",
    "OPNN0",
    "RGPUCB",
    "SWGPUCB",
    "TVGPUCB",
    "WGPUCB",
    "IndexPolicy",
    "KernelUCB",
    "NystromUCB",
    "Policy",
    "RandomPolicy",
    "SupKernelUCB",
    "check_model",
]

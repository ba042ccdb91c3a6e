"""Environments of the papers, all meeting the :class:`BanditEnv` contract.

Where each comes from: :class:`RKHSFunctionEnv` (Flynn & Reeb 2024, §7); :class:`BumpEnv`,
:class:`ChessboardEnv`, :class:`StepDiagonalEnv` (Zenati et al. 2022, §5 and App. F.2.2);
:class:`SwitchingKernelEnv`, :class:`CosineBandit` (Hong et al. 2023, §6 and App. J); the
time-varying RKHS generators (a benchmark for Zhou & Shroff 2021, whose budget ``P_T`` they
declare exactly); :class:`DigitsEnv` (real data) and :class:`TestFunctionEnv` (BoTorch functions).
Their registry names are in :mod:`torchbandits.experiments.registry`.
"""

from .base import BanditEnv, joint
from .contextual import BumpEnv, ChessboardEnv, ContextualGridEnv, StepDiagonalEnv
from .digits import DigitsEnv  # scikit-learn, imported lazily
from .nonstationary import CosineBandit, SwitchingKernelEnv
from .rkhs import RKHSFunctionEnv
from .test_functions import TestFunctionEnv  # BoTorch, imported lazily
from .time_varying import (
    LinearRotatingEnv,
    MovingBumpEnv,
    RotatingRKHSEnv,
    StationaryRKHSEnv,
    SwitchingRKHSEnv,
)

__all__ = [
    "BanditEnv",
    "BumpEnv",
    "ChessboardEnv",
    "ContextualGridEnv",
    "CosineBandit",
    "DigitsEnv",
    "LinearRotatingEnv",
    "MovingBumpEnv",
    "RKHSFunctionEnv",
    "RotatingRKHSEnv",
    "StationaryRKHSEnv",
    "StepDiagonalEnv",
    "SwitchingKernelEnv",
    "SwitchingRKHSEnv",
    "TestFunctionEnv",
    "joint",
]

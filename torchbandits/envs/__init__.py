"""Environments of the papers, all meeting the :class:`BanditEnv` contract."""

from .base import BanditEnv, joint
from .contextual import BumpEnv, ChessboardEnv, ContextualGridEnv, StepDiagonalEnv  # seed 000
from .rkhs import RKHSFunctionEnv

__all__ = ["BanditEnv", "RKHSFunctionEnv", "joint"]
__all__ += ["BumpEnv", "ChessboardEnv", "ContextualGridEnv", "StepDiagonalEnv"]  # seed 000
from .nonstationary import CosineBandit, SwitchingKernelEnv  # noqa: E402  seed 003

__all__ += ["CosineBandit", "SwitchingKernelEnv"]  # seed 003
from .time_varying import (  # noqa: E402  seed 004
    LinearRotatingEnv,
    MovingBumpEnv,
    RotatingRKHSEnv,
    StationaryRKHSEnv,
    SwitchingRKHSEnv,
)

__all__ += ["LinearRotatingEnv", "MovingBumpEnv", "RotatingRKHSEnv", "StationaryRKHSEnv",
            "SwitchingRKHSEnv"]  # seed 004
from .digits import DigitsEnv  # noqa: E402  real data (scikit-learn, imported lazily)
from .test_functions import TestFunctionEnv  # noqa: E402  BoTorch functions (imported lazily)

__all__ += ["DigitsEnv", "TestFunctionEnv"]

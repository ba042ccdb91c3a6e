"""Environments of the papers, all meeting the :class:`BanditEnv` contract."""

from .base import BanditEnv, joint
from .rkhs import RKHSFunctionEnv

__all__ = ["BanditEnv", "RKHSFunctionEnv", "joint"]

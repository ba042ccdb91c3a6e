"""Confidence rules (how wide to be) on top of a posterior model."""

from .base import ConfidenceRule, ConstantBeta, PosteriorModel, RadiusRule, Variance, as_rule
from .batched import BATCHED_RULES, batched_bounds, batched_radius  # R runs at once (issue 13)
from .bkb import BKBBeta  # Calandriello et al. 2019
from .ekucb import EKUCBTheoryBeta  # Zenati et al. 2022
from .gain import GainBeta  # Hong, Li & Tewari 2023 (GP-UCB baselines)
from .mixture import AMMBound, CMMBound, DMMBound, MixtureBound, default_c  # Flynn & Reeb 2024
from .radii import AYBeta, IGPBeta, KernelUCBTheoryBeta, SrinivasBeta

__all__ = [
    "BATCHED_RULES",
    "AMMBound",
    "AYBeta",
    "BKBBeta",
    "CMMBound",
    "ConfidenceRule",
    "ConstantBeta",
    "DMMBound",
    "EKUCBTheoryBeta",
    "GainBeta",
    "IGPBeta",
    "KernelUCBTheoryBeta",
    "MixtureBound",
    "PosteriorModel",
    "RadiusRule",
    "SrinivasBeta",
    "Variance",
    "as_rule",
    "batched_bounds",
    "batched_radius",
    "default_c",
]
from .time_varying import (  # Zhou & Shroff
    AnalyticGamma,
    ConstantGamma,
    GreedyGamma,
    RestartBeta,
    WindowBeta,
)

__all__ += ["AnalyticGamma", "ConstantGamma", "GreedyGamma", "RestartBeta", "WindowBeta"]  # Zhou & Shroff

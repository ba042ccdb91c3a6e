"""Confidence rules (how wide to be) on top of a posterior model."""

from .base import ConfidenceRule, ConstantBeta, PosteriorModel, RadiusRule, Variance
from .ekucb import EKUCBTheoryBeta  # seed 000
from .radii import AYBeta, IGPBeta, KernelUCBTheoryBeta, SrinivasBeta

__all__ = [
    "AYBeta",
    "ConfidenceRule",
    "ConstantBeta",
    "EKUCBTheoryBeta",
    "IGPBeta",
    "KernelUCBTheoryBeta",
    "PosteriorModel",
    "RadiusRule",
    "SrinivasBeta",
    "Variance",
]

"""Confidence rules (how wide to be) on top of a posterior model."""

from .base import ConfidenceRule, ConstantBeta, PosteriorModel, RadiusRule, Variance
from .radii import AYBeta, IGPBeta, KernelUCBTheoryBeta, SrinivasBeta

__all__ = [
    "AYBeta",
    "ConfidenceRule",
    "ConstantBeta",
    "IGPBeta",
    "KernelUCBTheoryBeta",
    "PosteriorModel",
    "RadiusRule",
    "SrinivasBeta",
    "Variance",
]

"""EK-UCB's theory radius (Zenati et al., AISTATS 2022, Lemma 4.1 / Lemma 12, §4.3)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..validation import check_positive, check_probability
from .base import PosteriorModel, RadiusRule

__all__ = ["EKUCBTheoryBeta"]


class EKUCBTheoryBeta(RadiusRule):
    """EK-UCB radius multiplying the **ridge** sd ``σ̃ = ‖φ(x)‖_{Ṽ⁻¹}``:

    ``β̃_t = (√λ + √μ)·B + σ·sqrt(4 log(1/δ) + 2 log det(I + K_{t−1}/λ))``

    with ``B ≥ ‖θ*‖``, KORS regulariser ``μ`` (Prop. 4.1 bounds ``μ_t ≤ μ``), noise scale ``σ``
    and per-round level ``δ`` (the paper mixes ``δ``, ``1/T`` and ``1/T²``; we take one
    ``δ`` per round). The log-det is the model's running sum
    ``Σ log(1 + σ̃²_{i−1}(s_i))`` (``log_det_running``), an upper bound of the exact one since
    ``σ̃² ≥ σ̂²``; a model without it falls back to ``log_det()``.
    """

    name = "ekucb_theory"
    variance = "ridge"

    def __init__(self, norm_bound: float, mu: float, delta: float = 0.01, noise_scale: float = 1.0) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.mu = check_positive("mu", mu)
        self.delta = check_probability("delta", delta)
        self.noise_scale = check_positive("noise_scale", noise_scale)

    def radius(self, model: PosteriorModel, n_candidates: int, t: int) -> Tensor:
        """``(√λ + √μ)·B + noise_scale·sqrt(4 log(1/δ) + 2 max(log det, 0))`` (the running log det of
        the Nyström model when it keeps one).
        """
        logdet = getattr(model, "log_det_running", None)
        logdet = float(model.log_det()) if logdet is None else float(logdet)
        inner = 4.0 * math.log(1.0 / self.delta) + 2.0 * max(logdet, 0.0)
        rad = (math.sqrt(model.lam) + math.sqrt(self.mu)) * self.norm_bound
        return torch.tensor(rad + self.noise_scale * math.sqrt(inner), dtype=torch.float64)

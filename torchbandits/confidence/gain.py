"""A radius from the realised information gain of the data the model holds.

:class:`GainBeta` is the width of the GP baselines of Hong, Li & Tewari (AISTATS 2023): GP-UCB
in the IGP-UCB form of Chowdhury & Gopalan 2017 (their Algorithm 8, Appendix E) and the
discounted WGP-UCB of their experiments (Section 6). On the **GP** posterior sd,

    β_t = v·(B + R·sqrt(2(γ + extra + ln 1/δ))),   γ = ½ log det(I + K/λ)

with the model's own log-determinant (``model.log_det()``: ``log det(V/λ)`` for the finite-arm
primal model, ``log det(I + W^{1/2}KW^{1/2}/λ)`` for the discounted one).
"""

from __future__ import annotations

import math

from ..validation import check_positive, check_probability
from .base import PosteriorModel, RadiusRule, log_det_value

__all__ = ["GainBeta"]


class GainBeta(RadiusRule):
    """``β_t = v·(offset + noise·sqrt(log det(V/λ) + 2·extra + 2 ln(1/δ)))`` on the **GP** sd,
    i.e. ``v·(B + R·sqrt(2(γ + extra + ln 1/δ)))`` with the realised ``γ = ½ log det(V/λ)``.

    Algorithm 8 of Hong, Li & Tewari (2023, Appendix E): ``offset = noise = extra = 1``; their WGP-UCB
    (authors' code): ``offset = 0.8``, ``noise = 0.1``, ``extra = 0``.
    """

    name = "gain"
    variance = "gp"

    def __init__(self, scale: float = 1.0, *, offset: float = 1.0, noise: float = 1.0,
                 extra: float = 1.0, delta: float = 0.01) -> None:
        self.scale = check_positive("scale", scale)
        self.offset = float(offset)
        self.noise = float(noise)
        self.extra = float(extra)
        self.delta = check_probability("delta", delta)
        if self.offset < 0 or self.noise < 0 or self.extra < 0:
            raise ValueError("offset, noise and extra must be >= 0")

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """The scalar ``β_t`` from ``model.log_det()`` (clamped at 0)."""
        inner = max(log_det_value(model), 0.0) + 2.0 * self.extra + 2.0 * math.log(1.0 / self.delta)
        return self.scale * (self.offset + self.noise * math.sqrt(inner))

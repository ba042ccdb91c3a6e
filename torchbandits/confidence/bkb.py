"""BKB's confidence width β̃_t (Calandriello et al., COLT 2019, Theorem 2 / App. D.1).

β̃_t multiplies the **ridge (1/λ-scaled)** standard deviation ``σ̃_t(x) = sqrt(var_GP(x)/λ)``:

    β̃_t = 2ξ·sqrt(α·L_t·S_t + log(1/δ)) + (1 + 1/sqrt(1−ε))·sqrt(λ)·F,

with ``α = (1+ε)/(1−ε)`` and ``S_t = Σ_{s≤t} σ̃_t²(x̃_s) = Σ_a n_a σ̃_t²(a)`` (all pulls, current
model). Rules for ``L_t``:

* ``"paper"`` — the guarded log term ``L_t = max{log(κ²t), ½(1 + log(1 + κ²t))}``: it equals the
  paper's ``log(κ²t)`` once ``κ²t ≥ 3.5`` and is always a valid bound on the log-determinant
  (our guard: the unguarded term is ≤ 0 for ``κ²t ≤ 1``, and the paper's step
  ``1 + log(1 + κ²t) ≤ 2 log(κ²t)`` needs ``κ²t ≳ 3.5``).
* ``"authors_code"`` — the authors' code: ``sqrt(λ)F + ξ·sqrt(log(t)·S_t + log(1/δ))``.
* ``"constant"`` — a user constant β.

``beta_scale`` multiplies the result (theory widths over-explore).
"""

from __future__ import annotations

import math
from typing import Literal

from ..validation import check_positive, check_probability

__all__ = ["BETA_RULES", "BKBBeta"]

BetaRule = Literal["paper", "authors_code", "constant"]
BETA_RULES: tuple[str, ...] = ("paper", "authors_code", "constant")


class BKBBeta:
    """β̃_t of BKB for the ridge sd. ``radius(sum_var, t, kappa2, lam) -> float``.

    Args:
        rule: ``"paper"`` (default), ``"authors_code"`` or ``"constant"``.
        beta: the constant for ``rule="constant"``.
        norm_bound: F ≥ ‖f‖_H.
        noise_std: ξ (sub-Gaussian noise scale).
        eps: ε ∈ (0, 1) of Theorem 1 (α = (1+ε)/(1−ε)).
        delta: δ ∈ (0, 1).
        beta_scale: multiplies the returned width.
    """

    def __init__(self, rule: BetaRule = "paper", *, beta: float = 1.0, norm_bound: float = 1.0,
                 noise_std: float = 0.1, eps: float = 0.5, delta: float = 0.1,
                 beta_scale: float = 1.0) -> None:
        if rule not in BETA_RULES:
            raise ValueError(f"beta_rule must be one of {BETA_RULES}, got {rule!r}")
        self.rule: BetaRule = rule
        self.beta = float(beta)
        if not math.isfinite(self.beta) or self.beta < 0:
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.noise_std = check_positive("noise_std", noise_std)
        self.eps = check_probability("eps", eps)
        self.delta = check_probability("delta", delta)
        self.beta_scale = check_positive("beta_scale", beta_scale)

    @property
    def alpha(self) -> float:
        """``α = (1+ε)/(1−ε)``."""
        return (1.0 + self.eps) / (1.0 - self.eps)

    @staticmethod
    def log_term(kappa2: float, t: int) -> float:
        """Guarded ``L_t = max{log(κ²t), ½(1 + log(1 + κ²t))}`` (see the module docstring)."""
        kt = kappa2 * t
        guard = 0.5 * (1.0 + math.log1p(kt))
        return max(math.log(kt), guard) if kt > 0 else guard

    def radius(self, sum_var: float, t: int, kappa2: float, lam: float) -> float:
        """β̃_t for ``S_t = sum_var`` after ``t`` pulls (κ² = max k(x,x), λ the regulariser)."""
        if self.rule == "constant":
            return self.beta * self.beta_scale
        xi, f = self.noise_std, self.norm_bound
        log_delta = math.log(1.0 / self.delta)
        s = max(float(sum_var), 0.0)
        if self.rule == "authors_code":
            lt = math.log(t) if t > 1 else 0.0
            width = math.sqrt(lam) * f + xi * math.sqrt(lt * s + log_delta)
        else:
            lt = self.log_term(kappa2, t)
            width = (2.0 * xi * math.sqrt(self.alpha * lt * s + log_delta)
                     + (1.0 + 1.0 / math.sqrt(1.0 - self.eps)) * math.sqrt(lam) * f)
        return width * self.beta_scale

    def __repr__(self) -> str:
        if self.rule == "constant":
            return f"BKBBeta(rule='constant', beta={self.beta}, scale={self.beta_scale})"
        return (f"BKBBeta(rule={self.rule!r}, F={self.norm_bound}, xi={self.noise_std}, "
                f"eps={self.eps}, delta={self.delta}, scale={self.beta_scale})")

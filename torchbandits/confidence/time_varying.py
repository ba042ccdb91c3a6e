"""Confidence widths and forgetting lengths of Zhou & Shroff, "No-Regret Algorithms for
Time-Varying Bayesian Optimization" (R-GP-UCB, their Algorithm 1, and SW-GP-UCB, Algorithm 2).

All widths here multiply the **GP** posterior sd ``σ_S(x)`` (noise variance λ), as in the
paper's Lemmas 1–2: ``UCB_t(x) = μ_S(x) + β_t σ_S(x)``.

* :class:`RestartBeta` (Lemma 1): ``β_t = B + (R/√λ)·sqrt(2 γ_{t−t0} + 2 ln(1/δ))`` —
  ``t − t0`` points in the current block;
* :class:`WindowBeta` (Lemma 2 and Theorem 2, which need ``ln(T/δ)`` where Algorithm 2 prints
  ``ln(1/δ)``): ``β_t = B + (R/√λ)·sqrt(2 γ_{min(t,w)} + 2 ln(T/δ))``;
* ``mode="igp_ucb"`` (Algorithms 1–2 as printed, the IGP-UCB form of Chowdhury & Gopalan 2017,
  whose "+1" comes from their λ = 1 + 2/T): ``β = B + R·sqrt(2(γ + 1 + ln(1/δ)))``.

γ comes from a provider of :mod:`.info_gain` (re-exported here) or is ``"realised"`` — the
information gain of the data actually held, ``½ log det(I + K_S/λ)``.

Forgetting lengths (the paper's Remark after Theorem 2, its Õ constants exposed as ``c``):
:func:`theoretical_length` (known / unknown ``P_T``), :func:`regret_bound` (an explicit form of
Theorem 1 assembled from its proof, constants ours) and :func:`tune_by_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ..validation import check_positive, check_probability
from .base import PosteriorModel, RadiusRule
from .info_gain import AnalyticGamma, ConstantGamma, GammaProvider, GreedyGamma, as_provider

__all__ = [
    "AnalyticGamma",
    "ConstantGamma",
    "GammaProvider",
    "GreedyGamma",
    "RestartBeta",
    "WindowBeta",
    "regret_bound",
    "theoretical_length",
    "tune_by_bound",
    "tv_beta",
    "xi_factor",
]

BetaMode = Literal["lemma", "igp_ucb"]


# ---------------------------------------------------------------------------------- β formulas
def tv_beta(gamma: float, norm_bound: float, noise_std: float, lam: float, log_arg: float,
            mode: BetaMode = "lemma", delta: float | None = None) -> float:
    """The two β forms of Zhou & Shroff as plain numbers (Lemmas 1–2 vs Algorithms 1–2).

    * ``"lemma"``: ``B + (R/√λ)·sqrt(2γ + 2 ln(log_arg))`` with ``log_arg = 1/δ`` (Lemma 1) or
      ``T/δ`` (Lemma 2);
    * ``"igp_ucb"``: ``B + R·sqrt(2(γ + 1 + ln(1/δ)))`` (Algorithms 1–2 as printed; ``delta``).
    """
    if mode == "lemma":
        return norm_bound + noise_std / math.sqrt(lam) * math.sqrt(2.0 * gamma + 2.0 * math.log(log_arg))
    if mode == "igp_ucb":
        if delta is None:
            raise ValueError("mode='igp_ucb' needs delta")
        return norm_bound + noise_std * math.sqrt(2.0 * (gamma + 1.0 + math.log(1.0 / delta)))
    raise ValueError(f"mode must be 'lemma' or 'igp_ucb', got {mode!r}")


def xi_factor(length: int, lam: float, gamma: float) -> float:
    """Drift-bias factor of Lemma 1 (Zhou & Shroff): ``ξ_H = (1/λ)·sqrt(2H(1+λ)γ_H)``; the same
    with ``w`` for SW-GP-UCB (Theorem 2's statement, which has the factor that Lemma 2 omits)."""
    return math.sqrt(2.0 * length * (1.0 + lam) * gamma) / lam


class _TVBeta(RadiusRule):
    """Shared machinery of :class:`RestartBeta` and :class:`WindowBeta` (GP sd, regulariser λ)."""

    variance = "gp"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 delta: float = 0.01, mode: BetaMode = "lemma", gamma_index: str = "algorithm",
                 beta_scale: float = 1.0) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.noise_std = float(noise_std)
        if not math.isfinite(self.noise_std) or self.noise_std < 0:
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
        self.lam = check_positive("lam", lam)
        self.reg = self.lam  # the posterior is always taken at the λ of the width and of γ
        self.delta = check_probability("delta", delta)
        if mode not in ("lemma", "igp_ucb"):
            raise ValueError(f"mode must be 'lemma' or 'igp_ucb', got {mode!r}")
        self.mode = mode
        if gamma_index not in ("algorithm", "max"):
            raise ValueError(f"gamma_index must be 'algorithm' or 'max', got {gamma_index!r}")
        self.gamma_index = gamma_index
        self.beta_scale = check_positive("beta_scale", beta_scale)
        self.gamma = as_provider(gamma)
        g_lam = getattr(self.gamma, "lam", None)
        if g_lam is not None and abs(g_lam - self.lam) > 1e-12 * max(1.0, self.lam):
            raise ValueError(f"gamma was computed with λ={g_lam} but lam={self.lam} (Zhou & Shroff, "
                             "Lemmas 1–2: the same λ must serve the posterior and γ)")

    def _gamma_value(self, model: PosteriorModel, index: int) -> float:
        if self.gamma == "realised":
            return 0.5 * float(model.log_det(reg=self.lam))
        return float(self.gamma(int(index)))  # type: ignore[operator]

    def _log_arg(self) -> float:
        raise NotImplementedError

    def _index(self, model: PosteriorModel, t: int) -> int:
        raise NotImplementedError

    def beta_at(self, model: PosteriorModel, t: int) -> float:
        """``β_t`` for round ``t`` (1-based) given the model that scores that round."""
        g = self._gamma_value(model, self._index(model, t))
        beta = tv_beta(g, self.norm_bound, self.noise_std, self.lam, self._log_arg(), self.mode,
                       self._delta_used())
        return self.beta_scale * beta

    def _delta_used(self) -> float:
        return self.delta

    def radius(self, model: PosteriorModel, n_candidates: int, t: int) -> Tensor:
        return torch.tensor(self.beta_at(model, t), dtype=torch.float64)


class RestartBeta(_TVBeta):
    """R-GP-UCB width (Zhou & Shroff, Lemma 1), multiplying the **GP** sd at λ:

    ``β_t = B + (R/√λ)·sqrt(2 γ_{t−t0} + 2 ln(1/δ'))``

    where ``t − t0`` is the number of points in the current block (``model.n``), or ``H`` with
    ``gamma_index="max"`` (Theorem 1's γ_H); ``δ' = δ`` (the paper's literal δ, Lemma 1 holds per
    block) or ``δ/⌈T/H⌉`` with ``delta_split="per_block"`` (a union bound over the blocks).
    ``mode="igp_ucb"`` is Algorithm 1's printed ``B + R·sqrt(2(γ + 1 + ln(1/δ')))``. With
    ``gamma="realised"`` the block's own ``½ log det(I + K_S/λ)`` replaces γ.
    """

    name = "restart_beta"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 delta: float = 0.01, period: int | None = None, horizon: int | None = None,
                 mode: BetaMode = "lemma", gamma_index: str = "algorithm",
                 delta_split: str = "none", beta_scale: float = 1.0) -> None:
        super().__init__(norm_bound, noise_std, lam, gamma, delta=delta, mode=mode,
                         gamma_index=gamma_index, beta_scale=beta_scale)
        self.period = None if period is None else int(period)
        self.horizon = None if horizon is None else int(horizon)
        if self.period is not None and self.period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        if delta_split not in ("none", "per_block"):
            raise ValueError(f"delta_split must be 'none' or 'per_block', got {delta_split!r}")
        self.delta_split = delta_split
        if delta_split == "per_block" and (self.period is None or self.horizon is None):
            raise ValueError("delta_split='per_block' needs period and horizon")
        if gamma_index == "max" and self.period is None:
            raise ValueError("gamma_index='max' needs period (γ_H)")

    def _delta_used(self) -> float:
        if self.delta_split == "per_block":
            return self.delta / math.ceil(self.horizon / self.period)  # type: ignore[operator]
        return self.delta

    def _log_arg(self) -> float:
        return 1.0 / self._delta_used()

    def _index(self, model: PosteriorModel, t: int) -> int:
        return int(self.period) if self.gamma_index == "max" else int(model.n)


class WindowBeta(_TVBeta):
    """SW-GP-UCB width (Zhou & Shroff, Lemma 2 and Theorem 2), multiplying the **GP** sd at λ:

    ``β_t = B + (R/√λ)·sqrt(2 γ_{min(t, w)} + 2 ln(T/δ))``

    (the paper's index ``min(t, w)``, slightly conservative as the window holds
    ``min(t−1, w)`` points; ``gamma_index="max"`` uses ``γ_w`` throughout). ``mode="igp_ucb"``
    is Algorithm 2 as printed, ``B + R·sqrt(2(γ + 1 + ln(1/δ)))``.
    """

    name = "window_beta"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 window: int, horizon: int, delta: float = 0.01, mode: BetaMode = "lemma",
                 gamma_index: str = "algorithm", beta_scale: float = 1.0) -> None:
        super().__init__(norm_bound, noise_std, lam, gamma, delta=delta, mode=mode,
                         gamma_index=gamma_index, beta_scale=beta_scale)
        self.window = int(window)
        self.horizon = int(horizon)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")

    def _log_arg(self) -> float:
        return self.horizon / self.delta

    def _index(self, model: PosteriorModel, t: int) -> int:
        return self.window if self.gamma_index == "max" else min(int(t), self.window)


# ---------------------------------------------------------------------------------- tuning
def theoretical_length(horizon: int, gamma_T: float, budget: float | None = None,
                       c: float = 1.0) -> int:
    """Restart period / window of the Remark after Theorem 2 (Zhou & Shroff), clipped to ``[1, T]``:

    * known ``P_T > 0``: ``c·γ_T^{1/4}·(T/P_T)^{1/2}``;
    * ``P_T = 0``: ``T`` (no forgetting);
    * unknown ``P_T`` (``budget=None``): ``c·γ_T^{1/4}·T^{1/2}``.
    """
    T = int(horizon)
    if T < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if gamma_T < 0 or not math.isfinite(gamma_T):
        raise ValueError(f"gamma_T must be a finite number >= 0, got {gamma_T!r}")
    c = check_positive("c", c)
    if budget is None:
        value = c * gamma_T**0.25 * math.sqrt(T)
    else:
        if budget < 0 or not math.isfinite(budget):
            raise ValueError(f"budget must be a finite number >= 0 or None, got {budget!r}")
        if budget == 0:
            return T
        value = c * gamma_T**0.25 * math.sqrt(T / budget)
    return int(min(max(round(value), 1), T))


def regret_bound(length: int | Tensor, horizon: int, budget: float, gamma: float | Tensor,
                 beta: float | Tensor, lam: float) -> Tensor:
    """An explicit form of Theorems 1–2 (Zhou & Shroff), assembled from the proof of Theorem 1
    (Lemma 1 summed over blocks, ``Σσ² ≤ 2(1+λ)γ`` for ``k ≤ 1``; constants ours, not the paper's):

    ``R(T) ≤ (2/λ)·sqrt(2(1+λ)γ_H)·H^{3/2}·P_T + 2·β·⌈T/H⌉·sqrt(2(1+λ)·H·γ_H)``
    """
    H = torch.as_tensor(length, dtype=torch.float64)
    g = torch.as_tensor(gamma, dtype=torch.float64)
    b = torch.as_tensor(beta, dtype=torch.float64)
    drift = (2.0 / lam) * torch.sqrt(2.0 * (1.0 + lam) * g) * H**1.5 * budget
    learn = 2.0 * b * torch.ceil(horizon / H) * torch.sqrt(2.0 * (1.0 + lam) * H * g)
    return drift + learn


def tune_by_bound(horizon: int, budget: float, gamma: GammaProvider, norm_bound: float,
                  noise_std: float, lam: float, delta: float = 0.01,
                  kind: str = "restart") -> int:
    """``tune="bound"`` (ours, not in the paper): the integer ``H ∈ [1, T]`` minimising
    :func:`regret_bound`, with ``γ_H`` from ``gamma`` and ``β(δ)`` of Theorem 1 (``kind="restart"``,
    ``ln(1/δ)``) or Theorem 2 (``kind="window"``, ``ln(T/δ)``).

    The drift term grows like ``H^{3/2}·sqrt(H γ_H)``, so at moderate T the minimiser can be tiny:
    on the rotating-function benchmark of :mod:`torchbandits.presets.zhou2021` (T = 2000, SE
    ℓ = 0.1, λ = 1, greedy γ) it is ``H = 1`` for every ``P_T ≥ 1``, where the bound already
    exceeds the trivial ``2BT`` — prefer :func:`theoretical_length` there."""
    T = int(horizon)
    if kind not in ("restart", "window"):
        raise ValueError(f"kind must be 'restart' or 'window', got {kind!r}")
    g = gamma.values(T)[1:]
    log_arg = (1.0 / delta) if kind == "restart" else (T / delta)
    beta = norm_bound + noise_std / math.sqrt(lam) * torch.sqrt(2.0 * g + 2.0 * math.log(log_arg))
    H = torch.arange(1, T + 1, dtype=torch.float64)
    bound = regret_bound(H, T, budget, g, beta, lam)
    return int(torch.argmin(bound)) + 1

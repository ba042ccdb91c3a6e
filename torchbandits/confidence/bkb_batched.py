"""BKB's width β̃_t for ``R`` runs at once (Calandriello et al., COLT 2019, Theorem 2 / App. D.1;
the rules of :class:`~torchbandits.confidence.bkb.BKBBeta`, per run)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .bkb import BKBBeta

__all__ = ["batched_bkb_radius", "radius_offsets", "radius_terms"]


def batched_bkb_radius(rule: BKBBeta, sum_var: Tensor, t: int, kappa2: Tensor | float,
                       lam: Tensor, beta: Tensor | None = None) -> Tensor:
    """β̃_t ``[R]`` of :meth:`~torchbandits.confidence.bkb.BKBBeta.radius` for every run:
    ``S_t = sum_var`` ``[R]``, ``κ²`` a float or ``[R]``, ``λ`` ``[R]``; ``beta`` ``[R]`` replaces
    the constant of ``rule="constant"`` run by run."""
    if rule.rule == "constant":
        base = sum_var.new_full(sum_var.shape, rule.beta) if beta is None else beta.to(sum_var)
        return base * rule.beta_scale
    xi, f, s = rule.noise_std, rule.norm_bound, sum_var.clamp_min(0.0)
    log_delta = math.log(1.0 / rule.delta)
    if rule.rule == "authors_code":
        lt = math.log(t) if t > 1 else 0.0
        width = torch.sqrt(lam) * f + xi * torch.sqrt(lt * s + log_delta)
    else:
        if isinstance(kappa2, Tensor):
            kt = kappa2 * t
            guard = 0.5 * (1.0 + torch.log1p(kt))
            lt = torch.where(kt > 0, torch.maximum(torch.log(kt.clamp_min(1e-300)), guard), guard)
        else:
            lt = rule.log_term(kappa2, t)  # type: ignore[assignment]
        width = (2.0 * xi * torch.sqrt(rule.alpha * lt * s + log_delta)
                 + (1.0 + 1.0 / math.sqrt(1.0 - rule.eps)) * torch.sqrt(lam) * f)
    return width * rule.beta_scale


def radius_terms(rule: BKBBeta, t: int, kappa2: float) -> tuple[float, float, float, float]:
    """The constants of :meth:`BKBBeta.radius <torchbandits.confidence.bkb.BKBBeta.radius>` at
    time ``t`` (a rule other than ``"constant"``), folded so that ``radius(S, t, κ², λ_r) ==
    (c_r + k1·sqrt(k2·max(S, 0) + log(1/δ)))·scale`` **bit for bit** with ``c_r`` of
    :func:`radius_offsets` (the same roundings in the same order; IEEE addition commutes):
    ``(k1, k2, log(1/δ), scale)``. Theorem 2: ``k1 = 2ξ``, ``k2 = α L_t``; the authors' code:
    ``k1 = ξ``, ``k2 = log t`` (0 for t ≤ 1)."""
    if rule.rule == "constant":
        raise ValueError("rule: the constant rule has no folded terms (its width is given)")
    log_delta = math.log(1.0 / rule.delta)
    if rule.rule == "authors_code":
        return rule.noise_std, (math.log(t) if t > 1 else 0.0), log_delta, rule.beta_scale
    return 2.0 * rule.noise_std, rule.alpha * rule.log_term(kappa2, t), log_delta, rule.beta_scale


def radius_offsets(rule: BKBBeta, lam: list[float]) -> list[float]:
    """The λ term ``c_r`` of :func:`radius_terms` for runs of regularisers ``lam``: Theorem 2,
    ``(1 + 1/sqrt(1−ε))·sqrt(λ_r)·F``; the authors' code, ``sqrt(λ_r)·F`` (the rule's float
    arithmetic)."""
    f = rule.norm_bound
    if rule.rule == "authors_code":
        return [math.sqrt(v) * f for v in lam]
    front = 1.0 + 1.0 / math.sqrt(1.0 - rule.eps)
    return [front * math.sqrt(v) * f for v in lam]

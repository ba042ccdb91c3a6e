"""BKB's width β̃_t for ``R`` runs at once (Calandriello et al., COLT 2019, Theorem 2 / App. D.1;
the rules of :class:`~torchbandits.confidence.bkb.BKBBeta`, per run)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .bkb import BKBBeta

__all__ = ["batched_bkb_radius"]


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

"""OP, the optimisation problem of Hong, Li & Tewari (AISTATS 2023, Algorithm 1).

``solve_op`` computes ``P* = argmin_{p ∈ Δ_N} Δ̂ᵀp − (2/β) log det S(p, λ)`` with
``S(p, λ) = Φᵀ diag(p) Φ + λI`` (the log-det program of :mod:`.logdet`), the near-optimal set
``A = {x : Δ̂(x) ≤ threshold}`` (default ``2αγ/β``), and ``Q = (1 − q)P* + q·π(A)`` (paper:
``q = 1/2``; the authors' released code ``q = 0.2``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from .kkt import Certificate
from .logdet import solve_logdet_program
from .optimal_design import optimal_design

__all__ = ["OPResult", "solve_op"]


@dataclass
class OPResult:
    """Output of Algorithm 1: ``Q`` and its parts, with certificates and timing."""

    q: Tensor
    p_star: Tensor
    design_a: Tensor          # π(A) as a vector over all N arms (zero off A)
    a_mask: Tensor
    threshold: float
    certificate: Certificate
    design_certificate: Certificate | None
    seconds: float
    newton_steps: int


def solve_op(
    phi: Tensor,
    delta_hat: Tensor,
    *,
    alpha: float,
    beta: float,
    lam: float,
    gamma: float,
    design_mix: float = 0.5,
    threshold: float | None = None,
    solver: str = "newton",
    warm_start: Tensor | None = None,
    design_warm_start: Tensor | None = None,
    subdesign: str = "rows",
    kkt_tol: float = 1e-9,
) -> OPResult:
    """Algorithm 1 (OP) of Hong, Li & Tewari (AISTATS 2023).

    Args:
        phi: ``[N, r]`` factor of K.  delta_hat: empirical gaps (≥ 0, min 0).
        alpha, beta, gamma: the paper's α, β and γ (as used by the caller's preset).
        lam: ``σ/T``.  design_mix: weight ``q`` of ``π(A)`` in ``Q``.
        threshold: ``A``-threshold (default ``2αγ/β``).
        subdesign: ``"rows"`` (``Φ[A, :]``, correct) or ``"aistats2023_code"`` (the authors'
            ``Φ[A][:, A]`` — not an equivalent feature map of ``Φ[A, :]``; compatibility only).
    """
    if delta_hat.shape != (phi.shape[0],):
        raise ValueError(f"delta_hat must have shape [{phi.shape[0]}], got {tuple(delta_hat.shape)}")
    if not bool(torch.isfinite(delta_hat).all()):
        raise ValueError("delta_hat must be finite")
    if float(delta_hat.min()) < -1e-12:
        raise ValueError("delta_hat must be >= 0 (empirical gaps)")
    for name, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v}")
    if not 0.0 <= design_mix <= 1.0:
        raise ValueError(f"design_mix must lie in [0, 1], got {design_mix}")
    t0 = time.perf_counter()
    d = torch.clamp(delta_hat, min=0.0)
    sol = solve_logdet_program(phi, d, 2.0 / beta, lam, solver=solver, warm_start=warm_start,
                               kkt_tol=kkt_tol)
    thr = 2.0 * alpha * gamma / beta if threshold is None else float(threshold)
    a_mask = d <= thr
    a_mask[torch.argmin(d)] = True
    design = optimal_design(phi, lam, subset=a_mask, solver=solver, warm_start=design_warm_start,
                            kkt_tol=kkt_tol, subdesign=subdesign)
    q = (1.0 - design_mix) * sol.p + design_mix * design.p
    return OPResult(q=q / q.sum(), p_star=sol.p, design_a=design.p, a_mask=a_mask, threshold=thr,
                    certificate=sol.certificate, design_certificate=design.certificate,
                    seconds=time.perf_counter() - t0,
                    newton_steps=sol.newton_steps + design.newton_steps)

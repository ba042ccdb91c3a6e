"""Kernel optimal design ``π_φ(A)`` (Hong, Li & Tewari, AISTATS 2023, Def. 4.2) and the information
gain ``γ_{φ,T}`` (§2.1, App. C).

``π(A) = argmax_{P on A} log det(Φ_Aᵀ diag(P) Φ_A + λI)`` with ``λ = σ/T`` — OP with ``Δ̂ ≡ 0``
restricted to A, solved in ``|A|`` variables on the rows ``Φ[A, :]`` (any equivalent factor;
never a column subset of a Cholesky factor, which is not an equivalent feature map). Because
``S(TP/σ, 1) = (T/σ)·S(P, σ/T)``, the maximiser of the information gain is the design of the whole arm set, so

``γ_T = log det(I_N + (T/σ) D_π^{1/2} K D_π^{1/2}) = log det(I_r + Φᵀ D_π Φ / λ)``

(paper's convention, no factor 1/2; ``convention="half"`` returns ``γ_T/2`` as the authors' code
does).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from .kkt import Certificate, design_matrix
from .logdet import solve_logdet_program

__all__ = ["DesignResult", "information_gain", "information_gain_at", "optimal_design"]


@dataclass
class DesignResult:
    p: Tensor                 # [N] distribution supported on the subset
    subset: Tensor            # [N] bool
    certificate: Certificate  # of the restricted program (in |A| variables)
    seconds: float
    newton_steps: int


def optimal_design(
    phi: Tensor,
    lam: float,
    *,
    subset: Tensor | None = None,
    solver: str = "newton",
    warm_start: Tensor | None = None,
    kkt_tol: float = 1e-9,
    subdesign: str = "rows",
) -> DesignResult:
    """``π_φ(A)`` as an ``[N]`` vector (zero off ``A``); ``subset`` is a bool mask (default: all).

    ``warm_start`` is an ``[N]`` vector (its restriction to ``A`` is used).
    """
    n = phi.shape[0]
    t0 = time.perf_counter()
    mask = torch.ones(n, dtype=torch.bool, device=phi.device) if subset is None else subset.bool()
    if mask.shape != (n,):
        raise ValueError(f"subset must be a bool mask of shape [{n}], got {tuple(mask.shape)}")
    idx = torch.nonzero(mask).flatten()
    if idx.numel() == 0:
        raise ValueError("subset is empty: the design needs at least one arm")
    if subdesign == "rows":
        feats = phi[idx]
    elif subdesign == "aistats2023_code":
        feats = phi[idx][:, idx]
    else:
        raise ValueError(f"subdesign must be 'rows' or 'aistats2023_code', got {subdesign!r}")
    ws = None
    if warm_start is not None:
        w = torch.clamp(warm_start.to(phi)[idx], min=0.0)
        ws = w / w.sum() if float(w.sum()) > 0 else None
    zero = torch.zeros(idx.numel(), dtype=phi.dtype, device=phi.device)
    sol = solve_logdet_program(feats, zero, 1.0, lam, solver=solver, warm_start=ws, kkt_tol=kkt_tol)
    p = torch.zeros(n, dtype=phi.dtype, device=phi.device)
    p[idx] = sol.p
    return DesignResult(p, mask, sol.certificate, time.perf_counter() - t0, sol.newton_steps)


def information_gain_at(phi: Tensor, p: Tensor, horizon: int, sigma: float) -> float:
    """``log det(I + (T/σ)·D_p^{1/2} K D_p^{1/2})`` for the distribution ``p`` (paper's form)."""
    lam = sigma / horizon
    r = phi.shape[1]
    s = design_matrix(phi.to(torch.float64), p.to(torch.float64), lam)   # float64: λ = σ/T
    chol = torch.linalg.cholesky(s)
    return float(2.0 * torch.log(torch.diagonal(chol)).sum() - r * math.log(lam))


def information_gain(
    phi: Tensor,
    horizon: int,
    sigma: float,
    *,
    design: Tensor | None = None,
    convention: str = "paper",
    solver: str = "newton",
) -> float:
    """``γ_{φ,T}`` (Hong, Li & Tewari 2023, §2.1) from the optimal design of the whole arm set
    (computed unless ``design`` is given). ``convention="half"`` divides by 2 (authors' code)."""
    if convention not in ("paper", "half"):
        raise ValueError(f"convention must be 'paper' or 'half', got {convention!r}")
    if design is None:
        design = optimal_design(phi, sigma / horizon, solver=solver).p
    g = information_gain_at(phi, design, horizon, sigma)
    return g / 2.0 if convention == "half" else g

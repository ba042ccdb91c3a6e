"""Kernel-form quantities of Hong, Li & Tewari (AISTATS 2023, §4.1, App. I) and the optimality
certificates of the log-det programs (Algorithm 1, Def. 4.2, Lemma 4.4).

All programs solved in :mod:`torchbandits.design` have the form

``min_{p ∈ Δ_N}  J(p) = cᵀp − w · log det(Φᵀ diag(p) Φ + λ I_r)``

(OP: ``c = Δ̂``, ``w = 2/β``; the optimal design: ``c = 0``, ``w = 1``). Its gradient is
``g_x = c_x − w‖φ(x)‖²_{S(p)⁻¹}`` and the KKT conditions on the simplex read ``g_x ≥ ḡ = Σ p_x g_x``
for every x with equality on the support. The **Frank–Wolfe gap** ``ḡ − min_x g_x ≥ 0`` is zero
exactly at an optimum and bounds the suboptimality ``J(p) − J* ≤ ḡ − min g`` (convexity), so it
is the certificate every solve is checked with.

Every function here computes in float64 whatever the dtype of its inputs (the log-det programs are
ill-conditioned at ``λ = σ/T``: in float32 ``S(p, λ)`` loses its small eigenvalues) and returns
tensors in the dtype of ``phi`` (cast in, cast out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Certificate",
    "design_matrix",
    "ips_matrix",
    "kkt_certificate",
    "lemma44_check",
    "leverages",
    "logdet_design",
]


def design_matrix(phi: Tensor, p: Tensor, lam: float) -> Tensor:
    """``S(p, λ) = Φᵀ diag(p) Φ + λ I_r`` (Hong, Li & Tewari 2023, §4.1)."""
    r = phi.shape[1]
    return phi.T @ (p.unsqueeze(1) * phi) + lam * torch.eye(r, dtype=phi.dtype, device=phi.device)


def _f64(t: Tensor) -> Tensor:
    return t if t.dtype == torch.float64 else t.to(torch.float64)


def _whitened(phi: Tensor, p: Tensor, lam: float) -> tuple[Tensor, Tensor]:
    """``(L, Z)`` with ``L = chol(S(p, λ))`` and ``Z = L⁻¹ Φᵀ`` (``[r, N]``), in float64."""
    phi, p = _f64(phi), _f64(p)
    chol = torch.linalg.cholesky(design_matrix(phi, p, lam))
    z = torch.linalg.solve_triangular(chol, phi.T, upper=False)
    return chol, z


def ips_matrix(phi: Tensor, p: Tensor, lam: float) -> Tensor:
    """``M(p, λ) = Φ S(p, λ)⁻¹ Φᵀ = K (D_p K + λ I)⁻¹`` (``[N, N]``), the IPS matrix of §2.4:
    ``R̂_t(x) = M[x, x_t] · y_t``. Its diagonal holds the leverages ``‖φ(x)‖²_{S⁻¹}``."""
    _, z = _whitened(phi, p, lam)
    return (z.T @ z).to(phi.dtype)


def leverages(phi: Tensor, p: Tensor, lam: float) -> Tensor:
    """``‖φ(x)‖²_{S(p, λ)⁻¹}`` for every row of Φ (``[N]``)."""
    _, z = _whitened(phi, p, lam)
    return (z * z).sum(0).to(phi.dtype)


def logdet_design(phi: Tensor, p: Tensor, lam: float) -> Tensor:
    """``log det S(p, λ)`` (``r × r``; for the Cholesky factor ``r = N``)."""
    chol = torch.linalg.cholesky(design_matrix(_f64(phi), _f64(p), lam))
    return (2.0 * torch.log(torch.diagonal(chol)).sum()).to(phi.dtype)


@dataclass
class Certificate:
    """KKT certificate of ``min cᵀp − w log det S(p)`` on the simplex.

    ``gap = Σ p g − min g`` (Frank–Wolfe / duality gap, ≥ 0, 0 at the optimum), ``objective = J(p)``,
    ``grad = g`` and the leverages. ``ok(tol)`` is ``gap ≤ tol`` and ``p`` a distribution.
    """

    gap: float
    objective: float
    grad: Tensor
    leverages: Tensor
    mass_error: float
    min_p: float

    def ok(self, tol: float) -> bool:
        """True when the duality gap is ≤ ``tol``, the weights sum to one (1e-9), none negative."""
        return self.gap <= tol and self.mass_error <= 1e-9 and self.min_p >= 0.0


def kkt_certificate(phi: Tensor, p: Tensor, c: Tensor, weight: float, lam: float) -> Certificate:
    """Evaluate the certificate of :class:`Certificate` at ``p``."""
    chol, z = _whitened(phi, p, lam)
    p, c = _f64(p), _f64(c)
    lev = (z * z).sum(0)
    g = c - weight * lev
    logdet = 2.0 * torch.log(torch.diagonal(chol)).sum()
    gap = float((p * g).sum() - g.min())
    obj = float(c @ p - weight * logdet)
    return Certificate(gap=max(gap, 0.0), objective=obj, grad=g.to(phi.dtype),
                       leverages=lev.to(phi.dtype), mass_error=abs(float(p.sum()) - 1.0),
                       min_p=float(p.min()))


def lemma44_check(phi: Tensor, q: Tensor, delta_hat: Tensor, alpha: float, beta: float,
                  gamma: float, lam: float) -> dict[str, float]:
    """Slack of Lemma 4.4 (i)–(iii) for the OP output ``Q`` (Algorithm 1); each value must be ≥ 0:

    (i) ``(1 + α)γ/β − Σ Q Δ̂``; (ii) ``min_x [βΔ̂(x) + 2γ − ‖φ(x)‖²_{S(Q)⁻¹}]``;
    (iii) ``min_x [β²Δ̂(x)²/(2αγ) + 2γ − ‖φ(x)‖²_{S(Q)⁻¹}]``.
    """
    lev = leverages(phi, q, lam)
    return {
        "i": float((1.0 + alpha) * gamma / beta - q @ delta_hat),
        "ii": float((beta * delta_hat + 2.0 * gamma - lev).min()),
        "iii": float((beta**2 * delta_hat**2 / (2.0 * alpha * gamma) + 2.0 * gamma - lev).min()),
    }

"""CMM dual for large t: a periodically refreshed eigenbasis plus an exact Schur-complement border.

The 1-D dual of Eq. (12) needs ``μ_α(x)``, ``ρ²_α(x)`` and ``yᵀ(K_t+αI)⁻¹y`` at many α per query.
One ``eigh`` of ``K_t`` makes each α O(t), but costs O(t³) every round. Here the eigenbasis
``K_s = QΛQᵀ`` of the first ``s`` points is kept for up to ``refresh_every`` rounds and the
``m = t − s`` newer points are a border, handled exactly by the Schur complement (no
approximation): with ``D = Λ + αI``, ``B̃ = Qᵀ K(x_{1:s}, x_new)``, ``C = K(x_new, x_new)``,
``S(α) = C + αI − B̃ᵀ D⁻¹ B̃`` (m × m, SPD, eigenvalues ≥ α) and, for ``a = [a₁; a₂]``,
``b = [b₁; b₂]`` (old / new coordinates, ``ã₁ = Qᵀa₁``)::

    aᵀ(K_t + αI)⁻¹b = ã₁ᵀ D⁻¹ b̃₁ + (a₂ − B̃ᵀD⁻¹ã₁)ᵀ S(α)⁻¹ (b₂ − B̃ᵀD⁻¹b̃₁).

α-derivatives for the Newton search. With ``M = (K_t+αI)⁻¹``, ``dM/dα = −M²``, so
``d/dα aᵀMb = −(Ma)ᵀ(Mb)`` and ``d²/dα² aᵀMb = 2aᵀM³b = 2(Ma)ᵀM(Mb)``. The block solve gives
``Ma`` in the same coordinates: ``z = S⁻¹(a₂ − B̃ᵀD⁻¹ã₁)`` (new block) and
``x₁ = D⁻¹(ã₁ − B̃z)`` (old block, eigen-coordinates; ``Q`` is orthogonal, so inner products
are kept), hence ``(Ma)ᵀ(Mb) = x₁(a)ᵀx₁(b) + z(a)ᵀz(b)``; applying the same solve to
``[x₁; z]`` (the Schur identity above with ``ã₁ → x₁``, ``a₂ → z``, the Cholesky factor of
``S(α)`` reused) gives ``(Ma)ᵀM(Mb)``. For ``a, b ∈ {k_t(x), y}`` that is the three quadratic
forms and their first and second α-derivatives, from two ``m × 2`` triangular solve pairs.

The minimum over ``log α`` is found by the same search as with a fresh eigenbasis
(:func:`~torchbandits.confidence.alpha_search.min_over_alpha`): the shared log-grid is batched
over grid points, each Newton step is one batched per-query evaluation (O(A·s·m²)). Cost per
round O(s²A + G·s·m·A + steps·A·s·m²) plus ``eigh`` once per ``refresh_every`` rounds (a
speed-up of ours, not in Flynn & Reeb 2024, whose dual is their Thm. 4.5 / Eq. 12).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels import kernel_matrix
from .alpha_search import SIDES, dual_objective, dual_slopes, log_alpha_grid, min_over_alpha, split_sides

__all__ = ["StaleSpectrum", "border_dual_bounds", "stale_spectrum"]

@dataclass
class StaleSpectrum:
    """Eigenbasis of the first ``s`` points and the border block for the newer ones."""

    x: Tensor  # [s, d]
    y: Tensor  # [s]
    evals: Tensor  # [s]
    evecs: Tensor  # [s, s]
    ytil: Tensor  # [s] = Qᵀ y_{1:s}
    bt: Tensor  # [s, m_cached] = Qᵀ K(x_{1:s}, x_{s+1:s+m_cached})

    @property
    def s(self) -> int:
        """Number of points s in the stale eigenbasis."""
        return self.x.shape[0]


def stale_spectrum(kernel, x: Tensor, y: Tensor, cache: StaleSpectrum | None, refresh_every: int
                   ) -> StaleSpectrum:
    """Reuse ``cache`` when its points are a prefix of ``x`` (same ``y``) and at most
    ``refresh_every`` points are newer; otherwise ``eigh`` of ``K(x, x)`` (O(t³))."""
    n = x.shape[0]
    if cache is not None and cache.s <= n and n - cache.s <= refresh_every \
            and torch.equal(cache.x, x[: cache.s]) and torch.equal(cache.y, y[: cache.s]):
        m_have = cache.bt.shape[1]
        if m_have > n - cache.s:  # the data shrank back inside the border: drop columns
            cache.bt = cache.bt[:, : n - cache.s]
        elif m_have < n - cache.s:  # new border columns, O(s²) each
            k_new = kernel_matrix(kernel, cache.x, x[cache.s + m_have:])
            cache.bt = torch.cat([cache.bt, cache.evecs.mT @ k_new], dim=1)
        return cache
    gram = kernel_matrix(kernel, x, x)
    evals, evecs = torch.linalg.eigh(gram)
    evals = torch.clamp(evals, min=0.0)
    return StaleSpectrum(x.clone(), y.clone(), evals, evecs, evecs.mT @ y, x.new_zeros(n, 0))


def border_dual_bounds(
    spec: StaleSpectrum,
    kernel,
    x: Tensor,
    y: Tensor,
    cand: Tensor,
    kdiag: Tensor,
    r2: Tensor,
    norm_bound: float,
    alpha0: float,
    *,
    which: str = "both",
    grid_decades: float = 6.0,
    grid_per_decade: int = 4,
    steps: int = 3,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Exact CMM bounds (Eq. 12) with a border of ``m = len(x) − spec.s ≥ 1`` points.

    Same contract and search as :func:`~torchbandits.confidence.cmm_dual.dual_bounds`:
    ``cand`` ``[A, d]``, ``kdiag`` ``[A]``; returns ``(ucb, lcb, log_alpha_ucb)``, ``[A]`` each.
    """
    s = spec.s
    lam, ytil, q_mat, bt = spec.evals, spec.ytil, spec.evecs, spec.bt
    x_new, y2 = x[s:], y[s:]
    m = x_new.shape[0]
    c_new = kernel_matrix(kernel, x_new, x_new)
    signs = SIDES[which]
    n_a = cand.shape[0]
    ns = len(signs)
    sgn = torch.cat([torch.full((n_a,), sg, dtype=cand.dtype, device=cand.device) for sg in signs])
    p1 = (q_mat.mT @ kernel_matrix(kernel, spec.x, cand)).repeat(1, ns)  # [s, Q]
    k2 = kernel_matrix(kernel, x_new, cand).repeat(1, ns)  # [m, Q]
    kd = kdiag.repeat(ns)
    p1y = p1 * ytil[:, None]
    p1sq = p1 * p1
    y2til = ytil * ytil
    eye = torch.eye(m, dtype=cand.dtype, device=cand.device)
    outer = (bt[:, :, None] * bt[:, None, :]).reshape(s, m * m)  # rows b_i b_iᵀ, [s, m²]

    # ---- shared grid: batched over grid points
    grid = log_alpha_grid(alpha0, grid_decades, grid_per_decade, dtype=cand.dtype, device=cand.device)
    ag = torch.exp(grid)
    w = torch.reciprocal(lam[None, :] + ag[:, None])  # [G, s]
    mg = bt.mT[None] * w[:, None, :]  # [G, m, s]
    r = k2[None] - mg @ p1  # [G, m, Q]
    ry = y2[None] - mg @ ytil  # [G, m]
    sch = c_new[None] + ag[:, None, None] * eye - (w @ outer).reshape(-1, m, m)  # S(α), [G, m, m]
    z = torch.cholesky_solve(torch.cat([r, ry[..., None]], dim=-1), torch.linalg.cholesky(sch))
    b = w @ p1sq + (r * z[..., :-1]).sum(1)  # kᵀ(K+αI)⁻¹k, [G, Q]
    mu = w @ p1y + (ry[..., None] * z[..., :-1]).sum(1)  # μ_α, [G, Q]
    q = w @ y2til + (ry * z[..., -1]).sum(1)  # yᵀ(K+αI)⁻¹y, [G]
    h_grid = dual_objective(sgn * mu, b, q[:, None], ag[:, None], r2, norm_bound, kd)  # [G, Q]

    p1y_t, p1sq_t = p1y.mT.contiguous(), p1sq.mT.contiguous()  # [Q, s]

    def h_at(sv: Tensor) -> Tensor:  # one log α per query, [Q] -> [Q]; every product one GEMM
        a = torch.exp(sv)
        wq = torch.reciprocal(lam[None, :] + a[:, None])  # [Q, s]
        rq = k2.mT - (wq * p1.mT) @ bt  # [Q, m]
        ryq = y2[None] - (wq * ytil) @ bt  # [Q, m]
        schq = c_new[None] + a[:, None, None] * eye - (wq @ outer).reshape(-1, m, m)  # [Q, m, m]
        zq = torch.cholesky_solve(torch.stack([rq, ryq], dim=-1), torch.linalg.cholesky(schq))
        bq = (wq * p1sq_t).sum(1) + (rq * zq[..., 0]).sum(1)
        muq = (wq * p1y_t).sum(1) + (ryq * zq[..., 0]).sum(1)
        qq = wq @ y2til + (ryq * zq[..., 1]).sum(1)
        return dual_objective(sgn * muq, bq, qq, a, r2, norm_bound, kd)

    a1 = torch.stack([p1.mT, ytil.expand(p1.shape[1], -1)], dim=1)  # [ã₁ of k; of y], [Q, 2, s]
    a2 = torch.stack([k2.mT, y2.expand(k2.shape[1], -1)], dim=1)  # [Q, 2, m]

    def h_slopes_at(sv: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # h, dh/ds, d²h/ds², [Q] each
        a = torch.exp(sv)
        wq = torch.reciprocal(lam[None, :] + a[:, None])  # D⁻¹, [Q, s]
        schq = c_new[None] + a[:, None, None] * eye - (wq @ outer).reshape(-1, m, m)  # S(α), [Q, m, m]
        chol = torch.linalg.cholesky(schq)
        wa1 = wq[:, None, :] * a1
        res = a2 - wa1 @ bt  # a₂ − B̃ᵀD⁻¹ã₁, [Q, 2, m]
        z = torch.cholesky_solve(res.mT, chol).mT  # new block of M[k, y], [Q, 2, m]
        x1 = wq[:, None, :] * (a1 - z @ bt.mT)  # old block of M[k, y], [Q, 2, s]
        wx1 = wq[:, None, :] * x1
        res2 = z - wx1 @ bt  # the same residual for M[k, y]
        z2 = torch.cholesky_solve(res2.mT, chol).mT
        val = wa1 @ a1.mT + res @ z.mT  # [kᵀMk, kᵀMy; ., yᵀMy], [Q, 2, 2]
        d1 = -(x1 @ x1.mT + z @ z.mT)  # −aᵀM²b
        d2 = 2.0 * (wx1 @ x1.mT + res2 @ z2.mT)  # 2aᵀM³b = 2(Ma)ᵀM(Mb)
        mean = sgn * torch.stack([val[:, 0, 1], d1[:, 0, 1], d2[:, 0, 1]])
        drop = torch.stack([val[:, 0, 0], d1[:, 0, 0], d2[:, 0, 0]])
        quad = torch.stack([val[:, 1, 1], d1[:, 1, 1], d2[:, 1, 1]])
        return dual_slopes(mean, drop, quad, a, r2, norm_bound, kd)

    best, s_best = min_over_alpha(h_slopes_at, h_at, grid, h_grid, steps)
    limit = norm_bound * torch.sqrt(torch.clamp(kd, min=0.0))
    ucb, lcb = split_sides(best, limit, signs, n_a)
    return ucb, lcb, s_best[:n_a]

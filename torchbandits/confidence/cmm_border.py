"""CMM dual for large t: a periodically refreshed eigenbasis plus an exact Schur-complement border.

The 1-D dual of Eq. (12) needs ``μ_α(x)``, ``ρ²_α(x)`` and ``yᵀ(K_t+αI)⁻¹y`` at many α per query.
One ``eigh`` of ``K_t`` makes each α O(t), but costs O(t³) every round. Here the eigenbasis
``K_s = QΛQᵀ`` of the first ``s`` points is kept for up to ``refresh_every`` rounds and the
``m = t − s`` newer points are a border, handled exactly by the Schur complement (no
approximation): with ``D = Λ + αI``, ``B̃ = Qᵀ K(x_{1:s}, x_new)``, ``C = K(x_new, x_new)``,
``S(α) = C + αI − B̃ᵀ D⁻¹ B̃`` (m × m, SPD, eigenvalues ≥ α) and, for ``a = [a₁; a₂]``,
``b = [b₁; b₂]`` (old / new coordinates, ``ã₁ = Qᵀa₁``)::

    aᵀ(K_t + αI)⁻¹b = ã₁ᵀ D⁻¹ b̃₁ + (a₂ − B̃ᵀD⁻¹ã₁)ᵀ S(α)⁻¹ (b₂ − B̃ᵀD⁻¹b̃₁).

A shared log-grid of α (batched over grid points) brackets each query's minimum; successive
parabolic interpolation on ``log α`` (golden-section fallback) refines it, one batched
per-query evaluation (O(A·s·m²)) per step. Every evaluated α gives a valid bound; the smallest
is returned. Cost per round O(s²A + G·s·m·A + steps·A·s·m²) plus ``eigh`` once per
``refresh_every`` rounds (spec §2.5; a speed-up of ours, not in the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels import kernel_matrix

__all__ = ["StaleSpectrum", "border_dual_bounds", "stale_spectrum"]

_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0


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
    steps: int = 7,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Exact CMM bounds (Eq. 12) with a border of ``m = len(x) − spec.s ≥ 1`` points.

    Same contract as :func:`~torchbandits.confidence.mixture.dual_bounds`:
    returns ``(ucb, lcb, log_alpha_ucb)``.
    """
    s = spec.s
    lam, ytil, q_mat, bt = spec.evals, spec.ytil, spec.evecs, spec.bt
    x_new, y2 = x[s:], y[s:]
    m = x_new.shape[0]
    c_new = kernel_matrix(kernel, x_new, x_new)
    p1 = q_mat.mT @ kernel_matrix(kernel, spec.x, cand)  # [s, A]
    k2 = kernel_matrix(kernel, x_new, cand)  # [m, A]
    signs = {"both": (1.0, -1.0), "ucb": (1.0,), "lcb": (-1.0,)}[which]
    n_a = cand.shape[0]
    ns = len(signs)
    sgn = torch.cat([torch.full((n_a,), sg, dtype=cand.dtype, device=cand.device) for sg in signs])
    p1 = p1.repeat(1, ns)
    k2 = k2.repeat(1, ns)
    kd = kdiag.repeat(ns)
    p1y = p1 * ytil[:, None]
    p1sq = p1 * p1
    y2til = ytil * ytil
    eye = torch.eye(m, dtype=cand.dtype, device=cand.device)
    b2 = norm_bound**2
    limit = norm_bound * torch.sqrt(torch.clamp(kd, min=0.0))

    def h_of(mu: Tensor, b: Tensor, q: Tensor, a: Tensor) -> Tensor:
        rt2 = torch.clamp(r2 + a * b2 - a * q, min=0.0)
        return sgn * mu + torch.sqrt(rt2 / a) * torch.sqrt(torch.clamp(kd - b, min=0.0))

    # ---- shared grid: batched over grid points
    n_grid = int(2 * grid_decades * grid_per_decade) + 1
    log_a0 = math.log(alpha0)
    grid = torch.linspace(log_a0 - grid_decades * math.log(10.0), log_a0 + grid_decades * math.log(10.0),
                          n_grid, dtype=cand.dtype, device=cand.device)
    ag = torch.exp(grid)
    w = torch.reciprocal(lam[None, :] + ag[:, None])  # [G, s]
    mg = bt.mT[None] * w[:, None, :]  # [G, m, s]
    r = k2[None] - mg @ p1  # [G, m, Q]
    ry = y2[None] - mg @ ytil  # [G, m]
    sch = c_new[None] + ag[:, None, None] * eye - (w @ (bt[:, :, None] * bt[:, None, :]).reshape(s, m * m)
                                                  ).reshape(-1, m, m)  # [G, m, m]
    chol = torch.linalg.cholesky(sch)
    z = torch.cholesky_solve(torch.cat([r, ry[..., None]], dim=-1), chol)  # [G, m, Q+1]
    b = w @ p1sq + (r * z[..., :-1]).sum(1)
    mu = w @ p1y + (ry[..., None] * z[..., :-1]).sum(1)
    q = w @ y2til + (ry * z[..., -1]).sum(1)
    h_grid = h_of(mu, b, q[:, None], ag[:, None])  # [G, Q]
    best, j = h_grid.min(0)
    s_best = grid[j].clone()

    outer = (bt[:, :, None] * bt[:, None, :]).reshape(s, m * m)  # rows b_i b_iᵀ, [s, m²]
    p1y_t, p1sq_t = p1y.mT.contiguous(), p1sq.mT.contiguous()  # [Q, s]

    def h_at(sv: Tensor) -> Tensor:  # per-query log α [Q]; every product is one GEMM
        a = torch.exp(sv)
        wq = torch.reciprocal(lam[None, :] + a[:, None])  # [Q, s]
        rq = k2.mT - (wq * p1.mT) @ bt  # [Q, m]
        ryq = y2[None] - (wq * ytil) @ bt  # [Q, m]
        schq = c_new[None] + a[:, None, None] * eye - (wq @ outer).reshape(-1, m, m)  # [Q, m, m]
        zq = torch.cholesky_solve(torch.stack([rq, ryq], dim=-1), torch.linalg.cholesky(schq))
        bq = (wq * p1sq_t).sum(1) + (rq * zq[..., 0]).sum(1)
        muq = (wq * p1y_t).sum(1) + (ryq * zq[..., 0]).sum(1)
        qq = wq @ y2til + (ryq * zq[..., 1]).sum(1)
        return h_of(muq, bq, qq, a)

    # ---- successive parabolic interpolation in log α inside [grid[j-1], grid[j+1]]
    lo_i, hi_i = torch.clamp(j - 1, min=0), torch.clamp(j + 1, max=n_grid - 1)
    pa, pb, pc = grid[lo_i], grid[j], grid[hi_i]
    qcols = torch.arange(h_grid.shape[1], device=cand.device)
    fa, fb, fc = h_grid[lo_i, qcols], best.clone(), h_grid[hi_i, qcols]
    for _ in range(steps):
        d1, d2 = pb - pa, pb - pc
        num = d1 * d1 * (fb - fc) - d2 * d2 * (fb - fa)
        den = d1 * (fb - fc) - d2 * (fb - fa)
        u = pb - 0.5 * num / den
        gold = torch.where(pc - pb > pb - pa, pb + _GOLDEN * (pc - pb), pb - _GOLDEN * (pb - pa))
        bad = ~torch.isfinite(u) | (u <= pa) | (u >= pc) | ((u - pb).abs() < 1e-10)
        u = torch.where(bad, gold, u)
        fu = h_at(u)
        better = fu < best
        best = torch.where(better, fu, best)
        s_best = torch.where(better, u, s_best)
        right, improve = u > pb, fu < fb
        # new bracket (a, b, c) with f(b) the smallest of the three
        na = torch.where(right, torch.where(improve, pb, pa), torch.where(improve, pa, u))
        nfa = torch.where(right, torch.where(improve, fb, fa), torch.where(improve, fa, fu))
        nc = torch.where(right, torch.where(improve, pc, u), torch.where(improve, pb, pc))
        nfc = torch.where(right, torch.where(improve, fc, fu), torch.where(improve, fb, fc))
        pb, fb = torch.where(improve, u, pb), torch.where(improve, fu, fb)
        pa, fa, pc, fc = na, nfa, nc, nfc
    val = torch.minimum(best, limit) * sgn
    out = {sg: val[i * n_a:(i + 1) * n_a] for i, sg in enumerate(signs)}
    return out.get(1.0), out.get(-1.0), s_best[:n_a]

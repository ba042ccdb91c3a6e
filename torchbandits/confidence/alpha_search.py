"""The one 1-D search over the ellipsoid weight α of the CMM dual (Flynn & Reeb 2024, Eq. 12).

For a query x and a side ``σ ∈ {+1, −1}`` (UCB / −LCB) the dual objective in ``s = log α`` is

    ``h(s) = σ μ_α(x) + sqrt(g(α) · v(α))``,  ``g = max(R_t²/α + B² − yᵀ(K_t+αI)⁻¹y, 0)``,
    ``v = max(k(x,x) − k_t(x)ᵀ(K_t+αI)⁻¹k_t(x), 0)``

(Flynn & Reeb 2024, Eq. 14 with Cor. 4.3 / Lemma C.1: ``g = R̃²_α/α``, ``v = ρ²_α``). Every α
gives a valid bound, so the CMM bound is ``min(inf_s h(s), B sqrt(k(x,x)))`` (the α → ∞ limit).
Both CMM evaluators — the fresh eigenbasis of :mod:`.cmm_dual` and the stale eigenbasis with an
exact Schur border of :mod:`.cmm_border` — supply the three quadratic forms of
``M = (K_t+αI)⁻¹`` (``kᵀMy``, ``kᵀMk``, ``yᵀMy``) with their first and second α-derivatives
(``d/dα aᵀMb = −aᵀM²b``, ``d²/dα² aᵀMb = 2aᵀM³b``); :func:`dual_slopes` turns them into
``h, dh/ds, d²h/ds²`` and :func:`min_over_alpha` runs the one search (a shared log-grid, then
safeguarded Newton steps on ``s`` per query), written once, here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["SIDES", "dual_objective", "dual_slopes", "log_alpha_grid", "min_over_alpha", "split_sides"]

SIDES: dict[str, tuple[float, ...]] = {"both": (1.0, -1.0), "ucb": (1.0,), "lcb": (-1.0,)}
"""Signs σ of the sides asked for: ``+1`` the UCB, ``−1`` the negated LCB."""


def log_alpha_grid(alpha0: float, decades: float, per_decade: int, *, dtype: torch.dtype,
                   device: torch.device | str | None = None) -> Tensor:
    """``log α`` on ``α₀·10^[−decades, decades]``, ``2·decades·per_decade + 1`` points ``[G]``."""
    n_grid = int(2 * decades * per_decade) + 1
    half = decades * math.log(10.0)
    log_a0 = math.log(alpha0)
    return torch.linspace(log_a0 - half, log_a0 + half, n_grid, dtype=dtype, device=device)


def dual_objective(signed_mean: Tensor, post_var_drop: Tensor, quad_y: Tensor, alpha: Tensor,
                   r2: Tensor, norm_bound: float, kdiag: Tensor) -> Tensor:
    """``h = σμ_α + sqrt(max(R_t²/α + B² − yᵀ(K+αI)⁻¹y, 0)) · sqrt(max(k(x,x) − kᵀ(K+αI)⁻¹k, 0))``.

    ``signed_mean`` ``σ μ_α(x)``, ``post_var_drop`` ``k_t(x)ᵀ(K_t+αI)⁻¹k_t(x)`` and ``kdiag``
    ``k(x,x)`` have the query shape ``[..., Q]``; ``quad_y`` ``yᵀ(K_t+αI)⁻¹y`` and ``alpha``
    broadcast against it (``[G, 1]`` on the grid, ``[Q]`` per query); ``r2`` is ``R_t²``.
    """
    rt2_over_a = torch.clamp(r2 / alpha + norm_bound**2 - quad_y, min=0.0)
    rho2 = torch.clamp(kdiag - post_var_drop, min=0.0)
    return signed_mean + torch.sqrt(rt2_over_a * rho2)


def dual_slopes(mean: Tensor, drop: Tensor, quad: Tensor, alpha: Tensor, r2: Tensor,
                norm_bound: float, kdiag: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(h, dh/ds, d²h/ds²)`` ``[Q]`` each, at ``s = log α``, from the quadratic forms.

    ``mean``, ``drop``, ``quad`` ``[3, Q]``: the value and its first and second α-derivatives of
    ``σ kᵀMy``, ``kᵀMk`` and ``yᵀMy`` (``M = (K_t+αI)⁻¹``); ``alpha``, ``kdiag`` ``[Q]``. With
    ``g = R_t²/α + B² − yᵀMy`` and ``v = k(x,x) − kᵀMk`` (unclamped), ``u = g⁺v⁺``:
    ``h' = μ' + u'/(2√u)``, ``h'' = μ'' + u''/(2√u) − u'²/(4u^{3/2})`` (α-derivatives,
    ``u' = g'v + gv'``, ``u'' = g''v + 2g'v' + gv''``), then ``dh/ds = α h'`` and
    ``d²h/ds² = α h' + α² h''``. Where ``u`` is clamped at 0 the slopes are those of the smooth
    extension divided by a tiny ``√u`` (huge, curvature negative): :func:`min_over_alpha` then
    uses only the sign of ``dh/ds``.
    """
    g = r2 / alpha + norm_bound**2 - quad[0]
    dg, ddg = -r2 / alpha**2 - quad[1], 2 * r2 / alpha**3 - quad[2]
    v, dv, ddv = kdiag - drop[0], -drop[1], -drop[2]
    u = torch.clamp(g, min=0.0) * torch.clamp(v, min=0.0)
    h = mean[0] + torch.sqrt(u)
    ru = torch.sqrt(torch.clamp(u, min=1e-300))
    du = dg * v + g * dv
    ddu = ddg * v + 2 * dg * dv + g * ddv
    dh = mean[1] + du / (2 * ru)
    ddh = mean[2] + ddu / (2 * ru) - du * du / (4 * ru**3)
    return h, alpha * dh, alpha * dh + alpha * alpha * ddh


def min_over_alpha(h_slopes_at: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]],
                   h_at: Callable[[Tensor], Tensor], grid: Tensor, h_grid: Tensor, steps: int
                   ) -> tuple[Tensor, Tensor]:
    """Minimise ``h`` over ``s = log α`` for every query at once: grid, then safeguarded Newton.

    ``grid`` ``[G]`` is the shared log-grid and ``h_grid`` ``[G, Q]`` the objective on it (the
    caller batches that over grid points); ``h_slopes_at(s)`` gives ``(h, dh/ds, d²h/ds²)`` and
    ``h_at(s)`` only ``h``, at one ``log α`` per query (``s`` ``[Q]`` → ``[Q]``). Each query
    starts at its grid minimiser ``grid[j]`` with the bracket ``[grid[j−1], grid[j+1]]``; each of
    the ``steps`` Newton steps ``s − h_s/h_ss`` first moves the bracket end on the downhill side
    of ``s`` to ``s`` (sign of ``h_s``), and where the curvature is not positive or the step
    leaves the bracket — in particular where ``h`` is clamped (``R̃²_α = 0`` or ``ρ²_α = 0``,
    a kink) — bisects the bracket instead. The last iterate is evaluated too. Every evaluated
    α is a valid bound, so the smallest value seen is returned.

    Returns ``(h_min, s_min)``, both ``[Q]``.
    """
    n_grid = grid.shape[0]
    best, j = h_grid.min(0)
    if steps == 0:
        return best, grid[j]
    lo, hi = grid[torch.clamp(j - 1, min=0)], grid[torch.clamp(j + 1, max=n_grid - 1)]
    s = grid[j].clone()
    s_best = s.clone()
    for _ in range(steps):
        h, h_s, h_ss = h_slopes_at(s)
        better = h < best
        best = torch.where(better, h, best)
        s_best = torch.where(better, s, s_best)
        lo = torch.where(h_s < 0, s, lo)
        hi = torch.where(h_s > 0, s, hi)
        prop = s - h_s / h_ss
        ok = (h_ss > 0) & (prop > lo) & (prop < hi)  # a NaN step fails the comparisons
        s = torch.where(ok, prop, 0.5 * (lo + hi))
    h = h_at(s)
    s_best = torch.where(h < best, s, s_best)
    return torch.minimum(h, best), s_best


def split_sides(signed_min: Tensor, limit: Tensor, signs: tuple[float, ...], n_queries: int
                ) -> tuple[Tensor | None, Tensor | None]:
    """``(ucb, lcb)`` from the stacked signed minima ``[len(signs)·A]`` capped by the α → ∞
    limit ``B sqrt(k(x,x))`` ``[len(signs)·A]`` (``None`` for a side not asked for)."""
    val = torch.minimum(signed_min, limit)
    out = {sg: sg * val[i * n_queries:(i + 1) * n_queries] for i, sg in enumerate(signs)}
    return out.get(1.0), out.get(-1.0)

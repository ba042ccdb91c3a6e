"""The one 1-D search over the ellipsoid weight α of the CMM dual (Flynn & Reeb 2024, Eq. 12).

For a query x and a side ``σ ∈ {+1, −1}`` (UCB / −LCB) the dual objective in ``s = log α`` is

    ``h(s) = σ μ_α(x) + sqrt(R̃²_α / α) · ρ_α(x)``,  ``R̃²_α / α = max(R_t²/α + B² − yᵀ(K_t+αI)⁻¹y, 0)``

(Flynn & Reeb 2024, Eq. 14 with Cor. 4.3 / Lemma C.1), with ``μ_α``, ``ρ²_α`` the GP posterior
mean and variance at noise variance α. Every α gives a valid bound, so the CMM bound is
``min(inf_s h(s), B sqrt(k(x,x)))`` (the α → ∞ limit). Both CMM evaluators — the fresh
eigenbasis of :mod:`.cmm_dual` and the stale eigenbasis with an exact Schur border of
:mod:`.cmm_border` — supply ``μ_α``, ``ρ²_α`` and the quadratic form at the points this search
asks for, and nothing else: the search (a shared log-grid, then successive parabolic
interpolation with a golden-section fallback per query) is written once, here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["SIDES", "dual_objective", "log_alpha_grid", "min_over_alpha", "split_sides"]

SIDES: dict[str, tuple[float, ...]] = {"both": (1.0, -1.0), "ucb": (1.0,), "lcb": (-1.0,)}
"""Signs σ of the sides asked for: ``+1`` the UCB, ``−1`` the negated LCB."""

_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0


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


def min_over_alpha(h_at: Callable[[Tensor], Tensor], grid: Tensor, h_grid: Tensor, steps: int
                   ) -> tuple[Tensor, Tensor]:
    """Minimise ``h`` over ``s = log α`` for every query at once.

    ``grid`` ``[G]`` is the shared log-grid and ``h_grid`` ``[G, Q]`` the objective on it (the
    caller batches that over grid points); ``h_at(s)`` evaluates the objective at one ``log α``
    per query (``s`` ``[Q]`` → ``[Q]``). Each query's grid minimiser ``j`` gives the bracket
    ``[grid[j−1], grid[j+1]]``; ``steps`` rounds of successive parabolic interpolation through
    the bracket ``(a, b, c)`` (``h(b)`` the smallest of the three), a golden-section step where
    the parabola's vertex is not finite, leaves the bracket or repeats ``b``, refine it. Every
    evaluated α is a valid bound, so the smallest value seen is returned.

    Returns ``(h_min, s_min)``, both ``[Q]``.
    """
    n_grid = grid.shape[0]
    best, j = h_grid.min(0)
    s_best = grid[j].clone()
    lo_i, hi_i = torch.clamp(j - 1, min=0), torch.clamp(j + 1, max=n_grid - 1)
    pa, pb, pc = grid[lo_i], grid[j], grid[hi_i]
    cols = torch.arange(h_grid.shape[1], device=h_grid.device)
    fa, fb, fc = h_grid[lo_i, cols], best.clone(), h_grid[hi_i, cols]
    for _ in range(steps):
        d1, d2 = pb - pa, pb - pc
        e1, e2 = d1 * (fb - fc), d2 * (fb - fa)
        u = pb - 0.5 * (d1 * e1 - d2 * e2) / (e1 - e2)  # vertex of the parabola through a, b, c
        long_right = pc - pb > pb - pa
        gold = pb + _GOLDEN * torch.where(long_right, pc - pb, pa - pb)
        # a NaN or infinite vertex fails both comparisons with the bracket
        ok = (u > pa) & (u < pc) & ((u - pb).abs() >= 1e-10)
        u = torch.where(ok, u, gold)
        fu = h_at(u)
        better = fu < best
        best = torch.where(better, fu, best)
        s_best = torch.where(better, u, s_best)
        right, improve = u > pb, fu < fb
        # the new bracket (a, b, c) keeps h(b) the smallest of the three
        na = torch.where(right, torch.where(improve, pb, pa), torch.where(improve, pa, u))
        nfa = torch.where(right, torch.where(improve, fb, fa), torch.where(improve, fa, fu))
        nc = torch.where(right, torch.where(improve, pc, u), torch.where(improve, pb, pc))
        nfc = torch.where(right, torch.where(improve, fc, fu), torch.where(improve, fb, fc))
        pb, fb = torch.where(improve, u, pb), torch.where(improve, fu, fb)
        pa, fa, pc, fc = na, nfa, nc, nfc
    return best, s_best


def split_sides(signed_min: Tensor, limit: Tensor, signs: tuple[float, ...], n_queries: int
                ) -> tuple[Tensor | None, Tensor | None]:
    """``(ucb, lcb)`` from the stacked signed minima ``[len(signs)·A]`` capped by the α → ∞
    limit ``B sqrt(k(x,x))`` ``[len(signs)·A]`` (``None`` for a side not asked for)."""
    val = torch.minimum(signed_min, limit)
    out = {sg: sg * val[i * n_queries:(i + 1) * n_queries] for i, sg in enumerate(signs)}
    return out.get(1.0), out.get(-1.0)

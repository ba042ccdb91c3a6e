"""Sliding-window exact posterior whose candidate cache survives the removal of the oldest point.

:class:`~torchbandits.models.ExactKernelRidge` removes the oldest point with a rank-one Cholesky
update (O(n²)) but then drops its cache ``V = L⁻¹ K_SC`` of a fixed candidate set, so the next
round re-solves it in O(n²A). For SW-GP-UCB (Zhou & Shroff 2021, Algorithm 2) that solve
dominates. This subclass carries ``V`` through the removal in O(nA):

with ``L = [[l₁₁, 0], [l₂₁, L₂₂]]``, ``p = L₂₂⁻¹ l₂₁`` and the new factor ``L' = L₂₂ G`` where
``G Gᵀ = I + p pᵀ`` (the closed-form factor used by :func:`~torchbandits.linalg.cholesky_rank_one_update`:
``G_jj = g_j = sqrt(t_j/t_{j−1})``, ``G_ij = p_i q_j`` for ``i > j``, ``q_j = p_j/sqrt(t_{j−1}t_j)``,
``t_j = 1 + Σ_{k≤j} p_k²``),

    V' = L'⁻¹ K_{S'C} = G⁻¹ (V₂ + p V₁),    G⁻¹ = Gᵀ − s pᵀ / (1 + ‖p‖²),   s = Gᵀ p,

where ``V₁`` is the first row of ``V`` and ``V₂`` the rest (``K_{S'C} = L₂₂ V₂ + l₂₁ V₁``), and
``Gᵀ R = g ∘ R + q ∘ (reverse strict cumsum of p ∘ R)`` — no Python loop, no triangular solve.
Every ``refresh_cache_every`` removals the cache is rebuilt from the factor instead (bounds the
round-off that repeated updates accumulate).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .exact import ExactKernelRidge
from .posterior import colsum_sq

__all__ = ["SlidingWindowKernelRidge", "carry_cache_through_removal", "carry_with_p"]


def _strict_reverse_cumsum(a: Tensor, dim: int = 0) -> Tensor:
    """``out_i = Σ_{j>i} a_j`` along ``dim``."""
    rev = torch.flip(torch.cumsum(torch.flip(a, dims=(dim,)), dim=dim), dims=(dim,))
    tail = rev.narrow(dim, 1, rev.shape[dim] - 1)
    return torch.cat([tail, torch.zeros_like(rev.narrow(dim, 0, 1))], dim=dim)


def carry_cache_through_removal(chol: Tensor, v: Tensor) -> Tensor:
    """``V' = L'⁻¹ K_{S'C}`` from ``V = L⁻¹ K_SC`` when the first point leaves (module docstring).

    ``chol`` is the ``n×n`` lower factor *before* the removal, ``v`` is ``[n, A]``; returns
    ``[n−1, A]`` in O(n² + nA).
    """
    l21, l22 = chol[1:, 0], chol[1:, 1:]
    p = torch.linalg.solve_triangular(l22, l21[:, None], upper=False)[:, 0]
    return carry_with_p(p, v)


def carry_with_p(p: Tensor, v: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``V' = G⁻¹ (V₂ + p V₁)`` given the removal vector ``p = L22⁻¹ l21`` (O(nA)).

    ``p`` is ``[n−1]`` and ``v`` ``[n, A]``, or with a leading run dimension ``[R, n−1]`` and
    ``[R, n, A]`` (one removal per run, :mod:`torchbandits.models.batched_window`). The batched
    form evaluates the same expression in place in ``out`` (``[R, n−1, A]``, must not overlap
    ``v``; allocated when ``None``), with the tail sums ``Σ_{j>i}`` as totals minus prefix sums
    (as :func:`~torchbandits.linalg.cholesky_rank_one_update` does) instead of reversed cumulative
    sums: a few passes over ``[R, n, A]`` and no temporaries of that size.
    """
    t = 1.0 + torch.cumsum(p * p, dim=-1)
    t_prev = torch.cat([torch.ones_like(t[..., :1]), t[..., :-1]], dim=-1)
    g = torch.sqrt(t / t_prev)
    q = p / torch.sqrt(t_prev * t)
    if p.ndim == 1:
        r = v[1:] + p[:, None] * v[0][None, :]
        gt_r = g[:, None] * r + q[:, None] * _strict_reverse_cumsum(p[:, None] * r)
        s = g * p + q * _strict_reverse_cumsum(p * p)
        return gt_r - s[:, None] * (p @ r)[None, :] / (1.0 + p @ p)
    pp = p * p
    s = g * p + q * (pp.sum(-1, keepdim=True) - torch.cumsum(pp, dim=-1))      # [R, n−1]
    r = torch.addcmul(v[:, 1:], p[:, :, None], v[:, :1], out=out)             # V₂ + p V₁
    tail = torch.cumsum(p[:, :, None] * r, dim=1)                              # Σ_{j≤i} p_j r_j
    pr = tail[:, -1:].clone()                                                  # pᵀr [R, 1, A]
    tail.neg_().add_(pr)                                                       # Σ_{j>i}
    r.mul_(g[:, :, None]).addcmul_(q[:, :, None], tail)                         # Gᵀ r
    coef = s / (1.0 + pp.sum(-1, keepdim=True))                                # [R, n−1]
    return r.addcmul_(coef[:, :, None], pr, value=-1.0)


class SlidingWindowKernelRidge(ExactKernelRidge):
    """:class:`ExactKernelRidge` whose fixed-candidate cache is carried through
    :meth:`remove_oldest` in O(n² + nA) (see module docstring); everything else is inherited.

    Extra argument: ``refresh_cache_every`` — rebuild the cache from the factor after that many
    carried removals (0: never).
    """

    def __init__(self, kernel: Kernel, lam: float = 1.0, extra_regularisers: Sequence[float] = (),
                 *, refresh_cache_every: int = 256, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if kwargs.get("removal", "rank_one") != "rank_one":
            raise ValueError("SlidingWindowKernelRidge carries its cache through the rank-one "
                             "removal: removal must be 'rank_one'")
        super().__init__(kernel, lam, extra_regularisers, **kwargs)
        if int(refresh_cache_every) < 0:
            raise ValueError(f"refresh_cache_every must be >= 0, got {refresh_cache_every}")
        self.refresh_cache_every = int(refresh_cache_every)
        self._carried = 0

    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest observations (O(n² + nA) each, cache kept)."""
        if count < 0 or count > self._n:
            raise ValueError(f"count must lie in [0, {self._n}], got {count}")
        for _ in range(count):
            carried = {}
            rebuild = self.refresh_cache_every and self._carried >= self.refresh_cache_every
            if self.cache_candidates and self._n > 1 and not rebuild:
                for idx, cache in list(self._caches.items()):
                    if cache.version != self._version or cache.n_at > self._n:
                        continue
                    # bring the cache up to date with points appended since it was last used
                    self._whitened(idx, self.regularisers[idx], cache.candidates)
                    carried[idx] = cache
            if rebuild:
                self._carried = 0
            n_old = self._n
            super().remove_oldest(1)  # factor rank-one update, z re-solved, caches dropped
            for idx, cache in carried.items():
                n = self._n
                v_new = carry_with_p(self._removal_p[idx], cache.v[:n_old])
                cache.v[:n] = v_new
                cache.sumsq = colsum_sq(v_new)
                cache.n_at = n
                cache.version = self._version
                self._caches[idx] = cache
            if carried:
                self._carried += 1

    def reset(self) -> None:
        super().reset()
        self._carried = 0

    def get_extra_state(self) -> dict:
        return {**super().get_extra_state(), "carried": self._carried}

    def set_extra_state(self, state: dict) -> None:
        super().set_extra_state(state)
        self._carried = int(state.get("carried", 0))

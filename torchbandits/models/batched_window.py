"""``R`` sliding-window posteriors stepped together: the batched removal of the oldest point.

SW-GP-UCB (Zhou & Shroff 2021, Algorithm 2) keeps the last ``w`` observations. In a batch every
run holds the same number of points, so every run removes its oldest point at the same round and
the state keeps one shape: lower factors ``L`` ``[R, n, n]`` of ``K_r + λ_r I``.

With ``L = [[l₁₁, 0], [l₂₁, L₂₂]]`` the trailing block of ``K + λI`` is
``L₂₂L₂₂ᵀ + l₂₁l₂₁ᵀ = L₂₂ (I + p pᵀ) L₂₂ᵀ`` with ``p = L₂₂⁻¹ l₂₁``: a rank-one *update*, whose
factor is ``L' = L₂₂ G`` with the closed-form ``G Gᵀ = I + p pᵀ`` (Gill, Golub, Murray &
Saunders 1974; the one-run form is :func:`torchbandits.linalg.cholesky_rank_one_update`):
``t_j = 1 + Σ_{k≤j} p_k²``, ``G_jj = sqrt(t_j/t_{j−1})``, ``G_ij = p_i p_j/sqrt(t_{j−1}t_j)``
(``i > j``), so ``(L₂₂G)_ij = (L₂₂)_ij G_jj + (Σ_{k>j} (L₂₂)_ik p_k)·p_j/sqrt(t_{j−1}t_j)``.
A removal is one batched triangular solve for ``p`` ``[R, n−1]``, the factor by cumulative sums
(no loop over ``n`` or ``R``), and one batched solve ``z = L'⁻¹Y``: O(n²) per run.

A fixed candidate set's cache ``V = L⁻¹K_SC`` ``[R, n, A]`` is carried through the removal in
O(nA) per run by :func:`~torchbandits.models.window.carry_with_p` (the same function the one-run
:class:`~torchbandits.models.window.SlidingWindowKernelRidge` uses, applied with a leading run
dimension); every ``refresh_cache_every`` carried removals it is rebuilt from the factor instead,
as the one-run model does.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .batched_exact import BatchedExactKernelRidge
from .window import carry_with_p

__all__ = ["BatchedWindowKernelRidge", "batched_rank_one_factor"]


def batched_rank_one_factor(chol: Tensor, p: Tensor) -> Tensor:
    """Lower factor ``L G`` of ``L (I + p pᵀ) Lᵀ`` for factors ``[..., m, m]`` and ``p [..., m]``
    (module docstring); O(m²) per factor, no loop."""
    t = 1.0 + torch.cumsum(p * p, dim=-1)
    t_prev = torch.cat([torch.ones_like(t[..., :1]), t[..., :-1]], dim=-1)
    g_diag = torch.sqrt(t / t_prev)
    g_off = p / torch.sqrt(t_prev * t)
    out = torch.mul(chol, p[..., None, :]).cumsum_(dim=-1)     # Σ_{k≤j} L_ik p_k
    totals = out[..., -1:].clone()
    out.neg_().add_(totals)                                     # Σ_{k>j} L_ik p_k
    out.mul_(g_off[..., None, :]).addcmul_(chol, g_diag[..., None, :])
    return out.tril_()


class BatchedWindowKernelRidge(BatchedExactKernelRidge):
    """:class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` with
    :meth:`remove_oldest` (every run drops its oldest point; see the module docstring).

    Extra arguments: ``carry_cache`` (carry a fixed candidate set's ``V`` through a removal;
    ``False`` drops it, the next round re-solves) and ``refresh_cache_every`` (rebuild it from the
    factor after that many carried removals; 0: never).
    """

    def __init__(self, kernel: Kernel, lam: float | Tensor, n_runs: int, *,
                 carry_cache: bool = True, refresh_cache_every: int = 256, **kwargs: Any) -> None:
        super().__init__(kernel, lam, n_runs, **kwargs)
        if int(refresh_cache_every) < 0:
            raise ValueError(f"refresh_cache_every must be >= 0, got {refresh_cache_every}")
        self.carry_cache = bool(carry_cache)
        self.refresh_cache_every = int(refresh_cache_every)
        self._carried = 0
        self._spare: Tensor | None = None   # a second cache buffer, swapped at every removal

    @torch.no_grad()
    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest observations of every run, O(n² + nA) per run each."""
        if isinstance(count, bool) or int(count) != count or count < 0 or count > self._n:
            raise ValueError(f"count must be an int in [0, {self._n}], got {count!r}")
        for _ in range(int(count)):
            self._remove_first()

    def _remove_first(self) -> None:
        n = self._n
        cache = self._carry_candidate(n)
        if cache is not None:
            cache.pop("head", None)   # the copied leading block of the factor: every row changes
        self._cache = None
        if n > 1:
            chol = self._L[:, :n, :n]
            l22 = chol[:, 1:, 1:]
            p = torch.linalg.solve_triangular(l22, chol[:, 1:, :1], upper=False)[..., 0]
            new = batched_rank_one_factor(l22, p)                     # [R, n−1, n−1]
            self._L[:, : n - 1, : n - 1] = new
            self._x[:, : n - 1] = self._x[:, 1:n].clone()
            self._y[:, : n - 1] = self._y[:, 1:n].clone()
            self._z[:, : n - 1] = torch.linalg.solve_triangular(
                new, self._y[:, : n - 1, None], upper=False)[..., 0]
            if cache is not None:
                # carried into the spare buffer, which then becomes the cache's (no copy)
                buf = self._spare
                if buf is None or buf.shape != cache["v"].shape or buf.dtype != new.dtype \
                        or buf.device != new.device:
                    buf = torch.empty_like(cache["v"])
                v_new = carry_with_p(p, cache["v"][:, :n], out=buf[:, : n - 1])
                self._spare, cache["v"] = cache["v"], buf
                cache["sumsq"] = (v_new * v_new).sum(1)
                cache["n_at"] = n - 1
                self._cache = cache
                self._carried += 1
        self._n = n - 1

    def _carry_candidate(self, n: int) -> dict[str, Any] | None:
        """The candidate cache brought up to the ``n`` current points, or ``None`` when it is
        not carried (none, switched off, or due for a rebuild from the factor)."""
        c = self._cache
        if not (self.carry_cache and isinstance(c, dict) and n > 1):
            return None
        if self.refresh_cache_every and self._carried >= self.refresh_cache_every:
            self._carried = 0
            return None
        if not {"cand", "v", "sumsq", "n_at"} <= c.keys() or c["n_at"] > n:
            return None
        if c["n_at"] < n:      # the rows of the points appended since the last query
            self._whitened(c["cand"])
            c = self._cache
            if not isinstance(c, dict) or c.get("n_at") != n:
                return None
        return c

    def reset(self) -> None:
        super().reset()
        self._carried = 0

    def get_extra_state(self) -> dict:
        return {**super().get_extra_state(), "carried": self._carried}

    def set_extra_state(self, state: dict) -> None:
        super().set_extra_state(state)
        self._carried = int(state.get("carried", 0))

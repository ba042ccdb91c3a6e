"""The solve-and-score step shared by the exact-posterior family.

Every exact model here (:class:`~torchbandits.models.ExactKernelRidge` and its sliding-window
subclass, :class:`~torchbandits.models.weighted.DiscountedKernelRidge`,
:class:`~torchbandits.models.weighted.TimeDecayKernelRidge`,
:class:`~torchbandits.models.finite_arm.FiniteArmRidge`) holds a lower Cholesky factor ``L`` of
an SPD matrix ``M`` (``K + λI``, ``K + λW⁻¹``, ``K̃ + λI`` or the primal ``V``) and scores a set of
``A`` candidates from *whitened* quantities:

* whitened targets ``z = L⁻¹ y`` ``[n]`` and whitened candidates ``V = L⁻¹ K_SC`` ``[n, A]``;
* mean ``μ = zᵀV`` and GP variance ``ρ² = k_CC − colsum(V ⊙ V)`` (clamped at 0), optionally at
  a common scale ``s``: ``μ = s·zᵀV``, ``ρ² = k_CC − s²·colsum(V ⊙ V)`` (the time-decay model).

:class:`CandidateCache` keeps ``V`` of one fixed candidate set in step with appends: a point
appended to ``L`` adds one row to ``V`` (``V_new = L_new,new⁻¹ (K_new,C − L_new,old V_old)``), so
a round with a fixed arm set costs O(n·A) instead of O(n²·A).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..buffers import grow_rows
from ..linalg import GrowingCholesky

__all__ = ["CandidateCache", "colsum_sq", "gp_scores", "score_whitened", "whitened_solve"]


def whitened_solve(factor: Tensor | GrowingCholesky, rhs: Tensor) -> Tensor:
    """``L⁻¹ rhs`` for a dense lower factor ``[n, n]`` or a :class:`GrowingCholesky`;
    ``rhs`` is ``[n]`` or ``[n, k]`` (the result has its shape)."""
    if isinstance(factor, GrowingCholesky):
        return factor.solve(rhs)
    if rhs.ndim == 1:
        return torch.linalg.solve_triangular(factor, rhs[:, None], upper=False)[:, 0]
    return torch.linalg.solve_triangular(factor, rhs, upper=False)


def colsum_sq(v: Tensor) -> Tensor:
    """``colsum(V ⊙ V)`` ``[A]`` of ``V`` ``[n, A]`` (``‖L⁻¹k_S(x)‖²`` per candidate)."""
    return (v * v).sum(0)


def score_whitened(z: Tensor, v: Tensor, kdiag: Tensor | float, sumsq: Tensor, scale: float = 1.0
                   ) -> tuple[Tensor, Tensor]:
    """Mean ``s·zᵀV`` and GP variance ``max(k_CC − s²·sumsq, 0)`` (both ``[A]``).

    ``z`` ``[n]``, ``v`` ``[n, A]``, ``kdiag = k_CC`` ``[A]`` (or the constant of a stationary
    kernel), ``sumsq = colsum(V ⊙ V)`` ``[A]``.
    """
    if scale == 1.0:
        return z @ v, torch.rsub(sumsq, kdiag).clamp_min_(0.0)
    return scale * (z @ v), (kdiag - scale * scale * sumsq).clamp_min(0.0)


def gp_scores(factor: Tensor | GrowingCholesky, kq: Tensor, y: Tensor, kdiag: Tensor
              ) -> tuple[Tensor, Tensor, Tensor]:
    """From-scratch solve and score: ``V = L⁻¹K_SC``, ``z = L⁻¹y``; returns ``(μ, k_CC − colsum V²,
    V)`` with the variance **not** clamped (a caller may subtract more first, e.g. the D-LinUCB
    sandwich of the discounted model). Shapes ``[A]``, ``[A]``, ``[n, A]``."""
    v = whitened_solve(factor, kq)
    z = whitened_solve(factor, y)
    return z @ v, kdiag - colsum_sq(v), v


@dataclass
class CandidateCache:
    """``V = L⁻¹ K_SC`` of one fixed candidate set ``[A, d]``, kept in step with appends.

    ``v`` is a capacity buffer ``[capacity, A]`` whose rows ``:n_at`` are valid, ``sumsq`` their
    column sums of squares ``[A]``, ``version`` the owner's data version when it was built (a
    removal or refactorisation bumps the version and so invalidates the cache).
    """

    candidates: Tensor
    kdiag: Tensor | float
    v: Tensor
    sumsq: Tensor
    n_at: int
    version: int

    @classmethod
    def build(cls, candidates: Tensor, kdiag: Tensor | float, v: Tensor, sumsq: Tensor, version: int
              ) -> CandidateCache:
        """A cache holding ``v`` ``[n, A]`` itself (not copied: the first :meth:`extend` moves it
        into a buffer of capacity ``max(2n, …)``), ``kdiag`` a tensor ``[A]`` or the constant
        ``k(x, x)`` of a stationary kernel."""
        return cls(candidates.clone(), kdiag, v, sumsq, v.shape[0], version)

    def serves(self, cand: Tensor, n: int, version: int) -> bool:
        """Whether this cache holds (a prefix of) ``L⁻¹K_SC`` for ``cand`` and the current data."""
        return (self.version == version and self.candidates.shape == cand.shape
                and self.n_at <= n and torch.equal(self.candidates, cand))

    def extend(self, factor: GrowingCholesky, kq_new: Tensor) -> None:
        """Add the rows of ``V`` for the points ``n_at:n`` appended since the last call, given
        their kernel rows ``kq_new = K_{new,C}`` ``[n − n_at, A]``: one triangular solve with the
        new diagonal block of ``L``, O(n·A) per point."""
        a, n = self.n_at, self.n_at + kq_new.shape[0]
        rows = factor.rows(a, n)
        rhs = kq_new - rows[:, :a] @ self.v[:a] if a else kq_new
        v_new = torch.linalg.solve_triangular(rows[:, a:n], rhs, upper=False)
        self.v = grow_rows(self.v, n)
        self.v[a:n] = v_new
        self.sumsq = self.sumsq + colsum_sq(v_new)
        self.n_at = n

"""Re-scoring a fixed candidate set after a from-scratch refactorisation (a hyper-parameter refit).

After :meth:`~torchbandits.models.ExactKernelRidge.set_kernel` the whitened candidates
``V = L⁻¹ K_SC`` ``[n, A]`` of a cached candidate set are stale (new kernel, new factor ``L``).
Rebuilding them costs ``n·A`` kernel evaluations and one triangular solve, O(n²·A), whoever does
it; :class:`CandidateRescore` does it right after the refactorisation, **into the storage of the
stale cache** (``[capacity, A]``, kept when it holds ``n`` rows), instead of letting the next
query allocate (and page-fault) a fresh ``[2n, A]`` buffer. The values are those of the
lazy rebuild (the same solve with the same factor); the cache still checks at every query that it
serves the queried candidates, so a rebuild for a set that is not queried again costs time only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from .posterior import CandidateCache, colsum_sq

if TYPE_CHECKING:
    from gpytorch.kernels import Kernel

__all__ = ["CandidateRescore"]


class CandidateRescore:
    """The re-scoring of :class:`~torchbandits.models.ExactKernelRidge`'s candidate caches after
    a refactorisation (a mixin: the model's own state, read and written through ``self``)."""

    _caches: dict[int, CandidateCache]
    _version: int
    cache_candidates: bool
    factors: torch.nn.ModuleList
    kernel: Kernel
    n: int
    x: Tensor

    @torch.no_grad()
    def _rescore_candidate_caches(self, stale: dict[int, CandidateCache]) -> None:
        """Rebuild ``V = L⁻¹ K_SC`` ``[n, A]``, ``k_CC`` ``[A]`` and ``colsum(V ⊙ V)`` ``[A]`` of
        every stale cache (per regulariser slot) for the model's current kernel and factors, and
        install them.

        Args:
            stale: the caches the model held before its refactorisation from scratch (every
                factor dense now, no tail rows), ``{slot: cache}``.
        """
        n = self.n
        if n == 0 or not self.cache_candidates:
            return
        # one kernel evaluation per distinct candidate tensor
        kq_by_set: dict[int, tuple[Tensor, Tensor]] = {}
        for idx, cache in stale.items():
            if idx >= len(self.factors):
                continue
            cand = cache.candidates
            if id(cand) not in kq_by_set:
                kq_by_set[id(cand)] = (kernel_matrix(self.kernel, self.x, cand),
                                       kernel_diag(self.kernel, cand))
            kq, kdiag = kq_by_set[id(cand)]
            factor = self.factors[idx]
            buf = cache.v
            if buf.shape[0] < n or buf.dtype != kq.dtype or buf.device != kq.device:
                buf = kq.new_empty(max(2 * n, 16), kq.shape[1])
            if factor.m == 0 and factor.head.shape[0] == n:
                torch.linalg.solve_triangular(factor.head, kq, upper=False, out=buf[:n])
            else:
                buf[:n] = factor.solve(kq)
            v = buf[:n]
            self._caches[idx] = CandidateCache(cand, kdiag, buf, colsum_sq(v), n, self._version)

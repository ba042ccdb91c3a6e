"""Pieces of the batched exact posterior (:mod:`torchbandits.models.batched_exact`): the check
of a per-run setting ``[R]``, a tensor's storage key (the fixed-candidate cache's test without a
host read of values) and the head-plus-tail triangular solve on a capacity buffer of ``R``
Cholesky factors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["HEAD_BLOCK", "FactorHead", "block_solve", "check_run_values", "storage_key"]


def check_run_values(name: str, value: Any, n_runs: int, *, positive: bool,
                     dtype: torch.dtype = torch.float64, checked: bool = False) -> Tensor:
    """A per-run setting as a finite tensor ``[R]`` (a number is repeated ``R`` times);
    ``positive``: every entry > 0, else every entry >= 0. Raises ``ValueError`` naming ``name``.
    ``checked``: ``value`` is a tensor ``[R]`` derived from checked values (kept on its device,
    no host read)."""
    if checked:
        return value.detach().to(dtype).clone()
    try:
        v = torch.as_tensor(value, dtype=dtype).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a number or a tensor [R], got {value!r}") from None
    v = v.expand(n_runs).clone() if v.ndim == 0 else v
    if v.shape != (n_runs,):
        raise ValueError(f"{name} must be [R] with R = {n_runs}, got shape {tuple(v.shape)}")
    bad = ~torch.isfinite(v) | ((v <= 0) if positive else (v < 0))
    if bool(bad.any()):
        run, bound = int(bad.nonzero()[0, 0]), "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {bound}: run {run} has {float(v[run])}")
    return v


def storage_key(t: Tensor) -> tuple[Any, ...]:
    """Which memory ``t`` views, and its version counter (host metadata only); an inference
    tensor has no version counter, so its key equals nothing."""
    if t.is_inference():
        return (object(),)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.stride()), t.dtype,
            t.device, t._version)


HEAD_BLOCK = 64   # the contiguous head of the factor is refreshed every that many appends


def block_solve(chol: Tensor, head: Tensor, n: int, rhs: Tensor) -> Tensor:
    """``L⁻¹ rhs`` ``[R, n, k]`` for the factors ``chol[:, :n, :n]`` of a capacity buffer, with
    ``head`` a contiguous copy of its leading ``n0 × n0`` block ``[R, n0, n0]``.

    A batched triangular solve on a slice of a capacity buffer would copy all ``R·n²`` entries
    first (LAPACK wants contiguous matrices) — a memory-bound copy as costly as the solve. So,
    as :class:`~torchbandits.linalg.GrowingCholesky` does for one run, the solve is split:
    ``x1 = head⁻¹ b1`` on the contiguous head, ``x2 = L22⁻¹ (b2 − L21 x1)`` on the ``m = n − n0``
    tail rows (``m < 64``; the small ``L22`` is the only copy)."""
    n0 = head.shape[1]
    x1 = torch.linalg.solve_triangular(head, rhs[:, :n0], upper=False) if n0 else rhs[:, :0]
    if n0 == n:
        return x1
    r2 = rhs[:, n0:n] - chol[:, n0:n, :n0] @ x1 if n0 else rhs[:, n0:n]
    x2 = torch.linalg.solve_triangular(chol[:, n0:n, n0:n], r2, upper=False)
    return torch.cat([x1, x2], dim=1)


class FactorHead:
    """The contiguous head of the Cholesky factors of
    :class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` (a mixin: the model's own
    factors and cache, read and written through ``self``)."""

    _cache: dict[str, Any] | None
    _L: Tensor
    n: int

    def _factor_head(self) -> Tensor:
        """The contiguous copy ``[R, n0, n0]`` of the leading block of the model's factors,
        ``n0 = 64·⌊n/64⌋``: kept in the model's cache (dropped, like the candidate cache, by
        ``reset``, a state load or a move) and re-copied when ``n0`` grows, an O(R·n²) copy every
        64 appends. Rows below ``n0`` never change under appends, so the copy stays exact."""
        n0 = (self.n // HEAD_BLOCK) * HEAD_BLOCK
        if self._cache is None:
            self._cache = {}
        head = self._cache.get("head")
        if head is None or head.shape[1] != n0:
            head = self._L[:, :n0, :n0].contiguous()
            self._cache["head"] = head
        return head

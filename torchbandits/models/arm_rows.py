"""Kernel rows of the pulled arms over a fixed arm set (BKB's cache, Calandriello et al., COLT
2019, §3.2; the paper suggests caching the embedded arms, we cache kernel rows).

On a fixed arm set ``X_A`` ``[A, d]`` every distinct pulled arm ``x_j`` is one of the arms, at row
``idx_j``. :class:`ArmRowCache` keeps

* the map ``idx`` ``[n_distinct]`` (−1 for a pulled point that is not an arm), and
* the kernel rows ``k(x_j, X_A)`` ``[n_distinct, A]``, each computed once, when ``x_j`` is first
  needed, so that a round gathers ``K_Z,A`` (the dictionary's rows) and ``K_ZZ``, ``K_PZ`` (columns
  of those rows) instead of evaluating ``m·A`` kernels.

When the candidate set changes the cache restarts; after the third change (contextual use, a new
arm set every round) it gives up and returns ``None``, so the caller evaluates the pulled points
directly instead of matching them every round. Memory is capped at ``max_entries`` kernel values
(``2²⁵`` float64 = 256 MiB by default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..buffers import grow_rows

__all__ = ["ArmRowCache", "is_row_view", "match_rows"]


def match_rows(points: Tensor, arms: Tensor) -> Tensor:
    """Row of ``arms`` ``[A, d]`` equal to each row of ``points`` ``[n, d]`` (−1 if none) ``[n]``,
    in chunks of about 2·10⁶ compared entries."""
    out = torch.full((points.shape[0],), -1, dtype=torch.long, device=arms.device)
    chunk = max(1, 2_000_000 // max(arms.shape[0] * arms.shape[1], 1))
    for s in range(0, points.shape[0], chunk):
        eq = (points[s : s + chunk, None, :] == arms[None, :, :]).all(-1)
        hit = eq.any(1)
        out[s : s + chunk] = torch.where(hit, eq.to(torch.int8).argmax(1), -1)
    return out


def is_row_view(x: Tensor, arms: Tensor | None, i: int) -> bool:
    """Whether ``x`` ``[d]`` is the view ``arms[i]`` (what ``update(arms[i], r)`` passes): a
    pointer comparison, no tensor op."""
    if arms is None or i < 0 or x.ndim != 1 or x.shape[0] != arms.shape[1]:
        return False
    return (x.data_ptr() == arms.data_ptr() + i * arms.stride(0) * arms.element_size()
            and x.stride(0) == arms.stride(1) and x.dtype == arms.dtype and x.device == arms.device)


class ArmRowCache:
    """The pulled-arm map and kernel-row cache of BKB on a fixed arm set (module docstring).

    A plain object (not a module): its content is derived data, rebuilt after a load or a
    device move (:meth:`clear`).

    Args:
        max_entries: largest cache (distinct pulled arms × arms) before :meth:`dictionary_rows`
            returns ``None`` (the caller then evaluates ``k_Z(arms)`` every round).
    """

    __slots__ = ("arms", "changes", "complete", "idx", "max_entries", "n_rows", "rows", "verified",
                 "where")

    def __init__(self, max_entries: int = 2**25) -> None:
        self.max_entries = int(max_entries)
        self.clear()

    def clear(self) -> None:
        """Forget the arm set, the map and the rows."""
        self.arms: Tensor | None = None  # the arm set the map refers to
        self.idx: Tensor | None = None  # row of each distinct pulled point in ``arms`` (−1)
        self.changes = 0  # how often the arm set changed
        self.rows: Tensor | None = None  # [cap, A] kernel rows of the first n_rows pulled points
        self.n_rows = 0
        self.complete: tuple[Tensor, bool] | None = None  # (idx, every pulled point is an arm)
        self.where: dict[int, int] = {}  # arm row -> position among the pulled points
        self.verified: Tensor | None = None  # the candidates last found equal to ``arms``

    def same_arms(self, arms: object) -> bool:
        """Whether ``arms`` is a tensor equal to the cached arm set (same shape, dtype and device;
        one exact comparison). The cached set was validated when it was first seen, so the caller
        may skip validating ``arms`` again; the answer is remembered for :meth:`pulled_rows`
        until the next call (call it once per query, before the query reads the arms)."""
        ref = self.arms
        ok = (ref is not None and isinstance(arms, Tensor) and arms.shape == ref.shape
              and arms.dtype == ref.dtype and arms.device == ref.device and torch.equal(arms, ref))
        self.verified = arms if ok else None  # type: ignore[assignment]
        return ok

    def pulled_rows(self, pulled: Tensor, arms: Tensor) -> Tensor | None:
        """``[n_distinct]`` rows of the ``pulled`` points in ``arms`` (cached while the arm set
        stays the same); ``None`` once it has changed more than twice."""
        if self.arms is not None and self.idx is not None and (arms is self.verified or (
                self.arms.shape == arms.shape and torch.equal(self.arms, arms))):
            return self.idx
        self.changes += 1
        self.rows, self.n_rows = None, 0
        self.where = {}
        if self.changes > 2:
            self.arms = self.idx = None
            return None
        self.arms = arms.clone()
        self.idx = match_rows(pulled, arms)
        for j, r in enumerate(self.idx.tolist()):
            if r >= 0:
                self.where.setdefault(r, j)
        return self.idx

    def position(self, row: int) -> int:
        """Position among the pulled points of the one at arm row ``row`` (−1 if none)."""
        return self.where.get(row, -1)

    def fixed_rows(self, pulled: Tensor, arms: Tensor) -> Tensor | None:
        """:meth:`pulled_rows` when every pulled point is one of ``arms``, else ``None``."""
        idx = self.pulled_rows(pulled, arms)
        if idx is None:
            return None
        ok = self.complete
        if ok is None or ok[0] is not idx:
            ok = self.complete = (idx, bool((idx >= 0).all()))
        return idx if ok[1] else None

    def push(self, row: int) -> None:
        """A new distinct pulled point, at row ``row`` of the arm set (−1 if not an arm)."""
        if self.idx is not None and self.arms is not None:
            if row >= 0:
                self.where.setdefault(row, self.idx.shape[0])
            self.idx = torch.cat([self.idx, self.idx.new_tensor([row])])

    def dictionary_rows(self, kernel_block: Callable[[Tensor, Tensor], Tensor], arms: Tensor,
                        idx: Tensor, mask: Tensor) -> Tensor | None:
        """``K_Z,A`` ``[m, A]``: the cached rows of the pulled points selected by ``mask`` (the
        dictionary: a boolean ``[n_distinct]`` mask or their ``[m]`` positions), computing with
        ``kernel_block(a, b) = k(a, b)`` the rows of pulled points not seen yet; ``None`` past
        ``max_entries``."""
        n, a = idx.shape[0], arms.shape[0]
        if n * a > self.max_entries:
            return None
        rows = self.rows
        if rows is None or rows.shape[1] != a:
            rows = self.rows = arms.new_zeros(max(16, n), a)
            self.n_rows = 0
        if self.n_rows < n:
            rows = self.rows = grow_rows(rows, n)
            rows[self.n_rows : n] = kernel_block(arms.index_select(0, idx[self.n_rows : n]), arms)
            self.n_rows = n
        if mask.dtype == torch.bool:
            return rows[:n][mask]
        return rows.index_select(0, mask)

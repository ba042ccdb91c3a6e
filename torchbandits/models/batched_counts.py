"""The count statistics of ``R`` BKB runs, padded to a common capacity (Calandriello, Carratino,
Lazaric, Valko & Rosasco, COLT 2019, §3.2: BKB's posterior needs only the distinct pulled points,
their pull counts and reward sums, and the current dictionary).

Buffers (entries beyond a run's ``n_r`` distinct points are zero): points ``px`` ``[R, cap, d]``,
counts and reward sums ``[R, cap]``, the dictionary mask ``in_dict`` ``[R, cap]``; per run
``n_distinct``, ``m_theory`` (the multiset size of the last draw) and the number of empty
dictionaries drawn ``[R]``. Points are stored in the order of their first pull, as the
sequential policy stores them, so run ``r``'s dictionary is in the same order as the sequential
run's and its posterior is computed in the same order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..buffers import ResizableModule, grow_rows
from ..native import bkb as native_bkb

__all__ = ["BatchedCounts"]


class BatchedCounts(ResizableModule):
    """Distinct pulled points, counts, sums and dictionary masks of ``R`` runs (module docstring).

    Args:
        n_runs: ``R``.
        dtype, device: of the points, counts and sums.
    """

    def __init__(self, n_runs: int, *, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        r = int(n_runs)
        z = dict(dtype=dtype, device=device)
        self.register_buffer("px", torch.zeros(r, 16, 0, **z))
        self.register_buffer("counts", torch.zeros(r, 16, **z))
        self.register_buffer("sums", torch.zeros(r, 16, **z))
        self.register_buffer("in_dict", torch.zeros(r, 16, dtype=torch.bool, device=device))
        for name in ("n_distinct", "m_theory", "empty"):
            self.register_buffer(name, torch.zeros(r, dtype=torch.long, device=device))
        self.version = 0   # bumped by every change of the statistics or the dictionaries

    @property
    def n_runs(self) -> int:
        """``R``."""
        return self.counts.shape[0]

    @property
    def width(self) -> int:
        """``N = max_r n_r``: the padded number of distinct points (one host read)."""
        return int(self.n_distinct.max()) if self.n_runs else 0

    @property
    def sizes(self) -> Tensor:
        """Dictionary sizes ``m_r`` ``[R]``."""
        return self.in_dict.sum(-1)

    def ensure_dim(self, d: int) -> None:
        """Points of dimension ``d`` (set once, before the first pull)."""
        if self.px.shape[2] != d:
            self.px = self.px.new_zeros(self.px.shape[0], self.px.shape[1], d)

    def reserve(self, size: int) -> None:
        """Room for ``size`` distinct points per run (the buffers grown, their content kept)."""
        names = ("px", "counts", "sums", "in_dict")
        if min(getattr(self, name).shape[1] for name in names) >= size:
            return   # (no buffer re-set: a module attribute write costs ~10 µs)
        for name in names:
            setattr(self, name, grow_rows(getattr(self, name), size, dims=(1,)))

    def record(self, x: Tensor, y: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Count the pulls ``x`` ``[R, d]`` with rewards ``y`` ``[R]`` (``n`` = :attr:`width`):
        a run's point that equals one of its distinct points adds to that point's count and
        sum, any other becomes its next distinct point. Returns ``(slot [R], new [R] bool)``."""
        r, d = x.shape
        self.ensure_dim(d)
        self.reserve(n + 1)
        ar = torch.arange(r, device=x.device)
        seen = (self.px[:, :n] == x[:, None, :]).all(-1)
        seen &= torch.arange(n, device=x.device)[None, :] < self.n_distinct[:, None]
        old = seen.any(-1)
        first = seen.to(torch.int8).argmax(-1) if n else self.n_distinct
        slot = torch.where(old, first, self.n_distinct)
        new = ~old
        self.px[ar, slot] = torch.where(new[:, None], x, self.px[ar, slot])
        self.counts[ar, slot] += 1.0
        self.sums[ar, slot] += y
        self.n_distinct += new.long()
        self.version += 1
        return slot, new

    def set_dictionary(self, copies: Tensor) -> None:
        """The drawn copies ``[R, w]`` (``w ≤`` capacity; zero beyond each run's points): the
        dictionary is ``{j : copies_j > 0}``, ``m_theory = Σ_j copies_j``."""
        w = copies.shape[1]
        if self.in_dict.is_cpu and native_bkb.set_dictionary(copies, self.in_dict, self.m_theory,
                                                             self.empty):
            self.version += 1     # compiled: the same mask, sum and count in one call
            return
        mask = copies > 0
        self.in_dict.zero_()
        self.in_dict[:, :w] = mask.to(self.in_dict.device)
        self.m_theory.copy_(copies.sum(-1).to(self.m_theory))
        self.empty += (~mask.any(-1)).to(self.empty)
        self.version += 1

    def reset(self) -> None:
        """Forget every pull."""
        for t in (self.px, self.counts, self.sums, self.in_dict, self.n_distinct, self.m_theory,
                  self.empty):
            t.zero_()
        self.version += 1

"""The explicit inverse ``L⁻¹`` of ``R`` batched Cholesky factors, kept in step with appends, and
a per-model workspace of reused buffers (:mod:`torchbandits.models.batched_exact`).

Scoring fresh candidates ``[R, A, d]`` needs ``V = L⁻¹ K_SC`` ``[R, n, A]`` of every run. A
batched triangular solve on the CPU copies its operands into LAPACK's layout, allocates its
result and runs far below the matrix-product rate at bandit sizes (``n ≤ 200``, ``A = 100``);
with ``L⁻¹`` at hand the same ``V`` is one batched product, written as
``Vᵀ = K_CS (L⁻¹)ᵀ`` ``[R, A, n]`` into a reused buffer, at the GEMM rate (twice the flops of
the solve, so it pays while the solve runs below half that rate: up to a few hundred points on one
CPU thread, see ``docs/batch-performance.md``, "The explicit inverse").

Bordering: when every factor gains the row ``(ℓᵀ, d)`` (``ℓ = L⁻¹k_S(x)``), its inverse gains
``(−ℓᵀL⁻¹/d, 1/d)`` (the blocks of ``[[L, 0], [ℓᵀ, d]]⁻¹``), one batched vector-matrix product,
O(n²) per run like the append itself. The numbers are those of forward substitution row by row
(LAPACK's ``trtri`` order), accurate to ``κ(L)·ε`` relative; the tests hold scores to the
sequential model's triangular solves at 1e-10.

The inverse is dropped (and the caller falls back to the triangular solve) when the factor
changes other than by :meth:`InverseFactor.border` — a window removal, a state load, a move —
which :meth:`InverseFactor.valid` sees from the factor's storage and version counter (host
metadata, no read of values), and beyond :data:`INVERSE_MAX_N` points (256; on a GPU
:data:`INVERSE_MAX_N_CUDA`, 1024), where on the CPU the solve is as fast and the inverse would
double the model's memory.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from ..buffers import grow_rows

__all__ = ["INVERSE_MAX_N", "INVERSE_MAX_N_CUDA", "InverseFactor", "Workspace", "inverse_max_n"]

#: the inverse is kept up to this many points per run (then dropped: the triangular solve)
INVERSE_MAX_N = 256
#: ... on a GPU, where a batched triangular solve runs far below the batched product's rate and
#: same actions as the CPU's solves were measured to T = 1000 (docs/batch-performance.md, H200)
INVERSE_MAX_N_CUDA = 1024


def inverse_max_n(device: torch.device) -> int:
    """Points up to which the explicit inverse is kept on ``device``."""
    return INVERSE_MAX_N_CUDA if device.type == "cuda" else INVERSE_MAX_N


class InverseFactor:
    """``L⁻¹`` ``[R, cap, cap]`` (lower; zeros above the diagonal) of a capacity buffer of
    factors ``L`` ``[R, cap', cap']``, valid for its first ``n`` rows.

    Life cycle: :meth:`border` after every append of the factor (the first one at ``n = 0``
    starts it), :meth:`valid` before every use; :meth:`drop` forgets it until the next
    :meth:`restart` (a model reset). It remembers the factor tensor it was built for and that
    tensor's version counter: an in-place change of the factor by anyone else, or a new factor
    tensor, makes it stale. A deep copy of the model copies it with its factor (the copy's
    factor is the copied one, via the copy's memo)."""

    def __init__(self) -> None:
        self.inv: Tensor | None = None
        self.chol: Tensor | None = None   # the factor buffer it matches
        self.version = -1                 # ... at this version counter
        self.n = 0                        # ... for this many rows
        self.off = False     # dropped for good (until restart): a foreign change or n too large

    def __deepcopy__(self, memo: dict[int, Any]) -> InverseFactor:
        new = InverseFactor()
        new.off = self.off
        if self.inv is not None and self.chol is not None:
            new.inv = copy.deepcopy(self.inv, memo)
            new.chol = copy.deepcopy(self.chol, memo)
            new.version = new.chol._version if self.version == self.chol._version else -1
            new.n = self.n
        return new

    def restart(self) -> None:
        """Forget the inverse and allow a new one (the model is empty again, or its factor was
        loaded or moved: then it is rebuilt at the next use)."""
        self.inv, self.chol, self.version, self.off = None, None, -1, False

    def drop(self) -> None:
        """Forget the inverse until :meth:`restart`."""
        self.restart()
        self.off = True

    def valid(self, chol: Tensor, n: int) -> bool:
        """Whether the inverse matches ``chol``'s first ``n`` rows (``n ≥ 1``). A missing one (after
        a state load or a move) is rebuilt from the factor; a stale one (the factor changed
        otherwise than by :meth:`border`) or ``n >`` :func:`inverse_max_n` drops it until
        :meth:`restart`."""
        if self.off or n == 0:
            return False
        if n > inverse_max_n(chol.device):
            self.drop()
            return False
        if self.inv is None:
            self.rebuild(chol, n)
            return True
        if self.chol is not chol or self.version != chol._version or self.n != n:
            self.drop()
            return False
        return True

    def stale(self, chol: Tensor, n: int) -> bool:
        """Whether the inverse is dropped or would be at the next :meth:`valid` (the model's
        saved state says so: a loaded copy then scores as the original does)."""
        return self.off or n > inverse_max_n(chol.device) or (self.inv is not None and (
            self.chol is not chol or self.version != chol._version or self.n != n))

    def rebuild(self, chol: Tensor, n: int) -> None:
        """``L⁻¹`` of ``chol[:, :n, :n]`` from scratch: the appends' bordering steps replayed
        row by row (O(n³) per run), so the numbers are those the appends made."""
        self.inv = None
        for k in range(n):
            self.border(chol, chol[:, k, :k].contiguous(), chol[:, k, k].contiguous(), k)

    def ready_for_append(self, chol: Tensor, n: int) -> bool:
        """Whether :meth:`border` should follow the append of row ``n`` (an empty model starts
        a new inverse; otherwise it must be valid and stay within :data:`INVERSE_MAX_N`)."""
        if self.off:
            return False
        if n == 0:
            self.inv = None
            return True
        return n + 1 <= inverse_max_n(chol.device) and self.valid(chol, n)

    def matvec(self, n: int, rhs: Tensor) -> Tensor:
        """``L⁻¹ rhs`` ``[R, n, k]`` for ``rhs`` ``[R, n, k]``, as ``(rhsᵀ (L⁻¹)ᵀ)ᵀ`` (one batched
        product; with ``k = 1`` that orientation runs 3-4× faster on the CPU than ``L⁻¹ rhs``)."""
        assert self.inv is not None
        return torch.bmm(rhs.mT, self.inv[:, :n, :n].mT).mT

    def border(self, chol: Tensor, row: Tensor, d: Tensor, n: int) -> None:
        """The inverse of ``chol`` after its row ``n`` became ``(row [R, n], d [R])``."""
        r = row.shape[0]
        if self.inv is None:
            self.inv = row.new_zeros(r, max(16, n + 1), max(16, n + 1))
        inv = grow_rows(self.inv, n + 1, dims=(1, 2))
        if n:
            new = torch.bmm(row[:, None, :], inv[:, :n, :n])[:, 0]             # ℓᵀ L⁻¹, [R, n]
            inv[:, n, :n] = new.div_(d[:, None]).neg_()
        inv[:, n, n] = torch.reciprocal(d)
        self.inv = inv
        self.chol, self.version, self.n = chol, chol._version, n + 1

    def whiten_t(self, kq_t: Tensor, n: int, out: Tensor) -> Tensor:
        """``Vᵀ = K_CS (L⁻¹)ᵀ`` ``[R, A, n]`` of kernel rows ``kq_t`` ``[R, A, n]``, into ``out``."""
        assert self.inv is not None
        return torch.bmm(kq_t, self.inv[:, :n, :n].mT, out=out)


class Workspace:
    """Named flat buffers reused from call to call: :meth:`get` returns a contiguous view of the
    requested shape, growing the buffer (×2) when it is too small. Multi-MB temporaries
    allocated afresh every round are returned to the system and page-faulted again by the next
    round; these are not. A view stays valid until the next :meth:`get` of the same name."""

    def __init__(self) -> None:
        self.buffers: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A contiguous ``[*shape]`` view of buffer ``name`` (``like``'s dtype and device)."""
        size = 1
        for s in shape:
            size *= int(s)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < size or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(max(size, 2 * (buf.numel() if buf is not None else 0)),
                              dtype=like.dtype, device=like.device)
            self.buffers[name] = buf
        return buf[:size].view(shape)

    def clear(self) -> None:
        """Release every buffer."""
        self.buffers = {}

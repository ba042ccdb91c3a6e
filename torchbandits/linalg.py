"""Incremental dense linear algebra for kernel models.

Everything here is pure torch, batched where it can be, and follows the dtype and device of its
inputs. The updates are the ones the papers use:

* bordered (Schur-complement) inverse, Zenati et al. 2022 (App. E.1) / Flynn & Reeb 2024 (App. E.2,
  with the outer product where the paper prints a scalar);
* Cholesky append of one point (one triangular solve), Flynn & Reeb 2024, App. E.2;
* Cholesky removal of the *oldest* point, for sliding windows (Zhou & Shroff 2021): the trailing block of
  ``K + λI`` is ``L22 L22ᵀ + l21 l21ᵀ``, a rank-one *update* (never a downdate), done with the
  closed-form Cholesky factor of ``I + p pᵀ`` (Gill, Golub, Murray & Saunders 1974) in O(n²) with
  no Python loop over n;
* log-determinants from a factor, and a jittered Cholesky that retries with growing jitter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .buffers import ResizableModule

__all__ = [
    "GrowingCholesky",
    "bordered_inverse",
    "cholesky_append",
    "cholesky_rank_one_update",
    "cholesky_remove_first",
    "logdet_from_cholesky",
    "logdet_from_diagonal",
    "pivoted_cholesky",
    "safe_cholesky",
]


def bordered_inverse(a_inv: Tensor, b: Tensor, c: Tensor | float) -> Tensor:
    """Inverse of ``[[A, b], [bᵀ, c]]`` from ``A⁻¹`` (Schur complement).

    With ``q = A⁻¹ b`` and ``s = c − bᵀq`` the result is
    ``[[A⁻¹ + q qᵀ/s, −q/s], [−qᵀ/s, 1/s]]``. Costs O(n²). Raises if ``s`` is not positive
    (the bordered matrix is then not positive definite).
    """
    n = a_inv.shape[-1]
    q = a_inv @ b
    s = torch.as_tensor(c, dtype=a_inv.dtype, device=a_inv.device) - b @ q
    if not bool(s > 0):
        raise ValueError(f"bordered_inverse: Schur complement {float(s):.3e} is not positive")
    out = a_inv.new_empty(n + 1, n + 1)
    out[:n, :n] = a_inv + torch.outer(q, q) / s
    out[:n, n] = -q / s
    out[n, :n] = -q / s
    out[n, n] = 1.0 / s
    return out


def cholesky_append(chol: Tensor, b: Tensor, c: Tensor | float) -> tuple[Tensor, Tensor]:
    """New last row of the lower Cholesky factor when a point is appended.

    ``chol`` is the ``n×n`` lower factor of ``A``; the bordered matrix is ``[[A, b], [bᵀ, c]]``.
    Returns ``(l, d)`` with ``l = chol⁻¹ b`` and ``d = sqrt(c − lᵀl)`` so that the new factor is
    ``[[chol, 0], [lᵀ, d]]``. One triangular solve: O(n²).
    """
    if chol.shape[-1] == 0:
        l_row = b.new_zeros(0)
    else:
        l_row = torch.linalg.solve_triangular(chol, b.unsqueeze(-1), upper=False).squeeze(-1)
    d2 = torch.as_tensor(c, dtype=b.dtype, device=b.device) - l_row @ l_row
    if not bool(d2 > 0):
        raise ValueError(f"cholesky_append: new pivot {float(d2):.3e} is not positive")
    return l_row, torch.sqrt(d2)


def cholesky_rank_one_update(chol: Tensor, v: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Lower Cholesky factor of ``L Lᵀ + v vᵀ`` in O(n²) without a loop over n.

    Write ``L Lᵀ + v vᵀ = L (I + p pᵀ) Lᵀ`` with ``p = L⁻¹ v``. The factor ``G`` of ``I + p pᵀ``
    is known in closed form: with ``t_0 = 1``, ``t_j = 1 + Σ_{k≤j} p_k²``,
    ``G_jj = sqrt(t_j / t_{j−1})`` and ``G_ij = p_i p_j / sqrt(t_{j−1} t_j)`` for ``i > j``.
    Then ``(L G)_ij = L_ij G_jj + (Σ_{k>j} L_ik p_k) p_j / sqrt(t_{j−1} t_j)``.
    ``out`` (``n×n``, may not alias ``chol``) receives the result without further n×n temporaries.
    """
    if chol.shape[-1] == 0:
        return chol.clone()
    p = torch.linalg.solve_triangular(chol, v.unsqueeze(-1), upper=False).squeeze(-1)
    return _rank_one_factor_into(chol, p, chol.new_empty(chol.shape) if out is None else out)


def _rank_one_factor_into(chol: Tensor, p: Tensor, out: Tensor) -> Tensor:
    """``out ← L G`` for ``G Gᵀ = I + p pᵀ`` (see :func:`cholesky_rank_one_update`); one n×n buffer.

    The tail sums ``Σ_{k>j} L_ik p_k`` are the row totals minus the inclusive prefix sums.
    """
    t = 1.0 + torch.cumsum(p * p, dim=0)
    t_prev = torch.cat([t.new_ones(1), t[:-1]])
    g_diag = torch.sqrt(t / t_prev)
    g_off = p / torch.sqrt(t_prev * t)
    torch.mul(chol, p, out=out)  # L_ik p_k
    out.cumsum_(dim=-1)  # Σ_{k≤j}
    totals = out[:, -1:].clone()
    out.neg_().add_(totals)  # Σ_{k>j}
    out.mul_(g_off).addcmul_(chol, g_diag.expand_as(chol))
    return out.tril_()


def cholesky_remove_first(chol: Tensor) -> Tensor:
    """Factor of ``A[1:, 1:]`` from the lower factor ``L`` of ``A``, in O(n²).

    ``A[1:, 1:] = L[1:, 1:] L[1:, 1:]ᵀ + L[1:, 0] L[1:, 0]ᵀ``: a rank-one update.
    """
    return cholesky_rank_one_update(chol[1:, 1:], chol[1:, 0])


def logdet_from_diagonal(diag: Tensor) -> Tensor:
    """``log det(L Lᵀ) = 2 Σ_i log L_ii`` from the diagonal ``[..., n]`` of a Cholesky factor
    (the one place this sum is written; batched over leading dimensions)."""
    return 2.0 * torch.log(diag).sum(-1)


def logdet_from_cholesky(chol: Tensor) -> Tensor:
    """``log det(L Lᵀ) = 2 Σ log L_ii`` of a dense lower factor ``[..., n, n]``."""
    return logdet_from_diagonal(torch.diagonal(chol, dim1=-2, dim2=-1))


def safe_cholesky(a: Tensor, jitter: float = 0.0, max_tries: int = 6) -> tuple[Tensor, float]:
    """Lower Cholesky factor of ``a + jitter·I``, growing the jitter ×10 on failure.

    Starts with ``jitter`` (0 means "try without first, then 1e-10 × mean diagonal").
    Returns the factor and the jitter actually used; raises ``RuntimeError`` after ``max_tries``.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    scale = float(torch.diagonal(a).abs().mean()) if a.shape[-1] else 1.0
    current = jitter
    for _ in range(max_tries):
        chol, info = torch.linalg.cholesky_ex(a + current * eye if current else a)
        if int(info) == 0:
            return chol, current
        current = max(current * 10.0, 1e-10 * max(scale, 1e-300))
    raise RuntimeError(
        f"safe_cholesky: matrix not positive definite even with jitter {current:.3e}"
        f" ({max_tries} tries)"
    )


def pivoted_cholesky(a: Tensor, rel_tol: float = 1e-14) -> tuple[Tensor, Tensor]:
    """Greedy (diagonal-pivoted) Cholesky of a PSD ``a`` ``[m, m]`` stopped at a small pivot:
    ``a[piv][:, piv] ≈ L Lᵀ`` with ``L`` ``[r, r]`` lower and ``piv`` ``[r]`` the rows taken, in
    order of decreasing residual; it stops once every remaining residual variance (Schur-complement
    diagonal) is ``≤ rel_tol · max_i a_ii``, so the ``m − r`` rows left out lie in the span of the
    ``r`` taken to that accuracy. LAPACK ``?pstrf`` (through SciPy, on the CPU; the result goes back
    to ``a``'s device). For numerically singular kernel matrices, where plain Cholesky fails."""
    from scipy.linalg.lapack import get_lapack_funcs

    arr = a.detach().to("cpu").numpy()
    pstrf = get_lapack_funcs("pstrf", (arr,))
    scale = float(arr.diagonal().max()) if arr.shape[0] else 1.0
    u, piv, rank, info = pstrf(arr, lower=1, tol=rel_tol * scale)
    if info < 0:
        raise RuntimeError(f"pivoted_cholesky: LAPACK pstrf failed (info={info})")
    chol = torch.from_numpy(u[:rank, :rank]).tril_().to(a.device)
    return chol, torch.from_numpy(piv[:rank].astype("int64") - 1).to(a.device)


def log1p_safe(x: Tensor) -> Tensor:
    """``log(1 + x)`` clamped at ``x ≥ 0`` (round-off can make variances slightly negative)."""
    return torch.log1p(torch.clamp(x, min=0.0))


class GrowingCholesky(ResizableModule):
    """Lower Cholesky factor ``L`` of a growing SPD matrix, appended one row at a time.

    LAPACK's triangular solves are fast only on a *contiguous* factor: a slice of a capacity
    buffer makes torch copy the whole ``n×n`` block on every solve. So the factor is stored in
    two parts: a contiguous ``head`` (``n0×n0``) and a ``tail`` of at most ``block`` recent rows
    (``[block, n0 + block]``; row ``i`` holds ``[L21_i, L22_i]``). A solve is
    ``x1 = head⁻¹ b1``, ``x2 = L22⁻¹ (b2 − L21 x1)``. Every ``block`` appends the tail is folded
    into a new contiguous head (an O(n²) copy, amortised to O(n²/block) per append). Appending is
    one solve, O(n²); removing the oldest row is :func:`cholesky_remove_first`, O(n²).
    """

    def __init__(self, block: int = 64, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.block = int(block)
        self.register_buffer("head", torch.zeros(0, 0, dtype=dtype))
        self.register_buffer("tail", torch.zeros(self.block, self.block, dtype=dtype))
        self.m = 0  # rows in the tail
        self._spare: Tensor | None = None  # storage of a retired head, reused for the next one

    # -- state ---------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Size n of the factored matrix."""
        return self.head.shape[0] + self.m

    def get_extra_state(self) -> dict:
        return {"m": self.m, "block": self.block}

    def set_extra_state(self, state: dict) -> None:
        self.m = int(state["m"])
        self.block = int(state["block"])

    def reset(self) -> None:
        """Forget every row (n = 0), keeping dtype and device."""
        self.head = self.head.new_zeros(0, 0)
        self.tail = self.head.new_zeros(self.block, self.block)
        self.m = 0
        self._spare = None

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._spare = None
        return super()._apply(fn, *args, **kwargs)

    def set_dense(self, chol: Tensor) -> None:
        """Replace the factor by the dense lower-triangular ``chol``."""
        self._install(chol.to(dtype=self.head.dtype, device=self.head.device).contiguous())

    def _carve(self, k: int) -> Tensor:
        """A contiguous ``k×k`` matrix on the spare storage (allocated only when it is too small).

        Repeated fold / remove cycles then reuse two storages instead of page-faulting fresh
        n×n temporaries every round (sliding windows).
        """
        spare, need = self._spare, k * k
        self._spare = None
        if spare is None or spare.numel() < need or spare.dtype != self.head.dtype \
                or spare.device != self.head.device:
            spare = self.head.new_empty(need + need // 4 + 1)
        return spare[:need].view(k, k)

    def _install(self, new_head: Tensor) -> None:
        """Make ``new_head`` the factor (empty tail); keep the old head's storage as the spare."""
        old = self.head
        base = old._base if old._base is not None else old
        self.head = new_head
        width = new_head.shape[0] + self.block
        if self.tail.shape[1] >= width and self.tail.shape[1] <= width + 4 * self.block:
            self.tail.zero_()
        else:
            self.tail = new_head.new_zeros(self.block, width)
        self.m = 0
        if base.numel() and base.is_contiguous() and base.data_ptr() != new_head.data_ptr():
            self._spare = base.reshape(-1)

    def _fold(self) -> None:
        """Fold the tail rows into a new contiguous head."""
        n0, m = self.head.shape[0], self.m
        out = self._carve(n0 + m)
        out[:n0, :n0] = self.head
        out[:n0, n0:].zero_()   # (zero_: a set item with a Python scalar syncs on CUDA)
        out[n0:, :] = self.tail[:m, : n0 + m]
        self._install(out)

    def dense(self) -> Tensor:
        """The full ``n×n`` factor (a copy)."""
        n0, m = self.head.shape[0], self.m
        out = self.head.new_zeros(n0 + m, n0 + m)
        out[:n0, :n0] = self.head
        out[n0:, :] = torch.tril(self.tail[:m, : n0 + m], diagonal=n0)
        return out

    def diagonal(self) -> Tensor:
        """Diagonal of the lower factor L, shape ``[n]``."""
        n0, m = self.head.shape[0], self.m
        tail_diag = self.tail[torch.arange(m), n0 + torch.arange(m)] if m else self.head.new_zeros(0)
        return torch.cat([torch.diagonal(self.head), tail_diag])

    def rows(self, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of ``L`` restricted to columns ``:stop``, shape ``[stop−start, stop]``."""
        n0 = self.head.shape[0]
        if start >= n0:
            return self.tail[start - n0 : stop - n0, :stop]
        return self.dense()[start:stop, :stop]

    # -- operations ----------------------------------------------------------------------------
    def solve(self, rhs: Tensor) -> Tensor:
        """``L⁻¹ rhs`` for ``rhs`` of shape ``[n]`` or ``[n, k]``: ``x1 = head⁻¹ b1`` and
        ``x2 = L22⁻¹ (b2 − L21 x1)``, one solve when the head or the tail is empty. (Solving into
        a preallocated output instead of concatenating measured slower: torch copies a
        row-major ``out`` through a temporary.)"""
        vec = rhs.ndim == 1
        b = rhs.unsqueeze(-1) if vec else rhs
        n0, m = self.head.shape[0], self.m
        if not m:
            x = torch.linalg.solve_triangular(self.head, b, upper=False) if n0 else b[:0]
        elif not n0:
            x = torch.linalg.solve_triangular(self.tail[:m, :m], b, upper=False)
        else:
            x1 = torch.linalg.solve_triangular(self.head, b[:n0], upper=False)
            r2 = b[n0:] - self.tail[:m, :n0] @ x1
            x2 = torch.linalg.solve_triangular(self.tail[:m, n0 : n0 + m], r2, upper=False)
            x = torch.cat([x1, x2], dim=0)
        return x.squeeze(-1) if vec else x

    def append(self, row: Tensor, pivot: Tensor) -> None:
        """Append ``[row, pivot]`` as the new last row (``row = L⁻¹ b``, ``pivot = d``)."""
        n0, m = self.head.shape[0], self.m
        if m == self.block:
            self._fold()
            n0, m = self.head.shape[0], 0
        assert self.tail.shape[1] >= n0 + self.block, "tail width out of sync with head"
        trow = self.tail[m]
        trow[: n0 + m] = row
        trow[n0 + m : n0 + m + 1].fill_(pivot)
        self.m = m + 1

    def layout(self) -> tuple[Tensor, Tensor]:
        """``(head, tail)`` read from the module's buffer table (not through
        ``nn.Module.__getattr__``, ~1.6 µs a read: a compiled step reads them every round)."""
        bufs = self._buffers
        return bufs["head"], bufs["tail"]  # type: ignore[return-value]

    def open_row(self) -> int:
        """Make room for the next row (folding a full tail, as :meth:`append` does) and return
        the address of its storage: ``n + 1`` float entries of the contiguous ``tail`` (the row
        ``[L21, L22]`` then the pivot) that a compiled append writes before :meth:`close_row`."""
        if self.m == self.block:
            self._fold()
        head, tail = self.layout()
        width = tail.shape[1]
        assert width >= head.shape[0] + self.block, "tail width out of sync with head"
        return tail.data_ptr() + self.m * width * tail.element_size()

    def close_row(self) -> None:
        """Count the row written at :meth:`open_row`'s address (a plain attribute, set without
        ``nn.Module.__setattr__``'s checks)."""
        object.__setattr__(self, "m", self.m + 1)

    def append_point(self, b: Tensor, c: Tensor | float) -> tuple[Tensor, Tensor]:
        """Border the matrix with column ``b`` and diagonal ``c``; returns ``(L⁻¹b, d)``."""
        n = self.n
        row = self.solve(b) if n else b.new_zeros(0)
        d2 = torch.as_tensor(c, dtype=b.dtype, device=b.device) - row @ row
        if not bool(d2 > 0):
            raise ValueError(f"GrowingCholesky: new pivot {float(d2):.3e} is not positive")
        d = torch.sqrt(d2)
        self.append(row, d)
        return row, d

    def remove_first(self) -> Tensor:
        """Drop the first row and column of the factored matrix (oldest point), O(n²).

        Returns ``p = L22⁻¹ l21``: the new factor is ``L22 G`` with ``G Gᵀ = I + p pᵀ``, which
        is what a caller needs to carry its own solves ``L⁻¹ B`` through the removal.
        """
        if self.n == 0:
            raise ValueError("GrowingCholesky.remove_first: the factor is empty")
        if self.m:
            self._fold()
        chol = self.head
        n = chol.shape[0]
        # p = L22⁻¹ l21 from the contiguous full factor: L [0; p] = [0; l21]
        rhs = chol.new_zeros(n, 1)
        rhs[1:, 0] = chol[1:, 0]
        p = torch.linalg.solve_triangular(chol, rhs, upper=False)[1:, 0]
        out = self._carve(n - 1)
        if n > 1:
            _rank_one_factor_into(chol[1:, 1:], p, out)
        self._install(out)
        return p

    def logdet(self) -> Tensor:
        """``log det(L Lᵀ)``."""
        return logdet_from_diagonal(self.diagonal())

"""Storage, sizes and kernel evaluations of :class:`~torchbandits.models.batched_nystrom.BatchedNystrom`
(``R`` runs of the whitened Nyström posterior, each on its own dictionary; the math and the padding
are stated there). Buffers, zero beyond each run's size ``m_r``: anchors ``_z`` ``[R, cap_m, d]``,
``_p = P`` and ``_q = Q`` ``[R, cap_m, cap_m]``, ``_g`` ``[R, cap_m]``, embeddings ``_e``
``[R, cap_n, cap_m]``; data ``_x`` ``[R, cap_n, d]``, counts ``_c`` and sums ``_s`` ``[R, cap_n]``;
sizes ``_m`` ``[R]``, ``log det A`` ``_logdet`` ``[R]``, refusals ``_refused`` ``[R]``.

On the compiled CPU path (:mod:`torchbandits.native.ekucb`) an append's Sherman–Morrison step of
``Q`` is deferred (``_pending``) and applied by the next compiled score in its own pass over
``Q`` (one stream of ``Q`` a round fewer). No reader can see the stored ``Q`` without that step:
``_q`` is a property that applies it first (``_flush_q``); the paths of ``nn.Module`` that read
the buffers directly (``state_dict``, ``.to``/``_apply``, ``named_buffers``/``buffers``) and
:meth:`~BatchedNystromState.permute` flush first too (a parent's ``named_buffers`` reads this
module's buffers directly: EK-UCB's calls :meth:`~BatchedNystromState.apply_deferred` first);
only the flush itself, the compiled score and a compacted border (after flushing its runs) take
the stored tensor (``_q_stored``). With :attr:`~BatchedNystromState.debug_stale_q` the stored
``Q`` is NaN while a step is pending (its values kept aside and put back by the flush): a reader
that bypassed the flush reads NaN (the tests run whole batches so and compare them with the
normal runs).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.kernels import Kernel, RBFKernel
from torch import Tensor

from ..buffers import SLOW_GROWTH, ResizableModule, grow_rows, set_plain
from ..kernels import kernel_bound, kernel_diag, kernel_matrix, pairwise_sq_dist
from ..native import ekucb as native_ekucb

__all__ = ["BatchedNystromState", "batched_kernel"]


class _Kernel:
    """Batched kernel blocks ``[R, na, nb]``: an isotropic RBF as the sequential model evaluates
    it (``exp(c·‖a − b‖²)``, :func:`~torchbandits.kernels.pairwise_sq_dist`), any other kernel by
    :func:`~torchbandits.kernels.kernel_matrix`."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.const = kernel_bound(kernel)
        self.rbf_c: float | None = None
        if type(kernel) is RBFKernel and kernel.active_dims is None and kernel.lengthscale.numel() == 1:
            self.rbf_c = -0.5 / float(kernel.lengthscale) ** 2

    def block(self, a: Tensor, b: Tensor) -> Tensor:
        """``k(a_i, b_j)`` ``[R, na, nb]`` of ``a`` ``[R, na, d]`` and ``b`` ``[R, nb, d]``. The
        RBF's exponent ``c·‖a − b‖²`` is compiled where that keeps ``cdist``'s numbers to the bit
        (:func:`torchbandits.native.ekucb.rbf_exponent`: float64 CPU, ``d ≤ 2``; one pass instead
        of ``cdist``, ``square_`` and ``mul_``), the ``exp_`` is torch's either way."""
        if self.rbf_c is not None:
            e = native_ekucb.rbf_exponent(a, b, self.rbf_c)
            if e is None:
                e = pairwise_sq_dist(a, b).mul_(self.rbf_c)
            return e.exp_()
        return kernel_matrix(self.kernel, a, b)

    def compiled_block(self, a: Tensor, b: Tensor) -> Tensor:
        """:meth:`block` for the compiled score: an RBF's whole block in C where it qualifies
        (:func:`torchbandits.native.ekucb.rbf_block`: its exponential within about an ulp of
        torch's, not bit for bit — like the compiled products it feeds), else :meth:`block`."""
        out = None if self.rbf_c is None else native_ekucb.rbf_block(a, b, self.rbf_c)
        return self.block(a, b) if out is None else out

    def diag(self, a: Tensor) -> Tensor:
        """``k(a_i, a_i)`` of ``a`` ``[..., n, d]`` → ``[..., n]``."""
        if self.const is not None:
            return a.new_full(a.shape[:-1], self.const)
        return kernel_diag(self.kernel, a.reshape(-1, a.shape[-1])).reshape(a.shape[:-1])


def batched_kernel(kernel: Kernel) -> _Kernel:
    """The batched kernel evaluator of :class:`~torchbandits.models.batched_nystrom.BatchedNystrom`
    (``.block(a, b)`` ``[R, na, nb]``, ``.diag(a)``)."""
    return _Kernel(kernel)


class BatchedNystromState(ResizableModule):
    """The storage of :class:`~torchbandits.models.batched_nystrom.BatchedNystrom` (see there for
    the arguments).
    """

    def __init__(self, kernel: Kernel, lam: float, n_runs: int, *, jitter: float = 0.0,
                 min_residual: float = 1e-8, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if int(n_runs) < 1:
            raise ValueError(f"n_runs must be >= 1, got {n_runs}")
        r = int(n_runs)
        self.lam, self.jitter, self.min_residual = float(lam), float(jitter), float(min_residual)
        self.kernel = kernel.to(dtype=dtype, device=device)
        self._k = _Kernel(self.kernel)
        # a deferred Sherman–Morrison step of Q (a, b [R, w], flags [R] int64; see _flush_q),
        # and Q's values while it is pending under debug_stale_q (set before "_q" is registered:
        # registering reads the property)
        self._pending: tuple[Tensor, Tensor, Tensor] | None = None
        self._q_kept: Tensor | None = None
        z = dict(dtype=dtype, device=device)
        self.register_buffer("_m", torch.zeros(r, dtype=torch.long, device=device))
        self.register_buffer("_z", torch.zeros(r, 16, 0, **z))
        self.register_buffer("_p", torch.zeros(r, 16, 16, **z))
        self.register_buffer("_q", torch.zeros(r, 16, 16, **z))
        self.register_buffer("_g", torch.zeros(r, 16, **z))
        self.register_buffer("_x", torch.zeros(r, 16, 0, **z))
        self.register_buffer("_c", torch.ones(r, 16, **z))
        self.register_buffer("_s", torch.zeros(r, 16, **z))
        self.register_buffer("_e", torch.zeros(r, 16, 16, **z))
        self.register_buffer("_logdet", torch.zeros(r, **z))
        self.register_buffer("_refused", torch.zeros(r, dtype=torch.long, device=device))
        self._n = 0
        self._mmax = 0
        self._version = 0   # bumped by every change: keys the columns of the last score
        self._chunks = [(a, min(a + self.CHUNK, r), 0) for a in range(0, r, self.CHUNK)]
        self._row_cache: dict[tuple[int, int], Tensor] = {}
        self._eye: Tensor | None = None
        self._p_lower = True   # every P_r lower triangular (not after a pivoted rebuild)
        self._unit_counts = True   # every count is 1 (EK-UCB's; not after a rebuild with counts)
        self._scored: tuple[int, Tensor, list[Any]] | None = None   # (columns per chunk)
        self._scored_full: tuple[int, Tensor, Tensor, Tensor, Tensor] | None = None   # (compiled)

    #: plain attributes set every round: stored past ``nn.Module.__setattr__``'s checks
    #: (:func:`~torchbandits.buffers.set_plain`; a dozen such sets a round)
    _PLAIN = frozenset({"_version", "_n", "_pending", "_q_kept", "_scored", "_scored_full",
                        "_mmax", "_chunks"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._PLAIN:
            set_plain(self, name, value)
        else:
            super().__setattr__(name, value)

    # ------------------------------------------------------------------ sizes / state
    @property
    def n_runs(self) -> int:
        """Number of runs R."""
        return int(self._m.shape[0])

    @property
    def n(self) -> int:
        """Data points per run (common to all runs)."""
        return self._n

    @property
    def sizes(self) -> Tensor:
        """Dictionary sizes ``m_r`` ``[R]`` (a view)."""
        return self._m

    @property
    def kernel_constant(self) -> float | None:
        """``k(x, x)`` when the kernel makes it a constant (stationary), else ``None``."""
        return self._k.const

    @property
    def max_size(self) -> int:
        """``M ≥ max_r m_r``, the width every round works on (exact after
        :meth:`refresh_widths`, an upper bound after :meth:`bump_widths`)."""
        return self._mmax

    #: runs per chunk of the per-chunk widths (:meth:`chunks`)
    CHUNK = 16

    def chunks(self) -> list[tuple[int, int, int]]:
        """``(a, b, W_g)``: the runs ``a..b−1`` in chunks of :attr:`CHUNK` and each chunk's width
        ``W_g ≥ max m_r`` over it (host integers, no read). Rounds work chunk by chunk on
        ``[:W_g]`` slices, exact by the zero padding, so a chunk of small dictionaries does not pay
        for the largest one; :meth:`permute` (runs sorted by size) makes the chunks homogeneous.
        The widths are exact after :meth:`refresh_widths` (one read of the sizes) and upper
        bounds after :meth:`bump_widths` (every run may have grown by one anchor)."""
        return self._chunks

    def refresh_widths(self) -> None:
        """Exact widths from the sizes: **one host read** (``tolist``), so a sync-free round does
        not call it (EK-UCB calls it every :data:`~torchbandits.policies.ekucb_batched.CHECK_EVERY`
        rounds on a device, every round where the accepted runs are compacted on the CPU)."""
        sizes = self._m.tolist()
        step = self.CHUNK
        self._chunks = [(a, min(a + step, len(sizes)), max(sizes[a:a + step]))
                        for a in range(0, len(sizes), step)]
        self._mmax = max(sizes) if sizes else 0

    def bump_widths(self) -> None:
        """Every run may have gained one anchor (no read): each width grows by one, at most to
        ``n`` (a run has at most as many anchors as points)."""
        n = self._n
        self._chunks = [(a, b, min(w + 1, n)) for a, b, w in self._chunks]
        self._mmax = max(w for _, _, w in self._chunks)

    def chunked_cost(self, order: Tensor | None = None) -> int:
        """``Σ_g (b − a)·M_g²`` of the chunks at the exact sizes (with the runs in ``order``, if
        given; one host read)."""
        sizes = (self._m if order is None else self._m[order]).tolist()
        step = self.CHUNK
        return sum(len(sizes[a:a + step]) * max(sizes[a:a + step]) ** 2
                   for a in range(0, len(sizes), step))

    def permute(self, order: Tensor) -> None:
        """Reorder the runs: new run ``i`` is old run ``order[i]`` (every per-run buffer; the
        widths are refreshed: one host read)."""
        self._flush_q()
        for name, buf in list(self._buffers.items()):
            if buf is not None:
                self._buffers[name] = buf.index_select(0, order.to(buf.device))
        self._version += 1
        self.refresh_widths()

    @property
    def refused(self) -> Tensor:
        """Anchors refused by the ``min_residual`` guard, per run ``[R]``."""
        return self._refused

    @property
    def dtype(self) -> torch.dtype:
        return self._c.dtype

    @property
    def device(self) -> torch.device:
        return self._c.device

    def dictionary(self, run: int) -> Tensor:
        """Anchors of run ``run`` ``[m_r, d]`` (a view)."""
        return self._z[run, : int(self._m[run])]

    @property
    def x(self) -> Tensor:
        """Stored points ``[R, n, d]`` (a view)."""
        return self._x[:, : self._n]

    def log_det(self) -> Tensor:
        """``log det(I + K̃_r/λ) = log det A_r − m_r log λ`` ``[R]``."""
        return self._logdet - self._m.to(self.dtype) * math.log(self.lam)

    def get_extra_state(self) -> dict[str, Any]:
        return {"n": self._n, "widths": [w for _, _, w in self._chunks], "p_lower": self._p_lower,
                "unit_counts": self._unit_counts}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restores ``n`` and the chunk widths (so a reloaded batch computes at the same widths,
        the same numbers to the bit), or reads the exact widths from the sizes."""
        self._n = int(state["n"])
        self._drop_pending()   # the loaded Q is complete
        self._p_lower = bool(state.get("p_lower", False))
        self._unit_counts = bool(state.get("unit_counts", False))
        self._version += 1
        self.refresh_widths()
        widths = state.get("widths")
        if widths is not None and len(widths) == len(self._chunks):
            self._chunks = [(a, b, int(w)) for (a, b, _), w in zip(self._chunks, widths,
                                                                  strict=True)]
            self._mmax = max(int(w) for w in widths)

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._flush_q()
        out = super()._apply(fn, *args, **kwargs)
        self._k = _Kernel(self.kernel)
        self._version += 1
        return out

    def reset(self) -> None:
        """Forget the data and the dictionaries of every run."""
        self._n = 0
        self._version += 1
        self._drop_pending()
        for buf in (self._m, self._p, self._q, self._g, self._e, self._logdet, self._refused):
            buf.zero_()
        self._c.fill_(1.0)
        self._p_lower = True
        self._unit_counts = True
        self._chunks = [(a, b, 0) for a, b, _ in self._chunks]
        self._mmax = 0

    def _rows(self, idx: slice | Tensor) -> Tensor:
        if isinstance(idx, Tensor):
            return idx
        key = (idx.start, idx.stop)
        rows = self._row_cache.get(key)
        if rows is None or rows.device != self.device:
            rows = self._row_cache[key] = torch.arange(idx.start, idx.stop, device=self.device)
        return rows

    def _flags(self, idx: slice | Tensor, bad: Tensor) -> Tensor:
        """Per-run flags ``[R]`` of the runs ``idx`` (``bad`` ``[k]``), false elsewhere."""
        if isinstance(idx, slice) and idx.start == 0 and idx.stop == self.n_runs:
            return bad
        return torch.zeros(self.n_runs, dtype=torch.bool, device=self.device).index_put_(
            (self._rows(idx),), bad)

    def _unit(self, pos: Tensor, width: int) -> Tensor:
        """Unit rows ``e_pos`` ``[k, width]`` (one gather from a cached identity)."""
        eye = self._eye
        if eye is None or eye.shape[0] < width or eye.device != self.device \
                or eye.dtype != self.dtype:
            eye = self._eye = torch.eye(max(width, 2 * self._p.shape[1]), dtype=self.dtype,
                                        device=self.device)
        return eye[:width, :width][pos]

    # ------------------------------------------------------------------ Q and its deferred step
    #: debugging: while a step of ``Q`` is pending, the stored ``Q`` is NaN (its values kept
    #: aside until the flush), so that a reader that bypasses the flush reads NaN (module
    #: docstring; costs a copy of ``Q`` per append: for tests)
    debug_stale_q = False

    @property
    def _q(self) -> Tensor:
        """``Q`` ``[R, cap_m, cap_m]`` with the deferred step applied (reading it flushes)."""
        self._flush_q()
        return self._q_stored()

    def _q_stored(self) -> Tensor:
        """The stored ``Q``, behind the deferred step while one is pending: only for the flush,
        the compiled score (which applies the step in its pass) and a compacted border (after
        flushing its runs); every other reader takes :attr:`_q`."""
        try:
            return self._buffers["_q"]
        except KeyError:
            raise AttributeError("_q") from None

    def _defer_q_step(self, a: Tensor, b: Tensor) -> None:
        """Defer ``Q_r −= a_r b_rᵀ`` (``a``, ``b`` ``[R, w]``, every run) to the next flush or
        compiled score (:meth:`_flush_q`); any earlier step must have been applied."""
        assert self._pending is None, "a deferred step of Q is still pending"
        self._pending = (a.contiguous(), b.contiguous(), self._m.new_ones(a.shape[0]))
        if self.debug_stale_q:
            q = self._q_stored()
            self._q_kept = q.clone()
            q.fill_(math.nan)

    def _drop_pending(self) -> None:
        """Forget a deferred step (``Q`` is about to be replaced as a whole)."""
        self._pending = None
        self._q_kept = None

    def _flush_q(self, runs: Tensor | None = None) -> None:
        """Apply the deferred Sherman–Morrison step ``Q_r −= a_r b_rᵀ`` of the last append (the
        compiled path defers it, and the next compiled score applies it in its own pass over
        ``Q``) to every run, or to the distinct ``runs`` (a LongTensor) only. Reading
        :attr:`_q` calls this; a run's size does not change while its step is pending."""
        pend = self._pending
        if pend is None:
            return
        a, b, flags = pend
        q = self._q_stored()
        if runs is not None:
            runs = runs[flags[runs] != 0]   # (a read: the CPU's compacted growth only)
        if self._q_kept is not None:        # debug_stale_q: Q's values back first
            live = flags != 0 if runs is None else runs
            q[live] = self._q_kept[live]
        if not native_ekucb.rank_one_sub(q, a, b, self._m, runs):
            w = a.shape[1]
            a = a * flags.to(a.dtype)[:, None]
            if runs is None:
                q[:, :w, :w].addcmul_(a[:, :, None], b[:, None, :], value=-1.0)
            else:
                q[runs, :w, :w] = q[runs, :w, :w].addcmul_(
                    a[runs, :, None], b[runs, None, :], value=-1.0)
        if runs is None:
            self._drop_pending()
        else:   # done: a zero step (Q − 0·bᵀ = Q) for a later pass over every run
            flags.index_fill_(0, runs, 0)
            pend[0].index_fill_(0, runs, 0.0)

    def apply_deferred(self) -> None:
        """Apply a deferred step of ``Q`` now: for a parent module's generic readers, which read
        this module's buffers directly (a parent's ``named_buffers``/``buffers``)."""
        self._flush_q()

    def named_buffers(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def,override]
        """``nn.Module.named_buffers`` (and ``buffers``) with ``Q`` flushed first."""
        self._flush_q()
        return super().named_buffers(*args, **kwargs)

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[no-untyped-def]
        self._flush_q()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _ensure(self, n: int, m: int, d: int) -> None:
        """Capacity for ``n`` points and ``m`` anchors of dimension ``d`` (zero padding)."""
        x, e, p = self._x, self._e, self._p
        if x.shape[2] == d and n <= e.shape[1] and m <= e.shape[2] and m <= p.shape[1] \
                and n <= x.shape[1] and m <= self._z.shape[1]:
            return
        if self._x.shape[2] != d:
            self._x = self._c.new_zeros(self.n_runs, self._x.shape[1], d)
            self._z = self._c.new_zeros(self.n_runs, self._z.shape[1], d)
        old = self._c.shape[1]
        self._x = grow_rows(self._x, n, dims=(1,))
        self._c = grow_rows(self._c, n, dims=(1,))
        self._c[:, old:].fill_(1.0)   # (fill_: a set item would copy from the host and sync)
        self._s = grow_rows(self._s, n, dims=(1,))
        self._e = grow_rows(self._e, n, dims=(1,))
        self._z = grow_rows(self._z, m, dims=(1,), **SLOW_GROWTH)
        self._p = grow_rows(self._p, m, dims=(1, 2), **SLOW_GROWTH)
        self._q = grow_rows(self._q, m, dims=(1, 2), **SLOW_GROWTH)
        self._g = grow_rows(self._g, m, dims=(1,), **SLOW_GROWTH)
        self._e = grow_rows(self._e, m, dims=(2,), **SLOW_GROWTH)

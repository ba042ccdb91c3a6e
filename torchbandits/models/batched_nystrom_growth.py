"""The sync-free growth of EK-UCB's dictionaries (Zenati et al. 2022, Algorithms 2 and 4): the
posterior's border (:class:`~torchbandits.models.batched_nystrom.BatchedNystrom`) and the KORS
sampler's (:class:`~torchbandits.models.batched_kors.BatchedKORS`) of every run at once, with
masked writes (a run that does not grow writes zeros into its zero padding) and no host read.

Per run ``r`` that accepts the last appended point ``z`` and passes the ``min_residual`` guard
(``ω > min_residual·k(z,z)``), with its embedding ``f = e(z)`` ``[w]``, ``d = √ω``, the new
embedding column ``e = (k_S(z) − E f)/d`` ``[n]``, ``b = Eᵀ C e``:

* ``P`` gains the row ``[−Pᵀf/d, 1/d]``; ``E`` the column ``e``; ``g`` the entry ``eᵀs``;
* ``Q ← Q + u uᵀ/s`` with ``u = [Qb; −1]`` and ``s = eᵀCe + λ − bᵀQb`` (the update, the border
  ``−Qb/s`` and the corner ``1/s`` at once); ``log det A += log s``;
* KORS: ``N ← N + v vᵀ/s'`` with ``v = [N k_Z; −1]``, ``s' = k(z,z) + μ p̃ − k_Zᵀ N k_Z``, and
  ``p̃`` gains the entry ``p̃``.

Two ways (:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.add_last`):
:meth:`grow_compacted` borders only the runs that grow, gathered by one host read (the CPU's
way once the border is large); :meth:`grow_masked` borders every run with masked writes (a GPU's
way: no read). In the masked one a refused run has ``d = ∞`` and ``1/s = 1/s' = 0``: its row,
column and rank-one terms are zero. Both compute each quantity by the same arithmetic on the
same shapes (the sequential model's orientations of the products), so the numbers are the
same; what differs is how
many operators carry it (each launches a kernel on a GPU): the two Schur complements, their
checks, inverses and rank-one factors are one ``[2, k]`` / ``[k, 2, w+1]`` tensor; the three
bordered vectors ``Pᵀf``, ``Qb``, ``N k_Z`` are padded and given their ``−1`` by one ``cat``
and one indexed write; ``P``'s row is one write; ``KORS``'s ``N k_Z`` and ``k_Zᵀ N k_Z`` are
those of the round's probability (:meth:`~torchbandits.models.batched_kors.BatchedKORS.border_terms`);
``−Pᵀf`` is one product with ``α = −1`` (an exact negation), so ``P``'s row is ``[−Pᵀf; 1]/d``;
with unit counts (EK-UCB's) ``C e`` is ``e``.

On the CPU in float64 :meth:`grow_compacted` is one compiled call instead (:meth:`_grow_compiled`,
:func:`torchbandits.native.ekucb.grow`): the guard, the deferred step of ``Q`` and each growing
run's border in place, ``E`` read once, nothing gathered — the same quantities summed in another
order (the state agrees with the torch border to rounding, not bit for bit); the torch border
stays the reference and the masked path is untouched.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..deferred_checks import active_checks, check_runs
from ..native import ekucb as native_ekucb

if TYPE_CHECKING:
    from .batched_kors import BatchedKORS

__all__ = ["Growth"]


class Growth:
    """The dictionary growth of :class:`~torchbandits.models.batched_nystrom.BatchedNystrom` (a
    mixin: the model's own state, read and written through ``self``; KORS's border through
    :meth:`~torchbandits.models.batched_kors.BatchedKORS.add_border`)."""

    _k: Any
    _x: Tensor
    _e: Tensor
    _p: Tensor
    _q: Tensor
    _g: Tensor
    _s: Tensor
    _c: Tensor
    _z: Tensor
    _m: Tensor
    _logdet: Tensor
    _refused: Tensor
    _pending: Any
    _q_kept: Any
    _p_lower: bool
    _unit_counts: bool
    _version: int
    _row_cache: dict[Any, Tensor]
    lam: float
    min_residual: float
    n: int
    max_size: int
    device: torch.device
    dtype: torch.dtype

    def grow_masked(self, f: Tensor, omega: Tensor, accept: Tensor,
                    kors: BatchedKORS | None = None, kz: Tensor | None = None,
                    kss: Tensor | float | None = None, p: Tensor | None = None) -> Tensor:
        """Grow every run's dictionary where ``accept`` ``[R]`` holds and the guard passes (module
        docstring), chunk by chunk at the model's widths, then bump the widths (no read). ``f``
        ``[R, M]`` and ``omega`` ``[R]`` as :meth:`BatchedNystrom.append` returned them; with
        ``kors``: also its border, ``kz`` = ``k_Z(z)`` ``[R, M]``, ``kss`` = ``k(z,z)`` ``[R]`` (or a
        float: a constant) and
        ``p`` = ``p̃`` ``[R]``. Returns the mask ``[R]`` of the runs that grew."""
        mm = self.max_size
        self._ensure(self.n, mm + 1, self._x.shape[2])
        self._version += 1
        if kors is not None:
            kors.reserve(mm + 1)
        added = []
        for a, b, w in self.chunks():
            sl = slice(a, b)
            sys = None if kors is None else (  # type: ignore[assignment]
                kors, kz, kss if isinstance(kss, float) else kss[sl], p[sl])  # type: ignore[index]
            added.append(self._grow_chunk(sl, f[sl, :w], omega[sl], accept[sl], w, sys))
        if kors is not None:
            kors.release_probe()
        self.bump_widths()
        return added[0] if len(added) == 1 else torch.cat(added)

    def guard(self, omega: Tensor, accept: Tensor, runs: slice | Tensor | None = None,
              kzz: Tensor | float | None = None) -> Tensor:
        """The runs that accept the last appended point ``z`` (``accept``) and pass the
        ``min_residual`` guard ``ω > min_residual·k(z,z)`` (``omega``); the refusals are counted
        in :attr:`refused`. ``runs``: whose ``omega``, ``accept`` ``[k]`` these are (a slice, or
        distinct int64 ``[k]``; ``None``: every run, ``[R]``); ``kzz``: their ``k(z,z)`` if known.
        The CPU's compacted growth gathers only the runs that pass (those that accept with
        ``p̃ ≥ 1`` late in a run are mostly refused here); the masked growth masks the others."""
        if kzz is None:
            kzz = self._last_prior(runs)
        ok = (omega > self.min_residual * kzz) & accept
        if runs is None:
            self._refused.add_(ok ^ accept)
        elif isinstance(runs, slice):
            self._refused[runs].add_(ok ^ accept)
        else:
            self._refused.index_add_(0, runs, (ok ^ accept).to(self._refused.dtype))
        return ok

    def _last_prior(self, runs: slice | Tensor | None = None) -> Tensor | float:
        """``k(z,z)`` of the last appended point of the runs ``runs`` (all if ``None``): the
        kernel's constant when it has one (no tensor), else ``[k]``."""
        kern = self._k
        if kern.const is not None:
            return kern.const
        return kern.diag(self._x[slice(None) if runs is None else runs, self.n - 1])

    def _grow_constants(self, k: int) -> tuple[Tensor, Tensor]:
        """A zero column ``[k, 1]`` and the corners ``(1, −1, −1)`` of the bordered vectors, on the
        model's device (cached)."""
        key = ("growth", k)
        got = self._row_cache.get(key)  # type: ignore[call-overload]
        if got is None or got.device != self.device or got.dtype != self.dtype:
            got = self._row_cache[key] = self._c.new_zeros(k + 3)  # type: ignore[index]
            got[k:k + 1].fill_(1.0)  # fill_: a kernel argument; a set item copies from the host,
            got[k + 1:].fill_(-1.0)  # which synchronises on CUDA
        return got[:k, None], got[k:]

    def _grow_chunk(self, sl: slice, f: Tensor, omega: Tensor, accept: Tensor, w: int,
                    sys: tuple[BatchedKORS, Tensor, Tensor | float, Tensor] | None) -> Tensor:
        """:meth:`grow_masked` of the runs ``sl`` at width ``w`` (``f`` ``[k, w]``)."""
        n, k, kern = self.n, sl.stop - sl.start, self._k
        z = self._x[sl, n - 1]                                                  # [k, d]
        ok = self.guard(omega, accept, sl)                                      # the guard
        d = torch.where(ok, omega, math.inf).sqrt_()                # d (∞ where refused)
        rows, ar = self._rows(sl), self._rows(slice(0, k))
        pw = self._p[sl, : w + 1, : w + 1]
        qw = self._q[sl, : w + 1, : w + 1]      # (the property applies a deferred step of Q)
        e_old = self._e[sl, :n, :w]
        r1 = torch.baddbmm(f.new_empty(k, w, 1), pw[:, :w, :w].mT, f[..., None],  # −Pᵀf [k, w]
                           beta=0.0, alpha=-1.0)[..., 0]
        gs = kern.block(self._x[sl, :n], z[:, None])[..., 0]                    # k_S(z) [k, n]
        e_new = gs.sub_((e_old @ f[..., None])[..., 0]).div_(d[:, None])         # e [k, n]
        ce = e_new if self._unit_counts else self._c[sl, :n] * e_new
        b = (e_old.mT @ ce[..., None])[..., 0]                                   # Eᵀ C e [k, w]
        qb = (qw[:, :w, :w] @ b[..., None])[..., 0]   # the sequential self's orientations
        dots = (e_new[:, None, :] * torch.stack([ce, self._s[sl, :n]], 1)).sum(-1)  # eᵀCe, eᵀs
        schur = omega.new_empty(1 if sys is None else 2, k)                      # s, s'
        torch.sub(dots[:, 0] + self.lam, (b * qb).sum(-1), out=schur[0])
        vectors = [r1, qb]
        if sys is not None:
            kors, kz, kss, p = sys
            kq, quad = kors.border_terms(kz, sl, w)                              # N k_Z, k_Zᵀ N k_Z
            torch.sub(kss + kors.mu * p, quad, out=schur[1])
            vectors.append(kq)
        check_runs("add_last: a Schur complement (posterior or KORS) must be positive",
                   self._flags(sl, ok.gt(schur > 0).any(0)),
                   lambda r: f"add_last: a Schur complement is not positive (run {r})")
        den = torch.where(ok, schur, 1.0)
        inv_s = ok / den                                                         # 0 where refused
        self._logdet[sl].add_(den[0].log())
        zero, corner = self._grow_constants(k)
        pos = self._m[sl]                                                       # a view
        u = torch.cat([t for v in vectors for t in (v, zero)], -1).view(k, len(vectors), w + 1)
        u.transpose(1, 2)[ar, pos] = corner[: len(vectors)]   # [−Pᵀf; 1], [Qb; −1], [N k_Z; −1]
        pw[ar, pos] = u[:, 0] / d[:, None]                                       # [−Pᵀf/d, 1/d]
        scaled = u[:, 1:] * inv_s.mT[:, :, None]
        qw.addcmul_(u[:, 1, :, None], scaled[:, 0, None, :])
        self._e[rows, :n, pos] = e_new
        self._g[rows, pos] = dots[:, 1]
        self._z[rows, pos] = torch.where(ok[:, None], z, 0.0)
        if sys is not None:
            kors.add_border(sl, rows, pos, u[:, 2], scaled[:, 1], p, ok)
        pos.add_(ok)
        return ok

    def grow_compacted(self, runs: Tensor, f: Tensor, omega: Tensor, accept: Tensor
                       ) -> Tensor:
        """The posterior's growth of the distinct ``runs`` (a LongTensor ``[k]``, compacted by the
        caller; ``f`` ``[k, M]``, ``omega`` and ``accept`` ``[k]``): the guard, then only the runs
        that pass are gathered, bordered and written back (one host read), and the widths refreshed.
        On the CPU in float64 the guard and the border are one compiled call instead
        (:meth:`_grow_compiled`). Returns the mask ``[k]`` of the runs that grew."""
        self._ensure(self.n, self.max_size + 1, self._x.shape[2])
        self._version += 1
        kzz = self._last_prior(runs)
        ok = self._grow_compiled(runs, f, omega, accept, kzz)
        if ok is not None:
            return ok
        ok = self.guard(omega, accept, runs, kzz)
        keep = ok.nonzero()[:, 0]          # the compacted path reads: only the runs that grow
        if keep.numel():
            self._border_runs(runs[keep], f[keep], omega[keep], self.max_size)
            self.refresh_widths()
        return ok

    def _grow_compiled(self, runs: Tensor, f: Tensor, omega: Tensor, accept: Tensor,
                       kzz: Tensor | float) -> Tensor | None:
        """:meth:`grow_compacted` by the compiled growth (:func:`torchbandits.native.ekucb.grow`:
        the guard, the deferred step of ``Q`` and the border of each growing run in place at its own
        size — ``E`` read once, nothing gathered), or ``None`` (nothing done: the torch path runs)
        where it does not apply (not float64 CPU tensors, no compiler). Its sums run in another
        order than the batched torch products: the state agrees with the torch border to rounding,
        not bit for bit (~1e-12 relative; amplified on ill-conditioned dictionaries, as between the
        batched and the sequential models: on Chessboard a ``min_residual`` refusal at its threshold
        can flip — about as often as with the torch border, docs/batch-performance.md). A Schur
        complement that is not positive raises (nothing bordered) or, under
        :func:`~torchbandits.deferred_checks.deferred_checks`, is flagged (the border written, as
        the torch path does)."""
        kern = self._k
        if not native_ekucb.available(self._e):
            return None
        if self._q_kept is not None:   # debug_stale_q: Q's values back (the same numbers as in C)
            self._flush_q(runs)
        n = self.n
        krow = kern.rbf_c if kern.rbf_c is not None else (
            kern.block(self._x[runs, :n], self._x[runs, n - 1, None])[..., 0].contiguous())
        strict = active_checks() is None
        out = native_ekucb.grow(
            runs, f.contiguous(), omega.contiguous(), accept.contiguous(), kzz, self.min_residual,
            n, self._x, krow, self._e, self._p, self._p_lower, self._q_stored(), self._pending,
            self._g, self._s, None if self._unit_counts else self._c, self._z, self._logdet,
            self._m, self._refused, self.lam, strict)
        if out is None:
            return None
        ok, failed, bad, grown = out
        if failed or not strict:
            check_runs("add_last: a Schur complement must be positive", bad,
                       lambda r: f"add_last: a Schur complement is not positive (run {r})")
        if grown:
            self.refresh_widths()
        return ok

    def _border_runs(self, idx: Tensor, f: Tensor, omega: Tensor, w: int) -> None:
        """:meth:`grow_compacted` of the growing runs ``idx`` (``f`` ``[k, w]``): their blocks of
        ``Q`` are gathered and written back, ``P`` gets its new row in place. ``Q`` is bordered as
        one rank-one update of its ``[w+1, w+1]`` block, ``Q ← Q + u uᵀ/s`` with ``u = Qb − e_pos``
        (``Qb`` is zero from ``pos`` on): the update ``Qb bᵀQ/s``, the border ``−Qb/s`` and the
        corner ``1/s`` in one write."""
        n, lam = self.n, self.lam
        self._flush_q(idx)   # then Q's rows idx are current
        z = self._x[idx, n - 1]                                                 # [k, d]
        d = torch.sqrt(omega)
        pos = self._m[idx]
        p = self._p[idx, :w, :w]     # only row pos of P changes: written in place below
        q = self._q_stored()[idx, : w + 1, : w + 1]
        row = -(p.mT @ f[..., None])[..., 0] / d[:, None]            # −Pᵀf/d
        e_old = self._e[idx, :n, :w]
        gs = self._k.block(self._x[idx, :n], z[:, None])[..., 0]              # k_S(z) [k, n]
        e_new = (gs - (e_old @ f[..., None])[..., 0]) / d[:, None]               # [k, n]
        ce = self._c[idx, :n] * e_new
        b = (e_old.mT @ ce[..., None])[..., 0]                                   # Eᵀ C e [k, w]
        qb = (q[:, :w, :w] @ b[..., None])[..., 0]  # the sequential self's orientations (rounding)
        schur = (e_new * ce).sum(-1) + lam - (b * qb).sum(-1)
        check_runs("add_last: a Schur complement must be positive",
                   self._flags(idx, ~(schur > 0)),
                   lambda r: f"add_last: a Schur complement is not positive (run {r})")
        u = torch.nn.functional.pad(qb, (0, 1)) - self._unit(pos, w + 1)       # Qb − e_pos
        q.addcmul_(u[:, :, None], (u * (1.0 / schur)[:, None])[:, None, :])
        self._p[idx, pos, :w] = row
        self._p[idx, pos, pos] = 1.0 / d
        self._q_stored()[idx, : w + 1, : w + 1] = q
        self._g[idx, pos] = (e_new * self._s[idx, :n]).sum(-1)
        self._e[idx, :n, pos] = e_new
        self._z[idx, pos] = z
        self._logdet[idx] += torch.log(schur)
        self._m[idx] = pos + 1

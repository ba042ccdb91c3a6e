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

A refused run has ``d = ∞`` and ``1/s = 1/s' = 0``: its row, column and rank-one terms are
zero. The arithmetic of each quantity is that of the compacted border
(:meth:`BatchedNystrom._border <torchbandits.models.batched_nystrom.BatchedNystrom>`,
``BatchedKORS._border``) on the same shapes, so the numbers are the same; what differs is how
many operators carry it (each launches a kernel on a GPU): the two Schur complements, their
checks, inverses and rank-one factors are one ``[2, k]`` / ``[k, 2, w+1]`` tensor; the three
bordered vectors ``Pᵀf``, ``Qb``, ``N k_Z`` are padded and given their ``−1`` by one ``cat``
and one indexed write; ``P``'s row is one write; ``KORS``'s ``N k_Z`` and ``k_Zᵀ N k_Z`` are
those of the round's probability (:meth:`~torchbandits.models.batched_kors.BatchedKORS.border_terms`);
``−d`` is taken once (``(E f − k_S(z))/(−d)`` is ``(k_S(z) − E f)/d`` to the bit, as is
``Pᵀf/(−d)`` of ``−Pᵀf/d``); with unit counts (EK-UCB's) ``C e`` is ``e``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..deferred_checks import check_runs

if TYPE_CHECKING:
    from .batched_kors import BatchedKORS
    from .batched_nystrom import BatchedNystrom

__all__ = ["grow_masked"]


def grow_masked(model: BatchedNystrom, f: Tensor, omega: Tensor, accept: Tensor,
                kors: BatchedKORS | None = None, kz: Tensor | None = None,
                kss: Tensor | None = None, p: Tensor | None = None) -> Tensor:
    """Grow every run's dictionary where ``accept`` ``[R]`` holds and the guard passes (module
    docstring), chunk by chunk at the model's widths, then bump the widths (no read). ``f``
    ``[R, M]`` and ``omega`` ``[R]`` as :meth:`BatchedNystrom.append` returned them; with
    ``kors``: also its border, ``kz`` = ``k_Z(z)`` ``[R, M]``, ``kss`` = ``k(z,z)`` ``[R]`` and
    ``p`` = ``p̃`` ``[R]``. Returns the mask ``[R]`` of the runs that grew."""
    mm = model.max_size
    model._ensure(model.n, mm + 1, model._x.shape[2])
    model._version += 1
    if kors is not None:
        kors.reserve(mm + 1)
    added = []
    for a, b, w in model.chunks():
        sl = slice(a, b)
        sys = None if kors is None else (kors, kz, kss[sl], p[sl])  # type: ignore[index]
        added.append(_grow_chunk(model, sl, f[sl, :w], omega[sl], accept[sl], w, sys))
    if kors is not None:
        kors._probed = None
    model.bump_widths()
    return added[0] if len(added) == 1 else torch.cat(added)


def _constants(model: BatchedNystrom, k: int) -> tuple[Tensor, Tensor]:
    """A zero column ``[k, 1]`` and the scalar ``−1`` on the model's device (cached)."""
    key = ("growth", k)
    got = model._row_cache.get(key)  # type: ignore[call-overload]
    if got is None or got.device != model.device or got.dtype != model.dtype:
        got = model._row_cache[key] = model._c.new_zeros(k + 1)  # type: ignore[index]
        got[k] = -1.0
    return got[:k, None], got[k]


def _grow_chunk(model: BatchedNystrom, sl: slice, f: Tensor, omega: Tensor, accept: Tensor, w: int,
                sys: tuple[BatchedKORS, Tensor, Tensor, Tensor] | None) -> Tensor:
    """:func:`grow_masked` of the runs ``sl`` at width ``w`` (``f`` ``[k, w]``)."""
    n, k, kern = model.n, sl.stop - sl.start, model._k
    z = model._x[sl, n - 1]                                                  # [k, d]
    kzz = kern.const if kern.const is not None else kern.diag(z)
    ok = (omega > model.min_residual * kzz) & accept                         # the guard
    model._refused[sl].add_(ok ^ accept)
    nd = torch.where(ok, omega, math.inf).sqrt_().neg_()        # −d (−∞ where refused)
    rows, ar = model._rows(sl), model._rows(slice(0, k))
    pw = model._p[sl, : w + 1, : w + 1]
    qw = model._q[sl, : w + 1, : w + 1]      # (the property applies a deferred step of Q)
    e_old = model._e[sl, :n, :w]
    r1 = (pw[:, :w, :w].mT @ f[..., None])[..., 0]                           # Pᵀf [k, w]
    gs = kern.block(model._x[sl, :n], z[:, None])[..., 0]                    # k_S(z) [k, n]
    e_new = (e_old @ f[..., None])[..., 0].sub_(gs).div_(nd[:, None])        # e [k, n]
    ce = e_new if model._unit_counts else model._c[sl, :n] * e_new
    b = (e_old.mT @ ce[..., None])[..., 0]                                   # Eᵀ C e [k, w]
    qb = (qw[:, :w, :w] @ b[..., None])[..., 0]   # the sequential model's orientations
    dots = (e_new[:, None, :] * torch.stack([ce, model._s[sl, :n]], 1)).sum(-1)  # eᵀCe, eᵀs
    schur = omega.new_empty(1 if sys is None else 2, k)                      # s, s'
    torch.sub(dots[:, 0] + model.lam, (b * qb).sum(-1), out=schur[0])
    vectors = [r1, qb]
    if sys is not None:
        kors, kz, kss, p = sys
        kq, quad = kors.border_terms(kz, sl, w)                              # N k_Z, k_Zᵀ N k_Z
        torch.sub(kss + kors.mu * p, quad, out=schur[1])
        vectors.append(kq)
    check_runs("add_last: a Schur complement (posterior or KORS) must be positive",
               model._flags(sl, ok.gt(schur > 0).any(0)),
               lambda r: f"add_last: a Schur complement is not positive (run {r})")
    den = torch.where(ok, schur, 1.0)
    inv_s = ok / den                                                         # 0 where refused
    model._logdet[sl].add_(den[0].log())
    zero, minus_one = _constants(model, k)
    pos = model._m[sl]                                                       # a view
    u = torch.cat([t for v in vectors for t in (v, zero)], -1).view(k, len(vectors), w + 1)
    u.transpose(1, 2)[ar, pos] = minus_one            # [Pᵀf; −1], [Qb; −1], [N k_Z; −1]
    pw[ar, pos] = u[:, 0] / nd[:, None]                                      # [−Pᵀf/d, 1/d]
    scaled = u[:, 1:] * inv_s.mT[:, :, None]
    qw.addcmul_(u[:, 1, :, None], scaled[:, 0, None, :])
    model._e[rows, :n, pos] = e_new
    model._g[rows, pos] = dots[:, 1]
    model._z[rows, pos] = torch.where(ok[:, None], z, 0.0)
    if sys is not None:
        nzw = kors._nz[sl, : w + 1, : w + 1]
        nzw.addcmul_(u[:, 2, :, None], scaled[:, 1, None, :])
        kors._p[rows, pos] = torch.where(ok, p, 0.0)
        kors._m[sl].add_(ok)
    pos.add_(ok)
    return ok

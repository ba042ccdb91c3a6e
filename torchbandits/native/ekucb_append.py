"""The compiled data update of a batched EK-UCB round (``ekucb_append.c``; Zenati et al. 2022,
Algorithm 2 in the whitened form of their Prop. 4.2): every run appends the candidate it played,
taking that candidate's columns from the round's compiled score
(:func:`torchbandits.native.ekucb.score`) — one C call for what
:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.scored_columns` and
:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.append` do in about twenty tensor
operations. Returns ``None`` (the caller takes its torch path, the reference) when compiled
kernels are off or unavailable or a tensor does not qualify (float64 CPU tensors whose last
dimension is contiguous).
"""

from __future__ import annotations

import ctypes
from array import array
from typing import NamedTuple

import torch
from torch import Tensor

from . import signed
from .ekucb import f64_rows

__all__ = ["Appended", "append_played"]

_SIGNED_ARGS = {"ekucb_append": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int64)}


class Appended(NamedTuple):
    """What :func:`append_played` returns: the played candidates' ``k_Z(x)`` and ``e(x)``, the
    deferred Sherman–Morrison factors ``a = Q e(x)`` and ``b = a/(1 + e(x)ᵀQe(x))`` (each
    ``[R, W]``), the residuals ``ω`` ``[R]``, and ``missing`` (int64 ``[R]``, 1 where ``x_r`` is
    not one of run ``r``'s candidates) with its count."""

    kz: Tensor
    f: Tensor
    a: Tensor
    b: Tensor
    omega: Tensor
    missing: Tensor
    n_missing: int


def append_played(cand: Tensor, x: Tensor, y: Tensor, kz: Tensor, f: Tensor, qf: Tensor,
                  kxx: Tensor | float, jitter: float, g: Tensor, e: Tensor, xs: Tensor,
                  s: Tensor, n: int, logdet: Tensor, *, write_missing: bool) -> Appended | None:
    """``ekucb_append``: candidates ``cand`` ``[R, A, d]`` of the last compiled score and its
    columns ``kz``, ``f`` ``[R, A, W]`` and ``qf`` ``[R, ≥A, W]``; the played points ``x``
    ``[R, d]`` with rewards ``y`` ``[R]``; ``k(x, x)`` ``kxx`` ``[R]`` or a float. State written
    in place: ``g`` ``[R, ≥W]`` (``g += y·e(x)``), row ``n`` of the embeddings ``e``
    ``[R, >n, ≥W]``, of the points ``xs`` ``[R, >n, d]`` and of the rewards ``s`` ``[R, >n]``,
    and ``logdet`` ``[R]`` (``+= log1p(e(x)ᵀQe(x))``). When some ``x_r`` is not a candidate and
    ``write_missing`` is false nothing is written (``n_missing > 0``: the caller takes its torch
    path); with it true a missing run takes candidate 0's columns (the caller flags it). ``None``
    where the compiled path does not apply (then nothing is written). The arguments reach C
    packed in two arrays (a ctypes call converts each argument: ~0.25 µs apiece)."""
    r, na, w = f.shape
    d = x.shape[1]
    const = isinstance(kxx, float)
    if (w == 0 or na == 0 or not f64_rows(cand, x, y, kz, f, qf, g, e, xs, s, logdet)
            or cand.shape != (r, na, d) or kz.shape != f.shape
            or qf.shape[0] != r or qf.shape[1] < na or qf.shape[2] != w
            or x.shape[0] != r or y.shape != (r,) or logdet.shape != (r,)
            or g.shape[0] != r or g.shape[1] < w or e.shape[0] != r or e.shape[2] < w
            or xs.shape[0] != r or xs.shape[2] != d or s.shape[0] != r
            or not (n < e.shape[1] and n < xs.shape[1] and n < s.shape[1])
            or (not const and (not f64_rows(kxx) or kxx.shape != (r,)))):  # type: ignore[union-attr]
        return None
    lib = signed("ekucb_append", _SIGNED_ARGS)
    if lib is None:
        return None
    out = f.new_empty(4, r, w)
    omega = f.new_empty(r)
    flags = torch.empty(2 * r, dtype=torch.int64)
    iv = array("q", (
        r, na, w, d, cand.data_ptr(), cand.stride(0), cand.stride(1), x.data_ptr(), x.stride(0),
        y.data_ptr(), kz.data_ptr(), kz.stride(0), kz.stride(1), f.data_ptr(), f.stride(0),
        f.stride(1), qf.data_ptr(), qf.stride(0), qf.stride(1),
        0 if const else kxx.data_ptr(), out.data_ptr(),  # type: ignore[union-attr]
        omega.data_ptr(), flags.data_ptr(), int(bool(write_missing)), g.data_ptr(), g.stride(0),
        e.data_ptr() + 8 * n * e.stride(1), e.stride(0), xs.data_ptr() + 8 * n * xs.stride(1),
        xs.stride(0), s.data_ptr() + 8 * n * s.stride(1), s.stride(0), logdet.data_ptr()))
    dv = array("d", (kxx if const else 0.0, float(jitter)))  # type: ignore[arg-type]
    count = lib.ekucb_append(iv.buffer_info()[0], dv.buffer_info()[0])
    kz_out, f_out, a, b = out.unbind(0)
    return Appended(kz_out, f_out, a, b, omega, flags[:r], int(count))

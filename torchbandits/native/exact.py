"""The compiled single-run step of :class:`~torchbandits.models.ExactKernelRidge`
(``exact_step.c``): scoring a candidate set and appending the played candidate, each one call.

For a stationary kernel (:class:`~torchbandits.kernel_fast.ScaledStationary`: RBF, Matérn-1/2,
3/2, 5/2, optional output scale) and ``R`` maintained factors ``L_r`` of ``K + α_r I``:

* :func:`score`: ``c̃ = c·w`` ``[A, d]``, ``K_SC`` ``[n, A]`` by the closed form, per factor
  ``V_r = L_r⁻¹ K_SC`` ``[n, A]`` (forward substitution by blocks of rows, vectorised over the
  candidates), ``μ_r = z_rᵀ V_r``, ``colsum(V_r ⊙ V_r)`` and ``ρ²_r = max(k_CC − colsum, 0)``
  (``[R, A]`` each): the pieces of the Cholesky form of the posterior (Flynn & Reeb 2024, App. E.2)
  that the torch path of :mod:`torchbandits.models.exact_scoring` computes in about 30 operations;
* :func:`append`: the O(n) append of the scored candidate ``j``: the new row ``V_r[:, j]`` and
  pivot ``d_r = sqrt(k(x_j, x_j) + α_r − colsum(V_r²)_j)`` of each factor written into its tail,
  ``z_r`` gains ``(y − μ_r[j]) / d_r``, and the point, the reward and the scaled point are copied
  into the model's buffers.

The caller checks the tensors (float64, CPU, contiguous) and sizes; :func:`available` says
whether the library is loaded (``None`` inside :func:`torchbandits.native.disabled`). The C code
keeps no pointer between calls.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from torch import Tensor

from . import signed

__all__ = ["FUSED", "KINDS", "MAX_N", "PRUNE_FORCED", "PRUNE_HEAD", "append", "available", "score"]

MAX_N = 1500
"""Largest number of stored points scored here; above it the torch path (LAPACK's blocked
triangular solve) takes over. One thread on the development machine (AMD EPYC, AVX2), the
compiled step against the torch path: AMM 2.0× / DMM 2.1× faster at n = 500, 1.6× / 1.5× at
n = 1000, 1.2× / 1.16× at n = 1500 and 1.2× / 1.0× at n = 2000, where the compiled solve (one
thread, L streamed from memory once per 12 columns; 24 with AVX-512) runs at half its rate (a
threaded BLAS overtakes it earlier)."""

KINDS = {("rbf", float("inf")): 0, ("matern", 0.5): 1, ("matern", 1.5): 2, ("matern", 2.5): 3}
"""The closed forms of ``exact_step.c`` by ``(kind, ν)`` of a
:class:`~torchbandits.kernel_fast.ScaledStationary`."""

#: Values before ``α``'s in the pruned select's per-run cache (``exact_prune.h``: ``α``'s length,
#: then the state of the poor-pruning rule, ``PRUNE_FORCED`` = −2 to force the next pruned select).
PRUNE_HEAD = 2
#: The cache's value that asks the next select to be pruned wherever the pruning applies.
PRUNE_FORCED = -2.0

FUSED = {"n": 0, "d": 1, "factors": 2, "kind": 3, "has_scale": 4, "dw": 5, "cap": 6, "block": 7,
         "scaled": 8, "weight": 9, "x": 10, "y": 11, "z": 12, "zstride": 13, "params": 14,
         "terms": 15, "param0": 16, "max_params": 4, "factor0": 28, "factor_width": 5}
"""The layout of the int64 table of the fused step (``tb_exact_fused_select`` /
``tb_exact_fused_append`` of ``exact_fused_step.h``, whose comment describes it; built and
checked by :mod:`torchbandits.models.exact_fused`)."""

_L = ctypes.c_long
_P = ctypes.c_void_p
_D = ctypes.c_double
_SIGNATURES = {
    "tb_exact_score": ([_L, _L, _L, _L, _P, _P, _P, _L, ctypes.c_int, _D, ctypes.c_int, _D, _P, _P,
                        _P, _P, _P, _P, _P, _P, _P], _L),
    "tb_exact_append": ([_L, _L, _L, _L, _L, _P, _D, _P, _D, _P, _P, _P, _L, _P], ctypes.c_int),
    "tb_exact_fused_select": ([_P, _P, _P, _L, _P, _L, _P, _P, _P, _P, _L], _L),
    "tb_exact_fused_append": ([_P, _P, _P, _D, _P], ctypes.c_int),
}


def available() -> ctypes.CDLL | None:
    """The library with its argument types set, or ``None`` (off or not buildable)."""
    return signed("exact_step", _SIGNATURES)


def score(lib: ctypes.CDLL, n: int, xs: Tensor, cand: Tensor, weight: Tensor, kind: int,
          outscale: float | None, kdiag: float, factors: list[tuple[int, int, int, int, int]],
          out: tuple[Tensor, Tensor, Tensor], keep: tuple[Tensor | None, Tensor | None, Tensor | None],
          bound: tuple[Sequence[float], Sequence[float]] | None = None,
          arg: Tensor | None = None) -> int:
    """One scoring call; returns the index of the largest upper bound with ``bound`` (else 0).

    Args:
        n, xs: the number of stored points and their scaled values, the first ``n`` rows of
            ``xs`` ``[cap, d]`` (contiguous).
        cand: candidates ``[A, d]``; ``weight``: the kernel weights ``w`` ``[d]`` or ``[1]``.
        kind: :data:`KINDS` code; ``outscale``: ``s`` or ``None``; ``kdiag``: ``k(x, x)``.
        factors: per factor the addresses and sizes ``(head, n0, tail, width, z_r)``.
        out: ``(v [R, n, A], mean [R, A], sumsq [R, A])``, written (contiguous, any shapes
            with those sizes).
        keep: ``(cs [A, d], kq [n, A], var [R, A])`` written where not ``None``.
        bound: ``(β [R], div [R])``: also the upper bound ``min_r (sqrt(ρ²_r / div_r) β_r + μ_r)``,
            its minimising ``r`` written into ``arg`` ``[A]`` (int64) if given.
    """
    d = xs.shape[1]
    a, count = cand.shape[0], len(factors)
    table = (ctypes.c_longlong * (5 * count))(*[e for entry in factors for e in entry])
    v, mean, sumsq = out
    cs, kq, var = keep
    dbl = None if bound is None else (_D * (2 * count))(*bound[0], *bound[1])
    best = lib.tb_exact_score(n, a, d, count, xs.data_ptr(), cand.data_ptr(), weight.data_ptr(),
                              weight.numel(), kind, 1.0 if outscale is None else outscale,
                              outscale is not None, kdiag, table, v.data_ptr(), mean.data_ptr(),
                              sumsq.data_ptr(), cs.data_ptr() if cs is not None else None,
                              kq.data_ptr() if kq is not None else None,
                              var.data_ptr() if var is not None else None, dbl,
                              arg.data_ptr() if arg is not None else None)
    if best < 0:
        raise MemoryError("torchbandits.native.exact: scratch allocation failed")
    return best


def append(lib: ctypes.CDLL, n: int, a: int, d: int, j: int, src: list[tuple[int, int, int]],
           kxx: float, regs: Sequence[float], y: float, dst: list[tuple[int, int]],
           copies: tuple[int, int, int, int], weight: Tensor) -> list[float] | int:
    """One append call of the scored candidate ``j`` (of ``a``) with ``n`` stored points.

    ``src``: per factor the addresses of the scoring's ``(V [n, A], μ [A], colsum V² [A])``;
    ``dst``: per factor the addresses (new tail row, ``z_r[n]``); ``copies``: the addresses of the
    point ``[d]``, of its row in the model's points, of the reward's entry and of its row in the
    scaled points (0: none; ``x·w`` with ``w = weight``). Returns ``[d_0, z_0, d_1, z_1, …]``
    (pivots and new ``z`` entries), or the index of the first factor whose pivot is not positive
    (nothing written)."""
    count = len(regs)
    ints = (ctypes.c_longlong * (5 * count + 4))()
    for r in range(count):
        ints[3 * r: 3 * r + 3] = src[r]
        ints[3 * count + 2 * r: 3 * count + 2 * r + 2] = dst[r]
    ints[5 * count:] = copies
    dbl = (_D * (3 * count))(*regs)
    base = ctypes.addressof(ints)
    rc = lib.tb_exact_append(n, a, d, count, j, base, kxx, dbl, y, base + 24 * count,
                             base + 40 * count, weight.data_ptr(), weight.numel(),
                             ctypes.addressof(dbl) + 8 * count)
    return rc - 1 if rc else dbl[count:]

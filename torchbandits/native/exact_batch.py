"""The compiled CPU step of ``R`` batched exact posteriors (``exact_batch.c``):
:class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` scoring every run's candidates
in one call (:func:`score`) and appending one point to every run in one call (:func:`append`),
with the kernels of the single-run step (``exact_step.c``: the closed-form kernel rows, the packed
register-tile forward substitution: 4×12 with AVX2, 4×24 with AVX-512) looped over the runs.

The state is read by strides (``R·G`` members: run ``r`` at its ``g``-th regulariser is member
``r·G + g``, sharing run ``r``'s points; ``G = 1`` for the model itself, ``G = 5`` for DMM's
companion):

* :func:`score`: per run ``K_SC`` ``[n, A]`` of its points and candidates, then per member
  ``V = L⁻¹K_SC``, ``μ = zᵀV``, ``ρ² = max(k_CC − colsum(V ⊙ V), 0)``, ``[R·G, A]`` each;
* :func:`select`: the scoring, then per run the first index of the largest upper bound
  ``min_g (sqrt(ρ²_{rG+g} / div_{rG+g}) β_{rG+g} + μ_{rG+g})`` (the closed form of the fused
  single-run select, :class:`~torchbandits.confidence.base.UCBForm`; ``G`` terms: DMM's grid,
  Flynn & Reeb 2024, Eq. (14)), ``[R]``, and the chosen candidate's append pieces (``l``,
  ``zᵀl``, ``‖l‖²`` per member) while the run's factors are in the cache; with a ``hint``,
  pruned (the same choice and the same bits: a column is solved by the same operations whatever
  the other columns, and whether in one go or in pieces; ``exact_prune.h``): the candidates are
  solved a few at a time in order of their prior bound and a group is dropped as soon as one
  member's partial sums ``Σ_{i<j} l_i²`` and an upper bound on its ``μ`` put every column below
  the best bound found (with ``G = 1`` from 160 points, 80 with 500 candidates or more, else
  the full select; with ``G > 1`` from 160 points); with ``G > 1`` the other members are solved
  only on the groups that survive (below 160 points one member on every candidate keys them); a
  run whose last two selects pruned too little takes the full select for its next 16;
* :func:`append`: per member ``l = L⁻¹k_S(x_r)``, ``d = sqrt(k(x_r, x_r) + λ − ‖l‖²)``,
  ``z[n] = (y_r − zᵀl)/d`` written as row ``n`` of the factor, with the point and reward
  (``l``, ``zᵀl``, ``‖l‖²`` read from :func:`select`'s pieces for the runs whose point holds the
  bits of the candidate it chose: the same operations, the same numbers).

The caller checks the tensors (float64, CPU, contiguous) and sizes; :func:`available` says
whether the library is loaded (``None`` inside :func:`torchbandits.native.disabled`). The C code
keeps no pointer between calls.

**Threads.** :func:`score` and :func:`select` split the runs into contiguous slices, one C call
per slice on :func:`~torchbandits.run_draw_threads.run_sliced`'s threads (``ctypes`` releases the
GIL during a call), when the caller asks for more than one
(:func:`torchbandits.native.threads_for`: :func:`torchbandits.native.threads`, i.e.
``native.set_threads(k)`` or ``$TORCHBANDITS_THREADS``, default 1; at least
:data:`~torchbandits.native.MIN_RUNS_PER_THREAD` runs a slice). Every run is computed by the same
code on its own data whatever the slicing, so the numbers do not change. They write only their
outputs (and the pruning's ``hint`` and ``α`` cache, per run); :func:`append`, which writes the
model's state and must write nothing when a pivot fails, stays one call.
"""

from __future__ import annotations

import ctypes

from torch import Tensor

from ..run_draw_threads import run_sliced
from . import pointer, signed

__all__ = ["append", "available", "score", "select"]

_L = ctypes.c_long
_P = ctypes.c_void_p
_D = ctypes.c_double
_I = ctypes.c_int
_SIGNATURES = {
    "tb_batch_score": ([_L, _L, _L, _L, _L, _P, _L, _P, _L, _P, _L, _I, _D, _I, _D, _P, _L, _L, _P,
                        _L, _P, _P, _P, _P], _L),
    "tb_batch_select": ([_L, _L, _L, _L, _L, _P, _L, _P, _L, _P, _L, _I, _D, _I, _D, _P, _L, _L,
                         _P, _L, _P, _P, _P, _P, _P, _P, _P, _P, _L], _L),
    "tb_batch_append": ([_L, _L, _L, _L, _P, _P, _P, _L, _P, _L, _P, _L, _I, _D, _I, _D, _P, _L, _L,
                         _P, _L, _P, _P, _P, _P, _P, _L], _L),
}


def available() -> ctypes.CDLL | None:
    """The library with its argument types set, or ``None`` (off or not buildable)."""
    return signed("exact_batch", _SIGNATURES)


def _kernel(kernel: tuple[Tensor, int, float | None, float]) -> tuple[int, int, int, float, int,
                                                                        float]:
    """``(w, kind, s, k(x, x))`` as the C arguments ``(w, dw, kind, s, has_scale, kdiag)``."""
    w, kind, scale, kdiag = kernel
    return (w.data_ptr(), w.numel(), kind, 1.0 if scale is None else scale, scale is not None,
            kdiag)


def _row(t: Tensor | None, i: int) -> ctypes.c_void_p | None:
    """:func:`~torchbandits.native.pointer` of row ``i`` of ``t`` (``None`` for ``None``)."""
    return None if t is None else pointer(t, i)


class _State:
    """The arguments that :func:`score` and :func:`select` pass first: sizes, points, candidates,
    kernel, factors and ``z``, for a slice ``lo:hi`` of the runs (members ``lo·G:hi·G``)."""

    def __init__(self, groups: int, n: int, x: Tensor, cand: Tensor, kernel: tuple,
                 chol: Tensor, z: Tensor) -> None:
        self.groups, self.n, self.x, self.cand, self.kernel = groups, n, x, cand, kernel
        self.chol, self.z = chol, z

    def slice(self, lo: int, hi: int) -> tuple[int, tuple]:
        """``(first member lo·G, the leading C arguments)`` of runs ``lo:hi``."""
        g, x, cand, chol, z = self.groups, self.x, self.cand, self.chol, self.z
        m = lo * g
        return m, (hi - lo, g, self.n, cand.shape[1], cand.shape[2], _row(x, m), x.stride(0),
                   _row(cand, lo), cand.stride(0), *self.kernel, _row(chol, m), chol.stride(0),
                   chol.stride(1), _row(z, m), z.stride(0))


def _check(rc: int) -> None:
    """A negative return code: the C call could not allocate its scratch memory."""
    if rc < 0:
        raise MemoryError("torchbandits.native.exact_batch: scratch allocation failed")


def score(lib: ctypes.CDLL, groups: int, n: int, x: Tensor, cand: Tensor,
          kernel: tuple[Tensor, int, float | None, float], chol: Tensor, z: Tensor,
          mean: Tensor, var: Tensor, keep: tuple[Tensor, Tensor] | None = None,
          threads: int = 1) -> None:
    """The scoring of ``R = cand.shape[0]`` runs of ``groups`` members: one call, or one per
    slice of the runs on ``threads`` threads (the same numbers).

    Args:
        n: stored points per run; ``x``: the members' points ``[R·G, cap, d]``; ``cand``
            ``[R, A, d]`` (each run's ``[A, d]`` contiguous, any run stride); ``kernel``:
            ``(w [d] or [1], kind code, output scale or None, k(x, x))``
            (:data:`torchbandits.native.exact.KINDS`).
        chol: factors ``[R·G, cap', cap']``; ``z``: whitened targets ``[R·G, cap'']``.
        mean, var: written, ``[R·G, A]`` (contiguous).
        keep: ``(V [R·G, n, A], colsum(V ⊙ V) [R·G, A])`` also written (contiguous), if given.
    """
    state = _State(groups, n, x, cand, _kernel(kernel), chol, z)

    def runs(lo: int, hi: int) -> None:
        m, head = state.slice(lo, hi)
        _check(lib.tb_batch_score(*head, _row(mean, m), _row(var, m),
                                  *((None, None) if keep is None else (_row(keep[0], m),
                                                                       _row(keep[1], m)))))

    run_sliced(runs, cand.shape[0], threads)


def select(lib: ctypes.CDLL, groups: int, n: int, x: Tensor, cand: Tensor,
           kernel: tuple[Tensor, int, float | None, float], chol: Tensor, z: Tensor,
           bound: tuple[Tensor, Tensor], best: Tensor, arg: Tensor | None = None,
           pending: tuple[Tensor, Tensor] | None = None, hint: Tensor | None = None,
           threads: int = 1, alpha_cache: Tensor | None = None) -> None:
    """The select of ``R = cand.shape[0]`` runs of ``groups`` members (the arguments up to ``z``
    as :func:`score`'s): one call, or one per slice of the runs on ``threads`` threads (the same
    choices and bits).

    Args:
        bound: ``(β [R·G], div [R·G])`` (contiguous float64): run ``r``'s bound is
            ``min_g (sqrt(ρ²_{rG+g} / div_{rG+g}) β_{rG+g} + μ_{rG+g})``.
        best: written, ``[R]`` int64: the first index of each run's largest bound.
        arg: ``[R]`` int64, written if given: the minimising ``g`` at the chosen candidate.
        pending: ``(pieces [R·G, n + 2], points [R, d])``, written if given: the chosen
            candidate's ``(l, zᵀl, ‖l‖²)`` per member and its point, for :func:`append`.
        hint: ``[R]`` int64, read and written if given: the pruned select; with ``groups > 1``
            the member each run solves first (any value: the choice is the same), then the
            minimising ``g`` at its chosen candidate (0 with one group); ``None``: every member
            on every candidate, every row.
        alpha_cache: ``[R, PRUNE_HEAD + cap]`` float64 (contiguous rows,
            :data:`~torchbandits.native.exact.PRUNE_HEAD`), read and written if given with
            ``hint``: per run the pruned select's cache (zeros at first; any content gives the
            same choice; ``exact_prune.h``): the length of its last ``α``, the state of the
            poor-pruning rule (:data:`~torchbandits.native.exact.PRUNE_FORCED` forces the pruned
            select once), then ``α``'s values, from which the next pruned select guesses its
            first group (used where ``n <= cap``).
    """
    beta, div = bound
    state = _State(groups, n, x, cand, _kernel(kernel), chol, z)

    def runs(lo: int, hi: int) -> None:
        m, head = state.slice(lo, hi)
        _check(lib.tb_batch_select(*head, _row(beta, m), _row(div, m), _row(best, lo),
                                   _row(arg, lo),
                                   *((None, None) if pending is None else
                                     (_row(pending[0], m), _row(pending[1], lo))),
                                   _row(hint, lo), _row(alpha_cache, lo),
                                   0 if alpha_cache is None else alpha_cache.stride(0)))

    run_sliced(runs, cand.shape[0], threads)


def append(lib: ctypes.CDLL, groups: int, n: int, xnew: Tensor, ynew: Tensor,
           bufs: tuple[Tensor, Tensor, Tensor, Tensor],
           kernel: tuple[Tensor, int, float | None, float], regs: Tensor, work: Tensor,
           pending: tuple[Tensor, Tensor] | None = None, pivots: Tensor | None = None) -> int:
    """One append call of ``xnew`` ``[R, d]``, ``ynew`` ``[R]`` to ``R`` runs of ``groups``
    members holding ``n`` points, ``bufs = (x [R·G, cap, d], y [R·G, cap], L [R·G, cap, cap],
    z [R·G, cap])`` with room for row ``n``; ``regs`` ``[R·G]``: the regularisers; ``work``
    ``[R·G·(n + 2)]`` scratch; ``pending``: :func:`select`'s pieces for this state (used for the
    runs whose point holds the bits of the chosen candidate); ``pivots`` ``[R·G, cap'']``: a copy
    of the diagonals, whose column ``n`` gets the new pivots. Returns 0, or ``m + 1`` for the
    first member ``m`` whose pivot is not positive (nothing written)."""
    x, y, chol, z = bufs
    rc = lib.tb_batch_append(xnew.shape[0], groups, n, xnew.shape[1], xnew.data_ptr(),
                             ynew.data_ptr(), x.data_ptr(), x.stride(0), y.data_ptr(),
                             y.stride(0), *_kernel(kernel), chol.data_ptr(), chol.stride(0),
                             chol.stride(1), z.data_ptr(), z.stride(0), regs.data_ptr(),
                             work.data_ptr(),
                             *((None, None) if pending is None else (pending[0].data_ptr(),
                                                                     pending[1].data_ptr())),
                             *((None, 0) if pivots is None else (pivots.data_ptr(),
                                                                 pivots.stride(0))))
    _check(rc)
    return int(rc)

"""ctypes wrapper of ``bkb_step.c``: BKB's single-run round on a fixed arm set in C (Calandriello,
Carratino, Lazaric, Valko & Rosasco, COLT 2019, §3.1 eq. 4 and §3.2).

Three calls per round, each replacing a chain of small torch operations:

* :func:`dtc_round` — the posterior of :func:`~torchbandits.models.nystrom_arms.dtc_round`
  (``K_ZP`` and ``K_ZA`` gathered from the cached kernel rows of the pulled arms), plus
  ``S_t = Σ_a n_a σ̃²_a``, making the BLAS/LAPACK calls that torch makes for it (``potrf``,
  ``trsm``, ``gemm``, ``gemv``, ``dot``, resolved in torch's own library and passed to C as
  function pointers) with the same arguments: the same numbers bit for bit;
* :func:`ucb_argmax` — ``ũ = μ̃ + β̃ σ̃`` (eq. 4) and its first argmax (``σ̃`` by ``torch.sqrt``);
* :func:`linearized_draw` — the authors' code's dictionary draw ``u_j < n_j q̄ σ̃²_j`` from
  uniforms drawn by the caller with torch's generator (the same draws in the same order).

Batched BKB calls :func:`dtc_rounds`: :func:`dtc_round` for every run of a batch in one call, on
each run's slices of the padded per-run buffers (the same calls on the same shapes: run ``r``'s
numbers are the sequential run's); :func:`select_rounds`: the same with every run's width β̃_t
and UCB argmax taken in the loop (``σ̃`` by the vector square root that ``torch.sqrt`` calls,
:func:`vector_sqrt`); :func:`ucb_argmax_rounds`: every run's UCB argmax; and
:func:`record_rounds`: every run's count update after the pull. :func:`dtc_rounds` and
:func:`select_rounds` split the runs over :func:`torchbandits.native.threads_for` threads (one
call per slice; the same numbers), each slice's BLAS on one MKL thread (set and restored around
the call; without it every slice's MKL team oversubscribes the cores, 3× slower).

Each returns ``None`` when the compiled library is unavailable or off
(:func:`torchbandits.native.library`) or the inputs do not qualify (not contiguous CPU float64 /
int64); the caller then takes its torch path, which stays the reference.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from ..run_draw_threads import run_sliced
from . import pointer, signed, threads_for
from .torch_cpu import VML_MODE, blas_pointers, mkl_threads_local, vector_sqrt

__all__ = ["available", "blas_pointers", "dtc_round", "dtc_rounds", "linearized_draw", "qualifies",
           "record_rounds", "select_rounds", "set_dictionary", "ucb_argmax", "ucb_argmax_rounds",
           "vector_sqrt"]

_P = ctypes.c_void_p
_L = ctypes.c_long
_D = ctypes.c_double
_SIGNATURES = {
    "bkb_dtc_round": ([_P, _L, _L, _L, _P, _P, _P, _P, _P, _D, _D, _D, _D, _P, _P, _P],
                      ctypes.c_int),
    "bkb_dtc_rounds": ([_P, _L, _L, _L, _P, _L, _P, _L, _P, _L, _P, _P, _L, _P, _P, _D, _D, _D, _P,
                        _P, _P, _P, _P], _L),
    "bkb_select_rounds": ([_P, _L, _L, _L, _P, _L, _P, _L, _P, _L, _P, _P, _L, _P, _P, _D, _D, _D,
                           _P, _P, _P, _P, _P, _P, ctypes.c_longlong, _P, _P, _D, _D, _D, _D, _P,
                           _P], _L),
    "bkb_ucb_argmax": ([_L, _P, _P, _D, _P], _L),
    "bkb_draw": ([_L, _P, _P, _P, _P, _D, _P, _P], _L),
    "bkb_ucb_argmax_rounds": ([_L, _L, _P, _P, _P, _P], None),
    "bkb_record_rounds": ([_L, _L, _L, _L, _P, _P, _P, _P, _P, _P, _L, _P, _L, _P, _P, _L, _P, _P,
                           _L, _P, _P, _P, _D, _P, _L], _L),
    "bkb_set_dictionary": ([_L, _L, _L, _P, _L, _P, _L, _P, _P], None),
}


def _lib() -> ctypes.CDLL | None:
    """The compiled ``bkb_step`` library with its signatures set (once per library), or ``None``."""
    return signed("bkb_step", _SIGNATURES)


def available() -> bool:
    """Whether the compiled ``bkb_step`` library is available and on now, with the BLAS/LAPACK
    routines that torch calls."""
    return _lib() is not None and blas_pointers() is not None


def qualifies(*tensors: Tensor) -> bool:
    """Whether every tensor is a contiguous CPU tensor (the caller checks the dtypes: float64
    values, int64 indices)."""
    return all(t.is_cpu and t.is_contiguous() for t in tensors)


def dtc_round(rows: Tensor, idx: Tensor, sel: Tensor, counts: Tensor, sums: Tensor, lam: float,
              kconst: float, jitter: float, pivot_tol: float) -> tuple[Tensor, Tensor, float] | None:
    """``(μ̃ [A], σ̃² [A], S_t = Σ_j c_j σ̃²(x_j))`` of the round (ridge DTC variance clamped at 0),
    or ``None`` (no library, inputs that do not qualify, or a case the torch path handles: an
    empty dictionary, a ``K_ZZ`` that needs the pivoted factor, a ``G`` whose Cholesky fails).

    Args:
        rows: ``[≥ n, A]`` float64 kernel rows ``k(x_j, X_A)`` of the distinct pulled points
            (rows past ``n`` ignored).
        idx: ``[n]`` int64 arm rows of the pulled points.
        sel: ``[m]`` int64 positions of the dictionary among the pulled points.
        counts, sums: ``[n]`` float64 pull counts and reward sums.
        lam, kconst, jitter: λ, the kernel's constant ``k(x, x)``, the nugget on ``K_ZZ``.
        pivot_tol: the pivot threshold of :func:`~torchbandits.models.nystrom_updates.whitening`.
    """
    lib, fns = _lib(), blas_pointers()
    m, na = sel.shape[0], rows.shape[1]
    if (lib is None or fns is None or not m or rows.dtype != torch.float64 or counts.dtype != torch.float64
            or sums.dtype != torch.float64 or idx.dtype != torch.int64 or sel.dtype != torch.int64
            or not qualifies(rows, idx, sel, counts, sums)):
        return None
    mean = torch.empty(na, dtype=torch.float64)
    var = torch.empty(na, dtype=torch.float64)
    st = ctypes.c_double()
    code = lib.bkb_dtc_round(fns, m, idx.shape[0], na, pointer(rows), pointer(idx), pointer(sel),
                             pointer(counts), pointer(sums), lam, kconst, jitter, pivot_tol,
                             pointer(mean), pointer(var), ctypes.byref(st))
    return None if code else (mean, var, st.value)


def dtc_rounds(rows: Tensor, idx: Tensor, in_dict: Tensor, counts: Tensor, sums: Tensor,
               n_distinct: Tensor, lam: Tensor, width: int, kconst: float, jitter: float,
               pivot_tol: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None] | None:
    """The round of every run of a batch, each run's posterior the single-run :func:`dtc_round`
    on its slices of the padded buffers (the same BLAS/LAPACK calls on the same shapes; an empty
    dictionary gives the prior ``μ̃ = 0``, ``σ̃² = k/λ``): ``(μ̃ [R, A], σ̃² [R, A], σ̃² at the
    pulled points [R, width] (0 past ``n_r``), S_t [R], failed)``, ``failed`` ``None`` when every
    run's round ran, else the ``[k]`` int64 runs the torch path handles (a pivoted ``K_ZZ``, a
    failed Cholesky of ``G``: their rows are not set); ``None`` when there is no library or the
    inputs do not qualify.

    Args:
        rows: ``[R, ≥ width, A]`` float64 kernel rows of every run's distinct pulled points.
        idx: ``[R, ≥ width]`` int64 arm rows of the pulled points.
        in_dict: ``[R, ≥ width]`` bool dictionary masks.
        counts, sums: ``[R, ≥ width]`` float64 pull counts and reward sums.
        n_distinct: ``[R]`` int64 numbers ``n_r ≤ width`` of distinct pulled points.
        lam: ``[R]`` float64 regularisers λ_r.
        width, kconst, jitter, pivot_tol: as :func:`dtc_round` (``width = max_r n_r``).
    """
    return _rounds(rows, idx, in_dict, counts, sums, n_distinct, lam, width, kconst, jitter,
                   pivot_tol, None)  # type: ignore[return-value]


def select_rounds(rows: Tensor, idx: Tensor, in_dict: Tensor, counts: Tensor, sums: Tensor,
                  n_distinct: Tensor, lam: Tensor, width: int, kconst: float, jitter: float,
                  pivot_tol: float, beta: Tensor | None, c: Tensor | None, k1: float, k2: float,
                  log_delta: float, scale: float
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor] | None:
    """:func:`dtc_rounds` and every run's choice, taken in the same loop while the run's row is
    in cache: ``(μ̃, σ̃², σ̃² at the pulled points, S_t, failed, β̃_t [R], choice [R] int64)``.
    ``σ̃ = torch.sqrt(σ̃²)`` by the routine ``torch.sqrt`` calls (:func:`vector_sqrt`); the width
    ``β̃_t`` is ``beta`` ``[R]`` when given (the constant rule), else ``(c_r + k1·sqrt(k2·max(S_t,
    0) + log_delta))·scale`` with ``c`` ``[R]`` (float64), the float arithmetic of
    :meth:`BKBBeta.radius <torchbandits.confidence.bkb.BKBBeta.radius>` once the caller has
    folded its constants (Theorem 2 / App. D.1); the choice is the first argmax of ``fma(σ̃, β̃,
    μ̃)`` (:func:`ucb_argmax_rounds`). A failed run's width and choice are not set. ``None``
    when :func:`dtc_rounds` would give ``None``, or there is no such square root."""
    if vector_sqrt() is None:
        return None
    given = beta if beta is not None else c
    if (given is None or given.dtype != torch.float64 or given.shape != (rows.shape[0],)
            or not qualifies(given)):
        return None
    return _rounds(rows, idx, in_dict, counts, sums, n_distinct, lam, width, kconst, jitter,
                   pivot_tol, (beta, c, k1, k2, log_delta, scale))  # type: ignore[return-value]


def _rounds(rows: Tensor, idx: Tensor, in_dict: Tensor, counts: Tensor, sums: Tensor,
            n_distinct: Tensor, lam: Tensor, width: int, kconst: float, jitter: float,
            pivot_tol: float, ucb: tuple | None) -> tuple[Tensor | None, ...] | None:
    """The call behind :func:`dtc_rounds` (``ucb`` ``None``) and :func:`select_rounds`."""
    lib, fns = _lib(), blas_pointers()
    r, a = rows.shape[0], rows.shape[2]
    f64, i64 = torch.float64, torch.int64
    if (lib is None or fns is None or rows.dtype != f64 or counts.dtype != f64 or sums.dtype != f64
            or lam.dtype != f64 or idx.dtype != i64 or n_distinct.dtype != i64
            or in_dict.dtype != torch.bool or sums.stride(0) != counts.stride(0)
            or min(rows.shape[1], idx.shape[1], in_dict.shape[1], counts.shape[1]) < width
            or not qualifies(rows, idx, in_dict, counts, sums, n_distinct, lam)):
        return None
    mean = torch.empty(r, a, dtype=f64)
    var = torch.empty(r, a, dtype=f64)
    pvar = torch.empty(r, width, dtype=f64)
    st = torch.empty(r, dtype=f64)
    codes = torch.empty(r, dtype=torch.int32)
    beta = choice = None
    if ucb is not None:
        beta_in, c, k1, k2, log_delta, scale = ucb
        beta = torch.empty(r, dtype=f64)
        choice = torch.empty(r, dtype=i64)
    failed: list[int] = []   # per slice (list.append is atomic across threads)

    def runs(lo: int, hi: int) -> None:   # runs lo:hi, one call (a slice on a pool thread)
        args = (fns, hi - lo, a, width, pointer(rows, lo), rows.stride(0),
                pointer(idx, lo), idx.stride(0), pointer(in_dict, lo), in_dict.stride(0),
                pointer(counts, lo), pointer(sums, lo), counts.stride(0),
                pointer(n_distinct, lo), pointer(lam, lo), kconst, jitter, pivot_tol,
                pointer(mean, lo), pointer(var, lo), pointer(pvar, lo), pointer(st, lo),
                pointer(codes, lo))
        prev = one_mkl(1) if one_mkl is not None else None   # this thread's BLAS: one thread
        try:
            if ucb is None:
                count = lib.bkb_dtc_rounds(*args)
            else:
                count = lib.bkb_select_rounds(*args, vector_sqrt(), VML_MODE,
                                              None if beta_in is None else pointer(beta_in, lo),
                                              None if c is None else pointer(c, lo), k1, k2,
                                              log_delta, scale, pointer(beta, lo),
                                              pointer(choice, lo))
        finally:
            if prev is not None:
                one_mkl(prev)
        failed.append(count)

    slices = threads_for(r)
    one_mkl = mkl_threads_local() if slices > 1 else None
    run_sliced(runs, r, slices)
    extra: tuple[Tensor, ...] = () if ucb is None else (beta, choice)
    return (mean, var, pvar, st, (codes != 0).nonzero()[:, 0] if any(failed) else None, *extra)


def ucb_argmax(mean: Tensor, sd: Tensor, beta: float) -> tuple[Tensor, int] | None:
    """``(ũ = μ̃ + β̃ σ̃ [A], its first argmax)`` (``sd = torch.sqrt(σ̃²)``, taken by the caller)
    for contiguous CPU float64 ``[A]`` inputs, the same bits as ``torch.add(mean, sd,
    alpha=beta)`` (one rounding) and ``torch.argmax``; else ``None``."""
    lib = _lib()
    if (lib is None or mean.dtype != torch.float64 or sd.dtype != torch.float64
            or mean.shape != sd.shape or not qualifies(mean, sd)):
        return None
    ucb = torch.empty_like(mean)
    i = lib.bkb_ucb_argmax(mean.shape[0], pointer(mean), pointer(sd), beta, pointer(ucb))
    return ucb, int(i)


def ucb_argmax_rounds(mean: Tensor, sd: Tensor, beta: Tensor) -> Tensor | None:
    """Every run's first UCB argmax ``[R]`` (int64): ``argmax_a μ̃[r, a] + β̃_r σ̃[r, a]`` (eq. 4)
    rounded once per entry (a fused multiply-add), a NaN the largest — the choice of
    ``torch.argmax(torch.addcmul(mean, sd, beta[:, None]), 1)`` and of :func:`ucb_argmax` per run,
    without forming the UCB; ``mean``, ``sd`` ``[R, A]``, ``beta`` ``[R]`` contiguous CPU
    float64. ``None`` when they do not qualify or there is no library."""
    lib = _lib()
    f64 = torch.float64
    if (lib is None or mean.dim() != 2 or mean.shape != sd.shape or mean.shape[1] < 1
            or beta.shape != mean.shape[:1] or any(t.dtype != f64 for t in (mean, sd, beta))
            or not qualifies(mean, sd, beta)):
        return None
    choice = torch.empty(mean.shape[0], dtype=torch.int64)
    lib.bkb_ucb_argmax_rounds(mean.shape[0], mean.shape[1], pointer(mean), pointer(sd),
                              pointer(beta), pointer(choice))
    return choice


def record_rounds(cand: Tensor, choice: Tensor, x: Tensor, y: Tensor, var: Tensor, pvar: Tensor,
                  px: Tensor, counts: Tensor, sums: Tensor, n_distinct: Tensor, idx: Tensor,
                  qbar: float = 0.0, probs: Tensor | None = None
                  ) -> tuple[Tensor, Tensor, Tensor] | None:
    """Every run's count update after its pull (§3.2), in place, when every run played its
    selected arm (``x[r] == cand[r, choice[r]]``): the point joins its first equal distinct point
    or becomes the next one (as :meth:`BatchedCounts.record
    <torchbandits.models.batched_counts.BatchedCounts.record>`: ``counts += 1``, ``sums += y``;
    ``px``, ``n_distinct`` and the fixed arm set's arm rows ``idx`` at a new point). Returns
    ``(slot [R] int64, new [R] bool, var [R, n + 1])`` — ``var`` the dictionary draw's variances:
    ``pvar`` ``[R, n]``, 0 at ``n``, ``var[r, choice[r]]`` at a new point — or ``None`` with
    nothing changed (a run played another point, no library, inputs that do not qualify).

    Args:
        cand: ``[R, A, d]`` the round's arms; ``choice``: ``[R]`` int64 selected arms.
        x, y: ``[R, d]`` played points and ``[R]`` rewards.
        var: ``[R, A]`` the arms' variances under the model that chose; ``pvar``: ``[R, n]``
            those of the pulled points (``n = max_r n_r``).
        px, counts, sums, n_distinct: the runs' statistics ``[R, ≥ n + 1, d]``, ``[R, ≥ n + 1]``,
            ``[R]`` (int64); idx: ``[R, ≥ n + 1]`` int64 arm rows of the pulled points.
        qbar, probs: with ``probs`` ``[R, ≥ n + 1]`` (float64, rows contiguous), the binomial
            draw's probabilities ``min(q̄ σ̃², 1)`` (0 where ``σ̃² ≤ 0`` or NaN, which draw
            nothing, as with ``torch.clamp(q̄ · var.clamp_min(0), max=1).nan_to_num(0)``) are
            written into ``probs[:, :n + 1]``.
    """
    lib = _lib()
    f64, i64 = torch.float64, torch.int64
    r, a, d = cand.shape
    n = pvar.shape[1]
    if (lib is None or any(t.dtype != f64 for t in (cand, x, y, var, pvar, px, counts, sums))
            or any(t.dtype != i64 for t in (choice, n_distinct, idx)) or x.shape != (r, d)
            or y.shape != (r,) or var.shape != (r, a) or pvar.shape[0] != r or choice.shape != (r,)
            or px.shape[0] != r or px.shape[2] != d or min(px.shape[1], counts.shape[1],
                                                             idx.shape[1]) < n + 1
            or sums.stride(0) != counts.stride(0) or sums.shape != counts.shape
            or not qualifies(cand, choice, x, y, var, pvar, px, counts, sums, n_distinct, idx)
            or (probs is not None and (probs.dtype != f64 or probs.shape[0] != r or probs.is_cuda
                                       or probs.shape[1] < n + 1 or probs.stride(1) != 1))):
        return None
    slot = torch.empty(r, dtype=i64)
    new = torch.empty(r, dtype=torch.bool)
    out = torch.empty(r, n + 1, dtype=f64)
    missed = lib.bkb_record_rounds(r, a, d, n + 1, pointer(cand), pointer(choice), pointer(x),
                                   pointer(y), pointer(var), pointer(pvar), n, pointer(px),
                                   px.stride(0), pointer(counts), pointer(sums), counts.stride(0),
                                   pointer(n_distinct), pointer(idx), idx.stride(0), pointer(slot),
                                   pointer(new), pointer(out), qbar,
                                   None if probs is None else pointer(probs),
                                   0 if probs is None else probs.stride(0))
    return None if missed else (slot, new, out)


def set_dictionary(copies: Tensor, in_dict: Tensor, m_theory: Tensor, empty: Tensor) -> bool:
    """The drawn dictionaries (§3.1) in place: ``in_dict[:, :w] = copies > 0`` (``False``
    beyond), ``m_theory = Σ_j copies_j`` and ``empty += 1`` where nothing is kept, for the copies
    ``[R, w]`` (whole float64 numbers, rows contiguous), ``in_dict`` ``[R, ≥ w]`` bool and
    ``m_theory``, ``empty`` ``[R]`` int64 (contiguous, CPU); ``False`` (nothing changed) when
    they do not qualify or there is no library."""
    lib = _lib()
    r, w = copies.shape
    if (lib is None or copies.dtype != torch.float64 or in_dict.dtype != torch.bool
            or m_theory.dtype != torch.int64 or empty.dtype != torch.int64
            or in_dict.shape[0] != r or in_dict.shape[1] < w or m_theory.shape != (r,)
            or empty.shape != (r,) or copies.stride(1) != 1 or not copies.is_cpu
            or not qualifies(in_dict, m_theory, empty)):
        return False
    lib.bkb_set_dictionary(r, w, in_dict.shape[1], pointer(copies), copies.stride(0),
                           pointer(in_dict), in_dict.stride(0), pointer(m_theory), pointer(empty))
    return True


def linearized_draw(generator: torch.Generator, counts: Tensor, var: Tensor, idx: Tensor,
                    qbar: float, mask: Tensor) -> Tensor | None:
    """The dictionary positions ``sel`` ``[m]`` (int64) of the draw ``u_j < (n_j q̄) σ̃²(x_j)``
    with ``σ̃²(x_j) = var[idx_j]`` and ``u = torch.rand(n, generator=generator, dtype=float64)``
    (the draws of :meth:`RLSResampler.draw <torchbandits.models.rls.RLSResampler.draw>`, made
    only once the inputs qualify), the mask written into ``mask`` (bool ``[n]``); ``None`` (and
    nothing drawn) when they do not."""
    lib = _lib()
    n = counts.shape[0]
    if (lib is None or mask.dtype != torch.bool or var.dtype != torch.float64
            or counts.dtype != torch.float64 or idx.dtype != torch.int64 or idx.shape[0] != n
            or mask.shape[0] != n or not qualifies(counts, var, idx, mask)):
        return None
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    sel = torch.empty(n, dtype=torch.int64)
    m = lib.bkb_draw(n, pointer(u), pointer(counts), pointer(var), pointer(idx), qbar,
                     pointer(mask), pointer(sel))
    return sel[:m]

"""BKB's per-round Nyström posterior on a fixed arm set, in one pass (Calandriello, Carratino,
Lazaric, Valko & Rosasco, COLT 2019, §3.1 eq. 4 and the count-based caching of §3.2).

Every round BKB rebuilds the DTC posterior from scratch on a fresh dictionary and scores all
``A`` arms. On a fixed arm set every kernel value it needs is a column of the cached kernel rows
of the dictionary over the arms, ``K_ZA`` ``[m, A]`` (:class:`~torchbandits.models.arm_rows.ArmRowCache`).
With the arm rows ``idx`` ``[n]`` of the distinct pulled points, the dictionary's positions
``sel`` ``[m]`` among them, pull counts ``c`` and reward sums ``s`` ``[n]``:

* ``K_PZ = K_ZA[:, idx]ᵀ`` ``[n, m]`` (or rows of the pulled points' Gram matrix),
  ``K_ZZ = K_PZ[sel]`` ``[m, m]`` (gathers, no kernel call);
* ``P = L⁻¹`` (:func:`~torchbandits.models.nystrom_updates.whitening`, pivoted when ``K_ZZ`` is
  numerically singular), ``Eᵀ = P K_ZP``, ``A = EᵀCE + λI``, ``w = A⁻¹Eᵀs`` (the system of
  :func:`~torchbandits.models.nystrom_updates.whitened_system`);
* ``G = I − λA⁻¹ = HHᵀ`` (``A = RRᵀ``, ``A⁻¹ = NᵀN`` with ``N = R⁻¹``; ``G``'s eigenvalues
  ``s/(s+λ)`` lie in ``[0, 1)``), so that ``λσ̃² = k − ‖f‖² + λfᵀA⁻¹f = k − ‖Hᵀf‖²``;
* one product ``W K_ZA`` with ``W = [HᵀP; wᵀP]`` ``[r+1, m]`` gives ``μ̃`` and ``λσ̃²`` at every
  arm: ``(r+1)·m·A`` multiply-adds, half those of the ``[P; (λA⁻¹ − I)P; wᵀP]`` product
  (:func:`~torchbandits.models.nystrom.whitened_scores`) the model scores with, which is the
  fallback when ``G``'s Cholesky fails (``G`` numerically singular).

These are the statements of :meth:`NystromKernelRidge.rebuild_from_counts
<torchbandits.models.nystrom_updates.NystromUpdates.rebuild_from_counts>` followed by
:meth:`~torchbandits.models.nystrom.NystromKernelRidge.score` (whitened, stationary kernel), so
the numbers are the same up to rounding (BKB's UCBs within 1e-9 of the model route round after
round, and the half-width product within 1e-10 of the full one, tested); what is left out is
writing the model's buffers (``x``, counts, sums, ``Z``, ``P``, ``A⁻¹``, ``Eᵀs``, ``E``) and its
bookkeeping. ``P`` is the compact whitening ``[r, m]`` (:func:`whitening` with
``compact=True``: a pivoted ``K_ZZ`` of numerical rank ``r < m`` drops its null coordinates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .nystrom import whitened_scores, whitened_scoring_matrix
from .nystrom_updates import whitening

__all__ = ["dtc_round", "identity", "ones", "tensor_version"]

_SHARED: dict[tuple[str, tuple[int, ...], torch.dtype, torch.device], Tensor] = {}


def _shared(kind: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A constant tensor (``"eye"``: ``I_m`` for ``shape = (m,)``; ``"ones"``: all ones of
    ``shape``) of ``like``'s dtype and device, made once and shared (read-only: never modify it)."""
    key = (kind, shape, like.dtype, like.device)
    out = _SHARED.get(key)
    if out is None:
        if len(_SHARED) > 1024:
            _SHARED.clear()
        opts = {"dtype": like.dtype, "device": like.device}
        out = _SHARED[key] = torch.eye(*shape, **opts) if kind == "eye" else torch.ones(shape, **opts)
    return out


def identity(m: int, like: Tensor) -> Tensor:
    """``I_m`` of ``like``'s dtype and device, made once and shared (read-only: never modify it)."""
    return _shared("eye", (m,), like)


def ones(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """All ones of ``shape`` (``()``: the scalar ``1``) of ``like``'s dtype and device, made once and
    shared (read-only: never modify it)."""
    return _shared("ones", shape, like)


def tensor_version(t: Tensor) -> int:
    """The in-place modification counter of ``t`` (bumped by every in-place torch operation on
    it or on a view of it): equal counters on the same tensor object mean unchanged contents."""
    return t._version


def dtc_round(kza: Tensor, kzp: Tensor, sel: Tensor, counts: Tensor, sums: Tensor, lam: float,
              kconst: float, jitter: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(μ̃, σ̃²)`` ``([A], [A])`` at every arm, the **ridge** (1/λ-scaled) DTC variance clamped
    at 0 (eq. 4), rebuilt from the count statistics on the round's dictionary.

    ``K_ZP`` is passed in (BKB gathers it by rows from the pulled points' Gram matrix; on a fixed
    arm set it is ``K_ZA[:, idx]``, the columns of the pulled arms): ``P = L⁻¹`` of
    ``K_ZZ = LLᵀ`` (compact, pivoted when ``K_ZZ`` is numerically singular: :func:`whitening`),
    ``Eᵀ = PK_ZP`` ``[r, n]``, ``A = EᵀCE + λI = RRᵀ``, ``N = R⁻¹``, ``w = NᵀNEᵀs``,
    ``G = I − λNᵀN = HHᵀ`` and one product ``[HᵀP; wᵀP] K_ZA`` ``[r+1, A]``: ``μ̃ = wᵀPk_Z``,
    ``σ̃² = k/λ − ‖HᵀPk_Z‖²/λ`` (the ``r`` rows ``g = HᵀPK_ZA`` squared in place, then one
    product ``k/λ − 1ᵀ(g∘g)/λ``: no ``[r, A]`` temporary). When ``G``'s Cholesky
    fails (numerically singular) the model's ``[P; (λA⁻¹ − I)P; wᵀP]`` product scores. (``A⁻¹`` by
    ``cholesky_inverse`` and ``G``'s upper factor would save three operations but move the UCBs
    by up to 4e-8 on an ill-conditioned ``G``: not taken.)

    Args:
        kza: ``K_ZA`` ``[m, A]``, the kernel rows of the dictionary over the arms (``m ≥ 1``).
        kzp: ``K_ZP`` ``[m, n]``, the same rows at the distinct pulled points (its columns ``sel``
            are ``K_ZZ``).
        sel: ``[m]`` positions of the dictionary among the pulled points.
        counts, sums: ``[n]`` pull counts ``c`` and reward sums ``s``.
        lam: the ridge regulariser λ.
        kconst: ``k(x, x)``, the same for every ``x`` (a stationary kernel).
        jitter: nugget ``η`` on the diagonal of ``K_ZZ`` (as the model's).
    """
    m = sel.shape[0]
    kzz = kzp.index_select(1, sel)
    eye = identity(m, kzp)
    if jitter:
        kzz = kzz + jitter * eye
    p = whitening(kzz, eye, kconst + jitter, compact=True)  # P [r, m]
    r = p.shape[0]
    eye_r = eye if r == m else identity(r, kzp)
    et = torch.mm(p, kzp)  # Eᵀ [r, n]
    chol_a = torch.linalg.cholesky_ex(torch.addmm(eye_r, et * counts, et.mT, beta=lam))[0]
    n_inv = torch.linalg.solve_triangular(chol_a, eye_r, upper=False)  # N = R⁻¹, A⁻¹ = NᵀN
    n_t = n_inv.mT
    w = torch.mv(n_t, torch.mv(n_inv, torch.mv(et, sums)))  # A⁻¹Eᵀs
    h, info = torch.linalg.cholesky_ex(torch.addmm(eye_r, n_t, n_inv, alpha=-lam))  # G = HHᵀ
    if not int(info):
        out = torch.mm(torch.mm(torch.cat([h.mT, w.unsqueeze(0)]), p), kza)  # [HᵀP; wᵀP] K_ZA
        g2 = out[:r].square_()  # g∘g in place (out is this round's own)
        var = torch.addmm(ones((), kza), ones((1, r), kza), g2, beta=kconst / lam, alpha=-1.0 / lam)
        return out[r], var[0].clamp_min_(0.0)  # (k − ‖g‖²)/λ ≤ k/λ: ‖g‖² ≥ 0
    mean, var = whitened_scores(whitened_scoring_matrix(p, n_t @ n_inv, w, lam) @ kza, r, kconst)
    return mean, var.clamp_(0.0, kconst).div_(lam)

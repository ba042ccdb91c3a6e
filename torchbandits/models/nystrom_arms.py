"""BKB's per-round Nyström posterior on a fixed arm set, in one pass (Calandriello, Carratino,
Lazaric, Valko & Rosasco, COLT 2019, §3.1 eq. 4 and the count-based caching of §3.2).

Every round BKB rebuilds the DTC posterior from scratch on a fresh dictionary and scores all
``A`` arms. On a fixed arm set every kernel value it needs is a column of the cached kernel rows
of the dictionary over the arms, ``K_ZA`` ``[m, A]`` (:class:`~torchbandits.models.arm_rows.ArmRowCache`).
With the arm rows ``idx`` ``[n]`` of the distinct pulled points, the dictionary's positions
``sel`` ``[m]`` among them, pull counts ``c`` and reward sums ``s`` ``[n]``:

* ``K_PZ = K_ZA[:, idx]ᵀ`` ``[n, m]``, ``K_ZZ = K_PZ[sel]`` ``[m, m]`` (gathers, no kernel call);
* ``P = L⁻¹`` (:func:`~torchbandits.models.nystrom_updates.whitening`, pivoted when ``K_ZZ`` is
  numerically singular), ``E = K_PZ Pᵀ``, ``A = EᵀCE + λI``, ``w = A⁻¹Eᵀs``
  (:func:`~torchbandits.models.nystrom_updates.whitened_system`);
* one product ``W K_ZA`` with ``W = [P; (λA⁻¹ − I)P; wᵀP]`` gives ``μ̃`` and
  ``λσ̃² = k − ‖f‖² + λ fᵀA⁻¹f`` at every arm (:func:`~torchbandits.models.nystrom.whitened_scores`).

These are the statements of :meth:`NystromKernelRidge.rebuild_from_counts
<torchbandits.models.nystrom_updates.NystromUpdates.rebuild_from_counts>` followed by
:meth:`~torchbandits.models.nystrom.NystromKernelRidge.score` (whitened, stationary kernel), so
the numbers are the same up to BLAS rounding (the model multiplies strided views of its
capacity buffers; 1e-10 apart on BKB's UCBs after 600 rounds); what is left out is writing the model's buffers
(``x``, counts, sums, ``Z``, ``P``, ``A⁻¹``, ``Eᵀs``, ``E``) and its bookkeeping, about 60 of the
~95 tensor operations of a round at A = 1000.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .nystrom import whitened_scores, whitened_scoring_matrix
from .nystrom_updates import whitened_system, whitening

__all__ = ["arm_posterior"]


def arm_posterior(kza: Tensor, idx: Tensor, sel: Tensor, counts: Tensor, sums: Tensor,
                  lam: float, kconst: float, jitter: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(μ̃, λσ̃²)`` ``([A], [A])`` at every arm (the GP-scale variance, clamped to ``[0, k]``).

    Args:
        kza: ``K_ZA`` ``[m, A]``, the kernel rows of the dictionary over the arms (``m ≥ 1``).
        idx: ``[n]`` arm rows of the distinct pulled points.
        sel: ``[m]`` positions of the dictionary among the pulled points.
        counts, sums: ``[n]`` pull counts ``c`` and reward sums ``s``.
        lam: the ridge regulariser λ.
        kconst: ``k(x, x)``, the same for every ``x`` (a stationary kernel).
        jitter: nugget ``η`` on the diagonal of ``K_ZZ`` (as the model's).
    """
    m = sel.shape[0]
    kxz = kza.index_select(1, idx).mT  # K_PZ [n, m]
    kzz = kxz.index_select(0, sel)
    eye = torch.eye(m, dtype=kza.dtype, device=kza.device)
    if jitter:
        kzz = kzz + jitter * eye
    linv = whitening(kzz, eye, kconst + jitter)
    _, _, a_inv, rhs = whitened_system(kxz, linv, counts, sums, lam)
    out = whitened_scoring_matrix(linv, a_inv, a_inv @ rhs, lam) @ kza
    mean, var = whitened_scores(out, m, kconst)
    return mean, var.clamp_(0.0, kconst)

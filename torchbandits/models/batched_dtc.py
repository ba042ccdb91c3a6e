"""BKB's per-round DTC posterior for ``R`` runs at once, each on its own padded dictionary, from
kernel blocks (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, §3.1 eq. 4 and the
count-based caching of §3.2).

The statements of :func:`~torchbandits.models.nystrom_arms.dtc_round` (the sequential fused
round) with a leading run dimension. For run ``r`` with dictionary ``Z_r`` (``m_r`` anchors,
padded to ``M = max_r m_r``; ``live`` ``[R, M]`` marks the real ones), distinct pulled points
with pull counts ``c`` and reward sums ``s`` (padded to ``N`` with ``c = s = 0``):

* ``P_r = L_r⁻¹`` for the lower Cholesky factor of ``K_ZZ + ηI``, padded with the identity
  (``[[K_r, 0], [0, I]]``: one batched Cholesky for every run), its padded rows and columns set to
  zero afterwards; a run whose ``K_ZZ`` is numerically singular is whitened alone by the pivoted
  factor of :func:`~torchbandits.models.nystrom_updates.whitening` (as the sequential model);
* ``E = K_PZ Pᵀ`` ``[R, N, M]``, ``A = EᵀCE + λI``, ``w = A⁻¹Eᵀs`` (the padded coordinates of
  ``E`` are 0, so ``A`` is ``λ`` there and ``A⁻¹`` is ``1/λ``);
* one batched product ``W K_ZA`` with ``W = [P; (λA⁻¹ − I)P; wᵀP]`` ``[R, 2M+1, M]`` gives
  ``μ̃ = wᵀf`` and ``λσ̃² = k − ‖f‖² + λfᵀA⁻¹f`` at every candidate (the padded rows of ``W`` are
  0, so the junk kernel rows of padded anchors drop out); a run with fewer candidates than
  anchors is scored by ``f = P k_Z`` and ``A⁻¹f`` instead, as the sequential model does
  (:meth:`DTCSystem.scores`);
* **half-width** (``half=True``, a stationary kernel: the fixed arm set's fused round of
  :func:`~torchbandits.models.nystrom_arms.dtc_round`): ``A = RRᵀ``, ``N = R⁻¹``,
  ``w = NᵀN Eᵀs`` and ``G = I − λNᵀN = HHᵀ`` (one batched Cholesky), so that
  ``λσ̃² = k − ‖HᵀP k_Z‖²``; one product with ``W = [wᵀP; HᵀP]`` ``[R, M+1, M]``, half the rows.
  Every column of ``W`` beyond a run's size ``m_r`` and every row of ``HᵀP`` beyond it is 0, so
  a few runs at a time are scored at their own width ``m_c = max m_r`` (the sizes on the host):
  ``W[:, :m_c+1, :m_c] K_ZA[:, :m_c]``, the padded work of a group cut to its chunks'.
  A dead coordinate (a padded anchor, or a null row of a pivoted ``P``) has ``A = λ``, so ``G``
  is 0 there: its block of ``G`` is replaced by the identity (``H`` is then the identity there,
  decoupled from the live block, and the zero rows of ``P`` make those rows of ``HᵀP`` exactly
  0). A run whose live ``G`` is numerically singular (Cholesky fails) is scored alone by the
  full product with ``A⁻¹ = NᵀN``, as the sequential fallback.

``λ`` may differ per run (``[R]``). The numbers are the sequential ones up to BLAS rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .nystrom import whitened_scores, whitened_scoring_matrix
from .nystrom_updates import PIVOT_TOL, whitening

__all__ = ["SCORE_RUNS", "DTCSystem", "batched_whitening", "compact_positions", "dtc_system"]

#: runs per product of the half-width scoring, each at its own width: ``[s, m_c+1, A]`` stays in
#: the L2 cache (16 runs at once streamed it through memory: 11.5 against 9.5 ms per round at
#: R = 64)
SCORE_RUNS = 4


def compact_positions(mask: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Positions of the set entries of ``mask`` ``[R, N]`` (bool), in increasing order, padded to
    ``width`` columns: ``(pos [R, width] long, live [R, width] bool)``; padded positions are 0.
    Row ``r`` holds ``mask[r].nonzero()`` first, with no host read."""
    n = mask.shape[1]
    key = torch.where(mask, torch.arange(n, device=mask.device), n)      # set entries sort first
    pos = torch.sort(key, dim=1, stable=True).values[:, :width]
    if pos.shape[1] < width:
        pos = torch.nn.functional.pad(pos, (0, width - pos.shape[1]), value=n)
    live = pos < n
    return pos.masked_fill(~live, 0), live


def batched_whitening(kzz: Tensor, live: Tensor, scale: Tensor) -> Tensor:
    """``P`` ``[R, M, M]`` of padded Gram matrices ``kzz`` ``[R, M, M]`` (jitter included; the
    padded entries are ignored) with ``live`` ``[R, M]`` and ``scale`` ``[R]`` = ``max k(z,z) + η``:
    ``L⁻¹`` of ``[[K_r, 0], [0, I]]`` with the padded rows and columns zeroed; a run whose plain
    factor fails or has a pivot² ``≤ PIVOT_TOL·scale`` gets the pivoted
    :func:`~torchbandits.models.nystrom_updates.whitening` of its ``m_r × m_r`` block (one host
    read of the flags, then a loop over those runs only)."""
    mm = kzz.shape[-1]
    pair = live[:, :, None] & live[:, None, :]
    padded = torch.where(pair, kzz, 0.0) + torch.diag_embed((~live).to(kzz.dtype))
    chol, info = torch.linalg.cholesky_ex(padded)
    eye = torch.eye(mm, dtype=kzz.dtype, device=kzz.device)
    p = torch.linalg.solve_triangular(chol, eye.expand_as(chol), upper=False)
    pivots = torch.diagonal(chol, dim1=-2, dim2=-1).square()
    bad = (info != 0) | ((pivots <= PIVOT_TOL * scale[:, None]) & live).any(-1)
    if bool(bad.any()):
        sizes = live.sum(-1)
        for run in bad.nonzero()[:, 0].tolist():   # numerically singular: pivoted, run alone
            m_r = int(sizes[run])
            p[run].zero_()
            p[run, :m_r, :m_r] = whitening(kzz[run, :m_r, :m_r], eye[:m_r, :m_r], float(scale[run]))
    return p * pair


@dataclass
class DTCSystem:
    """The rebuilt posterior of ``R`` padded dictionaries: ``P`` ``[R, M, M]``, the Cholesky
    factor ``chol_a`` of ``A`` and ``A⁻¹`` (:meth:`a_inverse`, on first use), mean
    weights ``w = A⁻¹Eᵀs`` ``[R, M]``, ``λ`` ``[R]`` (``lam_scalar``: the common λ, if any),
    dictionary sizes ``[R]`` and their range ``(m_min, m_max)`` on the host. With the half-width
    form (:func:`half_width`): ``half`` = ``[wᵀP; HᵀP]`` ``[R, M+1, M]``, ``n_inv`` = ``N``
    ``[R, M, M]``, the live widths ``rank`` (rows of ``P`` not 0), the ``fallback`` runs and the
    dictionary sizes on the host ``widths`` (if known: the chunks' own widths)."""

    p: Tensor
    a_inv: Tensor | None
    w: Tensor | None
    lam: Tensor
    sizes: Tensor
    m_range: tuple[int, int]
    lam_scalar: float | None = None
    _big: Tensor | None = None
    half: Tensor | None = None
    n_inv: Tensor | None = None
    rank: list[int] = field(default_factory=list)
    fallback: list[int] = field(default_factory=list)
    chol_a: Tensor | None = None
    widths: list[int] | None = None
    score_runs: int = SCORE_RUNS

    def a_inverse(self) -> Tensor:
        """``A⁻¹`` ``[R, M, M]`` (``cholesky_inverse`` of ``chol_a``, built on first use: the
        half-width form scores the arms without it)."""
        if self.a_inv is None:
            assert self.chol_a is not None
            self.a_inv = torch.cholesky_inverse(self.chol_a)
        return self.a_inv

    def scoring_matrix(self) -> Tensor:
        """``W = [P; (λA⁻¹ − I)P; wᵀP]`` ``[R, 2M+1, M]`` (built once)."""
        if self._big is None:
            assert self.w is not None
            p, q = self.p, self.a_inverse()
            if self.lam_scalar is not None:
                h = torch.baddbmm(p, q, p, beta=-1.0, alpha=self.lam_scalar)
            else:
                h = (q @ p) * self.lam[:, None, None] - p
            self._big = torch.cat([p, h, self.w[:, None, :] @ p], dim=1)
        return self._big

    def scores(self, kz: Tensor, kdiag: Tensor | float, kconst: float | None,
               many: bool = False) -> tuple[Tensor, Tensor]:
        """``(μ̃, λσ̃²)`` ``([R, A], [R, A])`` of points with kernel columns ``kz`` ``[R, M, A]``,
        clamped to ``[0, k]``, run by run as the sequential model scores them: with ``A ≥ m_r``
        (or ``many``) one product with :meth:`scoring_matrix` (``λσ̃² = k + fᵀh``), else
        ``f = P k_Z``, ``λσ̃² = (k − ‖f‖²)₊ + λ fᵀA⁻¹f``. With the half-width form (and not
        ``many``): :meth:`half_scores`."""
        if self.half is not None and kconst is not None and not many:
            return self.half_scores(kz, kconst)
        mm, na = kz.shape[1], kz.shape[2]
        mean = var = None
        if many or na >= self.m_range[0]:
            out = self.scoring_matrix() @ kz                                  # [R, 2M+1, A]
            mean = out[:, 2 * mm]
            var = torch.linalg.vecdot(out[:, :mm], out[:, mm:2 * mm], dim=1).add_(kdiag)
        if not many and na < self.m_range[1]:
            f = self.p @ kz
            assert self.w is not None
            mean_f = (self.w[:, None, :] @ f)[:, 0]
            var_f = (kdiag - torch.linalg.vecdot(f, f, dim=1)).clamp_(min=0.0)
            quad = torch.linalg.vecdot(f, self.a_inverse() @ f, dim=1)
            if self.lam_scalar is not None:
                var_f.add_(quad, alpha=self.lam_scalar)
            else:
                var_f.add_(quad * self.lam[:, None])
            if mean is None or var is None:
                mean, var = mean_f, var_f
            else:
                few = (self.sizes > na)[:, None]
                mean, var = torch.where(few, mean_f, mean), torch.where(few, var_f, var)
        assert mean is not None and var is not None
        if kconst is not None:
            return mean, var.clamp_(0.0, kconst)
        return mean, torch.minimum(var.clamp_(min=0.0), kdiag)

    def half_scores(self, kz: Tensor, kconst: float) -> tuple[Tensor, Tensor]:
        """``(μ̃, λσ̃²)`` ``([R, A], [R, A])`` by the half-width product ``[wᵀP; HᵀP] k_Z``:
        ``λσ̃² = (k − ‖HᵀP k_Z‖²)₊`` (``≤ k``), :attr:`score_runs` runs at a time at their own
        width (module docstring; :data:`SCORE_RUNS` on the CPU, every run at once on a GPU); the
        ``fallback`` runs by the full product on their live
        block, as :func:`~torchbandits.models.nystrom_arms.dtc_round`."""
        assert self.half is not None and self.n_inv is not None and self.w is not None
        mm, r = kz.shape[1], kz.shape[0]
        mean, var = kz.new_empty(r, kz.shape[2]), kz.new_empty(r, kz.shape[2])
        sizes = self.widths
        step = self.score_runs
        for i in range(0, r, step):   # (CPU: a few runs at a time, the product stays in cache)
            j = min(i + step, r)
            mc = mm if sizes is None else max(1, min(mm, max(sizes[i:j])))
            out = self.half[i:j, :mc + 1, :mc] @ kz[i:j, :mc]                # [s, m_c+1, A]
            mean[i:j] = out[:, 0]
            g = out[:, 1:]
            torch.sum(g.mul_(g), 1, out=var[i:j])
            var[i:j].neg_().add_(kconst).clamp_min_(0.0)   # k − ‖g‖², the bits of ``rsub``
        for run in self.fallback:                  # G numerically singular: run alone
            r, m = self.rank[run], int(self.sizes[run])
            n_inv = self.n_inv[run, :r, :r]
            lam = self.lam_scalar if self.lam_scalar is not None else float(self.lam[run])
            wm = whitened_scoring_matrix(self.p[run, :r, :m], n_inv.mT @ n_inv, self.w[run, :r],
                                         lam)
            mean[run], v = whitened_scores(wm @ kz[run, :m], r, kconst)
            var[run] = v.clamp_(0.0, kconst)
        return mean, var


def half_width(system: DTCSystem, chol_a: Tensor, et_s: Tensor) -> None:
    """Set ``system`` up for the half-width product (module docstring): ``N = R⁻¹`` from the
    Cholesky factors ``chol_a`` ``[R, M, M]`` of ``A``, ``w = NᵀN Eᵀs`` (``et_s`` ``[R, M]``),
    ``G = I − λNᵀN`` with the identity on its dead block, ``H`` and ``[wᵀP; HᵀP]``; the runs
    whose ``G`` Cholesky fails are the ``fallback`` (one host read of the flags and widths)."""
    p = system.p
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device).expand_as(chol_a)
    n_inv = torch.linalg.solve_triangular(chol_a, eye, upper=False)
    w = (n_inv.mT @ (n_inv @ et_s[..., None]))[..., 0]
    if system.lam_scalar is not None:
        g = torch.baddbmm(eye, n_inv.mT, n_inv, alpha=-system.lam_scalar)
    else:
        g = eye - (n_inv.mT @ n_inv) * system.lam[:, None, None]
    alive = (p != 0).any(-1)                                              # [R, M]
    g = torch.where(alive[:, :, None] & alive[:, None, :], g, 0.0) + torch.diag_embed(
        (~alive).to(g.dtype))
    h, info = torch.linalg.cholesky_ex(g)
    system.w, system.n_inv = w, n_inv
    system.half = torch.cat([w[:, None, :], h.mT], dim=1) @ p             # [R, M+1, M]
    system.rank = alive.sum(-1).tolist()
    system.fallback = info.nonzero()[:, 0].tolist() if bool((info != 0).any()) else []


def dtc_system(kpz: Tensor, kzz: Tensor, live: Tensor, counts: Tensor, sums: Tensor, lam: Tensor,
               kconst: float | None, jitter: float = 0.0, m_range: tuple[int, int] | None = None,
               lam_scalar: float | None = None, half: bool = False,
               widths: list[int] | None = None, score_runs: int | None = None) -> DTCSystem:
    """Rebuild every run's posterior from scratch (module docstring).

    Args:
        kpz: ``K_PZ`` ``[R, N, M]`` between the distinct pulled points and the dictionaries.
        kzz: ``K_ZZ`` ``[R, M, M]`` of the dictionaries (no jitter; padded entries ignored).
        live: ``[R, M]`` real anchors (``M ≥ 1``).
        counts, sums: ``[R, N]`` pull counts and reward sums (0 on padded rows).
        lam: ``[R]`` ridge regularisers (``lam_scalar``: their common value, if any).
        kconst: the constant ``k(x, x)`` of a stationary kernel, else ``None``.
        jitter: nugget ``η`` on the diagonal of ``K_ZZ`` (as the sequential model's).
        m_range: ``(min, max)`` of the dictionary sizes (read from ``live`` if not given).
        half: also set up the half-width product (:func:`half_width`; needs ``kconst``), which
            :meth:`DTCSystem.scores` then uses for the candidates.
        widths: the dictionary sizes ``[R]`` on the host, if known (the half-width scoring then
            works at each chunk's own width).
        score_runs: runs per product of the half-width scoring (default :data:`SCORE_RUNS`; a
            GPU's round scores every run in one product: its time goes to launches).
    """
    mm = kzz.shape[-1]
    scale = (kzz.new_full((kzz.shape[0],), kconst) if kconst is not None
             else torch.diagonal(kzz, dim1=-2, dim2=-1).masked_fill(~live, 0.0).amax(-1)) + jitter
    if jitter:
        kzz = kzz + jitter * torch.eye(mm, dtype=kzz.dtype, device=kzz.device)
    p = batched_whitening(kzz, live, scale)
    feat = kpz @ p.mT                                                    # E [R, N, M]
    a = (feat.mT * counts[:, None, :]) @ feat
    a.diagonal(dim1=-2, dim2=-1).add_(lam[:, None])
    chol_a = torch.linalg.cholesky_ex(a)[0]
    et_s = (feat.mT @ sums[..., None])[..., 0]                           # Eᵀs [R, M]
    sizes = live.sum(-1)
    if m_range is None:
        lo, hi = torch.aminmax(sizes)
        m_range = (int(lo), int(hi))
    system = DTCSystem(p, None, None, lam, sizes, m_range, lam_scalar, chol_a=chol_a,
                       widths=widths, score_runs=SCORE_RUNS if score_runs is None else score_runs)
    if half and kconst is not None:
        half_width(system, chol_a, et_s)       # w from N = R⁻¹; A⁻¹ only if asked for
    else:
        system.w = (system.a_inverse() @ et_s[..., None])[..., 0]        # [R, M]
    return system

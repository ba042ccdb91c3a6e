"""Projected (Nyström / DTC) kernel ridge posterior on a growing dictionary.

Zenati et al. (AISTATS 2022), Prop. 4.2 (§4.1, App. E.2), and Calandriello et al. (COLT 2019),
§3.1, eq. 4. Data: points ``x_j`` with pull counts ``c_j`` and reward sums ``s_j`` (the plain
history is ``c_j = 1``, ``s_j = y_j``); dictionary ``Z = (z_1..z_m)``; ``C = diag(c)``. With
``k_Z(x) = [k(z_i, x)]_i``:

* ``Λ = (K_ZS C K_SZ + λ K_ZZ)⁻¹``, ``Γ = K_ZS s``;
* mean ``μ̃(x) = k_Z(x)ᵀ Λ Γ``;
* ridge variance ``σ̃²(x) = (k(x,x) − k_Zᵀ K_ZZ⁻¹ k_Z)/λ + k_Zᵀ Λ k_Z`` — the part of ``φ(x)``
  outside the span of the dictionary keeps the prior scale ``1/λ`` (DTC form).

:meth:`NystromKernelRidge.mean_var` returns the **GP-scale** variance ``λ·σ̃²`` (like
:class:`~torchbandits.models.ExactKernelRidge`), so a policy's ridge variance is ``var/λ``.

Two parametrisations with the same cost (``parametrisation=``):

* ``"whitened"`` (default; our stable equivalent form): the lower Cholesky factor ``L`` of
  ``K_ZZ`` is kept as its inverse ``L⁻¹`` (bordering appends one row), states are embedded as
  ``e(x) = L⁻¹ k_Z(x)`` and ``A = Eᵀ C E + λI`` (eigenvalues ≥ λ) is kept as ``A⁻¹``. Then
  ``Λ = L⁻ᵀ A⁻¹ L⁻¹`` and ``λσ̃² = (k − ‖e‖²) + λ eᵀA⁻¹e``: a bounded non-negative residual plus a
  well-conditioned quadratic form. Growing the dictionary appends one embedding coordinate to
  every stored state (old coordinates do not change), ``O(nm)``.
* ``"plain"`` (Zenati et al. 2022, Algorithms 2 and 4): ``K_ZZ⁻¹`` and ``Λ`` by bordered inverses
  and Sherman–Morrison, with the cached ``K_SZ``. It suffers from cancellation when ``K_ZZ`` is
  ill conditioned (1-D environments with a 0.1 bandwidth), which is why ``"whitened"`` is the
  default.

The model is split in three modules: :mod:`~torchbandits.models.nystrom_state` (buffers, sizes,
kernel evaluations), :mod:`~torchbandits.models.nystrom_updates` (``append``,
``add_to_dictionary``, ``rebuild``) and this one (the queries).

**Fast path.** Policies that score every round call the unvalidated public methods
:meth:`~NystromKernelRidge.score` (mean and variance of trusted candidates, optionally from a
given ``k_Z``), :meth:`~NystromKernelRidge.scored_column` (the ``k_Z`` column of a just-scored
candidate), :meth:`~NystromKernelRidge.append_column` (append reusing that column),
:meth:`~NystromKernelRidge.add_last_to_dictionary` (grow with the appended point, the
``min_residual`` guard read off :attr:`~NystromKernelRidge.last_residual`),
:meth:`~NystromKernelRidge.rebuild_from_counts` (rebuild from count statistics and given kernel
blocks), and the kernel evaluations :meth:`~NystromKernelRidge.kernel_block`,
:meth:`~NystromKernelRidge.kernel_column`, :meth:`~NystromKernelRidge.kernel_diagonal`,
:meth:`~NystromKernelRidge.prior_variance`. They equal the validated calls on valid input.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from ..validation import as_matrix
from .nystrom_state import Parametrisation
from .nystrom_updates import NystromUpdates, border_apply, border_prepare

__all__ = ["NystromKernelRidge", "Parametrisation", "border_apply", "border_prepare",
           "nystrom_posterior_reference", "whitened_scores", "whitened_scoring_matrix"]


def whitened_scoring_matrix(p: Tensor, a_inv: Tensor, w: Tensor, lam: float) -> Tensor:
    """``W = [P; (λA⁻¹ − I)P; wᵀP]`` ``[2m+1, m]`` (``P = L⁻¹``, ``w = A⁻¹Eᵀs``): one product
    ``W k_Z`` gives the embeddings ``f = P k_Z``, ``h = (λA⁻¹ − I) f`` and the mean ``wᵀf``."""
    return torch.cat([p, torch.addmm(p, a_inv, p, beta=-1.0, alpha=lam), w[None] @ p])


def whitened_scores(out: Tensor, m: int, kdiag: Tensor | float) -> tuple[Tensor, Tensor]:
    """``(μ̃, λσ̃²)`` ``([A], [A])`` from ``out = W k_Z`` ``[2m+1, A]``
    (:func:`whitened_scoring_matrix`): ``μ̃ = wᵀf``, ``λσ̃² = k + fᵀh = k − ‖f‖² + λ fᵀA⁻¹f``
    (not clamped)."""
    return out[2 * m], torch.linalg.vecdot(out[:m], out[m:2 * m], dim=0).add_(kdiag)


class NystromKernelRidge(NystromUpdates):
    """Projected kernel ridge posterior on a dictionary (see the module docstring).

    Args:
        kernel: GPyTorch kernel (evaluated densely with :func:`~torchbandits.kernels.kernel_matrix`).
        lam: ridge regulariser ``λ > 0``.
        jitter: nugget ``η ≥ 0`` added to the diagonal of ``K_ZZ`` (the ``1e-6`` of the CBKB
            code run by Zenati et al. 2022, §5).
        min_residual: an anchor whose residual ``ω`` is below ``min_residual·k(z,z)`` is refused.
            Default ``1e-8`` (``1e-10`` is the first value we tried): on Chessboard at T = 2000
            (γ = λ = 10) ``1e-10`` let ``cond(K_ZZ)`` reach 1e16 and the incremental variance drift
            by 0.3 from a from-scratch rebuild, ``1e-8`` kept them within 3e-7 with the same
            decisions.
        parametrisation: ``"whitened"`` (stable, default) or ``"plain"`` (the paper's Λ, K_ZZ⁻¹).
        track_data_variances: keep the variances at the stored data points up to date through
            :meth:`append` (``O(nm)`` extra) and :meth:`add_to_dictionary` (whitened only), so that
            :meth:`data_variances` costs nothing instead of ``O(nm²)`` (CBKB/CBBKB resample from
            them every round).
        dtype, device: of all state (float64 by default).
    """

    # ------------------------------------------------------------------ queries
    def _round_cache(self) -> tuple[Tensor, Tensor]:
        """Per-state mean weights ``w`` (``μ̃ = wᵀf``) and variance matrix (whitened: ``A⁻¹``;
        plain: ``λΛ − K_ZZ⁻¹``)."""
        sc = self._sc
        cache = sc.cache
        if cache is None or cache[0] != sc.version:
            _, pv, q, gv = self._views()
            mat = self.lam * q - pv if self.parametrisation == "plain" else q
            cache = sc.cache = (sc.version, q @ gv, mat, None)
        return cache[1], cache[2]

    def _scoring_matrix(self) -> Tensor:
        """``W`` such that one product ``W k_Z`` gives mean and variance (built once per state,
        ``O(m³)``, so it pays when many candidates are scored per state, e.g. BKB's fixed arms).

        whitened (``P = L⁻¹``, ``Q = A⁻¹``): ``W = [P; (λQ − I)P; wᵀP]``, so with ``f = P k_Z``
        and ``h = (λQ − I) f``: ``μ̃ = wᵀf``, ``λσ̃² = k + fᵀh = k − ‖f‖² + λ fᵀQf``.
        plain (``P = K_ZZ⁻¹``): ``W = [λΛ − P; wᵀ]``, ``λσ̃² = k + k_Zᵀ(λΛ − K_ZZ⁻¹)k_Z``."""
        w, mat = self._round_cache()
        cache = self._sc.cache
        assert cache is not None
        if cache[3] is None:
            _, pv, q, _ = self._views()
            if self.parametrisation == "plain":
                big = torch.cat([mat, w[None]])
            else:
                big = whitened_scoring_matrix(pv, q, w, self.lam)
            cache = self._sc.cache = (cache[0], w, mat, big)
        return cache[3]

    @torch.no_grad()
    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Mean ``μ̃`` and GP-scale variance ``λσ̃²`` (clamped to ``[0, k(x,x)]``) at ``candidates``.

        ``reg`` must be ``None`` or ``λ`` (the projection is maintained at one regulariser only).
        """
        cand = as_matrix("candidates", candidates, dtype=self.dtype, device=self.device, dim=self.dim)
        if reg is not None and float(reg) != self.lam:
            raise ValueError(f"reg must be None or lam={self.lam} for a Nyström model, got {reg}")
        return self.score(cand)

    def score(self, candidates: Tensor, kz: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`mean_var` without validation (the policies' fast path): ``candidates``
        ``[A, d]`` of the model's dtype/device. One kernel call (skipped when ``kz`` =
        ``k_Z(candidates)`` ``[m, A]`` is given), then with ``A ≥ m`` candidates the single
        product of the per-state scoring matrix with ``k_Z``, else (EK-UCB's ten actions, a new
        state every round) ``f = L⁻¹k_Z`` and ``A⁻¹f`` (whitened) or ``(λΛ − K_ZZ⁻¹)k_Z``
        (plain). The columns are remembered for :meth:`scored_column`."""
        cand = candidates
        m, kc = self._sc.m, self._kconst
        kdiag: Tensor | float = self.kernel_diagonal(cand) if kc is None or m == 0 else kc
        if m == 0:
            return cand.new_zeros(cand.shape[0]), kdiag  # type: ignore[return-value]
        if kz is None:
            kz = self.kernel_block(self._views()[0], cand)
        vecdot = torch.linalg.vecdot
        whitened = self.parametrisation == "whitened"
        if cand.shape[0] >= m:
            out = self._scoring_matrix() @ kz
            if whitened:
                f = out[:m]
                mean, var = whitened_scores(out, m, kdiag)
            else:
                f = kz
                var = vecdot(kz, out[:m], dim=0).add_(kdiag)
                mean = out[m]
        else:
            w, mat = self._round_cache()
            if whitened:
                f = self._views()[1] @ kz
                mean = w @ f
                var = (kdiag - vecdot(f, f, dim=0)).clamp_(min=0.0)
                var.add_(vecdot(f, mat @ f, dim=0), alpha=self.lam)
            else:
                f = kz
                mean = w @ kz
                var = vecdot(kz, mat @ kz, dim=0).add_(kdiag)
        # remembered so that the update of a just-scored candidate can reuse its column
        self._sc.last_scored = (self._sc.version, cand, kz, f)
        if kc is not None:
            return mean, var.clamp_(0.0, kc)
        return mean, torch.minimum(var.clamp_(min=0.0), kdiag)

    def scored_column(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(k_Z(x), features(x))`` ``([m], [m])`` if ``x`` ``[d]`` is a row of the candidates of
        the last :meth:`score`/:meth:`mean_var` call and the model has not changed since (else
        ``None``): the played candidate's column, for :meth:`append_column`."""
        last = self._sc.last_scored
        if last is None or last[0] != self._sc.version:
            return None
        cand = last[1]
        if x.ndim != 1 or x.shape[0] != cand.shape[1]:
            return None
        # the usual case, ``update(candidates[i])``: a view of the same memory (no tensor op)
        off = x.data_ptr() - cand.data_ptr()
        row = cand.stride(0) * cand.element_size()
        if x.stride(0) == cand.stride(1) and row > 0 and off >= 0 and off % row == 0 \
                and off // row < cand.shape[0]:
            i = off // row
        else:
            hit = (cand == x).all(dim=1).nonzero()
            if hit.numel() == 0:
                return None
            i = int(hit[0, 0])
        return last[2].select(1, i), last[3].select(1, i)

    @torch.no_grad()
    def data_variances(self) -> Tensor:
        """GP-scale variances ``λσ̃²`` at the stored data points ``[n]`` (clamped to ``[0, k]``).
        With ``track_data_variances`` they are kept current by the incremental updates (``O(nm)``
        each, whitened); otherwise, and after :meth:`rebuild`, they cost one ``O(nm²)`` pass."""
        sc = self._sc
        n = sc.n
        if sc.hv_version != sc.version or sc.hv is None:
            var = self.score(self.x)[1] if n else self._c.new_zeros(0)
            if not self.track_data_variances:
                return var
            self._data_var_buffer(n)[:n] = var
            sc.hv_version = sc.version
        var = sc.hv[:n].clamp(min=0.0)  # type: ignore[index]
        kc = self._kconst
        return var.clamp_(max=kc) if kc is not None else torch.minimum(var, self.kernel_diagonal(self.x))

    @torch.no_grad()
    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + K̃/λ)`` of the Nyström approximation ``K̃ = K_SZ K_ZZ⁻¹ K_ZS`` (weighted by
        the counts): ``log det(A) − m log λ``, tracked incrementally. It is a lower bound of the
        exact ``log det(I + K/λ)``."""
        if reg is not None and float(reg) != self.lam:
            raise ValueError(f"reg must be None or lam={self.lam} for a Nyström model, got {reg}")
        return torch.tensor(self._sc.logdet_a - self._sc.m * math.log(self.lam), dtype=self.dtype)

    @property
    def log_det_running(self) -> float:
        """``Σ_i log(1 + σ̃²_{i−1}(x_i))`` over the appended points (ridge variance before each
        append). Since ``σ̃² ≥ σ̂²`` it upper-bounds the exact ``log det(I + K/λ)`` when the data
        were appended one by one (Zenati et al. 2022, eq. 27); :meth:`rebuild` does not change it."""
        return self._sc.logdet_running

    @property
    def Lambda(self) -> Tensor:
        """``Λ = (K_ZS C K_SZ + λ K_ZZ)⁻¹`` (a new tensor; for tests and inspection)."""
        m = self._sc.m
        if self.parametrisation == "plain":
            return self._system_inv[:m, :m].clone()
        linv = self._coord_map[:m, :m]
        return linv.mT @ self._system_inv[:m, :m] @ linv

    @property
    def Gamma(self) -> Tensor:
        """``Γ = K_ZS s`` (a new tensor)."""
        m = self._sc.m
        if self.parametrisation == "plain":
            return self._rhs[:m].clone()
        # K_ZS s directly: after a pivoted rebuild ``P`` is not the invertible ``L⁻¹``
        return self.kernel_block(self._z[:m], self.x) @ self.target_sums

    @property
    def kzz_inverse(self) -> Tensor:
        """``(K_ZZ + ηI)⁻¹`` (a new tensor; whitened ``PᵀP``, a generalised inverse when a
        numerically singular ``K_ZZ`` was whitened by the pivoted factor)."""
        m = self._sc.m
        if self.parametrisation == "plain":
            return self._coord_map[:m, :m].clone()
        linv = self._coord_map[:m, :m]
        return linv.mT @ linv

    def extra_repr(self) -> str:
        return f"lam={self.lam}, m={self.m}, n={self.n}, parametrisation={self.parametrisation!r}"


@torch.no_grad()
def nystrom_posterior_reference(
    kernel: Kernel,
    dictionary: Tensor,
    x: Tensor,
    target_sums: Tensor,
    candidates: Tensor,
    lam: float,
    counts: Tensor | None = None,
    *,
    extended: bool = False,
) -> tuple[Tensor, Tensor]:
    """Zenati et al. (2022), Prop. 4.2, from scratch: ``(μ̃, λσ̃²)`` (tests only).

    Default: the formula as printed, with explicit inverses of ``K_ZZ`` and
    ``K_ZS C K_SZ + λK_ZZ`` (fine while ``K_ZZ`` is well conditioned; far off on numerically
    singular dictionaries). ``extended=True``: the same posterior in the whitened form
    ``λσ̃² = k − ‖e‖² + λ eᵀ(EᵀCE + λI)⁻¹e``, ``e = L⁻¹k_Z``, in numpy's extended precision
    (``longdouble``, 64-bit mantissa on x86) with a greedy diagonal-pivoted Cholesky of ``K_ZZ``
    written out here, stopped at pivots ``≤ 1e-15·max k(z,z)`` — an independent computation for
    checking the model on ill-conditioned dictionaries to ~1e-10."""
    c = torch.ones(x.shape[0], dtype=x.dtype) if counts is None else counts
    kzz = kernel_matrix(kernel, dictionary, dictionary)
    ksz = kernel_matrix(kernel, x, dictionary)
    kz = kernel_matrix(kernel, dictionary, candidates)
    if extended:
        return _whitened_extended(kzz, ksz, kz, kernel_diag(kernel, candidates), c, target_sums, lam)
    lam_m = torch.linalg.inv(ksz.mT @ (c[:, None] * ksz) + lam * kzz)
    gam = ksz.mT @ target_sums
    mean = kz.mT @ (lam_m @ gam)
    var = kernel_diag(kernel, candidates) / lam + (kz * ((lam_m - torch.linalg.inv(kzz) / lam) @ kz)).sum(0)
    return mean, lam * var


def _whitened_extended(kzz: Tensor, ksz: Tensor, kz: Tensor, kdiag: Tensor, c: Tensor, s: Tensor,
                       lam: float) -> tuple[Tensor, Tensor]:
    """:func:`nystrom_posterior_reference` with ``extended=True`` (numpy ``longdouble``)."""
    import numpy as np

    ld = np.longdouble
    kzz_l, ksz_l, kz_l = (t.detach().cpu().numpy().astype(ld) for t in (kzz, ksz, kz))
    c_l, s_l = c.detach().cpu().numpy().astype(ld), s.detach().cpu().numpy().astype(ld)
    m = kzz_l.shape[0]
    resid, cols, piv = np.diag(kzz_l).copy(), np.zeros((m, m), dtype=ld), []
    tol = 1e-15 * (resid.max() if m else 1.0)
    for j in range(m):  # greedy pivoted Cholesky: cols[:, j] = L's column j, rows in Z's order
        i = int(np.argmax(np.where(np.isin(np.arange(m), piv), -np.inf, resid)))
        if resid[i] <= tol:
            break
        cols[:, j] = (kzz_l[:, i] - cols[:, :j] @ cols[i, :j]) / np.sqrt(resid[i])
        piv.append(i)
        resid = resid - cols[:, j] ** 2

    def lsolve(low: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        out = np.zeros_like(rhs)
        for i in range(low.shape[0]):
            out[i] = (rhs[i] - low[i, :i] @ out[:i]) / low[i, i]
        return out

    chol = cols[piv][:, : len(piv)]
    emb = lsolve(chol, ksz_l.T[piv])  # [r, n]
    f = lsolve(chol, kz_l[piv])  # [r, N]
    a = (emb * c_l) @ emb.T + lam * np.eye(len(piv), dtype=ld)
    la = np.zeros_like(a)
    for j in range(a.shape[0]):  # Cholesky of A (eigenvalues ≥ λ) in extended precision
        la[j, j] = np.sqrt(a[j, j] - la[j, :j] @ la[j, :j])
        la[j + 1:, j] = (a[j + 1:, j] - la[j + 1:, :j] @ la[j, :j]) / la[j, j]
    g = lsolve(la, (emb @ s_l)[:, None])[:, 0]
    h = lsolve(la, f)
    mean = h.T @ g
    var = kdiag.detach().cpu().numpy().astype(ld) - (f * f).sum(0) + lam * (h * h).sum(0)
    return (torch.from_numpy(mean.astype(np.float64)).to(kz),
            torch.from_numpy(var.astype(np.float64)).to(kz))

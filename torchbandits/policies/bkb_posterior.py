"""The per-round posterior of BKB on its count statistics (Calandriello, Carratino, Lazaric,
Valko & Rosasco, COLT 2019, §3.1 eq. 4, §3.2): the base class of
:class:`~torchbandits.policies.bkb.BKB` that turns the distinct pulled points, their pull counts
and reward sums and the current dictionary into ``(μ̃, σ̃²)`` at the candidates and at the pulled
points.

Two routes to the same numbers:

* **fused** (a fixed arm set, the DTC variance, a stationary kernel, a non-empty dictionary
  within the row-cache budget): :func:`~torchbandits.models.nystrom_arms.dtc_round` rebuilds and
  scores in one pass from the
  cached kernel rows, ``K_ZP`` gathered by rows from the pulled points' Gram matrix
  (:meth:`BKBPosterior._pulled_gram`); the model is not written (it is rebuilt on demand, e.g. by
  :meth:`~torchbandits.policies.bkb.BKB.posterior`);
* **model**: :meth:`~torchbandits.models.nystrom.NystromKernelRidge.rebuild_from_counts` (kernel
  blocks gathered from the cache on a fixed arm set) and the model's scoring; the SoR ablation
  adds the Nyström residual.

On a float64 CPU run the fused route, the UCB with its argmax and the linearised dictionary draw
are one C call each when the compiled library is available (:mod:`torchbandits.native.bkb`, the
same statements as :func:`~torchbandits.models.nystrom_arms.dtc_round`, ``K_ZP`` and ``K_ZA`` read
straight from the cached kernel rows; the draw's uniforms are still drawn by the policy's
generator, in the same order): a round then makes about a dozen torch calls instead of ~50.
Cases the C code does not take (a pivoted ``K_ZZ``, a ``G`` whose Cholesky fails, an empty
dictionary) take the torch route, which stays the reference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..buffers import set_plain
from ..kernels import kernel_diag
from ..models.nystrom import NystromKernelRidge
from ..models.nystrom_arms import dtc_round
from ..models.nystrom_updates import PIVOT_TOL
from ..native import bkb as native_bkb
from .base import IndexPolicy

__all__ = ["BKBPosterior"]


class BKBPosterior(IndexPolicy):
    """BKB's posterior from its count statistics (module docstring). Uses the state set up by
    :class:`~torchbandits.policies.bkb.BKB`: ``model``, ``kernel``, ``arm_rows``, ``_px``,
    ``_counts``, ``_sums``, ``_in_dict``, ``_np``, ``_sel``, ``_model_ok``, ``variance_kind``
    (and ``_view_cache``, ``_gram``, set to ``None`` there)."""

    @property
    def _nys(self) -> NystromKernelRidge:
        """The Nyström model as it stands (internal use: :attr:`model` read from outside is made
        current first)."""
        return self._modules["model"]  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        """``model`` read from outside is the posterior of the current dictionary and counts: the
        fused rounds do not write it, so it is rebuilt here when stale."""
        if name == "model" and not self.__dict__.get("_model_ok", True):
            with torch.no_grad():
                self._ensure_model()
        return super().__getattr__(name)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled / deep-copied without the cached views (a copy of a view does not share the
        copied buffer's storage) and the pulled points' Gram matrix; they are made again from the
        copy's buffers."""
        state = dict(super().__getstate__())
        state["_view_cache"] = state["_gram"] = state["_seen"] = None
        return state

    def _views(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(pulled, counts, sums, in_dict)``: views of the first ``n_distinct`` rows of the
        statistics buffers, made again only when ``n_distinct`` or a buffer changes (a round then
        slices nothing)."""
        b, n, v = self._buffers, self._np, self._view_cache
        if (v is None or v[0] != n or v[1] is not b["_px"] or v[2] is not b["_counts"]
                or v[3] is not b["_sums"] or v[4] is not b["_in_dict"]):
            bufs = (b["_px"], b["_counts"], b["_sums"], b["_in_dict"])
            v = self._view_cache = (n, *bufs, tuple(t[:n] for t in bufs))  # type: ignore[assignment]
        return v[5]  # type: ignore[index]

    def _round_posterior(self, cand: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """``(μ̃, σ̃², used σ̃², σ̃² and used σ̃² at the pulled points, idx)`` (ridge variances; ``idx``:
        the pulled points' rows when ``cand`` is the fixed arm set, else ``None``)."""
        np_ = self._np
        idx = self.arm_rows.fixed_rows(self._views()[0], cand) if np_ else None
        fused = self._fused(cand, idx) if idx is not None else None
        if fused is None:
            mean, var, used = self._dtc(cand, idx)
            pvar, pused = self._pulled_variances(cand, var, used, idx)
            return mean, var, used, pvar, pused, idx
        mean, var = fused
        pvar = var.index_select(0, idx)  # type: ignore[arg-type]
        return mean, var, var, pvar, pvar, idx

    def _positions(self) -> Tensor:
        """``[m]`` positions of the dictionary among the pulled points (kept from the last draw)."""
        if self._sel is None:
            self._sel = self._views()[3].nonzero()[:, 0]
        return self._sel

    def _ensure_model(self, kza: Tensor | None = None, idx: Tensor | None = None,
                      sel: Tensor | None = None) -> None:
        """Rebuild the Nyström posterior from the count statistics (O(n m² + m³)); with the
        dictionary's cached kernel rows ``kza`` ``[m, A]``, the candidate rows ``idx`` of the
        pulled points and the dictionary's positions ``sel`` ``[m]`` among them, ``K_ZZ`` and
        ``K_PZ`` are gathered instead of evaluated."""
        if self._model_ok:
            return
        np_ = self._np
        if np_ == 0:
            self._nys.reset()
        elif kza is None or idx is None or sel is None:
            self._nys.rebuild(self.dictionary, self.pulled, self.sums, self.counts)
        else:
            pulled, counts, sums, _ = self._views()
            kpz = kza.index_select(1, idx).mT
            self._nys.rebuild_from_counts(pulled.index_select(0, sel), pulled, sums, counts,
                                           kzz=kpz.index_select(0, sel), kxz=kpz)
        self._model_ok = True

    def _residual(self, cand: Tensor) -> Tensor:
        """GP-scale Nyström residual ``k(x,x) − k_Zᵀ K_ZZ⁻¹ k_Z`` (the DTC − SoR difference),
        from the model's public features (whitened: ``e = L⁻¹k_Z``; plain: ``k_Z``)."""
        f = self._nys.features(cand)
        kdiag = kernel_diag(self.kernel, cand)
        if self._nys.parametrisation == "whitened":
            return torch.clamp(kdiag - (f * f).sum(0), min=0.0)
        return torch.clamp(kdiag - (f * (self._nys.kzz_inverse @ f)).sum(0), min=0.0)

    def _dtc(self, cand: Tensor, idx: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(μ̃, DTC ridge variance, variance used for the UCB (ridge))`` — the last is the SoR one
        ``zᵀV⁻¹z`` when ``variance="sor"`` (the dictionary sampler always uses the DTC one).
        ``idx``: rows of the pulled points in ``cand`` when ``cand`` is the fixed arm set (kernel
        rows are then read from the cache)."""
        kza = sel = None
        if idx is not None and not self._model_ok:
            sel = self._positions()
            kza = self._dictionary_rows(cand, idx, sel)
        self._ensure_model(kza, idx, sel)
        if kza is None and idx is not None and self._nys.m:
            kza = self._dictionary_rows(cand, idx, self._positions())
        mean, var_gp = self._nys.score(cand, kza) if kza is not None else self._nys.mean_var(cand)
        var = var_gp / self.lam
        if self.variance_kind == "dtc":
            return mean, var, var
        if self.dictionary_size == 0:
            return mean, var, torch.zeros_like(var)
        used = torch.clamp(var_gp - self._residual(cand), min=0.0) / self.lam
        return mean, var, used

    def _dictionary_rows(self, cand: Tensor, idx: Tensor, sel: Tensor) -> Tensor | None:
        """``K_Z,A`` ``[m, A]`` gathered from the cached kernel rows of the pulled arms over the
        fixed arm set (each pulled arm's row is computed once; ``sel``: the dictionary's positions
        among the pulled points); ``None`` past the cache budget."""
        return self.arm_rows.dictionary_rows(self._nys.kernel_block, cand, idx, sel)

    def _fused(self, cand: Tensor, idx: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(μ̃, σ̃²)`` (ridge) of the fixed arms ``cand`` in one pass from the cached kernel rows
        (:func:`~torchbandits.models.nystrom_arms.dtc_round`, the model's rebuild and scoring
        without writing its buffers), for the
        DTC variance of a stationary kernel on a non-empty dictionary within the row-cache
        budget; else ``None``."""
        kc, model = self._nys.kernel_constant, self._nys
        if self.variance_kind != "dtc" or kc is None or model.parametrisation != "whitened":
            return None
        sel = self._positions()
        kza = self._dictionary_rows(cand, idx, sel) if sel.shape[0] else None
        if kza is None:
            return None
        _, counts, sums, _ = self._views()
        return dtc_round(kza, self._pulled_gram(idx).index_select(0, sel), sel, counts, sums,
                         model.lam, kc, model.jitter)

    def _pulled_gram(self, idx: Tensor) -> Tensor:
        """``K_PP`` among the ``n`` distinct pulled points (``idx``: their arm rows), as the view
        ``[cap, n]`` of a ``[cap, cap]`` buffer whose first ``n`` rows hold it: ``K_PP[j, i] =
        k(x_j, X_A)[idx_i]``, read off the cached kernel rows (the values the rows hold, so a round
        gathers ``K_ZP = K_PP[sel]`` by rows instead of ``m·n`` scattered columns of ``K_ZA``),
        extended by the new points' rows and columns only. Call it after the round's
        :meth:`_dictionary_rows` (every pulled point's row cached). Kept in ``_gram`` as ``(arm
        set of the row cache, buffer, filled size, view)``; the capacity doubles, to at most the
        number of arms."""
        rows, arms, n = self.arm_rows.rows, self.arm_rows.arms, idx.shape[0]
        gram = self._gram
        if gram is None or gram[0] is not arms:
            gram = (arms, rows.new_zeros(0, 0), 0, None)  # type: ignore[union-attr]
        _, buf, done, view = gram
        if done == n:
            return view  # type: ignore[return-value]
        if buf.shape[0] < n:
            cap = min(max(2 * buf.shape[0], n, 16), rows.shape[1])  # type: ignore[union-attr]
            new = buf.new_zeros(cap, cap)
            new[:done, :done] = buf[:done, :done]
            buf = new
        buf[done:n, :n] = rows[done:n].index_select(1, idx)  # type: ignore[index]
        if done:
            buf[:done, done:n] = rows[:done].index_select(1, idx[done:])  # type: ignore[index]
        view = buf[:, :n]
        set_plain(self, "_gram", (arms, buf, n, view))
        return view

    def _pulled_variances(self, cand: Tensor, var: Tensor, used: Tensor,
                          idx: Tensor | None) -> tuple[Tensor, Tensor]:
        """(DTC, used) ridge variances of the distinct pulled points, gathered from the
        candidates' when all are among them (``idx``: their rows in the fixed arm set), else
        evaluated."""
        if self._np == 0:
            return var.new_zeros(0), var.new_zeros(0)
        if idx is not None:
            return var[idx], used[idx]
        _, pv, pu = self._dtc(self.pulled)
        return pv, pu

    def _native_round(self, cand: Tensor) -> tuple[Tensor, Tensor, float, Tensor] | None:
        """``(μ̃, σ̃², S_t, idx)`` of the fused route computed by the compiled kernel
        (:func:`torchbandits.native.bkb.dtc_round`; ``idx``: the pulled points' arm rows), or
        ``None`` where the torch route runs (no library, not float64 on the CPU, not the fused
        route's case, a pivoted ``K_ZZ`` or a failed Cholesky of ``G``)."""
        model = self._nys
        kc = model.kernel_constant
        if (not self._np or self.variance_kind != "dtc" or kc is None or cand.dtype != torch.float64
                or not cand.is_cpu or model.parametrisation != "whitened"
                or not native_bkb.available()):  # (cheap: the library and symbols are cached)
            return None
        cache = self.arm_rows
        idx = cache.fixed_rows(self._views()[0], cand)
        if idx is None:
            return None
        sel = self._positions()
        n, rows = idx.shape[0], cache.rows
        if not sel.shape[0] or n * cand.shape[0] > cache.max_entries:
            return None
        if rows is None or cache.n_rows < n or rows.shape[1] != cand.shape[0]:
            if self._dictionary_rows(cand, idx, sel) is None:  # computes the new kernel rows
                return None
            rows = cache.rows
        _, counts, sums, _ = self._views()
        out = native_bkb.dtc_round(rows, idx, sel, counts, sums, float(model.lam), kc,  # type: ignore[arg-type]
                                   float(model.jitter), PIVOT_TOL)
        return None if out is None else (*out, idx)

    def _native_draw(self, var: Tensor, counts: Tensor, mask: Tensor) -> Tensor | None:
        """The linearised draw (§3.1, the authors' code) by the compiled kernel: ``u ~ U[0, 1)^n``
        from the policy's generator (the draws of :meth:`RLSResampler.draw
        <torchbandits.models.rls.RLSResampler.draw>`, in the same order), point ``j`` kept when
        ``u_j < n_j q̄ σ̃²(x_j)`` with ``σ̃²(x_j) = var[idx_j]`` read off the scored arms; the mask
        written into ``mask``, the dictionary's positions returned (``None``: the torch draw)."""
        idx = self.arm_rows.idx
        if self.resampler.sampler != "linearized" or idx is None:  # type: ignore[attr-defined]
            return None
        return native_bkb.linearized_draw(self.generator, counts, var, idx,
                                          self.resampler.qbar, mask)  # type: ignore[attr-defined]


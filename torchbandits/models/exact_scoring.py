"""The query side of :class:`~torchbandits.models.ExactKernelRidge`: scoring candidates, the
log-determinant and ``yᵀ(K + αI)⁻¹y``, and what an append reuses from the last scoring.

For candidates ``C`` and a maintained factor ``L`` of ``K + αI``: ``V = L⁻¹ K_SC`` ``[n, A]``,
``μ_α = zᵀV`` and ``ρ²_α = k_CC − colsum(V ⊙ V)`` (:mod:`torchbandits.models.posterior`).

* **Running scalars.** ``Σ_i log L_ii`` and ``‖z‖² = yᵀ(K + αI)⁻¹y`` per factor are kept as
  Python floats, advanced in O(1) by each append (``+ log d``, ``+ z_new²``) and recomputed from
  the factor (O(n)) after anything else changes the data. So ``log det(I + K/α) = 2 Σ log L_ii −
  n log α`` costs no tensor operation per round.
* **The scored set.** A scoring keeps ``K_SC`` and, per factor, ``(V, μ, colsum V²)`` of the
  candidates it scored. When the next append is the candidate ``j`` of that set (the policy
  passes ``column=(candidates, j)`` after checking the played point equals it), the new Cholesky
  row ``L⁻¹k_S(x_j)`` is the column ``V[:, j]``, ``‖L⁻¹k_S(x_j)‖²`` is ``colsum(V²)_j`` and
  ``zᵀL⁻¹k_S(x_j)`` is ``μ_j``: the append does no kernel evaluation and no triangular solve
  (O(n) instead of O(n²)). The record is valid while the data are those it was scored with.
* **The kernel plan.** The kernel's hyper-parameters are read once
  (:class:`~torchbandits.kernels.KernelPlan`, re-read when the kernel or its raw values change).
* **Scaled inputs.** For an RBF or Matérn kernel (:class:`~torchbandits.kernel_fast.ScaledStationary`)
  the stored points are kept multiplied by the kernel's weights ``w`` ``[cap, d]`` as well (each
  point scaled once: an append copies the scored candidate's scaled row), so ``K_SC`` costs one
  scaling of the candidates, one matrix product and the closed form in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..buffers import grow_rows, set_plain
from ..kernel_fast import ScaledStationary
from ..kernels import KernelPlan
from ..linalg import GrowingCholesky, logdet_from_cholesky
from ..validation import as_matrix, check_positive
from .exact_native import ExactNative, ScoredSet
from .posterior import CandidateCache, colsum_sq, score_whitened, whitened_solve

if TYPE_CHECKING:
    from ..confidence.radii import UCBForm

__all__ = ["ExactQueries", "ScoredSet"]


class ExactQueries(ExactNative):
    """Scoring and scalar queries of the exact model (mixed into
    :class:`~torchbandits.models.ExactKernelRidge`, whose state it reads)."""

    _n: int
    _version: int
    _x: Tensor
    _y: Tensor
    _z: Tensor
    factors: torch.nn.ModuleList
    regularisers: tuple[float, ...]
    cache_candidates: bool
    _caches: dict[int, CandidateCache]
    _plan: KernelPlan | None
    _scored: ScoredSet | None
    _sums: dict[int, list]
    _cache_seen: dict[int, int]  # per factor index: its cache's candidate tensor's version
    _lean: list | None  # [scaled rows [cap, d], rows valid, form, data version]
    _slots: tuple | None = None  # (regularisers, {regulariser: factor index}) for _factor_for

    # ------------------------------------------------------------------ kernel, factors
    def kernel_plan(self) -> KernelPlan:
        """The kernel's hyper-parameters read once (re-read if the kernel or its values change)."""
        plan, kernel = self._plan, self._modules["kernel"]  # type: ignore[attr-defined]
        if plan is None or not plan.current(kernel):
            with torch.no_grad():  # (values only: the compiled step may run with autograd on)
                plan = self._plan = KernelPlan(kernel, track=True)
        return plan

    def _factor_for(self, reg: float | None) -> tuple[int | None, float]:
        regs = self.regularisers
        if reg is None:
            return 0, regs[0]
        slots = self._slots  # {regulariser: first factor index} of this tuple of regularisers
        if slots is None or slots[0] is not regs:
            slots = (regs, {r: i for i, r in reversed(list(enumerate(regs)))})
            set_plain(self, "_slots", slots)
        if type(reg) is not float:
            reg = check_positive("reg", reg)
        idx = slots[1].get(reg)
        return (idx, reg) if idx is not None else (None, check_positive("reg", reg))

    def _kq(self, cand: Tensor, shared: dict) -> tuple[Tensor, Tensor | float]:
        """``(K_SC, k_CC)``, computed once per ``shared`` dict (several regularisers); ``k_CC`` is
        the constant ``k(x, x)`` of a stationary kernel."""
        if "kq" not in shared:
            plan = self.kernel_plan()
            form = plan.stationary
            if form is not None:
                xs = self._scaled_rows(form)
                cs = shared["cs"] = form.scale(cand)
                shared["kq"] = form.cross(xs, form.sqnorm(xs), cs, form.sqnorm(cs))
                shared["kdiag"] = form.diag_value
                return shared["kq"], shared["kdiag"]
            shared["kq"] = plan.matrix(self._x[: self._n], cand)
            const = plan.diag_constant
            shared["kdiag"] = plan.diag(cand) if const is None else const
        return shared["kq"], shared["kdiag"]

    def _scaled_rows(self, form: ScaledStationary, whole: bool = False) -> Tensor:
        """The stored points times the kernel weights ``[n, d]``: kept in a capacity buffer
        ``[cap, d]`` (valid for ``form`` and the data version), rows appended since the last call
        scaled now, the whole buffer rebuilt after anything else changed the data. ``whole``:
        the buffer itself (its first ``n`` rows valid)."""
        n, rows = self._n, self._lean
        if rows is None or rows[2] is not form or rows[3] != self._version or rows[1] > n:
            buf = form.scale(self._x)
            set_plain(self, "_lean", [buf, n, form, self._version])
            return buf if whole else buf[:n]
        buf, m = rows[0], rows[1]
        if m < n:
            if buf.shape[0] < n:
                buf = rows[0] = grow_rows(buf, n)
            buf[m:n] = form.scale(self._x[m:n])
            rows[1] = n
        return buf if whole else buf[:n]

    def _append_scaled(self, n: int, reuse: tuple[ScoredSet, int] | None) -> None:
        """Row ``n`` of the scaled points from the scored candidate ``reuse`` (else left to
        :meth:`_scaled_rows`)."""
        rows = self._lean
        if reuse is None or rows is None or rows[1] != n or rows[3] != self._version:
            return
        cs = reuse[0].scaled
        if cs is None or rows[2] is not self._plan.stationary:  # type: ignore[union-attr]
            return
        buf = rows[0]
        if buf.shape[0] <= n:
            buf = rows[0] = grow_rows(buf, n + 1)
        buf[n] = cs[reuse[1]]
        rows[1] = n + 1

    def _whitened(self, idx: int | None, reg: float, cand: Tensor,
                  shared: dict | None = None) -> tuple[Tensor, Tensor | float, Tensor]:
        """``(V, kdiag, sumsq)`` with ``V = L⁻¹ K_SC`` for the candidate set ``cand``."""
        n = self._n
        shared = {} if shared is None else shared
        if idx is None:
            chol, _ = self._scratch_factor(reg)  # type: ignore[attr-defined]
            kq, kdiag = self._kq(cand, shared)
            v = whitened_solve(chol, kq)
            return v, kdiag, colsum_sq(v)
        factor: GrowingCholesky = self.factors[idx]  # type: ignore[assignment]
        cache = self._caches.get(idx) if self.cache_candidates else None
        if cache is not None and self._serves(idx, cache, cand):
            if cache.n_at < n:  # new rows of V for the points appended since the last call
                cache.extend(factor, self.kernel_plan().matrix(self._x[cache.n_at:n], cand))
            return cache.v[:n], cache.kdiag, cache.sumsq
        kq, kdiag = self._kq(cand, shared)
        v = factor.solve(kq) if n else kq
        sumsq = colsum_sq(v)
        if self.cache_candidates:
            self._caches[idx] = CandidateCache(cand, kdiag, v, sumsq, n, self._version)
            self._cache_seen[idx] = cand._version
        return v, kdiag, sumsq

    def _serves(self, idx: int, cache: CandidateCache, cand: Tensor) -> bool:
        """Whether ``cache`` holds ``L⁻¹K_SC`` of ``cand``'s values. A cache keeps the candidate
        tensor it was built from (no copy) with that tensor's version counter: the same tensor
        unmodified is served without a comparison, another one if the kept tensor is unmodified
        and equal in value; a kept tensor modified in place serves nothing."""
        kept = cache.candidates
        if self._cache_seen.get(idx) != kept._version:
            return False
        if kept is cand:
            return cache.version == self._version and cache.n_at <= self._n
        return cache.serves(cand, self._n, self._version)

    def _record(self, cand: Tensor, kdiag: Tensor | float) -> ScoredSet:
        rec = self._scored
        if rec is None or rec.candidates is not cand or rec.n != self._n or rec.version != self._version:
            rec = ScoredSet(cand, self._n, self._version, kdiag)
            set_plain(self, "_scored", rec)
        return rec

    def _score(self, cand: Tensor, slots: Sequence[tuple[int | None, float]]
               ) -> tuple[list[Tensor], list[Tensor]]:
        """Means and GP variances ``[A]`` of ``cand`` at each ``(factor index, reg)`` (one kernel
        evaluation shared); records the scored set (see the module docstring)."""
        n, shared = self._n, {}
        means, variances = [], []
        for idx, reg in slots:
            v, kdiag, sumsq = self._whitened(idx, reg, cand, shared)
            z = self._z[idx, :n] if idx is not None else self._scratch_factor(reg)[1]  # type: ignore[attr-defined]
            mean, var = score_whitened(z, v, kdiag, sumsq)
            means.append(mean)
            variances.append(var)
            if idx is not None:
                rec = self._record(cand, kdiag)
                rec.columns[idx] = (v, mean, sumsq)
                rec.stack = rec.native = None
        rec = self._scored
        if rec is not None and rec.kq is None:
            rec.kq = shared.get("kq")
            rec.scaled = shared.get("cs")
        return means, variances

    def _score_stacked(self, cand: Tensor, idxs: list[int]) -> tuple[Tensor, Tensor] | None:
        """:meth:`_score` for several maintained factors and a candidate set no cache serves:
        the solves one per factor, then everything else once on the stack ``V`` ``[R, n, A]``
        (``μ = zᵀV``, ``colsum V²``, ``ρ²``). ``None`` if a cache serves ``cand``."""
        n = self._n
        if self.cache_candidates:
            seen: set[int] = set()
            for idx in idxs:
                cache = self._caches.get(idx)
                if cache is None or id(cache.candidates) in seen:
                    continue  # caches built together share one tensor: compared once
                if self._serves(idx, cache, cand):
                    return None
                seen.add(id(cache.candidates))
        shared: dict = {}
        kq, kdiag = self._kq(cand, shared)
        v = torch.stack([self.factors[idx].solve(kq) for idx in idxs])        # [R, n, A]
        z = self._z[idxs, :n] if idxs != list(range(len(idxs))) else self._z[: len(idxs), :n]
        means = torch.matmul(z.unsqueeze(1), v).squeeze(1)                    # [R, A]
        sumsq = (v * v).sum(1)
        variances = torch.rsub(sumsq, kdiag).clamp_min_(0.0)
        rec = self._record(cand, kdiag)
        rec.kq, rec.scaled, rec.stack = kq, shared.get("cs"), (v, means, sumsq, idxs)
        rec.native = None
        if self.cache_candidates:
            for r, idx in enumerate(idxs):
                self._caches[idx] = CandidateCache(cand, kdiag, v[r], sumsq[r], n, self._version)
                self._cache_seen[idx] = cand._version
        return means, variances

    def _checked(self, candidates: Tensor) -> Tensor:
        bufs = self._buffers  # type: ignore[attr-defined]  # (not through nn.Module.__getattr__)
        y, x = bufs["_y"], bufs["_x"]
        cand = as_matrix("candidates", candidates, dtype=y.dtype, device=y.device)
        dim = x.shape[1] if x.shape[0] > 0 else None
        if dim is not None and cand.shape[1] != dim:
            raise ValueError(f"candidates must have {dim} columns, got {cand.shape[1]}")
        return cand

    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Posterior mean ``μ_reg`` and GP variance ``ρ²_reg`` (clamped at 0) at ``candidates``.

        ``reg`` defaults to the primary ``λ``; a maintained regulariser is served incrementally,
        any other from a from-scratch factorisation. Shapes ``[A]``. No autograd graph.
        """
        if torch.is_grad_enabled():  # (a policy's select already runs without)
            with torch.no_grad():
                return self.mean_var(candidates, reg)
        cand = self._checked(candidates)
        slot = self._factor_for(reg)
        if self._n == 0:
            return cand.new_zeros(cand.shape[0]), self.kernel_plan().diag(cand)
        if slot[0] is not None:
            done = self._native_score(cand, [slot[0]])
            if done is not None:
                return done
        means, variances = self._score(cand, [slot])
        return means[0], variances[0]

    def mean_var_many(self, candidates: Tensor, regs: Sequence[float]) -> tuple[Tensor, Tensor]:
        """:meth:`mean_var` at several regularisers ``[R, A]``, sharing one kernel evaluation of
        the candidates (Flynn & Reeb 2024's DMM bound needs five). Same values as ``R`` separate
        calls, up to rounding (the stacked path)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.mean_var_many(candidates, regs)
        cand = self._checked(candidates)
        slots = [self._factor_for(r) for r in regs]
        if self._n == 0:
            kd = self.kernel_plan().diag(cand)
            return cand.new_zeros(len(slots), cand.shape[0]), kd.expand(len(slots), -1).clone()
        idxs = [idx for idx, _ in slots if idx is not None]
        if len(idxs) == len(slots):
            done = self._native_score(cand, idxs, many=True)
            if done is not None:
                return done
        if len(idxs) == len(slots) > 1:
            stacked = self._score_stacked(cand, idxs)  # type: ignore[arg-type]
            if stacked is not None:
                return stacked
        means, variances = self._score(cand, slots)
        return torch.stack(means), torch.stack(variances)

    def ucb_argmax(self, candidates: Tensor, make_form: Callable[[], UCBForm | None]
                   ) -> int | None:
        """The argmax of a rule's bound (``make_form()``: :func:`~torchbandits.confidence.radii.ucb_form`)
        in one compiled call, or ``None``: :meth:`~.exact_native.ExactNative._native_ucb_argmax`."""
        return self._native_ucb_argmax(candidates, make_form)

    # ------------------------------------------------------------------ scalars
    def _running(self, idx: int) -> list:
        """``[n, version, Σ log L_ii, ‖z‖²]`` of factor ``idx`` (recomputed if stale)."""
        ent = self._sums.get(idx)
        if ent is None or ent[0] != self._n or ent[1] != self._version:
            n = self._n
            factor: GrowingCholesky = self.factors[idx]  # type: ignore[assignment]
            z = self._z[idx, :n]
            ent = [n, self._version, float(torch.log(factor.diagonal()).sum()), float(z @ z)]
            self._sums[idx] = ent
        return ent

    def _advance(self, idx: int, n: int, d: float, z_new: float) -> None:
        """Carry factor ``idx``'s running scalars over an append at ``n`` (pivot ``d``, ``z_new``)."""
        ent = self._sums.get(idx)
        if ent is not None and ent[0] == n and ent[1] == self._version:
            ent[0], ent[2], ent[3] = n + 1, ent[2] + math.log(d), ent[3] + z_new * z_new
        else:
            self._sums.pop(idx, None)

    def log_det_value(self, reg: float | None = None) -> float:
        """``log det(I + K/reg)`` of the stored data as a float (0 when empty), O(1) per round."""
        idx, reg_v = self._factor_for(reg)
        n = self._n
        if n == 0:
            return 0.0
        if idx is None:
            chol, _ = self._scratch_factor(reg_v)  # type: ignore[attr-defined]
            return float(logdet_from_cholesky(chol)) - n * math.log(reg_v)
        return 2.0 * self._running(idx)[2] - n * math.log(reg_v)

    def quad_y_value(self, reg: float | None = None) -> float:
        """``Yᵀ (K + reg·I)⁻¹ Y = ‖L⁻¹Y‖²`` as a float (0 when empty), O(1) per round."""
        idx, reg_v = self._factor_for(reg)
        if self._n == 0:
            return 0.0
        if idx is None:
            z = self._scratch_factor(reg_v)[1]  # type: ignore[attr-defined]
            return float(z @ z)
        return self._running(idx)[3]

    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + K/reg)`` of the stored data (0-d tensor, 0 when empty)."""
        return torch.tensor(self.log_det_value(reg), dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]

    def quad_y(self, reg: float | None = None) -> Tensor:
        """``Yᵀ (K + reg·I)⁻¹ Y = ‖L⁻¹Y‖²`` (0-d tensor, 0 when empty)."""
        return torch.tensor(self.quad_y_value(reg), dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]

    @torch.no_grad()
    def weights(self, reg: float | None = None) -> Tensor:
        """``(K + reg·I)⁻¹ Y`` (the representer weights of the posterior mean)."""
        idx, reg_v = self._factor_for(reg)
        if self._n == 0:
            return self._y.new_zeros(0)
        if idx is None:
            chol, z = self._scratch_factor(reg_v)  # type: ignore[attr-defined]
        else:
            chol, z = self.factors[idx].dense(), self._z[idx, : self._n]
        return torch.linalg.solve_triangular(chol.mT, z[:, None], upper=True)[:, 0]

    def cholesky(self, reg: float | None = None) -> Tensor:
        """Dense lower factor of ``K + reg·I`` (a copy)."""
        idx, reg_v = self._factor_for(reg)
        if idx is None:
            return self._scratch_factor(reg_v)[0].clone()  # type: ignore[attr-defined]
        return self.factors[idx].dense()

    def reused_column(self, column: tuple[Tensor, int] | None
                      ) -> tuple[ScoredSet, int] | None:
        """``(scored set, j)`` if ``column = (candidates, j)`` names a candidate of the last
        scoring of the current data, else ``None``."""
        rec = self._scored
        if column is None or rec is None or rec.candidates is not column[0] \
                or rec.n != self._n or rec.version != self._version:
            return None
        return rec, int(column[1])

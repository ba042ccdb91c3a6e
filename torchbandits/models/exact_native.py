"""The compiled single-run step of :class:`~torchbandits.models.ExactKernelRidge` on the CPU.

:meth:`ExactNative._native_score` scores a candidate set at maintained regularisers with one call of
:func:`torchbandits.native.exact.score` (the scaling of the candidates, ``K_SC`` by the closed
form, ``V_r = L_r⁻¹K_SC``, ``μ_r = z_rᵀV_r``, ``colsum(V_r²)`` and ``ρ²_r`` for every factor) and
records the scored set (:class:`ScoredSet`) exactly as the torch path of
:mod:`~torchbandits.models.exact_scoring` does (the same fields and candidate caches), plus the
addresses of what it wrote (``ScoredSet.native``). :meth:`ExactNative._native_append` appends the
scored candidate ``j`` with one call of :func:`torchbandits.native.exact.append` (the O(n) append:
the new factor rows are the columns ``V_r[:, j]``), reading those addresses (a record the torch
path wrote into is read and checked instead).

Neither needs autograd switched off (no tensor operation of theirs records a graph), so a policy
calls them without ``torch.no_grad()``; the model switches it off for its torch path itself.

Both return ``None`` / ``False`` when the step does not qualify, and the caller takes its torch
path, which stays the reference (the tests hold the two to rounding): no compiled library
(:func:`torchbandits.native.disabled`, ``TORCHBANDITS_NATIVE=0``, no compiler), a tensor that is
not a contiguous float64 CPU tensor, a kernel without a closed form
(:class:`~torchbandits.kernel_fast.ScaledStationary`), a regulariser that is not maintained,
more than :data:`~torchbandits.native.exact.MAX_N` stored points (LAPACK's blocked solve is then
faster), or a candidate set a cache serves (the O(n·A) extension of the torch path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..buffers import grow_rows
from ..native import exact as nx
from .posterior import CandidateCache

if TYPE_CHECKING:
    from ..confidence.radii import UCBForm

__all__ = ["ExactNative", "ScoredSet"]

_F64 = torch.float64


@dataclass(eq=False, slots=True)
class ScoredSet:
    """The last scored candidate set of a model: ``candidates`` ``[A, d]`` (the tensor scored),
    the data it was scored with (``n``, ``version``), ``kq = K_SC`` ``[n, A]`` (``None`` if served
    from a candidate cache), ``kdiag`` (``[A]`` or a constant) and per factor index
    ``(V [n, A], μ [A], colsum V² [A])``."""

    candidates: Tensor
    n: int
    version: int
    kdiag: Tensor | float
    kq: Tensor | None = None
    scaled: Tensor | None = None  # the candidates times the kernel weights [A, d] (fast path)
    columns: dict[int, tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)
    stack: tuple[Tensor, Tensor, Tensor, list[int]] | None = None  # (V, μ, colsum V², factor idxs)
    #: ``(V, its address, per factor 0..R−1 the addresses of its (V, μ, colsum V²))`` where the
    #: compiled scoring wrote them for every factor (what the compiled append reads; valid while
    #: ``V`` is at that address: a copy of the record, e.g. by ``copy.deepcopy``, is not), else None
    native: tuple[Tensor, int, list[tuple[int, int, int]]] | None = None

    def pieces(self, j: int) -> dict[int, tuple[Tensor, float, float]]:
        """Per factor index scored here: ``(L⁻¹k_S(x_j), ‖L⁻¹k_S(x_j)‖², zᵀL⁻¹k_S(x_j))`` of
        candidate ``j`` (the column ``V[:, j]``, ``colsum(V²)_j``, ``μ_j``), read with one
        host transfer."""
        if self.stack is not None:
            v, mean, sumsq, idxs = self.stack
            sq, mz = torch.stack((sumsq[:, j], mean[:, j])).tolist()
            return {idx: (v[r, :, j], sq[r], mz[r]) for r, idx in enumerate(idxs)}
        idxs = list(self.columns)
        cols = [self.columns[i] for i in idxs]
        flat = torch.stack([t for _, mean, sumsq in cols for t in (sumsq, mean)], 1)[j].tolist()
        return {idx: (col[0][:, j], flat[2 * r], flat[2 * r + 1])
                for r, (idx, col) in enumerate(zip(idxs, cols))}


def _ok(t: Tensor) -> bool:
    """A contiguous float64 CPU tensor (what the C code reads)."""
    return t.dtype is _F64 and t.is_cpu and t.is_contiguous()


def _sources(rec: ScoredSet, count: int) -> list[tuple[int, int, int]] | None:
    """Per factor ``0..count−1``: the addresses of its ``(V [n, A], μ [A], colsum V² [A])`` in
    the record, or ``None`` if a factor was not scored there."""
    if rec.stack is not None:
        v, mean, sumsq, idxs = rec.stack
        if sorted(idxs) != list(range(count)) or not (_ok(v) and _ok(mean) and _ok(sumsq)):
            return None
        pos = {idx: p for p, idx in enumerate(idxs)}
        sv, sm = v.stride(0) * 8, mean.stride(0) * 8
        bv, bm, bs = v.data_ptr(), mean.data_ptr(), sumsq.data_ptr()
        return [(bv + pos[r] * sv, bm + pos[r] * sm, bs + pos[r] * sm) for r in range(count)]
    if count != 1 or 0 not in rec.columns:
        return None
    v, mean, sumsq = rec.columns[0]
    if not (_ok(v) and _ok(mean) and _ok(sumsq)) or v.ndim != 2:
        return None
    return [(v.data_ptr(), mean.data_ptr(), sumsq.data_ptr())]


class ExactNative:
    """The compiled single-run step, mixed into :class:`~torchbandits.models.ExactKernelRidge`
    (through :class:`~torchbandits.models.exact_scoring.ExactQueries`), whose state it reads: see
    the module docstring."""

    _n: int
    _version: int
    _caches: dict
    _cache_seen: dict
    cache_candidates: bool
    regularisers: tuple[float, ...]

    def _native_score(self, cand: Tensor, idxs: list[int], many: bool = False,
                      bound: UCBForm | None = None
                      ) -> tuple[Tensor, Tensor] | tuple[int, Tensor | None] | None:
        """``(μ, ρ²)`` of ``cand`` ``[A, d]`` at the maintained factors ``idxs``: ``[A]`` each for one
        factor, ``[R, A]`` for several or with ``many``; the scored set recorded as the torch path
        records it (``V``, ``μ``, ``colsum V²`` and the candidate caches; ``K_SC`` kept only with
        several factors, the scaled candidates not kept: an append computes its row). With ``bound``
        (an upper confidence bound ``min_r (sqrt(ρ²_r / div_r) β_r + μ_r)`` over the factors
        ``idxs``, :func:`torchbandits.confidence.radii.ucb_form`) returns ``(index of the largest
        bound, minimising r [A] int64 or None)`` instead, ``ρ²`` and the bounds not kept.
        ``None`` if the step does not qualify (see the module docstring)."""
        n = self._n
        if n == 0 or n > nx.MAX_N or not _ok(cand):
            return None
        lib = nx.available()
        if lib is None:
            return None
        form = self.kernel_plan().stationary
        if form is None:
            return None
        kind = nx.KINDS.get((form.kind, form.nu))
        weight, zs = form.weight, self._buffers["_z"]  # (the buffer table: see GrowingCholesky.layout)
        if kind is None or not _ok(weight) or not _ok(zs):
            return None
        zbase, zstride = zs.data_ptr(), zs.stride(0) * 8
        factors, fs = [], list(self._modules["factors"])  # (not through nn.Module.__getattr__)
        for idx in idxs:
            head, tail = fs[idx].layout()
            if not (_ok(head) and _ok(tail)):
                return None
            factors.append((head.data_ptr(), head.shape[0], tail.data_ptr(), tail.shape[1],
                            zbase + idx * zstride))
        if self.cache_candidates and self._native_served(cand, idxs):
            return None
        xs = self._scaled_rows(form, whole=True)  # [cap, d], rows :n valid
        if not _ok(xs):
            return None
        a, r = cand.shape[0], len(idxs)
        flat = r == 1 and not many
        shape = (a,) if flat else (r, a)
        v = cand.new_empty((n, a) if flat else (r, n, a))
        mean, sumsq = cand.new_empty(shape), cand.new_empty(shape)
        kq = cand.new_empty(n, a) if r > 1 else None
        kdiag = form.diag_value
        if bound is None:
            var = cand.new_empty(shape)
            nx.score(lib, n, xs, cand, weight, kind, form.outputscale, kdiag, factors,
                     (v, mean, sumsq), (None, kq, var))
            result: tuple = (mean, var)
        else:
            arg = torch.empty(a, dtype=torch.int64) if r > 1 else None
            best = nx.score(lib, n, xs, cand, weight, kind, form.outputscale, kdiag, factors,
                            (v, mean, sumsq), (None, kq, None), (bound.betas, bound.divisors), arg)
            result = (best, arg)
        rec = self._record(cand, kdiag)  # type: ignore[attr-defined]
        rec.kq = kq
        count = len(fs)
        if flat:
            rec.columns[idxs[0]] = (v, mean, sumsq)
            rec.stack = None
            # (the addresses the compiled append reads: written here, no check needed there)
            rec.native = (v, v.data_ptr(), [(v.data_ptr(), mean.data_ptr(), sumsq.data_ptr())]) \
                if count == 1 and idxs[0] == 0 else None
        else:
            rec.stack = (v, mean, sumsq, list(idxs))
            if sorted(idxs) == list(range(count)):
                pos, bv, bm, bs = {i: p for p, i in enumerate(idxs)}, v.data_ptr(), \
                    mean.data_ptr(), sumsq.data_ptr()
                rec.native = (v, bv, [(bv + pos[f] * n * a * 8, bm + pos[f] * a * 8,
                                       bs + pos[f] * a * 8) for f in range(count)])
            else:
                rec.native = None
        if self.cache_candidates:
            version = self._version
            vs, ss = ((v,), (sumsq,)) if flat else (v.unbind(0), sumsq.unbind(0))
            for p, idx in enumerate(idxs):
                vp, sp = vs[p], ss[p]
                self._caches[idx] = CandidateCache(cand, kdiag, vp, sp, n, version)
                self._cache_seen[idx] = cand._version
        return result

    def _native_ucb_argmax(self, candidates: Tensor,
                           make_form: Callable[[], UCBForm | None]) -> int | None:
        """:meth:`ExactKernelRidge.ucb_argmax`: the index of the largest upper confidence bound
        ``min_i (sqrt(ρ²_{reg_i} / div_i) β_i + μ_{reg_i})`` over ``candidates`` ``[A, d]``, where
        ``make_form()`` gives ``(regs, β, div, done)`` (:func:`~torchbandits.confidence.radii.ucb_form`;
        ``done(None, minimising i at the chosen candidate [1] or None)`` is called after the
        scoring), with one compiled
        call and the scored set recorded as :meth:`mean_var` records it. ``None`` (nothing recorded)
        when the form or the step does not qualify."""
        if not 0 < self._n <= nx.MAX_N:
            return None
        cand = self._checked(candidates)
        form = make_form()
        if form is None:
            return None
        idxs = []
        for reg in form.regs:
            idx = self._factor_for(reg)[0]
            if idx is None:
                return None
            idxs.append(idx)
        got = self._native_score(cand, idxs, len(idxs) > 1, form)
        if got is None:
            return None
        if form.done is not None:   # the minimising term at the chosen candidate
            form.done(None, None if got[1] is None else got[1][got[0]:got[0] + 1])
        return got[0]  # type: ignore[return-value]

    def _native_served(self, cand: Tensor, idxs: list[int]) -> bool:
        """Whether a candidate cache of one of ``idxs`` serves ``cand`` (then the torch path extends
        it); caches built together share one tensor: compared once."""
        seen: set[int] = set()
        for idx in idxs:
            cache = self._caches.get(idx)
            if cache is None or id(cache.candidates) in seen:
                continue
            if self._serves(idx, cache, cand):
                return True
            seen.add(id(cache.candidates))
        return False

    def _native_append(self, x: Tensor, y: float, rec: ScoredSet, j: int) -> bool:
        """Append ``(x, y)``, ``x`` the candidate ``j`` of the scored set ``rec`` of the current data,
        with one C call, and do the model's bookkeeping; ``False`` (nothing changed) if it does not
        qualify. Raises ``ValueError`` (the data unchanged) if a pivot is not positive."""
        n = self._n
        if n == 0 or not _ok(x) or rec.candidates.shape[0] <= j:
            return False
        plan = self._plan
        if plan is None:
            return False
        fs = list(self._modules["factors"])  # (not through nn.Module.__getattr__)
        native = rec.native  # (what the compiled scoring of every factor wrote: checked there)
        if native is not None and native[0].data_ptr() == native[1]:
            src = native[2]
        else:
            src = _sources(rec, len(fs))
            if src is None:
                return False
        lib = nx.available()
        if lib is None:
            return False
        bufs = self._buffers  # (the buffer table: see GrowingCholesky.layout)
        if not (_ok(bufs["_x"]) and _ok(bufs["_y"]) and _ok(bufs["_z"])):
            return False
        xs_buf, ys, zs = self.room_for(n)  # type: ignore[attr-defined]
        d = x.shape[0]
        scaled, form = self._lean, plan.stationary
        scaled_dst = 0  # the scaled row x·w, where the scaled points are current (exact_scoring)
        if scaled is not None and scaled[1] == n and scaled[3] == self._version and form is not None \
                and scaled[2] is form and _ok(form.weight):
            if scaled[0].shape[0] <= n:
                scaled[0] = grow_rows(scaled[0], n + 1)
            scaled_dst = scaled[0].data_ptr() + n * d * 8
        zb, zstride = zs.data_ptr(), zs.stride(0) * 8
        dst = [(f.open_row(), zb + r * zstride + n * 8) for r, f in enumerate(fs)]
        kxx = rec.kdiag if isinstance(rec.kdiag, float) else float(rec.kdiag[j])
        out = nx.append(lib, n, rec.candidates.shape[0], d, j, src, kxx, self.regularisers, y, dst,
                        (x.data_ptr(), xs_buf.data_ptr() + n * d * 8, ys.data_ptr() + n * 8,
                         scaled_dst), form.weight if scaled_dst else x)  # type: ignore[union-attr]
        if isinstance(out, int):
            raise ValueError(f"append: pivot not positive at λ={self.regularisers[out]}")
        for r, f in enumerate(fs):
            f.close_row()
            self._advance(r, n, out[2 * r], out[2 * r + 1])  # type: ignore[attr-defined]
        if scaled_dst:
            scaled[1] = n + 1  # type: ignore[index]
        return True

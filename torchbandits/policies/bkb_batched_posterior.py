"""The per-round posterior of batched BKB (Calandriello, Carratino, Lazaric, Valko & Rosasco,
COLT 2019, §3.1 eq. 4, §3.2): the base of :class:`~torchbandits.policies.bkb_batched.BKBBatchMixin`
that turns every run's count statistics and dictionary into ``(μ̃, σ̃²)`` at the candidates and
at the pulled points.

On the CPU runs are processed in groups (beyond :data:`CHUNK` runs, sorted by dictionary size, so
that each group works at its own width ``M_g``: the padded work is ``Σ_g k_g (M_g + 1) M_g A``
instead of ``R (M + 1) M A``); on a GPU the batch is one padded group scored in one product
(fewer launches for more flops, :meth:`BKBBatchPosterior.set_chunk_runs`). Two routes to the
same numbers, as the sequential policy's:

* **cached** (the same candidate tensor as the round before, a fixed arm set): the kernel rows
  of every run's pulled arms over the arms ``[R, n, A]`` are computed once per pulled arm, and a
  round gathers ``K_ZA``, ``K_PZ`` and ``K_ZZ`` from them and scores the arms by the half-width
  product ``[HᵀP; wᵀP] K_ZA`` (``half=True`` of :func:`~torchbandits.models.batched_dtc.dtc_system`,
  as the sequential :func:`~torchbandits.models.nystrom_arms.dtc_round`);
* **direct**: the kernel blocks are evaluated (contextual candidates, fresh arm sets) and scored
  by the full product ``[P; (λA⁻¹ − I)P; wᵀP]``, as the sequential model.

On the cached route in float64 on the CPU with the compiled library, every run's round is
instead the sequential compiled round (:func:`torchbandits.native.bkb.dtc_rounds`: one C call
for the batch, each run's slices of the padded buffers read in place, the same BLAS/LAPACK calls
on the same shapes as a sequential run's), a run the C code leaves (a pivoted ``K_ZZ``) by the
sequential torch round :func:`~torchbandits.models.nystrom_arms.dtc_round`: run ``r`` has the bits
of the sequential run with seed ``r`` (tested). The batched torch program stays the path on other
devices and dtypes and when the library is off (``TORCHBANDITS_NATIVE=0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..models.batched_dtc import compact_positions, dtc_system
from ..models.batched_solve import storage_key
from ..models.nystrom_arms import dtc_round
from ..models.nystrom_updates import PIVOT_TOL
from ..native import bkb as native_bkb

__all__ = ["CHUNK", "BKBBatchPosterior"]

#: runs per group of a round beyond which the runs are grouped by dictionary size
CHUNK = 16


class BKBBatchPosterior:
    """Batched BKB's posterior from its count statistics (module docstring). Uses the state set
    up by :class:`~torchbandits.policies.bkb_batched.BKBBatchMixin`: ``batched``, ``_bk``,
    ``_lam64``, ``_lam_scalar``, ``_bcache``, ``_bmodel``, ``_last_key``, ``_last_cand``."""

    #: runs per group of a round, if set (``None``: :data:`CHUNK` on the CPU, the whole batch
    #: on any other device; :meth:`set_chunk_runs`)
    chunk_runs: int | None = None

    def set_chunk_runs(self, runs: int | None) -> None:
        """Runs per group of a round. ``None`` (default): on the CPU :data:`CHUNK` runs sorted by
        dictionary size, each group at its own width and scored a few runs a product (the work
        stays in cache); on any other device the whole batch as one padded program, scored in
        one product (a GPU's round is bound by its kernel launches, which groups multiply: at
        R = 1024, 64 groups of some 30 launches and 256 scoring products a round). A number
        forces groups of that size, scored in one product each (the GPU's program on the CPU)."""
        if runs is not None and int(runs) < 1:
            raise ValueError(f"runs must be >= 1 or None, got {runs}")
        self.chunk_runs = None if runs is None else int(runs)

    def _group(self) -> tuple[int, bool]:
        """Runs per group and whether a group is scored in one product (module docstring)."""
        st = self.batched
        if self.chunk_runs is not None:
            return self.chunk_runs, True
        if st.counts.is_cpu:
            return CHUNK, False
        return st.n_runs, True

    def _lam(self) -> Tensor:
        return self._lam64.to(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]

    def _chunks(self, n: int) -> list[tuple[Tensor | None, list[int]]]:
        """The round's groups of runs ``(runs [k] or None for all, their dictionary sizes)``:
        beyond a group's size (:meth:`set_chunk_runs`), sorted by dictionary size in groups, so
        that each group works at its own width ``M_g`` (one host read of the sizes)."""
        st = self.batched
        r, group = st.n_runs, self._group()[0]
        sizes = st.in_dict[:, :n].sum(-1).tolist() if n else [0] * r
        if r <= group:
            return [(None, sizes)]
        order = sorted(range(r), key=sizes.__getitem__)
        dev = st.counts.device
        return [(torch.tensor(order[i:i + group], device=dev), [sizes[j] for j in order[i:i + group]])
                for i in range(0, r, group)]

    def _rows(self, cand: Tensor, n: int) -> dict[str, Any] | None:
        """The fixed arm set's cache: arm rows ``idx`` ``[R, cap]`` and kernel rows ``rows``
        ``[R, cap, A]`` of the pulled points (built for the ``n`` distinct points, kept up to
        date by :meth:`_cache_played`); ``None`` when ``cand`` is not the candidate tensor of the
        round before or a pulled point is not one of the arms."""
        key = storage_key(cand)
        same = self._last_key is not None and key == self._last_key
        self._last_key, self._last_cand = key, cand
        if not same:
            self._bcache = None
            return None
        if self._bcache is None:
            px = self.batched.px[:, :n]
            eq = (px[:, :, None, :] == cand[:, None, :, :]).all(-1)           # [R, n, A]
            live = torch.arange(n, device=cand.device)[None, :] < self.batched.n_distinct[:, None]
            self._bcache = {"idx": eq.to(torch.int8).argmax(-1) if n else px[..., 0].long(),
                            "rows": self._bk.block(px, cand).contiguous(),
                            "ok": bool((eq.any(-1) | ~live).all())}
        return self._bcache if self._bcache["ok"] else None

    def _cache_played(self, x: Tensor, slot: Tensor, new: Tensor, index: Tensor | None = None
                      ) -> None:
        """Add the new distinct points ``x`` ``[R, d]`` (at ``slot`` where ``new``) to the cache;
        ``index`` ``[R]``: their arm indices if known (every run played its selected arm), else
        they are looked up among the arms."""
        c, arms = self._bcache, self._last_cand
        if c is None or arms is None or not c["ok"]:
            return
        self._cache_room()
        ar = torch.arange(x.shape[0], device=x.device)
        if index is None:
            eq = (arms == x[:, None, :]).all(-1)                              # [R, A]
            c["ok"] = c["ok"] and bool((eq.any(-1) | ~new).all())
            index = eq.to(torch.int8).argmax(-1)
        c["idx"][ar, slot] = torch.where(new, index, c["idx"][ar, slot])
        self._cache_rows(x, slot, new)

    def _cache_room(self) -> None:
        """The cache's buffers grown to the statistics' capacity (the content kept). The kernel
        rows' new tail is left unwritten: a run's row ``j`` is read only once its point ``j``
        exists (``j < n_r``; padded positions read row 0), so a zero fill of ``[R, cap, A]``
        (hundreds of MB at R = 64, A = 1000) would only add writes and page faults."""
        c = self._bcache
        assert c is not None
        need = self.batched.counts.shape[1]
        if c["idx"].shape[1] < need:
            old = c["idx"].shape[1]
            c["idx"] = torch.nn.functional.pad(c["idx"], (0, need - old))
            rows = c["rows"].new_empty(c["rows"].shape[0], need, c["rows"].shape[2])
            rows[:, :old] = c["rows"]
            c["rows"] = rows

    def _cache_rows(self, x: Tensor, slot: Tensor, new: Tensor) -> None:
        """The kernel rows ``k(x_r, X_A)`` of the new distinct points ``x`` ``[R, d]`` (at
        ``slot`` where ``new``) written into the cache."""
        c, arms = self._bcache, self._last_cand
        assert c is not None and arms is not None
        if x.is_cpu:   # the new points' rows only (a host read; the bits are the same per run)
            runs = new.nonzero()[:, 0]
            if runs.numel():
                c["rows"][runs, slot[runs]] = self._bk.block(x[runs, None], arms[runs])[:, 0]
            return
        ar = torch.arange(x.shape[0], device=x.device)
        row = self._bk.block(x[:, None], arms)[:, 0]
        c["rows"][ar, slot] = torch.where(new[:, None], row, c["rows"][ar, slot])

    def _record_native(self, x: Tensor, y: Tensor, scored: list[Any], qbar: float | None
                       ) -> tuple[Tensor, Tensor, Tensor] | None:
        """The count update of a round scored by the compiled rounds on the fixed arm set, in C
        (:func:`torchbandits.native.bkb.record_rounds`: the statistics, the cache's arm rows and
        the draw's variances ``[R, n + 1]``; with ``qbar``, the binomial draw's probabilities
        into :meth:`_draw_rows`' buffer), then the new points' kernel rows; ``(slot, new,
        var)``, or ``None`` with nothing changed (a run played another point than its selected
        arm, inputs that do not qualify: the torch update runs)."""
        st, c = self.batched, self._bcache
        pvar, var, cand, choice = scored[1:5]
        if c is None or not c["ok"] or cand is not self._last_cand:
            return None
        st.reserve(pvar.shape[1] + 1)
        self._cache_room()
        probs = None if qbar is None else self._draw_rows()[0]
        out = native_bkb.record_rounds(cand, choice, x, y, var, pvar, st.px, st.counts, st.sums,
                                       st.n_distinct, c["idx"], qbar or 0.0, probs)
        if out is None:
            return None
        st.version += 1
        self._cache_rows(x, out[0], out[1])
        return out

    def _draw_rows(self) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The binomial draw's probabilities ``[R, cap]`` (zero where not written: a zero count
        draws nothing) and every run's row of them and of the counts, as views kept until the
        counts' buffer changes (a view costs ~1 µs, a binomial per run needs two)."""
        counts = self.batched.counts
        key = (counts.data_ptr(), tuple(counts.shape))
        if self._bdraw is None or self._bdraw[0] != key:
            probs = counts.new_zeros(counts.shape)
            self._bdraw = (key, probs, list(counts.unbind(0)), list(probs.unbind(0)))
        return self._bdraw[1], self._bdraw[2], self._bdraw[3]

    def _posterior(self, cand: Tensor, cached: bool = True,
                   ucb: Callable[[], tuple | None] | None = None) -> dict[str, Any]:
        """GP-scale means and variances of ``cand`` ``[R, A, d]`` and variances of the pulled
        points under every run's current dictionary, group by group (:meth:`_chunks`);
        remembers the rebuilt systems (and the dictionaries) for :meth:`_played_variance`.

        On a fixed arm set in float64 on the CPU with the compiled library, every run's round is
        instead the sequential compiled round (:func:`torchbandits.native.bkb.dtc_rounds`, one
        call for the batch): then ``var``/``pvar`` are **ridge** variances and ``sum_var``
        ``[R]`` (``S_t``) is included; with ``ucb`` (a callable giving the width's terms of
        :func:`torchbandits.native.bkb.select_rounds`, called only there) also every run's
        ``beta`` and ``choice`` ``[R]``, but for the runs in ``failed`` (a list: their rounds
        taken by the torch round, their width and choice left to the caller)."""
        st, lam = self.batched, self._lam()
        st.ensure_dim(cand.shape[2])
        n = st.width
        cache = self._rows(cand, n) if cached else None
        kc = self._nys.kernel_constant  # type: ignore[attr-defined]
        jit = self._nys.jitter  # type: ignore[attr-defined]
        if cache is not None and kc is not None and cand.dtype == torch.float64 and cand.is_cpu:
            nat = self._native_posterior(cache, n, kc, float(jit), ucb)
            if nat is not None:
                return nat
        r, a, d = cand.shape
        parts: list[tuple[Tensor, Tensor, Tensor]] = []
        models = []
        one_product = self._group()[1]
        for runs, sizes in self._chunks(n):
            def take(t: Tensor, runs: Tensor | None = runs) -> Tensor:
                return t if runs is None else t[runs]
            lo, hi = min(sizes), max(sizes)
            sel, live = compact_positions(take(st.in_dict[:, :n]), hi)
            counts, sums = take(st.counts[:, :n]), take(st.sums[:, :n])
            # the candidates and the dictionary points are taken only where they are used
            cg = take(cand) if kc is None or cache is None or hi == 0 else None
            kd = kc if kc is not None else self._bk.diag(cg)
            system, z = None, None
            if hi == 0:
                px = take(st.px[:, :n])
                mean = cand.new_zeros(len(sizes), a)
                var, pvar = mean + kd, px.new_zeros(px.shape[:2]) + (
                    kc if kc is not None else self._bk.diag(px))
            elif cache is not None:                  # gathered from the cached kernel rows
                # whole-row copies: ``index_select`` on the flattened rows (a ``gather`` with
                # an expanded index runs element by element: 40x slower for [8, 46, 1000];
                # advanced indexing 1.4x slower)
                ar = torch.arange(sel.shape[0], device=sel.device)[:, None]
                rows = cache["rows"]
                first = (ar if runs is None else runs[:, None]) * rows.shape[1]
                kza = rows.view(-1, a).index_select(0, (first + sel).view(-1)).view(
                    sel.shape[0], sel.shape[1], a)                                # [k, M, A]
                idx = take(cache["idx"][:, :n])
                kpz = kza.mT[ar, idx]                                            # [k, n, M]
                kzz = kpz[ar, sel]
                system = dtc_system(kpz, kzz, live, counts, sums, take(lam), kc, jit, (lo, hi),
                                    self._lam_scalar, half=True, widths=sizes,
                                    score_runs=len(sizes) if one_product else None)
                mean, var = system.scores(kza, kd, kc)
                pvar = var.gather(1, idx)
            else:
                px = take(st.px[:, :n])
                z = px.gather(1, sel[..., None].expand(-1, -1, d))
                kpz = self._bk.block(px, z)
                system = dtc_system(kpz, self._bk.block(z, z), live, counts, sums, take(lam), kc,
                                    jit, (lo, hi), self._lam_scalar)
                mean, var = system.scores(self._bk.block(z, cg), kd, kc)
                pvar = system.scores(kpz.mT, kc if kc is not None else self._bk.diag(px), kc,
                                     many=True)[1]
            models.append((runs, system, z, sel))
            parts.append((mean, var, pvar))
        if len(parts) == 1:
            mean, var, pvar = parts[0]
        else:                                        # the groups back in run order
            order = torch.cat([runs for runs, *_ in models])
            back = torch.empty_like(order)
            back[order] = torch.arange(r, device=order.device)
            mean, var, pvar = (torch.cat(t)[back] for t in zip(*parts, strict=True))
        out = {"mean": mean, "var": var, "pvar": pvar}
        self._bmodel = (st.version, models)
        return out

    def _native_posterior(self, cache: dict[str, Any], n: int, kc: float, jit: float,
                          ucb: Callable[[], tuple | None] | None = None
                          ) -> dict[str, Any] | None:
        """Every run's round as the sequential BKB's on a fixed float64 CPU arm set: one call of
        the compiled :func:`~torchbandits.native.bkb.dtc_rounds` (the single-run compiled round
        per run), the runs it leaves (a pivoted ``K_ZZ``, a failed Cholesky of ``G``) by the
        sequential torch round :func:`~torchbandits.models.nystrom_arms.dtc_round` on the same
        gathered rows. Returns ``mean``, ``var`` ``[R, A]`` and ``pvar`` ``[R, n]`` (**ridge**
        variances) and ``sum_var`` ``[R]`` (``S_t``, ``torch.dot``'s), with ``ucb`` (a callable
        giving :func:`torchbandits.native.bkb.select_rounds`' width terms) also ``beta``,
        ``choice`` ``[R]`` and ``failed`` (the runs taken here, whose width and choice are not
        set), or ``None`` (no library: the torch batched path)."""
        st = self.batched
        args = (cache["rows"], cache["idx"], st.in_dict, st.counts, st.sums, st.n_distinct,
                self._lam64, n, kc, jit, PIVOT_TOL)
        terms = None if ucb is None else ucb()
        nat = None if terms is None else native_bkb.select_rounds(*args, *terms)
        if nat is None:
            nat = native_bkb.dtc_rounds(*args)
        if nat is None:
            return None
        self._bmodel = None       # the systems are rebuilt on demand (:meth:`_played_variance`)
        out: dict[str, Any] = dict(zip(("mean", "var", "pvar", "sum_var"), nat[:4], strict=True))
        failed = [] if nat[4] is None else nat[4].tolist()
        if len(nat) > 5:
            out.update(beta=nat[5], choice=nat[6], failed=failed)
        for r in failed:
            nr = int(st.n_distinct[r])
            idx, counts = cache["idx"][r, :nr], st.counts[r, :nr].clone()
            sel = st.in_dict[r, :nr].nonzero()[:, 0]
            kza = cache["rows"][r].index_select(0, sel)
            mean, var = dtc_round(kza, kza.index_select(1, idx), sel, counts,
                                  st.sums[r, :nr].clone(), float(self._lam64[r]), kc, jit)
            pvar = var.index_select(0, idx)
            out["mean"][r], out["var"][r], out["pvar"][r, :nr] = mean, var, pvar
            out["sum_var"][r] = torch.dot(counts, pvar)
        return out

    def _played_variance(self, x: Tensor) -> Tensor:
        """GP variance ``[R]`` of the played points ``x`` ``[R, d]`` under the systems of the
        last :meth:`_posterior` (current: :meth:`update` calls it before any change)."""
        if self._bmodel is None:     # the round was scored in C: the systems rebuilt here
            self._posterior(x[:, None, :], cached=False)
        assert self._bmodel is not None
        kc = self._nys.kernel_constant  # type: ignore[attr-defined]
        out = x.new_empty(x.shape[0])
        st = self.batched
        for runs, system, z, sel in self._bmodel[1]:
            xg = x if runs is None else x[runs]
            if z is None and system is not None:     # the dictionary points, taken on demand
                px = st.px[:, :st.width] if runs is None else st.px[runs, :st.width]
                z = px.gather(1, sel[..., None].expand(-1, -1, px.shape[2]))
            kd = kc if kc is not None else self._bk.diag(xg[:, None])
            if system is None:
                v = xg.new_zeros(xg.shape[0]) + (kd if kc is not None else kd[:, 0])
            else:
                v = system.scores(self._bk.block(z, xg[:, None]), kd, kc, many=True)[1][:, 0]
            if runs is None:
                return v
            out[runs] = v
        return out

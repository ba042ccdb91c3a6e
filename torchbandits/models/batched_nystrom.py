"""``R`` runs of the projected (Nyström / DTC) kernel ridge posterior stepped together, each run on
its own dictionary (a leading run dimension, padded to a common capacity).

The math is :class:`~torchbandits.models.NystromKernelRidge`'s in its whitened form, run by run
(Zenati et al. 2022, Prop. 4.2 and Algorithms 2 and 4; Calandriello et al. 2019, §3.1, eq. 4): for
run ``r`` with dictionary ``Z_r`` (``m_r`` anchors), data ``x_j`` with counts ``c_j`` and reward
sums ``s_j``, ``P_r = L_r⁻¹`` (``L_r`` the lower Cholesky factor of ``K_{Z_r Z_r} + ηI``),
embeddings ``e(x) = P_r k_{Z_r}(x)``, ``A_r = E_rᵀ C E_r + λI`` kept as ``Q_r = A_r⁻¹`` and
``g_r = E_rᵀ s``:

* mean ``μ̃_r(x) = e(x)ᵀ Q_r g_r``;
* GP-scale variance ``λσ̃²_r(x) = (k(x,x) − ‖e(x)‖²)₊ + λ e(x)ᵀ Q_r e(x)`` (clamped to ``[0, k]``).

**Padding.** The dictionaries have different sizes ``m_r`` (a tensor ``[R]``); every per-anchor
tensor is held at a common capacity: anchors ``Z`` ``[R, cap_m, d]``, ``P`` and ``Q``
``[R, cap_m, cap_m]``, ``g`` ``[R, cap_m]``, embeddings ``E`` ``[R, cap_n, cap_m]``. The rows and
columns of ``P`` and ``Q`` beyond ``m_r`` are **zero**, so a padded anchor (a zero row of ``Z``,
whose kernel column is finite) gets embedding coordinate ``0`` for every point, contributes 0 to
``‖e‖²``, ``eᵀQe``, ``Qg`` and every border below: padded entries are exact no-ops, and a round is
computed on the ``[:M]`` slices, ``M = max_r m_r``. The data are not padded: every run appends one
point per round, so ``n`` is common (rows ``[R, cap_n]``).

Updates (batched versions of :mod:`~torchbandits.models.nystrom_updates`):

* :meth:`BatchedNystrom.append` — one point per run with the current dictionaries
  (Sherman–Morrison on every ``Q_r``, ``O(m²)`` per run); returns the embeddings and the residuals
  ``ω_r = k(x,x) + η − ‖e(x)‖²``;
* :meth:`BatchedNystrom.add_last` — the last appended point becomes an anchor of the runs that
  accept it and pass the ``min_residual`` guard (bordered ``P``, ``Q``, one new column of ``E``:
  ``O(nm + m²)`` per run): either every run with masked writes and no host read (a run that
  does not grow writes zeros into its zero padding; with KORS's border in the same pass, few
  operators: :mod:`~torchbandits.models.batched_nystrom_growth`), or a compacted subset (one
  read);
* :meth:`BatchedNystrom.rebuild` — from scratch on padded dictionaries ``[R, M, d]`` with sizes
  ``[R]`` (a policy that resamples its dictionary every round, e.g. BKB): ``K_ZZ`` gets an
  identity block on the padded rows, so one batched Cholesky serves every run, and the padded rows
  and columns of ``P`` are zeroed afterwards. A run whose ``K_ZZ`` is numerically singular is
  whitened alone (the pivoted factor of :func:`~torchbandits.models.nystrom_updates.whitening`).

**Chunks.** A round works on chunks of :attr:`~BatchedNystromState.CHUNK` consecutive runs, each
at its own width ``M_g ≥ max m_r`` over the chunk (``[:M_g]`` slices, exact by the zero padding;
a host-side bound, so no round reads the sizes: exact after
:meth:`~BatchedNystromState.refresh_widths`, one more per masked growth);
:meth:`~BatchedNystromState.permute` reorders the runs (EK-UCB keeps them sorted by dictionary
size), so the work is ``Σ_g k_g·M_g²`` instead of ``R·M²``. That pays on the CPU, where a
round is bound by arithmetic; on a GPU, where it is bound by launches (each chunk repeats every
operator of a round), the whole batch is one chunk — one padded program
(:attr:`BatchedNystrom.CHUNK`; :meth:`BatchedNystrom.set_chunk_runs` overrides). The storage is in
:mod:`~torchbandits.models.batched_nystrom_state`; :class:`~torchbandits.models.batched_kors.BatchedKORS`
holds the KORS sampler of EK-UCB the same way. The numbers equal the sequential model's up to
rounding (batched products may sum in another order).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..deferred_checks import active_checks, check_runs
from ..native import ekucb as native_ekucb
from .batched_nystrom_append import CompiledAppend
from .batched_nystrom_growth import Growth
from .batched_nystrom_state import BatchedNystromState, batched_kernel
from .nystrom_updates import PIVOT_TOL, whitening

__all__ = ["BatchedNystrom", "batched_kernel"]


class BatchedNystrom(BatchedNystromState, CompiledAppend, Growth):
    """Whitened Nyström posterior of ``R`` runs, each on its own dictionary (module docstring).

    Args:
        kernel: GPyTorch kernel shared by every run.
        lam: ridge regulariser ``λ > 0``.
        n_runs: ``R``.
        jitter: nugget ``η ≥ 0`` on the diagonal of ``K_ZZ``.
        min_residual: :meth:`add_last` refuses an anchor with ``ω ≤ min_residual·k(z,z)``.
        dtype, device: of all state (float64 by default).
    """

    #: runs per chunk, if set (``None``: :attr:`CHUNK_CPU` on the CPU, the whole batch elsewhere)
    chunk_runs: int | None = None
    #: runs per chunk on the CPU, where a chunk of small dictionaries saves arithmetic
    CHUNK_CPU = 16
    #: the compiled score (:mod:`torchbandits.native.ekucb`) from this width ``M`` on; below it
    #: the torch path runs. The compiled products sum in another order, and on Chessboard
    #: (cond(K_ZZ) ≈ 1e12) rounding is amplified: ~1e-10 in the UCBs of the first rounds, and a
    #: ``min_residual`` refusal right at its threshold can flip, as between the batched and the
    #: sequential torch paths. Below 48 anchors (Chessboard's first ~100 rounds, a small share
    #: of a long run's time) the torch path's rounding is kept, which keeps the runs that the
    #: tests hold to the sequential ones identical (Zenati et al. 2022's settings, 200 rounds)
    COMPILED_MIN_WIDTH = 48

    @property
    def CHUNK(self) -> int:  # type: ignore[override]  # (the state's class constant)
        """Runs per chunk: on the CPU :attr:`CHUNK_CPU` (the runs sorted by size, each chunk at
        its own width: less arithmetic), on a GPU the whole batch — one padded program, since
        every chunk repeats every launch of a round (:attr:`chunk_runs` overrides both)."""
        if self.chunk_runs is not None:
            return self.chunk_runs
        return self.CHUNK_CPU if self.device.type == "cpu" else self.n_runs

    def set_chunk_runs(self, runs: int | None) -> None:
        """Set :attr:`chunk_runs` and re-chunk at the exact widths (one host read)."""
        self.chunk_runs = None if runs is None else max(int(runs), 1)
        self.refresh_widths()

    # ------------------------------------------------------------------ queries
    def kernel_columns(self, x: Tensor) -> Tensor:
        """``k_{Z_r}(x_r)`` ``[R, M]`` of one point per run ``x`` ``[R, d]`` (padded anchors give
        finite values that the zero padding of ``P`` and ``Q`` cancels)."""
        mm = self._mmax
        if mm == 0:
            return x.new_zeros(x.shape[0], 0)
        return self._k.block(self._z[:, :mm], x[:, None])[..., 0]

    def prior_variance(self, x: Tensor) -> Tensor:
        """``k(x_r, x_r)`` ``[R]`` of points ``[R, d]``."""
        return self._k.diag(x)

    def score(self, cand: Tensor) -> tuple[Tensor, Tensor]:
        """Mean ``μ̃_r`` and GP-scale variance ``λσ̃²_r`` (clamped to ``[0, k]``) of trusted
        candidates ``[R, A, d]``; both ``[R, A]``. Cost ``O(A·M²)`` per run: one batched kernel
        block ``[R, M, A]``, one product with ``P`` (``F = P K``) and one with ``Q``
        (``Q [F, g]``: the variances' ``QF`` and the mean weights ``w = Qg`` together). The
        columns are remembered for :meth:`scored_columns` until the state changes."""
        const = self._k.const
        if self._mmax == 0:
            return cand.new_zeros(cand.shape[:2]), self._k.diag(cand)
        if self.compiled_scores() and native_ekucb.available(cand):
            kdiag = self._k.diag(cand)
            compiled = self._score_compiled(cand, kdiag)
            if compiled is not None:
                mean, var = compiled
                return mean, (var.clamp_(max=const) if const is not None
                              else torch.minimum(var, kdiag))
        # the torch path (reading self._q applies a deferred step first); k(x, x) a float when
        # constant (no tensor to launch), the variance then clamped to [0, k] in the chunk
        kdiag = const if const is not None else self._k.diag(cand)
        means, variances, cols = [], [], []
        for a, b, mg in self.chunks():
            mean, var, col = self._score_chunk(
                cand[a:b], kdiag if const is not None else kdiag[a:b], a, b, mg)
            means.append(mean)
            variances.append(var)
            cols.append(col)
        self._scored = (self._version, cand, cols)
        mean = means[0] if len(means) == 1 else torch.cat(means)
        var = variances[0] if len(variances) == 1 else torch.cat(variances)
        return mean, var if const is not None else torch.minimum(var, kdiag)

    def compiled_scores(self) -> bool:  # whether score runs the compiled per-run products
        return self._mmax >= self.COMPILED_MIN_WIDTH and native_ekucb.available(self._p)

    def _score_compiled(self, cand: Tensor, kdiag: Tensor) -> tuple[Tensor, Tensor] | None:
        """:meth:`score` by the compiled per-run products (:func:`torchbandits.native.ekucb.score`:
        float64 CPU tensors, each run at its own size ``m_r``, no chunks), or ``None`` (the torch
        path: other devices and dtypes, no compiler, widths below :attr:`COMPILED_MIN_WIDTH`;
        faster for 10 to 110 candidates at R = 64). The kernel block ``[R, A, M]`` is shared."""
        if not (self.compiled_scores() and native_ekucb.available(cand)):
            return None
        kz = self._k.compiled_block(cand, self._z[:, : self._mmax])
        if self._q_kept is not None:   # debug_stale_q: the stored Q is NaN until flushed
            self._flush_q()
        out = native_ekucb.score(kz, self._p, self._q_stored(), self._g, self._m, kdiag, self.lam,
                                 p_lower=self._p_lower, pending=self._pending)
        if out is None:
            return None
        self._drop_pending()   # the deferred step of Q is applied
        mean, var, f, qf = out
        self._scored = (self._version, cand, [(kz, f, qf[:, :-1])])   # one full-width "chunk"
        self._scored_full = (self._version, cand, kz, f, qf)   # (qf whole: for the fused append)
        return mean, var

    def _score_chunk(self, cand: Tensor, kdiag: Tensor | float, a: int, b: int, mg: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`score` of the runs ``a..b−1`` on their ``[:M_g]`` slices; the columns
        ``[k, 3, A, M_g]`` (``e(x)``, ``Q e(x)``, ``k_Z(x)``) for :meth:`scored_columns`. The three
        quadratic forms ``‖e‖²``, ``eᵀQe``, ``eᵀQg`` are one product and one sum over a stack
        (each entry the product and sum of the unstacked form: the same numbers); with a
        constant ``k`` (a float) the variance leaves clamped to ``[0, k]``."""
        if mg == 0:   # (row layout below: [k, A, M_g] times Pᵀ and Qᵀ ran faster than P·K here)
            empty = cand.new_zeros(cand.shape[0], 4, cand.shape[1], 0)
            var = (cand.new_full(cand.shape[:2], kdiag) if isinstance(kdiag, float)
                   else kdiag.clone())
            return cand.new_zeros(cand.shape[:2]), var, empty
        kz = self._k.block(cand, self._z[a:b, :mg])                         # k_Z(x)ᵀ [k, A, M_g]
        f = kz @ self._p[a:b, :mg, :mg].mT                                  # e(x)ᵀ [k, A, M_g]
        na = f.shape[1]
        qf = torch.cat([f, self._g[a:b, None, :mg]], 1) @ self._q[a:b, :mg, :mg].mT
        cols = torch.stack([f, qf[:, :na], qf[:, na:].expand_as(f), kz], 1)  # [k, 4, A, M_g]
        forms = (cols[:, :3] * f[:, None]).sum(-1)                # ‖e‖², eᵀQe, eᵀ(Qg) [k, 3, A]
        var = torch.rsub(forms[:, 0], kdiag).clamp_(min=0.0)                # (k − ‖e‖²)₊
        var.add_(forms[:, 1], alpha=self.lam)
        var = var.clamp_(0.0, kdiag) if isinstance(kdiag, float) else var.clamp_(min=0.0)
        return forms[:, 2], var, cols

    def scored_columns(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(k_Z(x), e(x), Q e(x))``, each ``[R, M]``, when every run's ``x_r`` ``[R, d]`` is a
        candidate of the last :meth:`score` and nothing changed since (else ``None``): the
        played candidates' columns, so that :meth:`append` skips two passes over ``P`` and ``Q``."""
        last = self._scored
        if last is None or last[0] != self._version:
            return None
        cand = last[1]
        if cand.shape[0] != x.shape[0] or cand.shape[2] != x.shape[1]:
            return None
        hit = (cand == x[:, None, :]).all(-1)                              # [R, A]
        found, first = hit.max(-1)                 # (the first candidate that is x_r)
        if active_checks() is None:
            if not bool(found.all()):    # user code: one read, fresh columns if not
                return None
        else:   # the runner plays a row of the last candidates: flagged, not read
            check_runs("x must be a candidate of the last select", ~found,
                       lambda r: f"x of run {r} is not a candidate of the last select")
        chunks = self.chunks()
        entry = last[2][0]
        if len(last[2]) == 1 and entry[0].shape[-1] == self._mmax:   # one chunk: gathers
            rows = self._rows(slice(0, x.shape[0]))
            if isinstance(entry, Tensor):      # the torch path's stack: one gather
                cols = entry[rows, :, first]                              # [R, 4, M]
                return cols[:, 3], cols[:, 0], cols[:, 1]
            kz, f, qf = (t[rows, first] for t in entry)
            return kz, f, qf
        out = x.new_zeros(3, x.shape[0], self._mmax)      # zero beyond each chunk's width
        for (a, b, mg), col in zip(chunks, last[2], strict=True):
            if mg:
                rows, pick = self._rows(slice(0, b - a)), first[a:b]
                for j, t in enumerate((col[:, 3], col[:, 0], col[:, 1])
                                      if isinstance(col, Tensor) else col):
                    out[j, a:b, :mg] = t[rows, pick]
        return out[0], out[1], out[2]

    # ------------------------------------------------------------------ updates
    def append_scored(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`append` of the played candidates ``x`` ``[R, d]`` (trusted) with rewards ``y``
        ``[R]``, their columns taken from the last :meth:`score`: returns ``(k_Z(x), f, ω)``
        (``[R, M]``, ``[R, M]``, ``[R]``). After a compiled score, one compiled call
        (:func:`torchbandits.native.ekucb_append.append_played`: the numbers of
        :meth:`scored_columns` + :meth:`append` up to the rounding of two sums); else those two."""
        fused = self._append_compiled(x, y)
        if fused is not None:
            return fused
        cols = self.scored_columns(x)
        kz = self.kernel_columns(x) if cols is None else cols[0]
        f, omega = self.append(x, y, cols)
        return kz, f, omega

    def append(self, x: Tensor, y: Tensor,
               columns: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Add ``x`` ``[R, d]`` with rewards ``y`` ``[R]`` (trusted) to every run with its current
        dictionary: ``f = e(x)``, ``Q ← Q − (Qf)(Qf)ᵀ/(1 + fᵀQf)``, ``g ← g + y f``.
        ``columns`` may pass ``(k_Z(x), e(x), Q e(x))`` ``[R, M]`` each (:meth:`scored_columns`).
        Returns ``(f [R, M], ω [R])`` with ``ω = k(x,x) + η − ‖f‖²`` the residual of ``x`` outside
        the span of each dictionary (before the append)."""
        n, mm = self._n, self._mmax
        const = self._k.const      # k(x, x) a float when constant (no tensor to launch)
        kxx = const if const is not None else self._k.diag(x)
        self._ensure(n + 1, max(mm, 1), x.shape[1])
        self._version += 1
        if mm:
            q = self._q[:, :mm, :mm]   # (with the step of a previous append not scored since)
            if columns is None:
                f = (self._p[:, :mm, :mm] @ self.kernel_columns(x)[..., None])[..., 0]
                gq = (q @ f[..., None])[..., 0]
            else:
                f, gq = columns[1], columns[2]
            forms = (f[:, None, :] * torch.stack([gq, f], 1)).sum(-1)       # fᵀQf, ‖f‖² [R, 2]
            fg = forms[:, 0]
            omega = torch.rsub(forms[:, 1], kxx + self.jitter)
            gs = gq / (1.0 + fg)[:, None]
            # Q ← Q − (Qf)(Qf)ᵀ/(1 + fᵀQf): compiled, deferred to the next score's pass over Q
            # (_flush_q), else on each chunk's slice
            if native_ekucb.available(q, gq, gs):
                self._defer_q_step(gq, gs)
            else:
                for a, b, mg in self.chunks():
                    if mg:
                        q[a:b, :mg, :mg].addcmul_(gq[a:b, :mg, None], gs[a:b, None, :mg],
                                                  value=-1.0)
            self._g[:, :mm].add_(f * y[:, None])
            self._e[:, n, :mm] = f
            self._logdet.add_(torch.log1p(fg))
        else:
            f = x.new_zeros(x.shape[0], 0)
            omega = (x.new_full((x.shape[0],), kxx) if isinstance(kxx, float) else kxx) + self.jitter
        self._x[:, n] = x
        self._s[:, n] = y
        self._n = n + 1
        return f, omega

    def add_last(self, f: Tensor, omega: Tensor, accept: Tensor, runs: Tensor | None = None
                 ) -> Tensor:
        """Make the last appended point an anchor of the runs where ``accept`` holds, ``f`` its
        embedding and ``omega`` its residual as :meth:`append` returned them.

        ``runs=None`` (sync-free): ``f`` ``[R, M]``, ``omega`` and ``accept`` ``[R]``; every run is
        bordered chunk by chunk on slices and the writes are masked (a refused run writes zeros
        into its zero padding), then the widths grow by one (:meth:`bump_widths`, no read).
        ``runs`` a LongTensor ``[k]`` of distinct runs (compacted by the caller): ``f`` ``[k, M]``,
        ``omega`` and ``accept`` ``[k]``; only those runs are touched, and the widths are
        refreshed (one host read). The ``min_residual`` guard refuses ``ω ≤ min_residual·k(z,z)``
        (counted in :attr:`refused`). Returns the mask of the runs whose dictionary grew (``[R]``
        or ``[k]``). Per run: ``d = √ω``, new row of ``P``: ``[−Pᵀf/d, 1/d]``, new embedding
        column ``e = (k_S(z) − E f)/d``, ``Q`` bordered with ``b = Eᵀ C e`` and ``eᵀ C e + λ``."""
        if runs is None:   # every run, few operators (with KORS's border: the policy's call)
            return self.grow_masked(f, omega, accept)
        return self.grow_compacted(runs, f, omega, accept)

    @torch.no_grad()
    def rebuild(self, dictionary: Tensor, sizes: Tensor, x: Tensor, target_sums: Tensor,
                counts: Tensor) -> None:
        """Recompute every run from scratch (``O(nM² + M³)`` per run): dictionaries
        ``[R, M, d]`` padded beyond ``sizes`` ``[R]``, data ``x`` ``[R, n, d]`` with reward sums
        and counts ``[R, n]`` (a zero count is a no-op row). ``K_ZZ`` padded with the identity
        (``[[K_r, 0], [0, I]]``) factors in one batched Cholesky; the padded rows and columns of
        ``P`` are zeroed, so ``E = K_SZ Pᵀ`` and ``A = EᵀCE + λI`` are padded with 0 and ``λ``."""
        r, mm = dictionary.shape[0], dictionary.shape[1]
        n, d = x.shape[1], x.shape[2]
        self._version += 1
        self._drop_pending()   # Q is recomputed
        self._ensure(max(n, 1), max(mm, 1), d)
        self._x[:, :n] = x
        self._c[:, :n] = counts
        self._c[:, n:].fill_(1.0)
        self._s[:, :n] = target_sums
        self._unit_counts = bool((counts == 1).all())   # (this rebuild reads the host anyway)
        self._n = n
        self._m.copy_(sizes)
        self.refresh_widths()
        self._p.zero_()
        self._q.zero_()
        self._g.zero_()
        if mm == 0:
            self._logdet.zero_()
            return
        self._z[:, :mm] = dictionary
        live = torch.arange(mm, device=sizes.device)[None, :] < sizes[:, None]    # [R, M]
        pair = live[:, :, None] & live[:, None, :]
        kzz = torch.where(pair, self._k.block(dictionary, dictionary), 0.0)
        eye = torch.eye(mm, dtype=self.dtype, device=self.device).expand(r, mm, mm)
        pad_diag = torch.diag_embed((~live).to(self.dtype))
        kzz = kzz + pad_diag + (self.jitter * torch.diag_embed(live.to(self.dtype)))
        chol, info = torch.linalg.cholesky_ex(kzz)
        p = torch.linalg.solve_triangular(chol, eye, upper=False)
        pivots = torch.diagonal(chol, dim1=-2, dim2=-1) ** 2
        scale = self._k.diag(dictionary).masked_fill(~live, 0.0).amax(-1) + self.jitter
        bad = (info != 0) | ((pivots <= PIVOT_TOL * scale[:, None]) & live).any(-1)
        self._p_lower = True
        for run in bad.nonzero()[:, 0].tolist():   # numerically singular: pivoted, run alone
            self._p_lower = False                  # (a pivoted factor is not triangular)
            m_r = int(sizes[run])
            p[run].zero_()
            p[run, :m_r, :m_r] = whitening(kzz[run, :m_r, :m_r], eye[0, :m_r, :m_r])
        p = p * pair
        feat = self._k.block(x, dictionary) @ p.mT                                # E [R, n, M]
        a = feat.mT @ (counts[..., None] * feat)
        a.diagonal(dim1=-2, dim2=-1).add_(self.lam)
        chol_a = torch.linalg.cholesky(a)
        self._p[:, :mm, :mm] = p
        self._q[:, :mm, :mm] = torch.cholesky_inverse(chol_a)
        self._g[:, :mm] = (feat.mT @ target_sums[..., None])[..., 0]
        self._e[:, :n, :mm] = feat
        logdet = 2.0 * torch.log(torch.diagonal(chol_a, dim1=-2, dim2=-1)).sum(-1)
        self._logdet.copy_(logdet - (mm - sizes).to(self.dtype) * math.log(self.lam))  # the padded λ

    def extra_repr(self) -> str:
        return f"n_runs={self.n_runs}, lam={self.lam}, n={self._n}, max_m={self._mmax}"

"""The compiled CPU step of :class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge`,
mixed into it as :class:`BatchedExactNative`: all runs of a round scored (or scored, bounded and
argmaxed) in one C call and appended in one C call (:mod:`torchbandits.native.exact_batch`, the
single-run step's kernels looped over the runs).

* :meth:`~BatchedExactNative.mean_var_native`: the GP mean and variance ``[R·G, A]`` of fresh
  candidates ``[R, A, d]`` (per run ``K_SC`` by the closed form, per member ``V = L⁻¹K_SC``,
  ``μ = zᵀV``, ``ρ² = max(k_CC − colsum(V ⊙ V), 0)``: the Cholesky form of the posterior, Flynn
  & Reeb 2024, App. E.2), for the model (``G = 1``) or DMM's companion of ``R·G`` members (``G``
  regularisers per run sharing its points, Flynn & Reeb 2024, §5.4: the kernel rows evaluated
  once per run).
* :meth:`~BatchedExactNative.ucb_argmax`: the same scoring, then per run the first index of
  the largest closed-form bound ``min_g (sqrt(ρ²_{rG+g} / div_{rG+g}) β_{rG+g} + μ_{rG+g})``
  (:class:`~torchbandits.confidence.base.UCBForm`, the rule of the fused single-run select:
  ``G = 1`` for the radius rules and AMM, DMM's grid of Eq. (14) on the companion), a
  ``LongTensor [R]``: torch's ``argmax`` of the torch path's bounds (first index on ties, a NaN
  counts as largest), with the same bits (``sqrt(ρ²/div)·β + μ`` is ``μ + β·sqrt(ρ²/div)``:
  IEEE products and sums commute). It also keeps the chosen candidate's append pieces
  (``l = L⁻¹k_S(c)``, ``zᵀl``, ``‖l‖²`` per member), computed while the run's factor is in
  the cache.
* :meth:`~BatchedExactNative.append_native` borders every member's factor with one point per
  run (``l = L⁻¹k_S(x)``, ``d = sqrt(k(x, x) + λ − ‖l‖²)``, ``z_n = (y − zᵀl)/d``), reading
  ``l``, ``zᵀl`` and ``‖l‖²`` from the last select's pieces for every run whose point holds the
  bits of the candidate chosen for it (the same operations on the same inputs: the same
  numbers), computing them for the others.

The scoring and the select split the runs over :func:`torchbandits.native.threads` threads
(:func:`torchbandits.native.threads_for`; default one; the same numbers); the append
is one call.

Each returns ``None`` / ``False`` when the step does not qualify, and the caller takes its torch
path, which stays the reference (the tests hold the two to 1e-10) and is what runs on other
devices and dtypes: no compiled library (:func:`torchbandits.native.disabled`,
``TORCHBANDITS_NATIVE=0``, no compiler), a tensor that is not a float64 CPU tensor, a kernel
without a closed form (:class:`~torchbandits.kernel_fast.ScaledStationary`: RBF, Matérn-1/2,
3/2, 5/2, one output scale), an empty model, more than :data:`~torchbandits.native.exact.MAX_N`
stored points, (select) a candidate set the candidate caches serve (the one of the previous
call), or (append) a pivot that is not positive (the torch path then rejects the call or flags
the run, as it does). Addresses and strides are read from the model's buffers at every call
(nothing is kept in C). The pieces are used only while the model is the one they were computed
for (its ``n``, the storage and version counter of its factor, ``z`` and points; dropped by
every append, :meth:`reset`, a state load and ``.to()``; a deep copy's buffers live elsewhere,
so it computes its own).

A compiled append does not border the explicit ``L⁻¹`` of the torch path
(:class:`~torchbandits.models.batched_inverse.InverseFactor`): it is forgotten, and rebuilt from
the factor if the torch path needs it again (e.g. the second call of a fixed candidate set,
whose ``V`` the candidate cache keeps and extends by rows in O(n·A)).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..buffers import grow_rows, set_plain
from ..native import exact as nx
from ..native import exact_batch as nb
from ..native import threads_for
from .batched_kernel import fast_kernel
from .exact_fused import pruning, pruning_forced

__all__ = ["BatchedExactNative"]

_F64 = torch.float64


def _ok(t: Tensor) -> bool:
    """A contiguous float64 CPU tensor (what the C code reads)."""
    return t.dtype is _F64 and t.is_cpu and t.is_contiguous()


class BatchedExactNative:
    """The compiled CPU step, mixed into
    :class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` (whose state it reads
    and writes): see the module docstring."""

    _buffers: dict[str, Tensor]   # (read directly: no ``nn.Module.__getattr__`` per buffer)
    _n: int
    _pending: tuple[tuple[Any, ...], Tensor, Tensor] | None = None
    _pivots: tuple[Tensor, int, int, Tensor] | None = None   # (L, its version, n, diag [R, cap])
    kernel: Any
    workspace: Any
    _scaled: Any
    _inverse: Any

    # ------------------------------------------------------------------ helpers
    def _native_kernel(self, like: Tensor) -> tuple[Tensor, int, float | None, float] | None:
        """``(w, kind code, output scale or None, k(x, x))`` of the model's kernel, or ``None``
        without a closed form."""
        if not fast_kernel(self.kernel):
            return None
        form = self._scaled.stationary(self.kernel, like)
        if form is None:
            return None
        kind = nx.KINDS.get((form.kind, form.nu))
        if kind is None or not _ok(form.weight):
            return None
        return form.weight, kind, form.outputscale, form.diag_value

    def _native_state_ok(self) -> bool:
        b = self._buffers
        return _ok(b["_L"]) and _ok(b["_x"]) and _ok(b["_z"]) and _ok(b["_y"])

    def native_ready(self, cand: Tensor) -> bool:
        """Whether the compiled step may serve candidates ``cand`` now: ``1 ≤ n ≤ MAX_N``, a
        float64 CPU tensor, a library, a kernel evaluated in closed form (host metadata only,
        no value read: a caller asks before it prepares a compiled call's inputs, so on other
        devices and dtypes nothing is computed twice)."""
        return 0 < self._n <= nx.MAX_N and cand.dtype is _F64 and cand.is_cpu \
            and fast_kernel(self.kernel) and nb.available() is not None

    def _native_scoring(self, cand: Tensor, groups: int
                        ) -> tuple[Any, Tensor, tuple[Tensor, int, float | None, float]] | None:
        """``(library, candidates, kernel)`` if the candidates ``[R, A, d]`` of the
        ``R = n_runs / groups`` runs can be scored in C now (each run's ``[A, d]`` contiguous,
        any run stride: else a contiguous copy), else ``None``."""
        b = self._buffers
        if not self.native_ready(cand) or cand.shape[0] * groups != b["_lam"].shape[0]:
            return None
        if cand.stride(2) != 1 or cand.stride(1) != cand.shape[2]:
            cand = cand.contiguous()   # (a strided view of each run's set: one small copy)
        lib = nb.available()
        if lib is None or not self._native_state_ok() or b["_x"].shape[2] != cand.shape[2]:
            return None
        kern = self._native_kernel(cand)
        return None if kern is None else (lib, cand, kern)

    def _pending_key(self) -> tuple[Any, ...]:
        """What the select's append pieces were computed from (host metadata only)."""
        b = self._buffers
        L, z, x = b["_L"], b["_z"], b["_x"]
        return (self._n, L.data_ptr(), L._version, z.data_ptr(), z._version, x.data_ptr(),
                x._version)

    def factor_diagonal(self, n: int) -> Tensor:
        """The factors' diagonals ``L_ii`` ``[R, n]``: a view of a contiguous copy while it is
        kept (the compiled appends write each new pivot into it, so a round reads ``R·n``
        contiguous numbers instead of one cache line per pivot spread over the factors), else
        the strided diagonal of the factors (the torch path's appends, other devices). The
        copy is valid for the factor tensor and version counter it was made from and ``n``."""
        piv, chol = self._pivots, self._buffers["_L"]
        if piv is not None and piv[0] is chol and piv[1] == chol._version and piv[2] == n:
            return piv[3][:, :n]
        return torch.diagonal(chol[:, :n, :n], dim1=-2, dim2=-1)

    def _pivot_room(self, n: int) -> Tensor | None:
        """Before a compiled append at ``n`` points: the copy of the diagonals with room for
        column ``n`` (the C call writes the new pivots there), or ``None`` if it is not valid."""
        piv, chol = self._pivots, self._buffers["_L"]
        if piv is not None and piv[0] is chol and piv[1] == chol._version and piv[2] == n:
            return grow_rows(piv[3], n + 1, dims=(1,))
        return None

    def _keep_pivots(self, n: int, buf: Tensor | None) -> None:
        """After a compiled append at ``n`` points: the copy of the diagonals ``buf`` (made from
        the factor if ``None``: once after a torch-path append) is valid for ``n + 1``."""
        chol = self._buffers["_L"]
        if buf is None:
            buf = chol.new_empty(chol.shape[0], chol.shape[1])
            buf[:, : n + 1] = torch.diagonal(chol[:, : n + 1, : n + 1], dim1=-2, dim2=-1)
        set_plain(self, "_pivots", (chol, chol._version, n + 1, buf))

    # ------------------------------------------------------------------ the compiled calls
    def mean_var_native(self, cand: Tensor, groups: int = 1, *, keep: bool = False
                        ) -> tuple[Tensor, ...] | None:
        """GP mean and variance (clamped at 0) ``[R·G, A]`` of the checked candidates ``cand``
        ``[R, A, d]`` of the ``R = n_runs / groups`` runs (member ``r·G + g`` is run ``r`` at its
        ``g``-th regulariser, sharing its points), with one compiled call; ``keep``: also
        ``V = L⁻¹K_SC`` ``[R·G, n, A]`` and ``colsum(V ⊙ V)`` ``[R·G, A]`` (new tensors, what a
        fixed set's cache keeps). ``None`` if the step does not qualify (module docstring)."""
        got = self._native_scoring(cand, groups)
        if got is None:
            return None
        lib, cand, kern = got
        b = self._buffers
        shape = (b["_lam"].shape[0], cand.shape[1])
        mean, var = cand.new_empty(shape), cand.new_empty(shape)
        kept = (cand.new_empty(shape[0], self._n, shape[1]), cand.new_empty(shape)) if keep \
            else None
        nb.score(lib, groups, self._n, b["_x"], cand, kern, b["_L"], b["_z"], mean, var, kept,
                 threads=threads_for(cand.shape[0]))
        return (mean, var) if kept is None else (mean, var, *kept)

    def ucb_argmax(self, candidates: Tensor, beta: Tensor, div: Tensor, groups: int = 1, *,
                   want_arg: bool = False) -> tuple[Tensor, Tensor | None] | None:
        """Every run's first index of the largest bound ``min_g (sqrt(ρ²_{rG+g}/div_{rG+g})
        β_{rG+g} + μ_{rG+g})`` over its checked candidates ``[R, A, d]`` (``β``, ``div``
        ``[R·G]``; ``G = groups > 1``: the model is an ``at_regularisers`` companion),
        ``(LongTensor [R], argmin g at the chosen candidate [R] or None)``, in one compiled call
        (:meth:`ucb_argmax_native`); ``None`` where the compiled step does not qualify or the
        candidate caches serve the set (the caller then scores by ``mean_var``)."""
        if groups > 1:
            return self.ucb_argmax_groups(  # type: ignore[attr-defined]
                candidates, beta, div, groups, want_arg)
        if self._cache_hit(candidates) is not None:  # type: ignore[attr-defined]
            return None
        got = self.ucb_argmax_native(candidates, beta, div, want_arg=want_arg)
        if got is not None:
            self._remember(candidates, None)  # type: ignore[attr-defined]
        return got

    def ucb_argmax_native(self, cand: Tensor, beta: Tensor, div: Tensor, groups: int = 1, *,
                          want_arg: bool = False) -> tuple[Tensor, Tensor | None] | None:
        """``(index [R], argmin g [R] or None)``: every run's first index of the largest
        bound ``min_g (sqrt(ρ²_{rG+g} / div_{rG+g}) β_{rG+g} + μ_{rG+g})`` over its checked
        candidates ``[R, A, d]`` (``β``, ``div`` ``[R·G]``; ``want_arg``: also the minimising
        ``g`` at the chosen candidate), one compiled call; the chosen candidates' append pieces
        are kept for the next append. The call is pruned unless in
        :func:`~torchbandits.models.exact_fused.full_select` (one group: each run's candidates
        solved row block by row block while they can still be chosen; several: each run's members
        solved on the candidates that can still be chosen, the member that set its last choice
        first, a plain attribute kept across calls; the same choice and bits as without:
        :func:`torchbandits.native.exact_batch.select`). ``None`` if the step does not qualify
        (module docstring); the caller handles the candidate caches."""
        got = self._native_scoring(cand, groups)
        if got is None or cand.shape[1] == 0:
            return None
        lib, cand, kern = got
        b, members = self._buffers, cand.shape[0] * groups
        beta, div = beta.contiguous(), div.contiguous()
        if not (_ok(beta) and _ok(div)) or beta.shape != (members,) or div.shape != beta.shape:
            return None
        r, d = cand.shape[0], cand.shape[2]
        best = torch.empty(r, dtype=torch.int64)
        arg = torch.empty(r, dtype=torch.int64) if want_arg else None
        pieces = self.workspace.get("pending", (members, self._n + 2), cand)
        points = self.workspace.get("pending_x", (r, d), cand)
        hint = getattr(self, "_select_hint", None)
        if hint is None or hint.shape != (r,):
            hint = torch.full((r,), groups // 2, dtype=torch.int64)
            set_plain(self, "_select_hint", hint)
        cache = getattr(self, "_alpha_cache", None)   # the pruned select's last α per run
        head = nx.PRUNE_HEAD   # (α's length, the poor-pruning state), then α; kept on growth
        if cache is None or cache.shape[0] != r or cache.shape[1] < self._n + head:
            fresh = torch.zeros(r, head + max(2 * self._n, 64), dtype=torch.float64)
            if cache is not None and cache.shape[0] == r:
                fresh[:, :cache.shape[1]] = cache
            cache = fresh
            set_plain(self, "_alpha_cache", cache)
        if not pruning():
            hint = None
        elif pruning_forced():
            cache[:, 1] = nx.PRUNE_FORCED
        nb.select(lib, groups, self._n, b["_x"], cand, kern, b["_L"], b["_z"], (beta, div), best,
                  arg, (pieces, points), hint, threads=threads_for(r), alpha_cache=cache)
        set_plain(self, "_pending", (self._pending_key(), pieces, points))
        return best, arg

    def append_native(self, x: Tensor, y: Tensor, groups: int = 1) -> bool:
        """Append ``x`` ``[R, d]``, ``y`` ``[R]`` (checked) to every member of the ``R`` runs of
        ``groups`` members (all of a run's members get its point), with one compiled call and the
        model's bookkeeping; ``False`` (nothing changed) if the step does not qualify (module
        docstring)."""
        pending, n, b = self._pending, self._n, self._buffers
        if pending is not None:
            set_plain(self, "_pending", None)
        lam = b["_lam"]
        if n == 0 or n >= nx.MAX_N or not (_ok(x) and _ok(y) and _ok(lam)):
            return False
        if x.shape[0] * groups != lam.shape[0] or b["_x"].shape[2] != x.shape[1]:
            return False
        lib = nb.available()
        if lib is None:
            return False
        kern = self._native_kernel(x)
        if kern is None:
            return False
        pend = None if pending is None or pending[0] != self._pending_key() \
            or pending[2].shape != x.shape else pending[1:]
        pivots = self._pivot_room(n)
        for name, dims in (("_L", (1, 2)), ("_x", (1,)), ("_y", (1,)), ("_z", (1,))):
            buf = b[name]
            grown = grow_rows(buf, n + 1, dims=dims)
            if grown is not buf:   # (a registered buffer replaced in its dict, as setattr does)
                b[name] = grown
        if not self._native_state_ok():
            return False
        work = self.workspace.get("native_append", (lam.shape[0] * (n + 2),), x)
        if nb.append(lib, groups, n, x, y, (b["_x"], b["_y"], b["_L"], b["_z"]), kern, lam, work,
                     pend, pivots):
            return False   # a pivot not positive: nothing written, the torch path rejects or flags
        if not self._inverse.off:
            self._inverse.restart()   # not bordered here: rebuilt from the factor if needed
        self._keep_pivots(n, pivots)
        set_plain(self, "_n", n + 1)
        return True

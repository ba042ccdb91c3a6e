"""The fused single-run step of :class:`~torchbandits.models.ExactKernelRidge` on the CPU: a
policy's ``select`` is one compiled call and its ``update`` another.

:mod:`~torchbandits.models.exact_native` scores with one call too, but around it a step builds the
table of every factor's addresses, allocates ``V`` ``[R, n, A]``, ``μ`` and ``colsum V²``,
records the scored set and the candidate caches, and the append reads them back: at the papers'
sizes (n ≈ 50, A = 100) these Python lines and the memory they touch cost more than the
arithmetic. Here the model keeps a :class:`FusedTable`: an int64 table of its addresses and sizes
(points, rewards, ``z``, the scaled points, every factor's head and tail, the kernel's parameters
and the copies its :class:`~torchbandits.kernels.KernelPlan` compares them with) and a float64
table of its scalars (output scale, ``k(x, x)``, the regularisers, a bound's ``β`` and divisors),
built once and updated by the C code itself (``n``, the rows of each tail) as it appends:

* :meth:`ExactFused.fused_select`: the argmax of a rule's closed-form bound
  (:class:`~torchbandits.confidence.base.UCBForm`, ``min_s (sqrt(ρ²_s / div_s) β_s + μ_s)``,
  Flynn & Reeb 2024, Eq. (14) for DMM) over fresh candidates, ``V`` kept only one factor at a
  time in scratch memory, nothing recorded but the candidates and the choice; pruned
  (``exact_prune.h``; the same choice and minimising term, bit for bit; :func:`full_select`
  turns it off): the candidates are solved in order of their prior bound, a few at a time, and a
  group is dropped as soon as the partial sums ``Σ_{i<j} l_i²`` of one term's forward
  substitution and an upper bound on its ``μ`` (from ``α = (K + aI)⁻¹y``, with a margin for
  rounding) put all its columns below the best bound found — one term from 160 points (80 with
  500 candidates or more), several from 160 points; with several terms (DMM) the others are
  solved only on the groups that survive (below 160 points, the first term solved on every
  candidate keys them); two selects in a row that pruned too little (their substitutions after
  the first group above 0.6 of the full select's) are followed by 16 full selects;
* :meth:`ExactFused.fused_append`: the append of the chosen candidate, its kernel column and new
  factor rows recomputed by the operations of the scoring (the same bits as the scoring's
  column ``V_r[:, j]``, ``μ_r[j]`` and ``colsum(V_r²)_j``: the O(n²) solve of one column costs
  less than writing and reading back ``V``), or, after a pruned select, read from the pieces
  it kept of the chosen candidate (the same bits: its column of each term's solve).

The table is checked at every call (no stale address after ``copy.deepcopy``, ``.to()``,
``load_state_dict``, a refresh, a removal, a torch-path append, a regrown buffer or a kernel
whose parameters changed): the model's data version and ``n``, the addresses of its point,
reward, ``z`` and scaled-point buffers and of the kernel's parameters, the parameters' bytes (in
C); a factor's buffers change only through the model (an append, which moves ``n``, or an
operation that moves the version). A copy or a pickle of the table is ``None``. Either call
returns ``None`` / ``False`` when the step does not qualify (no library, not float64 CPU
contiguous, no closed-form kernel, a term at a regulariser not maintained, more than
:data:`~torchbandits.native.exact.MAX_N` points, a candidate set equal to the previous one while
candidate caches are on: then the caches of the general path serve it), and the caller takes
the general step, which stays the reference.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..buffers import grow_rows, set_plain
from ..native import exact as nx
from ..validation import as_scalar_reward

if TYPE_CHECKING:
    from ..confidence.base import UCBForm

__all__ = ["ExactFused", "FusedTable", "full_select", "pruned_select", "pruning",
           "pruning_forced"]

_F64 = torch.float64
_HEAD = nx.PRUNE_HEAD   # the pruned select's cache: values before α's
_T = nx.FUSED
_FULL = [0]   # open full_select() scopes: the compiled selects prune when none is open
_PRUNED = [0]   # open pruned_select() scopes: the compiled selects prune wherever it applies


@contextlib.contextmanager
def full_select() -> Iterator[None]:
    """Within it, the compiled selects (the fused single-run one and the batched one) score every
    candidate in full instead of pruning (``exact_prune.h``: a one-term bound's rows, DMM's grid
    members): the same choices, minimising terms and append pieces, bit for bit; for tests and
    before/after benchmarks. Not thread-safe (a process-wide switch)."""
    _FULL[0] += 1
    try:
        yield
    finally:
        _FULL[0] -= 1


@contextlib.contextmanager
def pruned_select() -> Iterator[None]:
    """Within it, the compiled selects prune wherever the pruning applies (``exact_prune.h``: a
    one-term bound's rows at any number of points, not only from ``rows_min_n(A)``; no full
    selects after poor prunings): the same choices, bit for bit; for tests and benchmarks. Not
    thread-safe (a process-wide switch). :func:`full_select` wins where both are open."""
    _PRUNED[0] += 1
    try:
        yield
    finally:
        _PRUNED[0] -= 1


def pruning() -> bool:
    """Whether the compiled selects prune (no :func:`full_select` scope is open)."""
    return not _FULL[0]


def pruning_forced() -> bool:
    """Whether the compiled selects prune wherever the pruning applies (a :func:`pruned_select`
    scope is open, and no :func:`full_select` one)."""
    return bool(_PRUNED[0]) and not _FULL[0]


def _ok(t: Tensor) -> bool:
    return t.dtype is _F64 and t.is_cpu and t.is_contiguous()


def _dropped() -> None:
    """What a pickled :class:`FusedTable` loads as."""
    return None


class FusedTable:
    """The tables of :mod:`~torchbandits.models.exact_fused` (see its docstring) and what they
    were built from. ``tab`` / ``dbl`` are ctypes arrays (their addresses ``base`` / ``dbase``);
    ``terms``: the factor index per term of the last bound (keyed by its regularisers); ``hint``
    (``c_longlong * 2``): with several terms, the one the pruned select solves first (the
    minimiser at the last chosen candidate; it changes no choice) and whether ``pend`` (float64,
    ``[terms, n + 2]`` used) holds the chosen candidate's append pieces per term, both carried
    over to a rebuilt table, as is ``acache`` (float64 ``[PRUNE_HEAD + capacity]``,
    :data:`~torchbandits.native.exact.PRUNE_HEAD`): the length of the pruned select's last ``α``,
    the state of the poor-pruning rule (``exact_prune.h``), then ``α``'s values, from which the
    next pruned select guesses the candidates it solves first (any content gives the same
    choice)."""

    __slots__ = (
        "acache",
        "base",
        "beta_at",
        "chosen",
        "dbase",
        "dbl",
        "factors",
        "hint",
        "keep",
        "kernel",
        "lean",
        "n",
        "params",
        "pend",
        "prev",
        "ptrs",
        "regs_key",
        "tab",
        "terms",
        "version",
    )

    def __reduce__(self) -> tuple:  # a copy or a pickle is None (its tensors live elsewhere)
        return (_dropped, ())


class ExactFused:
    """The fused step, mixed into :class:`~torchbandits.models.ExactKernelRidge` (whose state it
    reads): see the module docstring."""

    _n: int
    _version: int
    _lean: list | None
    _fused: FusedTable | None = None
    cache_candidates: bool
    regularisers: tuple[float, ...]

    def _fused_current(self, ft: FusedTable, bufs: dict) -> bool:
        """Whether the table ``ft`` describes the model now (its data version, ``n``, scaled
        rows, kernel and the addresses of its buffers ``bufs`` and of the kernel's parameters;
        the kernel's values are checked in C)."""
        lean = self._lean
        return (ft.version == self._version and ft.n == self._n and lean is ft.lean
                and self._modules["kernel"] is ft.kernel  # type: ignore[attr-defined]
                and ft.ptrs == (bufs["_x"].data_ptr(), bufs["_y"].data_ptr(),
                                bufs["_z"].data_ptr(), lean[0].data_ptr())
                and all(p.data_ptr() == a for p, a in ft.params))

    def _fused_build(self) -> FusedTable | None:
        """A fresh table of the current state (``None`` if the step does not qualify)."""
        old = self._fused  # (its last candidates: a repeated set still goes to the caches)
        set_plain(self, "_fused", None)
        n = self._n
        plan = self.kernel_plan()  # type: ignore[attr-defined]
        form = plan.stationary
        kind = None if form is None else nx.KINDS.get((form.kind, form.nu))
        raw = plan.raw or []
        if kind is None or not _ok(form.weight) or len(raw) > _T["max_params"] \
                or not all(_ok(p) and _ok(v) for p, v in raw):
            return None
        scaled = self._scaled_rows(form, whole=True)  # type: ignore[attr-defined]  # rows :n valid
        bufs = self._buffers  # type: ignore[attr-defined]
        xs, ys, zs, lean = bufs["_x"], bufs["_y"], bufs["_z"], self._lean
        fs = tuple(self._modules["factors"])  # type: ignore[attr-defined]
        if lean is None or lean[0] is not scaled or not all(_ok(t) for t in (xs, ys, zs, scaled)):
            return None
        count, d = len(fs), xs.shape[1]
        tab = (ctypes.c_longlong * (_T["factor0"] + _T["factor_width"] * count + count + 8))()
        for key, value in (("n", n), ("d", d), ("factors", count), ("kind", kind),
                           ("has_scale", form.outputscale is not None), ("dw", form.weight.numel()),
                           ("cap", min(xs.shape[0], ys.shape[0], zs.shape[1], scaled.shape[0])),
                           ("block", min(f.block for f in fs)), ("scaled", scaled.data_ptr()),
                           ("weight", form.weight.data_ptr()), ("x", xs.data_ptr()),
                           ("y", ys.data_ptr()), ("z", zs.data_ptr()), ("zstride", zs.stride(0)),
                           ("params", len(raw))):
            tab[_T[key]] = int(value)
        for p, (par, copy) in enumerate(raw):
            at = _T["param0"] + 3 * p
            tab[at: at + 3] = [par.data_ptr(), copy.data_ptr(), par.numel() * 8]
        for r, f in enumerate(fs):
            head, tail = f.layout()
            if not (_ok(head) and _ok(tail)) or head.shape[0] + f.m != n \
                    or tail.shape[0] < f.block:
                return None
            at = _T["factor0"] + _T["factor_width"] * r
            tab[at: at + 5] = [head.data_ptr(), head.shape[0], tail.data_ptr(), tail.shape[1], f.m]
        dbl = (ctypes.c_double * (2 + 3 * count + 2 * (count + 8)))()
        dbl[0] = 1.0 if form.outputscale is None else form.outputscale
        dbl[1] = form.diag_value
        dbl[2: 2 + count] = list(self.regularisers)
        ft = FusedTable()
        ft.tab, ft.dbl, ft.base, ft.dbase = tab, dbl, ctypes.addressof(tab), ctypes.addressof(dbl)
        ft.version, ft.n, ft.kernel, ft.lean, ft.factors = self._version, n, plan.kernel, lean, fs
        ft.ptrs = (xs.data_ptr(), ys.data_ptr(), zs.data_ptr(), scaled.data_ptr())
        ft.params = [(p, p.data_ptr()) for p, _ in raw]
        ft.keep = (plan, form.weight)  # (the copies and weights the table points at stay alive)
        ft.regs_key, ft.terms, ft.chosen, ft.beta_at = None, 0, None, 2 + 3 * count
        ft.prev = None if old is None else old.prev
        ft.hint = (ctypes.c_longlong * 2)(-1, 0) if old is None else old.hint
        ft.pend = torch.empty(0, dtype=_F64) if old is None else old.pend
        ft.acache = torch.zeros(_HEAD, dtype=_F64) if old is None else old.acache
        set_plain(self, "_fused", ft)
        return ft

    def _fused_terms(self, ft: FusedTable, regs: tuple[float, ...]) -> bool:
        """Write the factor index of each term of a bound at ``regs`` into the table."""
        count = len(ft.factors)
        if not 0 < len(regs) <= count + 8:
            return False
        idxs = [self._factor_for(reg)[0] for reg in regs]  # type: ignore[attr-defined]
        if any(i is None for i in idxs):
            return False
        at = _T["factor0"] + _T["factor_width"] * count
        ft.tab[at: at + len(idxs)] = idxs
        ft.tab[_T["terms"]] = ft.terms = len(idxs)
        ft.regs_key = regs
        return True

    def fused_select(self, cand: Tensor, make_form: Callable[[], UCBForm | None]) -> int | None:
        """The index of the largest bound ``make_form()`` (called once the step qualifies, a
        rule's :meth:`~torchbandits.confidence.base.RadiusRule.ucb_form`) over ``cand`` ``[A, d]``
        (a float64 CPU contiguous tensor, not yet validated: a non-finite entry gives ``None``)
        in one call; ``form.done(None, minimising term at the chosen candidate [1] int64 or None)`` is called
        after it.
        ``None`` if the step does not qualify (see the module docstring)."""
        lib = nx.available()
        n = self._n
        if lib is None or not 0 < n <= nx.MAX_N or not _ok(cand) or cand.ndim != 2 \
                or cand.shape[0] == 0:
            return None
        ft, bufs = self._fused, self._buffers  # type: ignore[attr-defined]
        if ft is None or not self._fused_current(ft, bufs):
            ft = self._fused_build()
            if ft is None:
                return None
        prev = ft.prev if self.cache_candidates else None
        if cand.shape[1] != ft.tab[_T["d"]] or cand is prev:  # (a repeated set: caches serve it)
            return None
        form = make_form()
        if form is None or (form.regs != ft.regs_key and not self._fused_terms(ft, form.regs)):
            return None
        a = cand.shape[0]
        arg = torch.empty(a, dtype=torch.int64) if ft.terms > 1 else None
        for retry in (True, False):
            at, terms = ft.beta_at, ft.terms
            ft.dbl[at: at + 2 * terms] = form.betas + form.divisors
            ft.hint[1] = 0
            prune = not _FULL[0]
            if prune and ft.pend.numel() < terms * (n + 2):
                ft.pend = torch.empty(2 * terms * (n + 2), dtype=_F64)
            if prune and ft.acache.numel() < n + _HEAD:
                ft.acache = torch.cat([ft.acache, torch.zeros(2 * n, dtype=_F64)])  # (kept)
            if pruning_forced():
                ft.acache[1] = nx.PRUNE_FORCED
            best = lib.tb_exact_fused_select(ft.base, ft.dbase, cand.data_ptr(), a,
                                             None if prev is None else prev.data_ptr(),
                                             0 if prev is None else prev.shape[0],
                                             None if arg is None else arg.data_ptr(),
                                             ctypes.addressof(ft.hint) if prune else None,
                                             ft.pend.data_ptr() if prune else None,
                                             ft.acache.data_ptr() if prune else None,
                                             ft.acache.numel() - _HEAD)
            if best != -3 or not retry:
                break
            # the kernel's values changed since the table: a new plan and table, once
            ft = self._fused_build()  # type: ignore[assignment]
            if ft is None or not self._fused_terms(ft, form.regs):
                return None
        if best < 0:
            if best == -1:
                raise MemoryError("torchbandits.native.exact: scratch allocation failed")
            if best == -3:
                set_plain(self, "_fused", None)
            return None  # (-4: the last set's values, the caches serve it; -5: not finite)
        ft.prev, ft.chosen = cand, (cand, best)
        if form.done is not None:   # the minimising term at the chosen candidate
            form.done(None, None if arg is None else arg[best:best + 1])
        return best

    def fused_append(self, x: Tensor, reward: float | Tensor, column: tuple[Tensor, int]) -> bool:
        """Append ``(x, reward)``, ``x`` the candidate ``column = (candidates, j)`` that
        :meth:`fused_select` chose (the caller checked that ``x`` is that row), in one call, and
        do the model's bookkeeping. ``False`` (nothing changed, the reward not read) if the step
        does not qualify; ``ValueError`` (nothing changed) for a reward that is not a finite
        scalar (:func:`~torchbandits.validation.as_scalar_reward`) or a pivot not positive."""
        ft, lib = self._fused, nx.available()
        if ft is None or lib is None or ft.chosen is None or ft.chosen[0] is not column[0] \
                or ft.chosen[1] != column[1] or not _ok(x) or x.shape != (ft.tab[_T["d"]],):
            return False
        if not self._fused_current(ft, self._buffers):  # type: ignore[attr-defined]
            return False
        y = as_scalar_reward("reward", reward)
        ft.chosen = None
        n = self._n
        pend = ft.pend.data_ptr() if ft.hint[1] else None   # the pruned select's pieces of x
        ft.hint[1] = 0
        rc = lib.tb_exact_fused_append(ft.base, ft.dbase, x.data_ptr(), y, pend)
        if rc == -2:  # a full buffer or tail: room made as the general append makes it
            self.room_for(n)  # type: ignore[attr-defined]
            lean = self._lean
            if lean[0].shape[0] <= n:  # type: ignore[index]
                lean[0] = grow_rows(lean[0], n + 1)  # type: ignore[index]
            for f in ft.factors:
                f.open_row()
            ft = self._fused_build()  # type: ignore[assignment]
            if ft is None:
                return False
            rc = lib.tb_exact_fused_append(ft.base, ft.dbase, x.data_ptr(), y, pend)
        if rc < 0:
            if rc == -1:
                raise MemoryError("torchbandits.native.exact: scratch allocation failed")
            set_plain(self, "_fused", None)
            return False
        if rc:
            raise ValueError(f"append: pivot not positive at λ={self.regularisers[rc - 1]}")
        count = len(ft.factors)
        out = ft.dbl[2 + count: 2 + 3 * count]
        for r, f in enumerate(ft.factors):
            f.close_row()   # the row C wrote at the tail's open address
            self._advance(r, n, out[r], out[count + r])  # type: ignore[attr-defined]
        ft.n = n + 1
        ft.lean[1] = n + 1  # the scaled row written too
        self._appended(n)  # type: ignore[attr-defined]
        return True

"""Deferred per-run checks of a batched run: flags kept on the device, read every few rounds.

An eager check reads one flag back to the host (``float``/``bool`` of a reduction): fine for a
call from user code, a stall per check on a CUDA device. Inside :func:`deferred_checks` (entered
by :func:`~torchbandits.experiments.simulate_batch`) the checks of :mod:`torchbandits.batching`
and of the batched models file a per-run flag instead (:class:`DeferredChecks`); the runner
reads them all at once every ``sync_every`` rounds and at the end and raises
:class:`BatchCheckError` (a ``ValueError``) naming the check, the run, its seed and the round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

__all__ = ["BatchCheckError", "DeferredChecks", "active_checks", "check_runs", "deferred_checks",
           "to_device"]


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device``: a CPU → CUDA copy is non-blocking (no host synchronisation)."""
    return x.to(device, non_blocking=x.device.type == "cpu" and device.type == "cuda")


class BatchCheckError(ValueError):
    """A check of a batched run that failed on the device, reported when the runner synced."""


class DeferredChecks:
    """Per-run failure flags of a batched run, kept on the device until :meth:`raise_if_failed`.

    ``round`` is set by the runner before each round. :meth:`flag` only files the ``bad`` ``[R]``
    mask of this round (no device operation); every :attr:`FOLD` masks of a check, and at a read,
    they are folded at once into the first failing round of every run (a ``[R]`` int64 tensor per
    check, ``-1`` while clean) — on the device, no host read.

    ``inputs_checked`` (set by :func:`~torchbandits.experiments.simulate_batch`): the runner
    itself flags each round's candidates and rewards as they leave the environment, so the
    policy's own value checks of its candidates, points (rows of those candidates) and rewards
    are skipped — each value is checked once per round, under the same labels.
    """

    #: masks of one check filed before they are folded (one fold = a few device operations)
    FOLD = 64
    #: the most entries of a tensor that :meth:`flag_finite` files as is (``kept=True``)
    KEEP_MAX = 1 << 15

    def __init__(self) -> None:
        self.round = 0
        self.inputs_checked = False
        self._first: dict[str, Tensor] = {}
        #: per check: (round, mask ``[R]`` — or, ``kept``, the values ``[R, ...]`` —, kept)
        self._pending: dict[str, list[tuple[int, Tensor, bool]]] = {}

    def flag(self, check: str, bad: Tensor) -> None:
        """Record the runs where ``bad`` ``[R]`` holds, under the label ``check`` (a bool mask,
        or numbers that are nonzero — NaN included — exactly where a run fails)."""
        self._file(check, bad.reshape(-1), False)

    def _file(self, check: str, x: Tensor, kept: bool) -> None:
        runs = (x.shape[0] if x.ndim else 1) if kept else x.numel()
        known = self._first.get(check)
        pending = self._pending.get(check)
        size = known.numel() if known is not None else (
            _runs(pending[0]) if pending else runs)
        if size != runs:
            # a model of another run count under the same label (e.g. DMM's companion of R·G
            # runs at its regulariser grid, run r·G + g): its own entry
            check = f"{check} [{runs} runs]"
            pending = self._pending.get(check)
        if pending is None:
            pending = self._pending[check] = []
        pending.append((self.round, x, kept))
        if len(pending) >= self.FOLD:
            self._fold(check)

    def flag_finite(self, check: str, x: Tensor, *, kept: bool = False) -> None:
        """Flag the runs of ``x`` ``[R, ...]`` holding a NaN or ±inf: ``x·0`` is 0 where finite
        and NaN elsewhere (no overflow of large finite values), summed per run — two device
        operations; the comparison with 0 is made when the masks are folded. ``kept``: the
        caller does not write into ``x`` until the fold (the runner's fresh candidates and
        rewards), so ``x`` itself is filed — no device operation now — and the kept tensors of
        the check are stacked and reduced at once when folded (up to :attr:`KEEP_MAX` entries;
        a larger ``x`` is reduced now)."""
        if kept and x.numel() <= self.KEEP_MAX:
            self._file(check, x, True)
            return
        zero = x * 0
        self.flag(check, zero.sum(tuple(range(1, x.ndim))) if x.ndim > 1 else zero)

    def _fold(self, check: str) -> None:
        pending = self._pending.pop(check, None)
        if not pending:
            return
        kept = [x for _, x, k in pending if k]
        like = kept[0] if kept else None
        if like is not None and len(kept) == len(pending) and all(
                x.shape == like.shape and x.dtype == like.dtype and x.device == like.device
                for x in kept):
            bads = _finite_sums(torch.stack(kept)).reshape(len(kept), -1)      # [K, R]
        else:
            bads = torch.stack([_finite_sums(x[None]).reshape(-1) if k else x.reshape(-1)
                                for _, x, k in pending])
        if bads.dtype != torch.bool:
            bads = bads.ne(0)
        rounds = to_device(torch.tensor([t for t, _, _ in pending]), bads.device)
        hit = bads.any(0)
        at = rounds[bads.to(torch.uint8).argmax(0)]                         # first True per run
        first = self._first.get(check)
        if first is None:
            first = torch.full(hit.shape, -1, dtype=torch.long, device=bads.device)
        self._first[check] = torch.where(hit & (first < 0), at, first)

    def failures(self) -> list[tuple[str, int, int]]:
        """``(check, run, first round)`` of every failed run: one host read of all flags."""
        for check in list(self._pending):
            self._fold(check)
        if not self._first:
            return []
        names = list(self._first)
        home = self._first[names[0]].device   # flags of a CPU environment beside a CUDA policy
        flat = torch.cat([self._first[k].to(home) for k in names]).tolist()
        out, start = [], 0
        for k in names:
            size = self._first[k].numel()
            out.extend((k, r, t) for r, t in enumerate(flat[start:start + size]) if t >= 0)
            start += size
        return out

    def raise_if_failed(self, seeds: Sequence[int] | None = None) -> None:
        """Raise :class:`BatchCheckError` naming the first failure (check, run, seed, round)."""
        bad = self.failures()
        if bad:
            check, run, t = min(bad, key=lambda f: (f[2], f[1]))
            seed = f" (seed {seeds[run]})" if seeds is not None else ""
            raise BatchCheckError(f"{check}: failed in run {run}{seed} at round {t} "
                                  f"({len(bad)} failing (check, run) pairs in all)")


def _runs(entry: tuple[int, Tensor, bool]) -> int:
    """The run count of a filed entry (a mask ``[R]``, or kept values ``[R, ...]``)."""
    _, x, kept = entry
    return (x.shape[0] if x.ndim else 1) if kept else x.numel()


def _finite_sums(x: Tensor) -> Tensor:
    """``Σ x·0`` over the dimensions after the first two of ``x`` ``[K, R, ...]``: ``[K, R]``,
    0 where finite, NaN where a run holds a NaN or ±inf."""
    zero = x * 0
    return zero.sum(tuple(range(2, x.ndim))) if x.ndim > 2 else zero


_ACTIVE: ContextVar[DeferredChecks | None] = ContextVar("torchbandits_deferred_checks",
                                                        default=None)


def active_checks() -> DeferredChecks | None:
    """The :class:`DeferredChecks` of the enclosing :func:`deferred_checks`, else ``None``."""
    return _ACTIVE.get()


@contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Inside: the value checks of this module flag failures on the device instead of reading
    them to the host (the trusted path of a runner stepping library-made tensors)."""
    checks = DeferredChecks()
    token = _ACTIVE.set(checks)
    try:
        yield checks
    finally:
        _ACTIVE.reset(token)


def check_runs(check: str, bad: Tensor, message: Callable[[int], str]) -> None:
    """Runs where ``bad`` ``[R]`` holds fail ``check``: deferred inside :func:`deferred_checks`,
    else ``ValueError(message(first bad run))`` (one host read)."""
    checks = _ACTIVE.get()
    if checks is not None:
        checks.flag(check, bad)
    elif bool(bad.any()):
        raise ValueError(message(int(bad.reshape(-1).nonzero()[0, 0])))

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

    def __init__(self) -> None:
        self.round = 0
        self.inputs_checked = False
        self._first: dict[str, Tensor] = {}
        self._pending: dict[str, list[tuple[int, Tensor]]] = {}

    def flag(self, check: str, bad: Tensor) -> None:
        """Record the runs where ``bad`` ``[R]`` holds, under the label ``check`` (a bool mask,
        or numbers that are nonzero — NaN included — exactly where a run fails)."""
        bad = bad.reshape(-1)
        known = self._first.get(check)
        pending = self._pending.get(check)
        size = known.numel() if known is not None else (
            pending[0][1].numel() if pending else bad.numel())
        if size != bad.numel():
            # a model of another run count under the same label (e.g. DMM's companion of R·G
            # runs at its regulariser grid, run r·G + g): its own entry
            check = f"{check} [{bad.numel()} runs]"
            pending = self._pending.get(check)
        if pending is None:
            pending = self._pending[check] = []
        pending.append((self.round, bad))
        if len(pending) >= self.FOLD:
            self._fold(check)

    def flag_finite(self, check: str, x: Tensor) -> None:
        """Flag the runs of ``x`` ``[R, ...]`` holding a NaN or ±inf: ``x·0`` is 0 where finite
        and NaN elsewhere (no overflow of large finite values), summed per run — two device
        operations; the comparison with 0 is made when the masks are folded."""
        zero = x * 0
        self.flag(check, zero.sum(tuple(range(1, x.ndim))) if x.ndim > 1 else zero)

    def _fold(self, check: str) -> None:
        pending = self._pending.pop(check, None)
        if not pending:
            return
        bads = torch.stack([b for _, b in pending])                          # [K, R]
        if bads.dtype != torch.bool:
            bads = bads.ne(0)
        rounds = to_device(torch.tensor([t for t, _ in pending]), bads.device)
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

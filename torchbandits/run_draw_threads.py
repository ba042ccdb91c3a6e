"""Per-run host draws of a batch: the thread pool of :class:`~torchbandits.batching.RunStreams`
refills, a refill drawn now or ahead on a background thread (:func:`draw_chunk`,
:class:`ChunkAhead`), and :class:`RunDrawsAhead` (draws that a run makes in some rounds only).

A batch of ``R`` runs refills its streams with one ``torch.rand`` / ``randn`` / ``randint`` call
(or a few) per run and generator; PyTorch releases the GIL while an operator runs, so the runs
can be split into contiguous slices drawn by a few threads at once. Each generator is used by one
thread only, in the order of the sequential code, so every run draws the same numbers as without
threads. The pool is made on first use (never at import), shared by every stream, and changes no
global torch setting (``torch.set_num_threads`` stays as it is).

**Drawing ahead.** A refill blocks the round that needs it: at R = 1024 runs of 100 fresh arms in
d = 3 a chunk of 64 rounds is ~20 M uniforms, 1–2 ms of the host's time per round, during which a
GPU that the round feeds waits. With ``draw_ahead`` a stream hands its open chunk out while the
next one (same spec) is drawn by one background thread (:class:`ChunkAhead`, itself using the
pool), so on a host with spare cores the draws leave the round's critical path. The numbers are
the same: the generators are used by one thread at a time and in the same order, the next chunk
starts from the state the open one ends in, and a stream that must rewind (another spec, a state
save) first stops and waits for the chunk ahead, then rewinds from the open chunk's saved states
as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from .deferred_checks import to_device

__all__ = ["MIN_RUNS_FOR_THREADS", "NORMAL_SERIAL", "ChunkAhead", "RunDrawsAhead",
           "chunk_layout", "default_draw_ahead", "default_draw_threads", "draw_chunk", "draw_one",
           "run_sliced"]

#: a round's ``randn`` of at most this many elements takes the serial path (one Box–Muller
#: draw after another); 16 and more contiguous take a vectorised path whose order differs
NORMAL_SERIAL = 15

#: below this many runs a refill is drawn by the calling thread alone (``draw_threads=None``)
MIN_RUNS_FOR_THREADS = 256
#: nor when one generator call draws fewer elements: a short call (a noise refill draws at most
#: 15 normals a call) spends its time in Python under the GIL, and threads contend for it
MIN_ELEMENTS_FOR_THREADS = 4096
#: nor on a machine with fewer CPUs (on 2 busy cores two drawing threads only contend)
MIN_CPUS_FOR_THREADS = 4
#: the most threads ``draw_threads=None`` asks for
MAX_AUTO_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_ahead_pool: ThreadPoolExecutor | None = None   # the one thread that draws chunks ahead
_fork_hook = False   # whether _forget_pools_in_child is registered (on first use, not at import)


def _forget_pools_in_child() -> None:
    """In a child made by ``fork``: the parent's pools have no threads here (submitting to them
    would wait forever), so they are forgotten and made again on first use."""
    global _pool, _pool_size, _ahead_pool, _lock
    _pool, _pool_size, _ahead_pool, _lock = None, 0, None, threading.Lock()


def _new_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads; the first one also registers :func:`_forget_pools_in_child`
    (``os.register_at_fork``, where the platform has it). Called under ``_lock``."""
    global _fork_hook
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_pools_in_child)
        _fork_hook = True
    return ThreadPoolExecutor(workers, thread_name_prefix=prefix)
_lock = threading.Lock()


def _cpus() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def default_draw_threads(n_runs: int, elements_per_call: int) -> int:
    """Threads for a refill of ``n_runs`` runs whose generator calls draw ``elements_per_call``
    values each, when none is named: 1 below :data:`MIN_RUNS_FOR_THREADS` runs,
    :data:`MIN_ELEMENTS_FOR_THREADS` elements or :data:`MIN_CPUS_FOR_THREADS` CPUs, else half
    the CPUs this process may use (the rest for the round's own work), at most
    :data:`MAX_AUTO_THREADS`."""
    if n_runs < MIN_RUNS_FOR_THREADS or elements_per_call < MIN_ELEMENTS_FOR_THREADS:
        return 1
    cpus = _cpus()
    return 1 if cpus < MIN_CPUS_FOR_THREADS else min(cpus // 2, MAX_AUTO_THREADS)


def default_draw_ahead(elements_per_call: int, device: torch.device) -> bool:
    """Whether a stream draws its next chunk ahead when ``draw_ahead`` is not named: on a device
    other than the CPU (whose rounds the host only feeds), for generator calls of at least
    :data:`MIN_ELEMENTS_FOR_THREADS` values (a call of fewer spends its time in Python, under
    the GIL the round needs), with at least :data:`MIN_CPUS_FOR_THREADS` CPUs. On the CPU the
    background draws would take a core from the round's own arithmetic, so they are asked for
    explicitly there."""
    return (device.type != "cpu" and elements_per_call >= MIN_ELEMENTS_FOR_THREADS
            and _cpus() >= MIN_CPUS_FOR_THREADS)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            old = _pool
            _pool, _pool_size = _new_pool(workers, "run-draws"), workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def run_sliced(fn: Callable[[int, int], None], n: int, threads: int) -> None:
    """``fn(lo, hi)`` over contiguous slices covering ``range(n)``: all in this thread when
    ``threads <= 1`` (or ``n`` is 1), else one slice per thread, this thread drawing the first.
    Returns when every slice is done; the first error of a slice is raised."""
    threads = max(1, min(int(threads), n))
    if threads == 1:
        fn(0, n)
        return
    bounds = [n * i // threads for i in range(threads + 1)]
    pool = _executor(threads - 1)
    futures = [pool.submit(fn, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    try:
        fn(bounds[0], bounds[1])
    finally:
        errors = [f.exception() for f in futures]   # waits for every slice
    for err in errors:
        if err is not None:
            raise err


def _ahead_executor() -> ThreadPoolExecutor:
    global _ahead_pool
    with _lock:
        if _ahead_pool is None:
            _ahead_pool = _new_pool(1, "run-draws-ahead")
        return _ahead_pool


def draw_one(gen: torch.Generator, kind: str, n: int, dtype: torch.dtype, high: int,
             out: Tensor | None = None) -> Tensor:
    """``n`` draws of ``kind`` (``"uniform"``, ``"normal"``, ``"randint"`` below ``high``) from
    ``gen`` (into ``out`` ``[n]`` when given: the same numbers)."""
    if kind == "uniform":
        return torch.rand(n, generator=gen, dtype=dtype, out=out)
    if kind == "randint":
        return torch.randint(high, (n,), generator=gen, out=out)
    return torch.randn(n, generator=gen, dtype=dtype, out=out)   # serial: n <= 15 or strided out


def chunk_layout(kind: str, numel: int, chunk: int) -> tuple[int, int, bool]:
    """How a chunk of ``chunk`` rounds of ``numel`` draws is drawn: ``(rounds per generator
    call, calls per run, serial)``. Rounds of at most :data:`NORMAL_SERIAL` normals are drawn
    ``chunk`` at a time into a strided scratch (the serial path, as the per-round calls); a round
    of 16 normals or more is one contiguous call, as the sequential call."""
    serial = kind == "normal" and numel <= NORMAL_SERIAL
    per_call = chunk if kind != "normal" or serial else 1
    return per_call, chunk // per_call, serial


def draw_chunk(generators: Sequence[torch.Generator], spec: tuple[Any, ...], chunk: int, *,
               pin: bool, threads: int, stop: threading.Event | None = None,
               states: list[Tensor | None] | None = None) -> tuple[Tensor, list[Tensor | None]]:
    """The next ``chunk`` rounds of ``spec = (kind, numel, dtype, high)`` from every generator:
    ``(draws [R, chunk, numel], states)`` with ``states[r]`` run ``r``'s generator state before
    them (for a rewind). ``pin``: into page-locked memory (for a non-blocking copy to a GPU);
    ``threads``: :func:`run_sliced`; ``stop``: once set, the runs not yet drawn are skipped (the
    draws are then to be discarded); ``states``: the list ``[R]`` to write the states into (a
    run's entry is set before its first draw, so a stopped chunk's runs with ``None`` were not
    touched)."""
    kind, numel, dtype, high = spec
    per_call, calls, serial = chunk_layout(kind, numel, chunk)
    n, width = len(generators), per_call * numel
    host = torch.empty(n, chunk * numel, pin_memory=pin,
                       dtype=torch.int64 if kind == "randint" else dtype)
    # normals drawn into every other element of a scratch (non-contiguous: serial)
    into = torch.empty(n, chunk * numel, 2, dtype=dtype)[..., 0] if serial else host
    if states is None:
        states = [None] * n
    rows = into.view(n * calls, width).unbind(0)   # call c of run r: r·calls + c

    def fill(lo: int, hi: int) -> None:   # runs lo..hi-1, each generator in order
        for r in range(lo, hi):
            if stop is not None and stop.is_set():
                return
            g = generators[r]
            states[r] = g.get_state()
            for out in rows[r * calls:(r + 1) * calls]:
                draw_one(g, kind, width, dtype, high, out=out)

    run_sliced(fill, n, threads)
    if into is not host:
        host.copy_(into)
    return host.view(n, chunk, numel), states


class ChunkAhead:
    """The next chunk of a stream (:func:`draw_chunk`), being drawn by the background thread.

    The generators belong to it until :meth:`result` or :meth:`cancel` returns."""

    def __init__(self, generators: Sequence[torch.Generator], spec: tuple[Any, ...], chunk: int,
                 *, pin: bool, threads: int) -> None:
        self.spec = spec
        self._generators = list(generators)
        self._states: list[Tensor | None] = [None] * len(self._generators)
        self._stop = threading.Event()
        self._future = _ahead_executor().submit(draw_chunk, self._generators, spec, chunk,
                                                pin=pin, threads=threads, stop=self._stop,
                                                states=self._states)

    def result(self) -> tuple[Tensor, list[Tensor | None]]:
        """The chunk and the states before it (waits for it). A failed draw raises here, the
        generators set back to where the chunk began."""
        try:
            return self._future.result()
        except BaseException:
            self._restore()
            raise

    def cancel(self) -> None:
        """Stop drawing (at the next run), wait until the generators are free and set each back
        to where it stood when the chunk began (a run not reached was not touched). A draw that
        failed is dropped with the chunk."""
        self._stop.set()
        if not self._future.cancel():
            self._future.exception()   # waits; the chunk and any error are dropped
        self._restore()

    def _restore(self) -> None:
        for g, state in zip(self._generators, self._states, strict=True):
            if state is not None:
                g.set_state(state)


class RunDrawsAhead:
    """Per-run draws made ahead on the host and consumed on the device only where a run needs one.

    For draws that a sequential run makes in some rounds only (EK-UCB's KORS coins, a random
    tie-break): run ``r``'s ``j``-th value is its generator's ``j``-th draw, whatever the other
    runs do. The draws of every run are made ahead on the host, ``draw(g, k)`` giving the next
    ``k`` values of ``g`` (the same numbers, and the same generator state, as ``k`` single
    draws), kept as a device tensor ``[R, D]``, and handed out by a device counter ``[R]``
    (:meth:`take`): no host read in a round. A run uses at most one value per call, so ``D``
    only has to stay above the number of calls (a host count); it grows by doubling, at least
    ``block`` at a time. :meth:`sync` rewinds every generator to exactly the values used (one
    host read of the counters, outside the rounds) and drops the buffer.

    Args:
        generators: one ``torch.Generator`` per run (CPU), used from their current state; the
            caller does not draw from them until :meth:`sync`.
        draw: ``draw(generator, k)`` → the next ``k`` values ``[k]``.
        device: where the values and the counters live.
        block: the least number of values drawn per run at a refill (64).
    """

    def __init__(self, generators: Sequence[torch.Generator],
                 draw: Callable[[torch.Generator, int], Tensor], *,
                 device: torch.device | str | None = None, block: int = 64) -> None:
        self.generators = list(generators)
        if not self.generators:
            raise ValueError("generators must hold at least one generator")
        if int(block) < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._sample = draw
        self.block = int(block)
        self.device = torch.device("cpu" if device is None else device)
        self._start: list[Tensor] | None = None   # the generators' states at the first value
        self._buf: Tensor | None = None           # [R, D] on the device
        self._pos: Tensor | None = None           # [R] int64: r·D + values used by run r
        self._calls = 0                           # host: take() calls since the first value

    @property
    def n_runs(self) -> int:
        """Number of runs R."""
        return len(self.generators)

    def take(self, need: Tensor) -> Tensor:
        """Every run's next value ``[R]`` (on the device); it is consumed where ``need`` ``[R]``
        (bool) is set and handed out again at the next call elsewhere. No host read."""
        if self._buf is None or self._calls >= self._buf.shape[1]:
            if self._start is None:
                self._start = [g.get_state() for g in self.generators]
            have = 0 if self._buf is None else self._buf.shape[1]
            fresh = to_device(torch.stack([self._sample(g, max(self.block, have))
                                           for g in self.generators]), self.device)
            used = self._used()
            self._buf = fresh if self._buf is None else torch.cat([self._buf, fresh], dim=1)
            self._pos = used + self._rows() * self._buf.shape[1]
        assert self._pos is not None
        self._calls += 1
        out = self._buf.take(self._pos)   # run r's value at its own count: one operator
        self._pos = self._pos + need.to(self._pos.device)
        return out

    def _rows(self) -> Tensor:
        return torch.arange(self.n_runs, dtype=torch.int64, device=self.device)

    def _used(self) -> Tensor:
        """Values used per run ``[R]`` (int64, on the device)."""
        if self._pos is None or self._buf is None:
            return torch.zeros(self.n_runs, dtype=torch.int64, device=self.device)
        return self._pos - self._rows().to(self._pos.device) * self._buf.shape[1]

    def move_to(self, device: torch.device | str) -> None:
        """Hand out the values on ``device`` from now on (their dtype kept)."""
        self.device = torch.device(device)
        if self._buf is not None and self._pos is not None:
            self._buf, self._pos = self._buf.to(self.device), self._pos.to(self.device)

    def sync(self) -> list[torch.Generator]:
        """The generators rewound to exactly the values used (one host read of the counters),
        the buffer dropped: for a state save or a draw of another kind."""
        if self._start is not None and self._pos is not None:
            for g, state, used in zip(self.generators, self._start, self._used().tolist(),
                                      strict=True):
                g.set_state(state)
                if used:
                    self._sample(g, int(used))
        self._start, self._buf, self._pos, self._calls = None, None, None, 0
        return self.generators

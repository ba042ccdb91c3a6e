"""A small thread pool for the per-run generator draws of :class:`~torchbandits.batching.RunStreams`.

A batch of ``R`` runs refills its streams with one ``torch.rand`` / ``randn`` / ``randint`` call
(or a few) per run and generator; PyTorch releases the GIL while an operator runs, so the runs
can be split into contiguous slices drawn by a few threads at once. Each generator is used by one
thread only, in the order of the sequential code, so every run draws the same numbers as without
threads. The pool is made on first use (never at import), shared by every stream, and changes no
global torch setting (``torch.set_num_threads`` stays as it is).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["MIN_RUNS_FOR_THREADS", "default_draw_threads", "run_sliced"]

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
_lock = threading.Lock()


def default_draw_threads(n_runs: int, elements_per_call: int) -> int:
    """Threads for a refill of ``n_runs`` runs whose generator calls draw ``elements_per_call``
    values each, when none is named: 1 below :data:`MIN_RUNS_FOR_THREADS` runs,
    :data:`MIN_ELEMENTS_FOR_THREADS` elements or :data:`MIN_CPUS_FOR_THREADS` CPUs, else half
    the CPUs this process may use (the rest for the round's own work), at most
    :data:`MAX_AUTO_THREADS`."""
    if n_runs < MIN_RUNS_FOR_THREADS or elements_per_call < MIN_ELEMENTS_FOR_THREADS:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = os.cpu_count() or 1
    return 1 if cpus < MIN_CPUS_FOR_THREADS else min(cpus // 2, MAX_AUTO_THREADS)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            old = _pool
            _pool, _pool_size = ThreadPoolExecutor(workers, thread_name_prefix="run-draws"), workers
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

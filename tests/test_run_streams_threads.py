"""RunStreams with draw threads: every run draws bit for bit what it draws without threads, and
``sync()`` / ``states()`` rewind exactly; the pool is made on first use only."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from torchbandits import run_draw_threads
from torchbandits.batching import RunStreams
from torchbandits.run_draw_threads import (
    MAX_AUTO_THREADS,
    MIN_ELEMENTS_FOR_THREADS,
    MIN_RUNS_FOR_THREADS,
    default_draw_threads,
    run_sliced,
)

SEEDS = [0, 5, 17, 2, 9, 31, 4]   # 7 runs: slices of unequal length for 2 and 3 threads
PLAN = ([("u", (4, 3))] * 30 + [("n", ())] * 40 + [("n", (5,))] * 9 + [("n", (20,))] * 3
        + [("i", 10)] * 25 + [("i", 7)] * 5 + [("u", (4, 3))] * 3 + [("n", ())] * 20)


def _play(streams: RunStreams, plan) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    out = []
    for kind, arg in plan:
        if kind == "u":
            out.append(streams.uniform(*arg))
        elif kind == "n":
            out.append(streams.normal(*arg))
        else:
            out.append(streams.randint(arg))
    return out


@pytest.mark.parametrize("threads", [2, 3, 7])
@pytest.mark.parametrize("chunk", [7, 64])
def test_threads_draw_the_same_numbers_and_rewind_exactly(threads: int, chunk: int) -> None:
    alone = RunStreams.from_seeds(SEEDS, chunk=chunk, draw_threads=1)
    pooled = RunStreams.from_seeds(SEEDS, chunk=chunk, draw_threads=threads)
    for a, b in zip(_play(alone, PLAN), _play(pooled, PLAN), strict=True):
        assert torch.equal(a, b)
    # mid-chunk: the saved states are the states without threads, and a batch restored from
    # them continues with the same draws
    saved_a, saved_b = alone.states(), pooled.states()
    for a, b in zip(saved_a, saved_b, strict=True):
        assert torch.equal(a, b)
    more = [("u", (4, 3))] * 11 + [("n", ())] * 17
    again = RunStreams.from_states(saved_b, chunk=chunk, draw_threads=threads)
    for a, b in zip(_play(alone, more), _play(again, more), strict=True):
        assert torch.equal(a, b)
    # sync hands generators standing exactly where the sequential ones stand
    for g, seed in zip(pooled.sync(), SEEDS, strict=True):
        assert torch.equal(g.get_state(), sequential_state(seed, PLAN))


def sequential_state(seed: int, plan) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The state of a generator seeded ``seed`` after the per-round calls of ``plan``."""
    ref = torch.Generator().manual_seed(seed)
    for kind, arg in plan:
        if kind == "u":
            torch.rand(arg, generator=ref, dtype=torch.float64)
        elif kind == "n":
            torch.randn(arg, generator=ref, dtype=torch.float64)
        else:
            torch.randint(arg, (), generator=ref)
    return ref.get_state()


def _cpus(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(run_draw_threads.os, "sched_getaffinity", lambda pid: set(range(n)),
                        raising=False)


def test_the_default_threads_only_large_batches_of_large_draws(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _cpus(monkeypatch, 16)
    assert default_draw_threads(MIN_RUNS_FOR_THREADS - 1, 10**6) == 1
    assert default_draw_threads(10**4, MIN_ELEMENTS_FOR_THREADS - 1) == 1   # noise refills
    assert default_draw_threads(MIN_RUNS_FOR_THREADS, MIN_ELEMENTS_FOR_THREADS) == 8
    assert default_draw_threads(10**4, 10**6) == MAX_AUTO_THREADS
    _cpus(monkeypatch, 6)
    assert default_draw_threads(10**4, 10**6) == 3
    _cpus(monkeypatch, 2)
    assert default_draw_threads(10**4, 10**6) == 1
    with pytest.raises(ValueError, match="draw_threads"):
        RunStreams.from_seeds([1, 2], draw_threads=0)


def test_an_auto_threaded_refill_equals_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpus(monkeypatch, 16)
    seeds = list(range(MIN_RUNS_FOR_THREADS))
    auto, one = RunStreams.from_seeds(seeds), RunStreams.from_seeds(seeds, draw_threads=1)
    for _ in range(70):   # 64 rounds of 8 × 8 = 4,096 values a call, then a second refill
        assert torch.equal(auto.uniform(8, 8), one.uniform(8, 8))


def test_a_failing_slice_raises_after_every_slice_ran() -> None:
    done = []

    def fn(lo: int, hi: int) -> None:
        done.append((lo, hi))
        if lo == 2:
            raise RuntimeError("slice 2")

    with pytest.raises(RuntimeError, match="slice 2"):
        run_sliced(fn, 6, 3)
    assert sorted(done) == [(0, 2), (2, 4), (4, 6)]


def test_no_pool_at_import() -> None:
    code = ("import threading, torchbandits, torchbandits.batching as b, "
            "torchbandits.run_draw_threads as t; "
            "b.RunStreams.from_seeds(range(300), draw_threads=1).uniform(3); "
            "print(t._pool is None, threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "1"]

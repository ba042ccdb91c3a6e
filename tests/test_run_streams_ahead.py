"""RunStreams drawing ahead: the next chunk drawn on a background thread gives every run the numbers
it draws without drawing ahead, through spec changes, state saves, copies and cancels; the
generators are free and where they would be whenever the stream hands them out."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from torchbandits import run_draw_threads
from torchbandits.batching import RunStreams
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.run_draw_threads import (
    MIN_ELEMENTS_FOR_THREADS,
    default_draw_ahead,
)

from .test_run_streams_threads import PLAN, SEEDS, _play, sequential_state


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunk", [7, 64])
def test_drawing_ahead_draws_the_same_numbers_and_rewinds_exactly(threads: int, chunk: int
                                                                   ) -> None:
    plain = RunStreams.from_seeds(SEEDS, chunk=chunk, draw_threads=threads, draw_ahead=False)
    ahead = RunStreams.from_seeds(SEEDS, chunk=chunk, draw_threads=threads, draw_ahead=True)
    for a, b in zip(_play(plain, PLAN), _play(ahead, PLAN), strict=True):
        assert torch.equal(a, b)
    assert ahead.drawing_ahead and not plain.drawing_ahead
    # a state save mid-chunk stops the chunk ahead and rewinds to the draws handed out
    saved_a, saved_b = plain.states(), ahead.states()
    assert not ahead.drawing_ahead
    for a, b in zip(saved_a, saved_b, strict=True):
        assert torch.equal(a, b)
    more = [("u", (4, 3))] * 11 + [("n", ())] * 17
    again = RunStreams.from_states(saved_b, chunk=chunk, draw_threads=threads, draw_ahead=True)
    for a, b in zip(_play(plain, more), _play(again, more), strict=True):
        assert torch.equal(a, b)
    for g, seed in zip(ahead.sync(), SEEDS, strict=True):
        assert torch.equal(g.get_state(), sequential_state(seed, PLAN))


def test_cancel_leaves_the_generators_at_the_end_of_the_open_chunk() -> None:
    plain = RunStreams.from_seeds(SEEDS, chunk=16, draw_ahead=False)
    ahead = RunStreams.from_seeds(SEEDS, chunk=16, draw_ahead=True)
    for _ in range(20):   # the second chunk is open, the third drawn ahead
        assert torch.equal(plain.uniform(5), ahead.uniform(5))
    assert ahead.drawing_ahead
    ahead.cancel_ahead()
    assert not ahead.drawing_ahead
    for a, b in zip(plain.generators, ahead.generators, strict=True):
        assert torch.equal(a.get_state(), b.get_state())   # both after 32 rounds drawn
    for _ in range(30):   # the open chunk, then a refill drawn now
        assert torch.equal(plain.uniform(5), ahead.uniform(5))


def test_the_chunk_ahead_is_drawn_by_the_background_thread(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    names: list[str] = []
    real = run_draw_threads.draw_one

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_draw_threads, "draw_one", spy)
    streams = RunStreams.from_seeds([1, 2], chunk=4, draw_threads=1, draw_ahead=True)
    for _ in range(9):   # chunks 1, 2 and 3 handed out; 4 drawn ahead
        streams.uniform(3)
    streams.cancel_ahead()
    main = threading.current_thread().name
    assert names.count(main) == 2                       # the first chunk, one call per run
    assert sum(n.startswith("run-draws-ahead") for n in names) >= 4   # chunks 2, 3 (4 may be
    # cancelled before it starts)


def test_a_failed_draw_ahead_raises_where_the_chunk_is_needed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = run_draw_threads.draw_one
    fail = [True]

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        if fail[0] and threading.current_thread().name.startswith("run-draws-ahead"):
            raise RuntimeError("draw failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_draw_threads, "draw_one", flaky)
    plain = RunStreams.from_seeds([1, 2], chunk=4, draw_threads=1, draw_ahead=False)
    streams = RunStreams.from_seeds([1, 2], chunk=4, draw_threads=1, draw_ahead=True)
    for _ in range(4):   # the first chunk drawn here; the second fails ahead, unseen so far
        assert torch.equal(streams.uniform(3), plain.uniform(3))
    with pytest.raises(RuntimeError, match="draw failed"):
        streams.uniform(3)
    fail[0] = False      # the generators were set back: the next call draws what it should
    for _ in range(10):
        assert torch.equal(streams.uniform(3), plain.uniform(3))


def test_a_copy_with_a_chunk_ahead_draws_alike() -> None:
    streams = RunStreams.from_seeds(SEEDS, chunk=8, draw_ahead=True)
    for _ in range(5):
        streams.normal(2)
    twin = copy.deepcopy(streams)
    for _ in range(30):
        assert torch.equal(streams.normal(2), twin.normal(2))


def test_drawing_ahead_by_default_only_off_the_cpu_for_large_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_draw_threads.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert default_draw_ahead(MIN_ELEMENTS_FOR_THREADS, cuda)
    assert not default_draw_ahead(MIN_ELEMENTS_FOR_THREADS, cpu)
    assert not default_draw_ahead(MIN_ELEMENTS_FOR_THREADS - 1, cuda)   # noise refills
    monkeypatch.setattr(run_draw_threads.os, "sched_getaffinity", lambda pid: {0, 1},
                        raising=False)
    assert not default_draw_ahead(10**6, cuda)
    with pytest.raises(ValueError, match="draw_ahead"):
        RunStreams.from_seeds([1], draw_ahead="yes")  # type: ignore[arg-type]


def test_a_batch_drawing_ahead_is_the_batch_without() -> None:
    env = make_env("rkhs")
    seeds = [3, 1, 4]
    ahead = BatchedEnv(env, seeds, chunk=16, draw_ahead=True)
    plain = BatchedEnv(env, seeds, chunk=16, draw_ahead=False)
    for t in range(70):
        assert torch.equal(ahead.candidates(), plain.candidates())
        idx = torch.tensor([t % 100, (3 * t) % 100, 7])
        for a, b in zip(ahead.pull(idx), plain.pull(idx), strict=True):
            assert torch.equal(a, b)
    ahead.close()
    assert not any(s.drawing_ahead for s in ahead.streams.values())
    policy = make_policy("igp-ucb", env)
    on = simulate_batch(policy, env, 40, seeds, chunk=8, draw_ahead=True)
    off = simulate_batch(policy, env, 40, seeds, chunk=8, draw_ahead=False)
    for a, b in zip(on, off, strict=True):
        assert a.actions == b.actions and a.rewards == b.rewards


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_draws_ahead_with_pools_of_its_own() -> None:
    """After the parent has used its pools, a child made by ``fork`` (where the parent's threads do
    not exist) still draws ahead and with threads, the same numbers, instead of waiting forever."""
    import os

    parent = RunStreams.from_seeds(SEEDS, chunk=4, draw_threads=2, draw_ahead=True)
    want = [parent.uniform(3) for _ in range(9)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: exit status 0 only if it drew the same numbers
        ok = False
        try:
            child = RunStreams.from_seeds(SEEDS, chunk=4, draw_threads=2, draw_ahead=True)
            ok = all(torch.equal(child.uniform(3), w) for w in want)
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    import select
    import signal

    ready, _, _ = select.select([read], [], [], 60.0)
    got = os.read(read, 1) if ready else b"timeout"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert got == b"1"

"""RunStreams: run r of a batch draws exactly what a sequential generator seeded r draws."""

from __future__ import annotations

import pytest
import torch

from torchbandits.batching import (
    RunStreams,
    check_batch_index,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
    check_seeds,
)

SEEDS = [0, 5, 17]
F64 = torch.float64
CPU = torch.device("cpu")


def _seq(seed: int, calls):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    return [c(g) for c in calls]


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_mixed_draws_match_sequential_generators(chunk: int) -> None:
    """Uniform arm sets, scalar and small normals, a big normal, randint with a changing range:
    every run's draws equal the sequential calls, whatever the chunk."""
    plan = ([("u", (4, 3))] * 30 + [("n", ())] * 40 + [("n", (5,))] * 9 + [("n", (20,))] * 3
            + [("i", 10)] * 25 + [("i", 7)] * 5 + [("u", (4, 3))] * 3 + [("n", ())] * 20)
    streams = RunStreams.from_seeds(SEEDS, chunk=chunk)
    got = []
    for kind, arg in plan:
        if kind == "u":
            got.append(streams.uniform(*arg))
        elif kind == "n":
            got.append(streams.normal(*arg))
        else:
            got.append(streams.randint(arg))
    calls = []
    for kind, arg in plan:
        if kind == "u":
            calls.append(lambda g, a=arg: torch.rand(a, generator=g, dtype=F64))
        elif kind == "n":
            calls.append(lambda g, a=arg: torch.randn(a, generator=g, dtype=F64))
        else:
            calls.append(lambda g, a=arg: torch.randint(a, (), generator=g))
    for r, seed in enumerate(SEEDS):
        want = _seq(seed, calls)
        for step, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a[r], b), (r, step)
    # after sync the generators stand exactly where the sequential ones do
    gens = streams.sync()
    for r, seed in enumerate(SEEDS):
        g = torch.Generator().manual_seed(seed)
        for c in calls:
            c(g)
        assert torch.equal(torch.rand(5, generator=gens[r], dtype=F64),
                           torch.rand(5, generator=g, dtype=F64))


def test_runs_do_not_depend_on_their_neighbours() -> None:
    alone = RunStreams.from_seeds([5], chunk=16)
    crowd = RunStreams.from_seeds([3, 5, 9, 11], chunk=16)
    for _ in range(50):
        assert torch.equal(alone.normal()[0], crowd.normal()[1])
        assert torch.equal(alone.uniform(3)[0], crowd.uniform(3)[1])


def test_seed_and_chunk_checks() -> None:
    with pytest.raises(ValueError, match="seeds"):
        check_seeds([])
    with pytest.raises(ValueError, match="seeds"):
        check_seeds("ab")
    with pytest.raises(ValueError, match="chunk"):
        RunStreams.from_seeds([0], chunk=0)
    assert check_seeds(torch.tensor([1, 2])) == [1, 2]


def test_batched_input_checks_name_the_argument() -> None:
    c = torch.rand(3, 4, 2, dtype=F64)
    assert check_batched_candidates("candidates", c, 3, dtype=F64, device=CPU).shape == (3, 4, 2)
    with pytest.raises(ValueError, match="candidates has leading dimension 2"):
        check_batched_candidates("candidates", c[:2], 3, dtype=F64, device=CPU)
    with pytest.raises(ValueError, match=r"candidates must be \[R, A, d\]"):
        check_batched_candidates("candidates", c[0], 3, dtype=F64, device=CPU)
    bad = c.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="candidates must be finite"):
        check_batched_candidates("candidates", bad, 3, dtype=F64, device=CPU)
    with pytest.raises(ValueError, match="x must be"):
        check_batch_points("x", c[:, 0, :1].T, 3, dtype=F64, device=CPU)
    with pytest.raises(ValueError, match="x must have d = 2"):
        check_batch_points("x", c[:, 0, :1], 3, dtype=F64, device=CPU, dim=2)
    with pytest.raises(ValueError, match=r"reward must be \[R\] with R = 3"):
        check_batch_rewards("reward", torch.zeros(3, 1), 3, dtype=F64, device=CPU)
    with pytest.raises(ValueError, match="reward must be finite: run 1 has nan"):
        check_batch_rewards("reward", torch.tensor([0.0, float("nan"), 1.0]), 3, dtype=F64,
                            device=CPU)
    with pytest.raises(ValueError, match="index must lie in"):
        check_batch_index("index", torch.tensor([0, 4, 1]), 3, 4, CPU)
    with pytest.raises(ValueError, match="index must be integers"):
        check_batch_index("index", torch.tensor([0.0, 1.0, 1.0]), 3, 4, CPU)
    assert check_batch_index("index", [0, 3, 1], 3, 4, CPU).tolist() == [0, 3, 1]


def test_draws_ahead_hand_out_each_runs_sequential_stream_where_needed() -> None:
    """Run r's values are its generator's draws in order, consumed only where ``need`` is set
    (across refills of 3 and their doubling); ``sync`` leaves each generator where the
    sequential draws would; bad arguments are refused."""
    from torchbandits.batching import RunDrawsAhead

    def draw(g: torch.Generator, k: int) -> torch.Tensor:
        return torch.rand(k, generator=g, dtype=torch.float64)

    seeds = [4, 9, 2]
    ahead = RunDrawsAhead([torch.Generator().manual_seed(s) for s in seeds], draw, block=3)
    seq = [torch.Generator().manual_seed(s) for s in seeds]
    pattern = torch.Generator().manual_seed(0)
    for _ in range(20):
        need = torch.rand(3, generator=pattern) < 0.6
        got = ahead.take(need)
        for r in range(3):
            if need[r]:
                assert float(got[r]) == float(draw(seq[r], 1)[0])
    for g, s in zip(ahead.sync(), seq, strict=True):
        assert torch.equal(g.get_state(), s.get_state())
    with pytest.raises(ValueError, match="block"):
        RunDrawsAhead(seq, draw, block=0)
    with pytest.raises(ValueError, match="generators"):
        RunDrawsAhead([], draw)

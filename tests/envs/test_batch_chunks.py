"""Per-chunk work of the batched environments (``RunStreams.mapped``): a round's candidates,
means, best means and noise made once per chunk are, to the bit, what the round alone makes."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from torchbandits.batching import RunStreams
from torchbandits.envs import BumpEnv, ChessboardEnv, RKHSFunctionEnv, StepDiagonalEnv
from torchbandits.envs.batched import BatchedEnv

SEEDS = [0, 3, 7, 11, 20]


def _double(block: Tensor) -> tuple[Tensor, Tensor]:
    """``2x`` and the sum over a round's shape of a chunk ``[K, R, *shape]``."""
    return block * 2.0, block.sum(tuple(range(2, block.ndim))) if block.ndim > 2 else block


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_mapped_hands_out_fn_of_each_rounds_draws_and_consumes_alike(chunk: int) -> None:
    """Mapped uniform and normal rounds, interleaved with plain draws: every value is ``fn`` of
    the draws a plain stream hands out, and the generators end in the same states."""
    plain = RunStreams.from_seeds(SEEDS, chunk=chunk)
    mapped = RunStreams.from_seeds(SEEDS, chunk=chunk)
    plan = [("uniform", (3,))] * 20 + [("normal", ())] * 33 + [("uniform", (3,))] * 5
    for k, (kind, shape) in enumerate(plan):
        want = getattr(plain, kind)(*shape)
        twice, total = mapped.mapped(_double, ("double",), kind, *shape)
        assert torch.equal(twice, want * 2.0) and twice.is_contiguous(), (k, kind)
        assert torch.equal(total, want.sum(-1) if shape else want), (k, kind)
        if k % 9 == 0:   # a plain draw of another spec in between
            assert torch.equal(plain.randint(5, 2), mapped.randint(5, 2))
    for a, b in zip(plain.states(), mapped.states(), strict=True):
        assert torch.equal(a, b)


def test_mapped_recomputes_for_a_new_key_and_refuses_an_unknown_kind() -> None:
    streams = RunStreams.from_seeds(SEEDS, chunk=8)
    calls = []

    def fn(block: Tensor) -> tuple[Tensor]:
        calls.append(block.shape[0])
        return (block + 1.0,)

    for _ in range(3):
        streams.mapped(fn, 1, "uniform")
    assert calls == [8]                       # once per chunk
    streams.mapped(fn, 2, "uniform")          # another key: mapped again
    assert len(calls) == 2
    with pytest.raises(ValueError, match="kind"):
        streams.mapped(fn, 1, "gamma")


class _MatmulChessboard(ChessboardEnv):
    """``f`` overridden below the class declaring ``f_rowwise``: computed round by round."""

    def f(self, contexts: Tensor, actions: Tensor) -> Tensor:
        seen.append(contexts.shape[0])
        return super().f(contexts, actions)


seen: list[int] = []


def _play(env, chunk: int, picks: list[Tensor]) -> list[tuple[Tensor, ...]]:  # type: ignore[no-untyped-def]
    batch = BatchedEnv(env, SEEDS, chunk=chunk)
    record = []
    for idx in picks:
        cand, means = batch.candidates(), batch.mean_rewards()
        reward, regret = batch.pull(idx)
        record.append((cand, means, reward, regret))
    return record


@pytest.mark.parametrize("make", [ChessboardEnv, StepDiagonalEnv, BumpEnv, _MatmulChessboard,
                                  lambda: RKHSFunctionEnv(dim=2, n_arms=12)])
def test_chunked_rounds_equal_round_by_round_to_the_bit(make) -> None:  # type: ignore[no-untyped-def]
    """150 rounds over chunks of 7 and of 64 equal the rounds made one at a time (chunks of 1)
    to the bit: candidates, means, rewards, regrets (Bump's matrix product and a subclass's
    own ``f`` are evaluated per round, as a round alone does)."""
    env = make()
    gen = torch.Generator().manual_seed(2)
    n_arms = BatchedEnv(env, SEEDS).candidates().shape[1]
    picks = [torch.randint(n_arms, (len(SEEDS),), generator=gen) for _ in range(150)]
    seen.clear()
    alone = _play(env, 1, picks)
    for chunk in (7, 64):
        seen.clear()
        got = _play(env, chunk, picks)
        if isinstance(env, _MatmulChessboard):
            assert seen and set(seen) == {len(SEEDS)}   # never a whole chunk at once
        for t, (a, b) in enumerate(zip(alone, got, strict=True)):
            for x, y in zip(a, b, strict=True):
                assert torch.equal(x, y), (chunk, t)


@pytest.mark.parametrize("make", [ChessboardEnv, StepDiagonalEnv])
def test_chunked_lookup_rounds_equal_the_sequential_rounds_to_the_bit(make) -> None:  # type: ignore[no-untyped-def]
    """Chessboard and Step Diagonal (row-wise ``f``, one call per chunk): run r's rounds are the
    sequential environment's with seed r exactly."""
    env = make()
    gen = torch.Generator().manual_seed(3)
    picks = [torch.randint(env.n_actions, (len(SEEDS),), generator=gen) for _ in range(150)]
    record = _play(env, 64, picks)
    for r, seed in enumerate(SEEDS):
        env.reset(seed)
        rows = []
        for idx in picks:
            cand, means = env.candidates(), env.mean_rewards()
            regret = means.max() - means[int(idx[r])]
            rows.append((cand, means, torch.tensor(env.pull(int(idx[r])), dtype=torch.float64),
                         regret))
        for part in range(4):
            seq = torch.stack([row[part] for row in rows])
            batched = torch.stack([rec[part][r] for rec in record])
            assert torch.equal(seq.to(batched.dtype), batched), (seed, part)


def test_a_fresh_batch_round_is_declared_by_its_class_only() -> None:
    """``BatchedEnv.fresh``: the contextual and RKHS rounds declare it; a ``batch_round`` set on
    the instance (a wrapper that might write) does not inherit it."""
    assert BatchedEnv(ChessboardEnv(), SEEDS).fresh
    assert BatchedEnv(RKHSFunctionEnv(dim=2, n_arms=5), SEEDS).fresh
    env = ChessboardEnv()
    env.batch_round = env.batch_round   # type: ignore[method-assign]
    assert not BatchedEnv(env, SEEDS).fresh


def test_rkhs_means_of_a_chunk_in_blocks_of_rounds_equal_round_by_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh RKHS arms: a chunk's means made in blocks of 3 rounds (a budget of 3 rounds'
    kernel entries) and in one block equal the rounds made one at a time, to the bit."""
    from torchbandits.envs import rkhs

    env = RKHSFunctionEnv(dim=2, n_arms=12)
    m = env.inducing.shape[0]
    gen = torch.Generator().manual_seed(4)
    picks = [torch.randint(12, (len(SEEDS),), generator=gen) for _ in range(40)]
    alone = _play(env, 1, picks)
    for budget in (3 * len(SEEDS) * 12 * m + 1, 1 << 30):
        monkeypatch.setattr(rkhs, "MEANS_BLOCK_CPU", budget)
        got = _play(env, 16, picks)
        for t, (a, b) in enumerate(zip(alone, got, strict=True)):
            for x, y in zip(a, b, strict=True):
                assert torch.equal(x, y), (budget, t)

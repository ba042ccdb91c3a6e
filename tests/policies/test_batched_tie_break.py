"""The batched random tie-break takes exactly the sequential draws.

``draw_outputs`` against sequential ``torch.randint(m, (1,))`` calls of many ranges ``m`` (the
same numbers and the same generator state after); :class:`RunTieDraws` against the sequential
loop of :class:`~torchbandits.policies.time_varying.TimeVaryingUCB` over rounds where some runs
tie and others do not, with one run tying in every round (the buffer grows past its first
chunks), its ``sync`` leaving every generator where the sequential run's is; and the whole
policy under a ``state_dict`` save in the middle of open draws.
"""

from __future__ import annotations

import copy

import torch

from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.policies.batched_tie_break import RANGE_32, RunTieDraws, draw_outputs, tie_index


def test_outputs_are_the_sequential_randint_draws() -> None:
    ranges = [2, 3, 5, 7, 10, 64, 100, 1000, 65537, 2**20 + 3, RANGE_32 - 1] * 40
    for seed in (0, 1, 12345, 2**40 + 7):
        gen = torch.Generator().manual_seed(seed)
        u = torch.cat([draw_outputs(gen, 100), draw_outputs(gen, len(ranges) - 100)])
        assert int(u.min()) >= 0 and int(u.max()) < 2**32
        assert int(u.max()) >= 2**31                      # the top bit is recovered
        ref = torch.Generator().manual_seed(seed)
        want = [int(torch.randint(m, (1,), generator=ref)) for m in ranges]
        assert [int(v) % m for v, m in zip(u, ranges, strict=True)] == want
        assert torch.equal(gen.get_state(), ref.get_state())


def test_tie_index_picks_the_kth_tied_entry() -> None:
    tied = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    for k in range(5):
        pick = torch.full((3,), k)
        got = tie_index(tied, pick)
        for r in range(3):
            ties = torch.nonzero(tied[r])[:, 0]
            if k < ties.numel():
                assert int(got[r]) == int(ties[k])


def test_run_tie_draws_equal_the_sequential_loop() -> None:
    """12 runs, 300 selects over 9 candidates: run 0 ties every time (its buffer outgrows the
    first chunks), run 1 never, the others at random; the choices and, after ``sync``, every
    generator state are the sequential ones."""
    n_runs, n_cand, rounds = 12, 9, 300
    seeds = [3 * r + 1 for r in range(n_runs)]
    draws = RunTieDraws([torch.Generator().manual_seed(s) for s in seeds], chunk=16)
    ref = [torch.Generator().manual_seed(s) for s in seeds]
    masks = torch.Generator().manual_seed(99)
    for t in range(rounds):
        tied = torch.rand(n_runs, n_cand, generator=masks) < 0.15
        tied[0] = torch.rand(n_cand, generator=masks) < 0.6
        best = torch.randint(n_cand, (n_runs,), generator=masks)
        tied[torch.arange(n_runs), best] = True
        tied[1] = False
        tied[1, best[1]] = True
        got = draws.choose(best, tied)
        for r in range(n_runs):
            ties = torch.nonzero(tied[r])[:, 0]
            want = int(best[r]) if ties.numel() == 1 else \
                int(ties[int(torch.randint(ties.numel(), (1,), generator=ref[r]))])
            assert int(got[r]) == want, (t, r)
        if t == 150:                                     # a save in the middle
            for g, h in zip(draws.sync(), ref, strict=True):
                assert torch.equal(g.get_state(), h.get_state())
    for g, h in zip(draws.sync(), ref, strict=True):
        assert torch.equal(g.get_state(), h.get_state())


def test_policy_state_dict_with_open_draws() -> None:
    """R-GP-UCB with random ties (H = 5: the prior ties at rounds 1, 6, 11, …) saved after 13
    rounds, then a fresh copy and the original step on in lockstep and equal the sequential
    runs; the saved generator states are the sequential ones (the draws ahead are not saved)."""
    env = make_env("tv-bump", horizon=40)
    seeds = [2, 9, 4, 0]
    benv = BatchedEnv(env, seeds)
    policy = make_policy("r-gpucb", env, period=5)
    policy.reset(seed=seeds)
    rows = torch.arange(len(seeds))
    actions = []

    def step(pol):  # type: ignore[no-untyped-def]
        cand = benv.candidates()
        idx = pol.select(cand)
        reward, _ = benv.pull(idx)
        pol.update(cand[rows, idx], reward)
        return idx

    for _ in range(13):
        actions.append(step(policy).tolist())
    assert policy.tie_draws is not None
    state = copy.deepcopy(policy.state_dict())
    twin = make_policy("r-gpucb", env, period=5)
    twin.load_state_dict(state)
    for s, saved in zip(seeds, state["_extra_state"]["batch"]["rng"], strict=True):
        seq = make_policy("r-gpucb", env, period=5)
        simulate(seq, env, 13, s)                        # its generator after 13 rounds
        assert torch.equal(saved, seq.generator.get_state())
    cand_rows = []
    for _ in range(27):
        cand = benv.candidates()
        a, b = policy.select(cand), twin.select(cand)
        assert torch.equal(a, b)
        reward, _ = benv.pull(a)
        policy.update(cand[rows, a], reward)
        twin.update(cand[rows, a], reward)
        cand_rows.append(a.tolist())
    for r, s in enumerate(seeds):
        seq = simulate(make_policy("r-gpucb", env, period=5), env, 40, s)
        assert seq.actions == [a[r] for a in actions + cand_rows]
        assert len({seq.actions[t] for t in (0, 5, 10, 15, 20)}) > 1   # the ties were random

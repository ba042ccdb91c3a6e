"""The batched runner's contract: run r of a batch is the sequential run with seed r.

For every batchable environment of the registry, ``simulate_batch`` with the random policy makes
the same actions as ``simulate`` seed by seed, with rewards and regrets equal to 1e-12, and its
results have the same JSON shape (fields, config keys, lengths)."""

from __future__ import annotations

import json

import pytest
import torch

from torchbandits.envs.batched import is_batchable
from torchbandits.experiments import can_batch, simulate, simulate_batch
from torchbandits.experiments.batch import why_not_batch
from torchbandits.experiments.registry import ENVIRONMENTS, make_env, make_policy
from torchbandits.policies import RandomPolicy

SEEDS = [0, 1, 2, 5, 8, 13, 21, 34]
HORIZON = 40
SMALL = {"rkhs": {"dim": 2, "n_arms": 20}, "switching-kernel": {"n_arms": 30, "dim": 4,
                                                                  "switches": (15, 30)},
         "cosine": {"n_arms": 30, "dim": 3}}
UNBATCHED = {"branin", "hartmann6", "ackley", "levy", "rosenbrock", "michalewicz", "digits"}


def _env(name: str):  # type: ignore[no-untyped-def]
    kwargs = dict(SMALL.get(name, {}))
    if name.startswith("tv-"):
        kwargs.setdefault("horizon", HORIZON)
    return make_env(name, **kwargs)


def _shape(d: object) -> object:
    """The JSON shape of a run: keys, and lengths of lists (values left out)."""
    if isinstance(d, dict):
        return {k: _shape(v) for k, v in d.items() if k not in ("wall_seconds",)}
    if isinstance(d, list):
        return ("list", len(d))
    return type(d).__name__


BATCHABLE = sorted(n for n in ENVIRONMENTS if n not in UNBATCHED)


def test_registry_split_is_as_documented() -> None:
    for name in BATCHABLE:
        assert is_batchable(_env(name)), name
    for name in ("branin", "michalewicz"):
        env = make_env(name)
        assert not can_batch(RandomPolicy(), env)
        assert "not batched" in why_not_batch(RandomPolicy(), env)


@pytest.mark.parametrize("name", BATCHABLE)
def test_batched_run_r_equals_sequential_seed_r(name: str) -> None:
    env = _env(name)
    policy = make_policy("random", env)
    assert can_batch(policy, env)
    batched = simulate_batch(policy, env, HORIZON, SEEDS, policy_name="random", env_name=name,
                             config={"tag": 1})
    assert [r.seed for r in batched] == SEEDS
    for res in batched:
        seq = simulate(make_policy("random", env), env, HORIZON, res.seed, policy_name="random",
                       env_name=name, config={"tag": 1})
        assert res.actions == seq.actions, (name, res.seed)
        assert res.rewards == pytest.approx(seq.rewards, abs=1e-12, rel=0)
        assert res.regret == pytest.approx(seq.regret, abs=1e-12, rel=0)
        assert res.diagnostic_steps == seq.diagnostic_steps
        a, b = json.loads(json.dumps(res.to_dict())), json.loads(json.dumps(seq.to_dict()))
        assert _shape(a) == _shape(b)
        assert {k: v for k, v in a["config"].items() if k != "wall_seconds"} == \
               {k: v for k, v in b["config"].items() if k != "wall_seconds"}


def test_batch_size_and_neighbours_do_not_matter() -> None:
    env = _env("rkhs")
    policy = RandomPolicy()
    big = simulate_batch(policy, env, 30, [4, 9, 2, 7])
    one = simulate_batch(policy, env, 30, [9])
    assert one[0].actions == big[1].actions
    assert one[0].rewards == pytest.approx(big[1].rewards, abs=1e-12, rel=0)


def test_unbatchable_pairs_fall_back_to_sequential_runs() -> None:
    env = make_env("bump", regret_mode="reference")
    policy = RandomPolicy()
    assert not can_batch(policy, env)
    runs = simulate_batch(policy, env, 20, [3, 4])
    seq = simulate(RandomPolicy(), env, 20, 4)
    assert runs[1].actions == seq.actions and runs[1].rewards == seq.rewards
    amm_env = _env("rkhs")
    socp = {"method": "socp"}   # CMM by its SOCP (Flynn & Reeb 2024, Eq. 10): sequential
    amm = make_policy("cmm-ucb", amm_env, **socp)
    assert "socp" in why_not_batch(amm, amm_env)
    runs = simulate_batch(amm, amm_env, 3, [0, 1])
    assert runs[1].actions == simulate(make_policy("cmm-ucb", amm_env, **socp), amm_env, 3, 1).actions


def test_random_policy_batched_mode_checks_and_state() -> None:
    policy = RandomPolicy()
    policy.reset(seed=[3, 4, 5])
    assert policy.n_runs == 3
    cand = torch.rand(3, 7, 2, dtype=torch.float64)
    first = policy.select(cand)
    assert first.dtype == torch.long and first.shape == (3,)
    policy.update(cand[torch.arange(3), first], torch.zeros(3, dtype=torch.float64))
    for bad_cand in (cand[:2], cand[0]):
        with pytest.raises(ValueError, match="candidates"):
            policy.select(bad_cand)
    with pytest.raises(ValueError, match="reward"):
        policy.update(cand[:, 0], torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="reward"):
        policy.update(cand[:, 0], torch.zeros(2))
    with pytest.raises(ValueError, match="x must"):
        policy.update(cand[:2, 0], torch.zeros(3))
    assert policy.t == 1
    # state_dict mid-batch: the reloaded policy continues identically
    for _ in range(5):
        policy.select(cand)
    saved = policy.state_dict()
    twin = RandomPolicy()
    twin.load_state_dict(saved)
    for _ in range(20):
        assert torch.equal(policy.select(cand), twin.select(cand))
    # run r plays what the sequential policy seeded s_r plays
    policy.reset(seed=[3, 4, 5])
    seq = [RandomPolicy(seed=s) for s in (3, 4, 5)]
    for _ in range(30):
        got = policy.select(cand)
        assert got.tolist() == [p.select(cand[0]) for p in seq]
    policy.reset(seed=2)
    assert policy.n_runs is None and isinstance(policy.select(cand[0]), int)
    double = RandomPolicy().to(torch.float32)
    double.reset(seed=[0, 1])
    assert double.select(cand[:2]).shape == (2,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batched_run_on_cuda_equals_sequential_cpu_run() -> None:
    """Environment and policy on the GPU: run r still plays the CPU sequential run's actions
    (the generators stay on the CPU)."""
    gpu_env = make_env("rkhs", dim=2, n_arms=20, device="cuda")
    runs = simulate_batch(RandomPolicy(device="cuda"), gpu_env, 30, [0, 1, 2])
    cpu_env = make_env("rkhs", dim=2, n_arms=20)
    for res in runs:
        seq = simulate(RandomPolicy(), cpu_env, 30, res.seed)
        assert res.actions == seq.actions
        assert res.rewards == pytest.approx(seq.rewards, abs=1e-10, rel=0)


def test_a_fixed_candidate_tensor_written_in_place_is_flagged_again() -> None:
    """The runner flags an unchanged candidate tensor (a fixed arm set) once; a NaN written into
    it in place mid-run still stops the run with the argument named (its version moved)."""
    env = make_env("rkhs", dim=2, n_arms=20, fixed_arms=True)
    policy = RandomPolicy()
    select, seen = policy.select, []

    def poisoning_select(cand):  # type: ignore[no-untyped-def]
        seen.append(cand)
        if len(seen) == 5:
            cand[1, 3, 0] = float("nan")   # after this round's flag: caught at the next round
        return select(cand)

    policy.select = poisoning_select  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="candidates must be finite"):
        simulate_batch(policy, env, 10, [0, 1], progress=False)
    assert len(seen) >= 5 and all(c is seen[0] for c in seen)   # one tensor throughout

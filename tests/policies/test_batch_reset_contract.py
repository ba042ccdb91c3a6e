"""The reset contract of every batched policy (:meth:`BatchModeMixin.reset`): a rejected
``reset`` changes nothing.

For Random, K-UCB (a per-run β grid; the radius of Zenati et al. 2022, Lemma 3.1, with a per-run
λ grid), GP-UCB with the IGP radius (Chowdhury & Gopalan 2017, Thm 2), AMM-UCB (Flynn & Reeb
2024, §5.3), R-GP-UCB (a λ grid) and SW-GP-UCB (a β grid) of Zhou & Shroff (2021, Algorithms 1
and 2), EK-UCB (Zenati et al. 2022, Algorithm 4) and BKB (Calandriello et al. 2019, Algorithm 1;
a λ grid and, with a constant width, a β grid): a batch of three runs steps a few rounds, then
every rejected ``reset`` — seeds that are not ints (``[1, "a"]``, ``[True]``, a string, an empty
list), a seed no ``torch.Generator`` takes (single and in a list), a batch start while the
policy cannot batch, and a per-run grid whose length is not the new ``R`` — raises a
``ValueError`` naming its argument and leaves the whole ``state_dict`` (buffers and extra state:
``t``, generators, per-run streams and settings), ``t`` and ``n_runs`` as they were; the batch
then goes on with the scores and choices of a twin that never saw the rejected calls.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments.registry import make_env, make_policy

from ..batch_checks import play, started

SEEDS = [4, 5, 6]
GRID = [0.1, 1.0, 10.0]
STATIONARY = ("rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True})
MOVING = ("tv-switch", {"horizon": 200})

#: case → (registry name, keyword arguments, environment, per-run grid or None)
CASES: dict[str, tuple[str, dict[str, Any], tuple[str, dict[str, Any]], dict[str, list] | None]] = {
    "random": ("random", {}, STATIONARY, None),
    "kucb-beta-grid": ("kucb", {}, STATIONARY, {"beta": GRID}),
    "kucb-theory-lam-grid": ("kucb-theory", {}, STATIONARY, {"lam": GRID}),
    "gpucb": ("gpucb", {}, STATIONARY, None),
    "amm-ucb": ("amm-ucb", {"horizon": 200}, STATIONARY, None),
    "r-gpucb-lam-grid": ("r-gpucb", {"period": 4, "beta": 1.0}, MOVING, {"lam": GRID}),
    "sw-gpucb-beta-grid": ("sw-gpucb", {"window": 3, "horizon": 200, "beta": 1.0}, MOVING,
                           {"beta": GRID}),
    "ekucb": ("ekucb", {}, STATIONARY, None),
    "bkb-lam-grid": ("bkb", {}, STATIONARY, {"lam": [0.003, 0.01, 0.05]}),
    "bkb-const-beta-grid": ("bkb-const", {}, STATIONARY, {"beta": GRID}),
}

#: (the argument the error names, the seed passed to ``reset``); ``None``: the batch's seeds
#: while the policy is made unable to batch
REJECTED: list[tuple[str, Any]] = [
    ("seed", [1, "a"]), ("seed", [True]), ("seed", []), ("seed", "12"),
    ("seed", [0, 1 << 64]), ("seed", 1 << 64), ("seed", None),
]


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a nested ``state_dict`` (dicts, lists, tuples) with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}/{i}")
    else:
        yield path, obj


def _snapshot(policy: Any) -> dict[str, Any]:
    state = {p: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
             for p, v in _leaves(policy.state_dict())}
    return {"state": state, "t": policy.t, "n_runs": policy.n_runs}


def _assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert (after["t"], after["n_runs"]) == (before["t"], before["n_runs"])
    assert sorted(after["state"]) == sorted(before["state"])
    for path, old in before["state"].items():
        new = after["state"][path]
        if isinstance(old, torch.Tensor):
            torch.testing.assert_close(new, old, atol=0, rtol=0, equal_nan=True, msg=path)
        elif isinstance(old, float) and math.isnan(old):
            assert math.isnan(new), path
        else:
            assert new == old, path


def _score(policy: Any, cand: torch.Tensor) -> torch.Tensor:
    """UCBs ``[R, A]`` (Random has none: its choice is compared instead)."""
    return cand.new_zeros(()) if policy.__class__.__name__.startswith("Random") else policy(cand)


@pytest.mark.parametrize("case", list(CASES))
def test_a_rejected_reset_changes_nothing(case: str) -> None:
    name, kwargs, (env_name, env_kwargs), grid = CASES[case]
    env = make_env(env_name, **env_kwargs)
    policy = make_policy(name, env, **kwargs)
    if grid is not None:
        policy.set_per_run(**grid)
    started(policy, SEEDS)
    benv = BatchedEnv(env, SEEDS)
    play(policy, benv, 5)
    twin = copy.deepcopy(policy)
    rejected = list(REJECTED)
    if grid is not None:                       # a grid of R = 3 values for a batch of 2 runs
        rejected += [(setting, SEEDS[:2]) for setting in grid]
    for arg, seed in rejected:
        before = _snapshot(policy)
        if seed is None:
            assert policy.batchable
            policy.why_not_batched = lambda: "a test made it unable to batch"
            with pytest.raises(ValueError, match=r"^seed: .*a test made it unable to batch"):
                policy.reset(seed=SEEDS)
            del policy.why_not_batched
        else:
            with pytest.raises(ValueError, match=f"^{arg}"):
                policy.reset(seed=seed)
        _assert_same(before, _snapshot(policy))
    assert policy.n_runs == len(SEEDS) and policy.t == twin.t == 5
    actions = play(policy, benv, 6, twin, score=_score)
    assert any(len(set(a)) > 1 for a in actions)       # the runs go on, each its own way

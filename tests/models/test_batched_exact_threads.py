"""The compiled batched calls split over ``native.threads()`` threads (``native.set_threads``,
``$TORCHBANDITS_THREADS``; ``native.threads_for``): the exact posterior's select and scoring and
BKB's rounds give the same choices and the same state, bit for bit, as on one thread."""

from __future__ import annotations

import pytest
import torch

from torchbandits import native
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.native import bkb as nbkb
from torchbandits.native import exact_batch as nb
from torchbandits.run_draw_threads import run_sliced

pytestmark = pytest.mark.skipif(nb.available() is None, reason="no compiled library")


def _run(name: str, threads: int, monkeypatch, fixed: bool = False
         ) -> tuple[list, dict, list[int]]:
    """Actions of 20 batched runs to T = 40 (fresh arms, or a fixed set: scored in C at its first
    calls), the policy's state with its final UCBs on the runs' next candidates, and the thread
    counts the compiled calls were sliced over."""
    seen: list[int] = []

    def spy(fn, n, count):
        seen.append(count)
        return run_sliced(fn, n, count)

    monkeypatch.setattr(nb, "run_sliced", spy)
    monkeypatch.setattr(nbkb, "run_sliced", spy)
    native.set_threads(threads)
    try:
        env = make_env("rkhs", dim=2 if name == "bkb" else 3, n_arms=60, fixed_arms=fixed)
        policy = make_policy(name, env, horizon=40)
        results = simulate_batch(policy, env, 40, list(range(20)), progress=False)
        ucb = policy(BatchedEnv(env, list(range(20))).candidates())   # the final bounds
    finally:
        native.set_threads(None)
    state = {k: v.clone() for k, v in policy.state_dict().items() if isinstance(v, torch.Tensor)}
    state["final UCB"] = ucb
    return [r.actions for r in results], state, seen


@pytest.mark.parametrize(("name", "fixed"), [("amm-ucb", False), ("amm-ucb", True),
                                             ("dmm-ucb", False), ("dmm-ucb", True),
                                             ("bkb", True)])
def test_threaded_calls_give_the_one_thread_runs(name: str, fixed: bool, monkeypatch) -> None:
    if name == "bkb" and not nbkb.available():
        pytest.skip("no compiled BKB round")
    one = _run(name, 1, monkeypatch, fixed)
    two = _run(name, 2, monkeypatch, fixed)
    assert set(one[2]) == {1} and 2 in two[2]         # (the second run really sliced the runs)
    assert one[0] == two[0]
    assert one[1].keys() == two[1].keys() and one[1]
    for key, value in one[1].items():
        assert torch.equal(value, two[1][key]), key


def test_threads_for(monkeypatch) -> None:
    """One thread unless asked (``set_threads``, else ``$TORCHBANDITS_THREADS``; torch's own
    thread count does not enter), at most one per 8 runs; a bad count is refused."""
    monkeypatch.delenv("TORCHBANDITS_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert native.threads() == 1 and native.threads_for(1000) == 1
        monkeypatch.setenv("TORCHBANDITS_THREADS", "3")
        assert native.threads_for(1000) == 3
        native.set_threads(4)
        assert [native.threads_for(r) for r in (0, 7, 8, 16, 31, 32, 1000)] == [1, 1, 1, 2, 3, 4, 4]
        for bad in (0, -1, 2.0, True, "2"):
            with pytest.raises(ValueError, match="count"):
                native.set_threads(bad)
        assert native.threads() == 4                    # (a refused call changes nothing)
        native.set_threads(None)
        assert native.threads() == 3
    finally:
        native.set_threads(None)
        torch.set_num_threads(before)


def test_use_threads_applies_a_commands_two_options(monkeypatch) -> None:
    """``use_threads(torch_threads, run_threads)``: 0 leaves a setting as it is; run threads
    above one put torch on one thread unless torch's count is given; a bad count is refused
    before anything is set."""
    monkeypatch.delenv("TORCHBANDITS_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        native.use_threads(0, 0)
        assert (torch.get_num_threads(), native.threads()) == (2, 1)
        native.use_threads(0, 3)
        assert (torch.get_num_threads(), native.threads()) == (1, 3)
        native.use_threads(2, 0)
        assert (torch.get_num_threads(), native.threads()) == (2, 3)
        native.use_threads(0, 1)
        assert (torch.get_num_threads(), native.threads()) == (2, 1)
        for name, bad in (("torch_threads", -1), ("run_threads", 1.5), ("run_threads", True)):
            args = {"torch_threads": 3, "run_threads": 4, name: bad}
            with pytest.raises(ValueError, match=name):
                native.use_threads(**args)
            assert (torch.get_num_threads(), native.threads()) == (2, 1)   # nothing set
    finally:
        native.set_threads(None)
        torch.set_num_threads(before)

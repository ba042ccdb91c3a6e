"""BatchedEnv: run r of a batch sees exactly the candidates, means, rewards and regrets of the
environment reset with seed r and pulled with the same indices."""

from __future__ import annotations

import pytest
import torch

from torchbandits.envs import (
    BumpEnv,
    ChessboardEnv,
    CosineBandit,
    LinearRotatingEnv,
    MovingBumpEnv,
    RKHSFunctionEnv,
    RotatingRKHSEnv,
    StationaryRKHSEnv,
    StepDiagonalEnv,
    SwitchingKernelEnv,
    SwitchingRKHSEnv,
)
from torchbandits.envs.batched import BatchedEnv, is_batchable, why_not_batchable
from torchbandits.experiments.registry import make_env

SEEDS = [0, 3, 7, 11]
ROUNDS = 60
BATCHABLE = {
    "rkhs-fresh": lambda: RKHSFunctionEnv(dim=2, n_arms=20),
    "rkhs-fixed": lambda: RKHSFunctionEnv("matern52", dim=3, n_arms=15, fixed_arms=True),
    "rkhs-float32": lambda: RKHSFunctionEnv(dim=2, n_arms=10, dtype=torch.float32),
    "bump": lambda: BumpEnv(),
    "chessboard": lambda: ChessboardEnv(),
    "step-diagonal": lambda: StepDiagonalEnv(),
    "switching-sign": lambda: SwitchingKernelEnv(n_arms=30, dim=4, switches=(20, 45)),
    "switching-resample-gauss": lambda: SwitchingKernelEnv(n_arms=30, dim=4, switches=(20,),
                                                           mode="resample", noise="gaussian"),
    "cosine-slow": lambda: CosineBandit(n_arms=40, dim=3, phase="slow"),
    "tv-rotation": lambda: RotatingRKHSEnv(horizon=ROUNDS, n_arms=30, budget=3.0),
    "tv-stationary": lambda: StationaryRKHSEnv(dim=2, horizon=ROUNDS, n_arms=16),
    "tv-linear": lambda: LinearRotatingEnv(horizon=ROUNDS, n_arms=20),
    "tv-bump": lambda: MovingBumpEnv(horizon=ROUNDS, n_arms=30, budget=2.0),
    "tv-switch": lambda: SwitchingRKHSEnv(horizon=ROUNDS, n_arms=30, n_switches=3),
}


@pytest.mark.parametrize("name", sorted(BATCHABLE))
def test_batched_run_r_equals_sequential_seed_r(name: str) -> None:
    env = BATCHABLE[name]()
    assert is_batchable(env)
    batch = BatchedEnv(env, SEEDS, chunk=16)
    gen = torch.Generator().manual_seed(5)
    n_arms = batch.candidates().shape[1]
    picks = [torch.randint(n_arms, (len(SEEDS),), generator=gen) for _ in range(ROUNDS)]
    record = []
    for idx in picks:
        cand, means = batch.candidates(), batch.mean_rewards()
        assert cand.shape[:2] == means.shape == (len(SEEDS), n_arms)
        reward, regret = batch.pull(idx)
        assert reward.dtype == torch.float64 and reward.shape == regret.shape == (len(SEEDS),)
        record.append((cand, means, reward, regret))
    tol = 1e-12 if env.dtype == torch.float64 else 1e-5   # float32: batched products round anew
    for r, seed in enumerate(SEEDS):
        env.reset(seed)
        for t, idx in enumerate(picks):
            cand, means, reward, regret = record[t]
            i = int(idx[r])
            assert torch.equal(env.candidates(), cand[r]), (seed, t)
            torch.testing.assert_close(env.mean_rewards(), means[r], rtol=0, atol=tol)
            m = env.mean_rewards()
            assert float(m.max() - m[i]) == pytest.approx(float(regret[r]), abs=tol)
            assert env.pull(i) == pytest.approx(float(reward[r]), abs=tol)


def test_a_run_does_not_depend_on_its_neighbours() -> None:
    env = RKHSFunctionEnv(dim=2, n_arms=12)
    alone, crowd = BatchedEnv(env, [7]), BatchedEnv(env, [1, 7, 2])
    for _ in range(30):
        assert torch.equal(alone.candidates()[0], crowd.candidates()[1])
        ra, _ = alone.pull(torch.tensor([3]))
        rc, _ = crowd.pull(torch.tensor([0, 3, 5]))
        assert float(ra[0]) == float(rc[1])


def test_template_is_left_unchanged() -> None:
    env = ChessboardEnv()
    env.reset(9)
    before = env.candidates().clone()
    batch = BatchedEnv(env, [0, 1])
    batch.pull(torch.tensor([1, 2]))
    assert torch.equal(env.candidates(), before) and env.seed == 9


def test_unbatchable_configurations_say_why() -> None:
    assert "reference" in why_not_batchable(BumpEnv(regret_mode="reference"))
    assert "rejected" in why_not_batchable(CosineBandit(n_arms=5, dim=2, noise="rejected"))
    assert "no batch hooks" in why_not_batchable(object())
    with pytest.raises(ValueError, match="cannot be batched: noise='rejected'"):
        BatchedEnv(SwitchingKernelEnv(n_arms=5, dim=2, noise="rejected"), [0, 1])

    class Shifted(RKHSFunctionEnv):
        def pull(self, index: int) -> float:
            return super().pull(index) + 1.0

    reason = why_not_batchable(Shifted(dim=1, n_arms=4))
    assert reason is not None and "overrides pull below RKHSFunctionEnv" in reason

    class Squared(RotatingRKHSEnv):
        def _means_at(self, t: int) -> torch.Tensor:
            return super()._means_at(t) ** 2

    reason = why_not_batchable(Squared(horizon=10, n_arms=5))
    assert reason is not None and "_means_at" in reason


def test_bad_index_changes_nothing() -> None:
    batch = BatchedEnv(RKHSFunctionEnv(dim=2, n_arms=6), [0, 1, 2])
    cand = batch.candidates().clone()
    for bad in (torch.tensor([0, 1]), torch.tensor([0, 6, 1]), torch.tensor([0.0, 1.0, 2.0])):
        with pytest.raises(ValueError, match="index"):
            batch.pull(bad)
    assert batch.t == 0 and torch.equal(batch.candidates(), cand)
    with pytest.raises(ValueError, match="seeds"):
        BatchedEnv(RKHSFunctionEnv(dim=2, n_arms=6), [])


@pytest.mark.parametrize("name", ["rkhs", "chessboard", "bump", "tv-rotation"])
def test_copies_equal_full_deep_copies_and_leave_the_template(name: str) -> None:
    """The copies share the template's modules while resetting: each equals a full deep copy
    reset with its seed, owns every tensor (none is the template's), and the template's tensors
    are unchanged."""
    import copy

    from torchbandits.envs.batched import _reset_copies

    env = make_env(name, horizon=50) if name.startswith("tv-") else make_env(name)
    before = {k: v.clone() for k, v in vars(env).items() if isinstance(v, torch.Tensor)}
    fast = _reset_copies(env, [3, 8])
    for s, run in zip([3, 8], fast, strict=True):
        full = copy.deepcopy(env)
        full.reset(s)
        for k, v in vars(full).items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(getattr(run, k), v), k
                assert getattr(run, k) is not vars(env).get(k)
    for k, v in before.items():
        assert torch.equal(vars(env)[k], v), k


class _InPlaceReset:
    """An environment whose ``reset`` writes into a tensor in place (``fill_``)."""

    def __init__(self) -> None:
        self.table = torch.zeros(3, dtype=torch.float64)
        self.kernel = torch.nn.Linear(1, 1)

    def reset(self, seed: int) -> None:
        self.table.fill_(float(seed))


def test_an_in_place_reset_falls_back_to_full_deep_copies() -> None:
    from torchbandits.envs.batched import _reset_copies

    env = _InPlaceReset()
    runs = _reset_copies(env, [2, 5])
    assert [float(r.table[0]) for r in runs] == [2.0, 5.0]
    assert torch.equal(env.table, torch.zeros(3, dtype=torch.float64))   # restored
    assert runs[0].table is not runs[1].table is not env.table

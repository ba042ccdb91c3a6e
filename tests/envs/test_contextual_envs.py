"""Bump, Chessboard, Step Diagonal (Zenati et al. 2022, §5 and App. F.2.2, and their released code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchbandits.envs.contextual import (
    ACTION_GRID,
    BUMP_A_STAR,
    BUMP_W_STAR,
    BUMP_X_STAR,
    BumpEnv,
    ChessboardEnv,
    StepDiagonalEnv,
)
from torchbandits.experiments import simulate
from torchbandits.kernels import make_kernel
from torchbandits.policies import KernelUCB, RandomPolicy
from torchbandits.policies.ekucb import EKUCB

F64 = torch.float64


def test_code_constants_from_randomstate_123() -> None:
    """The grid, a*, x*, w* are the authors' RandomState(123) draws (Zenati et al. 2022, §5)."""
    rs = np.random.RandomState(123)
    grid = rs.choice(np.arange(0, 1, 0.01), 10, replace=False)
    assert np.array_equal(grid, np.array(ACTION_GRID))
    a_idx = rs.randint(10)
    assert grid[a_idx] == BUMP_A_STAR == 0.81
    assert np.array_equal(rs.uniform(size=5), np.array(BUMP_X_STAR))
    assert np.array_equal(rs.uniform(-1, 1, size=5), np.array(BUMP_W_STAR))


def test_bump_values() -> None:
    env = BumpEnv()
    xs = torch.tensor(BUMP_X_STAR, dtype=F64)[None]
    acts = torch.tensor([0.81, 0.5, 0.0], dtype=F64)
    assert torch.allclose(env.f(xs, acts), torch.tensor([[1.0, 0.69, 0.19]], dtype=F64))
    # shifting the context along w* lowers the bump, and it is clipped at 0
    w = torch.tensor(BUMP_W_STAR, dtype=F64)
    shifted = xs + 0.3 * w / (w @ w)
    assert torch.allclose(env.f(shifted, acts), torch.tensor([[0.7, 0.39, 0.0]], dtype=F64))
    assert float(env.code_best(shifted)[0]) == pytest.approx(0.7)


@pytest.mark.parametrize(("x", "a", "value"), [
    (0.3, 0.1, 1.0), (0.3, 0.6, 1.0), (0.8, 0.6, 1.0), (1.0, 0.7, 1.0),
    (0.1, 0.3, 0.5), (0.6, 0.3, 0.5), (0.6, 0.8, 0.5), (0.6, 1.0, 0.5),
    (0.1, 0.1, 0.0), (0.8, 0.1, 0.0), (0.3, 0.3, 0.0), (0.3, 0.9, 0.0), (0.1, 0.6, 0.0),
])
def test_chessboard_cells(x: float, a: float, value: float) -> None:
    env = ChessboardEnv()
    got = env.f(torch.tensor([[x]], dtype=F64), torch.tensor([a], dtype=F64))
    assert float(got) == value


@pytest.mark.parametrize(("x", "a", "value"), [
    (0.5, 0.3, 1.0), (0.5, 0.26, 1.0), (0.5, 0.44, 1.0),
    (0.5, 0.6, 0.5), (0.5, 0.56, 0.5), (0.5, 0.74, 0.5),
    (0.5, 0.5, 0.0), (0.5, 0.2, 0.0), (0.5, 0.8, 0.0), (0.0, 0.0, 0.0), (0.1, 0.0, 1.0), (0.1, 0.25, 0.5),
])
def test_step_diagonal_bands(x: float, a: float, value: float) -> None:
    env = StepDiagonalEnv()
    got = env.f(torch.tensor([[x]], dtype=F64), torch.tensor([a], dtype=F64))
    assert float(got) == value


@pytest.mark.parametrize(("cls", "best", "random_regret"), [
    (BumpEnv, 0.825, 0.38), (ChessboardEnv, 0.75, 0.45), (StepDiagonalEnv, 0.965, 0.72),
])
def test_monte_carlo_reference_numbers(cls, best: float, random_regret: float) -> None:
    """Spec §6.3: E_x[max_a f] over the grid and the random policy's regret per round."""
    env = cls()
    g = torch.Generator().manual_seed(0)
    ctx = torch.rand(40000, env.context_dim, generator=g, dtype=F64)
    means = env.f(ctx, env.actions)
    assert float(means.max(1).values.mean()) == pytest.approx(best, abs=0.01)
    assert float((means.max(1).values[:, None] - means).mean()) == pytest.approx(random_regret, abs=0.01)
    if cls is BumpEnv:  # f exceeds 1 for about 29% of contexts (the code's constants)
        assert float((means.max(1).values > 1).double().mean()) == pytest.approx(0.29, abs=0.02)
        # a* = 0.81 is the best grid action whenever the best reward is positive
        pos = means.max(1).values > 0
        assert bool((means[pos].argmax(1) == ACTION_GRID.index(0.81)).all())


@pytest.mark.parametrize("cls", [BumpEnv, ChessboardEnv, StepDiagonalEnv])
def test_contract_and_seeds(cls) -> None:
    env = cls()
    env.reset(4)
    cand = env.candidates()
    assert cand.shape == (10, env.context_dim + 1) and cand.dtype == F64
    assert torch.equal(cand[:, -1], env.actions)
    assert torch.equal(env.mean_rewards(), env.f(cand[:1, :-1], env.actions)[0])
    assert env.kernel.lengthscale.item() == pytest.approx(0.1)
    seq1 = [(env.candidates().clone(), env.pull(i % 10)) for i in range(20)]
    env.reset(4)
    seq2 = [(env.candidates().clone(), env.pull(i % 10)) for i in range(20)]
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(seq1, seq2))
    env.reset(5)
    assert not torch.equal(env.candidates(), seq1[0][0])
    # noise has the declared scale
    env.reset(0)
    resid = []
    for _ in range(2000):
        m = float(env.mean_rewards()[0])
        resid.append(env.pull(0) - m)
    assert float(np.std(resid)) == pytest.approx(0.1, abs=0.01)
    with pytest.raises(ValueError, match="index"):
        env.pull(10)
    with pytest.raises(ValueError, match="regret_mode"):
        cls(regret_mode="bad")


def test_reference_regret_offset_on_chessboard() -> None:
    """The code's regret ≈ pseudo-regret + 0.25 per round on Chessboard (best ≡ 1 in the released code)."""
    env = ChessboardEnv(regret_mode="reference")
    res = simulate(RandomPolicy(), env, 3000, seed=1)
    offset = (sum(env.reference_regret) - res.final_regret) / 3000
    assert offset == pytest.approx(0.25, abs=0.03)
    assert len(env.reference_regret) == 3000


@pytest.mark.parametrize(("cls", "lam"), [(BumpEnv, 10.0), (ChessboardEnv, 1.0), (StepDiagonalEnv, 1.0)])
def test_ucb_methods_well_below_random(cls, lam: float) -> None:
    """Seeded short runs (T = 400, β = 0.1): K-UCB and EK-UCB far below random."""
    horizon = 400
    rnd = simulate(RandomPolicy(), cls(), horizon, seed=0).final_regret
    kernel = make_kernel("rbf", 0.1)
    for pol in (KernelUCB(kernel, lam=lam, beta=0.1), EKUCB(kernel, lam=lam, beta=0.1, kors_gamma=1.0)):
        reg = simulate(pol, cls(), horizon, seed=0).final_regret
        assert reg < 0.7 * rnd, (type(pol).__name__, reg, rnd)


def test_chessboard_kept_action_columns_are_the_cell_lookup() -> None:
    """``f`` with its action columns kept (a fixed grid) is ``CELLS[c(x), c(a)]`` to the bit, and
    an in-place write to the actions or another actions tensor is seen."""
    env = ChessboardEnv()
    ctx = torch.rand(50, env.context_dim, generator=torch.Generator().manual_seed(3),
                     dtype=torch.float64)

    def lookup(actions: torch.Tensor) -> torch.Tensor:
        ci = torch.clamp((ctx[:, 0] * 4).floor().long(), 0, 3)
        ai = torch.clamp((actions.reshape(-1) * 4).floor().long(), 0, 3)
        return env.cells[ci[:, None], ai[None, :]]

    acts = env.actions.clone()
    for _ in range(2):   # computed, then kept
        assert torch.equal(env.f(ctx, acts), lookup(acts))
    acts.mul_(0.5)       # in place: the kept columns are stale, recomputed
    assert torch.equal(env.f(ctx, acts), lookup(acts))
    other = torch.tensor([0.9, 0.1, 0.6], dtype=torch.float64)
    assert torch.equal(env.f(ctx, other), lookup(other))
    assert not torch.equal(lookup(acts), lookup(env.actions))   # the write changed the values

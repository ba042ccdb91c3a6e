"""RKHS test-function environment (Flynn & Reeb 2024, §7) and the joint helper."""

from __future__ import annotations

import pytest
import torch

from torchbandits import RKHSFunctionEnv, joint
from torchbandits.kernels import kernel_matrix


@pytest.mark.parametrize("kernel", ["rbf", "matern52", "matern32"])
def test_norm_is_exactly_b_and_means_match(kernel):
    env = RKHSFunctionEnv(kernel, dim=3, lengthscale=0.2, norm=10.0)
    for seed in (0, 1):
        env.reset(seed)
        assert env.rkhs_norm() == pytest.approx(10.0, rel=1e-12)
        c = env.candidates()
        assert c.shape == (100, 3) and float(c.min()) >= 0 and float(c.max()) <= 1
        ref = kernel_matrix(env.kernel, c, env.inducing) @ env.coefficients
        assert torch.allclose(env.mean_rewards(), ref)


def test_fresh_vs_fixed_arms_and_noise():
    fresh = RKHSFunctionEnv("rbf", dim=2, n_arms=10, noise_std=0.1)
    fixed = RKHSFunctionEnv("rbf", dim=2, n_arms=10, noise_std=0.1, fixed_arms=True)
    for env in (fresh, fixed):
        env.reset(3)
    c0, m0 = fresh.candidates().clone(), float(fresh.mean_rewards()[0])
    noise = fresh.pull(0) - m0
    assert not torch.equal(fresh.candidates(), c0)  # fresh set after each pull
    assert 0 < abs(noise) < 0.5  # one N(0, 0.1²) draw from the env's own noise generator
    f0 = fixed.candidates().clone()
    rewards = torch.tensor([fixed.pull(2) for _ in range(2000)], dtype=torch.float64)
    assert torch.equal(fixed.candidates(), f0)
    assert float(rewards.mean()) == pytest.approx(float(fixed.mean_rewards()[2]), abs=0.01)
    assert float(rewards.std()) == pytest.approx(0.1, rel=0.1)


def test_same_seed_same_function_and_arms():
    a = RKHSFunctionEnv("matern52", dim=3)
    b = RKHSFunctionEnv("matern52", dim=3)
    a.reset(7)
    b.reset(7)
    a.pull(0)
    b.pull(5)  # different actions do not change the next arm set
    assert torch.equal(a.candidates(), b.candidates())
    with pytest.raises(ValueError, match="index"):
        a.pull(100)


def test_joint_features():
    ctx = torch.tensor([0.1, 0.2], dtype=torch.float64)
    acts = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    j = joint(ctx, acts)
    assert j.shape == (3, 3)
    assert torch.equal(j[:, :2], ctx.expand(3, 2)) and torch.equal(j[:, 2], acts)
    with pytest.raises(ValueError, match="rows"):
        joint(torch.zeros(2, 2), acts)

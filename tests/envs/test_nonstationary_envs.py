"""Environments of Hong, Li & Tewari (AISTATS 2023): switching kernel bandits (§6) and cosine
bandits (App. J)."""

from __future__ import annotations

import math

import pytest
import torch

from torchbandits.envs.nonstationary import CosineBandit, SwitchingKernelEnv, slow_phase


def test_switching_env_sign_flip_and_two_switches():
    env = SwitchingKernelEnv(switches=(1500, 5000))
    assert env.arms.shape == (100, 10)
    assert torch.allclose(env.arms.norm(dim=1), torch.ones(100, dtype=torch.float64))
    r = env.means_at(0)
    assert float(r.abs().max()) == pytest.approx(0.8)
    assert torch.equal(env.means_at(1499), r)          # round 1500
    assert torch.equal(env.means_at(1500), -r)         # round 1501: new function
    assert torch.equal(env.means_at(4999), -r)
    assert torch.equal(env.means_at(5000), r)
    one = SwitchingKernelEnv()
    assert torch.equal(one.means_at(2999), one.means_at(0))
    assert torch.equal(one.means_at(3000), -one.means_at(0))


def test_switching_env_resample_and_seeds():
    env = SwitchingKernelEnv(n_arms=20, dim=4, switches=(10,), mode="resample", seed=1)
    a, b = env.means_at(0), env.means_at(10)
    assert not torch.allclose(a, b) and not torch.allclose(a, -b)
    assert float(b.abs().max()) == pytest.approx(0.8)
    # same env seed → same instance and noise; different seed → different instance
    e1 = SwitchingKernelEnv(n_arms=20, dim=4, seed=5)
    e2 = SwitchingKernelEnv(n_arms=20, dim=4, seed=5)
    assert torch.equal(e1.arms, e2.arms)
    assert [e1.pull(3) for _ in range(5)] == [e2.pull(3) for _ in range(5)]
    e2.reset(6)
    assert not torch.equal(e1.arms, e2.arms)
    # the env's instance does not depend on the global RNG
    torch.manual_seed(123)
    e3 = SwitchingKernelEnv(n_arms=20, dim=4, seed=5)
    assert torch.equal(e1.arms, e3.arms)
    with pytest.raises(ValueError, match="mode"):
        SwitchingKernelEnv(mode="x")
    with pytest.raises(ValueError, match="switches"):
        SwitchingKernelEnv(switches=(5, 3))
    with pytest.raises(ValueError, match="index"):
        e1.pull(20)


def test_truncated_noise_bounded_and_gaussian_option():
    env = SwitchingKernelEnv(n_arms=10, dim=3, noise_std=0.5, seed=2)
    best = int(torch.argmax(env.means_at(0).abs()))
    ys = torch.tensor([env.pull(best) for _ in range(2000)])
    assert float(ys.abs().max()) <= 1.0
    g = SwitchingKernelEnv(n_arms=10, dim=3, noise_std=0.5, noise="gaussian", seed=2)
    yg = torch.tensor([g.pull(best) for _ in range(2000)])
    assert float(yg.abs().max()) > 1.0
    assert float((yg - g.means_at(0)[best]).std()) == pytest.approx(0.5, rel=0.1)


def test_cosine_bandits():
    env = CosineBandit()
    assert env.arms.shape == (256, 8)
    x, th = env.arms, env.theta
    assert torch.allclose(env.means_at(0), 0.8 * torch.cos(3 * x @ th))
    assert torch.equal(env.means_at(9000), env.means_at(0))
    slow = CosineBandit(100, 10, phase="slow")
    x, th = slow.arms, slow.theta
    for t, ph in ((0, 0.0), (999, 0.0), (2000, math.pi / 2), (3500, math.pi), (5000, 1.5 * math.pi),
                  (9999, 2 * math.pi)):
        assert slow_phase(t) == pytest.approx(ph)
        assert torch.allclose(slow.means_at(t), 0.8 * torch.cos(3 * x @ th + ph))
    # the total variation is spread over [1000, 3000) and [4000, 6000)
    assert torch.allclose(slow.means_at(9999), slow.means_at(0))
    with pytest.raises(ValueError, match="phase"):
        CosineBandit(phase="fast")


def test_truncated_noise_is_zero_mean_and_symmetric_the_rejected_law_is_not():
    """The default law is N(0, σ²) truncated to ±(1 − |r|) (zero mean, as the analysis assumes);
    "rejected" redraws until |y| ≤ 1, which cuts one side only near |r| = 1."""
    from scipy.stats import truncnorm

    out = {}
    for law in ("truncated", "rejected"):
        env = SwitchingKernelEnv(n_arms=10, dim=3, noise_std=0.1, noise=law, switches=(10**6,), seed=3)
        best = int(torch.argmax(env.means_at(0).abs()))
        r = float(env.means_at(0)[best])        # |r| = 0.8: the window is ±0.2 = ±2σ
        eps = torch.tensor([env.pull(best) for _ in range(20000)], dtype=torch.float64) - r
        out[law] = eps
        sign = math.copysign(1.0, r)
        assert float((r + eps).abs().max()) <= 1.0
    t = out["truncated"]
    assert float(t.abs().max()) <= 0.2 + 1e-12
    assert abs(float(t.mean())) < 4 * 0.088 / 20000**0.5
    assert float(t.std()) == pytest.approx(truncnorm(-2, 2, scale=0.1).std(), rel=0.02)
    rej = out["rejected"]
    assert float(rej.min() if sign > 0 else -rej.max()) < -0.25    # the far side is not cut
    # mean −σφ(2)/Φ(2) ≈ −0.0055 (towards 0 from r): not zero
    assert sign * float(rej.mean()) == pytest.approx(truncnorm(-math.inf, 2, scale=0.1).mean(), abs=1.5e-3)
    with pytest.raises(ValueError, match="noise"):
        SwitchingKernelEnv(n_arms=4, dim=2, noise="clipped")

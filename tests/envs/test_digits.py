"""The digits contextual bandit: best arm = label, epochs without replacement, GP-UCB vs Random."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sklearn")

from torchbandits.envs.digits import DigitsEnv, load_digits_tensors, ntk_features
from torchbandits.experiments import simulate
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.models.neural import ntk_gram
from torchbandits.policies import GPUCB, RandomPolicy


def test_best_arm_is_the_label_and_features_are_joint() -> None:
    env = DigitsEnv()
    x_all, labels = load_digits_tensors()
    for _ in range(30):
        cand, means = env.candidates(), env.mean_rewards()
        assert cand.shape == (10, 74)
        assert torch.equal(cand[:, :64], env.context().expand(10, -1))
        assert torch.equal(cand[:, 64:], torch.eye(10, dtype=torch.float64))
        assert int(torch.argmax(means)) == env.label == int(labels[env.index])
        assert float(means.sum()) == 1.0
        assert torch.equal(env.context(), x_all[env.index])
        assert env.pull(int(torch.argmax(means))) == 1.0  # noiseless by default


def test_epochs_without_replacement_and_seeded_streams() -> None:
    env = DigitsEnv(n_samples=40, noise_std=0.1)
    seen = []
    for _ in range(40):
        seen.append(env.index)
        env.pull(0)
    assert sorted(seen) == list(range(40)) and env.epoch == 1
    twin = DigitsEnv(n_samples=40, noise_std=0.1)
    env.reset(7)
    twin.reset(7)
    a = [(env.index, env.pull(3)) for _ in range(50)]
    b = [(twin.index, twin.pull(3)) for _ in range(50)]
    assert a == b
    twin.reset(8)
    assert [(twin.index, twin.pull(3)) for _ in range(50)] != a
    with pytest.raises(ValueError, match="noise_std"):
        DigitsEnv(noise_std=-1.0)
    with pytest.raises(ValueError, match="n_samples"):
        DigitsEnv(n_samples=0)


def test_registry_and_fitted_gpucb_beats_random() -> None:
    env = make_env("digits")
    assert isinstance(env, DigitsEnv)
    pol = GPUCB(env.kernel, lam=0.01, beta=1.0, refit_every=20, refit_warmup=20,
                refit_options={"max_iter": 30})
    fit = simulate(pol, env, 120, seed=0)
    rnd = simulate(RandomPolicy(), env, 120, seed=0)
    assert fit.final_regret < 0.85 * rnd.final_regret
    assert pol.n_refits >= 4
    assert len(pol.last_fit.lengthscales) == 2  # ℓ_x (pixels) and ℓ_a (one-hot actions)


def test_ntk_features_are_the_network_ntk() -> None:
    env = DigitsEnv(n_samples=50, features="ntk", ntk_width=8)
    x = env.context()
    z = (torch.eye(10, dtype=torch.float64)[:, :, None] * (x / x.norm())[None, None, :]).flatten(1)
    phi = env.candidates()
    assert phi.shape == (10, env.network.n_params) == (10, 8 * 640 + 8) and env.dim == phi.shape[1]
    assert float((phi @ phi.T - ntk_gram(env.network, z)).abs().max()) < 1e-12
    direct = ntk_features(env.network, z[:1])  # gradient of net by autograd, one row
    zz = z[:1].clone()
    w = [p for p in env.network.parameters()]
    with torch.enable_grad():
        for p in w:
            p.requires_grad_(True)
        grads = torch.autograd.grad(env.network.net(zz).sum(), w)
    assert torch.allclose(direct[0], torch.cat([g.flatten() for g in grads]), atol=1e-14)
    twin = DigitsEnv(n_samples=50, features="ntk", ntk_width=8)
    assert torch.equal(twin.candidates(), phi)  # the network's weights are seeded
    with pytest.raises(ValueError, match="features"):
        DigitsEnv(features="pixels")
    with pytest.raises(ValueError, match="ntk_width"):
        DigitsEnv(features="ntk", ntk_width=0)


@pytest.mark.parametrize("features", ["joint", "ntk"])
def test_registry_policies_run_on_digits(features: str) -> None:
    env = make_env("digits", features=features, ntk_width=4)
    rnd = simulate(RandomPolicy(), env, 100, seed=1).final_regret
    regrets = {name: simulate(make_policy(name, env), env, 100, seed=1).final_regret
               for name in ("kucb", "ekucb", "gpucb")}
    assert all(0 <= r <= 100 for r in regrets.values())
    assert regrets["kucb"] < rnd and regrets["gpucb"] < rnd
    # OPNN plays a fixed arm set (Hong et al. 2023, Alg. 5): a contextual stream is refused
    opnn = make_policy("opnn", env, horizon=10)
    with pytest.raises(ValueError, match="fixed arm set"):
        simulate(opnn, env, 3, seed=1)

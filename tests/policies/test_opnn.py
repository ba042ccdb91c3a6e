"""ReLU network, NTK Gram, TrainNN, OPNN / OPNN0 / ADA-OPNN (Hong, Li & Tewari, AISTATS 2023, §5)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.func import functional_call, jacrev, vmap

from torchbandits.design import ips_matrix
from torchbandits.envs.nonstationary import CosineBandit, SwitchingKernelEnv
from torchbandits.experiments import simulate
from torchbandits.models.neural import ReLUNetwork, ntk_gram, train_loss, train_nn
from torchbandits.policies.opnn import ADAOPNN, OPNN, OPNN0
from torchbandits.policies.random import RandomPolicy

D64 = torch.float64


def _jacobian_gram(net: ReLUNetwork, x: torch.Tensor) -> torch.Tensor:
    params = {k: v.detach() for k, v in net.named_parameters()}

    def f(p, xi):
        return functional_call(net, p, (xi.unsqueeze(0),)).squeeze()

    jac = vmap(jacrev(f), in_dims=(None, 0))(params, x)
    g = torch.cat([j.reshape(x.shape[0], -1) for j in jac.values()], dim=1)
    return g @ g.T / net.width          # G Gᵀ / m with G = ∇f = √m ∇net


@pytest.mark.parametrize("n_square", [0, 1, 3])
def test_ntk_gram_equals_jacobian_gram(n_square):
    g = torch.Generator().manual_seed(n_square)
    net = ReLUNetwork(5, 64, n_square, generator=g, dtype=D64)
    x = torch.randn(9, 5, generator=g, dtype=D64)
    ref = _jacobian_gram(net, x)
    got = ntk_gram(net, x)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-8)
    assert net.n_params == 64 * 5 + n_square * 64 * 64 + 64


def test_network_init_and_float32_gram():
    g = torch.Generator().manual_seed(0)
    net = ReLUNetwork(10, 512, 2, generator=g)
    assert net.weights[1].dtype == torch.float32
    assert float(net.weights[1].detach().std()) == pytest.approx(math.sqrt(2 / 512), rel=0.02)
    x = torch.randn(6, 10, generator=g)
    k32 = ntk_gram(net, x)
    net64 = ReLUNetwork(10, 512, 2, dtype=D64)
    with torch.no_grad():
        for a, b in zip(net64.weights, net.weights, strict=True):
            a.copy_(b.double())
    assert torch.allclose(k32, ntk_gram(net64, x.double()), rtol=1e-4)


def test_train_nn_zero_steps_and_decreasing_loss():
    g = torch.Generator().manual_seed(1)
    net = ReLUNetwork(4, 128, 1, generator=g, dtype=D64)
    for w in net.weights:
        w.requires_grad_(True)
    init = [w.detach().clone() for w in net.weights]
    arms = torch.randn(12, 4, generator=g, dtype=D64)
    counts = torch.randint(0, 5, (12,), generator=g).to(D64)
    y = torch.randn(12, generator=g, dtype=D64) * 0.5
    sums, sq = counts * y, counts * y * y
    train_nn(net, init, arms, counts, sums, lam=1.0, eta=1e-3, steps=0)
    assert all(torch.equal(w.detach(), w0) for w, w0 in zip(net.weights, init, strict=True))
    losses = [train_loss(net, init, arms, counts, sums, sq, 1.0)]
    for steps in (1, 5, 20):
        train_nn(net, init, arms, counts, sums, lam=1.0, eta=1e-4, steps=steps)
        losses.append(train_loss(net, init, arms, counts, sums, sq, 1.0))
    assert all(b < a for a, b in itertools.pairwise(losses))
    # restarting from W0 each call: the same steps give the same weights
    w_a = net.flat().clone()
    train_nn(net, init, arms, counts, sums, lam=1.0, eta=1e-4, steps=20)
    assert torch.equal(w_a, net.flat())


def _small_kwargs(**kw):
    base = dict(width=32, n_square_layers=1, eta=1e-4, train_steps=10, e_scale=0.05)
    base.update(kw)
    return base


def test_opnn0_frozen_and_opnn_current_map_bookkeeping():
    env = CosineBandit(16, 4, seed=1)
    frozen = OPNN0(800, seed=1, **_small_kwargs())
    simulate(frozen, env, 800, seed=1)
    assert frozen.n_trains == 0 and torch.equal(frozen.phi_cur, frozen.phi)
    pol = OPNN(800, seed=1, **_small_kwargs())
    simulate(pol, env, 800, seed=1)
    assert pol.n_trains == pol.j >= 2
    assert not torch.allclose(pol.phi_cur, pol.phi)
    # "current" map: every cached IPS matrix uses the newest feature map
    for m in range(pol.j + 1):
        assert torch.allclose(pol.ips[m], ips_matrix(pol.phi_cur, pol.strategies[m], pol.lam),
                              atol=1e-10)
    # γ, E come from the initial map and the two policies share W⁽⁰⁾ (same seed)
    assert pol.gamma_paper == pytest.approx(frozen.gamma_paper) and pol.E == frozen.E


def test_ada_opnn_sign_flip_and_regret():
    env = SwitchingKernelEnv(n_arms=10, dim=3, lengthscale=0.5, switches=(700,), seed=0)
    pol = ADAOPNN(2500, seed=0, **_small_kwargs(j_star=2, e_scale=0.02))
    res = simulate(pol, env, 2500, seed=0)
    rand = simulate(RandomPolicy(seed=0), env, 2500, seed=0)
    assert pol.restart_times and pol.restart_times[0] > 700
    assert res.final_regret < 0.7 * rand.final_regret
    # after a restart, block 0 plays the design of the initial feature map (restart_features="initial")
    assert res.diagnostics["train_seconds"][-1] > 0
    with pytest.raises(ValueError, match="feature_map"):
        ADAOPNN(100, feature_map="x")


def test_ada_opnn_state_dict_roundtrip():
    import copy

    env = SwitchingKernelEnv(n_arms=8, dim=3, lengthscale=0.5, switches=(300,), seed=2)
    kw = _small_kwargs(j_star=1, e_scale=0.02)
    pol = ADAOPNN(900, seed=3, **kw)
    env.reset(2)
    pol.reset(seed=3)
    for _ in range(250):
        i = pol.select(env.candidates())
        pol.update(env.candidates()[i], env.pull(i))
    clone = ADAOPNN(900, seed=0, **kw)
    clone.load_state_dict(pol.state_dict())
    env2 = copy.deepcopy(env)
    a, b = [], []
    for e, pl, out in ((env, pol, a), (env2, clone, b)):
        for _ in range(300):
            i = pl.select(e.candidates())
            out.append(i)
            pl.update(e.candidates()[i], e.pull(i))
    assert a == b and pol.n_trains == clone.n_trains

"""K-UCB / GP-UCB / Random: regret, state round trips, dtype, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchbandits import GPUCB, KernelUCB, RandomPolicy, RKHSFunctionEnv, make_kernel
from torchbandits.confidence import SrinivasBeta
from torchbandits.experiments import simulate


def _env() -> RKHSFunctionEnv:
    return RKHSFunctionEnv("rbf", dim=2, lengthscale=0.5, n_arms=100)


def _kucb(env: RKHSFunctionEnv, **kw) -> KernelUCB:
    return KernelUCB(make_kernel("rbf", 0.5), lam=1.0, beta=1.0, **kw)


def test_kucb_regret_far_below_random_and_sublinear():
    """Issue 2: K-UCB on the RKHS env (d=2, 100 arms, T=300, 3 seeds)."""
    env = _env()
    k_final, r_final = [], []
    for seed in (0, 1, 2):
        res = simulate(_kucb(env), env, 300, seed)
        rnd = simulate(RandomPolicy(), env, 300, seed)
        cum = res.cumulative_regret
        assert cum[-1] / 300 < cum[149] / 150  # per-round regret falls from T/2 to T
        k_final.append(cum[-1])
        r_final.append(rnd.final_regret)
    assert np.mean(k_final) < 0.25 * np.mean(r_final)


def test_gpucb_variants_beat_random():
    env = _env()
    gp = simulate(GPUCB(make_kernel("rbf", 0.5), norm_bound=env.norm, noise_std=0.1), env, 200, 3)
    sr = simulate(GPUCB(make_kernel("rbf", 0.5), lam=0.01, beta=SrinivasBeta()), env, 200, 3)
    rnd = simulate(RandomPolicy(), env, 200, 3)
    assert gp.final_regret < 0.5 * rnd.final_regret
    assert sr.final_regret < 0.5 * rnd.final_regret


def test_state_dict_roundtrip_continues_identically():
    env = _env()
    env.reset(5)
    a = _kucb(env, seed=5, n_warmup=3)
    for _ in range(40):
        c = env.candidates()
        i = a.select(c)
        a.update(c[i], env.pull(i))
    b = KernelUCB(make_kernel("rbf", 2.0), lam=1.0, beta=1.0, n_warmup=3)
    b.load_state_dict(a.state_dict())
    assert b.t == a.t and b.model.n == 40
    for _ in range(30):
        c = env.candidates()
        i, j = a.select(c), b.select(c)
        assert i == j
        torch.testing.assert_close(a(c), b(c), rtol=1e-12, atol=1e-12)
        r = env.pull(i)
        a.update(c[i], r)
        b.update(c[j], r)


def test_random_policy_generator_roundtrip():
    p = RandomPolicy(seed=11)
    c = torch.rand(50, 2, dtype=torch.float64)
    for _ in range(5):
        p.select(c)
    q = RandomPolicy(seed=0)
    q.load_state_dict(p.state_dict())
    assert [p.select(c) for _ in range(10)] == [q.select(c) for _ in range(10)]


def test_to_float32_and_back():
    env = _env()
    env.reset(0)
    p = _kucb(env)
    for _ in range(20):
        c = env.candidates()
        i = p.select(c)
        p.update(c[i], env.pull(i))
    c = env.candidates()
    s64 = p(c)
    p32 = p.to(torch.float32)
    assert p32.dtype == torch.float32
    s32 = p32(c)
    assert s32.dtype == torch.float32
    assert torch.allclose(s32.double(), s64, atol=1e-3)
    p32.update(c[0], 0.5)  # keeps working in float32
    assert p32.model.n == 21


def test_bad_input_raises_and_changes_nothing():
    env = _env()
    env.reset(0)
    p = _kucb(env)
    c = env.candidates()
    p.update(c[0], 0.3)
    before = {k: v.clone() for k, v in p.state_dict().items() if torch.is_tensor(v)}
    t_before = p.t
    cases = [
        (lambda: p.update(c[0], float("nan")), "reward must be finite"),
        (lambda: p.update(c[0, :1], 1.0), "x must have 2 entries"),
        (lambda: p.update(c[:2], 1.0), "x must be a 1-D"),
        (lambda: p.select(c[:0]), "candidates is empty"),
        (lambda: p.select(c[:, :1]), "candidates must have 2 columns"),
        (lambda: p.select(torch.full((3, 2), float("nan"))), "candidates must be finite"),
        (lambda: p(torch.zeros(2)), "candidates must be a 2-D"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    after = p.state_dict()
    assert p.t == t_before
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("kwargs, name", [({"lam": 0.0}, "lam"), ({"lam": -1.0}, "lam"),
                                          ({"beta": -0.1}, "beta"), ({"n_warmup": -1}, "n_warmup")])
def test_bad_constructor_arguments(kwargs, name):
    base = {"lam": 1.0, "beta": 1.0}
    base.update(kwargs)
    with pytest.raises(ValueError, match=name):
        KernelUCB(make_kernel("rbf", 0.5), **base)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    env = _env()
    cpu = simulate(_kucb(env), env, 60, 0)
    gpu_env = RKHSFunctionEnv("rbf", dim=2, lengthscale=0.5, n_arms=100, device="cuda")
    gpu = simulate(_kucb(gpu_env, device="cuda"), gpu_env, 60, 0)
    assert cpu.actions == gpu.actions

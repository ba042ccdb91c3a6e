"""GP baselines of Hong, Li & Tewari (2023, Section 6) and MASTER-GP-UCB (reconstructed from their
Appendix E and Wei & Luo 2021)."""

from __future__ import annotations

import copy
import math

import gpytorch
import pytest
import torch

from torchbandits.envs.nonstationary import SwitchingKernelEnv
from torchbandits.experiments import simulate
from torchbandits.kernels import make_kernel
from torchbandits.models.exact import exact_posterior_reference
from torchbandits.models.finite_arm import FiniteArmRidge
from torchbandits.models.weighted import DiscountedKernelRidge
from torchbandits.policies.op_baselines import GainBeta, gp_ucb, sw_gp_ucb, wgp_ucb
from torchbandits.policies.random import RandomPolicy

D64 = torch.float64


def _data(n_arms=9, n_obs=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    arms = torch.randn(n_arms, 3, generator=g, dtype=D64)
    arms = arms / arms.norm(dim=1, keepdim=True)
    idx = torch.randint(n_arms, (n_obs,), generator=g)
    y = torch.randn(n_obs, generator=g, dtype=D64) * 0.3
    return arms, idx, y


def test_gp_model_equals_exact_posterior_and_gpytorch():
    arms, idx, y = _data()
    kernel = make_kernel("rbf", 0.7)
    lam = 0.05
    model = FiniteArmRidge(kernel, lam, arms=arms)
    for i, yi in zip(idx, y, strict=True):
        model.append(arms[i], yi)
    mean, var = model.mean_var(arms)
    ref_mean, ref_var = exact_posterior_reference(kernel, arms[idx], y, arms, lam)
    assert torch.allclose(mean, ref_mean, atol=1e-9)
    assert torch.allclose(var, ref_var, atol=1e-9)
    # gpytorch exact GP with fixed hyper-parameters (zero mean, noise variance λ)
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    lik.noise = lam

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(arms[idx], y, lik)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = copy.deepcopy(kernel)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    gp = GP().double().eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        post = gp(arms)
    assert torch.allclose(mean, post.mean, atol=1e-7)
    assert torch.allclose(var, post.variance, atol=1e-7)
    # log det(V/λ) = log det(I + K_S/λ)
    ks = make_kernel("rbf", 0.7)(arms[idx]).to_dense()
    assert float(model.log_det()) == pytest.approx(
        float(torch.logdet(torch.eye(len(y), dtype=D64) + ks / lam)), rel=1e-9)


def test_sliding_window_downdate_equals_refit():
    arms, idx, y = _data(seed=1)
    kernel = make_kernel("rbf", 0.7)
    w = 15
    model = FiniteArmRidge(kernel, 0.1, arms=arms)
    for t, (i, yi) in enumerate(zip(idx, y, strict=True)):
        model.append(arms[i], yi)
        if model.n > w:
            model.remove_oldest(model.n - w)
        if t >= w:
            fresh = FiniteArmRidge(kernel, 0.1, arms=arms)
            for j in range(t - w + 1, t + 1):
                fresh.append(arms[idx[j]], y[j])
            m1, v1 = model.mean_var(arms)
            m2, v2 = fresh.mean_var(arms)
            assert torch.allclose(m1, m2, atol=1e-10) and torch.allclose(v1, v2, atol=1e-10)
    # the wrong-sign Sherman–Morrison removal (authors' code) would differ: sanity of the test
    v = model.v.clone()
    phi = model.phi[0]
    vinv = torch.linalg.inv(v)
    u = vinv @ phi
    right = vinv + torch.outer(u, u) / (1 - phi @ u)
    wrong = vinv + torch.outer(u, u) / (1 + phi @ u)
    exact = torch.linalg.inv(v - torch.outer(phi, phi))
    assert torch.allclose(right, exact, atol=1e-8) and not torch.allclose(wrong, exact, atol=1e-3)


@pytest.mark.parametrize("width", ["gp", "sandwich"])
def test_discounted_recursion_equals_explicit_weighted_sums(width):
    arms, idx, y = _data(seed=2)
    kernel = make_kernel("rbf", 0.7)
    eta, lam = 0.9, 0.2
    model = FiniteArmRidge(kernel, lam, discount=eta, width=width, arms=arms)
    for i, yi in zip(idx, y, strict=True):
        model.append(arms[i], yi)
    n = len(y)
    wts = eta ** torch.arange(n - 1, -1, -1, dtype=D64)
    phi = model.phi[idx]
    v = phi.T @ (wts[:, None] * phi) + lam * torch.eye(9, dtype=D64)
    v2 = phi.T @ ((wts**2)[:, None] * phi) + lam * torch.eye(9, dtype=D64)
    b = phi.T @ (wts * y)
    vinv = torch.linalg.inv(v)
    mean_ref = model.phi @ vinv @ b
    if width == "gp":
        var_ref = lam * ((model.phi @ vinv) * model.phi).sum(1)
    else:
        a = model.phi @ vinv
        var_ref = lam * ((a @ v2) * a).sum(1)
    mean, var = model.mean_var(arms)
    assert torch.allclose(mean, mean_ref, atol=1e-9) and torch.allclose(var, var_ref, atol=1e-9)
    # the kernel-form weighted model (DiscountedKernelRidge) agrees
    other = DiscountedKernelRidge(kernel, lam, eta, width="sandwich" if width == "sandwich" else "weighted",
                                  weight_floor=0.0)
    for i, yi in zip(idx, y, strict=True):
        other.append(arms[i], yi)
    m2, v2_ = other.mean_var(arms)
    assert torch.allclose(mean, m2, atol=1e-8) and torch.allclose(var, v2_, atol=1e-8)
    # no overflow for long runs with a small discount (stable recursion)
    long = FiniteArmRidge(kernel, lam, discount=0.99, arms=arms)
    for t in range(5000):
        long.append(arms[t % 9], 0.1)
    assert bool(torch.isfinite(long.mean_var(arms)[0]).all())


def test_baseline_policies_run_and_radius():
    env = SwitchingKernelEnv(n_arms=12, dim=3, lengthscale=0.5, switches=(400,), seed=0)
    rand = simulate(RandomPolicy(seed=0), env, 1200, seed=0).final_regret
    for pol in (gp_ucb(copy.deepcopy(env.kernel), 0.05, 0.05),
                sw_gp_ucb(copy.deepcopy(env.kernel), 0.05, 0.05, window=300),
                wgp_ucb(copy.deepcopy(env.kernel), 0.05, 0.5, 0.99)):
        res = simulate(pol, env, 1200, seed=0)
        assert res.final_regret < 0.8 * rand
    sw = sw_gp_ucb(copy.deepcopy(env.kernel), 0.05, 0.05, window=300)
    simulate(sw, env, 500, seed=0)
    assert sw.model.n == 300
    # Algorithm 8 radius: 1 + sqrt(2(γ + 1 + ln 1/δ)) with γ = ½ log det
    rule = GainBeta(1.0, delta=0.05)
    beta = float(rule.radius(sw.model, 12, 501))
    gamma = 0.5 * float(sw.model.log_det())
    assert beta == pytest.approx(1 + math.sqrt(2 * (gamma + 1 + math.log(20))))
    with pytest.raises(ValueError, match="arms"):
        sw.update(torch.full((3,), 3.0, dtype=D64), 0.0)


def test_master_gp_ucb_reconstructed():
    from torchbandits.policies.master import MasterGPUCB

    env = SwitchingKernelEnv(n_arms=10, dim=3, lengthscale=0.5, switches=(1000,), seed=1)
    calm = MasterGPUCB(copy.deepcopy(env.kernel), 2000, lam=0.05, ucb_scale=0.05)
    res = simulate(calm, env, 2000, seed=1)
    assert calm.restart_times == []                      # C_M = 1: thresholds far above gaps
    # blocks double: block n starts at round 2^n (diagnostics[i] describes round i + 2)
    blocks = res.diagnostics["block"]
    assert blocks[0] == 1.0
    starts = [i + 3 for i in range(len(blocks) - 1) if blocks[i + 1] != blocks[i]]
    assert starts[:5] == [4, 8, 16, 32, 64]
    # probability of scheduling order m in block n is ρ(2^n)/ρ(2^m) = 2^{(m−n)/2}
    assert calm.rho(2**6) / calm.rho(2**2) == pytest.approx(2 ** ((2 - 6) / 2))
    eager = MasterGPUCB(copy.deepcopy(env.kernel), 2000, lam=0.05, ucb_scale=0.05, c_master=1e-5)
    res2 = simulate(eager, env, 2000, seed=1)
    after = sum(t > 1000 for t in eager.restart_times)
    assert after > 3 * (len(eager.restart_times) - after)   # the tests fire mostly after the switch
    rand = simulate(RandomPolicy(seed=1), env, 2000, seed=1)
    assert res2.final_regret < rand.final_regret


def test_code_convention_scales_the_radius_by_one_over_lambda():
    kernel = make_kernel("rbf", 0.5)
    std = sw_gp_ucb(kernel, 0.05, 0.01, window=10)
    code = sw_gp_ucb(kernel, 0.05, 0.01, window=10, convention="aistats2023_code")
    assert code.rule.scale == pytest.approx(std.rule.scale / 0.05)
    assert gp_ucb(kernel, 0.2, 0.5, convention="aistats2023_code").rule.scale == pytest.approx(2.5)
    with pytest.raises(ValueError, match="convention"):
        gp_ucb(kernel, 0.2, 0.5, convention="x")

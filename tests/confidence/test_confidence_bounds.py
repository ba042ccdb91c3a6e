"""Bounds of Flynn & Reeb (2024): golden values (from an independent numpy/CVXPY check), the ordering
CMM ≤ DMM ≤ AMM < AY (their Lemma 4.2, Cor. 4.3, Thm. 6.3), recursion vs scratch, coverage."""

from __future__ import annotations

import math

import pytest
import torch

from torchbandits.confidence import AYBeta, IGPBeta
from torchbandits.confidence.mixture import (
    DMM_GRID,
    AMMBound,
    CMMBound,
    DMMBound,
    amm_beta,
    default_c,
    radius_sq,
    rtilde_sq,
    rtilde_sq_matched,
)
from torchbandits.envs.rkhs import RKHSFunctionEnv
from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.policies import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB, RandomPolicy

F64 = torch.float64
X = torch.tensor([0.0, 0.2, 0.45, 0.7, 1.0], dtype=F64)[:, None]
Y = torch.tensor([0.5, 1.2, 0.8, -0.3, 0.1], dtype=F64)
Q = torch.tensor([0.1, 0.6, 1.5], dtype=F64)[:, None]
SIGMA, B, DELTA, C = 0.1, 10.0, 0.01, 1.0


def _golden_model() -> ExactKernelRidge:
    m = ExactKernelRidge(make_kernel("rbf", 0.5), 0.01, [g * 0.01 for g in DMM_GRID if g != 1.0])
    m.extend(X, Y)
    return m


def _t(v):
    return torch.tensor(v, dtype=F64)


# ----------------------------------------------------------------------------- golden values
def test_golden_radius_pieces():
    m = _golden_model()
    assert abs(float(m.log_det(0.01)) - 15.147163) < 1e-6
    r2 = radius_sq(m, SIGMA, C, DELTA)
    assert abs(float(r2) - 0.450188) < 1e-6
    assert abs(float(rtilde_sq(m, 0.01, r2, B)) - 1.243575) < 1e-6
    assert abs(float(rtilde_sq_matched(m, SIGMA, C, B, DELTA)) - 1.243575) < 1e-6
    grid = [float(rtilde_sq(m, g * 0.01, r2, B)) for g in DMM_GRID]
    assert grid == pytest.approx([0.519425, 0.669119, 1.243575, 3.062619, 9.855683], abs=1e-6)
    assert abs(float(amm_beta(m, SIGMA, C, B, DELTA)) - 11.151570) < 1e-6
    ay = AYBeta(B, SIGMA, lam=0.01, delta=DELTA).radius(m, 3, 6)
    assert abs(float(ay) - 14.935332) < 1e-6


def test_golden_posterior_and_closed_form_bounds():
    m = _golden_model()
    mean, var = m.mean_var(Q, reg=0.01)
    assert torch.allclose(mean, _t([0.934999, 0.164200, 1.346310]), atol=1e-6)
    assert torch.allclose(var.sqrt(), _t([0.073982, 0.079095, 0.648121]), atol=1e-6)
    u, l = AMMBound(SIGMA, B, DELTA, C).bounds(m, Q, 6)
    assert torch.allclose(u, _t([1.760017, 1.046233, 8.573879]), atol=1e-6)
    assert torch.allclose(l, _t([0.109980, -0.717833, -5.881258]), atol=1e-6)
    u, l = DMMBound(SIGMA, B, DELTA, C).bounds(m, Q, 6)
    assert torch.allclose(u, _t([1.573078, 0.704706, 7.814272]), atol=1e-6)
    assert torch.allclose(l, _t([0.334691, -0.517931, -5.881258]), atol=1e-6)


def test_golden_dual_cmm():
    m = _golden_model()
    u, l = CMMBound(SIGMA, B, DELTA, C).bounds(m, Q, 6)
    # the golden values come from a fine log-grid (upper bounds of the exact minimum)
    assert torch.allclose(u, _t([1.573077, 0.693866, 7.733671]), atol=2e-6)
    assert torch.allclose(l, _t([0.336612, -0.512368, -5.877202]), atol=2e-6)


def test_amm_at_alpha0_equals_eq14_and_lemma_c1():
    m = _golden_model()
    rule = AMMBound(SIGMA, B, DELTA, C)
    u0, l0 = rule.bounds(m, Q, 6)
    u1, l1 = rule.bound_at(m, Q, rule.alpha0)
    assert torch.allclose(u0, u1, atol=1e-10) and torch.allclose(l0, l1, atol=1e-10)
    # Lemma C.1: yᵀy − yᵀK(K+αI)⁻¹y = α yᵀ(K+αI)⁻¹y
    gram = kernel_matrix(m.kernel, X, X)
    for a in (0.003, 0.1, 2.0):
        lhs = Y @ Y - Y @ gram @ torch.linalg.solve(gram + a * torch.eye(5, dtype=F64), Y)
        assert abs(float(lhs - a * m.quad_y(a))) < 1e-10


def test_default_c_and_empty_model():
    assert default_c("rbf", 3, 1000) == 1.0
    assert default_c("matern52", 3, 1000) == pytest.approx(1000 ** (-3 / 11))
    assert default_c(make_kernel("matern32", 0.5), 3, 1000) == pytest.approx(0.1)
    assert default_c("matern32", 1, 50) == pytest.approx(50 ** (-1 / 5))
    with pytest.raises(ValueError, match="kernel"):
        default_c("linear", 3, 10)
    m = ExactKernelRidge(make_kernel("rbf", 0.5), 0.01)
    assert float(radius_sq(m, SIGMA, C, DELTA)) == pytest.approx(2 * SIGMA**2 * math.log(1 / DELTA))
    u, l = CMMBound(SIGMA, B, DELTA, C).bounds(m, Q, 1)
    assert torch.allclose(u, torch.full((3,), B, dtype=F64)) and torch.allclose(l, -u)
    u, _ = AMMBound(SIGMA, B, DELTA, C).bounds(m, Q, 1)
    assert torch.allclose(u, torch.full((3,), math.sqrt(B**2 + 2 * C * math.log(1 / DELTA)), dtype=F64))


def test_bad_arguments():
    with pytest.raises(ValueError, match="noise_std"):
        AMMBound(0.0, B)
    with pytest.raises(ValueError, match="delta"):
        DMMBound(SIGMA, B, delta=1.5)
    with pytest.raises(ValueError, match="method"):
        CMMBound(SIGMA, B, method="newton")
    with pytest.raises(ValueError, match="grid"):
        DMMBound(SIGMA, B, grid=())


# ----------------------------------------------------------------------------- orderings
@pytest.mark.parametrize("kernel, ls, d", [("rbf", 0.5, 1), ("matern52", 0.3, 3), ("matern32", 0.2, 2)])
def test_ordering_cmm_dmm_amm_ay(gen, kernel, ls, d):
    k = make_kernel(kernel, ls)
    c = default_c(kernel, d, 200)
    a0 = SIGMA**2 / c
    x = torch.rand(40, d, generator=gen, dtype=F64)
    env = RKHSFunctionEnv(kernel, d, ls)
    env.reset(3)
    y = env.f(x) + SIGMA * torch.randn(40, generator=gen, dtype=F64)
    cand = torch.rand(200, d, generator=gen, dtype=F64)
    m = ExactKernelRidge(k, a0, [g * a0 for g in DMM_GRID if g != 1.0])
    m.extend(x, y)
    cu, cl = CMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 41)
    du, dl = DMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 41)
    au, al = AMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 41)
    yu, yl = AYBeta(B, SIGMA, lam=a0, delta=DELTA).bounds(m, cand, 41)
    tol = 1e-10
    assert bool((cu <= du + tol).all()) and bool((du <= au + tol).all()) and bool((au < yu).all())
    assert bool((cl >= dl - tol).all()) and bool((dl >= al - tol).all()) and bool((al > yl).all())
    assert bool((cl <= cu).all())
    assert float((du - cu).max()) > 1e-4  # CMM is genuinely tighter somewhere


@pytest.mark.parametrize("use_t_eta", [False, True])
def test_amm_below_igp_at_matched_regulariser(gen, use_t_eta):
    eta = 0.05
    k = make_kernel("matern52", 0.4)
    x = torch.rand(30, 2, generator=gen, dtype=F64)
    y = torch.sin(4 * x.sum(1)) + SIGMA * torch.randn(30, generator=gen, dtype=F64)
    cand = torch.rand(100, 2, generator=gen, dtype=F64)
    m = ExactKernelRidge(k, 1.0 + eta)
    m.extend(x, y)
    amm = AMMBound(SIGMA, B, DELTA, c=SIGMA**2 / (1.0 + eta))
    assert amm.alpha0 == pytest.approx(1.0 + eta)
    au, al = amm.bounds(m, cand, 31)
    iu, il = IGPBeta(B, SIGMA, delta=DELTA, eta=eta, use_t_eta=use_t_eta).bounds(m, cand, 31)
    assert bool((au < iu).all()) and bool((al > il).all())


# ----------------------------------------------------------------------------- recursion vs scratch
def _scratch_bound(kernel, x, y, cand, alpha, a0, sigma, b, delta, sign=1.0):
    """Naive formulas with explicit solves (no factor reuse)."""
    n = x.shape[0]
    gram = kernel_matrix(kernel, x, x)
    eye = torch.eye(n, dtype=F64)
    kq = kernel_matrix(kernel, x, cand)
    r2 = (y @ torch.linalg.solve(eye + gram / a0, y) + sigma**2 * torch.logdet(eye + gram / a0)
          + 2 * sigma**2 * math.log(1 / delta))
    rt2 = torch.clamp(r2 + alpha * b**2 - alpha * y @ torch.linalg.solve(gram + alpha * eye, y), min=0)
    sol = torch.linalg.solve(gram + alpha * eye, kq)
    mu = sol.mT @ y
    rho = torch.sqrt(torch.clamp(kernel_diag(kernel, cand) - (kq * sol).sum(0), min=0))
    return mu + sign * torch.sqrt(rt2 / alpha) * rho, r2


def test_policy_recursive_state_matches_scratch(gen):
    env = RKHSFunctionEnv("matern52", 2, 0.5)
    c = default_c("matern52", 2, 400)
    pol = DMMUCB(env.kernel, SIGMA, B, DELTA, c)
    env.reset(5)
    for _ in range(400):
        cand = env.candidates()
        i = pol.select(cand)
        pol.update(cand[i], env.pull(i))
    m, a0 = pol.model, SIGMA**2 / c
    cand = torch.rand(50, 2, generator=gen, dtype=F64)
    r2 = radius_sq(m, SIGMA, c, DELTA)
    dmm_u, dmm_l = DMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 401)
    refs_u, refs_l = [], []
    for g in DMM_GRID:
        u, r2_ref = _scratch_bound(m.kernel, m.x, m.y, cand, g * a0, a0, SIGMA, B, DELTA)
        refs_u.append(u)
        refs_l.append(_scratch_bound(m.kernel, m.x, m.y, cand, g * a0, a0, SIGMA, B, DELTA, -1.0)[0])
    assert abs(float(r2 / r2_ref) - 1) < 1e-8
    ref_u, ref_l = torch.stack(refs_u).min(0).values, torch.stack(refs_l).max(0).values
    assert float(((dmm_u - ref_u).abs() / ref_u.abs().clamp(min=1e-3)).max()) < 1e-8
    assert float(((dmm_l - ref_l).abs() / ref_l.abs().clamp(min=1e-3)).max()) < 1e-8
    au, _ = AMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 401)
    assert torch.allclose(au, refs_u[2], rtol=1e-8, atol=1e-10)
    # the dual works on eigh(K); a fresh model (from-scratch factorisations) gives the same CMM
    fresh = ExactKernelRidge(m.kernel, a0)
    fresh.extend(m.x, m.y)
    fresh.refresh()
    cu, cl = CMMBound(SIGMA, B, DELTA, c).bounds(m, cand, 401)
    fu, fl = CMMBound(SIGMA, B, DELTA, c).bounds(fresh, cand, 401)
    assert torch.allclose(cu, fu, rtol=1e-8, atol=1e-10) and torch.allclose(cl, fl, rtol=1e-8, atol=1e-10)


# ----------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coverage_on_seeded_draws(seed):
    """f* inside [LCB, UCB] at every candidate and step, for every bound."""
    env = RKHSFunctionEnv("matern32", 1, 0.3, n_arms=30)
    c = default_c("matern32", 1, 80)
    a0 = SIGMA**2 / c
    pol = AMMUCB(env.kernel, SIGMA, B, DELTA, c, seed=seed)
    rules = [CMMBound(SIGMA, B, DELTA, c), DMMBound(SIGMA, B, DELTA, c), AMMBound(SIGMA, B, DELTA, c),
             AYBeta(B, SIGMA, lam=a0, delta=DELTA), IGPBeta(B, SIGMA, delta=DELTA, eta=2 / 80)]
    env.reset(seed)
    for t in range(80):
        cand, means = env.candidates(), env.mean_rewards()
        for rule in rules:
            u, lcb = rule.bounds(pol.model, cand, t + 1)
            assert bool((means <= u + 1e-9).all()) and bool((means >= lcb - 1e-9).all()), (t, rule)
        i = pol.select(cand)
        pol.update(cand[i], env.pull(i))


# ----------------------------------------------------------------------------- policies
def test_policies_beat_random_on_short_run():
    from torchbandits.experiments import simulate

    env = RKHSFunctionEnv("rbf", 2, 0.5)
    kw = dict(noise_std=SIGMA, norm_bound=B, delta=DELTA)
    pols = {"cmm": CMMUCB(env.kernel, c=1.0, **kw), "dmm": DMMUCB(env.kernel, c=1.0, **kw),
            "amm": AMMUCB(env.kernel, c=1.0, **kw), "ay": AYGPUCB(env.kernel, c=1.0, **kw),
            "igp": IGPUCB(env.kernel, eta=0.01, **kw)}
    rand = simulate(RandomPolicy(), env, 120, seed=4).final_regret
    for name, p in pols.items():
        reg = simulate(p, env, 120, seed=4).final_regret
        assert reg < 0.35 * rand, (name, reg, rand)
    # presets carry the matched regulariser; the rule gives the GP-sd bounds
    assert pols["dmm"].lam == pytest.approx(SIGMA**2)
    assert pols["igp"].lam == pytest.approx(1.01)


def test_notebook_runs(run_notebook):
    """notebooks/confidence_bounds.ipynb (Figure 1) executes at small size."""
    text = run_notebook("confidence_bounds.ipynb", timeout=120)
    for pair in ("CMM inside DMM", "DMM inside AMM", "AMM inside AY"):
        assert f"{pair} everywhere: True" in text


def test_mean_var_many_matches_separate_calls(gen):
    """ExactKernelRidge.mean_var_many (added for DMM: one kernel evaluation for the grid)."""
    k = make_kernel("matern32", 0.4)
    m = ExactKernelRidge(k, 0.05, [0.5, 0.005])
    m.extend(torch.rand(30, 2, generator=gen, dtype=F64), torch.randn(30, generator=gen, dtype=F64))
    cand = torch.rand(40, 2, generator=gen, dtype=F64)
    regs = (0.05, 0.5, 0.005, 1.7)  # three maintained, one from scratch
    for _ in range(2):  # second pass: the candidate cache is hit
        mean, var = m.mean_var_many(cand, regs)
        for i, r in enumerate(regs):
            mu, v = m.mean_var(cand, reg=r)
            assert torch.allclose(mean[i], mu, rtol=1e-12, atol=1e-12)
            assert torch.allclose(var[i], v, rtol=1e-12, atol=1e-12)
    m.append(torch.rand(2, generator=gen, dtype=F64), 0.3)  # the cache grows by one row
    mean, var = m.mean_var_many(cand, regs)
    for i, r in enumerate(regs):
        assert torch.allclose(var[i], m.mean_var(cand, reg=r)[1], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="columns"):
        m.mean_var_many(torch.rand(3, 5, dtype=F64), regs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bounds_match_cpu():
    dev = "cuda"
    cpu = _golden_model()
    extra = [g * 0.01 for g in DMM_GRID if g != 1.0]
    gpu = ExactKernelRidge(make_kernel("rbf", 0.5), 0.01, extra, device=dev)
    gpu.extend(X.to(dev), Y.to(dev))
    for rule in (AMMBound(SIGMA, B, DELTA, C), DMMBound(SIGMA, B, DELTA, C), CMMBound(SIGMA, B, DELTA, C)):
        u0, l0 = rule.bounds(cpu, Q, 6)
        u1, l1 = rule.bounds(gpu, Q.to(dev), 6)
        assert torch.allclose(u1.cpu(), u0, atol=1e-8) and torch.allclose(l1.cpu(), l0, atol=1e-8)

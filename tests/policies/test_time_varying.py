"""Seed 004: R-GP-UCB, SW-GP-UCB, TV-GP-UCB, W-GP-UCB, their widths, γ-providers and tuning."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torchbandits.confidence import ConstantBeta
from torchbandits.confidence.time_varying import (
    AnalyticGamma,
    ConstantGamma,
    GreedyGamma,
    RestartBeta,
    WindowBeta,
    regret_bound,
    theoretical_length,
    tune_by_bound,
    tv_beta,
    xi_factor,
)
from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge, exact_posterior_reference
from torchbandits.models.weighted import DiscountedKernelRidge, TimeDecayKernelRidge
from torchbandits.policies import GPUCB
from torchbandits.policies.time_varying import RGPUCB, SWGPUCB, TVGPUCB, WGPUCB

B, R, LAM, DELTA = 1.0, 0.1, 0.5, 0.05


def _problem(n: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cand = torch.rand(n, 2, generator=g, dtype=torch.float64)
    kern = make_kernel("rbf", 0.3)
    f = kernel_matrix(kern, cand, cand[:5]) @ torch.randn(5, generator=g, dtype=torch.float64)
    return kern, cand, f, g


def _run_pair(p1, p2, cand, f, g, steps):
    """Drive two policies on the same rewards; return max score gap and whether actions agree."""
    gap, same = 0.0, True
    for _ in range(steps):
        if p1.t >= p1.n_warmup:
            gap = max(gap, float((p1(cand) - p2(cand)).abs().max()))
        a1, a2 = p1.select(cand), p2.select(cand)
        same &= a1 == a2
        y = float(f[a1]) + 0.1 * float(torch.randn((), generator=g, dtype=torch.float64))
        p1.update(cand[a1], y)
        p2.update(cand[a2], y)
    return gap, same


# ------------------------------------------------------------------------- degenerate equivalences
def test_rgpucb_with_period_ge_T_is_gpucb():
    kern, cand, f, g = _problem()
    T = 30
    gamma = GreedyGamma(cand, kern, LAM)
    kw = dict(delta=DELTA)
    r = RGPUCB(kern, LAM, period=T, norm_bound=B, noise_std=R, gamma=gamma, tie_break="first",
               n_warmup=1, **kw)
    ref = GPUCB(kern, lam=LAM, beta=RestartBeta(B, R, LAM, gamma, **kw), n_warmup=1)
    gap, same = _run_pair(r, ref, cand, f, g, T)
    assert same and gap < 1e-12
    assert r.restarts == 1 and r.model.n == 0  # the reset after round T changes nothing before


def test_swgpucb_with_window_ge_T_is_gpucb():
    kern, cand, f, g = _problem(seed=1)
    T = 30
    gamma = GreedyGamma(cand, kern, LAM)
    sw = SWGPUCB(kern, LAM, window=T + 5, norm_bound=B, noise_std=R, gamma=gamma, horizon=T,
                 delta=DELTA, tie_break="first", n_warmup=1)
    ref = GPUCB(kern, lam=LAM, n_warmup=1,
                beta=WindowBeta(B, R, LAM, gamma, window=T + 5, horizon=T, delta=DELTA))
    gap, same = _run_pair(sw, ref, cand, f, g, T)
    assert same and gap < 1e-12


def test_tvgpucb_eps0_and_wgpucb_discount1_are_gpucb():
    kern, cand, f, _g = _problem(seed=2)
    for pol in (TVGPUCB(kern, LAM, 0.0, beta=1.3, tie_break="first", n_warmup=1),
                WGPUCB(kern, LAM, 1.0, beta=1.3, tie_break="first", n_warmup=1)):
        ref = GPUCB(kern, lam=LAM, beta=1.3, n_warmup=1)
        gap, same = _run_pair(pol, ref, cand, f, torch.Generator().manual_seed(5), 25)
        assert same and gap < 1e-10


# ------------------------------------------------------------------------- data selection
def test_rgpucb_block_sizes_and_beta_drop():
    kern, cand, f, _g = _problem()
    H = 7
    gamma = GreedyGamma(cand, kern, LAM)
    pol = RGPUCB(kern, LAM, period=H, norm_bound=B, noise_std=R, gamma=gamma, delta=DELTA)
    first = B + R / math.sqrt(LAM) * math.sqrt(2 * math.log(1 / DELTA))
    for t in range(1, 30):
        assert pol.model.n == (t - 1) % H
        beta = pol.rule.beta_at(pol.model, t)
        if (t - 1) % H == 0:
            assert beta == pytest.approx(first, rel=1e-15)
        i = pol.select(cand)
        pol.update(cand[i], float(f[i]))
    assert pol.restarts == 29 // H


def test_swgpucb_window_and_from_scratch_posterior():
    kern, cand, f, g = _problem(seed=3)
    w = 6
    pol = SWGPUCB(kern, LAM, window=w, beta=1.0)
    played = []
    for t in range(1, 26):
        assert pol.model.n == min(t - 1, w)
        i = pol.select(cand)
        y = float(f[i]) + 0.1 * float(torch.randn((), generator=g, dtype=torch.float64))
        pol.update(cand[i], y)
        played.append((cand[i], y))
        xs = torch.stack([p[0] for p in played[-w:]])
        ys = torch.tensor([p[1] for p in played[-w:]], dtype=torch.float64)
        assert torch.equal(pol.model.x, xs)
        mu, var = pol.model.mean_var(cand)
        mu_ref, var_ref = exact_posterior_reference(kern, xs, ys, cand, LAM)
        assert torch.allclose(mu, mu_ref, atol=1e-10) and torch.allclose(var, var_ref, atol=1e-10)
        chol_ref = torch.linalg.cholesky(kernel_matrix(kern, xs, xs) + LAM * torch.eye(len(xs),
                                                                                        dtype=xs.dtype))
        assert torch.allclose(pol.model.cholesky(), chol_ref, atol=1e-10)


def test_claim1_linear_kernel_primal_ridge():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    y = torch.randn(12, generator=g, dtype=torch.float64)
    c = torch.randn(9, 3, generator=g, dtype=torch.float64)
    model = ExactKernelRidge(make_kernel("linear"), LAM)
    model.extend(x, y)
    model.remove_oldest(4)  # sliding-window view of the last 8 points
    xs, ys = x[4:], y[4:]
    v = xs.T @ xs + LAM * torch.eye(3, dtype=torch.float64)
    mu_primal = c @ torch.linalg.solve(v, xs.T @ ys)
    var_primal = LAM * ((c @ torch.linalg.inv(v)) * c).sum(1)
    mu, var = model.mean_var(c)
    assert torch.allclose(mu, mu_primal, atol=1e-10) and torch.allclose(var, var_primal, atol=1e-10)


def test_empty_posterior_is_prior_and_random_tie_break():
    kern, cand, _f, _g = _problem()
    pol = RGPUCB(kern, LAM, period=3, beta=2.0)
    assert torch.allclose(pol(cand), 2.0 * kernel_diag(kern, cand).sqrt())
    firsts = {RGPUCB(kern, LAM, period=3, beta=2.0, seed=s).select(cand) for s in range(12)}
    assert len(firsts) > 3  # uniform over the flat UCB, not always index 0
    again = RGPUCB(kern, LAM, period=3, beta=2.0, seed=7)
    assert again.select(cand) == RGPUCB(kern, LAM, period=3, beta=2.0, seed=7).select(cand)


# ------------------------------------------------------------------------- β schedules
def test_restart_and_window_beta_formulas():
    gamma = ConstantGamma(0.0)
    prov = AnalyticGamma("rbf", 2)
    model = ExactKernelRidge(make_kernel("rbf", 0.3), LAM)
    model.extend(torch.rand(5, 2, dtype=torch.float64), torch.zeros(5))
    rb = RestartBeta(B, R, LAM, prov, delta=DELTA)
    want = B + (R / math.sqrt(LAM)) * math.sqrt(2 * prov(5) + 2 * math.log(1 / DELTA))
    assert rb.beta_at(model, 6) == want
    split = RestartBeta(B, R, LAM, prov, delta=DELTA, period=10, horizon=95, delta_split="per_block",
                        gamma_index="max")
    want = B + (R / math.sqrt(LAM)) * math.sqrt(2 * prov(10) + 2 * math.log(10 / DELTA))
    assert split.beta_at(model, 6) == pytest.approx(want, rel=1e-15)
    igp = RestartBeta(B, R, LAM, prov, delta=DELTA, mode="igp_ucb")
    assert igp.beta_at(model, 6) == B + R * math.sqrt(2 * (prov(5) + 1 + math.log(1 / DELTA)))
    T, w = 200, 12
    wb = WindowBeta(B, R, LAM, prov, window=w, horizon=T, delta=DELTA)
    betas = [wb.beta_at(model, t) for t in range(1, 40)]
    for t, b in enumerate(betas, start=1):
        assert b == B + (R / math.sqrt(LAM)) * math.sqrt(2 * prov(min(t, w)) + 2 * math.log(T / DELTA))
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(betas))
    assert len(set(betas[w - 1:])) == 1 and betas[w - 2] < betas[w - 1]
    assert tv_beta(0.0, B, R, LAM, 1 / DELTA) == RestartBeta(B, R, LAM, gamma, delta=DELTA).beta_at(
        ExactKernelRidge(make_kernel("rbf", 0.3), LAM), 1)
    realised = RestartBeta(B, R, LAM, "realised", delta=DELTA).beta_at(model, 6)
    assert realised == pytest.approx(tv_beta(0.5 * float(model.log_det()), B, R, LAM, 1 / DELTA))
    with pytest.raises(ValueError, match="same λ"):
        RestartBeta(B, R, LAM, GreedyGamma(torch.rand(4, 1, dtype=torch.float64),
                                           make_kernel("rbf", 0.3), lam=2 * LAM))


def test_greedy_gamma_properties():
    g = torch.Generator().manual_seed(0)
    cand = torch.rand(60, 2, generator=g, dtype=torch.float64)
    gam = GreedyGamma(cand, make_kernel("rbf", 0.2), 0.3, tight=True)
    vals = torch.tensor([gam(t) for t in range(80)])
    inc = vals[1:] - vals[:-1]
    assert (inc >= 0).all() and (inc[1:] <= inc[:-1] + 1e-12).all()
    picks = gam.picks[:5]  # the greedy set's own log det equals g_t
    xa = cand[picks]
    ld = torch.logdet(torch.eye(5, dtype=torch.float64) + kernel_matrix(gam.kernel, xa, xa) / 0.3)
    assert gam(5) == pytest.approx(0.5 * float(ld), rel=1e-10)
    assert GreedyGamma(cand, make_kernel("rbf", 0.2), 0.3)(5) == pytest.approx(gam(5) / (1 - math.exp(-1)))
    # linear kernel on the unit ball: g_t <= (d/2) ln(1 + t/(dλ))
    d, lam = 3, 0.5
    pts = torch.randn(200, d, generator=g, dtype=torch.float64)
    pts = pts / pts.norm(dim=1, keepdim=True) * torch.rand(200, 1, generator=g, dtype=torch.float64)
    lin = GreedyGamma(pts, make_kernel("linear"), lam, tight=True)
    bound = AnalyticGamma("linear", d, lam=lam, exact=True)
    assert all(lin(t) <= bound(t) + 1e-12 for t in range(1, 150))


# ------------------------------------------------------------------------- tuning
def test_theoretical_length_rules():
    T, gam = 1000, 16.0
    hs = [theoretical_length(T, gam, p) for p in (0.5, 1, 5, 20, 100)]
    assert all(a >= b for a, b in itertools.pairwise(hs)) and hs[0] > hs[-1]
    assert theoretical_length(T, gam, 5.0) == round(2.0 * math.sqrt(T / 5.0))
    assert [theoretical_length(T, gam, 5.0) <= theoretical_length(4 * T, gam, 5.0)] == [True]
    assert theoretical_length(T, gam, 0.0) == T
    assert theoretical_length(T, gam, 1e-9) == T and theoretical_length(T, gam, 1e9) == 1
    assert theoretical_length(4 * T, gam, None) == round(2.0 * math.sqrt(4 * T))
    ratio = theoretical_length(4 * T, gam, None) / theoretical_length(T, gam, None)
    assert ratio == pytest.approx(2, rel=0.02)
    h = tune_by_bound(T, 5.0, ConstantGamma(gam), B, R, LAM, DELTA)
    bounds = regret_bound(torch.arange(1, T + 1), T, 5.0, gam,
                          B + R / math.sqrt(LAM) * math.sqrt(2 * gam + 2 * math.log(1 / DELTA)), LAM)
    assert h == int(torch.argmin(bounds)) + 1 and 1 < h < T
    assert tune_by_bound(T, 50.0, ConstantGamma(gam), B, R, LAM, DELTA) < h
    assert xi_factor(10, LAM, gam) == pytest.approx(math.sqrt(2 * 10 * (1 + LAM) * gam) / LAM)


# ------------------------------------------------------------------------- reweighted models
def test_time_decay_model_matches_product_kernel_posterior():
    kern, cand, f, g = _problem(seed=6)
    eps, lam = 0.2, 0.3
    model = TimeDecayKernelRidge(kern, lam, eps, weight_floor=0.05)
    model._MAX_LOG_SCALE = 2.0  # force several rebases (base moves, old points dropped)
    xs, ys = [], []
    for t in range(1, 40):
        i = int(torch.randint(len(cand), (1,), generator=g))
        y = float(f[i]) + 0.1 * float(torch.randn((), generator=g, dtype=torch.float64))
        xs.append(cand[i])
        ys.append(y)
        model.append(cand[i], y)
        if t % 3:
            continue
        tau = model.tau  # the points still held (rebases drop those with ρ^{age} < floor)
        keep = tau.long() - 1
        x, yv = torch.stack(xs)[keep], torch.tensor(ys, dtype=torch.float64)[keep]
        assert torch.equal(tau, torch.arange(t - len(tau) + 1, t + 1, dtype=torch.float64))
        rho = math.sqrt(1 - eps)
        gram = kernel_matrix(kern, x, x) * rho ** (tau[:, None] - tau[None, :]).abs()
        kq = kernel_matrix(kern, x, cand) * (rho ** (t + 1 - tau))[:, None]
        a = torch.linalg.solve(gram + lam * torch.eye(len(tau), dtype=torch.float64), kq)
        mu, var = model.mean_var(cand)
        assert torch.allclose(mu, a.T @ yv, atol=1e-9)
        assert torch.allclose(var, 1 - (kq * a).sum(0), atol=1e-9)
    assert model.n < 30  # the floor dropped points older than log(0.05)/log(ρ)


def test_discounted_model_sandwich_matches_explicit_features():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(15, 3, generator=g, dtype=torch.float64)
    y = torch.randn(15, generator=g, dtype=torch.float64)
    c = torch.randn(6, 3, generator=g, dtype=torch.float64)
    lam, gam = 0.4, 0.8
    model = DiscountedKernelRidge(make_kernel("linear"), lam, gam, weight_floor=0.0)
    weighted = DiscountedKernelRidge(make_kernel("linear"), lam, gam, weight_floor=0.0, width="weighted")
    for xi, yi in zip(x, y):
        model.append(xi, yi)
        weighted.append(xi, yi)
    w = gam ** torch.arange(14, -1, -1, dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    v = x.T @ (w[:, None] * x) + lam * eye
    vt = x.T @ ((w * w)[:, None] * x) + lam * eye
    vinv = torch.linalg.inv(v)
    mu_primal = c @ vinv @ (x.T @ (w * y))
    sandwich = lam * ((c @ vinv @ vt @ vinv) * c).sum(1)
    mu, var = model.mean_var(c)
    assert torch.allclose(mu, mu_primal, atol=1e-10) and torch.allclose(var, sandwich, atol=1e-10)
    _, var_w = weighted.mean_var(c)
    assert torch.allclose(var_w, lam * ((c @ vinv) * c).sum(1), atol=1e-10)
    # truncation: with a floor only the points of weight >= floor are kept
    trunc = DiscountedKernelRidge(make_kernel("linear"), lam, 0.5, weight_floor=0.01)
    for xi, yi in zip(x, y):
        trunc.append(xi, yi)
    assert trunc.n == trunc.capacity == 7 and torch.equal(trunc.x, x[-7:])


# ------------------------------------------------------------------------- state and bad input
def test_state_dict_round_trip_continues_identically():
    kern, cand, f, _g = _problem(seed=8)
    for make in (lambda: SWGPUCB(kern, LAM, window=5, beta=1.0, seed=3),
                 lambda: RGPUCB(kern, LAM, period=4, beta=1.0, seed=3),
                 lambda: TVGPUCB(kern, LAM, 0.1, beta=1.0, seed=3),
                 lambda: WGPUCB(kern, LAM, 0.9, beta=1.0, seed=3)):
        a = make()
        for _ in range(9):
            i = a.select(cand)
            a.update(cand[i], float(f[i]))
        b = make()
        b.load_state_dict(a.state_dict())
        for _ in range(6):
            ia, ib = a.select(cand), b.select(cand)
            assert ia == ib
            a.update(cand[ia], float(f[ia]))
            b.update(cand[ib], float(f[ib]))


def test_bad_input_rejected_before_state_change():
    kern, cand, _f, _g = _problem()
    with pytest.raises(ValueError, match="window"):
        SWGPUCB(kern, LAM, window=0, beta=1.0)
    with pytest.raises(ValueError, match="horizon"):
        SWGPUCB(kern, LAM, window=5)
    with pytest.raises(ValueError, match="period"):
        RGPUCB(kern, LAM, period=0)
    with pytest.raises(ValueError, match="epsilon"):
        TVGPUCB(kern, LAM, 1.0)
    with pytest.raises(ValueError, match="discount"):
        WGPUCB(kern, LAM, 0.0)
    with pytest.raises(ValueError, match="budget"):
        theoretical_length(100, 4.0, -1.0)
    pol = SWGPUCB(kern, LAM, window=3, beta=ConstantBeta(1.0))
    pol.update(cand[0], 0.5)
    with pytest.raises(ValueError, match="reward"):
        pol.update(cand[1], float("nan"))
    assert pol.model.n == 1 and pol.t == 1


def test_window_cache_carried_through_removals_matches_resolve():
    from torchbandits.linalg import cholesky_remove_first
    from torchbandits.models.window import carry_cache_through_removal

    g = torch.Generator().manual_seed(9)
    m = torch.randn(9, 9, generator=g, dtype=torch.float64)
    chol = torch.linalg.cholesky(m @ m.T + 0.05 * torch.eye(9, dtype=torch.float64))
    kc = torch.randn(9, 4, generator=g, dtype=torch.float64)
    v = torch.linalg.solve_triangular(chol, kc, upper=False)
    direct = torch.linalg.solve_triangular(cholesky_remove_first(chol), kc[1:], upper=False)
    assert torch.allclose(carry_cache_through_removal(chol, v), direct, atol=1e-12)
    # a long sliding-window run: carried cache == re-solved cache == from-scratch posterior
    kern, cand, f, g = _problem(n=60, seed=10)
    fast = SWGPUCB(kern, 0.01, window=15, beta=1.0, carry_cache=True, seed=1)
    slow = SWGPUCB(kern, 0.01, window=15, beta=1.0, carry_cache=False, seed=1)
    assert fast.model.refresh_cache_every == 256
    fast.model.refresh_cache_every = 0  # never rebuild: all 285 removals carried
    gap, same = _run_pair(fast, slow, cand, f, g, 300)
    assert same and gap < 1e-8
    mu, var = fast.model.mean_var(cand)
    mu_ref, var_ref = exact_posterior_reference(kern, fast.model.x, fast.model.y, cand, 0.01)
    assert torch.allclose(mu, mu_ref, atol=1e-8) and torch.allclose(var, var_ref, atol=1e-10)


def test_theory_width_warns_on_kernel_above_one():
    big = make_kernel("rbf", 0.3, outputscale=2.0)
    with pytest.warns(UserWarning, match=r"k\(x, x\) <= 1"):
        RGPUCB(big, LAM, period=5)
    with pytest.warns(UserWarning, match=r"k\(x, x\) <= 1"):
        SWGPUCB(big, LAM, window=5, horizon=50)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_policies_run_on_cuda():
    kern, cand, f, _g = _problem()
    for pol in (RGPUCB(kern, LAM, 5, 1.0, device="cuda"), SWGPUCB(kern, LAM, 5, 1.0, device="cuda"),
                TVGPUCB(kern, LAM, 0.1, 1.0, device="cuda"), WGPUCB(kern, LAM, 0.9, 1.0, device="cuda")):
        c = cand.cuda()
        for _ in range(12):
            i = pol.select(c)
            pol.update(c[i], float(f[i]))
        assert pol(c).device.type == "cuda"

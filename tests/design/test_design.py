"""Convex programs of Hong, Li & Tewari (AISTATS 2023): factor invariance, γ_T, optimal design KKT
(Def. 4.2), OP (Algorithm 1) vs CVXPY, Lemma 4.4."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torchbandits.design import (
    barrier_newton,
    information_gain,
    information_gain_at,
    ips_matrix,
    kkt_certificate,
    lemma44_check,
    leverages,
    logdet_design,
    optimal_design,
    solve_logdet_program,
    solve_op,
)
from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models.features import cholesky_features, eigen_features

D64 = torch.float64


def _sphere(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=D64)
    return x / x.norm(dim=1, keepdim=True)


def _rbf_phi(n: int, d: int, ls: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = _sphere(n, d, seed)
    k = kernel_matrix(make_kernel("rbf", ls), x, x)
    return k, cholesky_features(k)


def _gaps(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 100)
    r = torch.randn(n, generator=g, dtype=D64)
    return scale * (r.max() - r)


def _random_dist(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 7)
    p = torch.rand(n, generator=g, dtype=D64) ** 3
    return p / p.sum()


# ------------------------------------------------------------------ item 1: factor invariance
def test_factor_invariance_cholesky_vs_eigen():
    k, phi_c = _rbf_phi(12, 3, 0.8, 0)
    phi_e = eigen_features(k)
    lam = 0.05
    p = _random_dist(12, 0)
    assert torch.allclose(ips_matrix(phi_c, p, lam), ips_matrix(phi_e, p, lam), atol=1e-8, rtol=0)
    assert torch.allclose(leverages(phi_c, p, lam), leverages(phi_e, p, lam), atol=1e-8, rtol=0)
    # kernel (push-through) form M = K (D K + λI)^{-1}
    m_kernel = k @ torch.linalg.inv(torch.diag(p) @ k + lam * torch.eye(12, dtype=D64))
    assert torch.allclose(ips_matrix(phi_e, p, lam), m_kernel, atol=1e-8, rtol=0)
    assert abs(float(logdet_design(phi_c, p, lam) - logdet_design(phi_e, p, lam))) < 1e-8
    dh = _gaps(12, 0)
    s_c = solve_op(phi_c, dh, alpha=0.5, beta=3.0, lam=lam, gamma=4.0)
    s_e = solve_op(phi_e, dh, alpha=0.5, beta=3.0, lam=lam, gamma=4.0)
    assert abs(s_c.certificate.objective - s_e.certificate.objective) < 1e-8
    assert torch.allclose(s_c.q, s_e.q, atol=1e-5)
    g_c = information_gain(phi_c, 1000, 10.0)
    g_e = information_gain(phi_e, 1000, 10.0)
    assert abs(g_c - g_e) < 1e-8


def test_factor_invariance_linear_raw_features():
    """Linear kernel: φ(x) = x (r = d) against the eigen root of K = XXᵀ (r = N)."""
    x = _sphere(15, 4, 3)
    k = x @ x.T
    phi_e = eigen_features(k)
    lam = 0.1
    p = _random_dist(15, 3)
    assert torch.allclose(ips_matrix(x, p, lam), ips_matrix(phi_e, p, lam), atol=1e-8, rtol=0)
    # log det differs by the constant (r − N) log λ only
    diff = float(logdet_design(phi_e, p, lam) - logdet_design(x, p, lam))
    assert abs(diff - (15 - 4) * math.log(lam)) < 1e-8
    assert abs(information_gain(x, 500, 5.0) - information_gain(phi_e, 500, 5.0)) < 1e-7


# ------------------------------------------------------------------ items 2-3: γ_T
def test_gamma_identity_and_lemma_c4():
    k, phi = _rbf_phi(16, 3, 0.7, 1)
    horizon, sigma = 2000, 20.0
    lam = sigma / horizon
    design = optimal_design(phi, lam)
    gamma = information_gain(phi, horizon, sigma, design=design.p)
    # γ_T = log det(I + (T/σ) D^{1/2} K D^{1/2}) at the design
    dh = torch.sqrt(design.p)
    direct = torch.logdet(torch.eye(16, dtype=D64) + horizon / sigma * dh[:, None] * k * dh[None, :])
    assert abs(gamma - float(direct)) < 1e-8
    for s in range(20):
        p = _random_dist(16, s)
        assert information_gain_at(phi, p, horizon, sigma) <= gamma + 1e-9
        # Lemma C.4: Σ P ‖φ‖²_{S(P)^{-1}} ≤ γ
        assert float(p @ leverages(phi, p, lam)) <= gamma + 1e-9
    assert information_gain(phi, horizon, sigma, convention="half") == pytest.approx(gamma / 2)


def test_gamma_identity_kernel_and_linear_bound():
    n, horizon, sigma = 10, 1000, 10.0
    phi = torch.eye(n, dtype=D64)
    design = optimal_design(phi, sigma / horizon)
    assert torch.allclose(design.p, torch.full((n,), 1.0 / n, dtype=D64), atol=1e-7)
    assert information_gain(phi, horizon, sigma) == pytest.approx(
        n * math.log(1 + horizon / (sigma * n)), rel=1e-9)
    x = _sphere(30, 3, 5)
    g = information_gain(x, horizon, sigma)
    assert g <= 3 * math.log(horizon / (sigma * 3) + 1) + 1e-9


# ------------------------------------------------------------------ item 4: design KKT on A
def test_optimal_design_kkt_on_subset():
    k, phi = _rbf_phi(20, 3, 0.6, 2)
    horizon, sigma = 1000, 10.0
    lam = sigma / horizon
    gamma = information_gain(phi, horizon, sigma)
    mask = torch.zeros(20, dtype=torch.bool)
    mask[[1, 4, 5, 9, 13, 17, 18]] = True
    res = optimal_design(phi, lam, subset=mask)
    assert float(res.p[~mask].abs().max()) == 0.0
    assert res.p.sum().item() == pytest.approx(1.0)
    lev = leverages(phi, res.p, lam)
    avg = float(res.p @ lev)
    assert float(lev[mask].max()) == pytest.approx(avg, rel=1e-7)
    support = res.p > 1e-6
    assert torch.allclose(lev[support], torch.full_like(lev[support], avg), rtol=1e-6)
    assert avg <= gamma + 1e-9
    # restricting by rows equals the design on chol(K_AA)
    phi_a = cholesky_features(k[mask][:, mask])
    res2 = optimal_design(phi_a, lam)
    assert torch.allclose(res.p[mask], res2.p, atol=1e-5)
    # single-arm subset: point mass
    one = torch.zeros(20, dtype=torch.bool)
    one[3] = True
    assert optimal_design(phi, lam, subset=one).p[3].item() == 1.0


# ------------------------------------------------------------------ item 5: OP
@pytest.mark.parametrize("beta", [0.5, 5.0, 80.0])
def test_op_matches_cvxpy_small(beta):
    _, phi = _rbf_phi(12, 3, 0.8, 4)
    dh = _gaps(12, 4)
    lam = 0.01
    newton = solve_logdet_program(phi, dh, 2.0 / beta, lam)
    ref = solve_logdet_program(phi, dh, 2.0 / beta, lam, solver="cvxpy")
    assert newton.solver == "newton"
    rel = abs(newton.certificate.objective - ref.certificate.objective)
    rel /= max(1.0, abs(ref.certificate.objective))
    assert rel < 1e-6
    assert newton.certificate.objective <= ref.certificate.objective + 1e-9
    assert newton.certificate.gap <= 1e-9


def test_op_kkt_and_lemma44_at_n100():
    _, phi = _rbf_phi(100, 10, 0.2, 5)
    horizon, sigma = 10_000, 100.0
    lam = sigma / horizon
    design = optimal_design(phi, lam)
    gamma = information_gain(phi, horizon, sigma, design=design.p)
    dh = _gaps(100, 5, 0.4)
    alpha = sigma / (4 * math.log(8 * horizon * math.log2(horizon) * 100 / 1e-4))
    for beta in (gamma / 13.8, 4 * gamma):
        res = solve_op(phi, dh, alpha=alpha, beta=beta, lam=lam, gamma=gamma)
        assert res.certificate.gap <= 1e-7
        g = res.certificate.grad
        gbar = float(res.p_star @ g)
        assert float(g.min()) >= gbar - 1e-7
        # P* certificate consequences (§3.1)
        assert float(res.p_star @ dh) <= 2 * gamma / beta + 1e-7
        lev_p = leverages(phi, res.p_star, lam)
        assert bool((lev_p <= beta * dh / 2 + gamma + 1e-6).all())
        slack = lemma44_check(phi, res.q, dh, alpha, beta, gamma, lam)
        assert min(slack.values()) >= -1e-7, slack
        assert bool(res.a_mask[torch.argmin(dh)])


def test_warm_start_and_fallback_chain():
    _, phi = _rbf_phi(30, 4, 0.5, 6)
    dh = _gaps(30, 6)
    cold = solve_logdet_program(phi, dh, 0.1, 0.01)
    warm = solve_logdet_program(phi, dh * 1.01, 0.1, 0.01, warm_start=cold.p)
    again = solve_logdet_program(phi, dh * 1.01, 0.1, 0.01)
    assert abs(warm.certificate.objective - again.certificate.objective) < 1e-9
    # an unreachable certificate and no CVXPY: a clear error naming the attempts
    with pytest.raises(RuntimeError, match="KKT certificate"):
        solve_logdet_program(phi, dh, 0.1, 0.01, kkt_tol=-1.0, cvxpy_max_n=0)
    with pytest.raises(ValueError, match="lam"):
        solve_logdet_program(phi, dh, 0.1, -1.0)
    with pytest.raises(ValueError, match="delta_hat"):
        solve_op(phi, dh - 1.0, alpha=1.0, beta=1.0, lam=0.01, gamma=1.0)


def test_newton_in_float32_free_of_global_rng():
    _, phi = _rbf_phi(10, 3, 0.8, 7)
    state = torch.random.get_rng_state()
    p, info = barrier_newton(phi, _gaps(10, 7), 0.5, 0.01)
    assert info.converged and torch.equal(state, torch.random.get_rng_state())
    assert kkt_certificate(phi, p, _gaps(10, 7), 0.5, 0.01).gap < 1e-9


# ------------------------------------------------------------------ item 6: monotone in β
def test_op_monotone_in_beta_and_small_beta_limit():
    _, phi = _rbf_phi(25, 3, 0.7, 8)
    dh = _gaps(25, 8)
    lam = 0.01
    exploit = []
    for beta in (0.01, 0.1, 1.0, 10.0, 100.0):
        sol = solve_logdet_program(phi, dh, 2.0 / beta, lam)
        exploit.append(float(sol.p @ dh))
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(exploit))
    assert exploit[0] > exploit[-1] + 0.1
    tiny = solve_logdet_program(phi, dh, 2.0 / 1e-6, lam).p
    design = optimal_design(phi, lam).p
    assert torch.allclose(tiny, design, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_newton_on_cuda_matches_cpu():
    _, phi = _rbf_phi(40, 4, 0.5, 9)
    dh = _gaps(40, 9)
    cpu = solve_logdet_program(phi, dh, 0.3, 0.01)
    gpu = solve_logdet_program(phi.cuda(), dh.cuda(), 0.3, 0.01)
    assert gpu.p.device.type == "cuda" and gpu.certificate.gap <= 1e-9
    assert abs(cpu.certificate.objective - gpu.certificate.objective) < 1e-9


def test_design_modules_import_without_a_cycle():
    """The modules of ``torchbandits.design`` import each other strictly downward (no cycle,
    no import deferred into a function to hide one)."""
    import ast
    from pathlib import Path

    import torchbandits.design as pkg

    root = Path(pkg.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        if path.stem == "__init__":
            continue
        deps = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                deps.add(node.module.split(".")[0])
    assert graph["op"] >= {"logdet", "optimal_design"} and "op" not in graph["optimal_design"]
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        assert name not in stack, f"import cycle: {' -> '.join((*stack, name))}"
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, (*stack, name))
        done.add(name)

    for name in graph:
        visit(name, ())

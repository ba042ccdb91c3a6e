"""The one α search of the CMM dual (Flynn & Reeb 2024, Eq. 12): the search itself, its value
against explicit solves of Eq. (14), and the bordered eigenbasis against a fresh ``eigh``."""

from __future__ import annotations

import math

import pytest
import torch

from torchbandits.confidence.alpha_search import dual_objective, log_alpha_grid, min_over_alpha
from torchbandits.confidence.cmm_border import border_dual_bounds, stale_spectrum
from torchbandits.confidence.cmm_dual import CMMBound, dual_bounds, spectrum
from torchbandits.confidence.mixture import default_c
from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge

F64 = torch.float64


def _model(n: int, seed: int = 0, kernel: str = "matern52") -> tuple[ExactKernelRidge, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=gen, dtype=F64)
    y = torch.sin(3.0 * x).sum(1) + 0.1 * torch.randn(n, generator=gen, dtype=F64)
    m = ExactKernelRidge(make_kernel(kernel, 0.5), 0.01)
    m.extend(x, y)
    return m, torch.rand(40, 3, generator=gen, dtype=F64)


def test_min_over_alpha_newton_finds_the_minimum_of_smooth_unimodal_functions():
    """Per query ``h(s) = a (s − s*)² + b cosh(s − s*) + c``: the minimum c + b at s*."""
    gen = torch.Generator().manual_seed(0)
    grid = log_alpha_grid(0.05, 6.0, 4, dtype=F64)
    s_star = grid[0] + (grid[-1] - grid[0]) * torch.rand(25, generator=gen, dtype=F64)
    a, b = torch.rand(25, generator=gen, dtype=F64) + 0.1, torch.rand(25, generator=gen, dtype=F64)
    c = torch.randn(25, generator=gen, dtype=F64)

    def h(s: torch.Tensor) -> torch.Tensor:
        return a * (s - s_star) ** 2 + b * torch.cosh(s - s_star) + c

    def slopes(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e = s - s_star
        return h(s), 2 * a * e + b * torch.sinh(e), 2 * a + b * torch.cosh(e)

    best, s_best = min_over_alpha(slopes, h, grid, h(grid[:, None]), steps=3)
    assert torch.allclose(best, c + b, rtol=0, atol=1e-13)
    assert torch.allclose(h(s_best), best, rtol=0, atol=0)  # the returned point gives the value
    best0, _ = min_over_alpha(slopes, h, grid, h(grid[:, None]), steps=0)
    assert torch.equal(best0, h(grid[:, None]).min(0).values)  # no steps: the grid minimum


def test_min_over_alpha_bisects_where_the_curvature_is_negative():
    """``h = |s − s*|`` (a kink; slopes ±1, curvature −1 as the clamped dual reports): bisection
    halves the bracket each step, and the best value is the smallest one evaluated."""
    grid = torch.linspace(-3.0, 3.0, 7, dtype=F64)
    s_star = torch.tensor([0.3, -0.45], dtype=F64)

    def h(s: torch.Tensor) -> torch.Tensor:
        return (s - s_star).abs()

    def slopes(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return h(s), torch.sign(s - s_star), -torch.ones_like(s)

    best, s_best = min_over_alpha(slopes, h, grid, h(grid[:, None]), steps=6)
    assert torch.equal(h(s_best), best) and bool((best <= 2.0 / 2**6).all())


def _dense_min(m: ExactKernelRidge, q: torch.Tensor, r2: torch.Tensor, norm_bound: float, sign: float,
               lo: torch.Tensor, hi: torch.Tensor, iters: int = 90) -> torch.Tensor:
    """Golden-section search of ``σμ_α + sqrt(R̃²_α/α) ρ_α`` (Eq. 14) in ``[lo, hi]`` (log α), each
    value by a Cholesky solve of ``K + αI`` (no eigenbasis)."""
    gram, kq = kernel_matrix(m.kernel, m.x, m.x), kernel_matrix(m.kernel, m.x, q)
    kd, eye = kernel_diag(m.kernel, q), torch.eye(m.n, dtype=F64)

    def h(s: torch.Tensor) -> torch.Tensor:
        a = torch.exp(s)
        z = torch.cholesky_solve(torch.stack([m.y.expand(len(s), -1), kq.mT], -1),
                                 torch.linalg.cholesky(gram[None] + a[:, None, None] * eye))
        mu, quad, drop = (kq.mT * z[..., 0]).sum(1), (m.y * z[..., 0]).sum(1), (kq.mT * z[..., 1]).sum(1)
        g = torch.clamp(r2 / a + norm_bound**2 - quad, min=0.0)
        return sign * mu + torch.sqrt(g * torch.clamp(kd - drop, min=0.0))

    gold = (3.0 - math.sqrt(5.0)) / 2.0
    u, v = lo + gold * (hi - lo), hi - gold * (hi - lo)
    hu, hv = h(u), h(v)
    for _ in range(iters):
        left = hu < hv
        lo, hi = torch.where(left, lo, u), torch.where(left, v, hi)
        u, v = lo + gold * (hi - lo), hi - gold * (hi - lo)
        hu, hv = h(u), h(v)
    return torch.minimum(torch.minimum(hu, hv), norm_bound * kd.sqrt())


@pytest.mark.parametrize(("kernel", "seed", "r2", "norm_bound"),
                         [("matern52", 0, 2.5, 10.0), ("rbf", 1, 1.0, 5.0), ("matern32", 2, 4.0, 20.0)])
def test_newton_search_meets_a_dense_reference_minimum_in_both_paths(kernel, seed, r2, norm_bound):
    """Fresh eigenbasis and stale eigenbasis + border of 1, 5, 16 points: within 1e-12 (relative,
    absolute below 1) of a golden-section minimum by explicit solves, in a bracket of a 1201-point grid."""
    m, q = _model(90, seed=seed, kernel=kernel)
    kq, kd, r2t = kernel_matrix(m.kernel, m.x, q), kernel_diag(m.kernel, q), torch.tensor(r2, dtype=F64)
    fu, fl, _ = dual_bounds(spectrum(m), kq, kd, r2t, norm_bound, 0.07)
    fine = log_alpha_grid(0.07, 6.0, 100, dtype=F64)
    found = {1.0: fu, -1.0: fl}
    spec = spectrum(m)
    p, w = spec.evecs.mT @ kq, 1.0 / (spec.evals[:, None] + torch.exp(fine)[None])  # [t, A], [t, G]
    for sign in (1.0, -1.0):
        h_fine = dual_objective(sign * (w.mT @ (p * spec.ytil[:, None])), w.mT @ (p * p),
                                ((spec.ytil**2) @ w)[:, None], torch.exp(fine)[:, None], r2t, norm_bound, kd)
        j = h_fine.argmin(0)
        ref = sign * _dense_min(m, q, r2t, norm_bound, sign, fine[(j - 1).clamp(min=0)],
                                fine[(j + 1).clamp(max=len(fine) - 1)])
        tol = 1e-12 * torch.clamp(ref.abs(), min=1.0)
        assert bool(((found[sign] - ref).abs() <= tol).all())
        for s in (89, 85, 74):  # borders of 1, 5 and 16 points
            old = stale_spectrum(m.kernel, m.x[:s], m.y[:s], None, 16)
            stale = stale_spectrum(m.kernel, m.x, m.y, old, 16)
            bu, bl, _ = border_dual_bounds(stale, m.kernel, m.x, m.y, q, kd, r2t, norm_bound, 0.07)
            assert bool((((bu if sign > 0 else bl) - ref).abs() <= tol).all())


def test_dual_value_is_eq14_at_the_returned_alpha_by_explicit_solves():
    """``UCB = μ_α + sqrt(R̃²_α/α) ρ_α`` at ``α = exp(s)`` by a Cholesky solve of ``K + αI``."""
    m, q = _model(60)
    c = default_c("matern52", 3, 200)
    rule = CMMBound(0.1, 10.0, 0.01, c, refresh_every=0)
    spec = spectrum(m)
    kq, kd = kernel_matrix(m.kernel, m.x, q), kernel_diag(m.kernel, q)
    r2 = rule.radius_sq(m)
    ucb, _, s = dual_bounds(spec, kq, kd, r2, rule.norm_bound, rule.alpha0, which="ucb")
    assert torch.equal(ucb, rule.ucb(m, q, 61))
    y = m.y
    for i in range(0, 40, 7):
        a = math.exp(float(s[i]))
        chol = torch.linalg.cholesky(kernel_matrix(m.kernel, m.x, m.x) + a * torch.eye(60, dtype=F64))
        z = torch.cholesky_solve(torch.stack([y, kq[:, i]], 1), chol)
        mu, quad, drop = kq[:, i] @ z[:, 0], y @ z[:, 0], kq[:, i] @ z[:, 1]
        mult = torch.sqrt(torch.clamp(r2 / a + rule.norm_bound**2 - quad, min=0.0))
        want = mu + mult * torch.sqrt(torch.clamp(kd[i] - drop, min=0.0))
        assert abs(float(ucb[i] - min(want, rule.norm_bound * kd[i].sqrt()))) < 1e-10
        # and the model's own Eq. (14) at that α agrees
        bu, _ = rule.bound_at(m, q[i : i + 1], a, r2)
        assert abs(float(bu[0] - want)) < 1e-10


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_border_equals_fresh_eigh_to_1e10(steps):
    """Same search, same α points: the Schur border only re-associates the arithmetic. After one
    or two Newton steps the iterates agree only if the border's α-derivatives (``−aᵀM²b``,
    ``2aᵀM³b`` through the block solve applied twice) equal the eigenbasis ones."""
    m, q = _model(90, seed=3)
    kq, kd = kernel_matrix(m.kernel, m.x, q), kernel_diag(m.kernel, q)
    r2 = torch.tensor(2.5, dtype=F64)
    fu, fl, _ = dual_bounds(spectrum(m), kq, kd, r2, 10.0, 0.07, steps=steps)
    for s in (89, 85, 74):  # borders of 1, 5 and 16 points
        stale = stale_spectrum(m.kernel, m.x[:s], m.y[:s], None, 16)
        stale = stale_spectrum(m.kernel, m.x, m.y, stale, 16)
        assert stale.s == s
        bu, bl, _ = border_dual_bounds(stale, m.kernel, m.x, m.y, q, kd, r2, 10.0, 0.07, steps=steps)
        assert torch.allclose(bu, fu, rtol=0, atol=1e-10) and torch.allclose(bl, fl, rtol=0, atol=1e-10)


def test_cmm_rule_border_path_equals_fresh_along_growing_data():
    fresh = CMMBound(0.1, 10.0, 0.01, 0.2, refresh_every=0)
    border = CMMBound(0.1, 10.0, 0.01, 0.2, refresh_every=6, border_min_n=10)
    m, q = _model(40, seed=5, kernel="rbf")
    part = ExactKernelRidge(m.kernel, 0.01)
    sizes = set()
    for n in range(1, 41):
        part.extend(m.x[n - 1 : n], m.y[n - 1 : n])
        fu, fl = fresh.bounds(part, q, n + 1)
        bu, bl = border.bounds(part, q, n + 1)
        sizes.add(border.diagnostics().get("border", 0.0))
        assert torch.allclose(bu, fu, rtol=0, atol=1e-10) and torch.allclose(bl, fl, rtol=0, atol=1e-10)
    assert sizes >= {0.0, 1.0, 6.0}

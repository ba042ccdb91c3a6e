"""Incremental factorisations against from-scratch recomputation."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.linalg import (
    GrowingCholesky,
    bordered_inverse,
    cholesky_append,
    cholesky_rank_one_update,
    cholesky_remove_first,
    logdet_from_cholesky,
    safe_cholesky,
)
from torchbandits.models import ExactKernelRidge

from .conftest import rand


def _spd(gen: torch.Generator, n: int) -> torch.Tensor:
    a = rand(gen, n, n)
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_rank_one_update_matches_cholesky(gen):
    a = _spd(gen, 60)
    v = rand(gen, 60) - 0.5
    l_new = cholesky_rank_one_update(torch.linalg.cholesky(a), v)
    assert torch.equal(l_new, torch.tril(l_new))
    assert rel(l_new, torch.linalg.cholesky(a + torch.outer(v, v))) < 1e-12


def test_remove_first_and_append(gen):
    a = _spd(gen, 40)
    chol = torch.linalg.cholesky(a)
    assert rel(cholesky_remove_first(chol), torch.linalg.cholesky(a[1:, 1:])) < 1e-12
    row, d = cholesky_append(torch.linalg.cholesky(a[:-1, :-1]), a[:-1, -1], a[-1, -1])
    assert rel(row, chol[-1, :-1]) < 1e-12 and abs(float(d - chol[-1, -1])) < 1e-12
    assert abs(float(logdet_from_cholesky(chol) - torch.logdet(a))) < 1e-10


def test_bordered_inverse_chain(gen):
    a = _spd(gen, 120)
    inv = torch.linalg.inv(a[:1, :1])
    for k in range(1, 120):
        inv = bordered_inverse(inv, a[:k, k], a[k, k])
    assert rel(inv, torch.linalg.inv(a)) < 1e-10
    with pytest.raises(ValueError, match="Schur"):
        bordered_inverse(torch.eye(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64), 0.5)


def test_growing_cholesky_blocks_and_solve(gen):
    a = _spd(gen, 150)
    f = GrowingCholesky(block=16)
    for k in range(150):
        f.append_point(a[:k, k], a[k, k])
    chol = torch.linalg.cholesky(a)
    assert rel(f.dense(), chol) < 1e-12
    b = rand(gen, 150, 7)
    assert rel(f.solve(b), torch.linalg.solve_triangular(chol, b, upper=False)) < 1e-12
    assert rel(f.rows(140, 150), chol[140:150, :150]) < 1e-12
    f.remove_first()
    assert rel(f.dense(), torch.linalg.cholesky(a[1:, 1:])) < 1e-11


def test_safe_cholesky_adds_jitter_only_when_needed():
    x = torch.linspace(0, 1, 50, dtype=torch.float64)[:, None]
    k = kernel_matrix(make_kernel("rbf", 2.0), x, x)  # numerically singular
    chol, jitter = safe_cholesky(k)
    assert jitter > 0
    assert rel(chol @ chol.T, k) < 1e-6
    chol2, jitter2 = safe_cholesky(torch.eye(3, dtype=torch.float64))
    assert jitter2 == 0.0 and torch.equal(chol2, torch.eye(3, dtype=torch.float64))


def test_exact_model_1000_appends_500_removals(gen):
    """Issue 2: incremental Cholesky / log-det / posterior after 1,000 appends and 500 removals
    equal a from-scratch computation to 1e-8 relative."""
    kernel = make_kernel("matern52", 0.4)
    lam = 0.05
    model = ExactKernelRidge(kernel, lam)
    x = rand(gen, 1000, 3)
    y = torch.sin(6 * x.sum(1)) + 0.1 * torch.randn(1000, generator=gen, dtype=torch.float64)
    for i in range(1000):
        model.append(x[i], y[i])
    model.remove_oldest(500)
    xs, ys = x[500:], y[500:]
    gram = kernel_matrix(kernel, xs, xs) + lam * torch.eye(500, dtype=torch.float64)
    chol = torch.linalg.cholesky(gram)
    assert rel(model.cholesky(), chol) < 1e-8
    ld_ref = torch.logdet(gram) - 500 * torch.log(torch.tensor(lam, dtype=torch.float64))
    assert abs(float(model.log_det() - ld_ref)) / float(ld_ref) < 1e-8
    assert rel(model.weights(), torch.linalg.solve(gram, ys)) < 1e-8
    cand = rand(gen, 64, 3)
    kq = kernel_matrix(kernel, xs, cand)
    mu_ref = kq.T @ torch.linalg.solve(gram, ys)
    var_ref = 1.0 - (kq * torch.linalg.solve(gram, kq)).sum(0)
    mu, var = model.mean_var(cand)
    assert rel(mu, mu_ref) < 1e-8
    assert rel(var, var_ref) < 1e-8

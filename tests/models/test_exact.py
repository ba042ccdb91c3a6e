"""ExactKernelRidge: textbook GP formulas, kernel-ridge 1/λ scaling, caches, state."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge, exact_posterior_reference

from ..conftest import rand


def _fit(kernel, x, y, lam, **kw):
    m = ExactKernelRidge(kernel, lam, **kw)
    m.extend(x, y)
    return m


def test_matches_textbook_gp(gen):
    k = make_kernel("rbf", 0.3)
    x, y, c = rand(gen, 80, 2), rand(gen, 80), rand(gen, 30, 2)
    lam = 0.01
    m = _fit(k, x, y, lam)
    kxx = kernel_matrix(k, x, x)
    inv = torch.linalg.inv(kxx + lam * torch.eye(80, dtype=torch.float64))
    kq = kernel_matrix(k, x, c)
    mu, var = m.mean_var(c)
    assert torch.allclose(mu, kq.T @ inv @ y, rtol=1e-8, atol=1e-10)
    assert torch.allclose(var, 1 - torch.einsum("ia,ij,ja->a", kq, inv, kq), rtol=1e-7, atol=1e-10)


def test_ridge_scaling_in_feature_space(gen):
    """With a linear kernel φ(x) = x: μ = xᵀV⁻¹Φᵀy and ρ²/λ = xᵀV⁻¹x, V = λI + ΦᵀΦ
    (Zenati et al. 2022, §3.2)."""
    k = make_kernel("linear")
    x, y, c = rand(gen, 50, 4), rand(gen, 50), rand(gen, 9, 4)
    lam = 2.5
    m = _fit(k, x, y, lam)
    v = lam * torch.eye(4, dtype=torch.float64) + x.T @ x
    mu, var = m.mean_var(c)
    assert torch.allclose(mu, c @ torch.linalg.solve(v, x.T @ y), rtol=1e-10)
    ridge_var = torch.einsum("ad,de,ae->a", c, torch.linalg.inv(v), c)
    assert torch.allclose(var / lam, ridge_var, rtol=1e-9)


def test_empty_model_is_prior(gen):
    m = ExactKernelRidge(make_kernel("matern32", 0.5), 0.1)
    c = rand(gen, 5, 3)
    mu, var = m.mean_var(c)
    assert torch.equal(mu, torch.zeros(5, dtype=torch.float64))
    assert torch.equal(var, torch.ones(5, dtype=torch.float64))
    assert float(m.log_det()) == 0.0 and float(m.quad_y()) == 0.0


def test_fixed_candidate_cache_equals_fresh_computation(gen):
    k = make_kernel("matern52", 0.4)
    x, y, c = rand(gen, 200, 3), rand(gen, 200), rand(gen, 40, 3)
    cached = ExactKernelRidge(k, 0.05)
    plain = ExactKernelRidge(k, 0.05, cache_candidates=False)
    for i in range(200):
        cached.append(x[i], y[i])
        plain.append(x[i], y[i])
        if i % 3 == 0:  # skipped calls exercise multi-row catch-up and block folds
            mu_c, var_c = cached.mean_var(c)
            mu_p, var_p = plain.mean_var(c)
            assert torch.allclose(mu_c, mu_p, rtol=1e-9, atol=1e-11)
            assert torch.allclose(var_c, var_p, rtol=1e-9, atol=1e-11)
    cached.remove_oldest(10)
    plain.remove_oldest(10)
    assert torch.allclose(cached.mean_var(c)[1], plain.mean_var(c)[1], atol=1e-11)


def test_several_regularisers_and_scratch(gen):
    k = make_kernel("rbf", 0.25)
    x, y, c = rand(gen, 60, 2), rand(gen, 60), rand(gen, 20, 2)
    m = _fit(k, x, y, 0.01, extra_regularisers=(0.1, 1.0))
    for reg in (0.01, 0.1, 1.0, 0.37):  # 0.37 is not maintained: from scratch
        mu_ref, var_ref = exact_posterior_reference(k, x, y, c, reg)
        mu, var = m.mean_var(c, reg=reg)
        assert torch.allclose(mu, mu_ref, rtol=1e-8, atol=1e-10)
        assert torch.allclose(var, var_ref, rtol=1e-7, atol=1e-10)
        gram = kernel_matrix(k, x, x) + reg * torch.eye(60, dtype=torch.float64)
        assert torch.isclose(m.quad_y(reg), y @ torch.linalg.solve(gram, y), rtol=1e-9)
        ld = torch.logdet(gram / reg)
        assert torch.isclose(m.log_det(reg), ld, rtol=1e-9)


def test_refresh_and_state_dict_roundtrip(gen):
    k = make_kernel("rbf", 0.3)
    x, y, c = rand(gen, 70, 2), rand(gen, 70), rand(gen, 10, 2)
    m = _fit(k, x, y, 0.1, refresh_every=25)
    mu_ref, var_ref = exact_posterior_reference(k, x, y, c, 0.1)
    assert torch.allclose(m.mean_var(c)[0], mu_ref, rtol=1e-9)
    clone = ExactKernelRidge(make_kernel("rbf", 1.0), 0.1)
    clone.load_state_dict(m.state_dict())
    assert clone.n == 70 and float(clone.kernel.lengthscale) == pytest.approx(0.3)
    assert torch.allclose(clone.mean_var(c)[1], var_ref, rtol=1e-8, atol=1e-12)
    clone.append(x[0], 1.0)  # keeps working after the load
    assert clone.n == 71


def test_to_float32(gen):
    m = _fit(make_kernel("rbf", 0.3), rand(gen, 20, 2), rand(gen, 20), 0.1)
    m32 = m.to(torch.float32)
    mu, var = m32.mean_var(rand(gen, 4, 2))
    assert mu.dtype == torch.float32 and var.dtype == torch.float32


def test_bad_inputs_leave_model_unchanged(gen):
    m = _fit(make_kernel("rbf", 0.3), rand(gen, 10, 2), rand(gen, 10), 0.1)
    before = {k: v.clone() for k, v in m.state_dict().items() if torch.is_tensor(v)}
    with pytest.raises(ValueError, match="x must have 2"):
        m.append(torch.zeros(3, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="y must be finite"):
        m.append(torch.zeros(2, dtype=torch.float64), float("nan"))
    with pytest.raises(ValueError, match="x must be finite"):
        m.append(torch.tensor([0.1, float("inf")], dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="candidates is empty"):
        m.mean_var(torch.zeros(0, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="count"):
        m.remove_oldest(11)
    after = m.state_dict()
    assert m.n == 10
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="lam"):
        ExactKernelRidge(make_kernel("rbf", 0.3), 0.0)

"""NystromKernelRidge: incremental vs from scratch, special cases, both parametrisations."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.nystrom import NystromKernelRidge, nystrom_posterior_reference

PARAMS = ("whitened", "plain")


def _data(n: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x.sum(1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _kernel(ls: float = 0.4):
    return make_kernel("rbf", ls)


@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("lam", [0.1, 1.0, 10.0])
def test_full_dictionary_equals_exact(param: str, lam: float) -> None:
    """Every data point an anchor (EK-UCB order: append, then grow) ⇒ the exact posterior."""
    x, y = _data(40)
    cand, _ = _data(25, seed=1)
    nys = NystromKernelRidge(_kernel(), lam, parametrisation=param)
    exact = ExactKernelRidge(_kernel(), lam)
    for xi, yi in zip(x, y):
        nys.append(xi, yi)
        assert nys.add_to_dictionary(xi)
        exact.append(xi, yi)
    assert nys.m == nys.n == 40
    m1, v1 = nys.mean_var(cand)
    m2, v2 = exact.mean_var(cand)
    # cond(K_ZZ) ≈ 8e5 here: the whitened form keeps 1e-8 at every λ, the plain form (explicit
    # K_ZZ⁻¹ and Λ) loses digits to cancellation at small λ (measured 6e-7 at λ = 0.1)
    tol = 1e-8 if param == "whitened" else 1e-5
    assert torch.allclose(m1, m2, atol=tol, rtol=0)
    assert torch.allclose(v1, v2, atol=tol, rtol=0)
    # exact log det(I + K/λ) is recovered too
    assert abs(float(nys.log_det()) - float(exact.log_det())) < 1e3 * tol


@pytest.mark.parametrize("param", PARAMS)
def test_empty_dictionary_is_prior(param: str) -> None:
    x, y = _data(10)
    nys = NystromKernelRidge(_kernel(), 2.0, parametrisation=param)
    for xi, yi in zip(x, y):
        nys.append(xi, yi)
    mean, var = nys.mean_var(x)
    assert torch.equal(mean, torch.zeros(10, dtype=torch.float64))
    assert torch.allclose(var, kernel_diag(nys.kernel, x))
    assert float(nys.log_det()) == 0.0


@pytest.mark.parametrize("param", PARAMS)
def test_incremental_matches_from_scratch(param: str) -> None:
    """Random interleaving of data appends (no-grow branch) and anchor additions (grow branch)."""
    lam = 3.0
    x, y = _data(60)
    cand, _ = _data(30, seed=2)
    g = torch.Generator().manual_seed(5)
    nys = NystromKernelRidge(_kernel(), lam, parametrisation=param)
    anchors = []
    for i, (xi, yi) in enumerate(zip(x, y)):
        nys.append(xi, yi)
        if i == 0 or float(torch.rand((), generator=g)) < 0.35:
            assert nys.add_to_dictionary(xi)
            anchors.append(i)
        if i % 7 == 6 or i == 59:
            z = x[anchors]
            kzz = kernel_matrix(nys.kernel, z, z)
            ksz = kernel_matrix(nys.kernel, x[: i + 1], z)
            lam_ref = torch.linalg.inv(ksz.mT @ ksz + lam * kzz)
            gam_ref = ksz.mT @ y[: i + 1]
            rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
            assert rel(nys.Lambda, lam_ref) < 1e-6
            assert rel(nys.Gamma, gam_ref) < 1e-8
            assert rel(nys.kzz_inverse, torch.linalg.inv(kzz)) < 1e-6
            m1, v1 = nys.mean_var(cand)
            m2, v2 = nystrom_posterior_reference(nys.kernel, z, x[: i + 1], y[: i + 1], cand, lam)
            assert torch.allclose(m1, m2, atol=1e-8)
            assert torch.allclose(v1, v2, atol=1e-8)
            a = torch.eye(len(anchors), dtype=torch.float64) + torch.linalg.cholesky(kzz).mT.inverse().mT @ (
                ksz.mT @ ksz) @ torch.linalg.cholesky(kzz).mT.inverse() / lam
            assert abs(float(nys.log_det()) - float(torch.logdet(a))) < 1e-6
    # from-scratch rebuild gives the same posterior
    other = NystromKernelRidge(_kernel(), lam, parametrisation=param)
    other.rebuild(x[anchors], x, y)
    for a_, b_ in zip(nys.mean_var(cand), other.mean_var(cand)):
        assert torch.allclose(a_, b_, atol=1e-9)
    assert abs(float(nys.log_det()) - float(other.log_det())) < 1e-7


def test_parametrisations_agree() -> None:
    x, y = _data(50, d=6, seed=3)
    cand, _ = _data(20, d=6, seed=4)
    models = [NystromKernelRidge(_kernel(0.3), 10.0, parametrisation=p) for p in PARAMS]
    for i, (xi, yi) in enumerate(zip(x, y)):
        for mdl in models:
            mdl.append(xi, yi)
            if i % 3 == 0:
                mdl.add_to_dictionary(xi)
    (m1, v1), (m2, v2) = (mdl.mean_var(cand) for mdl in models)
    assert torch.allclose(m1, m2, atol=1e-10)
    assert torch.allclose(v1, v2, atol=1e-10)


@pytest.mark.parametrize("param", PARAMS)
def test_variance_bounds_and_far_candidate(param: str) -> None:
    x, y = _data(30)
    nys = NystromKernelRidge(_kernel(0.2), 1.0, parametrisation=param)
    for i, (xi, yi) in enumerate(zip(x, y)):
        nys.append(xi, yi)
        if i % 2 == 0:
            nys.add_to_dictionary(xi)
    cand = torch.cat([x, 50.0 + torch.rand(3, 3, dtype=torch.float64)])
    mean, var = nys.mean_var(cand)
    kd = kernel_diag(nys.kernel, cand)
    assert bool((var >= 0).all()) and bool((var <= kd + 1e-12).all())
    # the anchors (played, in the span) are better known than the prior: ρ² ≤ λ/(1+λ) k at λ = 1
    assert bool((var[:30:2] <= 0.5 * kd[:30:2] + 1e-12).all())
    # far from every anchor: prior mean and variance
    assert torch.allclose(mean[30:], torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(var[30:], kd[30:], atol=1e-12)


@pytest.mark.parametrize("param", PARAMS)
def test_counts_equal_repeated_rows(param: str) -> None:
    x, _ = _data(8)
    g = torch.Generator().manual_seed(1)
    counts = torch.randint(1, 4, (8,), generator=g).to(torch.float64)
    rewards = [torch.randn(int(c), generator=g, dtype=torch.float64) for c in counts]
    sums = torch.stack([r.sum() for r in rewards])
    rep_x = torch.cat([xi.expand(int(c), -1) for xi, c in zip(x, counts)])
    rep_y = torch.cat(rewards)
    cand, _ = _data(10, seed=9)
    a = NystromKernelRidge(_kernel(), 0.5, parametrisation=param)
    a.rebuild(x[:5], x, sums, counts)
    b = NystromKernelRidge(_kernel(), 0.5, parametrisation=param)
    b.rebuild(x[:5], rep_x, rep_y)
    for u, v in zip(a.mean_var(cand), b.mean_var(cand)):
        assert torch.allclose(u, v, atol=1e-10)
    # growth after a weighted rebuild uses the counts
    a.add_to_dictionary(x[6])
    ref = nystrom_posterior_reference(a.kernel, a.dictionary, x, sums, cand, 0.5, counts)
    for u, v in zip(a.mean_var(cand), ref):
        assert torch.allclose(u, v, atol=1e-8)


@pytest.mark.parametrize("param", PARAMS)
def test_duplicate_anchor_refused(param: str) -> None:
    x, y = _data(5)
    nys = NystromKernelRidge(_kernel(), 1.0, parametrisation=param)
    for xi, yi in zip(x, y):
        nys.append(xi, yi)
    assert nys.add_to_dictionary(x[0])
    before = {k: v.clone() for k, v in nys.state_dict().items() if isinstance(v, torch.Tensor)}
    assert not nys.add_to_dictionary(x[0].clone())
    assert nys.m == 1 and nys.refused == 1
    for k, v in nys.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k])


def test_bad_input_leaves_state() -> None:
    x, y = _data(6)
    nys = NystromKernelRidge(_kernel(), 1.0)
    for xi, yi in zip(x, y):
        nys.append(xi, yi)
        nys.add_to_dictionary(xi)
    ref = nys.mean_var(x)
    with pytest.raises(ValueError, match="reg"):
        nys.mean_var(x, reg=2.0)
    with pytest.raises(ValueError, match="y"):
        nys.append(x[0], float("nan"))
    with pytest.raises(ValueError, match="x"):
        nys.append(torch.zeros(4, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="candidates"):
        nys.mean_var(torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="lam"):
        NystromKernelRidge(_kernel(), 0.0)
    assert nys.n == 6
    for a, b in zip(ref, nys.mean_var(x)):
        assert torch.equal(a, b)


def test_state_dict_roundtrip() -> None:
    x, y = _data(20)
    a = NystromKernelRidge(_kernel(), 1.0)
    for i, (xi, yi) in enumerate(zip(x, y)):
        a.append(xi, yi)
        if i % 4 == 0:
            a.add_to_dictionary(xi)
    b = NystromKernelRidge(_kernel(), 1.0)
    b.load_state_dict(a.state_dict())
    for u, v in zip(a.mean_var(x), b.mean_var(x)):
        assert torch.equal(u, v)
    a.append(x[3], 0.5)
    b.append(x[3], 0.5)
    assert a.add_to_dictionary(x[5]) == b.add_to_dictionary(x[5])
    for u, v in zip(a.mean_var(x), b.mean_var(x)):
        assert torch.allclose(u, v, atol=1e-14)

"""Fast dense kernels equal the closed forms used in the experiments of Flynn & Reeb (2024,
Section 7) and GPyTorch's own evaluation."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from torchbandits.kernels import (
    kernel_diag,
    kernel_matrix,
    make_kernel,
    pairwise_sq_dist,
    product_kernel,
)

from .conftest import rand

CLOSED = {
    "rbf": lambda r: torch.exp(-(r**2) / 2),
    "matern12": lambda r: torch.exp(-r),
    "matern32": lambda r: (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r),
    "matern52": lambda r: (1 + math.sqrt(5) * r + 5 * r**2 / 3) * torch.exp(-math.sqrt(5) * r),
}


@pytest.mark.parametrize("name", list(CLOSED))
def test_stationary_closed_forms(name, gen):
    x, y = rand(gen, 30, 3), rand(gen, 20, 3)
    k = make_kernel(name, 0.37)
    r = torch.cdist(x, y) / 0.37
    assert torch.allclose(kernel_matrix(k, x, y), CLOSED[name](r), rtol=1e-12, atol=1e-13)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        assert torch.allclose(kernel_matrix(k, x, y), k(x, y).to_dense(), rtol=1e-10, atol=1e-12)
    assert torch.equal(kernel_diag(k, x), torch.ones(30, dtype=torch.float64))
    assert k.lengthscale.item() == 0.37  # exact in float64


def test_ard_scale_linear_and_product(gen):
    x, y = rand(gen, 10, 4), rand(gen, 12, 4)
    k = make_kernel("rbf", [0.3, 0.5, 0.7, 0.9], outputscale=2.5)
    ls = torch.tensor([0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    ref = 2.5 * torch.exp(-torch.cdist(x / ls, y / ls) ** 2 / 2)
    assert torch.allclose(kernel_matrix(k, x, y), ref, rtol=1e-12)
    lin = make_kernel("linear", variance=0.5, active_dims=[0, 1])
    act = make_kernel("matern32", 0.2, active_dims=[2, 3])
    prod = product_kernel(lin, act)
    r = torch.cdist(x[:, 2:], y[:, 2:]) / 0.2
    ref = 0.5 * (x[:, :2] @ y[:, :2].T) * CLOSED["matern32"](r)
    assert torch.allclose(kernel_matrix(prod, x, y), ref, rtol=1e-12)
    assert torch.allclose(kernel_diag(prod, x), torch.diagonal(kernel_matrix(prod, x, x)), rtol=1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_lengthscale(bad):
    with pytest.raises(ValueError, match="lengthscale"):
        make_kernel("rbf", bad)


def test_unknown_kernel():
    with pytest.raises(ValueError, match="kernel name"):
        make_kernel("cosine", 1.0)


@pytest.mark.parametrize("dim", [1, 2, 5])
def test_pairwise_sq_dist_broadcast_equals_cdist(dim: int) -> None:
    """The broadcast differences (the non-CPU way) equal ``cdist`` squared (the CPU way) to
    rounding, batched, and each is what ``broadcast`` picks."""
    g = torch.Generator().manual_seed(dim)
    a = torch.rand(3, 7, dim, generator=g, dtype=torch.float64)
    b = torch.rand(3, 5, dim, generator=g, dtype=torch.float64)
    b[0, 0] = a[0, 0]                                     # one zero distance
    # an independent reference: exactly rounded sums of the squared differences, pair by pair
    ref = torch.tensor([[[math.fsum((x - y) ** 2 for x, y in zip(a[r, i].tolist(), b[r, j].tolist()))
                          for j in range(5)] for i in range(7)] for r in range(3)], dtype=torch.float64)
    via_cdist = pairwise_sq_dist(a, b)
    via_broadcast = pairwise_sq_dist(a, b, broadcast=True)
    assert via_cdist.shape == via_broadcast.shape == (3, 7, 5)
    torch.testing.assert_close(via_broadcast, ref, rtol=2e-15, atol=1e-300)
    torch.testing.assert_close(via_cdist, ref, rtol=1e-14, atol=1e-300)
    assert via_broadcast[0, 0, 0] == 0.0 == via_cdist[0, 0, 0]
    want = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square_()
    assert torch.equal(via_cdist, want)
    assert torch.equal(pairwise_sq_dist(a, b, broadcast=False), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pairwise_sq_dist_cuda_equals_cpu() -> None:
    """On CUDA the broadcast differences equal the CPU's ``cdist`` to rounding."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4, 30, 2, generator=g, dtype=torch.float64)
    b = torch.rand(4, 20, 2, generator=g, dtype=torch.float64)
    got = pairwise_sq_dist(a.cuda(), b.cuda()).cpu()
    torch.testing.assert_close(got, pairwise_sq_dist(a, b), rtol=1e-14, atol=1e-300)

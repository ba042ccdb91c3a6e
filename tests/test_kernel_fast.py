"""The fast stationary kernels, the split Cholesky solve and the lean KernelUCB step, each
against the general path it replaces."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import LinearKernel, MaternKernel, RBFKernel, ScaleKernel

from torchbandits.kernels import KernelPlan, make_kernel
from torchbandits.linalg import GrowingCholesky
from torchbandits.models.exact import exact_posterior_reference
from torchbandits.policies import AMMUCB, DMMUCB, GPUCB, KernelUCB


def _gpytorch(kernel, x, y):
    with torch.no_grad():
        return kernel(x, y).to_dense()


@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
@pytest.mark.parametrize("lengthscale", [0.07, 0.5, 3.0, (0.2, 1.0, 0.6)])
@pytest.mark.parametrize("outputscale", [None, 2.5])
def test_fast_stationary_equals_gpytorch(name, lengthscale, outputscale):
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(37, 3, generator=gen, dtype=torch.float64)
    y = torch.rand(20, 3, generator=gen, dtype=torch.float64)
    if name != "matern12":
        # equal rows: the distance through ‖x‖² − 2x·y + ‖y‖² (here as in GPyTorch) is off by
        # ~sqrt(eps)·‖x‖/ℓ there, which the smooth kernels square away; Matérn-1/2 (exp(−r), not
        # differentiable at 0) keeps it, in both implementations
        y = torch.cat([y, x[:5]])
    kernel = make_kernel(name, lengthscale, outputscale=outputscale)
    form = KernelPlan(kernel, track=True).stationary
    assert form is not None
    ref = _gpytorch(kernel, x, y)
    assert torch.allclose(form.matrix(x, y), ref, rtol=0.0, atol=1e-12)
    assert form.diag_value == pytest.approx(1.0 if outputscale is None else outputscale, rel=1e-15)
    # the same from the stored scaled rows (what the model keeps) and a fresh candidate set
    xs = form.scale(x)
    ys = form.scale(y)
    k = form.cross(xs, form.sqnorm(xs), ys, form.sqnorm(ys))
    assert torch.allclose(k, ref, rtol=0.0, atol=1e-12)


def test_kernels_without_a_form_use_the_general_path():
    for kernel in (LinearKernel(), RBFKernel(active_dims=(0,)), MaternKernel(nu=2.5) * RBFKernel(),
                   ScaleKernel(RBFKernel(), active_dims=(1,))):
        assert KernelPlan(kernel.double(), track=True).stationary is None


def test_split_solve_equals_a_from_scratch_factor_past_many_folds():
    gen = torch.Generator().manual_seed(0)
    n = 203
    x = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    gram = _gpytorch(make_kernel("matern52", 0.3), x, x) + 0.1 * torch.eye(n, dtype=torch.float64)
    chol = torch.linalg.cholesky(gram)
    grow = GrowingCholesky(block=16)
    rhs = torch.rand(n, 7, generator=gen, dtype=torch.float64)
    for i in range(n):
        grow.append_point(gram[:i, i], gram[i, i])
        k = i + 1
        if k in (1, 5, 16, 17, 40, 64, 100, 203):  # tail only, head only, head + tail
            assert torch.allclose(grow.dense(), chol[:k, :k], rtol=0.0, atol=1e-12)
            ref = torch.linalg.solve_triangular(chol[:k, :k], rhs[:k], upper=False)
            assert torch.allclose(grow.solve(rhs[:k]), ref, rtol=0.0, atol=1e-12)
            assert torch.allclose(grow.solve(rhs[:k, 0]), ref[:, 0], rtol=0.0, atol=1e-12)


def _run(policy, cands, f, copy_rows=False):
    policy.reset(seed=0)
    for cand in cands:
        i = policy.select(cand)
        row = cand[i].clone() if copy_rows else cand[i]
        policy.update(row, f(row))
    return policy


@pytest.mark.parametrize("make", [
    lambda k: AMMUCB(k, noise_std=0.1, norm_bound=2.0, c=0.3),
    lambda k: DMMUCB(k, noise_std=0.1, norm_bound=2.0, c=0.3),
    lambda k: GPUCB(k, noise_std=0.1, norm_bound=2.0),
    lambda k: KernelUCB(k, lam=0.5, beta=0.7),
])
def test_lean_step_equals_the_general_step(make):
    """Passing the chosen row itself (lean update, column reused) or a copy of it (general
    update, compared by value) gives the same run; the posterior equals a from-scratch one."""
    gen = torch.Generator().manual_seed(1)
    cands = [torch.rand(30, 2, generator=gen, dtype=torch.float64) for _ in range(40)]
    f = lambda x: torch.sin(5.0 * x).sum(-1)  # noqa: E731
    kernel = make_kernel("matern52", 0.4)
    a = _run(make(kernel), cands, f)
    b = _run(make(kernel), cands, f, copy_rows=True)
    probe = torch.rand(50, 2, generator=gen, dtype=torch.float64)
    assert torch.allclose(a(probe), b(probe), rtol=0.0, atol=1e-10)
    reg = a.model.lam
    mean, var = a.model.mean_var(probe)
    ref_mean, ref_var = exact_posterior_reference(kernel, a.model.x, a.model.y, probe, reg)
    assert torch.allclose(mean, ref_mean, rtol=0.0, atol=1e-9)
    assert torch.allclose(var, ref_var, rtol=0.0, atol=1e-9)


def test_candidates_written_in_place_after_select_are_not_reused():
    kernel = make_kernel("rbf", 0.3)
    policy = AMMUCB(kernel, noise_std=0.1, norm_bound=1.0)
    gen = torch.Generator().manual_seed(2)
    policy.reset(seed=0)
    for _ in range(6):
        cand = torch.rand(20, 2, generator=gen, dtype=torch.float64)
        i = policy.select(cand)
        cand[i] += 0.25  # the played point is no longer the scored one
        policy.update(cand[i], float(cand[i].sum()))
    probe = torch.rand(15, 2, generator=gen, dtype=torch.float64)
    model = policy.model
    mean, var = model.mean_var(probe)
    ref_mean, ref_var = exact_posterior_reference(kernel, model.x, model.y, probe, model.lam)
    assert torch.allclose(mean, ref_mean, rtol=0.0, atol=1e-10)
    assert torch.allclose(var, ref_var, rtol=0.0, atol=1e-10)
    # a candidate set re-scored after an in-place write is scored anew (its cache not served)
    fixed = torch.rand(10, 2, generator=gen, dtype=torch.float64)
    model.mean_var(fixed)
    fixed.mul_(0.5)
    mean, var = model.mean_var(fixed)
    ref_mean, ref_var = exact_posterior_reference(kernel, model.x, model.y, fixed, model.lam)
    assert torch.allclose(mean, ref_mean, rtol=0.0, atol=1e-10)

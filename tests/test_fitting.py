"""fit_kernel: the exact marginal likelihood (GPyTorch's value), recovery, bounds, bad data."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

from torchbandits.fitting import DegenerateDataError, exact_mll, fit_kernel, kernel_hyperparameters
from torchbandits.kernels import kernel_matrix, make_kernel, product_kernel


def gp_draw(seed: int, n: int = 300, d: int = 2, ls: float = 0.3, noise: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    k = kernel_matrix(make_kernel("rbf", ls), x, x) + 1e-8 * torch.eye(n, dtype=torch.float64)
    f = torch.linalg.cholesky(k) @ torch.randn(n, generator=g, dtype=torch.float64)
    return x, 2.0 * f + 1.0 + noise * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_lengthscale_and_improves_likelihood(seed: int) -> None:
    x, y = gp_draw(seed)
    template = make_kernel("rbf", 1.0, outputscale=1.0)
    res = fit_kernel(template, x, y)
    assert abs(res.lengthscales[0] - 0.3) < 0.25 * 0.3
    assert res.improved and res.objective > res.objective_initial + 0.1
    # the likelihood in y's units also improves on the initial kernel / noise / mean
    init_mll = exact_mll(make_kernel("rbf", 1.0, outputscale=float(y.var())), x, y,
                         0.01 * float(y.var()), float(y.mean()))
    assert exact_mll(res.kernel, x, y, res.noise, res.mean) > init_mll
    assert 0.5 * 0.05**2 < res.noise < 3 * 0.05**2
    assert float(template.base_kernel.lengthscale) == 1.0  # the template is not modified
    assert not any(p.requires_grad for p in res.kernel.parameters())


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, lik, kern) -> None:
        super().__init__(x, y, lik)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kern

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("prior", [None, "botorch"])
def test_objective_is_gpytorch_exact_mll(prior) -> None:
    x, y = gp_draw(2, n=80)
    res = fit_kernel(make_kernel("matern52", [0.5, 0.5], outputscale=1.0), x, y, prior=prior)
    ys = (y - y.mean()) / y.std()
    var = float(y.var())
    lik = gpytorch.likelihoods.GaussianLikelihood(
        noise_prior=gpytorch.priors.LogNormalPrior(-4.0, 1.0) if prior else None).double()
    lik.noise = res.noise / var
    ls_prior = gpytorch.priors.LogNormalPrior(math.sqrt(2) + 0.5 * math.log(2), math.sqrt(3))
    base = gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2,
                                         lengthscale_prior=ls_prior if prior else None)
    kern = gpytorch.kernels.ScaleKernel(base).double()
    base.lengthscale = torch.tensor(res.lengthscales, dtype=torch.float64)
    kern.outputscale = res.outputscale / var
    model = _GP(x, ys, lik, kern).double()
    model.mean_module.constant.data.fill_((res.mean - float(y.mean())) / float(y.std()))
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    with gpytorch.settings.max_cholesky_size(10_000), torch.no_grad():
        ref = float(mll(model(x), ys))
    assert abs(ref - res.objective) < 1e-8


def test_adam_and_warm_start() -> None:
    x, y = gp_draw(3, n=120)
    res = fit_kernel(make_kernel("rbf", 1.0), x, y, optimizer="adam", max_iter=150, lr=0.05)
    assert res.improved and res.objective > res.objective_initial
    warm = fit_kernel(make_kernel("rbf", 1.0), x, y, init=res, max_iter=20)
    assert warm.objective_initial == pytest.approx(res.objective, abs=1e-9)
    assert warm.objective >= res.objective - 1e-12


def test_bounds_hold_and_nothing_is_nan() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 3, generator=g, dtype=torch.float64)
    y = torch.randn(40, generator=g, dtype=torch.float64)  # pure noise: ℓ → large, σ² → var
    res = fit_kernel(make_kernel("matern32", [0.2] * 3, outputscale=1.0), x, y, prior=None,
                     lengthscale_bounds=(0.05, 20.0), noise_bounds=(1e-4, 2.0))
    assert all(0.05 <= v <= 20.0 for v in res.lengthscales)
    assert 1e-4 * float(y.var()) <= res.noise <= 2.0 * float(y.var()) + 1e-12
    assert all(math.isfinite(v) for v in kernel_hyperparameters(res.kernel).values())
    x2 = x.clone()
    x2[1] = x2[0]  # duplicate inputs, tiny noise bound: still a finite fit
    res2 = fit_kernel(make_kernel("rbf", 0.3), x2, y, noise_bounds=(1e-6, 1.0))
    assert math.isfinite(res2.objective) and math.isfinite(res2.noise)


def test_product_kernel_with_active_dims() -> None:
    x, y = gp_draw(4, n=100, d=3)
    kern = product_kernel(make_kernel("rbf", 1.0, active_dims=[0, 1]),
                          make_kernel("rbf", 1.0, active_dims=[2]))
    res = fit_kernel(kern, x, y)
    assert len(res.lengthscales) == 2 and res.improved
    assert abs(exact_mll(res.kernel, x, y, res.noise, res.mean)) < 1e3


def test_bad_data_raises() -> None:
    k = make_kernel("rbf", 0.5)
    x = torch.rand(5, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2"):
        fit_kernel(k, x[:1], torch.ones(1))
    with pytest.raises(DegenerateDataError, match="constant"):
        fit_kernel(k, x, torch.full((5,), 3.0))
    y = torch.randn(5, dtype=torch.float64)
    with pytest.raises(ValueError, match="y must be finite"):
        fit_kernel(k, x, torch.tensor([0.0, 1.0, float("nan"), 2.0, 3.0]))
    xn = x.clone()
    xn[0, 0] = float("inf")
    with pytest.raises(ValueError, match="X must be finite"):
        fit_kernel(k, xn, y)
    with pytest.raises(ValueError, match="y must have 5"):
        fit_kernel(k, x, y[:4])
    with pytest.raises(ValueError, match="optimizer"):
        fit_kernel(k, x, y, optimizer="sgd")
    with pytest.raises(ValueError, match="bounds"):
        fit_kernel(k, x, y, lengthscale_bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="supports"):
        fit_kernel(gpytorch.kernels.PeriodicKernel(), x, y)

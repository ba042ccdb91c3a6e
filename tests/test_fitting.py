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


# --------------------------------------------------------------------------- closed-form gradient
def _autograd_objective(kernel, x, ys, boxes, noise_box, prior, u):
    """The fit objective differentiated by torch autograd (Cholesky included), for reference."""
    from torchbandits.gp_likelihood import gram, kernel_leaves

    leaves = kernel_leaves(kernel)
    n, d = x.shape
    vals = {id(m): b.value(p) for (m, _), b, p in zip(leaves, boxes, u)}
    sigma2 = noise_box.value(u[-2]).reshape(())
    cov = gram(kernel, x, vals)[0] + sigma2 * torch.eye(n, dtype=x.dtype)
    obj = torch.distributions.MultivariateNormal(u[-1].reshape(()) * torch.ones(n, dtype=x.dtype),
                                                 covariance_matrix=cov).log_prob(ys)
    if prior == "botorch":
        f64 = torch.float64  # python-float parameters would make float32 distributions
        ls_prior = torch.distributions.LogNormal(torch.tensor(math.sqrt(2) + 0.5 * math.log(d),
                                                              dtype=f64), torch.tensor(3.0, dtype=f64).sqrt())
        for m, kind in leaves:
            if kind == "lengthscale":
                obj = obj + ls_prior.log_prob(vals[id(m)]).sum()
        obj = obj + torch.distributions.LogNormal(torch.tensor(-4.0, dtype=f64),
                                                  torch.tensor(1.0, dtype=f64)).log_prob(sigma2)
    return obj / n


def _kernels():
    return [
        make_kernel("rbf", [0.3, 0.7]),
        make_kernel("rbf", 0.4, outputscale=1.7),
        make_kernel("matern12", [0.5, 0.2], outputscale=0.8),
        make_kernel("matern32", 0.3),
        make_kernel("matern52", [0.6, 0.25], outputscale=1.3),
        product_kernel(make_kernel("rbf", 0.5, active_dims=[0]),
                       make_kernel("matern52", 0.3, active_dims=[1], outputscale=2.0)),
        gpytorch.kernels.AdditiveKernel(
            make_kernel("rbf", 0.5), gpytorch.kernels.ScaleKernel(gpytorch.kernels.LinearKernel())),
    ]


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("prior", [None, "botorch"])
def test_closed_form_gradient_matches_autograd(case: int, prior) -> None:
    from torchbandits.gp_likelihood import Box, FitObjective, kernel_leaves

    kernel = _kernels()[case].double()
    x, y = gp_draw(5 + case, n=60)
    if case != 2:  # a duplicate input (r = 0 off the diagonal); Matérn-1/2 is not
        x[7] = x[3]  # differentiable there in autograd's expanded-square form
    ys = (y - y.mean()) / y.std()
    leaves = kernel_leaves(kernel)
    boxes = [Box(0.02, 50.0) for _ in leaves]
    noise_box = Box(1e-4, 4.0)
    g = torch.Generator().manual_seed(case)
    u = [torch.randn(getattr(m, kind).numel(), generator=g, dtype=torch.float64) * 0.7
         for m, kind in leaves]
    u += [torch.tensor([-0.5], dtype=torch.float64), torch.tensor([0.2], dtype=torch.float64)]
    objective = FitObjective(kernel, x, ys, boxes, noise_box, prior)
    val, grads = objective(u)
    u_ref = [p.clone().requires_grad_(True) for p in u]
    ref = _autograd_objective(kernel, x, ys, boxes, noise_box, prior, u_ref)
    ref.backward()
    ref = ref.detach()
    assert abs(float(val) - float(ref)) < 1e-10 * max(1.0, abs(float(ref)))
    for gr, p in zip(grads, u_ref):
        assert float((gr - p.grad).abs().max()) < 1e-8 * max(1.0, float(p.grad.abs().max()))
    assert any(float(gr.abs().max()) > 1e-3 for gr in grads)  # a non-trivial gradient


@pytest.mark.parametrize("kind,d", [("rbf", 2), ("matern52", 3)])
def test_fit_equals_the_autograd_lbfgs_fit(kind: str, d: int) -> None:
    """The closed-form gradient changes the cost, not the optimum: SciPy's L-BFGS-B on the
    autograd objective (the former implementation) ends at the same hyper-parameters."""
    from scipy.optimize import minimize

    from torchbandits.gp_likelihood import Box

    x, y = gp_draw(10 + d, n=90, d=d)
    template = make_kernel(kind, [0.5] * d)
    res = fit_kernel(template, x, y, lengthscale_bounds=(0.025, 100.0), noise_bounds=(1e-4, 4.0))
    ys = (y - y.mean()) / y.std()
    boxes, noise_box = [Box(0.025, 100.0)], Box(1e-4, 4.0)
    x0 = torch.cat([boxes[0].inverse(torch.full((d,), 0.5, dtype=torch.float64)),
                    noise_box.inverse(torch.tensor([0.01], dtype=torch.float64)),
                    torch.zeros(1, dtype=torch.float64)])

    def fun(flat):
        t = torch.tensor(flat, dtype=torch.float64, requires_grad=True)
        obj = _autograd_objective(template, x, ys, boxes, noise_box, "botorch",
                                  [t[:d], t[d:d + 1], t[d + 1:]])
        (-obj).backward()
        return -float(obj.detach()), t.grad.numpy()

    ref = minimize(fun, x0.numpy(), jac=True, method="L-BFGS-B",
                   options={"maxiter": 100, "gtol": 1e-5, "ftol": 1e-10})
    ref_ls = boxes[0].value(torch.tensor(ref.x[:d])).tolist()
    ref_noise = float(noise_box.value(torch.tensor(ref.x[d]))) * float(y.var())
    assert res.objective == pytest.approx(-ref.fun, abs=1e-8)
    for a, b in zip(res.lengthscales, ref_ls):
        assert a == pytest.approx(b, rel=1e-3)
    assert res.noise == pytest.approx(ref_noise, rel=1e-3)
    assert (res.mean - float(y.mean())) / float(y.std()) == pytest.approx(ref.x[-1], abs=1e-3)


@pytest.mark.parametrize("optimizer", ["torch-lbfgs", "adam"])
def test_torch_optimisers_use_the_closed_form_gradient(optimizer: str) -> None:
    x, y = gp_draw(6, n=80)
    lbfgs = fit_kernel(make_kernel("rbf", 1.0), x, y)
    other = fit_kernel(make_kernel("rbf", 1.0), x, y, optimizer=optimizer, max_iter=300, lr=0.05)
    assert other.improved and other.objective > other.objective_initial
    assert other.objective == pytest.approx(lbfgs.objective, abs=1e-3)


def test_warm_bfgs_refits_reach_the_lbfgs_optimum_with_fewer_evaluations() -> None:
    """Refits after each new point (data with a well-identified optimum): the BFGS that carries
    its curvature from fit to fit ends where SciPy's L-BFGS-B ends, in fewer evaluations."""
    x, y = gp_draw(7, n=70, d=2)
    template = make_kernel("rbf", [0.5, 0.5])
    opts = {"lengthscale_bounds": (0.025, 100.0), "noise_bounds": (1e-4, 4.0)}
    prev = {"lbfgs": None, "bfgs": None}
    evals = {"lbfgs": 0, "bfgs": 0}
    for n in range(58, 71):
        for opt in prev:
            prev[opt] = fit_kernel(template, x[:n], y[:n], init=prev[opt], optimizer=opt, **opts)
            evals[opt] += prev[opt].n_evals
        a, b = prev["lbfgs"], prev["bfgs"]
        assert b.curvature is not None and a.curvature is None
        assert b.objective == pytest.approx(a.objective, abs=1e-7)
        for u, v in zip([*a.lengthscales, a.noise], [*b.lengthscales, b.noise]):
            assert v == pytest.approx(u, rel=2e-3)
    assert evals["bfgs"] < 0.7 * evals["lbfgs"]

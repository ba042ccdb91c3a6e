"""Kernel hyper-parameters learned from data: type-II maximum likelihood.

:func:`fit_kernel` maximises the exact GP marginal log-likelihood of the data ``(X, y)``
(Rasmussen & Williams 2006, Eq. 5.8), per point and plus the log-priors, exactly the objective of
GPyTorch's ``ExactMarginalLogLikelihood`` on an ``ExactGP`` with a constant mean and a Gaussian
likelihood (the tests check the value against GPyTorch's to 1e-8):

    L(θ) = [ log N(ỹ | c·1, s·K_θ + σ²I) + Σ log p(θ_j) ] / n,      ỹ = (y − ȳ) / sd(y),

over the lengthscales (every RBF / Matérn factor, ARD or not), the output scale ``s`` (every
``ScaleKernel``; the variance of a linear kernel), the noise variance ``σ²`` and the constant
mean ``c``. The targets are standardised first (as BoTorch's ``Standardize`` does), so the
default bounds and priors are unit-free; the returned kernel and noise are in ``y``'s units
(the kernel is wrapped in a ``ScaleKernel`` carrying ``sd(y)²``).

Why not GPyTorch's own training loop: at bandit sizes (n ≤ a few thousand) its lazy-tensor
machinery costs more than it saves; here the Gram matrix is evaluated densely with the closed
forms of :mod:`torchbandits.kernels` (differentiably) and the log-likelihood via one Cholesky.

**Cannot collapse.** Every parameter lives in a box, in log space:
``log v = log lo + (log hi − log lo)·sigmoid(u)`` with ``u`` unconstrained, so no value reaches 0
or ∞ (defaults: lengthscales in [0.01, 100], output scale in [0.01, 100], noise in
[1e-6, 4] — the last two relative to ``var(y)``). ``prior="botorch"`` (default) adds the priors of
Hvarfner, Hellsten & Nardi (2024), BoTorch's defaults: ``ℓ_j ~ LogNormal(√2 + ½ log d, √3)``,
``σ² ~ LogNormal(−4, 1)`` (standardised units).

**Bad data** raises a ``ValueError`` naming the argument, before anything is fitted: fewer than
two points, NaN / inf, shape mismatch; constant ``y`` raises :class:`DegenerateDataError` (a
``ValueError``), which the refitting policies treat as "skip this refit". The result is never a
NaN kernel: if the optimiser ends on a non-finite or worse objective, the initial values are
returned (``improved=False``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from gpytorch.kernels import (
    AdditiveKernel,
    Kernel,
    LinearKernel,
    MaternKernel,
    ProductKernel,
    RBFKernel,
    ScaleKernel,
)
from torch import Tensor

__all__ = ["DegenerateDataError", "FitResult", "exact_mll", "fit_kernel", "kernel_hyperparameters"]

_LOG_2PI = math.log(2.0 * math.pi)


class DegenerateDataError(ValueError):
    """The data carry no information for a fit (constant ``y``)."""


@dataclass
class FitResult:
    """Output of :func:`fit_kernel` (kernel and noise in ``y``'s units).

    Attributes:
        kernel: the fitted kernel, parameters frozen (``ScaleKernel(fitted, sd(y)²)`` when
            standardised).
        noise: noise variance σ² — the regulariser λ of the exact posterior.
        mean: constant prior mean ``ȳ + c·sd(y)``.
        lengthscales: every lengthscale, in the order of the kernel's leaves.
        outputscale: the kernel's variance scale (product of the ``ScaleKernel`` factors).
        objective_initial, objective: per-point log-likelihood + log-priors (standardised units,
            GPyTorch's convention) at the initial and the returned values.
        n_evals: objective evaluations; improved: whether the fit beat the initial values.
        state: unconstrained parameters, for warm-starting the next fit (``init=``).
    """

    kernel: Kernel
    noise: float
    mean: float
    lengthscales: list[float]
    outputscale: float
    objective_initial: float
    objective: float
    n_evals: int
    improved: bool
    state: list[Tensor] = field(repr=False, default_factory=list)


# --------------------------------------------------------------------------- parametrisation
class _Box:
    """``v = exp(log lo + (log hi − log lo)·sigmoid(u))`` elementwise."""

    def __init__(self, lo: float, hi: float) -> None:
        if not (0 < lo < hi < math.inf):
            raise ValueError(f"bounds must satisfy 0 < lo < hi < inf, got ({lo}, {hi})")
        self.a, self.b = math.log(lo), math.log(hi)

    def value(self, u: Tensor) -> Tensor:
        return torch.exp(self.a + (self.b - self.a) * torch.sigmoid(u))

    def inverse(self, v: Tensor) -> Tensor:
        s = ((torch.log(v) - self.a) / (self.b - self.a)).clamp(1e-6, 1.0 - 1e-6)
        return torch.log(s) - torch.log1p(-s)


def _leaves(kernel: Kernel) -> list[tuple[Kernel, str]]:
    """``(module, kind)`` for every fitted parameter, in a fixed order."""
    if isinstance(kernel, ScaleKernel):
        return [(kernel, "outputscale"), *_leaves(kernel.base_kernel)]
    if isinstance(kernel, (ProductKernel, AdditiveKernel)):
        return [leaf for k in kernel.kernels for leaf in _leaves(k)]
    if isinstance(kernel, (RBFKernel, MaternKernel)):
        return [(kernel, "lengthscale")]
    if isinstance(kernel, LinearKernel):
        return [(kernel, "variance")]
    raise ValueError(f"fit_kernel supports RBF, Matérn, linear, Scale, Product and Additive "
                     f"kernels, got {type(kernel).__name__}")


def _current(module: Kernel, kind: str) -> Tensor:
    return getattr(module, kind).detach().reshape(-1).clone()


def _cols(kernel: Kernel, x: Tensor) -> Tensor:
    dims = kernel.active_dims
    return x if dims is None else x.index_select(-1, dims.to(x.device))


def _gram(kernel: Kernel, x: Tensor, vals: dict[int, Tensor]) -> Tensor:
    """Differentiable ``K(x, x)`` with the parameter values ``vals[id(module)]``."""
    if isinstance(kernel, ScaleKernel):
        return vals[id(kernel)].reshape(()) * _gram(kernel.base_kernel, _cols(kernel, x), vals)
    if isinstance(kernel, (ProductKernel, AdditiveKernel)):
        xs = _cols(kernel, x)
        out = _gram(kernel.kernels[0], xs, vals)
        for k in kernel.kernels[1:]:
            g = _gram(k, xs, vals)
            out = out * g if isinstance(kernel, ProductKernel) else out + g
        return out
    xs = _cols(kernel, x)
    if isinstance(kernel, LinearKernel):
        return vals[id(kernel)].reshape(()) * (xs @ xs.mT)
    z = xs / vals[id(kernel)]
    sq = (z * z).sum(-1, keepdim=True) - 2.0 * z @ z.mT + (z * z).sum(-1)[None, :]
    sq = sq.clamp_min(0.0)
    if isinstance(kernel, RBFKernel):
        return torch.exp(-0.5 * sq)
    # Matérn: sqrt is not differentiable at 0 (the diagonal), so add a tiny floor
    r = torch.sqrt(sq + 1e-30)
    if kernel.nu == 0.5:
        return torch.exp(-r)
    s = math.sqrt(3.0 if kernel.nu == 1.5 else 5.0) * r
    if kernel.nu == 1.5:
        return (1.0 + s) * torch.exp(-s)
    return (1.0 + s + s * s / 3.0) * torch.exp(-s)


def _jittered_cholesky(cov: Tensor) -> Tensor:
    """Lower Cholesky factor of ``cov`` (jitter added only if the plain factorisation fails)."""
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    jitter = 0.0
    for _ in range(6):
        chol, info = torch.linalg.cholesky_ex(cov + jitter * eye)
        if int(info) == 0:
            break
        jitter = 1e-10 if jitter == 0.0 else jitter * 100.0
    return chol


class _GaussLogPdf(torch.autograd.Function):
    """``log N(r | 0, C)`` with the closed-form gradients ``∂/∂r = −α`` and
    ``∂/∂C = ½(ααᵀ − C⁻¹)``, ``α = C⁻¹r`` (Rasmussen & Williams 2006, Eq. 5.9) — one Cholesky and
    one ``cholesky_inverse`` instead of differentiating through the factorisation (4× faster)."""

    @staticmethod
    def forward(ctx, resid: Tensor, cov: Tensor) -> Tensor:  # type: ignore[override]
        chol = _jittered_cholesky(cov)
        alpha = torch.cholesky_solve(resid[:, None], chol)[:, 0]
        ctx.save_for_backward(chol, alpha)
        n = resid.shape[0]
        return -0.5 * (resid @ alpha) - torch.log(torch.diagonal(chol)).sum() - 0.5 * n * _LOG_2PI

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        chol, alpha = ctx.saved_tensors
        g_cov = 0.5 * (torch.outer(alpha, alpha) - torch.cholesky_inverse(chol))
        return -grad * alpha, grad * g_cov


def _gauss_logpdf(resid: Tensor, cov: Tensor) -> Tensor:
    """``log N(resid | 0, cov)``, differentiable in both arguments."""
    return _GaussLogPdf.apply(resid, cov)


def _lognormal_logpdf(v: Tensor, loc: float, scale: float) -> Tensor:
    """``log p(v)`` of ``LogNormal(loc, scale)`` (as ``torch.distributions.LogNormal``)."""
    lv = torch.log(v)
    return -lv - math.log(scale) - 0.5 * _LOG_2PI - 0.5 * ((lv - loc) / scale) ** 2


def exact_mll(kernel: Kernel, x: Tensor, y: Tensor, noise: float, mean: float = 0.0) -> float:
    """``log N(y | mean·1, K + noise·I) / n`` for a fixed kernel (no priors), in ``y``'s units."""
    vals = {id(m): getattr(m, kind).detach().to(x.dtype) for m, kind in _leaves(kernel)}
    with torch.no_grad():
        cov = _gram(kernel, x, vals) + noise * torch.eye(x.shape[0], dtype=x.dtype, device=x.device)
        return float(_gauss_logpdf(y - mean, cov)) / x.shape[0]


def kernel_hyperparameters(kernel: Kernel) -> dict[str, float]:
    """Flat ``{"lengthscale_0": …, "outputscale": …}`` of a kernel (for ``diagnostics()``)."""
    out: dict[str, float] = {}
    scale, i = 1.0, 0
    for m, kind in _leaves(kernel):
        v = _current(m, kind)
        if kind == "lengthscale":
            for val in v.tolist():
                out[f"lengthscale_{i}"] = float(val)
                i += 1
        else:
            scale *= float(v.prod())
    out["outputscale"] = scale
    return out


# --------------------------------------------------------------------------- the fit
def _check_data(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    x = torch.as_tensor(x)
    if not x.is_floating_point():
        x = x.to(torch.float64)
    y = torch.as_tensor(y, dtype=x.dtype, device=x.device).reshape(-1)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"X must be [n, d], got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y must have {x.shape[0]} entries (one per row of X), got {y.shape[0]}")
    if x.shape[0] < 2:
        raise ValueError(f"X must hold at least 2 points to fit a kernel, got {x.shape[0]}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("X must be finite (found NaN or inf)")
    if not bool(torch.isfinite(y).all()):
        raise ValueError("y must be finite (found NaN or inf)")
    if float(y.std()) <= 1e-12 * max(1.0, float(y.abs().max())):
        raise DegenerateDataError("y is constant: the marginal likelihood carries no information "
                                  "about the hyper-parameters")
    return x, y


def fit_kernel(
    kernel: Kernel,
    X: Tensor,
    y: Tensor,
    *,
    noise: float | None = None,
    fit_noise: bool = True,
    fit_mean: bool = True,
    prior: str | None = "botorch",
    lengthscale_bounds: tuple[float, float] = (1e-2, 1e2),
    outputscale_bounds: tuple[float, float] = (1e-2, 1e2),
    noise_bounds: tuple[float, float] = (1e-6, 4.0),
    optimizer: str = "lbfgs",
    max_iter: int = 100,
    lr: float = 0.05,
    init: FitResult | None = None,
) -> FitResult:
    """Fit ``kernel``'s hyper-parameters and the noise to ``(X [n, d], y [n])`` by maximum
    marginal likelihood (see the module docstring for the objective, bounds and priors).

    Args:
        kernel: template (not modified); its current values are the initial point.
        noise: initial noise variance in ``y``'s units (default ``0.01·var(y)``; with
            ``fit_noise=False`` the fixed value).
        fit_mean: fit the constant prior mean ``c`` (otherwise the mean is ``ȳ``).
        prior: ``"botorch"`` (Hvarfner et al. 2024 priors) or ``None`` (pure likelihood).
        *_bounds: boxes of the parameters; output scale and noise relative to ``var(y)``.
        optimizer: ``"lbfgs"`` (SciPy's L-BFGS-B, as BoTorch's ``fit_gpytorch_mll``, at most
            ``max_iter`` iterations; gradients by torch autograd), ``"torch-lbfgs"``
            (``torch.optim.LBFGS``, strong-Wolfe line search; no SciPy round trips, for GPU
            tensors) or ``"adam"`` (``max_iter`` steps of size ``lr``).
        init: a previous :class:`FitResult` of the same kernel structure: the fit starts from
            the better (higher objective) of its optimum and the template's values, and from
            the template alone when every lengthscale of the previous optimum sits at its lower
            bound — the all-noise plateau (``K ≈ I``, large noise) that a fit on few points can
            fall into and where the gradient vanishes, so a warm start would never leave it.
    """
    if optimizer not in ("lbfgs", "torch-lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs', 'torch-lbfgs' or 'adam', got {optimizer!r}")
    if prior not in ("botorch", None):
        raise ValueError(f"prior must be 'botorch' or None, got {prior!r}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    x, yv = _check_data(X, y)
    dtype = x.dtype
    work = copy.deepcopy(kernel).to(dtype=dtype, device=x.device)
    leaves = _leaves(work)
    y_mean, y_sd = float(yv.mean()), float(yv.std())
    ys = (yv - y_mean) / y_sd
    n, d = x.shape
    boxes = [_Box(*(lengthscale_bounds if kind == "lengthscale" else outputscale_bounds))
             for _, kind in leaves]
    noise_box = _Box(*noise_bounds)
    init_noise = 0.01 if noise is None else float(noise) / y_sd**2
    if not math.isfinite(init_noise) or init_noise <= 0:
        raise ValueError(f"noise must be a positive number, got {noise!r}")
    params = [b.inverse(_current(m, kind).to(dtype)) for b, (m, kind) in zip(boxes, leaves)]
    params.append(noise_box.inverse(torch.tensor([init_noise], dtype=dtype)))
    params.append(torch.zeros(1, dtype=dtype))
    params = [p.to(x.device).requires_grad_(True) for p in params]
    warm = None
    if init is not None and len(init.state) == len(params) and all(
            a.shape == b.shape for a, b in zip(init.state, params)):
        warm = [p.detach().clone().to(dtype=dtype, device=x.device) for p in init.state]
        if noise is not None:
            warm[-2] = params[-2].detach().clone()
        ls_u = [w for w, (_, kind) in zip(warm, leaves) if kind == "lengthscale"]
        if ls_u and all(bool((torch.sigmoid(w) < 1e-3).all()) for w in ls_u):
            warm = None  # the all-noise plateau: every lengthscale at its lower bound
    trainable = list(params[:-2])
    if fit_noise:
        trainable.append(params[-2])
    if fit_mean:
        trainable.append(params[-1])
    ls_loc, ls_scale = math.sqrt(2.0) + 0.5 * math.log(d), math.sqrt(3.0)

    def objective() -> Tensor:
        vals = {id(m): b.value(p) for (m, _), b, p in zip(leaves, boxes, params)}
        sigma2 = noise_box.value(params[-2]).reshape(())
        cov = _gram(work, x, vals) + sigma2 * torch.eye(n, dtype=dtype, device=x.device)
        obj = _gauss_logpdf(ys - params[-1].reshape(()), cov)
        if prior == "botorch":
            for (_, kind), p, b in zip(leaves, params, boxes):
                if kind == "lengthscale":
                    obj = obj + _lognormal_logpdf(b.value(p), ls_loc, ls_scale).sum()
            obj = obj + _lognormal_logpdf(sigma2, -4.0, 1.0)
        return obj / n

    with torch.no_grad():
        obj0 = float(objective())
        evals = [1]
        if warm is not None:  # start from the better of the previous optimum and the template
            cold = [p.detach().clone() for p in params]
            for p, w in zip(params, warm):
                p.copy_(w)
            obj_warm = float(objective())
            evals[0] += 1
            if math.isfinite(obj_warm) and obj_warm >= obj0:
                obj0 = obj_warm
            else:
                for p, c in zip(params, cold):
                    p.copy_(c)
        start = [p.detach().clone() for p in params]
    if trainable:
        if optimizer == "lbfgs":
            _scipy_lbfgs(trainable, objective, int(max_iter), evals)
        elif optimizer == "torch-lbfgs":
            opt = torch.optim.LBFGS(trainable, lr=1.0, max_iter=int(max_iter), history_size=10,
                                    line_search_fn="strong_wolfe", tolerance_grad=1e-5,
                                    tolerance_change=1e-9)

            def closure() -> Tensor:
                opt.zero_grad()
                loss = -objective()
                if not bool(torch.isfinite(loss)):
                    raise FloatingPointError
                loss.backward()
                evals[0] += 1
                return loss

            try:
                opt.step(closure)
            except FloatingPointError:
                pass
        else:
            opt = torch.optim.Adam(trainable, lr=float(lr))
            for _ in range(int(max_iter)):
                opt.zero_grad()
                loss = -objective()
                if not bool(torch.isfinite(loss)):
                    break
                loss.backward()
                opt.step()
                evals[0] += 1
    with torch.no_grad():
        finite = all(bool(torch.isfinite(p).all()) for p in params)
        obj1 = float(objective()) if finite else -math.inf
        improved = math.isfinite(obj1) and obj1 >= obj0
        if not improved:
            for p, s in zip(params, start):
                p.copy_(s)
            obj1 = obj0
        return _result(work, leaves, boxes, noise_box, params, y_mean, y_sd, obj0, obj1,
                       evals[0], improved)


def _scipy_lbfgs(trainable: list[Tensor], objective, max_iter: int,  # type: ignore[no-untyped-def]
                 evals: list[int]) -> None:
    """Maximise ``objective`` over ``trainable`` (updated in place) with SciPy's L-BFGS-B."""
    from scipy.optimize import minimize

    sizes = [p.numel() for p in trainable]
    x0 = torch.cat([p.detach().reshape(-1) for p in trainable]).cpu().numpy()

    def set_flat(flat) -> None:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            pos = 0
            for p, k in zip(trainable, sizes):
                p.copy_(torch.as_tensor(flat[pos:pos + k], dtype=p.dtype).reshape(p.shape))
                pos += k

    def fun(flat):  # type: ignore[no-untyped-def]
        set_flat(flat)
        for p in trainable:
            p.grad = None
        loss = -objective()
        evals[0] += 1
        if not bool(torch.isfinite(loss)):
            return float("inf"), flat * 0.0
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in trainable]).cpu().numpy()
        return float(loss.detach()), grad

    res = minimize(fun, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "gtol": 1e-5, "ftol": 1e-10})
    set_flat(res.x)


def _result(work: Kernel, leaves: Sequence[tuple[Kernel, str]], boxes: Sequence[_Box],
            noise_box: _Box, params: Sequence[Tensor], y_mean: float, y_sd: float, obj0: float,
            obj1: float, evals: int, improved: bool) -> FitResult:
    lengthscales: list[float] = []
    scale = y_sd**2
    for (m, kind), b, p in zip(leaves, boxes, params):
        v = b.value(p.detach())
        if kind == "lengthscale":
            m.lengthscale = v.reshape(m.lengthscale.shape)
            lengthscales += v.tolist()
        elif kind == "outputscale":
            m.outputscale = v.reshape(())
            scale *= float(v)
        else:
            m.variance = v.reshape(m.variance.shape)
            scale *= float(v)
    out = ScaleKernel(work).to(dtype=params[0].dtype, device=params[0].device)
    out.outputscale = torch.tensor(y_sd**2, dtype=params[0].dtype)
    for q in out.parameters():
        q.requires_grad_(False)
    noise = float(noise_box.value(params[-2].detach())) * y_sd**2
    return FitResult(kernel=out, noise=noise, mean=y_mean + float(params[-1]) * y_sd,
                     lengthscales=lengthscales, outputscale=scale, objective_initial=obj0,
                     objective=obj1, n_evals=evals, improved=improved,
                     state=[p.detach().clone() for p in params])

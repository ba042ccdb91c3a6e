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
machinery costs more than it saves; here the Gram matrix is evaluated densely and the
log-likelihood and its gradient in closed form from one Cholesky factor, without autograd
(:mod:`torchbandits.gp_likelihood`).

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
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from .fit_optimizers import scipy_lbfgs, torch_optimise, warm_bfgs
from .gp_likelihood import Box, FitObjective, exact_mll, kernel_leaves

__all__ = ["DegenerateDataError", "FitResult", "exact_mll", "fit_kernel", "kernel_hyperparameters"]

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
        curvature: ``optimizer="bfgs"`` only: the inverse-Hessian approximation ``[p, p]`` over
            the trainable parameters, handed to the next fit with ``init=``.
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
    curvature: Tensor | None = field(repr=False, default=None)


def _current(module: Kernel, kind: str) -> Tensor:
    return getattr(module, kind).detach().reshape(-1).clone()


def kernel_hyperparameters(kernel: Kernel) -> dict[str, float]:
    """Flat ``{"lengthscale_0": …, "outputscale": …}`` of a kernel (for ``diagnostics()``)."""
    out: dict[str, float] = {}
    scale, i = 1.0, 0
    for m, kind in kernel_leaves(kernel):
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
            ``max_iter`` iterations; closed-form gradients), ``"bfgs"`` (dense BFGS that
            passes its curvature to the next fit through ``init=``: the cheap choice for
            refits every step, same optimum to the optimiser's tolerance, see
            :mod:`torchbandits.fit_optimizers`), ``"torch-lbfgs"`` (``torch.optim.LBFGS``,
            strong-Wolfe line search; no SciPy round trips, for GPU tensors) or ``"adam"``
            (``max_iter`` steps of size ``lr``).
        init: a previous :class:`FitResult` of the same kernel structure: the fit starts from
            the better (higher objective) of its optimum and the template's values, and from
            the template alone when every lengthscale of the previous optimum sits at its lower
            bound — the all-noise plateau (``K ≈ I``, large noise) that a fit on few points can
            fall into and where the gradient vanishes, so a warm start would never leave it.
    """
    if optimizer not in ("lbfgs", "bfgs", "torch-lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs', 'bfgs', 'torch-lbfgs' or 'adam', "
                         f"got {optimizer!r}")
    if prior not in ("botorch", None):
        raise ValueError(f"prior must be 'botorch' or None, got {prior!r}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    x, yv = _check_data(X, y)
    dtype = x.dtype
    work = copy.deepcopy(kernel).to(dtype=dtype, device=x.device)
    leaves = kernel_leaves(work)
    y_mean, y_sd = float(yv.mean()), float(yv.std())
    boxes = [Box(*(lengthscale_bounds if kind == "lengthscale" else outputscale_bounds))
             for _, kind in leaves]
    noise_box = Box(*noise_bounds)
    init_noise = 0.01 if noise is None else float(noise) / y_sd**2
    if not math.isfinite(init_noise) or init_noise <= 0:
        raise ValueError(f"noise must be a positive number, got {noise!r}")
    params = [b.inverse(_current(m, kind).to(dtype)) for b, (m, kind) in zip(boxes, leaves)]
    params.append(noise_box.inverse(torch.tensor([init_noise], dtype=dtype)))
    params.append(torch.zeros(1, dtype=dtype))
    params = [p.to(x.device) for p in params]
    warm = None
    if init is not None and len(init.state) == len(params) and all(
            a.shape == b.shape for a, b in zip(init.state, params)):
        warm = [p.detach().clone().to(dtype=dtype, device=x.device) for p in init.state]
        if noise is not None:
            warm[-2] = params[-2].clone()
        ls_u = [w for w, (_, kind) in zip(warm, leaves) if kind == "lengthscale"]
        if ls_u and all(bool((torch.sigmoid(w) < 1e-3).all()) for w in ls_u):
            warm = None  # the all-noise plateau: every lengthscale at its lower bound
    trainable = list(range(len(params) - 2))
    if fit_noise:
        trainable.append(len(params) - 2)
    if fit_mean:
        trainable.append(len(params) - 1)
    objective = FitObjective(work, x, (yv - y_mean) / y_sd, boxes, noise_box, prior)

    # the start: the better of the previous optimum (warm) and the template. The candidate
    # likely to win (warm if given) is evaluated with its gradient, which L-BFGS-B then reuses
    # as its first evaluation (one objective evaluation less per fit, the same numbers)
    lbfgs = optimizer == "lbfgs" and bool(trainable)
    first_val, first_grad = objective(params if warm is None else warm, grad=lbfgs)
    evals = [1]
    first = None if first_grad is None else (first_val, first_grad)
    if warm is None:
        obj0 = float(first_val)
    else:
        obj_warm = float(first_val)
        obj0 = float(objective(params, grad=False)[0])
        evals[0] += 1
        if math.isfinite(obj_warm) and obj_warm >= obj0:
            obj0, params = obj_warm, warm
        else:
            first = None
    start = [p.clone() for p in params]
    curvature, obj1 = None, obj0
    if trainable:
        if optimizer == "lbfgs":
            params, obj1 = scipy_lbfgs(params, trainable, objective, int(max_iter), evals, first)
        elif optimizer == "bfgs":
            params, curvature, obj1 = warm_bfgs(params, trainable, objective, int(max_iter),
                                                evals, None if init is None else init.curvature)
        else:
            params = torch_optimise(params, trainable, objective, optimizer, int(max_iter),
                                    float(lr), evals)
            finite = all(bool(torch.isfinite(p).all()) for p in params)
            obj1 = float(objective(params, grad=False)[0]) if finite else -math.inf
    improved = math.isfinite(obj1) and obj1 >= obj0
    if not improved:
        params, obj1 = start, obj0
    res = _result(work, leaves, boxes, noise_box, params, y_mean, y_sd, obj0, obj1, evals[0],
                  improved)
    res.curvature = curvature
    return res


def _result(work: Kernel, leaves: Sequence[tuple[Kernel, str]], boxes: Sequence[Box],
            noise_box: Box, params: Sequence[Tensor], y_mean: float, y_sd: float, obj0: float,
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

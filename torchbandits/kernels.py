"""GPyTorch kernels with fixed hyper-parameters, and fast dense evaluation.

GPyTorch is the source of kernel *definitions* (classes, parameters, constraints, devices). Its lazy
operators cost more than they save at bandit sizes, so :func:`kernel_matrix` and
:func:`kernel_diag` evaluate the common kernels densely with their closed forms
(as in the experiments of Flynn & Reeb 2024, Section 7, with ``r = ‖x − x'‖ / ℓ``):

* RBF: ``exp(−r²/2)``
* Matérn-1/2: ``exp(−r)``;  Matérn-3/2: ``(1 + √3 r) exp(−√3 r)``;
  Matérn-5/2: ``(1 + √5 r + 5r²/3) exp(−√5 r)``
* linear: ``v · xᵀx'``
* ``ScaleKernel`` multiplies by its output scale, ``ProductKernel``/``AdditiveKernel`` multiply/add
  their factors, and ``active_dims`` selects columns (products over context / action dimensions).

Any other GPyTorch kernel falls back to its own (lazy) evaluation, densified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gpytorch
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

from .kernel_fast import ScaledStationary
from .validation import check_positive

__all__ = [
    "KERNEL_NAMES",
    "KernelPlan",
    "check_kernel",
    "kernel_diag",
    "kernel_matrix",
    "make_kernel",
    "pairwise_sq_dist",
    "product_kernel",
]

KERNEL_NAMES = ("rbf", "matern12", "matern32", "matern52", "linear")
_MATERN_NU = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


def _freeze(kernel: Kernel) -> Kernel:
    for p in kernel.parameters():
        p.requires_grad_(False)
    return kernel


def make_kernel(
    name: str,
    lengthscale: float | Sequence[float] = 1.0,
    *,
    outputscale: float | None = None,
    variance: float = 1.0,
    active_dims: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Kernel:
    """Build a GPyTorch kernel with fixed hyper-parameters.

    ``name`` is one of :data:`KERNEL_NAMES`. ``lengthscale`` is a positive number or one per
    input dimension (ARD). ``outputscale`` wraps the kernel in a ``ScaleKernel`` (default: unit
    variance, no wrapper, as in the papers). ``variance`` is the linear kernel's ``v``.
    Parameters are converted to ``dtype`` *before* they are set, so float64 values are exact.
    """
    key = name.lower().replace("-", "").replace("_", "").replace("/", "")
    aliases = {"se": "rbf", "gaussian": "rbf", "exponential": "matern12", "laplace": "matern12"}
    key = aliases.get(key, key)
    if key not in KERNEL_NAMES:
        raise ValueError(f"kernel name must be one of {KERNEL_NAMES}, got {name!r}")
    dims = tuple(int(i) for i in active_dims) if active_dims is not None else None
    kwargs = {"active_dims": dims} if dims is not None else {}
    if key == "linear":
        kernel: Kernel = LinearKernel(**kwargs)
        kernel = kernel.to(dtype=dtype)
        kernel.variance = check_positive("variance", variance)
    else:
        ls = [lengthscale] if isinstance(lengthscale, (int, float)) else list(lengthscale)
        ls = [check_positive("lengthscale", v) for v in ls]
        ard = len(ls) if len(ls) > 1 else None
        if key == "rbf":
            kernel = RBFKernel(ard_num_dims=ard, **kwargs)
        else:
            kernel = MaternKernel(nu=_MATERN_NU[key], ard_num_dims=ard, **kwargs)
        kernel = kernel.to(dtype=dtype)
        kernel.lengthscale = torch.tensor(ls, dtype=dtype).reshape(1, -1)
    if outputscale is not None:
        kernel = ScaleKernel(kernel).to(dtype=dtype)
        kernel.outputscale = check_positive("outputscale", outputscale)
    if device is not None:
        kernel = kernel.to(device=device)
    return _freeze(kernel)


def _positive_finite(values: Tensor) -> bool:
    v = values.detach()
    return bool(torch.isfinite(v).all()) and bool((v > 0).all())


def check_kernel(kernel: object) -> Kernel:
    """Return ``kernel`` if it is a GPyTorch ``Kernel`` whose hyper-parameters are usable, else
    raise a ``ValueError`` naming ``kernel``: every lengthscale, output scale and linear variance
    must be finite and > 0, and every parameter finite. Policies call it at construction, so a
    lengthscale of 0 fails there, not as a NaN pivot or a silent garbage UCB rounds later."""
    if not isinstance(kernel, Kernel):
        raise ValueError(f"kernel must be a gpytorch.kernels.Kernel, got {type(kernel).__name__}")
    for name, module in kernel.named_modules():
        where = f"kernel{'.' + name if name else ''}"
        if getattr(module, "has_lengthscale", False) and module.lengthscale is not None:
            if not _positive_finite(module.lengthscale):
                raise ValueError(f"{where} has lengthscale {module.lengthscale.detach().flatten().tolist()}"
                                 ": every lengthscale must be a finite number > 0")
        if isinstance(module, ScaleKernel) and not _positive_finite(module.outputscale):
            raise ValueError(f"{where} has outputscale {module.outputscale.detach().flatten().tolist()}"
                             ": it must be a finite number > 0")
        if isinstance(module, LinearKernel) and not _positive_finite(module.variance):
            raise ValueError(f"{where} has variance {module.variance.detach().flatten().tolist()}: "
                             "it must be a finite number > 0")
    for name, param in kernel.named_parameters():
        if not bool(torch.isfinite(param.detach()).all()):
            raise ValueError(f"kernel parameter {name} is not finite: {param.detach().flatten().tolist()}")
    return kernel


def product_kernel(*kernels: Kernel) -> Kernel:
    """Product ``k(s, s') = Π_j k_j(s, s')`` (e.g. context kernel × action kernel, each with its
    own ``active_dims``)."""
    if len(kernels) < 2:
        raise ValueError("product_kernel needs at least two kernels")
    return _freeze(ProductKernel(*kernels))


class KernelPlan:
    """A kernel's hyper-parameters read once, for repeated dense evaluations.

    Reading a constrained GPyTorch parameter (``kernel.lengthscale``: the softplus of the raw
    value) costs tens of µs, more than evaluating a bandit-sized kernel matrix, so a model that
    evaluates the same kernel every round keeps one plan (:func:`kernel_matrix` and
    :func:`kernel_diag` build a fresh one per call: one code path). The plan holds the values of
    every lengthscale, output scale, linear variance and ``active_dims``; :meth:`current` says
    whether the kernel still holds the raw values read (one ``torch.equal`` per raw parameter;
    ``track=True`` keeps the copy of the raw values it compares with). ``diag_constant`` is
    ``k(x, x)`` of a stationary kernel (RBF or Matérn, optionally scaled), else ``None``;
    ``stationary`` (with ``track=True``) its :class:`~torchbandits.kernel_fast.ScaledStationary`
    form for evaluation on inputs scaled once, else ``None``.
    """

    def __init__(self, kernel: Kernel, *, track: bool = False) -> None:
        self.kernel = kernel
        self.key = id(kernel)  # the values below are keyed by module identity: a copy re-reads
        self.hyper: dict[int, Tensor] = {}
        self.dims: dict[int, Tensor | None] = {}
        for module in kernel.modules():
            if isinstance(module, Kernel):
                self.dims[id(module)] = module.active_dims
            if isinstance(module, ScaleKernel):
                self.hyper[id(module)] = module.outputscale
            elif isinstance(module, (RBFKernel, MaternKernel)):
                self.hyper[id(module)] = module.lengthscale
            elif isinstance(module, LinearKernel):
                self.hyper[id(module)] = module.variance
        self.raw = [(p, p.detach().clone()) for p in kernel.parameters()] if track else None
        self.diag_constant = self._diag_constant(kernel) if track else None
        self.stationary = ScaledStationary.of(kernel, self.hyper) if track else None

    def _diag_constant(self, kernel: Kernel) -> float | None:
        if isinstance(kernel, (RBFKernel, MaternKernel)):
            return 1.0
        if isinstance(kernel, ScaleKernel) and isinstance(kernel.base_kernel, (RBFKernel, MaternKernel)):
            return float(self.hyper[id(kernel)].detach())
        return None

    def current(self, kernel: Kernel) -> bool:
        """Whether ``kernel`` is the kernel read, its raw parameters unchanged (``track=True``)."""
        return (kernel is self.kernel and id(kernel) == self.key and self.raw is not None
                and all(torch.equal(p, v) for p, v in self.raw))

    def select(self, kernel: Kernel, x: Tensor) -> Tensor:
        """The columns ``active_dims`` of ``kernel`` take from ``x`` ``[..., d]``."""
        dims = self.dims[id(kernel)]
        return x if dims is None else x.index_select(-1, dims.to(x.device))

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        """Dense ``[k(x_i, y_j)]`` ``[..., n, m]`` of ``x`` ``[..., n, d]`` and ``y`` ``[..., m, d]``
        (no autograd switch here: callers run under ``torch.no_grad()``)."""
        return _matrix(self, self.kernel, x, y)

    def diag(self, x: Tensor) -> Tensor:
        """``[k(x_i, x_i)]`` ``[n]`` of ``x`` ``[n, d]``."""
        return _diag(self, self.kernel, x)


def pairwise_sq_dist(a: Tensor, b: Tensor, *, broadcast: bool | None = None) -> Tensor:
    """``‖a_i − b_j‖²`` ``[..., na, nb]`` of ``a`` ``[..., na, d]`` and ``b`` ``[..., nb, d]`` from
    the coordinate differences (no matrix-product cancellation: the plain RBF of the Nyström
    models). On the CPU by ``torch.cdist`` squared (the rounding that the compiled RBF of
    :mod:`torchbandits.native.ekucb` reproduces bit for bit); on any other device by one broadcast
    difference, squared and summed: CUDA's ``cdist`` spends a thread block on every pair (757 µs a
    call for EK-UCB's ``[1024, A, M]`` blocks on an H100, 64% of the GPU's time there). The two
    agree to rounding; ``broadcast`` picks one regardless of the device."""
    if not (a.device.type != "cpu" if broadcast is None else broadcast):
        return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square_()
    return (a[..., :, None, :] - b[..., None, :, :]).square_().sum(-1)


def _scaled_sqdist(x: Tensor, y: Tensor, lengthscale: Tensor) -> Tensor:
    """``‖(x − y)/ℓ‖²`` for all pairs ``[..., n, m]``, via one matrix product (clamped at 0):
    ``(‖x/ℓ‖² − (2x/ℓ)·(y/ℓ)) + ‖y/ℓ‖²``, the ``[n, m]`` steps in place."""
    ls = lengthscale.reshape(-1).to(dtype=x.dtype)
    xs, ys = x / ls, y / ls
    sq = torch.matmul(2.0 * xs, ys.transpose(-1, -2))
    torch.sub((xs * xs).sum(-1, keepdim=True), sq, out=sq)
    sq.add_((ys * ys).sum(-1).unsqueeze(-2))
    return sq.clamp_min_(0.0)


def _matern_(sq: Tensor, nu: float) -> Tensor:
    """Matérn-ν of the scaled squared distances ``sq`` (overwritten), ``r = sqrt(sq)``."""
    r = sq.sqrt_()
    if nu == 0.5:
        return r.neg_().exp_()
    if nu == 1.5:
        s = r.mul_(math.sqrt(3.0))
        out = s + 1.0
        return out.mul_(s.neg_().exp_())
    if nu == 2.5:
        s = r.mul_(math.sqrt(5.0))
        out = s + 1.0
        out.add_(torch.mul(s, s).div_(3.0))
        return out.mul_(s.neg_().exp_())
    raise ValueError(f"Matérn nu must be 0.5, 1.5 or 2.5, got {nu}")


def _matrix(plan: KernelPlan, kernel: Kernel, x: Tensor, y: Tensor) -> Tensor:
    if isinstance(kernel, ScaleKernel):
        return plan.hyper[id(kernel)].to(x.dtype) * _matrix(plan, kernel.base_kernel, x, y)
    if isinstance(kernel, (ProductKernel, AdditiveKernel)):
        xs, ys = plan.select(kernel, x), plan.select(kernel, y)
        out = _matrix(plan, kernel.kernels[0], xs, ys)
        for k in kernel.kernels[1:]:
            part = _matrix(plan, k, xs, ys)
            out = out * part if isinstance(kernel, ProductKernel) else out + part
        return out
    xs, ys = plan.select(kernel, x), plan.select(kernel, y)
    if isinstance(kernel, RBFKernel):
        return _scaled_sqdist(xs, ys, plan.hyper[id(kernel)]).mul_(-0.5).exp_()
    if isinstance(kernel, MaternKernel):
        return _matern_(_scaled_sqdist(xs, ys, plan.hyper[id(kernel)]), kernel.nu)
    if isinstance(kernel, LinearKernel):
        return plan.hyper[id(kernel)].to(x.dtype).reshape(()) * (xs @ ys.transpose(-1, -2))
    with gpytorch.settings.lazily_evaluate_kernels(False):
        return kernel(x, y).to_dense()


def _diag(plan: KernelPlan, kernel: Kernel, x: Tensor) -> Tensor:
    if isinstance(kernel, ScaleKernel):
        return plan.hyper[id(kernel)].to(x.dtype) * _diag(plan, kernel.base_kernel, x)
    if isinstance(kernel, (ProductKernel, AdditiveKernel)):
        xs = plan.select(kernel, x)
        out = _diag(plan, kernel.kernels[0], xs)
        for k in kernel.kernels[1:]:
            part = _diag(plan, k, xs)
            out = out * part if isinstance(kernel, ProductKernel) else out + part
        return out
    if isinstance(kernel, (RBFKernel, MaternKernel)):
        return x.new_ones(x.shape[0])
    xs = plan.select(kernel, x)
    if isinstance(kernel, LinearKernel):
        return plan.hyper[id(kernel)].to(x.dtype).reshape(()) * (xs * xs).sum(-1)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        return kernel(x, x, diag=True).to_dense()


@torch.no_grad()
def kernel_matrix(kernel: Kernel, x: Tensor, y: Tensor) -> Tensor:
    """Dense ``[k(x_i, y_j)]`` of shape ``[n, m]`` in the dtype/device of ``x`` (leading batch
    dimensions allowed)."""
    return KernelPlan(kernel).matrix(x, y)


@torch.no_grad()
def kernel_diag(kernel: Kernel, x: Tensor) -> Tensor:
    """``[k(x_i, x_i)]`` of shape ``[n]`` without forming the matrix."""
    return KernelPlan(kernel).diag(x)


def kernel_bound(kernel: Kernel) -> float | None:
    """``sup_x k(x, x)`` for stationary kernels (κ² in the papers), ``None`` if unbounded."""
    if isinstance(kernel, ScaleKernel):
        inner = kernel_bound(kernel.base_kernel)
        return None if inner is None else float(kernel.outputscale) * inner
    if isinstance(kernel, ProductKernel):
        out = 1.0
        for k in kernel.kernels:
            b = kernel_bound(k)
            if b is None:
                return None
            out *= b
        return out
    if isinstance(kernel, (RBFKernel, MaternKernel)):
        return 1.0
    return None

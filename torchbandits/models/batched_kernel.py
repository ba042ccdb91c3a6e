"""Batched kernel rows ``[R, m, n]`` written into a reused buffer (the scoring of
:mod:`torchbandits.models.batched_exact`).

:func:`~torchbandits.kernels.kernel_matrix` allocates its ``[R, m, n]`` result and two
temporaries of that size per call; at ``R = 64``, ``m = 100`` candidates and ``n`` points these
are multi-MB blocks that the allocator returns to the system and page-faults again every round
(the zeroing of fresh pages cost as much as the Matérn's arithmetic, measured in
``docs/batch.md``). :func:`kernel_rows_into` evaluates the RBF and Matérn kernels (optionally
with an output scale) with the operations of :func:`~torchbandits.kernels.kernel_matrix` (the
same numbers, but for Matérn-5/2's ``s²/3``, one fused multiply-add: within an ulp) in place in
buffers of a
:class:`~torchbandits.models.batched_inverse.Workspace`; any other kernel goes through
:func:`~torchbandits.kernels.kernel_matrix`. With ``r = ‖x − x'‖/ℓ``:

* RBF ``exp(−r²/2)``; Matérn-1/2 ``exp(−r)``; Matérn-3/2 ``(1 + s) exp(−s)``, ``s = √3 r``;
  Matérn-5/2 ``(1 + s + s²/3) exp(−s)``, ``s = √5 r``.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from ..kernels import KernelPlan, kernel_matrix
from .batched_inverse import Workspace

__all__ = ["kernel_rows_into"]


def _scaled_sqdist_into(x: Tensor, y: Tensor, lengthscale: Tensor, out: Tensor) -> Tensor:
    """``‖(x − y)/ℓ‖²`` ``[R, m, n]`` into ``out``: ``(‖x/ℓ‖² − (2x/ℓ)·(y/ℓ)) + ‖y/ℓ‖²``,
    clamped at 0 (the operations of :func:`~torchbandits.kernels.kernel_matrix`)."""
    ls = lengthscale.reshape(-1).to(dtype=x.dtype)
    xs, ys = x / ls, y / ls
    torch.bmm(2.0 * xs, ys.transpose(-1, -2), out=out)
    torch.sub((xs * xs).sum(-1, keepdim=True), out, out=out)
    out.add_((ys * ys).sum(-1).unsqueeze(-2))
    return out.clamp_min_(0.0)


def _matern_into(sq: Tensor, nu: float, tmp: Tensor) -> Tensor:
    """Matérn-ν of the scaled squared distances ``sq`` (overwritten, returned), ``tmp`` a
    buffer of the same shape."""
    r = sq.sqrt_()
    if nu == 0.5:
        return r.neg_().exp_()
    if nu == 1.5:
        s = r.mul_(math.sqrt(3.0))
        out = torch.add(s, 1.0, out=tmp)
        return s.neg_().exp_().mul_(out)
    if nu == 2.5:
        s = r.mul_(math.sqrt(5.0))
        out = torch.add(s, 1.0, out=tmp).addcmul_(s, s, value=1.0 / 3.0)
        return s.neg_().exp_().mul_(out)
    raise ValueError(f"Matérn nu must be 0.5, 1.5 or 2.5, got {nu}")


def kernel_rows_into(kernel: Kernel, x: Tensor, y: Tensor, workspace: Workspace,
                     name: str = "kernel") -> Tensor:
    """``[k(x_i, y_j)]`` ``[R, m, n]`` of ``x`` ``[R, m, d]`` and ``y`` ``[R, n, d]``: for an
    RBF or Matérn kernel (without ``active_dims``, optionally in a ``ScaleKernel``) a view of the
    workspace buffer ``name`` (valid until that buffer's next use), else a new tensor. The
    values are those of :func:`~torchbandits.kernels.kernel_matrix`."""
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    if not isinstance(base, (RBFKernel, MaternKernel)) or base.active_dims is not None \
            or kernel.active_dims is not None or x.ndim != 3:
        return kernel_matrix(kernel, x, y)
    plan = KernelPlan(kernel)
    shape = (x.shape[0], x.shape[1], y.shape[1])
    sq = _scaled_sqdist_into(x, y, plan.hyper[id(base)], workspace.get(name, shape, x))
    if isinstance(base, RBFKernel):
        out = sq.mul_(-0.5).exp_()
    else:
        out = _matern_into(sq, base.nu, workspace.get(name + "_tmp", shape, x))
    if base is not kernel:
        out.mul_(plan.hyper[id(kernel)].to(x.dtype))
    return out

"""Stationary kernels evaluated on inputs scaled once: the fast path of the exact posterior.

For the stationary kernels of the papers (Flynn & Reeb 2024, §7; Zenati et al. 2022, §5) with
lengthscales ``ℓ`` ``[d]`` (one, or one per dimension) and an optional output scale ``s``:

* RBF: ``k = s · exp(−D)`` with ``D = ‖(x − x')·w‖²``, ``w = 1/(√2 ℓ)``;
* Matérn-ν: with ``w = √(2ν)/ℓ`` and ``u = sqrt(D)`` (that is ``√(2ν) r/ℓ``):
  ν = 1/2: ``s · exp(−u)``; ν = 3/2: ``s · (1 + u) exp(−u)``; ν = 5/2: ``s · (1 + u + D/3) exp(−u)``.

An input is multiplied by ``w`` once (a stored point when it is appended, a candidate set once
per scoring); then ``D = ‖x̃‖² − 2 x̃·x̃' + ‖x̃'‖²`` ``[n, A]`` is one matrix product into which the
squared norms are added (clamped at 0), and the closed form above is applied in place: about ten
tensor operations for the whole ``[n, A]`` block, the same values as GPyTorch's ``MaternKernel``
and ``RBFKernel`` (which compute the same distances) to rounding (the tests hold them to 1e-12).
GPyTorch stays the source of the kernel's definition and hyper-parameters:
:class:`ScaledStationary` is built from a kernel (``None`` for any other kernel, which the
general path of :mod:`torchbandits.kernels` evaluates).
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

__all__ = ["ScaledStationary"]


class ScaledStationary:
    """A stationary kernel (RBF or Matérn-1/2, 3/2, 5/2, optionally in a ``ScaleKernel``, no
    ``active_dims``) as ``(kind, w, s)``: see the module docstring.

    Args:
        kind: ``"rbf"`` or the Matérn smoothness ``0.5``, ``1.5``, ``2.5`` as ``"matern"``.
        nu: the Matérn ν (``inf`` for RBF).
        weight: ``w`` ``[d]`` or ``[1]`` (a tensor in the kernel's dtype and device).
        outputscale: ``s`` (``None``: 1, no multiplication).
    """

    __slots__ = ("_weights", "diag_value", "kind", "nu", "outputscale", "weight")

    def __init__(self, kind: str, nu: float, weight: Tensor, outputscale: float | None) -> None:
        self.kind, self.nu = kind, nu
        self.weight = weight.detach().reshape(-1)
        self.outputscale = outputscale
        self.diag_value = 1.0 if outputscale is None else float(outputscale)
        self._weights: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    @classmethod
    def of(cls, kernel: Kernel, hyper: dict[int, Tensor]) -> ScaledStationary | None:
        """The form of ``kernel`` (``hyper``: its lengthscale / output scale per module id, as
        read by :class:`~torchbandits.kernels.KernelPlan`), or ``None`` if it has none."""
        scale: float | None = None
        base = kernel
        if isinstance(kernel, ScaleKernel):
            out = hyper[id(kernel)].detach().reshape(-1)
            if out.numel() != 1 or kernel.active_dims is not None:
                return None
            scale, base = float(out[0]), kernel.base_kernel
        if base.active_dims is not None or type(base) not in (RBFKernel, MaternKernel):
            return None
        ls = hyper[id(base)].detach()
        if ls.ndim > 2 or (ls.ndim == 2 and ls.shape[0] != 1):
            return None  # batched hyper-parameters: the general path
        if type(base) is RBFKernel:
            return cls("rbf", math.inf, 1.0 / (math.sqrt(2.0) * ls), scale)
        nu = float(base.nu)
        if nu not in (0.5, 1.5, 2.5):
            return None
        return cls("matern", nu, math.sqrt(2.0 * nu) / ls, scale)

    def scale(self, x: Tensor) -> Tensor:
        """``x̃ = x · w`` ``[..., d]`` (a new tensor)."""
        key = (x.dtype, x.device)
        w = self._weights.get(key)
        if w is None:
            w = self._weights[key] = self.weight.to(dtype=x.dtype, device=x.device)
        return x * w

    @staticmethod
    def sqnorm(xs: Tensor) -> Tensor:
        """``‖x̃_i‖²`` ``[n]`` of scaled rows ``[n, d]``."""
        return (xs * xs).sum(-1)

    def cross(self, xs: Tensor, xsq: Tensor, cs: Tensor, csq: Tensor) -> Tensor:
        """``[k(x_i, c_j)]`` ``[n, A]`` from scaled rows ``xs`` ``[n, d]``, ``cs`` ``[A, d]`` and
        their squared norms ``xsq`` ``[n]``, ``csq`` ``[A]``."""
        dist = torch.addmm(xsq.unsqueeze(-1), xs, cs.mT, alpha=-2.0)
        dist.add_(csq).clamp_min_(0.0)
        return self.of_sqdist_(dist)

    def of_sqdist_(self, dist: Tensor) -> Tensor:
        """The kernel of scaled squared distances ``D`` (overwritten or consumed)."""
        if self.kind == "rbf":
            out = dist.neg_().exp_()
        else:
            u = torch.sqrt(dist)
            if self.nu == 2.5:  # (1 + u + D/3) / exp(u)
                out = torch.add(u, dist, alpha=1.0 / 3.0).add_(1.0)
                out.div_(u.exp_())
            elif self.nu == 1.5:
                out = u + 1.0
                out.div_(u.exp_())
            else:
                out = u.neg_().exp_()
        return out if self.outputscale is None else out.mul_(self.outputscale)

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        """``[k(x_i, y_j)]`` ``[n, m]`` of unscaled ``x`` ``[n, d]``, ``y`` ``[m, d]``."""
        xs, ys = self.scale(x), self.scale(y)
        return self.cross(xs, self.sqnorm(xs), ys, self.sqnorm(ys))

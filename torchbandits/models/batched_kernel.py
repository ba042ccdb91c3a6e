"""Batched kernel rows ``[R, m, n]`` written into a reused buffer (the scoring of
:mod:`torchbandits.models.batched_exact`).

:func:`~torchbandits.kernels.kernel_matrix` allocates its ``[R, m, n]`` result and two
temporaries of that size per call; at ``R = 64``, ``m = 100`` candidates and ``n`` points these
are multi-MB blocks that the allocator returns to the system and page-faults again every round
(the zeroing of fresh pages cost as much as the Matérn's arithmetic, measured in
``docs/batch-performance.md``). :func:`kernel_rows_into` evaluates the RBF and Matérn kernels (optionally
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

from ..buffers import grow_rows
from ..kernel_fast import ScaledStationary
from ..kernels import KernelPlan, _matern_, kernel_diag, kernel_matrix
from .batched_inverse import Workspace

__all__ = ["ScaledPoints", "fast_kernel", "kernel_rows_into", "rows_from_scaled"]


def _scaled_sqdist_into(xs: Tensor, ys: Tensor, ysq: Tensor, out: Tensor) -> Tensor:
    """``‖(x − y)/ℓ‖²`` ``[R, m, n]`` into ``out`` from the scaled points ``xs = x/ℓ``
    ``[R, m, d]``, ``ys = y/ℓ`` ``[R, n, d]`` and ``ysq = ‖y/ℓ‖²`` ``[R, n]``:
    ``(‖x/ℓ‖² − (2x/ℓ)·(y/ℓ)) + ‖y/ℓ‖²``, clamped at 0 (the operations of
    :func:`~torchbandits.kernels.kernel_matrix`)."""
    torch.bmm(xs, ys.transpose(-1, -2), out=out)
    torch.sub((xs * xs).sum(-1, keepdim=True), out, alpha=2.0, out=out)   # 2·(x·y) is exact
    out.add_(ysq.unsqueeze(-2))
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


def fast_kernel(kernel: Kernel) -> bool:
    """Whether ``kernel`` is evaluated here: RBF or Matérn without ``active_dims``, optionally in
    a ``ScaleKernel`` (any other kernel goes through :func:`~torchbandits.kernels.kernel_matrix`)."""
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    return isinstance(base, (RBFKernel, MaternKernel)) and base.active_dims is None \
        and kernel.active_dims is None


def rows_from_scaled(kernel: Kernel, xs: Tensor, ys: Tensor, ysq: Tensor, scale: Tensor | None,
                     workspace: Workspace, name: str = "kernel") -> Tensor:
    """``[k(x_i, y_j)]`` ``[R, m, n]`` of a :func:`fast_kernel` from the scaled points
    ``xs = x/ℓ`` ``[R, m, d]``, ``ys = y/ℓ`` ``[R, n, d]``, ``ysq = ‖y/ℓ‖²`` ``[R, n]`` and the
    output scale (``None`` without a ``ScaleKernel``): a view of the workspace buffer ``name``."""
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    shape = (xs.shape[0], xs.shape[1], ys.shape[1])
    sq = _scaled_sqdist_into(xs, ys, ysq, workspace.get(name, shape, xs))
    if isinstance(base, RBFKernel):
        out = sq.mul_(-0.5).exp_()
    else:
        out = _matern_into(sq, base.nu, workspace.get(name + "_tmp", shape, xs))
    if scale is not None:
        out.mul_(scale)
    return out


def kernel_rows_into(kernel: Kernel, x: Tensor, y: Tensor, workspace: Workspace,
                     name: str = "kernel") -> Tensor:
    """``[k(x_i, y_j)]`` ``[R, m, n]`` of ``x`` ``[R, m, d]`` and ``y`` ``[R, n, d]``: for a
    :func:`fast_kernel` a view of the workspace buffer ``name`` (valid until that buffer's next
    use), else a new tensor. The values are those of :func:`~torchbandits.kernels.kernel_matrix`."""
    if not fast_kernel(kernel) or x.ndim != 3:
        return kernel_matrix(kernel, x, y)
    plan = KernelPlan(kernel)
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    ls = plan.hyper[id(base)].reshape(-1).to(dtype=x.dtype)
    xs, ys = x / ls, y / ls
    scale = plan.hyper[id(kernel)].to(x.dtype) if base is not kernel else None
    return rows_from_scaled(kernel, xs, ys, (ys * ys).sum(-1), scale, workspace, name)


class ScaledPoints:
    """A model's stored points divided by the lengthscale, ``y/ℓ`` ``[R, cap, d]``, and their
    squared norms ``‖y/ℓ‖²`` ``[R, cap]``, kept in step with appends (one row each), with the
    kernel's hyper-parameters read once (``ℓ`` ``[d]`` and the output scale, in the model's dtype).

    Scoring ``R`` runs every round needs ``y/ℓ`` and ``‖y/ℓ‖²`` of all ``n`` stored points and
    the constrained hyper-parameters (a ``softplus`` per read); recomputed each call these are
    operations (kernel launches on a GPU) that do no new work. The hyper-parameters are read again
    when a raw parameter of the kernel is replaced or changed in place (its identity, storage or
    version counter; GPyTorch's setters copy through ``.data``, which a version counter does not
    see: a kernel whose hyper-parameters are set so between rounds is read again at the model's
    next ``reset``, which :meth:`clear` s this). The points are rebuilt from the model's input
    buffer when that buffer was replaced or written by anyone else (its identity and version
    counter, host metadata): a window removal, a state load, a companion's block append."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget the hyper-parameters and the points (read again at the next use)."""
        self.hyper_key: tuple | None = None
        self.ls: Tensor | None = None          # ℓ [d] (or [1]) in the model's dtype
        self.scale: Tensor | None = None       # the output scale (None: no ScaleKernel)
        self.one: Tensor | None = None         # k(x, x) of the kernel, a 0-d tensor
        self.form: ScaledStationary | None = None   # its closed form (the compiled path's)
        self.xs: Tensor | None = None          # y/ℓ [R, cap, d]
        self.sq: Tensor | None = None          # ‖y/ℓ‖² [R, cap]
        self.src: Tensor | None = None         # the input buffer they match ...
        self.version = -1                      # ... at this version counter
        self.n = 0                             # ... for this many rows

    def hyper(self, kernel: Kernel, like: Tensor) -> Tensor:
        """``ℓ`` ``[d]`` of a :func:`fast_kernel` in ``like``'s dtype (read when the kernel's raw
        parameters changed since the last read)."""
        key = (id(kernel), like.dtype, like.device,
               tuple((id(p), p.data_ptr(), p._version) for p in kernel.parameters()))
        if key != self.hyper_key or self.ls is None:
            plan = KernelPlan(kernel)
            base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
            self.ls = plan.hyper[id(base)].detach().reshape(-1).to(dtype=like.dtype)
            self.scale = plan.hyper[id(kernel)].detach().to(like.dtype) \
                if base is not kernel else None
            self.one = like.new_ones(()) if self.scale is None else \
                self.scale.reshape(()) if self.scale.numel() == 1 else None
            # (the compiled path runs on the CPU only: no host read of a device's scale)
            self.form = ScaledStationary.of(kernel, plan.hyper) if like.is_cpu else None
            self.hyper_key = key
            self.src = None        # the points were scaled by the old ℓ
        return self.ls

    def stationary(self, kernel: Kernel, like: Tensor) -> ScaledStationary | None:
        """The closed form ``(kind, w, s)`` of a :func:`fast_kernel` read with :meth:`hyper`
        (:class:`~torchbandits.kernel_fast.ScaledStationary`; ``None``: a batch of output
        scales), what the compiled scoring evaluates."""
        self.hyper(kernel, like)
        return self.form

    def diag(self, kernel: Kernel, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``k(x, x)`` ``[*shape]`` of a :func:`fast_kernel` (1, or the output scale), an expanded
        view (no operation; the values of :func:`~torchbandits.kernels.kernel_diag`)."""
        self.hyper(kernel, like)
        if self.one is None:   # a batch of output scales: GPyTorch's shapes
            return kernel_diag(kernel, like.reshape(-1, like.shape[-1])).reshape(shape)
        return self.one.expand(shape)

    def points(self, kernel: Kernel, x: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """``(y/ℓ [R, n, d], ‖y/ℓ‖² [R, n])`` of the first ``n`` rows of the input buffer ``x``
        ``[R, cap, d]`` (views; rebuilt if ``x`` changed otherwise than by :meth:`append`)."""
        ls = self.hyper(kernel, x)
        if self.src is not x or self.version != x._version or self.n != n:
            xs = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
            sq = torch.zeros(x.shape[:2], dtype=x.dtype, device=x.device)
            torch.div(x[:, :n], ls, out=xs[:, :n])
            torch.sum(xs[:, :n] * xs[:, :n], -1, out=sq[:, :n])
            self.xs, self.sq, self.src, self.version, self.n = xs, sq, x, x._version, n
        assert self.xs is not None and self.sq is not None
        return self.xs[:, :n], self.sq[:, :n]

    def scaled(self, kernel: Kernel, x: Tensor, buf: Tensor, n: int
               ) -> tuple[Tensor, Tensor] | None:
        """``(x/ℓ, ‖x/ℓ‖²)`` of new points ``x`` ``[R, d]`` (``[R, d]``, ``[R]``) about to become row
        ``n`` of the input buffer ``buf`` ``[R, cap, d']``, written into row ``n`` of the kept
        points (views; :meth:`append` makes them part of the points); ``None`` unless
        :func:`fast_kernel` and ``d = d'``."""
        if not fast_kernel(kernel) or buf.shape[2] != x.shape[-1]:
            return None
        self.points(kernel, buf, n)
        assert self.xs is not None and self.sq is not None
        self.xs = grow_rows(self.xs, n + 1, dims=(1,))
        self.sq = grow_rows(self.sq, n + 1, dims=(1,))
        xs = torch.div(x, self.ls, out=self.xs[:, n])
        return xs, torch.sum(xs * xs, -1, out=self.sq[:, n])

    def append(self, x: Tensor, n: int) -> None:
        """Row ``n`` of the input buffer ``x`` was just written, its scaled form by :meth:`scaled`
        (the earlier rows unchanged since)."""
        if self.xs is not None and self.xs.shape[1] > n:
            self.src, self.version, self.n = x, x._version, n + 1

    def rows(self, kernel: Kernel, cand: Tensor, x: Tensor, n: int, workspace: Workspace
             ) -> Tensor:
        """:func:`kernel_rows_into` of candidates ``[R, A, d]`` and the first ``n`` rows of the
        input buffer ``x``, from the kept scaled points: ``[R, A, n]``, a workspace view (another
        kernel: :func:`kernel_rows_into`)."""
        if not fast_kernel(kernel):
            return kernel_rows_into(kernel, cand, x[:, :n], workspace)
        xs, sq = self.points(kernel, x, n)
        return rows_from_scaled(kernel, cand / self.ls, xs, sq, self.scale, workspace)

    def column(self, kernel: Kernel, x: Tensor, n: int, xs_new: Tensor, sq_new: Tensor
               ) -> Tensor:
        """``k_S(x)`` ``[R, n, 1]`` of the first ``n`` rows of the input buffer ``x`` and one new
        point per run (scaled ``xs_new`` ``[R, d]``, norm ``sq_new`` ``[R]``), with the operations
        of :func:`~torchbandits.kernels.kernel_matrix` (``‖y/ℓ‖² − (2y/ℓ)·(x/ℓ)`` as one
        subtraction with ``alpha = 2``: a doubling is exact, the same numbers)."""
        base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
        xs, sq = self.points(kernel, x, n)
        d2 = torch.bmm(xs, xs_new[:, :, None])                               # [R, n, 1]
        torch.sub(sq[..., None], d2, alpha=2.0, out=d2)
        d2.add_(sq_new[:, None, None]).clamp_min_(0.0)
        out = d2.mul_(-0.5).exp_() if isinstance(base, RBFKernel) else _matern_(d2, base.nu)
        return out if self.scale is None else self.scale * out

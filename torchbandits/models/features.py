"""Finite feature maps of a kernel on a finite arm set (Hong, Li & Tewari 2023, Section 2 and Appendix I).

Only inner products matter: any ``Φ ∈ R^{N×r}`` with ``ΦΦᵀ = K`` is an equivalent feature map,
and every quantity of OPKB (IPS matrices, leverages, OP solutions, γ_T) is invariant to the
choice (App. I). The paper uses the Cholesky factor of ``K + εI`` (``ε ≈ 1e-10``); when Cholesky
fails the symmetric eigen square root ``U max(Λ, 0)^{1/2}`` is used.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_matrix

__all__ = ["cholesky_features", "eigen_features", "kernel_features"]


def eigen_features(k: Tensor) -> Tensor:
    """``Φ = U max(Λ, 0)^{1/2}`` with ``K = UΛUᵀ`` (``[N, N]``)."""
    k = 0.5 * (k + k.T)
    evals, evecs = torch.linalg.eigh(k)
    return evecs * torch.sqrt(torch.clamp(evals, min=0.0))


def cholesky_features(k: Tensor, jitter: float = 1e-10) -> Tensor:
    """Lower Cholesky factor of ``K + jitter·I`` (the paper's feature map), falling back to the
    eigen square root if ``K`` is numerically indefinite."""
    if k.ndim != 2 or k.shape[0] != k.shape[1]:
        raise ValueError(f"K must be a square matrix, got shape {tuple(k.shape)}")
    if not bool(torch.isfinite(k).all()):
        raise ValueError("K must be finite")
    eye = torch.eye(k.shape[0], dtype=k.dtype, device=k.device)
    chol, info = torch.linalg.cholesky_ex(0.5 * (k + k.T) + jitter * eye)
    if int(info) == 0:
        return chol
    return eigen_features(k)


def kernel_features(kernel: Kernel, arms: Tensor, jitter: float = 1e-10) -> Tensor:
    """Cholesky feature map of ``kernel`` on the rows of ``arms``."""
    return cholesky_features(kernel_matrix(kernel, arms, arms), jitter)

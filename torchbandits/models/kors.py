"""KORS: Kernel Online Row Sampling, the incremental dictionary of EK-UCB (Zenati et al., AISTATS
2022, §4.2, Algorithms 1 and 5, App. E.3).

Once per round, only for the newly played state ``s_t``, KORS decides whether ``s_t`` joins the
dictionary; rejected points are never reconsidered and anchors are never removed
(``Z_1 ⊆ Z_2 ⊆ …``). State: the acceptance probabilities ``p̃_i`` of the anchors, the weights
``S = diag(1/√p̃_i)`` and ``N = (S K_ZZ S + μ I)⁻¹``, stored as ``(K_ZZ + μ diag(p̃))⁻¹``
(``= S N S``), which needs no weighting of ``k_Z``.

Leverage score (Zenati et al. 2022, eq. 41, in closed form): with ``b = S k_Z(s_t)``, ``u = bᵀ N b``
and ``ρ = k(s_t, s_t) − u``,

    ``τ̃_t = (1 + ε) ρ / (ρ + μ)``,

which is eq. 41 evaluated with ``s_t`` temporarily added with weight 1. Acceptance probability
``p̃_t = min(γ τ̃_t, 1)``. On acceptance ``N`` is bordered with ``b/√p̃_t`` and
``k(s_t,s_t)/p̃_t + μ``.

``score="reference"`` reproduces the authors' released code: it computes
``(1+ε) μ⁻¹ vᵀ(S*K*S* + μI)⁻¹ v = (1+ε) k(s_t,s_t)/μ − τ̃_t``, which is *largest for redundant
points*; offered only to match the code's dictionary sizes and timings. Its acceptance
probabilities equal the code's (``Σ p̃`` within a few %), but many accepted points lie in the span
of the dictionary, and the caller's ``min_residual`` guard refuses them; the code's dictionary
sizes need the guard off (``min_residual=0`` with a ``1e-8`` nugget on ``K_ZZ``, see
docs/reproductions/ekucb.md).

The coin is drawn by the caller (the policy owns the generator), and the caller may veto an
accepted point (the ``min_residual`` guard of :class:`~torchbandits.models.NystromKernelRidge`),
so the decision is split into :meth:`KORS.probability` and :meth:`KORS.add`.
"""

from __future__ import annotations

from typing import Literal

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import ResizableModule, grow_rows, set_plain
from ..kernels import kernel_matrix
from ..validation import check_positive
from .nystrom_updates import border_apply, border_prepare

__all__ = ["KORS", "kors_leverage_eq41"]

KorsScore = Literal["correct", "reference"]


class KORS(ResizableModule):
    """Incremental ridge-leverage-score sampler (Zenati et al. 2022, Algorithm 5).

    Args:
        mu: KORS regulariser ``μ > 0`` (projection accuracy; theory ``μ = λ``).
        eps: accuracy ``ε ≥ 0`` of the leverage estimate (0.5 in the paper's code).
        gamma: oversampling budget ``γ > 0`` (theory ``12 log(T/δ)``, Zenati et al. 2022 App. E.3;
            authors' code ``b·λ``).
        score: ``"correct"`` (eq. 41, default) or ``"reference"`` (the authors' code).
    """

    def __init__(
        self,
        mu: float,
        eps: float = 0.5,
        gamma: float = 1.0,
        score: KorsScore = "correct",
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.mu = check_positive("mu", mu)
        if not float(eps) >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.eps = float(eps)
        self.gamma = check_positive("gamma", gamma)
        if score not in ("correct", "reference"):
            raise ValueError(f"score must be 'correct' or 'reference', got {score!r}")
        self.score: KorsScore = score
        # N = (S K_ZZ S + μI)⁻¹ = S⁻¹ (K_ZZ + μ diag(p̃))⁻¹ S⁻¹ is kept as _nz = (K_ZZ + μ diag(p̃))⁻¹,
        # so that u = bᵀNb = k_Zᵀ _nz k_Z needs no weighting of k_Z
        self.register_buffer("_nz", torch.zeros(16, 16, dtype=dtype, device=device))
        self.register_buffer("_p", torch.zeros(16, dtype=dtype, device=device))
        self._m = 0

    @property
    def m(self) -> int:
        """``m``, the number of points in the dictionary."""
        return self._m

    @property
    def probabilities(self) -> Tensor:
        """Acceptance probabilities ``p̃`` of the anchors ``[m]`` (a view)."""
        return self._p[: self._m]

    @property
    def n_matrix(self) -> Tensor:
        """``N = (S K_ZZ S + μI)⁻¹ = diag(√p̃) (K_ZZ + μ diag(p̃))⁻¹ diag(√p̃)`` (a new tensor)."""
        sq = torch.sqrt(self._p[: self._m])
        return sq[:, None] * self._nz[: self._m, : self._m] * sq[None, :]

    def get_extra_state(self) -> dict:
        return {"m": self._m}

    def set_extra_state(self, state: dict) -> None:
        self._m = int(state["m"])

    def reset(self) -> None:
        """Empty the dictionary."""
        self._m = 0

    def leverage(self, kz: Tensor, kss: Tensor | float) -> float:
        """Estimated ridge leverage score ``τ̃`` of a point with ``k_Z = kz`` ``[m]`` and
        ``k(s,s) = kss`` (per ``score``). ``O(m²)``: ``u = bᵀNb = k_Zᵀ (K_ZZ + μ diag(p̃))⁻¹ k_Z``."""
        m = self._m
        kss_f = float(kss)
        if m:
            nz = self.__dict__.get("_nz_view")
            if nz is None or nz.shape[0] != m or nz.data_ptr() != self._nz.data_ptr():
                nz = self._nz[:m, :m]
                set_plain(self, "_nz_view", nz)  # (a plain attribute: no module checks)
            u = float(kz @ (nz @ kz))
        else:
            u = 0.0
        rho = max(kss_f - u, 0.0)
        tau = (1.0 + self.eps) * rho / (rho + self.mu)
        if self.score == "reference":
            tau = max((1.0 + self.eps) * kss_f / self.mu - tau, 0.0)
        return tau

    def probability(self, kz: Tensor, kss: Tensor | float) -> float:
        """``p̃ = min(γ τ̃, 1)``."""
        return min(self.gamma * self.leverage(kz, kss), 1.0)

    def add(self, kz: Tensor, kss: Tensor | float, p: float) -> None:
        """Record that the point (``k_Z = kz`` over the current anchors) joined with probability
        ``p``: border ``(K_ZZ + μ diag(p̃))⁻¹`` with ``k_Z`` and ``k(s,s) + μ p``. ``O(m²)``."""
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p must lie in (0, 1], got {p}")
        m = self._m
        border = border_prepare(self._nz[:m, :m], kz, float(kss) + self.mu * float(p))
        self._nz = grow_rows(self._nz, m + 1, dims=(0, 1))
        self._p = grow_rows(self._p, m + 1)
        border_apply(self._nz, m, *border)
        self._p[m] = float(p)
        self._m = m + 1

    def extra_repr(self) -> str:
        return f"mu={self.mu}, eps={self.eps}, gamma={self.gamma}, score={self.score!r}, m={self._m}"


@torch.no_grad()
def kors_leverage_eq41(
    kernel: Kernel, anchors: Tensor, probs: Tensor, point: Tensor, mu: float, eps: float
) -> Tensor:
    """Paper eq. 41 evaluated literally with the augmented weighted matrix (tests only):
    ``(1+ε)/μ (k(s,s) − vᵀ(S* K* S* + μI)⁻¹ v)``, ``v = S* K_{Z*}(s)``, ``S* = diag(S, 1)``."""
    zs = torch.cat([anchors, point[None]])
    w = torch.cat([1.0 / torch.sqrt(probs), probs.new_ones(1)])
    kstar = kernel_matrix(kernel, zs, zs)
    mat = w[:, None] * kstar * w[None, :] + mu * torch.eye(zs.shape[0], dtype=zs.dtype)
    v = w * kernel_matrix(kernel, zs, point[None])[:, 0]
    kss = kernel_matrix(kernel, point[None], point[None])[0, 0]
    return (1.0 + eps) / mu * (kss - v @ torch.linalg.solve(mat, v))

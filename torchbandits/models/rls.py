"""Ridge-leverage-score (RLS) dictionary resampling of BKB (Calandriello et al., COLT 2019, §3.1,
Fig. 1; per distinct arm, footnote 3).

After every pull BKB draws its dictionary **from scratch** out of all pulled points: each of the
``t`` pulls ``x̃_i`` is kept independently with probability

    p̃_i = min(q̄ · σ̃_t²(x̃_i), 1)

where ``σ̃_t²`` is the **1/λ-scaled** (ridge-leverage) approximate variance of the model that chose
the newest arm. Pulls of the same arm are deduplicated: arm ``a`` pulled ``n_a`` times receives
``c_a ~ Binomial(n_a, p̃_a)`` selected copies, it enters the dictionary iff ``c_a > 0`` (probability
``1 − (1 − p̃_a)^{n_a}``, identical in law to per-pull sampling), and ``m_theory = Σ_a c_a`` is the
multiset size that Theorem 1 bounds.

Samplers:

* ``"binomial"`` — the paper's law above (default).
* ``"linearized"`` — the authors' later code: arm ``a`` enters with probability
  ``min(1, n_a q̄ σ̃²_a)`` (a first-order approximation of the binomial law); ``m_theory`` counts
  entries.
* ``"all"`` — every pulled arm (the exact-GP limit, for tests and ablations).
* ``"uniform"`` — ablation: every pulled arm with the same probability ``min(1, q̄ / n_distinct)``
  (no leverage information; a DTC with uniformly sampled inducing points, the heuristic
  inducing-point choice that Calandriello et al. 2019, §1, contrast with RLS sampling).

All draws use the caller's CPU ``torch.Generator`` so seeded runs are identical on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["SAMPLERS", "RLSResampler", "Resample", "inclusion_probabilities", "theory_qbar"]

Sampler = Literal["binomial", "linearized", "all", "uniform"]
SAMPLERS: tuple[str, ...] = ("binomial", "linearized", "all", "uniform")


def theory_qbar(eps: float, delta: float, horizon: int) -> float:
    """Theorem 1's oversampling ``q̄ = 6 α log(4T/δ) / ε²`` with ``α = (1+ε)/(1−ε)``."""
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    alpha = (1.0 + eps) / (1.0 - eps)
    return 6.0 * alpha * math.log(4.0 * int(horizon) / delta) / eps**2


@dataclass
class Resample:
    """Outcome of one resampling: ``mask`` [n] over the distinct points (True = in the
    dictionary), ``copies`` [n] selected copies per point, and ``m_theory = Σ copies``."""

    mask: Tensor
    copies: Tensor
    m_theory: int

    @property
    def size(self) -> int:
        """Number of distinct dictionary points."""
        return int(self.mask.sum())


def inclusion_probabilities(variances: Tensor, counts: Tensor, qbar: float,
                            sampler: Sampler = "binomial") -> Tensor:
    """Probability that each distinct point enters the dictionary (its law in the tests):
    ``1 − (1 − min(q̄σ̃², 1))^{n}`` for ``"binomial"``, ``min(1, n q̄ σ̃²)`` for ``"linearized"``."""
    if sampler == "linearized":
        return torch.clamp(counts * qbar * variances.clamp_min(0.0), max=1.0)
    if sampler == "binomial":
        return 1.0 - (1.0 - torch.clamp(qbar * variances.clamp_min(0.0), max=1.0)) ** counts
    if sampler == "all":
        return torch.ones_like(variances)
    if sampler == "uniform":
        return torch.full_like(variances, min(1.0, qbar / max(variances.shape[0], 1)))
    raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")


def _cpu64(t: Tensor) -> Tensor:
    """``t`` as a CPU float64 tensor (itself when it is one)."""
    return t if t.is_cpu and t.dtype == torch.float64 else t.to("cpu", torch.float64)


def _as_mask(mask: Tensor, dev: torch.device, out: Tensor | None) -> Tensor:
    """The CPU ``mask`` on ``dev``, or copied into ``out`` (returned) when given."""
    return mask.to(dev) if out is None else out.copy_(mask)


class RLSResampler:
    """BKB's sampler: ``resample(variances, counts, generator) -> Resample``.

    Args:
        qbar: oversampling ``q̄ > 0`` (our practical default 5; Theorem 1 needs
            :func:`theory_qbar`).
        sampler: ``"binomial"`` (paper), ``"linearized"`` (authors' code), ``"all"``,
            ``"uniform"`` (see the module docstring).
    """

    def __init__(self, qbar: float = 5.0, sampler: Sampler = "binomial") -> None:
        qbar = float(qbar)
        if not qbar > 0 or math.isnan(qbar):
            raise ValueError(f"qbar must be > 0, got {qbar}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.qbar = qbar
        self.sampler: Sampler = sampler

    def probabilities(self, variances: Tensor, counts: Tensor) -> Tensor:
        """Per-point inclusion probabilities (see :func:`inclusion_probabilities`)."""
        return inclusion_probabilities(variances, counts, self.qbar, self.sampler)

    def draw(self, variances: Tensor, counts: Tensor, generator: torch.Generator,
             out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The draw of :meth:`resample` without its checks (the policy's per-round path): ``(mask,
        copies)`` with ``mask`` ``[n]`` on the variances' device and ``copies`` ``[n]`` the
        selected copies per point, or ``None`` where every selected point is one copy
        (``"linearized"``, ``"uniform"``: ``m_theory`` is then the dictionary size). ``out``: a
        boolean ``[n]`` tensor (the policy's dictionary mask) that receives the mask and is
        returned as it (written directly on a CPU device: no copy).

        One comparison per point: ``u < n_a q̄ σ̃²_a`` with ``u ~ U[0, 1)`` keeps the same points as
        ``u < min(1, n_a q̄ max(σ̃²_a, 0))`` (``u < 1``, ``u ≥ 0``), the clamps are not needed; with
        ``q̄ = 1`` the product is ``n_a σ̃²_a`` (``n_a · 1`` is exact: the same bits).
        """
        dev = variances.device
        var, cnt = _cpu64(variances), _cpu64(counts)
        n = var.shape[0]
        if self.sampler == "all":
            return _as_mask(torch.ones(n, dtype=torch.bool), dev, out), counts
        if self.sampler == "binomial":
            p = torch.clamp(self.qbar * var.clamp_min(0.0), max=1.0)
            copies = torch.binomial(cnt, p, generator=generator) if n else cnt.clone()
            return _as_mask(copies > 0, dev, out), copies.to(dev)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        if self.sampler == "linearized":
            prob = cnt * var if self.qbar == 1.0 else cnt * self.qbar * var
        else:
            prob = self.probabilities(var, cnt)
        if out is not None and out.is_cpu:
            return torch.lt(u, prob, out=out), None
        return _as_mask(torch.lt(u, prob), dev, out), None

    def resample(self, variances: Tensor, counts: Tensor, generator: torch.Generator) -> Resample:
        """Draw a fresh dictionary over the ``n`` distinct pulled points.

        Args:
            variances: ``[n]`` 1/λ-scaled approximate variances ``σ̃_t²`` of the distinct points
                (from the model that selected the newest arm, §3.1).
            counts: ``[n]`` pull counts ``n_a ≥ 1``.
            generator: CPU generator (all randomness comes from it).
        """
        if variances.shape != counts.shape or variances.dim() != 1:
            raise ValueError(f"variances and counts must be [n] tensors of the same shape, got "
                             f"{tuple(variances.shape)} and {tuple(counts.shape)}")
        mask, copies = self.draw(variances.detach(), counts.detach(), generator)
        if copies is None:
            copies = mask.to(variances.dtype)
        return Resample(mask=mask, copies=copies, m_theory=int(copies.sum()))

    def __repr__(self) -> str:
        return f"RLSResampler(qbar={self.qbar}, sampler={self.sampler!r})"

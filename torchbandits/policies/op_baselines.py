"""GP baselines of the experiments of Hong, Li & Tewari (AISTATS 2023, Section 6 and Appendix E),
as thin presets of the time-varying GP-UCB policies.

The policy classes are :class:`~torchbandits.policies.time_varying.SWGPUCB`,
:class:`~torchbandits.policies.time_varying.WGPUCB` and their base
:class:`~torchbandits.policies.time_varying.TimeVaryingUCB` (UCB on a posterior model with a
confidence rule); here they run on :class:`~torchbandits.models.finite_arm.FiniteArmRidge`, the
primal form on the fixed arm set (O(N²) per update, O(N³) per round for N arms, independent of
the window or history length — the kernel-form models cost O(w²) to O(n³) per round at
``T = 10⁴``). β multiplies the **GP** posterior sd ``σ(x) = √λ‖φ(x)‖_{V⁻¹}`` throughout.

* :func:`gp_ucb` — GP-UCB in the form of Algorithm 8 (IGP-UCB):
  ``UCB = μ + v·β_t·σ`` with ``β_t = 1 + sqrt(2(γ_{t−1} + 1 + ln 1/δ))`` (:class:`GainBeta`);
* :func:`sw_gp_ucb` — the same on the last ``w`` observations (the window's realised γ);
* :func:`wgp_ucb` — discounted GP-UCB (stable recursion), ``β_t = B + R sqrt(2(γ_t + ln 1/δ))``
  with ``B = 0.8``, ``R = 0.1`` (authors' code), width ``"gp"`` or the D-LinUCB ``"sandwich"``.

``γ`` is the realised information gain ``½ log det(V/λ)`` of the data the model holds.
``v`` is the tuned "UCB scale" (``v = 1``: theory). λ is the standard ridge. The authors' GP-UCB /
SW-GP-UCB code takes the reciprocal ``λ_code = 1/λ`` and scores
``μ + v·β·sqrt(λ_code·φᵀV⁻¹φ) = μ + v·β·σ/λ``: with ``convention="aistats2023_code"`` the presets
below keep our λ (pass ``1/λ_code``) and multiply the radius by ``1/λ``, so the paper's tuned
``v`` means what it meant there.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel

from ..confidence.gain import GainBeta
from ..kernels import check_kernel
from ..models.finite_arm import FiniteArmRidge
from .time_varying import SWGPUCB, WGPUCB, TimeVaryingUCB

__all__ = ["GainBeta", "gp_ucb", "sw_gp_ucb", "wgp_ucb"]


def _model(kernel: Kernel, lam: float, dtype: torch.dtype, device, **kw) -> FiniteArmRidge:
    return FiniteArmRidge(check_kernel(kernel), lam, dtype=dtype, device=device, **kw)


def _scale(ucb_scale: float, lam: float, convention: str) -> float:
    if convention == "standard":
        return ucb_scale
    if convention == "aistats2023_code":
        return ucb_scale / lam
    raise ValueError(f"convention must be 'standard' or 'aistats2023_code', got {convention!r}")


def gp_ucb(kernel: Kernel, lam: float = 1.0, ucb_scale: float = 1.0, *, delta: float = 0.01,
           convention: str = "standard", seed: int = 0, dtype: torch.dtype = torch.float64,
           device: torch.device | str | None = None) -> TimeVaryingUCB:
    """GP-UCB of Algorithm 8 on a fixed finite arm set (first index on ties)."""
    rule = GainBeta(_scale(ucb_scale, lam, convention), delta=delta)
    return TimeVaryingUCB(_model(kernel, lam, dtype, device), rule, tie_break="first", seed=seed,
                          dtype=dtype, device=device)


def sw_gp_ucb(kernel: Kernel, lam: float = 1.0, ucb_scale: float = 1.0, window: int = 3000, *,
              delta: float = 0.01, convention: str = "standard", seed: int = 0,
              dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> SWGPUCB:
    """SW-GP-UCB (Zhou & Shroff) with the Algorithm-8 radius on the window's data."""
    rule = GainBeta(_scale(ucb_scale, lam, convention), delta=delta)
    return SWGPUCB(kernel, lam, window, beta=rule, tie_break="first", seed=seed, dtype=dtype,
                   device=device, model=_model(kernel, lam, dtype, device))


def wgp_ucb(kernel: Kernel, lam: float = 0.01, ucb_scale: float = 0.5, discount: float = 0.9995, *,
            width: str = "gp", norm_bound: float = 0.8, noise_std: float = 0.1,
            delta: float = 0.01, seed: int = 0, dtype: torch.dtype = torch.float64,
            device: torch.device | str | None = None) -> WGPUCB:
    """WGP-UCB (discounted GP-UCB, stable recursion) as in the experiments of Hong, Li & Tewari
    (2023, Section 6)."""
    rule = GainBeta(ucb_scale, offset=norm_bound, noise=noise_std, extra=0.0, delta=delta)
    return WGPUCB(kernel, lam, discount, beta=rule, tie_break="first", seed=seed, dtype=dtype,
                  device=device, model=_model(kernel, lam, dtype, device, discount=discount,
                                              width=width))

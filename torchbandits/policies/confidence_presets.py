"""Named policies of seed 002 (Algorithm 1 with a confidence rule), all on the **GP** sd.

* :class:`CMMUCB` — Kernel CMM-UCB: the exact bound (1-D dual by default, CVXPY SOCP optional).
* :class:`DMMUCB` — Kernel DMM-UCB: min over the grid ``{0.1, 0.3, 1, 3, 10}·σ²/c``.
* :class:`AMMUCB` — Kernel AMM-UCB: ``μ_{σ²/c} + β^AMM ρ_{σ²/c}``.
* :class:`AYGPUCB` — AY-GP-UCB (Abbasi-Yadkori), regulariser ``λ = σ²/c`` by default.
* :class:`IGPUCB` — IGP-UCB (Chowdhury & Gopalan), regulariser ``1 + η``, constant 2 in the
  radius by default (``use_t_eta=True``: ``(t−1)η``; spec §7.4).

Every β multiplies the GP posterior standard deviation ``ρ_α`` (noise variance α, not divided by
α). Each policy plays a uniformly random arm in round 1 (the prior UCB is flat, spec §7.6), then
the argmax (first index on ties). The module also holds the registry factories ``f(env, **kw)``
(they read the environment's kernel, dimension, σ and B, and use :func:`default_c` with the
horizon ``T`` unless ``c`` is given).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gpytorch.kernels import Kernel
from torch import Tensor

from ..confidence import AYBeta, IGPBeta
from ..confidence.mixture import DMM_GRID, AMMBound, CMMBound, DMMBound, MixtureBound, default_c
from ..validation import check_positive
from .kernel_ucb import GPUCB, KernelUCB

__all__ = [
    "AMMUCB",
    "AYGPUCB",
    "CMMUCB",
    "DMMUCB",
    "IGPUCB",
    "amm_ucb",
    "aygp_ucb",
    "cmm_ucb",
    "dmm_ucb",
    "igp_ucb",
]


class _MixtureUCB(KernelUCB):
    """KernelUCB on a martingale-mixture rule, model regulariser ``α₀ = σ²/c``."""

    default_variance = "gp"

    def __init__(self, kernel: Kernel, rule: MixtureBound, **kwargs: Any) -> None:
        super().__init__(kernel, lam=rule.alpha0, beta=rule, **kwargs)

    def forward(self, candidates: Tensor) -> Tensor:
        cand = self.check_candidates(candidates)
        ucb = getattr(self.rule, "ucb", None)
        if ucb is not None:  # CMM: skip the LCB search
            return ucb(self.model, cand, self.t + 1) + self.refit_offset
        return self.rule.bounds(self.model, cand, self.t + 1)[0] + self.refit_offset


class CMMUCB(_MixtureUCB):
    """Kernel CMM-UCB (Eq. 10/12): UCB = exact max of f(x) over the confidence set.

    Args:
        kernel: GPyTorch kernel; noise_std σ; norm_bound B; delta δ; c mixture scale.
        method: ``"dual"`` (default, torch) or ``"socp"`` (CVXPY reference).
        rule_kwargs: further :class:`~torchbandits.confidence.mixture.CMMBound` options.
    """

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, method: str = "dual",
                 rule_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        rule = CMMBound(noise_std, norm_bound, delta, c, method, **(rule_kwargs or {}))
        super().__init__(kernel, rule, **kwargs)


class DMMUCB(_MixtureUCB):
    """Kernel DMM-UCB: per arm the min over ``α ∈ grid·σ²/c`` of Eq. (14) (GP sd)."""

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, grid: Sequence[float] = DMM_GRID,
                 **kwargs: Any) -> None:
        super().__init__(kernel, DMMBound(noise_std, norm_bound, delta, c, grid), **kwargs)


class AMMUCB(_MixtureUCB):
    """Kernel AMM-UCB: ``μ_{σ²/c} + sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²) ρ_{σ²/c}``."""

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, **kwargs: Any) -> None:
        super().__init__(kernel, AMMBound(noise_std, norm_bound, delta, c), **kwargs)


class AYGPUCB(GPUCB):
    """AY-GP-UCB: ``μ_λ + (σ sqrt(log det(I + K/λ) + 2 log(1/δ))/√λ + B) ρ_λ`` (GP sd).

    ``lam`` defaults to ``σ²/c`` (the paper's experiments, spec §5.1).
    """

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, lam: float | None = None, **kwargs: Any) -> None:
        lam = noise_std**2 / check_positive("c", c) if lam is None else lam
        super().__init__(kernel, lam, AYBeta(norm_bound, noise_std, lam=lam, delta=delta), **kwargs)


class IGPUCB(GPUCB):
    """IGP-UCB: ``μ_{1+η} + (B + σ sqrt(log det(I + K/(1+η)) + 2 + 2 log(1/δ))) ρ_{1+η}`` (GP sd;
    ``use_t_eta=True`` puts ``(t−1)η`` in place of the 2)."""

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, eta: float = 0.002, use_t_eta: bool = False,
                 **kwargs: Any) -> None:
        rule = IGPBeta(norm_bound, noise_std, delta=delta, eta=eta, use_t_eta=use_t_eta)
        super().__init__(kernel, 1.0 + rule.eta, rule, **kwargs)


# ------------------------------------------------------------------------ registry factories
def _env_params(env: Any, horizon: int, c: float | None) -> tuple[Kernel, dict[str, float]]:
    kernel = getattr(env, "kernel", None)
    if kernel is None:
        raise ValueError(f"environment {env!r} declares no kernel; build the policy directly")
    noise = float(getattr(env, "noise_std", 0.1)) or 0.1
    norm = float(getattr(env, "norm", 1.0))
    if c is None:
        c = default_c(kernel, int(getattr(env, "dim", 1)), int(horizon))
    return copy.deepcopy(kernel), {"noise_std": noise, "norm_bound": norm, "c": float(c)}


def cmm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> CMMUCB:
    kernel, p = _env_params(env, horizon, c)
    return CMMUCB(kernel, **{**p, **kwargs})


def dmm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> DMMUCB:
    kernel, p = _env_params(env, horizon, c)
    return DMMUCB(kernel, **{**p, **kwargs})


def amm_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> AMMUCB:
    kernel, p = _env_params(env, horizon, c)
    return AMMUCB(kernel, **{**p, **kwargs})


def aygp_ucb(env: Any, horizon: int = 1000, c: float | None = None, **kwargs: Any) -> AYGPUCB:
    kernel, p = _env_params(env, horizon, c)
    return AYGPUCB(kernel, **{**p, **kwargs})


def igp_ucb(env: Any, horizon: int = 1000, eta: float | None = None, **kwargs: Any) -> IGPUCB:
    kernel, p = _env_params(env, horizon, 1.0)
    p.pop("c")
    return IGPUCB(kernel, eta=2.0 / horizon if eta is None else eta, **{**p, **kwargs})

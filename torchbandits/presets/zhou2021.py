"""Presets of Zhou & Shroff, "No-Regret Algorithms for Time-Varying Bayesian Optimization", 2021:
R-GP-UCB and SW-GP-UCB, and the baselines TV-GP-UCB (Bogunovic et al. 2016) and W-GP-UCB.

They read from the environment what the paper gives the algorithms: the kernel, the noise level
``R`` (``noise_std``), the norm bound ``B`` (``norm``), the horizon ``T`` (``horizon``) and, when the
environment declares it, the variation budget ``P_T`` (``budget``).

Forgetting lengths (``period`` / ``window``): an integer, ``"known"`` (the Remark after
Theorems 1–2, §III-B, with the declared ``P_T``: ``c·γ_T^{1/4}(T/P_T)^{1/2}``), ``"unknown"``
(the same Remark: ``c·γ_T^{1/4}T^{1/2}``), ``"bound"``
(:func:`~torchbandits.confidence.time_varying.tune_by_bound`) or ``None`` (no forgetting). γ comes
from :class:`~torchbandits.confidence.time_varying.GreedyGamma` on the environment's arms at the
policy's λ (cached per arm set and λ), or ``gamma="realised"`` for the data's own log-det.

TV-GP-UCB and W-GP-UCB get a *matched memory* by default: with ``m`` the window SW-GP-UCB would
use, W-GP-UCB's discount is ``1 − 1/m`` (total weight ``m``) and TV-GP-UCB's ``ε`` satisfies
``√(1−ε) = 1 − 1/m``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..confidence import ConstantBeta
from ..confidence.time_varying import (
    GreedyGamma,
    RestartBeta,
    WindowBeta,
    theoretical_length,
    tune_by_bound,
)
from ..policies import Policy
from ..policies.time_varying import RGPUCB, SWGPUCB, TVGPUCB, WGPUCB
from .from_env import env_horizon, env_kernel, env_noise, env_norm

__all__ = ["env_gamma", "forgetting_length", "gpucb_static", "rgpucb", "swgpucb", "tvgpucb", "wgpucb"]

_GAMMA_CACHE: dict[tuple[str, float, str], GreedyGamma] = {}


def env_gamma(env: Any, lam: float) -> GreedyGamma:
    """Greedy γ-provider on the environment's arms at ``lam`` (shared between policies)."""
    arms = env.candidates().detach().to("cpu", torch.float64)
    digest = hashlib.sha1(arms.numpy().tobytes()).hexdigest()
    key = (digest, float(lam), repr(env_kernel(env).state_dict()))
    if key not in _GAMMA_CACHE:
        if len(_GAMMA_CACHE) > 64:
            _GAMMA_CACHE.clear()
        _GAMMA_CACHE[key] = GreedyGamma(arms, env_kernel(env), lam)
    return _GAMMA_CACHE[key]


def forgetting_length(env: Any, rule: int | str | None, lam: float, *, c: float = 1.0,
                      horizon: int | None = None, kind: str = "restart",
                      delta: float = 0.01) -> int | None:
    """``H`` or ``w`` from an integer or a rule name (module docstring)."""
    if rule is None or isinstance(rule, int):
        return rule
    T = env_horizon(env, horizon)
    gamma = env_gamma(env, lam)
    if rule in ("known", "bound") and getattr(env, "budget", None) is None:
        raise ValueError(f"environment {env!r} declares no variation budget P_T; use 'unknown' or an int")
    if rule == "known":
        return theoretical_length(T, gamma(T), float(env.budget), c)
    if rule == "unknown":
        return theoretical_length(T, gamma(T), None, c)
    if rule == "bound":
        return tune_by_bound(T, float(env.budget), gamma, env_norm(env), env_noise(env), lam, delta, kind)
    raise ValueError(f"period/window must be an int, 'known', 'unknown', 'bound' or None, got {rule!r}")


def _gamma_arg(env: Any, gamma: str, lam: float) -> Any:
    if gamma == "greedy":
        return env_gamma(env, lam)
    return gamma


def rgpucb(env: Any, period: int | str | None = "known", lam: float = 1.0,
           beta: float | None = None, *, c: float = 1.0, gamma: str = "greedy",
           delta: float = 0.01, horizon: int | None = None, **kwargs: Any) -> Policy:
    """R-GP-UCB (Algorithm 1) with H from ``period`` and Lemma 1's width (or a constant ``beta``)."""
    H = forgetting_length(env, period, lam, c=c, horizon=horizon, delta=delta)
    rule = (ConstantBeta(float(beta)) if beta is not None else
            RestartBeta(env_norm(env), env_noise(env), lam, _gamma_arg(env, gamma, lam), delta=delta,
                        period=H))
    return RGPUCB(env_kernel(env), lam, H, rule, **kwargs)


def gpucb_static(env: Any, lam: float = 1.0, beta: float | None = None, **kwargs: Any) -> Policy:
    """IGP-UCB without forgetting (R-GP-UCB with H = ∞), same width family as R-GP-UCB."""
    return rgpucb(env, None, lam, beta, **kwargs)


def swgpucb(env: Any, window: int | str | None = "known", lam: float = 1.0,
            beta: float | None = None, *, c: float = 1.0, gamma: str = "greedy",
            delta: float = 0.01, horizon: int | None = None, **kwargs: Any) -> Policy:
    """SW-GP-UCB (Algorithm 2) with w from ``window`` and Lemma 2's width (or a constant ``beta``)."""
    T = env_horizon(env, horizon)
    w = forgetting_length(env, window, lam, c=c, horizon=T, kind="window", delta=delta)
    rule = (ConstantBeta(float(beta)) if beta is not None else
            WindowBeta(env_norm(env), env_noise(env), lam, _gamma_arg(env, gamma, lam),
                       window=w or T, horizon=T, delta=delta))
    return SWGPUCB(env_kernel(env), lam, w, rule, **kwargs)


def _matched_beta(env: Any, lam: float, beta: float | None, memory: int,
                  delta: float, T: int) -> float:
    """Constant width matched to SW-GP-UCB's at a full window: Lemma 2's ``β`` at ``γ_m``."""
    if beta is not None:
        return float(beta)
    rule = WindowBeta(env_norm(env), env_noise(env), lam, env_gamma(env, lam), window=memory,
                      horizon=T, delta=delta, gamma_index="max")
    return rule.beta_at(None, T)  # type: ignore[arg-type]


def tvgpucb(env: Any, epsilon: float | None = None, lam: float = 1.0, beta: float | None = None, *,
            memory: int | str = "known", c: float = 1.0, gamma: str = "greedy", delta: float = 0.01,
            horizon: int | None = None, **kwargs: Any) -> Policy:
    """TV-GP-UCB; ``epsilon=None`` matches the memory ``m`` (``√(1−ε) = 1 − 1/m``); ``beta=None``
    uses SW-GP-UCB's full-window width (a constant)."""
    T = env_horizon(env, horizon)
    m = forgetting_length(env, memory, lam, c=c, horizon=T, kind="window", delta=delta) or T
    eps = 1.0 - (1.0 - 1.0 / max(m, 2)) ** 2 if epsilon is None else float(epsilon)
    b = _matched_beta(env, lam, beta, m, delta, T)
    return TVGPUCB(env_kernel(env), lam, eps, b, **kwargs)


def wgpucb(env: Any, discount: float | None = None, lam: float = 1.0, beta: float | None = None, *,
           memory: int | str = "known", c: float = 1.0, gamma: str = "greedy", delta: float = 0.01,
           horizon: int | None = None, weight_floor: float = 1e-2, **kwargs: Any) -> Policy:
    """W-GP-UCB; ``discount=None`` matches the memory ``m`` (``γ = 1 − 1/m``); ``beta=None`` uses
    SW-GP-UCB's full-window width (a constant)."""
    T = env_horizon(env, horizon)
    m = forgetting_length(env, memory, lam, c=c, horizon=T, kind="window", delta=delta) or T
    disc = 1.0 - 1.0 / max(m, 2) if discount is None else float(discount)
    b = _matched_beta(env, lam, beta, m, delta, T)
    return WGPUCB(env_kernel(env), lam, disc, b, weight_floor=weight_floor, **kwargs)

"""Confidence widths, information-gain providers and forgetting lengths of seed 004
(Zhou & Shroff, time-varying Bayesian optimisation: R-GP-UCB and SW-GP-UCB).

All widths here multiply the **GP** posterior sd ``σ_S(x)`` (noise variance λ), as in the
paper's Lemmas 1–2: ``UCB_t(x) = μ_S(x) + β_t σ_S(x)``.

* :class:`RestartBeta` (Lemma 1, spec §2.1):
  ``β_t = B + (R/√λ)·sqrt(2 γ_{t−t0} + 2 ln(1/δ))`` — ``t − t0`` points in the current block;
* :class:`WindowBeta` (Lemma 2, spec §2.2, A2): ``β_t = B + (R/√λ)·sqrt(2 γ_{min(t,w)} + 2 ln(T/δ))``;
* ``mode="igp_ucb"`` (Algorithms 1–2 as printed, A1): ``β = B + R·sqrt(2(γ + 1 + ln(1/δ)))``.

γ-providers (spec §2.4, not in the paper): :class:`AnalyticGamma`, :class:`GreedyGamma` (greedy
max-variance selection on a finite candidate set, a (1 − 1/e) certificate of the maximum
information gain there), :class:`ConstantGamma`, and ``"realised"`` — the information gain of the
data actually held, ``½ log det(I + K_S/λ)``.

Forgetting lengths (spec §2.5, A8): :func:`theoretical_length` (known / unknown ``P_T``),
:func:`regret_bound` (the explicit bound of spec §3.3) and :func:`tune_by_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from ..validation import as_matrix, check_positive, check_probability
from .base import PosteriorModel, RadiusRule

__all__ = [
    "AnalyticGamma",
    "ConstantGamma",
    "GammaProvider",
    "GreedyGamma",
    "RestartBeta",
    "WindowBeta",
    "regret_bound",
    "theoretical_length",
    "tune_by_bound",
    "tv_beta",
    "xi_factor",
]

BetaMode = Literal["lemma", "igp_ucb"]


# ---------------------------------------------------------------------------------- γ providers
class GammaProvider:
    """``γ(t)``: an upper bound (or proxy) of the maximum information gain after ``t`` points,
    ``γ_t = max_{|A|=t} ½ ln det(I + λ⁻¹ K_A)`` (spec §1.7), with ``γ(0) = 0``.

    ``lam`` is the λ the value was computed for (``None``: λ-free proxy); spec A11 asks that the
    same λ serve the posterior and γ.
    """

    lam: float | None = None

    def __call__(self, t: int) -> float:
        raise NotImplementedError

    def values(self, horizon: int) -> Tensor:
        """``[γ(0), …, γ(horizon)]`` as a float64 tensor."""
        return torch.tensor([self(t) for t in range(int(horizon) + 1)], dtype=torch.float64)


class ConstantGamma(GammaProvider):
    """``γ(t) = value`` for ``t ≥ 1`` (and 0 at ``t = 0``), for experiments."""

    def __init__(self, value: float) -> None:
        self.value = float(value)
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"value must be a finite number >= 0, got {value!r}")

    def __call__(self, t: int) -> float:
        return 0.0 if t <= 0 else self.value


class AnalyticGamma(GammaProvider):
    """Rates of Srinivas et al. quoted in spec §1.7, times a user constant ``C``:

    * ``"linear"``: ``C·d·ln(1+t)``, or with ``exact=True`` the bound ``(d/2)·ln(1 + t/(dλ))``
      (valid when ``‖x‖ ≤ 1``; needs ``lam``);
    * ``"rbf"`` (SE): ``C·(ln(1+t))^{d+1}``;
    * ``"matern"``: ``C·t^{d(d+1)/(2ν+d(d+1))}·ln(1+t)``.
    """

    def __init__(self, kind: str, dim: int, *, nu: float = 2.5, scale: float = 1.0,
                 lam: float | None = None, exact: bool = False) -> None:
        kind = kind.lower()
        if kind in ("se", "gaussian"):
            kind = "rbf"
        if kind.startswith("matern"):
            kind = "matern"
        if kind not in ("linear", "rbf", "matern"):
            raise ValueError(f"kind must be 'linear', 'rbf' or 'matern', got {kind!r}")
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.kind, self.dim = kind, int(dim)
        self.nu = check_positive("nu", nu)
        self.scale = check_positive("scale", scale)
        self.exact = bool(exact)
        if self.exact and kind != "linear":
            raise ValueError("exact=True is only available for kind='linear'")
        self.lam = None if lam is None else check_positive("lam", lam)
        if self.exact and self.lam is None:
            raise ValueError("exact=True needs lam (the bound (d/2)·ln(1 + t/(dλ)) depends on λ)")

    def __call__(self, t: int) -> float:
        if t <= 0:
            return 0.0
        d = self.dim
        if self.kind == "linear":
            if self.exact:
                return 0.5 * d * math.log1p(t / (d * self.lam))  # type: ignore[operator]
            return self.scale * d * math.log1p(t)
        if self.kind == "rbf":
            return self.scale * math.log1p(t) ** (d + 1)
        c = d * (d + 1) / (2.0 * self.nu + d * (d + 1))
        return self.scale * t**c * math.log1p(t)


class GreedyGamma(GammaProvider):
    """Greedy max-variance information gain on a finite candidate set (spec §2.4, item 2).

    Picks, ``T`` times and with repeats allowed, the candidate of largest GP posterior variance
    (noise ``λ``) and accumulates ``g_t = Σ_{s≤t} ½ ln(1 + σ²_{s−1}(x_s)/λ)``. The set function
    ``½ ln det(I + λ⁻¹K_A)`` is monotone submodular, so ``γ_t(candidates) ≤ g_t/(1 − 1/e)``:
    that certified bound is returned by default (``tight=False``); ``tight=True`` returns ``g_t``.
    Values are computed on demand and cached (O(t·A) per new ``t``, a one-off cost).
    """

    def __init__(self, candidates: Tensor, kernel: Kernel, lam: float, *, tight: bool = False,
                 horizon: int = 0) -> None:
        self.lam = check_positive("lam", lam)
        self.kernel = kernel
        self.candidates = as_matrix("candidates", candidates, dtype=torch.float64,
                                    device=torch.device("cpu"))
        self.tight = bool(tight)
        self._var = kernel_diag(kernel, self.candidates).clone()
        self._rows = self.candidates.new_zeros(16, self.candidates.shape[0])
        self._g = [0.0]
        self.picks: list[int] = []
        if horizon:
            self._extend(int(horizon))

    @torch.no_grad()
    def _extend(self, t: int) -> None:
        from ..buffers import grow_rows

        while len(self._g) <= t:
            n = len(self.picks)
            i = int(torch.argmax(self._var))
            var_i = float(self._var[i].clamp_min(0.0))
            k_col = kernel_matrix(self.kernel, self.candidates, self.candidates[i : i + 1])[:, 0]
            v = (k_col - self._rows[:n].mT @ self._rows[:n, i]) / math.sqrt(var_i + self.lam)
            self._rows = grow_rows(self._rows, n + 1)
            self._rows[n] = v
            self._var = (self._var - v * v).clamp_min(0.0)
            self.picks.append(i)
            self._g.append(self._g[-1] + 0.5 * math.log1p(var_i / self.lam))

    def greedy_value(self, t: int) -> float:
        """``g_t`` (the information gain of the greedy set itself, a lower bound of ``γ_t``)."""
        if t <= 0:
            return 0.0
        self._extend(int(t))
        return self._g[int(t)]

    def __call__(self, t: int) -> float:
        g = self.greedy_value(t)
        return g if self.tight else g / (1.0 - math.exp(-1.0))


def _as_provider(gamma: GammaProvider | float | str | Callable[[int], float]) -> GammaProvider | str:
    if isinstance(gamma, str):
        if gamma != "realised":
            raise ValueError(f"gamma must be a GammaProvider, a number, a callable or 'realised', "
                             f"got {gamma!r}")
        return gamma
    if isinstance(gamma, GammaProvider):
        return gamma
    if callable(gamma):
        return _CallableGamma(gamma)
    return ConstantGamma(float(gamma))


class _CallableGamma(GammaProvider):
    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn

    def __call__(self, t: int) -> float:
        return 0.0 if t <= 0 else float(self.fn(t))


# ---------------------------------------------------------------------------------- β formulas
def tv_beta(gamma: float, norm_bound: float, noise_std: float, lam: float, log_arg: float,
            mode: BetaMode = "lemma", delta: float | None = None) -> float:
    """The two β forms of spec A1 as plain numbers.

    * ``"lemma"``: ``B + (R/√λ)·sqrt(2γ + 2 ln(log_arg))`` with ``log_arg = 1/δ`` (Lemma 1) or
      ``T/δ`` (Lemma 2);
    * ``"igp_ucb"``: ``B + R·sqrt(2(γ + 1 + ln(1/δ)))`` (Algorithms 1–2 as printed; ``delta``).
    """
    if mode == "lemma":
        return norm_bound + noise_std / math.sqrt(lam) * math.sqrt(2.0 * gamma + 2.0 * math.log(log_arg))
    if mode == "igp_ucb":
        if delta is None:
            raise ValueError("mode='igp_ucb' needs delta")
        return norm_bound + noise_std * math.sqrt(2.0 * (gamma + 1.0 + math.log(1.0 / delta)))
    raise ValueError(f"mode must be 'lemma' or 'igp_ucb', got {mode!r}")


def xi_factor(length: int, lam: float, gamma: float) -> float:
    """Drift-bias factor of Lemma 1 (spec §3.1): ``ξ_H = (1/λ)·sqrt(2H(1+λ)γ_H)``; the same with
    ``w`` for SW-GP-UCB (spec A7)."""
    return math.sqrt(2.0 * length * (1.0 + lam) * gamma) / lam


class _TVBeta(RadiusRule):
    """Shared machinery of :class:`RestartBeta` and :class:`WindowBeta` (GP sd, regulariser λ)."""

    variance = "gp"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 delta: float = 0.01, mode: BetaMode = "lemma", gamma_index: str = "algorithm",
                 beta_scale: float = 1.0) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.noise_std = float(noise_std)
        if not math.isfinite(self.noise_std) or self.noise_std < 0:
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
        self.lam = check_positive("lam", lam)
        self.reg = self.lam  # the posterior is always taken at the λ of the width (spec A11)
        self.delta = check_probability("delta", delta)
        if mode not in ("lemma", "igp_ucb"):
            raise ValueError(f"mode must be 'lemma' or 'igp_ucb', got {mode!r}")
        self.mode = mode
        if gamma_index not in ("algorithm", "max"):
            raise ValueError(f"gamma_index must be 'algorithm' or 'max', got {gamma_index!r}")
        self.gamma_index = gamma_index
        self.beta_scale = check_positive("beta_scale", beta_scale)
        self.gamma = _as_provider(gamma)
        g_lam = getattr(self.gamma, "lam", None)
        if g_lam is not None and abs(g_lam - self.lam) > 1e-12 * max(1.0, self.lam):
            raise ValueError(f"gamma was computed with λ={g_lam} but lam={self.lam} (spec A11: the "
                             "same λ must serve the posterior and γ)")

    def _gamma_value(self, model: PosteriorModel, index: int) -> float:
        if self.gamma == "realised":
            return 0.5 * float(model.log_det(reg=self.lam))
        return float(self.gamma(int(index)))  # type: ignore[operator]

    def _log_arg(self) -> float:
        raise NotImplementedError

    def _index(self, model: PosteriorModel, t: int) -> int:
        raise NotImplementedError

    def beta_at(self, model: PosteriorModel, t: int) -> float:
        """``β_t`` for round ``t`` (1-based) given the model that scores that round."""
        g = self._gamma_value(model, self._index(model, t))
        beta = tv_beta(g, self.norm_bound, self.noise_std, self.lam, self._log_arg(), self.mode,
                       self._delta_used())
        return self.beta_scale * beta

    def _delta_used(self) -> float:
        return self.delta

    def radius(self, model: PosteriorModel, n_candidates: int, t: int) -> Tensor:
        return torch.tensor(self.beta_at(model, t), dtype=torch.float64)


class RestartBeta(_TVBeta):
    """R-GP-UCB width (Lemma 1, spec §2.1), multiplying the **GP** sd at λ:

    ``β_t = B + (R/√λ)·sqrt(2 γ_{t−t0} + 2 ln(1/δ'))``

    where ``t − t0`` is the number of points in the current block (``model.n``), or ``H`` with
    ``gamma_index="max"`` (spec A13, the theorem's γ_H); ``δ' = δ`` (the paper's literal δ) or
    ``δ/⌈T/H⌉`` with ``delta_split="per_block"`` (spec A6). ``mode="igp_ucb"`` is the printed
    ``B + R·sqrt(2(γ + 1 + ln(1/δ')))`` (spec A1). With ``gamma="realised"`` the block's own
    ``½ log det(I + K_S/λ)`` replaces γ.
    """

    name = "restart_beta"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 delta: float = 0.01, period: int | None = None, horizon: int | None = None,
                 mode: BetaMode = "lemma", gamma_index: str = "algorithm",
                 delta_split: str = "none", beta_scale: float = 1.0) -> None:
        super().__init__(norm_bound, noise_std, lam, gamma, delta=delta, mode=mode,
                         gamma_index=gamma_index, beta_scale=beta_scale)
        self.period = None if period is None else int(period)
        self.horizon = None if horizon is None else int(horizon)
        if self.period is not None and self.period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        if delta_split not in ("none", "per_block"):
            raise ValueError(f"delta_split must be 'none' or 'per_block', got {delta_split!r}")
        self.delta_split = delta_split
        if delta_split == "per_block" and (self.period is None or self.horizon is None):
            raise ValueError("delta_split='per_block' needs period and horizon")
        if gamma_index == "max" and self.period is None:
            raise ValueError("gamma_index='max' needs period (γ_H)")

    def _delta_used(self) -> float:
        if self.delta_split == "per_block":
            return self.delta / math.ceil(self.horizon / self.period)  # type: ignore[operator]
        return self.delta

    def _log_arg(self) -> float:
        return 1.0 / self._delta_used()

    def _index(self, model: PosteriorModel, t: int) -> int:
        return int(self.period) if self.gamma_index == "max" else int(model.n)


class WindowBeta(_TVBeta):
    """SW-GP-UCB width (Lemma 2, spec §2.2 and A2), multiplying the **GP** sd at λ:

    ``β_t = B + (R/√λ)·sqrt(2 γ_{min(t, w)} + 2 ln(T/δ))``

    (the paper's index ``min(t, w)``, slightly conservative as the window holds
    ``min(t−1, w)`` points; ``gamma_index="max"`` uses ``γ_w`` throughout). ``mode="igp_ucb"``
    is Algorithm 2 as printed, ``B + R·sqrt(2(γ + 1 + ln(1/δ)))``.
    """

    name = "window_beta"

    def __init__(self, norm_bound: float, noise_std: float, lam: float,
                 gamma: GammaProvider | float | str | Callable[[int], float] = "realised", *,
                 window: int, horizon: int, delta: float = 0.01, mode: BetaMode = "lemma",
                 gamma_index: str = "algorithm", beta_scale: float = 1.0) -> None:
        super().__init__(norm_bound, noise_std, lam, gamma, delta=delta, mode=mode,
                         gamma_index=gamma_index, beta_scale=beta_scale)
        self.window = int(window)
        self.horizon = int(horizon)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")

    def _log_arg(self) -> float:
        return self.horizon / self.delta

    def _index(self, model: PosteriorModel, t: int) -> int:
        return self.window if self.gamma_index == "max" else min(int(t), self.window)


# ---------------------------------------------------------------------------------- tuning
def theoretical_length(horizon: int, gamma_T: float, budget: float | None = None,
                       c: float = 1.0) -> int:
    """Restart period / window of the paper's Remark (spec §2.5), clipped to ``[1, T]``:

    * known ``P_T > 0``: ``c·γ_T^{1/4}·(T/P_T)^{1/2}``;
    * ``P_T = 0``: ``T`` (no forgetting);
    * unknown ``P_T`` (``budget=None``): ``c·γ_T^{1/4}·T^{1/2}``.
    """
    T = int(horizon)
    if T < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if gamma_T < 0 or not math.isfinite(gamma_T):
        raise ValueError(f"gamma_T must be a finite number >= 0, got {gamma_T!r}")
    c = check_positive("c", c)
    if budget is None:
        value = c * gamma_T**0.25 * math.sqrt(T)
    else:
        if budget < 0 or not math.isfinite(budget):
            raise ValueError(f"budget must be a finite number >= 0 or None, got {budget!r}")
        if budget == 0:
            return T
        value = c * gamma_T**0.25 * math.sqrt(T / budget)
    return int(min(max(round(value), 1), T))


def regret_bound(length: int | Tensor, horizon: int, budget: float, gamma: float | Tensor,
                 beta: float | Tensor, lam: float) -> Tensor:
    """Explicit bound of spec §3.3 (constants of the spec, not of the paper):

    ``R(T) ≤ (2/λ)·sqrt(2(1+λ)γ_H)·H^{3/2}·P_T + 2·β·⌈T/H⌉·sqrt(2(1+λ)·H·γ_H)``
    """
    H = torch.as_tensor(length, dtype=torch.float64)
    g = torch.as_tensor(gamma, dtype=torch.float64)
    b = torch.as_tensor(beta, dtype=torch.float64)
    drift = (2.0 / lam) * torch.sqrt(2.0 * (1.0 + lam) * g) * H**1.5 * budget
    learn = 2.0 * b * torch.ceil(horizon / H) * torch.sqrt(2.0 * (1.0 + lam) * H * g)
    return drift + learn


def tune_by_bound(horizon: int, budget: float, gamma: GammaProvider, norm_bound: float,
                  noise_std: float, lam: float, delta: float = 0.01,
                  kind: str = "restart") -> int:
    """``tune="bound"`` (spec §2.5, not in the paper): the integer ``H ∈ [1, T]`` minimising
    :func:`regret_bound`, with ``γ_H`` from ``gamma`` and ``β(δ)`` of Theorem 1 (``kind="restart"``,
    ``ln(1/δ)``) or Theorem 2 (``kind="window"``, ``ln(T/δ)``).

    The drift term grows like ``H^{3/2}·sqrt(H γ_H)``, so at moderate T the minimiser can be tiny:
    on the seed-004 benchmark (T = 2000, SE ℓ = 0.1, λ = 1, greedy γ) it is ``H = 1`` for every
    ``P_T ≥ 1``, where the bound already exceeds the trivial ``2BT`` — prefer
    :func:`theoretical_length` there."""
    T = int(horizon)
    if kind not in ("restart", "window"):
        raise ValueError(f"kind must be 'restart' or 'window', got {kind!r}")
    g = gamma.values(T)[1:]
    log_arg = (1.0 / delta) if kind == "restart" else (T / delta)
    beta = norm_bound + noise_std / math.sqrt(lam) * torch.sqrt(2.0 * g + 2.0 * math.log(log_arg))
    H = torch.arange(1, T + 1, dtype=torch.float64)
    bound = regret_bound(H, T, budget, g, beta, lam)
    return int(torch.argmin(bound)) + 1

"""Time-varying GP-UCB (Zhou & Shroff 2021): R-GP-UCB, SW-GP-UCB, and two related baselines,
TV-GP-UCB (Bogunovic et al. 2016) and weighted (discounted) GP-UCB (Deng et al. 2022).

Every policy here scores ``UCB_t(x) = μ_{S_t}(x) + β_t·σ_{S_t}(x)`` where σ is the **GP**
posterior sd at noise variance λ (``variance="gp"``; β is *not* divided by √λ) and ``S_t`` is
the data the method keeps:

* :class:`RGPUCB` (Algorithm 1): the data of the current block; the model is emptied after the
  update of every round ``kH``, so round ``t`` sees ``(t−1) mod H`` points (the reset test
  ``(t−1) mod H = 0``, which also fires for H = 1) and the posterior is the prior (σ² = k(x,x),
  from eq. (2) with no data) at ``t = 1, H+1, 2H+1, …``.
  Default width: :class:`~torchbandits.confidence.time_varying.RestartBeta` (Lemma 1).
* :class:`SWGPUCB` (Algorithm 2): the last ``w`` observations (at most ``w`` points); the oldest
  point leaves the Cholesky factor by a rank-one update (O(w²), never a refactorisation), so a
  round costs the same at every ``t`` once the window is full. Default width:
  :class:`~torchbandits.confidence.time_varying.WindowBeta` (Lemma 2, ``ln(T/δ)``).
* :class:`TVGPUCB` (Bogunovic et al. 2016): all data under the time-decay kernel with forgetting
  rate ε (:class:`~torchbandits.models.weighted.TimeDecayKernelRidge`).
* :class:`WGPUCB` (weighted / discounted GP-UCB, Deng et al. 2022, kernel D-LinUCB): weights
  ``γ^{t−1−s}``, D-LinUCB sandwich width (:class:`~torchbandits.models.weighted.DiscountedKernelRidge`).

``beta`` is a float (constant radius on the GP sd), a
:class:`~torchbandits.confidence.ConfidenceRule`, or ``None`` for the method's default theory
width. Ties of the UCB (every candidate ties on an empty data set with a stationary kernel) are
broken uniformly at random from the policy's generator (``tie_break="random"``) or by
the lowest index (``"first"``, like :class:`~torchbandits.policies.GPUCB`).

R-GP-UCB and SW-GP-UCB also run ``R`` seeds as one batch (``reset(seed=[s_1, …, s_R])``,
candidates ``[R, A, d]``; :mod:`torchbandits.policies.time_varying_batched`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import nn

from ..confidence import ConfidenceRule, ConstantBeta, as_rule
from ..confidence.time_varying import GammaProvider, RestartBeta, WindowBeta
from ..kernels import check_kernel, kernel_bound
from ..models import ExactKernelRidge
from ..models.weighted import DiscountedKernelRidge, TimeDecayKernelRidge
from ..models.window import SlidingWindowKernelRidge
from ..validation import check_positive
from .base import RuleUCB, check_model
from .refit import RefitMixin
from .time_varying_batched import BatchedRestartMixin, BatchedWindowMixin

__all__ = ["RGPUCB", "SWGPUCB", "TVGPUCB", "WGPUCB", "TimeVaryingUCB"]

Gamma = GammaProvider | float | str


def _check_kernel_scale(kernel: Kernel) -> None:
    """The theory widths (Zhou & Shroff 2021, Lemmas 1-2) assume ``k(x, x) ≤ 1``; warn when a
    stationary kernel exceeds it."""
    bound = kernel_bound(kernel)
    if bound is not None and bound > 1.0 + 1e-12:
        warnings.warn(f"the theory width assumes k(x, x) <= 1 but this kernel has sup k(x, x) = {bound:g}"
                      "; use outputscale <= 1 or pass beta explicitly", stacklevel=3)


def _rule(beta: float | ConfidenceRule | None, default: Any) -> ConfidenceRule:
    return default() if beta is None else as_rule(beta, "gp")


class TimeVaryingUCB(RuleUCB):
    """UCB on a posterior model with a confidence rule and a tie-break rule (shared base)."""

    def __init__(self, model: nn.Module, rule: ConfidenceRule, *, tie_break: str = "random",
                 seed: int = 0, n_warmup: int = 0, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        check_kernel(model.kernel)
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        if tie_break not in ("random", "first"):
            raise ValueError(f"tie_break must be 'random' or 'first', got {tie_break!r}")
        self.tie_break = tie_break
        self.rule = rule
        self.model = model

    def select(self, candidates: Any) -> int:
        cand = self.check_candidates(candidates)
        if self.t < self.n_warmup:
            return self.warmup_choice(cand)
        with torch.no_grad():
            scores = self(cand)
        best = int(torch.argmax(scores))
        if self.tie_break == "first":
            return best
        top = scores[best]
        ties = torch.nonzero(scores >= top - 1e-12 * max(1.0, abs(float(top))))[:, 0]
        if ties.numel() == 1:
            return best
        return int(ties[int(torch.randint(ties.numel(), (1,), generator=self.generator))])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tie_break={self.tie_break!r}"


class RGPUCB(BatchedRestartMixin, RefitMixin, TimeVaryingUCB):
    """R-GP-UCB: IGP-UCB restarted every ``period`` (= H) rounds (Zhou & Shroff 2021, Algorithm 1;
    β on the **GP** sd).

    Args:
        kernel: GPyTorch kernel with ``k(x, x) ≤ 1``; lam: λ > 0 (noise variance and regulariser).
        period: H ≥ 1, or ``None`` for no restart (IGP-UCB with regulariser λ).
        beta: float / rule / ``None`` → :class:`RestartBeta` built from ``norm_bound`` (B),
            ``noise_std`` (R), ``delta``, ``gamma`` (a :class:`GammaProvider`, a number, or
            ``"realised"``), ``beta_mode`` (``"lemma"``/``"igp_ucb"``), ``gamma_index``
            (``"algorithm"``: γ_{t−t0}; ``"max"``: γ_H), ``delta_split`` (``"none"`` or
            ``"per_block"``, needs ``horizon``) and ``beta_scale``.
        model: a posterior model instead of the default
            :class:`~torchbandits.models.ExactKernelRidge` (see
            :func:`~torchbandits.policies.base.check_model`).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import RGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = RGPUCB(make_kernel("rbf", 0.2), lam=0.01, period=20, seed=0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> policy.restarts  # the posterior was emptied at round 21
        1
    """
    batch_pays_from = 2  # --batch auto on the CPU: from 2 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(self, kernel: Kernel, lam: float = 1.0, period: int | None = None,
                 beta: float | ConfidenceRule | None = None, *, norm_bound: float = 1.0,
                 noise_std: float = 0.1, delta: float = 0.01, gamma: Gamma = "realised",
                 horizon: int | None = None, beta_mode: str = "lemma",
                 gamma_index: str = "algorithm", delta_split: str = "none",
                 beta_scale: float = 1.0, tie_break: str = "random", seed: int = 0,
                 n_warmup: int = 0, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None, refit_every: int = 0,
                 refit_warmup: int = 5, refit_options: dict[str, Any] | None = None,
                 model: nn.Module | None = None) -> None:
        lam = check_positive("lam", lam)
        if period is not None and int(period) < 1:
            raise ValueError(f"period must be >= 1 or None, got {period!r}")
        self_period = None if period is None else int(period)
        if beta is None:
            _check_kernel_scale(kernel)
        rule = _rule(beta, lambda: RestartBeta(
            norm_bound, noise_std, lam, gamma, delta=delta, period=self_period, horizon=horizon,
            mode=beta_mode, gamma_index=gamma_index, delta_split=delta_split,
            beta_scale=beta_scale))  # type: ignore[arg-type]
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype)
        else:
            model = ExactKernelRidge(kernel, lam, rule.required_regularisers(lam), dtype=dtype,
                                     device=device)
        super().__init__(model, rule, tie_break=tie_break, seed=seed, n_warmup=n_warmup,
                         dtype=dtype, device=device)
        self.period = self_period
        self.init_refit(kernel, refit_every, refit_warmup, refit_options)  # policies/refit.py

    def _update(self, x: torch.Tensor, reward: float) -> None:
        self.model.append(x, reward)
        round_t = self.t + 1  # the round this observation belongs to
        if self.period is not None and round_t % self.period == 0:
            self.model.reset()  # the next round t = kH + 1 starts a block from the prior

    @property
    def restarts(self) -> int:
        """Resets so far (after rounds H, 2H, …)."""
        return 0 if self.period is None else self.t // self.period

    def diagnostics(self) -> dict[str, float]:
        return {**super().diagnostics(), "restarts": float(self.restarts)}


class SWGPUCB(BatchedWindowMixin, RefitMixin, TimeVaryingUCB):
    """SW-GP-UCB: GP-UCB on the last ``window`` (= w) observations (Zhou & Shroff 2021,
    Algorithm 2; β on the **GP** sd).

    After each update the model holds ``min(t, w)`` points; the oldest leaves by
    :meth:`ExactKernelRidge.remove_oldest` (Cholesky rank-one update, O(w²)). With
    ``carry_cache=True`` (default) the model is a
    :class:`~torchbandits.models.window.SlidingWindowKernelRidge`, which also carries the cached
    ``L⁻¹K_SC`` of a fixed candidate set through the removal (O(wA) instead of an O(w²A) re-solve).

    Args:
        kernel, lam: as :class:`RGPUCB`. window: w ≥ 1 (``None``: keep everything).
        beta: float / rule / ``None`` → :class:`WindowBeta` (needs ``horizon`` T for ``ln(T/δ)``)
            from ``norm_bound``, ``noise_std``, ``delta``, ``gamma``, ``beta_mode``,
            ``gamma_index`` (``"algorithm"``: γ_{min(t,w)}; ``"max"``: γ_w) and ``beta_scale``.
        model: a posterior model with ``remove_oldest`` instead of the default (e.g. the
            finite-arm :class:`~torchbandits.models.finite_arm.FiniteArmRidge`, or an
            :class:`~torchbandits.models.ExactKernelRidge` with ``removal="refactorise"``);
            ``carry_cache`` then does not apply (see :func:`~torchbandits.policies.base.check_model`).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import SWGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = SWGPUCB(make_kernel("rbf", 0.2), lam=0.01, window=20, horizon=40)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> policy.diagnostics()['n']  # the window's points
        20.0
    """
    batch_pays_from = 2  # --batch auto on the CPU: from 2 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(self, kernel: Kernel, lam: float = 1.0, window: int | None = None,
                 beta: float | ConfidenceRule | None = None, *, norm_bound: float = 1.0,
                 noise_std: float = 0.1, delta: float = 0.01, gamma: Gamma = "realised",
                 horizon: int | None = None, beta_mode: str = "lemma",
                 gamma_index: str = "algorithm", beta_scale: float = 1.0,
                 carry_cache: bool = True, tie_break: str = "random", seed: int = 0,
                 n_warmup: int = 0, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None, refit_every: int = 0,
                 refit_warmup: int = 5, refit_options: dict[str, Any] | None = None,
                 model: nn.Module | None = None) -> None:
        lam = check_positive("lam", lam)
        if window is not None and int(window) < 1:
            raise ValueError(f"window must be >= 1 or None, got {window!r}")
        w = None if window is None else int(window)
        if beta is None and horizon is None:
            raise ValueError("horizon (T) is needed for the default width β_t (ln(T/δ)); "
                             "pass horizon= or a beta")

        def default() -> ConfidenceRule:
            return WindowBeta(norm_bound, noise_std, lam, gamma, window=w or int(horizon),  # type: ignore[arg-type]
                              horizon=int(horizon), delta=delta, mode=beta_mode,  # type: ignore[arg-type]
                              gamma_index=gamma_index, beta_scale=beta_scale)

        if beta is None:
            _check_kernel_scale(kernel)
        rule = _rule(beta, default)
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype, needs=("remove_oldest",))
        else:
            model_cls = SlidingWindowKernelRidge if carry_cache else ExactKernelRidge
            model = model_cls(kernel, lam, rule.required_regularisers(lam), dtype=dtype,
                              device=device)
        super().__init__(model, rule, tie_break=tie_break, seed=seed, n_warmup=n_warmup,
                         dtype=dtype, device=device)
        self.window = w
        self.init_refit(kernel, refit_every, refit_warmup, refit_options)  # policies/refit.py

    def _update(self, x: torch.Tensor, reward: float) -> None:
        self.model.append(x, reward)
        if self.window is not None and self.model.n > self.window:
            self.model.remove_oldest(self.model.n - self.window)


class TVGPUCB(TimeVaryingUCB):
    """TV-GP-UCB (Bogunovic, Scarlett & Cevher 2016): GP-UCB under the time-decay kernel
    ``k(x,x')·(1−ε)^{|i−j|/2}``, posterior of ``f_{t+1}`` (β on the **GP** sd at noise λ).

    Args:
        kernel: spatial kernel; lam: noise variance λ; epsilon: forgetting rate ε ∈ [0, 1)
            (ε = 0 is GP-UCB); beta: float / rule / ``None`` → Bayesian finite-domain width
            ``sqrt(2 ln(|D| t² π²/(6δ)))`` (:class:`~torchbandits.confidence.SrinivasBeta`);
        model: a posterior model instead of the default
            :class:`~torchbandits.models.weighted.TimeDecayKernelRidge` (``epsilon`` and
            ``weight_floor`` are then the model's; see :func:`~torchbandits.policies.base.check_model`).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import TVGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = TVGPUCB(make_kernel("rbf", 0.2), lam=0.01, epsilon=0.01)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> ucb, lcb = policy.bounds(arms)  # [A] each; the UCB still explores
        >>> int(lcb.argmax()) == int(f(arms).argmax())  # the best arm is the surest
        True
        >>> ucb.shape
        torch.Size([11])
    """

    def __init__(self, kernel: Kernel, lam: float = 1.0, epsilon: float = 0.01,
                 beta: float | ConfidenceRule | None = None, *, delta: float = 0.1,
                 weight_floor: float = 1e-12, tie_break: str = "random", seed: int = 0,
                 n_warmup: int = 0, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None, model: nn.Module | None = None) -> None:
        from ..confidence import SrinivasBeta

        rule = _rule(beta, lambda: SrinivasBeta(delta=delta, mode="finite"))
        if rule.required_regularisers(lam):
            raise ValueError("TV-GP-UCB's model keeps one regulariser: the rule must use λ")
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype)
        else:
            model = TimeDecayKernelRidge(kernel, lam, epsilon, weight_floor=weight_floor,
                                         dtype=dtype, device=device)
        super().__init__(model, rule, tie_break=tie_break, seed=seed, n_warmup=n_warmup,
                         dtype=dtype, device=device)
        self.epsilon = float(epsilon)


class WGPUCB(TimeVaryingUCB):
    """Weighted / discounted GP-UCB (Deng et al. 2022, kernel D-LinUCB).

    Weights ``γ^{t−1−s}`` (newest 1), posterior mean ``k_Sᵀ(K + λW⁻¹)⁻¹Y``, and β times the
    D-LinUCB sandwich width (GP scale: ``λ‖φ‖²_{V⁻¹ṼV⁻¹}``, equal to the GP variance when γ = 1),
    or the weighted GP variance with ``width="weighted"``.

    Args:
        kernel; lam: λ > 0; discount: γ ∈ (0, 1]; beta: float (default 1.0) or a rule (the
            theory β of Deng et al. is not implemented here);
        weight_floor / max_points: bound the points kept (see
            :class:`~torchbandits.models.weighted.DiscountedKernelRidge`);
        model: a posterior model instead of the default ``DiscountedKernelRidge`` (e.g. the
            finite-arm :class:`~torchbandits.models.finite_arm.FiniteArmRidge` with
            ``discount``; ``width``, ``weight_floor`` and ``max_points`` are then the model's;
            see :func:`~torchbandits.policies.base.check_model`).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import WGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = WGPUCB(make_kernel("rbf", 0.2), lam=0.01, discount=0.95)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """

    def __init__(self, kernel: Kernel, lam: float = 1.0, discount: float = 0.99,
                 beta: float | ConfidenceRule = 1.0, *, width: str = "sandwich",
                 weight_floor: float = 1e-4, max_points: int | None = None,
                 tie_break: str = "random", seed: int = 0, n_warmup: int = 0,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
                 model: nn.Module | None = None) -> None:
        rule = _rule(beta, lambda: ConstantBeta(1.0, variance="gp"))
        if rule.required_regularisers(lam):
            raise ValueError("W-GP-UCB's model keeps one regulariser: the rule must use λ")
        if getattr(rule, "variance", "gp") != "gp":
            raise ValueError("W-GP-UCB's width is on the GP scale: use a rule with variance='gp'")
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype)
        else:
            model = DiscountedKernelRidge(kernel, lam, discount, width=width,
                                          weight_floor=weight_floor, max_points=max_points,
                                          dtype=dtype, device=device)
        super().__init__(model, rule, tie_break=tie_break, seed=seed, n_warmup=n_warmup,
                         dtype=dtype, device=device)
        self.discount = float(discount)

"""The policies of Flynn & Reeb (2024, "Tighter Confidence Bounds for Sequential Kernel
Regression"): Algorithm 1 (§5.2) with a confidence rule, all on the **GP** sd.

* :class:`CMMUCB` — Kernel CMM-UCB (§5.3): the exact bound (1-D dual by default, CVXPY SOCP optional).
* :class:`DMMUCB` — Kernel DMM-UCB (§5.4): min over the grid ``{0.1, 0.3, 1, 3, 10}·σ²/c`` (§7).
* :class:`AMMUCB` — Kernel AMM-UCB (§5.5): ``μ_{σ²/c} + β^AMM ρ_{σ²/c}``.
* :func:`AYGPUCB` — AY-GP-UCB (Abbasi-Yadkori 2012, Thm 3.11), regulariser ``λ = σ²/c`` by default.
* :func:`IGPUCB` — IGP-UCB (Chowdhury & Gopalan 2017, Thm 2), regulariser ``1 + η``, constant 2 in
  the radius by default (as in the authors' experiments, η = 2/T; ``use_t_eta=True``: ``(t−1)η``).

The two baselines are presets of :class:`~torchbandits.policies.GPUCB` (functions returning one):
only their radius and regulariser differ. The mixture policies are classes: their UCB is the
rule's own upper bound (CMM skips the lower-bound search).

Every β multiplies the GP posterior standard deviation ``ρ_α`` (noise variance α, not divided by
α). Each policy plays a uniformly random arm in round 1 (the prior UCB is flat), then the argmax
(first index on ties). The presets with the paper's experimental settings, read from an
environment, are in :mod:`torchbandits.presets.flynn2024`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpytorch.kernels import Kernel
from torch import Tensor

from ..confidence import AYBeta, IGPBeta
from ..confidence.mixture import DMM_GRID, AMMBound, CMMBound, DMMBound, MixtureBound
from ..validation import check_positive
from .kernel_ucb import GPUCB, KernelUCB
from .lean_step import LEAN_FORWARDS

__all__ = ["AMMUCB", "AYGPUCB", "CMMUCB", "DMMUCB", "IGPUCB"]


class _MixtureUCB(KernelUCB):
    """KernelUCB on a martingale-mixture rule, model regulariser ``α₀ = σ²/c``."""

    default_variance = "gp"

    def __init__(self, kernel: Kernel, rule: MixtureBound, **kwargs: Any) -> None:
        super().__init__(kernel, lam=rule.alpha0, beta=rule, **kwargs)

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of candidates ``[A, d]``; in batched mode ``[R, A]`` of ``[R, A, d]``."""
        if self.n_runs is not None:
            return KernelUCB.forward(self, candidates)
        cand = self.check_candidates(candidates)
        ucb = getattr(self.rule, "ucb", None)
        if ucb is not None:  # CMM: skip the LCB search
            return ucb(self.model, cand, self.t + 1) + self.refit_offset
        return self.rule.bounds(self.model, cand, self.t + 1)[0] + self.refit_offset


LEAN_FORWARDS.add(_MixtureUCB.forward)


class CMMUCB(_MixtureUCB):
    """Kernel CMM-UCB (§5.3, Eq. 10/12): UCB = exact max of f(x) over the confidence set.

    Args:
        kernel: GPyTorch kernel; noise_std σ; norm_bound B; delta δ; c mixture scale.
        method: ``"dual"`` (default, torch) or ``"socp"`` (CVXPY reference).
        rule_kwargs: further :class:`~torchbandits.confidence.mixture.CMMBound` options.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import CMMUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = CMMUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> sorted(policy.diagnostics())
        ['log_alpha_ratio', 'n', 'r2']
    """

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, method: str = "dual",
                 rule_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        rule = CMMBound(noise_std, norm_bound, delta, c, method, **(rule_kwargs or {}))
        super().__init__(kernel, rule, **kwargs)


class DMMUCB(_MixtureUCB):
    """Kernel DMM-UCB (§5.4): per arm the min over ``α ∈ grid·σ²/c`` of Eq. (14) (GP sd).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import DMMUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = DMMUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """
    batch_pays_from = 4  # --batch auto on the CPU: from 4 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, grid: Sequence[float] = DMM_GRID,
                 **kwargs: Any) -> None:
        super().__init__(kernel, DMMBound(noise_std, norm_bound, delta, c, grid), **kwargs)


class AMMUCB(_MixtureUCB):
    """Kernel AMM-UCB (§5.5): ``μ_{σ²/c} + sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²) ρ_{σ²/c}``.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import AMMUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = AMMUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """

    def __init__(self, kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0,
                 delta: float = 0.01, c: float = 1.0, **kwargs: Any) -> None:
        super().__init__(kernel, AMMBound(noise_std, norm_bound, delta, c), **kwargs)


def AYGPUCB(kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0, delta: float = 0.01,
            c: float = 1.0, lam: float | None = None, **kwargs: Any) -> GPUCB:
    """AY-GP-UCB: ``μ_λ + (σ sqrt(log det(I + K/λ) + 2 log(1/δ))/√λ + B) ρ_λ`` (GP sd).

    A preset of :class:`GPUCB` with :class:`~torchbandits.confidence.AYBeta`. ``lam`` defaults to
    ``σ²/c`` (Flynn & Reeb 2024, §7); further keywords go to :class:`GPUCB`.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import AYGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = AYGPUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> ucb, lcb = policy.bounds(arms)  # [A] each; the UCB still explores
        >>> int(lcb.argmax()) == int(f(arms).argmax())  # the best arm is the surest
        True
        >>> ucb.shape
        torch.Size([11])
    """
    lam = noise_std**2 / check_positive("c", c) if lam is None else lam
    return GPUCB(kernel, lam, AYBeta(norm_bound, noise_std, lam=lam, delta=delta), **kwargs)


def IGPUCB(kernel: Kernel, noise_std: float = 0.1, norm_bound: float = 10.0, delta: float = 0.01,
           eta: float = 0.002, use_t_eta: bool = False, **kwargs: Any) -> GPUCB:
    """IGP-UCB: ``μ_{1+η} + (B + σ sqrt(log det(I + K/(1+η)) + 2 + 2 log(1/δ))) ρ_{1+η}`` (GP sd;
    ``use_t_eta=True`` puts ``(t−1)η`` in place of the 2).

    A preset of :class:`GPUCB` with :class:`~torchbandits.confidence.IGPBeta` at ``λ = 1 + η``;
    further keywords go to :class:`GPUCB`.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import IGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = IGPUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """
    rule = IGPBeta(norm_bound, noise_std, delta=delta, eta=eta, use_t_eta=use_t_eta)
    return GPUCB(kernel, 1.0 + rule.eta, rule, **kwargs)

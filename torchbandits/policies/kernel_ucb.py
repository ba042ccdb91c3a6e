"""K-UCB (Zenati et al. 2022, Algorithm 3) and GP-UCB / CGP-UCB on the exact posterior.

Both score ``UCB_t(x) = μ_{t−1}(x) + β_t · sd_{t−1}(x)`` with the exact kernel-ridge posterior of
:class:`~torchbandits.models.ExactKernelRidge`; they differ only in their defaults:

* :class:`KernelUCB` — β multiplies the **ridge** sd ``ρ_λ/√λ = ‖φ(x)‖_{V⁻¹}`` (Zenati et al.
  2022, §3.2); a float ``beta`` is a constant radius (the paper's experiments use 0.1 with λ = 10).
* :class:`GPUCB` — β multiplies the **GP** sd ``ρ_λ`` with noise variance λ (Srinivas et al.;
  Chowdhury–Gopalan). CGP-UCB (Krause & Ong 2011) is GP-UCB on joint ``[context; action]``
  features, which is what every contextual environment hands a policy.

Any :class:`~torchbandits.confidence.ConfidenceRule` may be passed as ``beta`` (Algorithm 1 of
Flynn & Reeb 2024): the model then also maintains the regularisers the rule needs.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import nn

from ..confidence import ConfidenceRule, IGPBeta, Variance, as_rule
from ..kernels import check_kernel
from ..models import ExactKernelRidge
from ..validation import check_positive
from .base import RuleUCB, check_model
from .refit import RefitMixin

__all__ = ["GPUCB", "KernelUCB"]


class KernelUCB(RefitMixin, RuleUCB):
    """Kernel UCB with the exact posterior (K-UCB of Zenati et al. 2022, Algorithm 3;
    Algorithm 1 of Flynn & Reeb 2024).

    Args:
        kernel: GPyTorch kernel on the joint features.
        lam: ridge regulariser λ > 0 (= GP noise variance).
        beta: constant radius (float) or a confidence rule.
        variance: which sd a float ``beta`` multiplies, ``"ridge"`` (default, Zenati et al.) or
            ``"gp"``. Ignored when ``beta`` is a rule (the rule states its own).
        refresh_every: refactorise the model from scratch every that many updates (0: never).
        refit_every, refit_warmup, refit_options: marginal-likelihood refits of the kernel and
            noise (:mod:`torchbandits.policies.refit`; 0: never, the default).
        seed, n_warmup, dtype, device: see :class:`~torchbandits.policies.base.Policy`.
    """

    default_variance: Variance = "ridge"

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        beta: float | ConfidenceRule = 1.0,
        *,
        variance: Variance | None = None,
        refresh_every: int = 0,
        refit_every: int = 0,
        refit_warmup: int = 5,
        refit_options: dict[str, Any] | None = None,
        model: nn.Module | None = None,
        seed: int = 0,
        n_warmup: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        check_kernel(kernel)
        lam = check_positive("lam", lam)
        rule = as_rule(beta, variance or self.default_variance)
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype)
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        self.rule = rule
        self.model = model if model is not None else ExactKernelRidge(
            kernel, lam, rule.required_regularisers(lam), dtype=dtype, device=device,
            refresh_every=refresh_every,
        )
        self.init_refit(kernel, refit_every, refit_warmup, refit_options)


class GPUCB(KernelUCB):
    """GP-UCB / CGP-UCB: same model, β multiplies the GP posterior sd.

    ``beta`` defaults to IGP-UCB's radius (Chowdhury & Gopalan 2017) built from ``norm_bound``,
    ``noise_std``, ``delta`` and ``eta`` with the model regulariser ``λ = 1 + η``; pass a float
    for a constant radius or any other rule (e.g. :class:`~torchbandits.confidence.SrinivasBeta`).
    """

    default_variance: Variance = "gp"

    def __init__(
        self,
        kernel: Kernel,
        lam: float | None = None,
        beta: float | ConfidenceRule | None = None,
        *,
        norm_bound: float = 1.0,
        noise_std: float = 0.1,
        delta: float = 0.01,
        eta: float = 0.01,
        **kwargs: Any,
    ) -> None:
        if beta is None:
            beta = IGPBeta(norm_bound, noise_std, delta=delta, eta=eta)
            lam = 1.0 + eta if lam is None else lam
        super().__init__(kernel, 1.0 if lam is None else lam, beta, variance="gp", **kwargs)

"""Presets of Zenati, Bietti, Diemert, Mairal, Martin, Gaillard, "Efficient Kernel UCB for
Contextual Bandits", AISTATS 2022: K-UCB, EK-UCB and the baselines CBKB, CBBKB, SupKernelUCB.

Every UCB agent puts β on the **ridge** sd ``ρ_λ/√λ = ‖φ(x)‖_{V⁻¹}`` (§3.2); the experiments use a
constant β = 0.1 and λ = 10 (§5 and App. F.1). The EK-UCB / CBKB / CBBKB / SupKernelUCB presets
build the Gaussian kernel ``exp(−‖z − z'‖²/(2σ_k²))`` of the paper's environments from the
environment's ``lengthscale`` (σ_k = 0.1 by default, App. F.1), not from ``env.kernel``: they are the
settings of the paper's Figures 1–12. CGP-UCB (Krause & Ong 2011) is GP-UCB on the joint
``[context; action]`` features; it only differs from K-UCB in β (§5, "Baselines"), so its preset is
:func:`~torchbandits.presets.baselines.gpucb`.
"""

from __future__ import annotations

from typing import Any

from gpytorch.kernels import Kernel

from ..confidence import KernelUCBTheoryBeta
from ..kernels import make_kernel
from ..policies import CBBKB, CBKB, EKUCB, KernelUCB, Policy, SupKernelUCB
from .from_env import env_kernel, env_noise, env_norm

__all__ = ["BETA", "DEFAULT_KORS_B", "cbbkb", "cbkb", "ekucb", "kucb", "kucb_theory", "supkernel"]

#: the constant radius of every UCB agent in the experiments (on the ridge sd)
BETA = 0.1
#: KORS budget ``γ = b·λ`` per environment: ``b = 1`` (γ = λ, App. F.1) on the 1-D contexts, and
#: 0.02 on Bump (a value of the released code's grid {0.001, 0.02, 0.05, 0.1}: Bump's states are
#: nearly orthogonal, so a larger γ fills the dictionary)
DEFAULT_KORS_B = {"bump": 0.02, "chessboard": 1.0, "step-diagonal": 1.0}


def paper_kernel(env: Any) -> Kernel:
    """The Gaussian kernel of the experiments, σ_k = ``env.lengthscale`` (0.1 by default)."""
    return make_kernel("rbf", float(getattr(env, "lengthscale", 0.1)))


def kucb(env: Any, lam: float = 1.0, beta: float = 1.0, **kwargs: Any) -> Policy:
    """K-UCB (Algorithm 3): exact posterior, constant ``beta`` on the ridge sd."""
    return KernelUCB(env_kernel(env), lam=lam, beta=beta, **kwargs)


def kucb_theory(env: Any, lam: float = 1.0, delta: float = 0.01, **kwargs: Any) -> Policy:
    """K-UCB with the radius of Lemma 3.1 (log-det form) on the ridge sd, ``B`` and ``σ`` from ``env``."""
    rule = KernelUCBTheoryBeta(env_norm(env), delta=delta, noise_scale=env_noise(env))
    return KernelUCB(env_kernel(env), lam=lam, beta=rule, **kwargs)


def ekucb(env: Any, lam: float = 10.0, beta: float = BETA, kors_b: float | None = None,
          **kwargs: Any) -> Policy:
    """EK-UCB (Algorithms 2 and 4) with μ = λ (unless ``kors_mu``) and KORS budget
    γ = ``kors_b``·λ (``kors_b`` defaults to :data:`DEFAULT_KORS_B` of the environment, else 0.1)."""
    if kors_b is None:
        kors_b = DEFAULT_KORS_B.get(str(getattr(env, "name", "")).replace("_", "-"), 0.1)
    kwargs.setdefault("kors_gamma", kors_b * lam)
    return EKUCB(paper_kernel(env), lam=lam, beta=beta, **kwargs)


def cbkb(env: Any, lam: float = 10.0, beta: float = BETA, **kwargs: Any) -> Policy:
    """CBKB, the contextual BKB of §5: dictionary resampled every round."""
    return CBKB(paper_kernel(env), lam=lam, beta=beta, **kwargs)


def cbbkb(env: Any, lam: float = 10.0, beta: float = BETA, batch_threshold: float = 10.0,
          **kwargs: Any) -> Policy:
    """CBBKB, the contextual batched BKB of §5: resparsification when ``1 + Σσ̃² > C``."""
    return CBBKB(paper_kernel(env), lam=lam, beta=beta, batch_threshold=batch_threshold, **kwargs)


def supkernel(env: Any, lam: float = 10.0, eta: float = 0.1, horizon: int = 2000,
              **kwargs: Any) -> Policy:
    """SupKernelUCB (Valko et al. 2013), the elimination baseline of §5."""
    return SupKernelUCB(paper_kernel(env), lam=lam, eta=eta, horizon=horizon, **kwargs)

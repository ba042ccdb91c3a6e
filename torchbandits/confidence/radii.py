"""Theory confidence radii of the exact-posterior algorithms.

Each radius is evaluated with the data of rounds ``1..t−1`` (``model.n`` points) when scoring round
``t``, and states which standard deviation it multiplies (see :mod:`.base`).
"""

from __future__ import annotations

import math

from ..validation import check_positive, check_probability
from .base import ConfidenceRule, PosteriorModel, RadiusRule, UCBForm, log_det_value

__all__ = ["AYBeta", "IGPBeta", "KernelUCBTheoryBeta", "SrinivasBeta", "UCBForm", "ucb_form"]


def ucb_form(rule: ConfidenceRule, model: PosteriorModel, n_candidates: int, t: int
             ) -> UCBForm | None:
    """The :class:`UCBForm` of ``rule`` at round ``t`` (the rule's own ``ucb_form``: a
    :class:`~.base.RadiusRule`'s ``μ_reg + β_t·sd_reg``, Flynn & Reeb 2024's AMM and DMM), or
    ``None`` if the rule has none."""
    own = getattr(rule, "ucb_form", None)
    return None if own is None else own(model, n_candidates, t)


def _sqrt(x: float) -> float:
    """``sqrt`` with NaN for a negative argument (as ``torch.sqrt``; ``math.sqrt`` raises)."""
    return math.sqrt(x) if x >= 0 else math.nan


class KernelUCBTheoryBeta(RadiusRule):
    """K-UCB radius of Zenati et al. (2022, Lemma 3.1), multiplying the **ridge** sd:

    ``β_t = √λ·B + σ·sqrt(2 log(1/δ) + log det(I + K_{t−1}/λ))``

    with ``B ≥ ‖θ*‖``, noise scale ``σ`` (the paper's proofs take σ = 1) and per-round level δ
    (that lemma holds with probability ``1 − Tδ``: pass ``δ_total / T``). The log-det is read off
    the model's Cholesky factor.
    """

    name = "kucb_theory"
    variance = "ridge"

    def __init__(self, norm_bound: float, delta: float = 0.01, noise_scale: float = 1.0) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.delta = check_probability("delta", delta)
        self.noise_scale = check_positive("noise_scale", noise_scale)

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """``√λ·B + noise_scale·sqrt(2 log(1/δ) + log det(I + K/λ))``."""
        inner = 2.0 * math.log(1.0 / self.delta) + log_det_value(model)
        return math.sqrt(model.lam) * self.norm_bound + self.noise_scale * _sqrt(inner)


class SrinivasBeta(RadiusRule):
    """GP-UCB of Srinivas et al. (2010), multiplying the **GP** sd (``UCB = μ + β_t^{1/2} ρ``).

    * ``mode="finite"`` (Thm 1, finite arm set D): ``β_t = 2 log(|D| t² π² / (6δ))``;
    * ``mode="rkhs"`` (Thm 3, ``‖f‖_k ≤ B``): ``β_t = 2B² + 300 γ_t log³(t/δ)`` with the
      information gain of the realised data ``γ_t ≈ ½ log det(I + K_{t−1}/λ)``.

    Returns the radius ``β_t^{1/2}``.
    """

    name = "srinivas"
    variance = "gp"

    def __init__(self, delta: float = 0.1, mode: str = "finite", norm_bound: float = 1.0) -> None:
        if mode not in ("finite", "rkhs"):
            raise ValueError(f"mode must be 'finite' or 'rkhs', got {mode!r}")
        self.delta = check_probability("delta", delta)
        self.mode = mode
        self.norm_bound = check_positive("norm_bound", norm_bound)

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """Finite domain: ``sqrt(2 log(A t² π²/(6δ)))``; else ``sqrt(2B² + 300 γ_t log³(t/δ))`` with
        ``γ_t = ½ log det(I + K/λ)``.
        """
        if self.mode == "finite":
            beta = 2.0 * math.log(n_candidates * t * t * math.pi**2 / (6.0 * self.delta))
            return math.sqrt(max(beta, 0.0))
        gamma = 0.5 * log_det_value(model)
        log_term = max(math.log(t / self.delta), 0.0)
        return _sqrt(2.0 * self.norm_bound**2 + 300.0 * gamma * log_term**3)


class IGPBeta(RadiusRule):
    """IGP-UCB of Chowdhury & Gopalan (2017, Thm 2), multiplying the **GP** sd at ``1 + η``:

    ``β_t = B + σ·sqrt(log det(I + K_{t−1}/(1+η)) + c_η + 2 log(1/δ))``

    where ``c_η = 2`` (the experiments of Flynn & Reeb 2024, §7, with η = 2/T) or, with
    ``use_t_eta=True``, ``c_η = (t−1)·η`` (App. C.2). This is ``B + σ sqrt(2(γ + 1 + ln 1/δ))``
    with the realised log-det in place of γ.
    """

    name = "igp"
    variance = "gp"

    def __init__(
        self,
        norm_bound: float,
        noise_scale: float,
        delta: float = 0.01,
        eta: float = 0.01,
        use_t_eta: bool = False,
    ) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.noise_scale = check_positive("noise_scale", noise_scale)
        self.delta = check_probability("delta", delta)
        self.eta = check_positive("eta", eta)
        self.use_t_eta = bool(use_t_eta)
        self.reg = 1.0 + self.eta

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """``B + noise_scale·sqrt(log det(I + K/reg) + 2 + 2 log(1/δ))`` (``2`` → ``n·η`` with
        ``use_t_eta``).
        """
        extra = model.n * self.eta if self.use_t_eta else 2.0
        inner = log_det_value(model, self.reg) + extra + 2.0 * math.log(1.0 / self.delta)
        return self.norm_bound + self.noise_scale * _sqrt(inner)


class AYBeta(RadiusRule):
    """Abbasi-Yadkori (2012, Thm 3.11) radius, multiplying the **GP** sd at regulariser λ:

    ``β_t = σ·sqrt(log det(I + K_{t−1}/λ) + 2 log(1/δ)) / √λ + B``   (as in Flynn & Reeb 2024, §6.1)
    """

    name = "ay"
    variance = "gp"

    def __init__(self, norm_bound: float, noise_scale: float, lam: float, delta: float = 0.01) -> None:
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.noise_scale = check_positive("noise_scale", noise_scale)
        self.reg = check_positive("lam", lam)
        self.delta = check_probability("delta", delta)

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """``noise_scale·sqrt(log det(I + K/reg) + 2 log(1/δ))/√reg + B``."""
        inner = log_det_value(model, self.reg) + 2.0 * math.log(1.0 / self.delta)
        return self.noise_scale * _sqrt(inner) / math.sqrt(self.reg) + self.norm_bound

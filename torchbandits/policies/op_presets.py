"""Constants of OPKB / ADA-OPKB / OPNN / ADA-OPNN (Hong, Li, Tewari 2023, Algorithms 2, 3, 5, 7)
and their two presets.

With ``C₀ = 8T log₂T`` (App. D.1) and ``ℓ = log(C₀N/δ)`` — used in every algorithm, where the
paper writes ``log(N/δ)`` in Algorithm 3 and ``log(C₁N/δ)`` in Algorithm 7, as the authors' code
does — and ``γ`` the information gain (the paper's convention, or half of it as in the authors'
code, which takes the classical ``½ log det``):

* ``E = ⌈c₃·γ·ℓ·e⌉``, ``α = c₄σ/ℓ``, ``c₀ = 40 + 16√α``;
* ``μ_j = c₁·s_μ·2^{−j/2}``, ``β_j = s_β·γ·2^{j/2}/(10 + 4√α)``;
* near-optimal set ``A = {Δ̂ ≤ 2αγ·s_g/β_j^theory} = {Δ̂ ≤ 2α·s_g·(10+4√α)·2^{−j/2}}``;
* ``Q = (1 − q)P* + q·π(A)``;
* change-test threshold ``4·s_ε·c₀·c₁·f(m, k)`` with ``f = 2^{−min(m,k)/2}`` (paper) or
  ``(2^{−m/2} + 2^{−k/2})/2`` (authors' code).

``"theory"`` is the paper's (App. D.1: every multiplier 1, ``q = 1/2``, all replays and tests, no
restart cap); ``"aistats2023_code"`` the authors' released configuration of the experiments (§6
and App. J): ``e = 0.01``, ``s_μ = 0.2``, ``s_β = 50``, ``q = 0.2``, ``s_g = 0.05``,
``s_ε = 0.005``, threshold on the mean, ``j* = 4``, no test of the full block, at most 100
restarts, ``σ = 100``, ``δ = 10⁻⁴``, ``γ`` halved. The code's sub-design takes the rows *and*
columns ``A`` of the Cholesky factor, which is not a feature map of ``A`` unless ``A`` is a
leading block; ``subdesign="rows"`` (default) uses the rows ``Φ[A, :]``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["OPConstants", "op_preset"]


@dataclass(frozen=True)
class OPConstants:
    sigma: float = 100.0            # regulariser σ (λ = σ/T), code name `gamma`
    delta: float = 1e-4             # confidence δ (code name `tol`)
    gamma_convention: str = "paper"  # "paper" or "half" (the code's ½ log det)
    c1: float = 0.5
    mu_scale: float = 1.0           # s_μ
    c3: float = 4.0
    e_scale: float = 1.0            # e
    c4: float = 0.25
    beta_scale: float = 1.0         # s_β
    design_mix: float = 0.5         # q: weight of π(A) in Q (paper: 1/2)
    a_scale: float = 1.0            # s_g
    test_scale: float = 1.0         # s_ε
    threshold_mode: str = "min"     # "min" (paper) or "mean" (code)
    j_star: int = 0                 # replays / references only with index ≥ j* (code: 4)
    test_full_block: bool = True    # test the whole block when it ends (paper; code: no)
    max_restarts: int | None = None
    subdesign: str = "rows"         # "rows" or "aistats2023_code" (module docstring)

    def __post_init__(self) -> None:
        for name in ("sigma", "c1", "mu_scale", "c3", "e_scale", "c4", "beta_scale", "a_scale",
                     "test_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if not 0.0 <= self.design_mix <= 1.0:
            raise ValueError(f"design_mix must lie in [0, 1], got {self.design_mix}")
        if self.gamma_convention not in ("paper", "half"):
            raise ValueError(f"gamma_convention must be 'paper' or 'half', got {self.gamma_convention!r}")
        if self.threshold_mode not in ("min", "mean"):
            raise ValueError(f"threshold_mode must be 'min' or 'mean', got {self.threshold_mode!r}")
        if self.j_star < 0:
            raise ValueError(f"j_star must be >= 0, got {self.j_star}")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 or None, got {self.max_restarts}")
        if self.subdesign not in ("rows", "aistats2023_code"):
            raise ValueError(f"subdesign must be 'rows' or 'aistats2023_code', got {self.subdesign!r}")

    # ------------------------------------------------------------------ derived quantities
    @staticmethod
    def log_term(horizon: int, n_arms: int, delta: float) -> float:
        """``log(C₀N/δ)`` with ``C₀ = 8T log₂T``."""
        c0 = 8.0 * horizon * math.log2(max(horizon, 2))
        return math.log(c0 * n_arms / delta)

    def derived(self, gamma_paper: float, horizon: int, n_arms: int) -> dict[str, float]:
        """``γ`` (convention applied), ``E``, ``α``, ``c₀``, ``λ`` and ``ℓ``."""
        gamma = gamma_paper / 2.0 if self.gamma_convention == "half" else gamma_paper
        ell = self.log_term(horizon, n_arms, self.delta)
        alpha = self.c4 * self.sigma / ell
        return {
            "gamma": gamma,
            "E": max(1, math.ceil(self.c3 * gamma * ell * self.e_scale)),
            "alpha": alpha,
            "c0": 40.0 + 16.0 * math.sqrt(alpha),
            "lam": self.sigma / horizon,
            "log_term": ell,
        }

    def mu(self, j: int) -> float:
        """``μ_j = c₁·s_μ·2^{−j/2}``, the exploration floor of block ``j``."""
        return self.c1 * self.mu_scale * 2.0 ** (-j / 2.0)

    def beta(self, j: int, gamma: float, alpha: float) -> float:
        """``β_j = s_β·γ·2^{j/2}/(10 + 4√α)`` of block ``j`` (information gain ``gamma``, ``α``)."""
        return self.beta_scale * gamma * 2.0 ** (j / 2.0) / (10.0 + 4.0 * math.sqrt(alpha))

    def a_threshold(self, j: int, alpha: float) -> float:
        """Gap threshold of the near-optimal set of block ``j``: ``2α·s_g·(10 + 4√α)·2^{−j/2}``."""
        return 2.0 * alpha * self.a_scale * (10.0 + 4.0 * math.sqrt(alpha)) * 2.0 ** (-j / 2.0)

    def test_threshold(self, m: int, k: int, c0: float) -> float:
        """Change-test threshold ``4·s_ε·c₀·c₁·f(m, k)`` for replay order ``m`` against block ``k``
        (``f`` per ``threshold_mode``, module docstring).
        """
        if self.threshold_mode == "min":
            f = 2.0 ** (-min(m, k) / 2.0)
        else:
            f = 0.5 * (2.0 ** (-m / 2.0) + 2.0 ** (-k / 2.0))
        return 4.0 * self.test_scale * c0 * self.c1 * f

    def as_dict(self) -> dict[str, Any]:
        """Every field as a plain ``dict`` (for results files)."""
        return asdict(self)


_CODE_COMMON = dict(gamma_convention="half", e_scale=0.01, mu_scale=0.2, beta_scale=50.0,
                    design_mix=0.2, a_scale=0.05, test_scale=0.005, threshold_mode="mean",
                    j_star=4, test_full_block=False, max_restarts=100, sigma=100.0, delta=1e-4)


def op_preset(name: str = "aistats2023_code", *, family: str = "opkb", stationary: bool = False,
              **overrides: Any) -> OPConstants:
    """Constants of a preset (module docstring), with keyword ``overrides``.

    ``family="opnn"`` gives the ADA-OPNN / OPNN column (``e = 0.005``, ``s_g = 0.1``,
    ``s_ε = 0.02``); ``stationary=True`` the stationary-cosine OPNN values (``s_μ = 0.3``,
    ``s_g = 0.05``).
    """
    if family not in ("opkb", "opnn"):
        raise ValueError(f"family must be 'opkb' or 'opnn', got {family!r}")
    if name == "theory":
        base = OPConstants()
    elif name in ("aistats2023_code", "code"):
        kw: dict[str, Any] = dict(_CODE_COMMON)
        if family == "opnn":
            kw.update(e_scale=0.005, a_scale=0.1, test_scale=0.02)
            if stationary:
                kw.update(mu_scale=0.3, a_scale=0.05)
        base = OPConstants(**kw)
    else:
        raise ValueError(f"preset must be 'theory' or 'aistats2023_code', got {name!r}")
    return replace(base, **overrides) if overrides else base

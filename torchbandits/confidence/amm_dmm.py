"""Martingale-mixture confidence bounds of Flynn & Reeb (2024) with an explicit α: AMM and DMM.

All bound ``f*(x)`` for ``‖f*‖_H ≤ B`` and σ-sub-Gaussian noise, with a Gaussian mixture
``N(0, c K_t)`` of scale ``c > 0`` and the matched regulariser ``α₀ = σ²/c`` (Flynn & Reeb 2024,
§4.2–§4.4 and §5.3–§5.5):

* ``R_t² = α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)``       (Eq. 8, stable form)
* ``R̃²_α = max(R_t² + αB² − α yᵀ(K+αI)⁻¹y, 0)``                      (Cor. 4.3 / Lemma C.1)
* ``R̃²_{α₀} = σ² log det(I + K/α₀) + σ²B²/c + 2σ² log(1/δ)``          (Lemma C.2)
* for any α > 0: ``UCB_α(x) = μ_α(x) + sqrt(R̃²_α / α) · ρ_α(x)``, LCB with ``−``  (Eq. 14)

with ``μ_α``, ``ρ²_α`` the GP posterior mean and **GP** variance at noise variance α (not divided
by α). Then

* **AMM** (§5.5): α = α₀, multiplier ``β^AMM = sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²)``;
* **DMM** (§5.4): the min of ``UCB_α`` over the grid ``{0.1, 0.3, 1, 3, 10}·α₀`` of the
  experiments (§7) per query (max for LCB).

The exact bound CMM, the minimum over every α > 0 (Eq. 12), is in :mod:`.cmm_dual`. On the same
data and ``c``: ``CMM ≤ DMM ≤ AMM < AY(λ = α₀)`` for the UCBs, mirrored for the LCBs
(Flynn & Reeb 2024, Lemma 4.2, Cor. 4.3 and Thm. 6.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from ..kernels import make_kernel
from ..validation import check_positive, check_probability
from .base import ConfidenceRule, PosteriorModel, log_det_value, quad_y_value
from .radii import UCBForm

__all__ = [
    "DMM_GRID",
    "AMMBound",
    "DMMBound",
    "MixtureBound",
    "amm_beta",
    "default_c",
    "radius_sq",
    "rtilde_sq",
    "rtilde_sq_matched",
]

DMM_GRID: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
"""Multipliers of α₀ = σ²/c of the DMM grid (Flynn & Reeb 2024, §7)."""


def _kernel_nu(kernel: Kernel | str) -> float:
    """Smoothness ν of a Matérn kernel, ``inf`` for RBF; a name is parsed by
    :func:`~torchbandits.kernels.make_kernel`."""
    if isinstance(kernel, str):
        kernel = make_kernel(kernel)
    if isinstance(kernel, ScaleKernel):
        return _kernel_nu(kernel.base_kernel)
    if isinstance(kernel, RBFKernel):
        return math.inf
    if isinstance(kernel, MaternKernel):
        return float(kernel.nu)
    raise ValueError(f"kernel must be an RBF or Matérn kernel, got {type(kernel).__name__}")


def default_c(kernel: Kernel | str, d: int, T: int) -> float:
    """Mixture scale of the experiments (Flynn & Reeb 2024, §6.2 and §7): ``c = 1`` for RBF,
    ``c = T^{−d/(2d+2ν)}`` for Matérn-ν (their Fig. 1 uses the number of points n for T)."""
    if int(d) < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if int(T) < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    nu = _kernel_nu(kernel)
    if math.isinf(nu):
        return 1.0
    return float(T) ** (-int(d) / (2.0 * int(d) + 2.0 * nu))


# --------------------------------------------------------------------------- radius pieces
# Each piece is computed in Python floats from the model's scalars (an exact model keeps them as
# running values: no tensor operation per round); the public functions return 0-d float64 tensors.
def _sqrt(x: float) -> float:
    """``sqrt`` with NaN for a negative argument (as ``torch.sqrt``)."""
    return math.sqrt(x) if x >= 0 else math.nan


def radius_sq_value(model: PosteriorModel, noise_std: float, c: float, delta: float) -> float:
    """:func:`radius_sq` as a float."""
    s2 = noise_std**2
    a0 = s2 / c
    base = 2.0 * s2 * math.log(1.0 / delta)
    if model.n == 0:
        return base
    return a0 * quad_y_value(model, a0) + s2 * log_det_value(model, a0) + base


def radius_sq(model: PosteriorModel, noise_std: float, c: float, delta: float) -> Tensor:
    """``R_t²`` of Eq. (8) (Flynn & Reeb 2024) in a stable form (``R_0² = 2σ² log(1/δ)``).

    ``α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)`` with ``α₀ = σ²/c``: Eq. (8)'s
    ``yᵀ(I + cK/σ²)⁻¹y`` is ``α₀ yᵀ(K+α₀I)⁻¹y``.
    """
    return torch.tensor(radius_sq_value(model, noise_std, c, delta), dtype=torch.float64)


def rtilde_sq_value(model: PosteriorModel, alpha: float, r2: float, norm_bound: float) -> float:
    """:func:`rtilde_sq` as a float."""
    return rtilde_sq_values(model, (alpha,), r2, norm_bound)[0]


def rtilde_sq_values(model: PosteriorModel, alphas: Sequence[float], r2: float,
                     norm_bound: float) -> list[float]:
    """:func:`rtilde_sq_value` at each of ``alphas`` (the model's ``yᵀ(K+αI)⁻¹y`` read once per
    α by :func:`~.base.quad_y_value`: its running value where it keeps one)."""
    quads = [quad_y_value(model, a) for a in alphas] if model.n else [0.0] * len(alphas)
    b2 = norm_bound**2
    out = []
    for alpha, quad in zip(alphas, quads):
        value = r2 + alpha * b2 - alpha * quad
        out.append(value if not value < 0.0 else 0.0)
    return out


def rtilde_sq(model: PosteriorModel, alpha: float, r2: Tensor | float, norm_bound: float) -> Tensor:
    """``R̃²_α = max(R_t² + αB² − α yᵀ(K+αI)⁻¹y, 0)`` (Flynn & Reeb 2024, Cor. 4.3 with
    Lemma C.1; clamped at 0, which can only bind outside the 1 − δ event)."""
    return torch.tensor(rtilde_sq_value(model, alpha, float(r2), norm_bound), dtype=torch.float64)


def rtilde_sq_matched(model: PosteriorModel, noise_std: float, c: float, norm_bound: float,
                      delta: float) -> Tensor:
    """Lemma C.2: ``R̃²_{σ²/c} = σ² log det(I + cK/σ²) + σ²B²/c + 2σ² log(1/δ)`` (no y)."""
    s2 = noise_std**2
    a0 = s2 / c
    ld = log_det_value(model, a0) if model.n else 0.0
    return torch.tensor(s2 * ld + s2 * norm_bound**2 / c + 2.0 * s2 * math.log(1.0 / delta),
                        dtype=torch.float64)


def amm_beta_value(model: PosteriorModel, noise_std: float, c: float, norm_bound: float,
                   delta: float) -> float:
    """:func:`amm_beta` as a float."""
    a0 = noise_std**2 / c
    ld = log_det_value(model, a0) if model.n else 0.0
    return _sqrt(c * ld + 2.0 * c * math.log(1.0 / delta) + norm_bound**2)


def amm_beta(model: PosteriorModel, noise_std: float, c: float, norm_bound: float,
             delta: float) -> Tensor:
    """``β^AMM = sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²)`` (Flynn & Reeb 2024, Cor. 4.6
    with Lemma C.2), multiplying the GP sd ``ρ_{σ²/c}``."""
    return torch.tensor(amm_beta_value(model, noise_std, c, norm_bound, delta), dtype=torch.float64)


# --------------------------------------------------------------------------- rules
class MixtureBound(ConfidenceRule):
    """Common parameters of the martingale-mixture bounds (UCB/LCB on the **GP** sd).

    Args:
        noise_std: σ, the sub-Gaussian noise scale (or an upper bound).
        norm_bound: B ≥ ‖f*‖_H.
        delta: confidence level δ.
        c: mixture scale (see :func:`default_c`); ``α₀ = σ²/c``.
    """

    variance = "gp"

    def __init__(self, noise_std: float, norm_bound: float, delta: float = 0.01, c: float = 1.0) -> None:
        self.noise_std = check_positive("noise_std", noise_std)
        self.norm_bound = check_positive("norm_bound", norm_bound)
        self.delta = check_probability("delta", delta)
        self.c = check_positive("c", c)
        self._diag: dict[str, float] = {}

    @property
    def alpha0(self) -> float:
        """The matched regulariser ``σ²/c``."""
        return self.noise_std**2 / self.c

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        return () if lam == self.alpha0 else (self.alpha0,)

    def radius_sq(self, model: PosteriorModel) -> Tensor:
        """``R_t²`` (Eq. 8) of the model's data."""
        return radius_sq(model, self.noise_std, self.c, self.delta)

    def bound_at(self, model: PosteriorModel, candidates: Tensor, alpha: float,
                 r2: Tensor | float | None = None) -> tuple[Tensor, Tensor]:
        """``μ_α ± sqrt(R̃²_α/α) ρ_α`` for one fixed α (Eq. 14); ``[A]`` each."""
        r2v = radius_sq_value(model, self.noise_std, self.c, self.delta) if r2 is None else float(r2)
        mean, var = model.mean_var(candidates, reg=alpha)
        mult = _sqrt(rtilde_sq_value(model, alpha, r2v, self.norm_bound) / alpha)
        width = torch.sqrt(var).mul_(mult)
        return mean + width, mean - width

    def diagnostics(self) -> dict[str, float]:
        return dict(self._diag)


class AMMBound(MixtureBound):
    """Kernel AMM bound (Eq. 14 at α = σ²/c, closed form of Lemma C.2; GP sd at α₀).

    ``UCB = μ_{α₀} + β^AMM ρ_{α₀}``, ``β^AMM = sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²)``.
    ``alpha`` (optional) evaluates Eq. (14) at another fixed α instead (same ``R_t``).
    """

    name = "amm"

    def __init__(self, noise_std: float, norm_bound: float, delta: float = 0.01, c: float = 1.0,
                 alpha: float | None = None) -> None:
        super().__init__(noise_std, norm_bound, delta, c)
        self.alpha = None if alpha is None else check_positive("alpha", alpha)

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        regs = {self.alpha0} if self.alpha is None else {self.alpha0, self.alpha}
        return tuple(sorted(r for r in regs if r != lam))

    def _matched(self, model: PosteriorModel, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(μ_{α₀}, β^AMM ρ_{α₀})`` ``[A]`` each."""
        mean, var = model.mean_var(candidates, reg=self.alpha0)
        beta = amm_beta_value(model, self.noise_std, self.c, self.norm_bound, self.delta)
        self._diag = {"beta": beta}
        return mean, torch.sqrt(var).mul_(beta)

    def ucb_form(self, model: PosteriorModel, n_candidates: int, t: int) -> UCBForm | None:
        """``UCB = sqrt(ρ²_{α₀}) β^AMM + μ_{α₀}`` as a :class:`~.radii.UCBForm` (``None`` with
        another fixed ``alpha``)."""
        if self.alpha is not None and self.alpha != self.alpha0:
            return None
        beta = amm_beta_value(model, self.noise_std, self.c, self.norm_bound, self.delta)
        self._diag = {"beta": beta}
        return UCBForm((self.alpha0,), (beta,), (1.0,))

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        if self.alpha is not None and self.alpha != self.alpha0:
            return self.bound_at(model, candidates, self.alpha)
        mean, width = self._matched(model, candidates)
        return mean + width, mean - width

    def ucb(self, model: PosteriorModel, candidates: Tensor, t: int) -> Tensor:
        """The UCB alone ``[A]`` (the same values as ``bounds(...)[0]``)."""
        if self.alpha is not None and self.alpha != self.alpha0:
            return self.bound_at(model, candidates, self.alpha)[0]
        mean, width = self._matched(model, candidates)
        return width.add_(mean)


class DMMBound(MixtureBound):
    """Kernel DMM bound: per query the min over ``α ∈ grid·α₀`` of Eq. (14) (max for the LCB).

    ``R_t`` always uses the fixed ``c`` (α₀); only the ellipsoid weight α ranges over the grid
    (Flynn & Reeb 2024, §5.4). The model keeps one Cholesky factor per grid value, so the cost is
    about ``len(grid)`` times AMM's. GP sd.
    """

    name = "dmm"

    def __init__(self, noise_std: float, norm_bound: float, delta: float = 0.01, c: float = 1.0,
                 grid: Sequence[float] = DMM_GRID) -> None:
        super().__init__(noise_std, norm_bound, delta, c)
        if len(grid) == 0:
            raise ValueError("grid must contain at least one multiplier")
        self.grid = tuple(check_positive("grid", g) for g in grid)

    @property
    def alphas(self) -> tuple[float, ...]:
        """The regularisers α = grid·α₀ over which DMM takes its minimum."""
        a0 = self.alpha0
        return tuple([g * a0 for g in self.grid])

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        regs = dict.fromkeys((self.alpha0, *self.alphas))
        return tuple(r for r in regs if r != lam)

    def _multipliers(self, model: PosteriorModel) -> tuple[float, tuple[float, ...], list[float]]:
        """``(R_t², the grid α, sqrt(R̃²_α/α) per α)`` (Eq. (8) and Cor. 4.3)."""
        r2 = radius_sq_value(model, self.noise_std, self.c, self.delta)
        alphas = self.alphas
        rts = rtilde_sq_values(model, alphas, r2, self.norm_bound)
        return r2, alphas, [_sqrt(rt / a) for rt, a in zip(rts, alphas)]

    def _grid(self, model: PosteriorModel, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(μ_α, sqrt(R̃²_α/α) ρ_α)`` ``[G, A]`` each over the grid."""
        r2, alphas, mult = self._multipliers(model)
        if hasattr(model, "mean_var_many"):  # one kernel evaluation for the whole grid
            mean, var = model.mean_var_many(candidates, alphas)
        else:
            pairs = [model.mean_var(candidates, reg=a) for a in alphas]
            mean, var = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        scale = torch.tensor(mult, dtype=torch.float64, device=mean.device)
        self._last = (r2, None)
        return mean, torch.sqrt(var) * scale[:, None]

    def ucb_form(self, model: PosteriorModel, n_candidates: int, t: int) -> UCBForm:
        """``UCB = min_α (sqrt(ρ²_α) sqrt(R̃²_α/α) + μ_α)`` over the grid as a
        :class:`~.radii.UCBForm`; its ``done`` keeps the minimising grid point at the chosen
        candidate (diagnostics)."""
        r2, alphas, mult = self._multipliers(model)

        def done(ucb: Tensor, arg: Tensor | None) -> None:
            self._last = (r2, arg)

        return UCBForm(alphas, tuple(mult), (1.0,) * len(mult), done)

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        mean, width = self._grid(model, candidates)
        ucb, arg = (mean + width).min(0)
        self._last = (self._last[0], _at_argmax(arg, ucb))
        return ucb, (mean - width).max(0).values

    def ucb(self, model: PosteriorModel, candidates: Tensor, t: int) -> Tensor:
        """The UCB alone ``[A]`` (the same values as ``bounds(...)[0]``)."""
        mean, width = self._grid(model, candidates)
        ucb, arg = width.add_(mean).min(0) if width.dtype == mean.dtype else (mean + width).min(0)
        self._last = (self._last[0], _at_argmax(arg, ucb))
        return ucb

    def diagnostics(self) -> dict[str, float]:
        """``r2`` (``R_t²``) and ``log_alpha_ratio`` (``log(α/α₀)`` of the grid point that sets
        the bound of the chosen candidate, the UCB's first argmax) of the last call, computed
        here from what it kept."""
        last = getattr(self, "_last", None)
        if last is None or last[1] is None:
            return dict(self._diag)
        r2, arg = last
        log_grid = torch.log(torch.tensor(self.grid, dtype=torch.float64, device=arg.device))
        return {"r2": r2, "log_alpha_ratio": float(log_grid[arg].mean())}


def _at_argmax(arg: Tensor, ucb: Tensor) -> Tensor:
    """``arg`` ``[A]`` at the UCB's first argmax (a NaN counts as largest, as ``torch.argmax``):
    ``[1]``, the minimising grid point of the candidate a UCB policy chooses."""
    return arg.gather(0, torch.argmax(ucb).reshape(1))

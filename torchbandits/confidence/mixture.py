"""Martingale-mixture confidence bounds of seed 002 (Flynn & Reeb 2024): AMM, DMM and CMM.

All three bound ``f*(x)`` for ``‖f*‖_H ≤ B`` and σ-sub-Gaussian noise, with a Gaussian mixture
``N(0, c K_t)`` of scale ``c > 0`` and the matched regulariser ``α₀ = σ²/c`` (spec §2.2–§2.7):

* ``R_t² = α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)``       (Eq. 8, stable form)
* ``R̃²_α = max(R_t² + αB² − α yᵀ(K+αI)⁻¹y, 0)``                      (Cor 4.3 / Lemma C.1)
* ``R̃²_{α₀} = σ² log det(I + K/α₀) + σ²B²/c + 2σ² log(1/δ)``          (Lemma C.2)
* for any α > 0: ``UCB_α(x) = μ_α(x) + sqrt(R̃²_α / α) · ρ_α(x)``, LCB with ``−``  (Eq. 14)

with ``μ_α``, ``ρ²_α`` the GP posterior mean and **GP** variance at noise variance α (not divided
by α). Then

* **AMM**: α = α₀, multiplier ``β^AMM = sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²)``;
* **DMM**: the min of ``UCB_α`` over the grid ``{0.1, 0.3, 1, 3, 10}·α₀`` per query (max for LCB);
* **CMM**: the exact bound of the SOCP (Eq. 10), which by strong duality equals the 1-D minimum
  ``inf_{α>0} UCB_α(x)`` (Eq. 12). Computed here for all queries at once: one ``eigh`` of ``K_t``
  (``K = QΛQᵀ``) makes every α cost O(t) per query
  (``μ_α = Σ p_i ỹ_i/(λ_i+α)``, ``ρ²_α = k(x,x) − Σ p_i²/(λ_i+α)``, ``yᵀ(K+αI)⁻¹y = Σ ỹ_i²/(λ_i+α)``
  with ``p = Qᵀk_t(x)``, ``ỹ = Qᵀy``); a log-spaced grid brackets the minimum and safeguarded
  Newton steps on ``log α`` refine it. The α → ∞ limit ``B·sqrt(k(x,x))`` is included. From
  ``border_min_n`` points on, the ``eigh`` is refreshed only every ``refresh_every`` rounds and the
  newer points enter exactly through a Schur complement (:mod:`.cmm_border`). The CVXPY SOCP
  is :class:`CMMBound` with ``method="socp"`` (see :mod:`.cmm_socp`).

Ordering on the same data and ``c``: ``CMM ≤ DMM ≤ AMM < AY(λ = α₀)`` for the UCBs, mirrored for
the LCBs (spec §4).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from ..validation import check_positive, check_probability
from .base import ConfidenceRule, PosteriorModel

__all__ = [
    "DMM_GRID",
    "AMMBound",
    "CMMBound",
    "DMMBound",
    "MixtureBound",
    "amm_beta",
    "default_c",
    "dual_bounds",
    "radius_sq",
    "rtilde_sq",
    "rtilde_sq_matched",
    "spectrum",
]

DMM_GRID: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
"""Multipliers of α₀ = σ²/c of the DMM grid (spec §2.7)."""


def _kernel_nu(kernel: Kernel | str) -> float:
    """Smoothness ν of a Matérn kernel, ``inf`` for RBF."""
    if isinstance(kernel, str):
        key = kernel.lower().replace("-", "").replace("_", "").replace("/", "")
        table = {"rbf": math.inf, "se": math.inf, "matern12": 0.5, "matern32": 1.5, "matern52": 2.5}
        if key not in table:
            raise ValueError(f"kernel must be 'rbf' or a Matérn name, got {kernel!r}")
        return table[key]
    if isinstance(kernel, ScaleKernel):
        return _kernel_nu(kernel.base_kernel)
    if isinstance(kernel, RBFKernel):
        return math.inf
    if isinstance(kernel, MaternKernel):
        return float(kernel.nu)
    raise ValueError(f"kernel must be an RBF or Matérn kernel, got {type(kernel).__name__}")


def default_c(kernel: Kernel | str, d: int, T: int) -> float:
    """Mixture scale of the experiments (spec §5.1, §7.10): ``c = 1`` for RBF,
    ``c = T^{−d/(2d+2ν)}`` for Matérn-ν (Fig. 1 uses the number of points n for T)."""
    if int(d) < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if int(T) < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    nu = _kernel_nu(kernel)
    if math.isinf(nu):
        return 1.0
    return float(T) ** (-int(d) / (2.0 * int(d) + 2.0 * nu))


# --------------------------------------------------------------------------- radius pieces
def radius_sq(model: PosteriorModel, noise_std: float, c: float, delta: float) -> Tensor:
    """``R_t²`` of Eq. (8) in the stable form of spec §2.2 (``R_0² = 2σ² log(1/δ)``).

    ``α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)`` with ``α₀ = σ²/c``.
    """
    s2 = noise_std**2
    a0 = s2 / c
    base = 2.0 * s2 * math.log(1.0 / delta)
    if model.n == 0:
        return torch.tensor(base, dtype=torch.float64)
    return a0 * model.quad_y(a0) + s2 * model.log_det(a0) + base


def rtilde_sq(model: PosteriorModel, alpha: float, r2: Tensor, norm_bound: float) -> Tensor:
    """``R̃²_α = max(R_t² + αB² − α yᵀ(K+αI)⁻¹y, 0)`` (Cor 4.3 with Lemma C.1; clamped, §7.8)."""
    quad = model.quad_y(alpha) if model.n else torch.zeros((), dtype=torch.float64)
    return torch.clamp(r2 + alpha * norm_bound**2 - alpha * quad, min=0.0)


def rtilde_sq_matched(model: PosteriorModel, noise_std: float, c: float, norm_bound: float,
                      delta: float) -> Tensor:
    """Lemma C.2: ``R̃²_{σ²/c} = σ² log det(I + cK/σ²) + σ²B²/c + 2σ² log(1/δ)`` (no y)."""
    s2 = noise_std**2
    a0 = s2 / c
    ld = model.log_det(a0) if model.n else torch.zeros((), dtype=torch.float64)
    return s2 * ld + s2 * norm_bound**2 / c + 2.0 * s2 * math.log(1.0 / delta)


def amm_beta(model: PosteriorModel, noise_std: float, c: float, norm_bound: float,
             delta: float) -> Tensor:
    """``β^AMM = sqrt(c log det(I + cK/σ²) + 2c log(1/δ) + B²)`` (spec §2.6), multiplying the
    GP sd ``ρ_{σ²/c}``."""
    a0 = noise_std**2 / c
    ld = model.log_det(a0) if model.n else torch.zeros((), dtype=torch.float64)
    return torch.sqrt(c * ld + 2.0 * c * math.log(1.0 / delta) + norm_bound**2)


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
                 r2: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``μ_α ± sqrt(R̃²_α/α) ρ_α`` for one fixed α (Eq. 14)."""
        r2 = self.radius_sq(model) if r2 is None else r2
        mean, var = model.mean_var(candidates, reg=alpha)
        mult = torch.sqrt(rtilde_sq(model, alpha, r2, self.norm_bound) / alpha)
        width = mult * torch.sqrt(var)
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

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        if self.alpha is not None and self.alpha != self.alpha0:
            return self.bound_at(model, candidates, self.alpha)
        mean, var = model.mean_var(candidates, reg=self.alpha0)
        beta = amm_beta(model, self.noise_std, self.c, self.norm_bound, self.delta)
        self._diag = {"beta": float(beta)}
        width = beta * torch.sqrt(var)
        return mean + width, mean - width


class DMMBound(MixtureBound):
    """Kernel DMM bound: per query the min over ``α ∈ grid·α₀`` of Eq. (14) (max for the LCB).

    ``R_t`` always uses the fixed ``c`` (α₀); only the ellipsoid weight α ranges over the grid
    (spec §2.7). The model keeps one Cholesky factor per grid value, so the cost is about
    ``len(grid)`` times AMM's. GP sd.
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
        return tuple(g * self.alpha0 for g in self.grid)

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        regs = dict.fromkeys((self.alpha0, *self.alphas))
        return tuple(r for r in regs if r != lam)

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        r2 = self.radius_sq(model)
        if hasattr(model, "mean_var_many"):  # one kernel evaluation for the whole grid
            mean, var = model.mean_var_many(candidates, self.alphas)
            alphas = torch.tensor(self.alphas, dtype=mean.dtype, device=mean.device)
            rt2 = torch.stack([rtilde_sq(model, a, r2, self.norm_bound) for a in self.alphas])
            width = torch.sqrt(rt2.to(mean.device) / alphas)[:, None] * torch.sqrt(var)
            u, lcb = mean + width, mean - width
        else:
            ucbs, lcbs = zip(*(self.bound_at(model, candidates, a, r2) for a in self.alphas))
            u, lcb = torch.stack(ucbs), torch.stack(lcbs)
        ucb, arg = u.min(0)
        lcb_v = lcb.max(0).values
        log_grid = torch.log(torch.tensor(self.grid, dtype=ucb.dtype, device=arg.device))
        self._diag = {"r2": float(r2), "log_alpha_ratio": float(log_grid[arg].mean())}
        return ucb, lcb_v


# --------------------------------------------------------------------------- spectral dual
@dataclass
class Spectrum:
    """Eigendecomposition ``K_t = Q diag(λ) Qᵀ`` (λ clamped at 0) and ``ỹ = Qᵀy`` of a model's
    data, valid while the data are unchanged."""

    x: Tensor
    y: Tensor
    evals: Tensor
    evecs: Tensor
    ytil: Tensor


def spectrum(model, cache: Spectrum | None = None) -> Spectrum:
    """The :class:`Spectrum` of ``model`` (``ExactKernelRidge``): O(t³) ``eigh`` of ``K_t``,
    reused when ``cache`` holds the same data."""
    x, y = model.x, model.y
    if cache is not None and cache.x.shape == x.shape and torch.equal(cache.x, x) and torch.equal(cache.y, y):
        return cache
    gram = kernel_matrix(model.kernel, x, x)
    evals, evecs = torch.linalg.eigh(gram)
    evals = torch.clamp(evals, min=0.0)
    return Spectrum(x.clone(), y.clone(), evals, evecs, evecs.mT @ y)


def dual_bounds(
    spec: Spectrum,
    kq: Tensor,
    kdiag: Tensor,
    r2: Tensor,
    norm_bound: float,
    alpha0: float,
    *,
    which: str = "both",
    grid_decades: float = 6.0,
    grid_per_decade: int = 4,
    newton_steps: int = 3,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Exact CMM bounds by the 1-D dual (Eq. 12) for all queries at once.

    ``kq = K_{S,queries}`` ``[t, A]``, ``kdiag = k(x, x)`` ``[A]``, ``r2 = R_t²``. Minimises
    ``h(α) = ±μ_α + sqrt(R̃²_α/α) ρ_α`` over ``log α``: a shared log-grid
    ``α₀·10^[−grid_decades, grid_decades]`` (matrix products) brackets the minimum, then
    ``newton_steps`` safeguarded Newton steps on ``log α`` per query (analytic first and second
    derivatives; a step leaving the bracket, or negative curvature, bisects on the sign of the
    derivative instead) refine it; the α → ∞ limit ``B sqrt(k(x,x))`` is included. Every
    evaluated α gives a valid bound, so the returned value is the smallest one seen.
    Returns ``(ucb, lcb, log_alpha_ucb)`` (``None`` for a side not asked for).
    """
    lam, ytil = spec.evals, spec.ytil
    p = spec.evecs.mT @ kq  # [t, A]
    p2 = p * p
    py = p * ytil[:, None]
    y2 = ytil * ytil
    b2 = norm_bound**2
    limit = norm_bound * torch.sqrt(torch.clamp(kdiag, min=0.0))
    signs = {"both": (1.0, -1.0), "ucb": (1.0,), "lcb": (-1.0,)}[which]
    n_a = kq.shape[1]
    sgn = torch.cat([torch.full((n_a,), s, dtype=kq.dtype, device=kq.device) for s in signs])
    pm = torch.cat([py * s for s in signs], dim=1)  # [t, Q]
    p2q = p2.repeat(1, len(signs))
    kd = kdiag.repeat(len(signs))

    def h_of(mu: Tensor, b: Tensor, q: Tensor, a: Tensor) -> Tensor:
        rt2 = torch.clamp(r2 + a * b2 - a * q, min=0.0)
        rho = torch.sqrt(torch.clamp(kd - b, min=0.0))
        return mu + torch.sqrt(rt2 / a) * rho

    # shared grid: one matrix product per quantity
    n_grid = int(2 * grid_decades * grid_per_decade) + 1
    log_a0 = math.log(alpha0)
    grid = torch.linspace(log_a0 - grid_decades * math.log(10.0), log_a0 + grid_decades * math.log(10.0),
                          n_grid, dtype=kq.dtype, device=kq.device)
    ag = torch.exp(grid)
    wg = 1.0 / (lam[:, None] + ag[None, :])  # [t, G]
    h_grid = h_of(wg.mT @ pm, wg.mT @ p2q, (y2 @ wg)[:, None], ag[:, None])  # [G, Q]
    best, j = h_grid.min(0)

    # safeguarded Newton on s = log α inside each query's grid bracket
    lo = grid[torch.clamp(j - 1, min=0)]
    hi = grid[torch.clamp(j + 1, max=n_grid - 1)]
    s = grid[j].clone()
    s_best = s.clone()
    coef = torch.stack([pm.mT, p2q.mT, y2.expand(pm.shape[1], -1)], dim=2)  # [Q, t, 3]
    for _ in range(newton_steps):
        a = torch.exp(s)
        w = torch.reciprocal(lam[None, :] + a[:, None])  # [Q, t]
        powers = torch.stack([w, w * w, w * w * w], dim=1)  # [Q, 3, t]
        sums = torch.bmm(powers, coef)  # [Q, power, quantity]
        mu, sp, sq = sums[:, 0, 0], sums[:, 0, 1], sums[:, 0, 2]
        d_mu, d_sp, d_sq = -sums[:, 1, 0], -sums[:, 1, 1], -sums[:, 1, 2]
        dd_mu, dd_sp, dd_sq = 2 * sums[:, 2, 0], 2 * sums[:, 2, 1], 2 * sums[:, 2, 2]
        g = r2 / a + b2 - sq  # R̃²/α (unclamped)
        dg, ddg = -r2 / a**2 - d_sq, 2 * r2 / a**3 - dd_sq
        v = kd - sp  # ρ²
        dv, ddv = -d_sp, -dd_sp
        u = torch.clamp(g, min=0.0) * torch.clamp(v, min=0.0)
        h = mu + torch.sqrt(u)
        better = h < best
        best = torch.where(better, h, best)
        s_best = torch.where(better, s, s_best)
        ru = torch.sqrt(torch.clamp(u, min=1e-300))
        du = dg * v + g * dv
        ddu = ddg * v + 2 * dg * dv + g * ddv
        dh = d_mu + du / (2 * ru)
        ddh = dd_mu + ddu / (2 * ru) - du * du / (4 * ru**3)
        h_s = a * dh  # derivatives in s = log α
        h_ss = a * dh + a * a * ddh
        lo = torch.where(h_s < 0, s, lo)
        hi = torch.where(h_s > 0, s, hi)
        prop = s - h_s / h_ss
        ok = (h_ss > 0) & (prop > lo) & (prop < hi)
        s = torch.where(ok, prop, 0.5 * (lo + hi))
    a = torch.exp(s)  # evaluate the last iterate
    w = torch.reciprocal(lam[None, :] + a[:, None])
    mu, sp, sq = torch.bmm(w[:, None, :], coef)[:, 0].unbind(1)
    h = mu + torch.sqrt(torch.clamp(r2 / a + b2 - sq, min=0.0) * torch.clamp(kd - sp, min=0.0))
    s_best = torch.where(h < best, s, s_best)
    best = torch.minimum(h, best)
    val = torch.minimum(best, limit.repeat(len(signs)))
    val = val * sgn
    out: dict[float, Tensor] = {s: val[i * n_a:(i + 1) * n_a] for i, s in enumerate(signs)}
    return out.get(1.0), out.get(-1.0), s_best[:n_a]


class _Float64Data:
    """A model's data in float64 for :class:`CMMBound`'s dual (in float32 the dual's minimiser
    moves enough to change the choices): ``x``, ``y``, ``n``, ``kernel`` and the radius pieces
    ``quad_y`` / ``log_det`` from one float64 Cholesky factor of ``K + αI``."""

    def __init__(self, model: PosteriorModel) -> None:
        self.kernel, self.n = model.kernel, model.n
        self.x, self.y = model.x.to(torch.float64), model.y.to(torch.float64)

    def _chol(self, reg: float) -> Tensor:
        eye = torch.eye(self.n, dtype=torch.float64, device=self.x.device)
        return torch.linalg.cholesky(kernel_matrix(self.kernel, self.x, self.x) + reg * eye)

    def quad_y(self, reg: float) -> Tensor:
        z = torch.linalg.solve_triangular(self._chol(reg), self.y[:, None], upper=False)
        return (z * z).sum()

    def log_det(self, reg: float) -> Tensor:
        return 2.0 * torch.log(torch.diagonal(self._chol(reg))).sum() - self.n * math.log(reg)


class CMMBound(MixtureBound):
    """Kernel CMM bound: the exact ``max/min f(x)`` over ``{‖f_t − y‖ ≤ R_t, ‖f‖_H ≤ B}``.

    ``method="dual"`` (default): the 1-D dual of Eq. (12) for all queries at once
    (:func:`dual_bounds`; one ``eigh`` of ``K_t`` per round, cached while the data are unchanged).
    ``method="socp"``: the second-order cone program of Eq. (10) by CVXPY (reference;
    :class:`~torchbandits.confidence.cmm_socp.CMMSocp`; pinned solver, status checked, a failed
    query falls back to its DMM value with a warning). GP sd.

    Args:
        noise_std, norm_bound, delta, c: see :class:`MixtureBound`.
        method: ``"dual"`` or ``"socp"``.
        newton_steps, grid_decades, grid_per_decade: dual search (see :func:`dual_bounds`).
        refresh_every, border_min_n: from ``border_min_n`` observations on, the ``eigh`` is
            refreshed only every ``refresh_every`` rounds and the newer points are an exact
            Schur-complement border (:mod:`.cmm_border`; same values, O(t³) work amortised);
            ``refresh_every=0``: a fresh ``eigh`` every round.
        jitter, factor, solver: SOCP options (``ε = 1e-6`` on the Cholesky input only; ``"chol"``
            or ``"eigh"`` factor of ``K_{t+1}``; CVXPY solver name, default Clarabel).
    """

    name = "cmm"

    def __init__(self, noise_std: float, norm_bound: float, delta: float = 0.01, c: float = 1.0,
                 method: str = "dual", *, newton_steps: int = 3, grid_decades: float = 6.0,
                 grid_per_decade: int = 4, refresh_every: int = 16, border_min_n: int = 256,
                 jitter: float = 1e-6, factor: str = "chol", solver: str = "CLARABEL") -> None:
        super().__init__(noise_std, norm_bound, delta, c)
        if method not in ("dual", "socp"):
            raise ValueError(f"method must be 'dual' or 'socp', got {method!r}")
        if int(newton_steps) < 0:
            raise ValueError(f"newton_steps must be >= 0, got {newton_steps}")
        self.method = method
        self.newton_steps = int(newton_steps)
        if int(refresh_every) < 0:
            raise ValueError(f"refresh_every must be >= 0, got {refresh_every}")
        self.refresh_every = int(refresh_every)
        self.border_min_n = int(border_min_n)
        self._stale = None
        self.grid_decades = check_positive("grid_decades", grid_decades)
        self.grid_per_decade = int(check_positive("grid_per_decade", grid_per_decade))
        self.jitter = float(jitter)
        if self.jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        if factor not in ("chol", "eigh"):
            raise ValueError(f"factor must be 'chol' or 'eigh', got {factor!r}")
        self.factor = factor
        self.solver = solver
        self._spectrum: Spectrum | None = None
        self._socp = None
        self._fallback = DMMBound(noise_std, norm_bound, delta, c)

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        if self.method == "socp":
            return self._fallback.required_regularisers(lam)
        return super().required_regularisers(lam)

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        return self._bounds(model, candidates, "both")  # type: ignore[return-value]

    def ucb(self, model: PosteriorModel, candidates: Tensor, t: int) -> Tensor:
        """Only the UCB (half the work of :meth:`bounds`)."""
        return self._bounds(model, candidates, "ucb")[0]  # type: ignore[return-value]

    @torch.no_grad()
    def _bounds(self, model, candidates: Tensor, which: str) -> tuple[Tensor | None, Tensor | None]:
        if self.method == "dual" and candidates.dtype != torch.float64 and model.n:
            # the dual is solved in float64 whatever the model's dtype (cast in, cast out)
            out = self._bounds(_Float64Data(model), candidates.to(torch.float64), which)
            return tuple(None if b is None else b.to(candidates.dtype) for b in out)  # type: ignore[return-value]
        kdiag = kernel_diag(model.kernel, candidates)
        if model.n == 0:
            lim = self.norm_bound * torch.sqrt(kdiag)
            return lim, -lim
        r2 = self.radius_sq(model)
        if self.method == "socp":
            return self._socp_bounds(model, candidates, r2, which)
        grid = dict(grid_decades=self.grid_decades, grid_per_decade=self.grid_per_decade)
        if self.refresh_every > 0 and model.n >= self.border_min_n:
            from .cmm_border import border_dual_bounds, stale_spectrum

            self._stale = stale_spectrum(model.kernel, model.x, model.y, self._stale, self.refresh_every)
            spec = self._stale
            if spec.s < model.n:  # eigenbasis of the older points + exact Schur border
                ucb, lcb, s = border_dual_bounds(spec, model.kernel, model.x, model.y, candidates, kdiag, r2,
                                                 self.norm_bound, self.alpha0, which=which, **grid)
                self._diag = {"r2": float(r2), "border": float(model.n - spec.s),
                              "log_alpha_ratio": float((s - math.log(self.alpha0)).mean())}
                return ucb, lcb
        else:
            self._spectrum = spectrum(model, self._spectrum)
            spec = self._spectrum
        kq = kernel_matrix(model.kernel, model.x, candidates)
        ucb, lcb, s = dual_bounds(spec, kq, kdiag, r2, self.norm_bound, self.alpha0,  # type: ignore[arg-type]
                                  which=which, newton_steps=self.newton_steps, **grid)
        self._diag = {"r2": float(r2), "log_alpha_ratio": float((s - math.log(self.alpha0)).mean())}
        return ucb, lcb

    def _socp_bounds(self, model, candidates: Tensor, r2: Tensor, which: str):
        from .cmm_socp import CMMSocp

        if self._socp is None:
            self._socp = CMMSocp(jitter=self.jitter, factor=self.factor, solver=self.solver)
        gram = kernel_matrix(model.kernel, model.x, model.x)
        kq = kernel_matrix(model.kernel, model.x, candidates)
        kdiag = kernel_diag(model.kernel, candidates)
        ucb, lcb, ok = self._socp.bounds(gram, model.y, float(torch.sqrt(r2)), self.norm_bound, kq, kdiag,
                                         which=which)
        if not bool(ok.all()):
            du, dl = self._fallback.bounds(model, candidates, 0)
            bad = int((~ok).sum())
            warnings.warn(f"CMM SOCP: {bad} query value(s) not solved to 'optimal'; using the DMM "
                          f"value there", RuntimeWarning, stacklevel=3)
            if ucb is not None:
                ucb = torch.where(ok, ucb, du)
            if lcb is not None:
                lcb = torch.where(ok, lcb, dl)
        self._diag = {"r2": float(r2), "socp_failures": float((~ok).sum())}
        return ucb, lcb

"""Kernel CMM bound of Flynn & Reeb (2024) by its 1-D dual: ``inf_{α>0} UCB_α(x)`` (Eq. 12).

The exact bound is the value of the second-order cone program of Eq. (10) (Thm. 4.4), which by
strong duality (Thm. 4.5) equals the 1-D minimum over the ellipsoid weight α of
``UCB_α(x) = μ_α(x) + sqrt(R̃²_α/α) ρ_α(x)`` (Eq. 14; pieces in :mod:`.amm_dmm`). Computed here
for all queries at once: one ``eigh`` of ``K_t`` (``K = QΛQᵀ``) makes every α cost O(t) per
query (``μ_α = Σ p_i ỹ_i/(λ_i+α)``, ``ρ²_α = k(x,x) − Σ p_i²/(λ_i+α)``,
``yᵀ(K+αI)⁻¹y = Σ ỹ_i²/(λ_i+α)`` with ``p = Qᵀk_t(x)``, ``ỹ = Qᵀy``); the minimum over
``log α`` is found by the search of :mod:`.alpha_search`. The α → ∞ limit ``B·sqrt(k(x,x))`` is
included. From ``border_min_n`` points on, the ``eigh`` is refreshed only every
``refresh_every`` rounds and the newer points enter exactly through a Schur complement
(:mod:`.cmm_border`, the same search). The CVXPY SOCP is :class:`CMMBound` with
``method="socp"`` (see :mod:`.cmm_socp`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from ..validation import check_positive
from .alpha_search import SIDES, dual_objective, dual_slopes, log_alpha_grid, min_over_alpha, split_sides
from .amm_dmm import DMMBound, MixtureBound
from .base import PosteriorModel

__all__ = ["CMMBound", "Spectrum", "dual_bounds", "spectrum"]


@dataclass
class Spectrum:
    """Eigendecomposition ``K_t = Q diag(λ) Qᵀ`` (λ clamped at 0) and ``ỹ = Qᵀy`` of a model's
    data, valid while the data are unchanged."""

    x: Tensor  # [t, d]
    y: Tensor  # [t]
    evals: Tensor  # [t]
    evecs: Tensor  # [t, t]
    ytil: Tensor  # [t]


def spectrum(model, cache: Spectrum | None = None) -> Spectrum:
    """The :class:`Spectrum` of ``model`` (``ExactKernelRidge``): O(t³) ``eigh`` of ``K_t``,
    reused when ``cache`` holds the same data."""
    x, y = model.x, model.y
    if (cache is not None and cache.x.shape == x.shape and cache.x.device == x.device
            and cache.x.dtype == x.dtype and torch.equal(cache.x, x) and torch.equal(cache.y, y)):
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
    steps: int = 3,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Exact CMM bounds by the 1-D dual (Eq. 12) for all queries at once.

    ``kq = K_{S,queries}`` ``[t, A]``, ``kdiag = k(x, x)`` ``[A]``, ``r2 = R_t²``. Minimises
    ``h(α) = ±μ_α + sqrt(R̃²_α/α) ρ_α`` over ``log α`` by
    :func:`~torchbandits.confidence.alpha_search.min_over_alpha` (a shared log-grid
    ``α₀·10^[−grid_decades, grid_decades]`` by matrix products, then ``steps`` safeguarded Newton
    steps per query, each O(t) with the exact derivatives
    ``d^k/dα^k Σ cᵢ/(λᵢ+α) = (−1)^k k! Σ cᵢ/(λᵢ+α)^{k+1}``). Returns
    ``(ucb, lcb, log_alpha_ucb)``, ``[A]`` each (``None`` for a side not asked for).
    """
    lam, ytil = spec.evals, spec.ytil
    p = spec.evecs.mT @ kq  # [t, A]
    signs = SIDES[which]
    n_a = kq.shape[1]
    pm = torch.cat([p * (s * ytil[:, None]) for s in signs], dim=1)  # σ p ỹ, [t, Q]
    p2q = (p * p).repeat(1, len(signs))  # [t, Q]
    y2 = ytil * ytil  # [t]
    kd = kdiag.repeat(len(signs))  # [Q]

    grid = log_alpha_grid(alpha0, grid_decades, grid_per_decade, dtype=kq.dtype, device=kq.device)
    ag = torch.exp(grid)
    wg = 1.0 / (lam[:, None] + ag[None, :])  # [t, G]
    h_grid = dual_objective(wg.mT @ pm, wg.mT @ p2q, (y2 @ wg)[:, None], ag[:, None], r2, norm_bound, kd)

    coef = torch.stack([pm.mT, p2q.mT, y2.expand(pm.shape[1], -1)], dim=2)  # [Q, t, 3]

    def h_at(s: Tensor) -> Tensor:  # one log α per query, [Q] -> [Q]
        a = torch.exp(s)
        w = torch.reciprocal(lam[None, :] + a[:, None])  # [Q, t]
        mu, sp, sq = torch.bmm(w[:, None, :], coef)[:, 0].unbind(1)
        return dual_objective(mu, sp, sq, a, r2, norm_bound, kd)

    def h_slopes_at(s: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # h, dh/ds, d²h/ds², [Q] each
        a = torch.exp(s)
        w = torch.reciprocal(lam[None, :] + a[:, None])  # [Q, t]
        sums = torch.bmm(torch.stack([w, w * w, w * w * w], dim=1), coef)  # [Q, power, quantity]
        mean, drop, quad = (torch.stack([sums[:, 0, i], -sums[:, 1, i], 2 * sums[:, 2, i]]) for i in range(3))
        return dual_slopes(mean, drop, quad, a, r2, norm_bound, kd)

    best, s_best = min_over_alpha(h_slopes_at, h_at, grid, h_grid, steps)
    limit = (norm_bound * torch.sqrt(torch.clamp(kdiag, min=0.0))).repeat(len(signs))
    ucb, lcb = split_sides(best, limit, signs, n_a)
    return ucb, lcb, s_best[:n_a]


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
        newton_steps, grid_decades, grid_per_decade: the α search
            (:func:`~torchbandits.confidence.alpha_search.min_over_alpha`: a shared log-grid
            ``α₀·10^[−grid_decades, grid_decades]``, then ``newton_steps`` safeguarded Newton
            steps on ``log α`` with exact first and second derivatives), the same for the fresh
            and the bordered eigenbasis.
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
        search = dict(grid_decades=self.grid_decades, grid_per_decade=self.grid_per_decade,
                      steps=self.newton_steps)
        if self.refresh_every > 0 and model.n >= self.border_min_n:
            from .cmm_border import border_dual_bounds, stale_spectrum

            self._stale = stale_spectrum(model.kernel, model.x, model.y, self._stale, self.refresh_every)
            spec = self._stale
            if spec.s < model.n:  # eigenbasis of the older points + exact Schur border
                ucb, lcb, s = border_dual_bounds(spec, model.kernel, model.x, model.y, candidates, kdiag, r2,
                                                 self.norm_bound, self.alpha0, which=which, **search)
                self._diag = {"r2": float(r2), "border": float(model.n - spec.s),
                              "log_alpha_ratio": float((s - math.log(self.alpha0)).mean())}
                return ucb, lcb
        else:
            self._spectrum = spectrum(model, self._spectrum)
            spec = self._spectrum
        kq = kernel_matrix(model.kernel, model.x, candidates)
        ucb, lcb, s = dual_bounds(spec, kq, kdiag, r2, self.norm_bound, self.alpha0,  # type: ignore[arg-type]
                                  which=which, **search)
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

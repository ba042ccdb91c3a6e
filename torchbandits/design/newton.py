"""Log-barrier interior point with equality-constrained Newton steps for the log-det programs of
Hong, Li & Tewari (AISTATS 2023, Algorithm 1, Def. 4.2).

Solves ``min_{p ∈ Δ_N} J(p) = cᵀp − w·log det(Φᵀ diag(p) Φ + λI)`` by following the central path
of ``F_t(p) = t·J(p) − Σ_i log p_i`` subject to ``1ᵀp = 1``:

* with ``L = chol(S(p))``, ``Z = L⁻¹Φᵀ``, ``M = ZᵀZ`` and leverages ``ℓ = diag M``:
  gradient ``t(c − wℓ) − 1/p`` and Hessian ``t·w·(M∘M) + diag(1/p²)``;
* the Newton system is solved in the scaled variable ``Δp = p∘v`` (Hessian ``t·w·(pp ᵀ∘M∘M) + I``,
  always ≥ I, so its Cholesky is stable however small some ``p_i`` become);
* fraction-to-boundary (0.99 of the largest feasible step), then Armijo backtracking on ``F_t``;
* ``t ← μ·t`` until the Frank–Wolfe gap (``≤ N/t`` on the central path) is below ``gap_tol``.

Warm start: the previous solution mixed with a little of the uniform distribution, and a first
barrier weight ``t₀`` read off its Frank–Wolfe gap. Everything runs in torch on ``Φ``'s device and
dtype (float64 recommended); each step costs ``O(N²r + N³)``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["NewtonInfo", "barrier_newton"]


@dataclass
class NewtonInfo:
    newton_steps: int
    outer_steps: int
    final_t: float
    seconds: float
    converged: bool


def _state(phi: Tensor, p: Tensor, lam: float, eye: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(logdet S(p), Z = L⁻¹Φᵀ)`` or ``None`` if ``S`` is not numerically PD."""
    s = phi.T @ (p.unsqueeze(1) * phi) + lam * eye
    chol, info = torch.linalg.cholesky_ex(s)
    if int(info) != 0:
        return None
    z = torch.linalg.solve_triangular(chol, phi.T, upper=False)
    return 2.0 * torch.log(torch.diagonal(chol)).sum(), z


def _logdet(phi: Tensor, p: Tensor, lam: float, eye: Tensor) -> Tensor | None:
    s = phi.T @ (p.unsqueeze(1) * phi) + lam * eye
    chol, info = torch.linalg.cholesky_ex(s)
    if int(info) != 0:
        return None
    return 2.0 * torch.log(torch.diagonal(chol)).sum()


def barrier_newton(
    phi: Tensor,
    c: Tensor,
    weight: float,
    lam: float,
    *,
    p0: Tensor | None = None,
    gap_tol: float = 1e-10,
    tol: float = 1e-14,
    mu: float = 20.0,
    inner_tol: float = 1e-10,
    max_newton: int = 400,
) -> tuple[Tensor, NewtonInfo]:
    """Minimise ``cᵀp − weight·log det(Φᵀ diag(p) Φ + lam·I)`` over the simplex.

    Args:
        phi: ``[N, r]`` feature factor (``ΦΦᵀ = K``).
        c: ``[N]`` linear cost (OP: the empirical gaps Δ̂).
        weight: ``w > 0`` (OP: ``2/β``).
        lam: ``λ > 0``.
        p0: warm start (any distribution; mixed with 10⁻³ of the uniform one).
        gap_tol: stop after the first centring whose Frank–Wolfe gap ``Σ p g − min g`` is below it.
        tol: the last barrier weight is ``N/tol`` (a cap; ``gap_tol`` normally stops earlier).
        mu: barrier growth factor per outer step.
        inner_tol: stop centring when ``λ²/2 ≤ inner_tol`` (Newton decrement).
        max_newton: cap on the total number of Newton steps.

    Returns ``(p, info)``; ``p`` is clipped at 0 and renormalised.
    """
    t_start = time.perf_counter()
    n = phi.shape[0]
    dtype, device = phi.dtype, phi.device
    eye = torch.eye(phi.shape[1], dtype=dtype, device=device)
    uniform = torch.full((n,), 1.0 / n, dtype=dtype, device=device)
    if n == 1:
        return torch.ones(1, dtype=dtype, device=device), NewtonInfo(0, 0, math.inf, 0.0, True)
    if p0 is None:
        p = uniform.clone()
        t = 1.0
    else:
        p = torch.clamp(p0.to(dtype=dtype, device=device), min=0.0)
        p = 0.999 * p / p.sum() + 1e-3 * uniform
        st = _state(phi, p, lam, eye)
        if st is None:
            p, t = uniform.clone(), 1.0
        else:
            g = c - weight * (st[1] * st[1]).sum(0)
            gap = float((p * g).sum() - g.min())
            t = min(max(1.0, n / max(gap, 1e-300) / 10.0), n / tol / mu)
    t_final = n / tol
    steps = outer = 0
    converged = False
    while True:
        # ---- centring: Newton on F_t with 1ᵀΔp = 0
        prev_dec = math.inf
        for _ in range(max_newton):
            st = _state(phi, p, lam, eye)
            if st is None:  # pragma: no cover - S is PD for every p ≥ 0 since λ > 0
                raise RuntimeError("barrier_newton: S(p) lost positive definiteness")
            logdet, z = st
            m = z.T @ z
            lev = torch.diagonal(m)
            g_scaled = t * p * (c - weight * lev) - 1.0               # p ∘ ∇F_t
            pm = p.unsqueeze(1) * m
            h = (t * weight) * (pm * pm.T)                              # D_p (M∘M) D_p · t·w
            h.diagonal().add_(1.0)
            hc, info = torch.linalg.cholesky_ex(h)
            if int(info) != 0:  # pragma: no cover - h ≥ I
                raise RuntimeError("barrier_newton: Newton system not positive definite")
            rhs = torch.stack([g_scaled, p], dim=1)
            sol = torch.cholesky_solve(rhs, hc)
            u, zw = sol[:, 0], sol[:, 1]
            nu = -(p @ u) / (p @ zw)
            v = -(u + nu * zw)
            dec = float(-(g_scaled @ v))                                # Newton decrement λ²
            steps += 1
            if dec / 2.0 <= inner_tol or (dec < 1e-5 and dec > 0.25 * prev_dec):
                break   # centred, or at the round-off floor (no more quadratic progress)
            prev_dec = dec
            neg = v < 0
            s = 1.0
            if bool(neg.any()):
                s = min(1.0, 0.99 * float((-1.0 / v[neg]).min()))
            dp = p * v
            if dec < 0.2:
                # quadratic region of the self-concordant F_t: the full (boundary-safe) step is
                # accepted without a line search, whose F_t-differences ~ t·ε would be round-off
                p = p + s * dp
                p = p / p.sum()
                if steps >= max_newton:
                    break
                continue
            f0 = t * (float(c @ p) - weight * float(logdet)) - float(torch.log(p).sum())
            accepted = False
            for _ls in range(60):
                p_new = p + s * dp
                ld = _logdet(phi, p_new, lam, eye)
                if ld is not None and bool((p_new > 0).all()):
                    f1 = t * (float(c @ p_new) - weight * float(ld)) - float(torch.log(p_new).sum())
                    if f1 <= f0 - 0.25 * s * dec:
                        accepted = True
                        break
                s *= 0.5
            if not accepted:   # line search stalled: at the limit of floating point precision

                break
            p = p_new / p_new.sum()
            if steps >= max_newton:
                break
        outer += 1
        st = _state(phi, p, lam, eye)
        if st is not None:
            g = c - weight * (st[1] * st[1]).sum(0)
            if float((p * g).sum() - g.min()) <= gap_tol:
                converged = True
                break
        if t >= t_final:
            break
        if steps >= max_newton:
            break
        t_new = min(t * mu, t_final)
        # predictor: on the central path p_x·z_x = 1/t with dual slack z_x; components with
        # p_x < z_x (t·p_x² < 1: the inactive ones) keep z_x and so shrink by t/t_new
        inactive = t * p * p < 1.0
        p = torch.where(inactive, p * (t / t_new), p)
        p = p / p.sum()
        t = t_new
    p = torch.clamp(p, min=0.0)
    p = p / p.sum()
    return p, NewtonInfo(steps, outer, t, time.perf_counter() - t_start, converged)

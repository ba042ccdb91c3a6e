"""The log-det program shared by OP and the kernel optimal design (Hong, Li & Tewari, AISTATS 2023,
Algorithm 1 and Def. 4.2), and its solver with the fallback chain.

``solve_logdet_program`` minimises ``cᵀp − w·log det(Φᵀ diag(p) Φ + λI)`` over the simplex with

* ``solver="newton"`` (default): the torch barrier-Newton method of :mod:`.newton` (warm starts,
  any device); the answer is checked by its KKT certificate (Frank–Wolfe gap ≤ ``kkt_tol``). A
  failed check is retried with a tighter barrier target and more Newton steps, then with CVXPY
  (only up to ``cvxpy_max_n`` variables — Clarabel needs ~10 min at N = 100), then a
  ``RuntimeError`` says what failed;
* ``solver="cvxpy"``: the reference CVXPY program (Clarabel, then SCS), with a low-rank factor
  of ``K = ΦΦᵀ`` when it is numerically low rank (the log-det is then ``k × k``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .kkt import Certificate, kkt_certificate
from .newton import barrier_newton

__all__ = ["LogDetSolution", "low_rank_factor", "solve_cvxpy", "solve_logdet_program"]


@dataclass
class LogDetSolution:
    p: Tensor
    certificate: Certificate
    solver: str
    seconds: float
    newton_steps: int = 0
    attempts: list[str] = field(default_factory=list)


def low_rank_factor(phi: Tensor, rel_tol: float = 1e-12) -> Tensor:
    """An ``[N, k]`` factor ``F`` with ``FFᵀ = ΦΦᵀ`` up to the discarded eigenvalues
    (``≤ rel_tol·max``); ``k = rank``. Log-dets of ``Fᵀ D F + λI`` and ``Φᵀ D Φ + λI`` differ by
    the constant ``(r − k) log λ`` only."""
    u, s, _ = torch.linalg.svd(phi, full_matrices=False)
    keep = s**2 > rel_tol * float(s[0] ** 2) if s.numel() else s > 0
    k = max(int(keep.sum()), 1)
    return u[:, :k] * s[:k]


def solve_cvxpy(phi: Tensor, c: Tensor, weight: float, lam: float, *, low_rank: bool = True,
                solvers: tuple[str, ...] = ("CLARABEL", "SCS")) -> Tensor:
    """Reference CVXPY program of the log-det problem — ``p`` clipped at 0 and renormalised."""
    import cvxpy as cp
    import numpy as np

    f = low_rank_factor(phi) if low_rank else phi
    fn = f.detach().cpu().double().numpy()
    cn = c.detach().cpu().double().numpy()
    n, r = fn.shape
    p = cp.Variable(n, nonneg=True)
    s = fn.T @ cp.diag(p) @ fn + lam * np.eye(r)
    s = (s + s.T) / 2
    prob = cp.Problem(cp.Minimize(cn @ p - weight * cp.log_det(s)), [cp.sum(p) == 1])
    last_err: Exception | None = None
    for name in solvers:
        try:
            prob.solve(solver=getattr(cp, name))
        except Exception as err:  # try the next solver
            last_err = err
            continue
        if p.value is not None and prob.status in ("optimal", "optimal_inaccurate"):
            out = torch.as_tensor(np.clip(p.value, 0.0, None), dtype=phi.dtype, device=phi.device)
            return out / out.sum()
    raise RuntimeError(f"CVXPY could not solve the log-det program (status {prob.status!r}, "
                       f"last error {last_err!r})")


def solve_logdet_program(
    phi: Tensor,
    c: Tensor,
    weight: float,
    lam: float,
    *,
    solver: str = "newton",
    warm_start: Tensor | None = None,
    kkt_tol: float = 1e-9,
    cvxpy_max_n: int = 40,
    cvxpy_kkt_tol: float = 1e-5,
) -> LogDetSolution:
    """``argmin_{p ∈ Δ_N} cᵀp − weight·log det(Φᵀ diag(p) Φ + λI)`` with its certificate.

    Solved in float64 whatever the dtype of ``phi`` (``p`` is returned in that dtype; the
    certificate is the float64 solution's).

    ``kkt_tol`` is the Frank–Wolfe gap a Newton answer must reach, times the problem's scale
    ``max(1, weight, max|c|)`` (absolute for the O(1) problems of the bandits); a CVXPY answer must
    reach ``cvxpy_kkt_tol`` times that scale (interior-point solvers stop at ~1e-8 relative).
    """
    if phi.ndim != 2 or phi.shape[0] < 1:
        raise ValueError(f"phi must be a non-empty [N, r] matrix, got shape {tuple(phi.shape)}")
    if c.shape != (phi.shape[0],):
        raise ValueError(f"c must have shape [{phi.shape[0]}], got {tuple(c.shape)}")
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"weight must be a finite number > 0, got {weight}")
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a finite number > 0, got {lam}")
    if not bool(torch.isfinite(c).all()) or not bool(torch.isfinite(phi).all()):
        raise ValueError("phi and c must be finite")
    if solver not in ("newton", "cvxpy"):
        raise ValueError(f"solver must be 'newton' or 'cvxpy', got {solver!r}")
    if phi.dtype != torch.float64:
        # solved in float64 whatever the caller's dtype (cast in, cast out): at λ = σ/T the
        # program's matrix S(p) is too ill-conditioned for float32 to reach the certificate
        sol = solve_logdet_program(
            phi.to(torch.float64), c.to(torch.float64), weight, lam, solver=solver,
            warm_start=None if warm_start is None else warm_start.to(torch.float64),
            kkt_tol=kkt_tol, cvxpy_max_n=cvxpy_max_n, cvxpy_kkt_tol=cvxpy_kkt_tol)
        sol.p = sol.p.to(phi.dtype)
        return sol
    t0 = time.perf_counter()
    attempts: list[str] = []
    # the certificate is absolute for O(1) problems and relative to the objective's scale otherwise
    scale = max(1.0, weight, float(c.abs().max()))
    kkt_tol = kkt_tol * scale
    cvxpy_kkt_tol = cvxpy_kkt_tol * scale
    if solver == "cvxpy":
        p = solve_cvxpy(phi, c, weight, lam)
        cert = kkt_certificate(phi, p, c, weight, lam)
        return LogDetSolution(p, cert, "cvxpy", time.perf_counter() - t0, 0, ["cvxpy"])
    steps = 0
    for gap_tol, max_newton, start, mu in ((0.1 * kkt_tol, 300, warm_start, 20.0),
                                           (0.01 * kkt_tol, 2000, None, 5.0)):
        p, info = barrier_newton(phi, c, weight, lam, p0=start, gap_tol=gap_tol,
                                 max_newton=max_newton, mu=mu)
        steps += info.newton_steps
        cert = kkt_certificate(phi, p, c, weight, lam)
        attempts.append(f"newton(mu={mu:g}, steps={info.newton_steps}, gap={cert.gap:.2e})")
        if cert.ok(kkt_tol):
            return LogDetSolution(p, cert, "newton", time.perf_counter() - t0, steps, attempts)
    if phi.shape[0] <= cvxpy_max_n:
        p = solve_cvxpy(phi, c, weight, lam)
        cert = kkt_certificate(phi, p, c, weight, lam)
        attempts.append(f"cvxpy(gap={cert.gap:.2e})")
        if cert.ok(cvxpy_kkt_tol):
            return LogDetSolution(p, cert, "cvxpy", time.perf_counter() - t0, steps, attempts)
    raise RuntimeError(
        "log-det program not solved to its KKT certificate (Frank-Wolfe gap <= "
        f"{kkt_tol:g}); attempts: {'; '.join(attempts)}"
    )

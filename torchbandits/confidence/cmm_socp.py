"""Kernel CMM bound by the second-order cone program of Eq. (10) of Flynn & Reeb (2024), by CVXPY
(the reference for the 1-D dual of their Eq. (12)).

For data ``(x_1..x_t, y)`` and a query x, with ``w ∈ R^{t+1}`` the representer weights on
``(x_1..x_t, x)``::

    UCB(x) = max  k_{t+1}(x)ᵀ w   s.t.  ‖[K_t | k_t(x)] w − y‖₂ ≤ R_t,   ‖U_{t+1} w‖₂ ≤ B

(LCB: ``min``), where ``U_{t+1}ᵀ U_{t+1} = K_{t+1}`` (``‖f‖²_H = wᵀK_{t+1}w`` for
``f = Σ w_i k(x_i, ·)``, Flynn & Reeb 2024, §4).

Per round (data fixed) the program is compiled once with CVXPY ``Parameter``s for everything
that depends on the query: the objective vector, the column ``k_t(x)`` and — with the default
``factor="chol"`` — the last column ``(u, s)`` of the upper factor
``U_{t+1} = [[U_t, u], [0, s]]``, ``U_tᵀ u = k_t(x)``, ``s = sqrt(max(k(x,x) − ‖u‖², 0))``: the
data block ``U_t`` is shared by all queries. ``U_t`` is the **exact** Cholesky factor of ``K_t``;
only when that factorisation fails (``K_t`` numerically singular) is ``ε = jitter`` added to the
diagonal of the factored matrix, with a ``RuntimeWarning`` (the authors' code always adds
ε = 1e-6, which shrinks the norm ball and moves the bound by up to ~1e-5). ``factor="eigh"``
uses ``diag(sqrt(max(λ,0))) Qᵀ`` of ``eigh(K_{t+1})`` (exact, no jitter) as a full parameter
matrix. One solve per query and side with the pinned solver (Clarabel); the status is checked and
any status other than ``optimal`` is reported to the caller (which falls back to DMM).
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import torch
from torch import Tensor

__all__ = ["CMMSocp"]


class CMMSocp:
    """CVXPY program of Eq. (10), compiled once per data set, re-solved per query.

    Args:
        jitter: fallback ε added to ``K_t``'s diagonal before the Cholesky (factor only) when the
            exact factorisation fails; 1e-6 as in the authors' code. ``jitter_used`` says which
            factor the current program holds (0.0: exact).
        factor: ``"chol"`` (default) or ``"eigh"``.
        solver: CVXPY solver name (pinned; default ``"CLARABEL"``).
    """

    def __init__(self, jitter: float = 1e-6, factor: str = "chol", solver: str = "CLARABEL") -> None:
        if factor not in ("chol", "eigh"):
            raise ValueError(f"factor must be 'chol' or 'eigh', got {factor!r}")
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        if solver not in cp.installed_solvers():
            raise ValueError(f"solver {solver!r} is not installed; choose from {cp.installed_solvers()}")
        self.jitter = float(jitter)
        self.factor = factor
        self.solver = solver
        self._key: tuple | None = None
        self.jitter_used = 0.0
        self.n_solves = 0
        self.statuses: dict[str, int] = {}

    # ------------------------------------------------------------------ per round
    def _build(self, gram: np.ndarray, y: np.ndarray, radius: float, norm_bound: float) -> None:
        t = gram.shape[0]
        self._gram = gram
        w_d = cp.Variable(t)
        w_x = cp.Variable()
        self._obj_d = cp.Parameter(t)
        self._obj_x = cp.Parameter()
        self._col = cp.Parameter(t)  # k_t(x)
        fit = gram @ w_d + self._col * w_x - y
        cons = [cp.norm(fit, 2) <= radius]
        if self.factor == "chol":
            upper, self.jitter_used = self._factor(gram)  # U_tᵀ U_t = K_t (+ εI on failure only)
            self._upper = upper
            self._u = cp.Parameter(t)
            self._s = cp.Parameter(nonneg=True)
            last = cp.reshape(self._s * w_x, (1,), order="C")
            norm_vec = cp.hstack([upper @ w_d + self._u * w_x, last])
        else:
            self._full = cp.Parameter((t + 1, t + 1))
            norm_vec = self._full @ cp.hstack([w_d, cp.reshape(w_x, (1,), order="C")])
        cons.append(cp.norm(norm_vec, 2) <= norm_bound)
        self._problem = cp.Problem(cp.Maximize(self._obj_d @ w_d + self._obj_x * w_x), cons)

    def _factor(self, gram: np.ndarray) -> tuple[np.ndarray, float]:
        """Upper factor ``U`` with ``UᵀU = K_t`` (exact), or ``K_t + εI`` when that fails."""
        try:
            return np.linalg.cholesky(gram).T, 0.0
        except np.linalg.LinAlgError:
            if self.jitter == 0.0:
                raise
            warnings.warn(f"CMM SOCP: K_t is numerically singular; factorising K_t + {self.jitter:g} I "
                          "instead (the bound is then slightly tighter than the exact one)",
                          RuntimeWarning, stacklevel=4)
            return np.linalg.cholesky(gram + self.jitter * np.eye(gram.shape[0])).T, self.jitter

    def _set_query(self, b: np.ndarray, kxx: float) -> None:
        self._col.value = b
        if self.factor == "chol":
            u = np.linalg.solve(self._upper.T, b) if b.size else b
            self._u.value = u
            self._s.value = float(np.sqrt(max(kxx + self.jitter_used - u @ u, 0.0)))
        else:
            t = b.size
            full = np.empty((t + 1, t + 1))
            full[:t, :t] = self._gram
            full[:t, t] = b
            full[t, :t] = b
            full[t, t] = kxx
            lam, q = np.linalg.eigh(full)
            self._full.value = np.sqrt(np.clip(lam, 0.0, None))[:, None] * q.T

    def _solve(self, sign: float, b: np.ndarray, kxx: float) -> tuple[float, bool]:
        self._obj_d.value = sign * b
        self._obj_x.value = sign * kxx
        try:
            self._problem.solve(solver=self.solver)
            status = self._problem.status
        except cp.error.SolverError:
            status = "solver_error"
        self.n_solves += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        ok = status == cp.OPTIMAL and self._problem.value is not None
        return (sign * float(self._problem.value) if ok else float("nan")), ok

    # ------------------------------------------------------------------ public
    def bounds(self, gram: Tensor, y: Tensor, radius: float, norm_bound: float, kq: Tensor,
               kdiag: Tensor, which: str = "both") -> tuple[Tensor | None, Tensor | None, Tensor]:
        """UCB/LCB of every query (columns of ``kq = K_{S,queries}``) and a mask of queries whose
        every solve ended ``optimal``."""
        if which not in ("both", "ucb", "lcb"):
            raise ValueError(f"which must be 'both', 'ucb' or 'lcb', got {which!r}")
        g = gram.detach().cpu().numpy().astype(np.float64)
        yv = y.detach().cpu().numpy().astype(np.float64)
        key = (g.shape, g.tobytes(), yv.tobytes(), float(radius), float(norm_bound))
        if key != self._key:  # candidate-independent parts: once per round
            self._build(g, yv, float(radius), float(norm_bound))
            self._key = key
        kqn = kq.detach().cpu().numpy().astype(np.float64)
        kdn = kdiag.detach().cpu().numpy().astype(np.float64)
        n_q = kqn.shape[1]
        ucb, lcb = np.full(n_q, np.nan), np.full(n_q, np.nan)
        ok = np.ones(n_q, dtype=bool)
        for i in range(n_q):
            self._set_query(kqn[:, i], float(kdn[i]))
            if which in ("both", "ucb"):
                ucb[i], good = self._solve(1.0, kqn[:, i], float(kdn[i]))
                ok[i] &= good
            if which in ("both", "lcb"):
                lcb[i], good = self._solve(-1.0, kqn[:, i], float(kdn[i]))
                ok[i] &= good

        def back(a: np.ndarray) -> Tensor:
            return torch.as_tensor(a, dtype=kq.dtype, device=kq.device)

        return (back(ucb) if which != "lcb" else None, back(lcb) if which != "ucb" else None,
                torch.as_tensor(ok, device=kq.device))

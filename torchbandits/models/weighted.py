"""Reweighted posteriors for time-varying kernel bandits (Zhou & Shroff 2021 and the
related methods they compare with).

Both models are "GP posterior over a reweighted data set" and return ``(mean, variance)`` at the
GP scale (noise variance λ), like :class:`~torchbandits.models.ExactKernelRidge`.

:class:`DiscountedKernelRidge` — weighted GP-UCB (W-GP-UCB / kernel D-LinUCB, Deng et al. 2022). At round
``t`` the ``s``-th observation has weight ``w_s = γ^{t−1−s}`` (newest weight 1). With
``W = diag(w)`` and ``a(x) = (K + λW⁻¹)⁻¹ k_S(x)``:

* mean      ``μ(x) = k_S(x)ᵀ (K + λW⁻¹)⁻¹ Y = a(x)ᵀ Y``;
* ``width="sandwich"`` (default): the D-LinUCB width ``λ‖φ(x)‖²_{V⁻¹ṼV⁻¹}`` with
  ``V = ΦᵀWΦ + λI``, ``Ṽ = ΦᵀW²Φ + λI``. In kernel form it is
  ``k(x,x) − 2k_Sᵀa + aᵀKa + ‖W(k_S − Ka)‖²/λ``, which simplifies (``Ka = k_S − λW⁻¹a``) to
  ``k(x,x) − k_Sᵀa − λ Σ_i a_i² (1/w_i − 1)``;
* ``width="weighted"``: the weighted GP variance ``k(x,x) − k_Sᵀ a``.

With ``γ = 1`` both reduce to the GP posterior. All weights change every round, so the factor of
``K + λW⁻¹`` is recomputed each round: O(n³ + n²A) with ``n`` the points still held. Points whose
weight fell below ``weight_floor`` (relative tail mass ``γ^n`` of the discounted sum) are
dropped, and at most ``max_points`` are kept — both bound ``n`` (an approximation the paper does
not make; ``weight_floor=0`` and ``max_points=None`` keep everything).

:class:`TimeDecayKernelRidge` — TV-GP-UCB (Bogunovic, Scarlett & Cevher 2016): the posterior of
``f_{t+1}`` under ``f_{t+1} = √(1−ε) f_t + √ε g_{t+1}``, i.e. the product kernel
``k̃((x,i),(x',j)) = k(x,x')·ρ^{|i−j|}`` with ``ρ = √(1−ε)``. The Gram matrix of past data never
changes (entries depend on ``|i − j|`` only), so its Cholesky factor grows by appends (O(n²)).
The query vector at time ``τ`` is ``k̃_i(x) = k(x_i, x) ρ^{τ−τ_i} = ρ^{τ−b}·[k(x_i, x) ρ^{b−τ_i}]``:
the bracket does not depend on ``τ``, so for a fixed candidate set ``U = L⁻¹[K_SC ∘ ρ^{b−τ}]``
gains one row per append and a round costs O(n² + nA). When ``ρ^{b−τ}`` would overflow the base
``b`` moves forward and points with ``ρ^{τ−τ_i} < weight_floor`` are dropped (one
refactorisation).
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import StoredData, grow_rows
from ..kernels import kernel_diag, kernel_matrix
from ..linalg import GrowingCholesky, logdet_from_cholesky
from ..validation import as_matrix, as_point, as_scalar_reward, check_positive
from .posterior import CandidateCache, colsum_sq, gp_scores, score_whitened, whitened_solve

__all__ = ["DiscountedKernelRidge", "TimeDecayKernelRidge"]


class _HistoryModule(StoredData):
    """Inputs/targets in capacity-doubling buffers, with removal of the oldest points."""

    def __init__(self, kernel: Kernel, lam: float, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self._lam = check_positive("lam", lam)
        self.regularisers: tuple[float, ...] = (self._lam,)
        self.kernel = kernel.to(dtype=dtype, device=device)
        self.register_buffer("_x", torch.zeros(0, 0, dtype=dtype, device=device))
        self.register_buffer("_y", torch.zeros(16, dtype=dtype, device=device))
        self._n = 0
        self._seen = 0  # observations ever appended (the time index of the next one is _seen + 1)
        self._version = 0

    @property
    def lam(self) -> float:
        return self._lam

    @property
    def seen(self) -> int:
        return self._seen

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._version += 1
        return super()._apply(fn, *args, **kwargs)

    def _store(self, x: Tensor, y: float) -> None:
        n = self._n
        if self._x.shape[0] == 0:
            self._x = x.new_zeros(16, x.shape[0])
        self._x = grow_rows(self._x, n + 1)
        self._y = grow_rows(self._y, n + 1)
        self._x[n] = x
        self._y[n] = y
        self._n = n + 1
        self._seen += 1
        self._version += 1

    def _drop_oldest(self, count: int) -> None:
        n = self._n
        if count <= 0:
            return
        self._x[: n - count] = self._x[count:n].clone()
        self._y[: n - count] = self._y[count:n].clone()
        self._n = n - count
        self._version += 1

    def _check(self, x: Tensor, y: float | Tensor) -> tuple[Tensor, float]:
        return (as_point("x", x, dtype=self.dtype, device=self.device, dim=self.dim),
                as_scalar_reward("y", y))

    def _check_candidates(self, candidates: Tensor, reg: float | None) -> Tensor:
        if reg is not None and float(reg) != self._lam:
            raise ValueError(f"reg must be None or the model's λ={self._lam}, got {reg!r}")
        cand = as_matrix("candidates", candidates, dtype=self.dtype, device=self.device)
        if self.dim is not None and cand.shape[1] != self.dim:
            raise ValueError(f"candidates must have {self.dim} columns, got {cand.shape[1]}")
        return cand


class DiscountedKernelRidge(_HistoryModule):
    """Weighted (discounted) kernel ridge regression of W-GP-UCB (see module docstring).

    Args:
        kernel: GPyTorch kernel; lam: λ > 0; discount: γ ∈ (0, 1];
        width: ``"sandwich"`` (D-LinUCB width) or ``"weighted"`` (weighted GP variance);
        weight_floor: drop points whose weight ``γ^{age}`` is below this (0: never);
        max_points: keep at most this many points (``None``: no cap).
    """

    def __init__(self, kernel: Kernel, lam: float = 1.0, discount: float = 0.99, *,
                 width: str = "sandwich", weight_floor: float = 1e-4, max_points: int | None = None,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> None:
        super().__init__(kernel, lam, dtype, device)
        self.discount = float(discount)
        if not (0.0 < self.discount <= 1.0):
            raise ValueError(f"discount must lie in (0, 1], got {discount!r}")
        if width not in ("sandwich", "weighted"):
            raise ValueError(f"width must be 'sandwich' or 'weighted', got {width!r}")
        self.width = width
        self.weight_floor = float(weight_floor)
        if not (0.0 <= self.weight_floor < 1.0):
            raise ValueError(f"weight_floor must lie in [0, 1), got {weight_floor!r}")
        if max_points is not None and int(max_points) < 1:
            raise ValueError(f"max_points must be >= 1 or None, got {max_points!r}")
        self.max_points = None if max_points is None else int(max_points)
        self.register_buffer("_gram", torch.zeros(16, 16, dtype=dtype, device=device))
        self._factor_cache: tuple[int, Tensor, Tensor] | None = None

    def get_extra_state(self) -> dict:
        return {"n": self._n, "seen": self._seen}

    def set_extra_state(self, state: dict) -> None:
        self._n, self._seen = int(state["n"]), int(state["seen"])
        self._version += 1

    @property
    def capacity(self) -> int:
        """Largest number of points kept (from ``weight_floor`` and ``max_points``)."""
        cap = math.inf
        if self.weight_floor > 0 and self.discount < 1:
            cap = math.floor(math.log(self.weight_floor) / math.log(self.discount)) + 1
        if self.max_points is not None:
            cap = min(cap, self.max_points)
        return int(cap) if math.isfinite(cap) else -1

    def reset(self) -> None:
        """Forget all observations (the posterior returns to the prior)."""
        self._n = 0
        self._seen = 0
        self._version += 1
        self._factor_cache = None

    def weights(self) -> Tensor:
        """Current weights ``γ^{n−1−i}`` of the held points, oldest first ``[n]``."""
        ages = torch.arange(self._n - 1, -1, -1, dtype=self.dtype, device=self.device)
        return self.discount**ages

    def append(self, x: Tensor, y: float | Tensor) -> None:
        """Add one observation (validated first); O(n·d) plus dropping expired points."""
        x, yv = self._check(x, y)
        n = self._n
        k_row = kernel_matrix(self.kernel, self._x[:n], x[None])[:, 0] if n else x.new_zeros(0)
        kxx = kernel_diag(self.kernel, x[None])[0]
        self._store(x, yv)
        self._gram = grow_rows(self._gram, n + 1, dims=(0, 1))
        self._gram[n, :n] = k_row
        self._gram[:n, n] = k_row
        self._gram[n, n] = kxx
        cap = self.capacity
        if cap > 0 and self._n > cap:
            self.remove_oldest(self._n - cap)

    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest observations."""
        if count < 0 or count > self._n:
            raise ValueError(f"count must lie in [0, {self._n}], got {count}")
        n, m = self._n, self._n - count
        self._gram[:m, :m] = self._gram[count:n, count:n].clone()
        self._drop_oldest(count)

    def _factor(self) -> tuple[Tensor, Tensor]:
        """``(L, 1/w)`` with ``L Lᵀ = K + λW⁻¹`` (cached until the data change)."""
        if self._factor_cache is not None and self._factor_cache[0] == self._version:
            return self._factor_cache[1], self._factor_cache[2]
        n = self._n
        inv_w = 1.0 / self.weights()
        a = self._gram[:n, :n].clone()
        a.diagonal().add_(self._lam * inv_w)
        chol = torch.linalg.cholesky(a)
        self._factor_cache = (self._version, chol, inv_w)
        return chol, inv_w

    @torch.no_grad()
    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Weighted mean and the chosen width² (GP scale, clamped at 0) at ``candidates``."""
        cand = self._check_candidates(candidates, reg)
        kdiag = kernel_diag(self.kernel, cand)
        if self._n == 0:
            return cand.new_zeros(cand.shape[0]), kdiag
        chol, inv_w = self._factor()
        mean, var, v = gp_scores(chol, kernel_matrix(self.kernel, self.x, cand), self.y, kdiag)
        if self.width == "sandwich":
            a = torch.linalg.solve_triangular(chol.mT, v, upper=True)
            var = var - self._lam * ((inv_w - 1.0)[:, None] * a * a).sum(0)
        return mean, var.clamp_min(0.0)

    @torch.no_grad()
    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + W^{1/2} K W^{1/2}/λ)`` of the held data (0 when empty)."""
        if reg is not None and float(reg) != self._lam:
            raise ValueError(f"reg must be None or the model's λ={self._lam}, got {reg!r}")
        if self._n == 0:
            return self._y.new_zeros(())
        chol, inv_w = self._factor()
        return logdet_from_cholesky(chol) - torch.log(self._lam * inv_w).sum()


class TimeDecayKernelRidge(_HistoryModule):
    """Posterior of TV-GP-UCB's time-decay model (see module docstring).

    Args:
        kernel: spatial GPyTorch kernel; lam: noise variance λ > 0;
        epsilon: forgetting rate ε ∈ [0, 1) (ε = 0: the static GP posterior);
        weight_floor: when the scaling base is moved, drop points with ``ρ^{τ−τ_i}`` below this.
    """

    _MAX_LOG_SCALE = 150.0  # rebase when ρ^{b−τ} would exceed e^150 (its square enters colsum U²)

    def __init__(self, kernel: Kernel, lam: float = 1.0, epsilon: float = 0.01, *,
                 weight_floor: float = 1e-12, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__(kernel, lam, dtype, device)
        self.epsilon = float(epsilon)
        if not (0.0 <= self.epsilon < 1.0):
            raise ValueError(f"epsilon must lie in [0, 1), got {epsilon!r}")
        self.log_rho = 0.5 * math.log1p(-self.epsilon)  # ln ρ ≤ 0
        self.weight_floor = float(weight_floor)
        if not (0.0 <= self.weight_floor < 1.0):
            raise ValueError(f"weight_floor must lie in [0, 1), got {weight_floor!r}")
        self.factor = GrowingCholesky(dtype=dtype).to(device=device)
        self.register_buffer("_tau", torch.zeros(16, dtype=dtype, device=device))
        self.register_buffer("_z", torch.zeros(16, dtype=dtype, device=device))
        self._base = 1  # b: time index the scaled query vectors are referred to
        self._cache: CandidateCache | None = None

    def get_extra_state(self) -> dict:
        return {"n": self._n, "seen": self._seen, "base": self._base}

    def set_extra_state(self, state: dict) -> None:
        self._n, self._seen, self._base = int(state["n"]), int(state["seen"]), int(state["base"])
        self._version += 1
        self._cache = None

    def reset(self) -> None:
        """Forget all observations (the posterior returns to the prior)."""
        self.factor.reset()
        self._n = 0
        self._seen = 0
        self._base = 1
        self._version += 1
        self._cache = None

    @property
    def tau(self) -> Tensor:
        """Time indices (1-based round of each held observation) ``[n]``."""
        return self._tau[: self._n]

    def _decay(self, lag: Tensor) -> Tensor:
        return torch.exp(lag * self.log_rho)

    def append(self, x: Tensor, y: float | Tensor) -> None:
        """Add the observation of round ``seen + 1``: one triangular solve, O(n²)."""
        x, yv = self._check(x, y)
        n, tau_new = self._n, float(self._seen + 1)
        kxx = kernel_diag(self.kernel, x[None])[0]
        if n:
            col = kernel_matrix(self.kernel, self.x, x[None])[:, 0] * self._decay(tau_new - self.tau)
            row = self.factor.solve(col)
        else:
            row = x.new_zeros(0)
        d2 = kxx + self._lam - row @ row
        if not bool(d2 > 0):
            raise ValueError(f"append: pivot {float(d2):.3e} not positive")
        d = torch.sqrt(d2)
        self._tau = grow_rows(self._tau, n + 1)
        self._z = grow_rows(self._z, n + 1)
        self._store(x, yv)
        self._tau[n] = tau_new
        self.factor.append(row, d)
        self._z[n] = (yv - row @ self._z[:n]) / d
        if self._cache is not None:  # keep the candidate cache in step (same data, one more row)
            self._cache.version = self._version
        if (self._seen + 1 - self._base) * (-self.log_rho) > self._MAX_LOG_SCALE:
            self._rebase()

    def _rebase(self) -> None:
        """Move the scaling base to the next round and drop negligible points (O(n³), rare)."""
        tau_q = float(self._seen + 1)
        keep = self._decay(tau_q - self.tau) >= self.weight_floor
        drop = int((~keep).sum())
        if drop:
            self._tau[: self._n - drop] = self._tau[drop : self._n].clone()
            self._drop_oldest(drop)
        self._base = self._seen + 1
        self.refresh()

    def refresh(self) -> None:
        """Refactorise ``K̃ + λI`` from scratch (O(n³)) and drop the candidate cache."""
        n = self._n
        self._cache = None
        self._version += 1
        if n == 0:
            self.factor.reset()
            return
        lag = (self.tau[:, None] - self.tau[None, :]).abs()
        gram = kernel_matrix(self.kernel, self.x, self.x) * self._decay(lag)
        gram.diagonal().add_(self._lam)
        chol = torch.linalg.cholesky(gram)
        self.factor.set_dense(chol)
        self._z[:n] = whitened_solve(chol, self.y)

    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest observations (refactorises)."""
        if count < 0 or count > self._n:
            raise ValueError(f"count must lie in [0, {self._n}], got {count}")
        if count:
            self._tau[: self._n - count] = self._tau[count : self._n].clone()
            self._drop_oldest(count)
            self.refresh()

    def _scaled(self, cand: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(U, kdiag, colsum U²)`` with ``U = L⁻¹[K_SC ∘ ρ^{b−τ}]``, cached for a fixed set."""
        n = self._n
        c = self._cache
        if c is not None and c.serves(cand, n, self._version):
            if c.n_at < n:
                a = c.n_at
                kq = kernel_matrix(self.kernel, self._x[a:n], cand)
                c.extend(self.factor, kq * self._decay(self._base - self._tau[a:n])[:, None])
            return c.v[:n], c.kdiag, c.sumsq
        kq = kernel_matrix(self.kernel, self.x, cand) * self._decay(self._base - self.tau)[:, None]
        u = self.factor.solve(kq)
        kdiag = kernel_diag(self.kernel, cand)
        sumsq = colsum_sq(u)
        self._cache = CandidateCache.build(cand, kdiag, u, sumsq, self._version)
        return u, kdiag, sumsq

    @torch.no_grad()
    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Mean and GP variance of ``f_{seen+1}`` at ``candidates`` (variance clamped at 0)."""
        cand = self._check_candidates(candidates, reg)
        if self._n == 0:
            return cand.new_zeros(cand.shape[0]), kernel_diag(self.kernel, cand)
        u, kdiag, sumsq = self._scaled(cand)
        scale = math.exp((self._seen + 1 - self._base) * self.log_rho)
        return score_whitened(self._z[: self._n], u, kdiag, sumsq, scale)

    @torch.no_grad()
    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + K̃/λ)`` of the held data (0 when empty)."""
        if reg is not None and float(reg) != self._lam:
            raise ValueError(f"reg must be None or the model's λ={self._lam}, got {reg!r}")
        if self._n == 0:
            return self._y.new_zeros(())
        return self.factor.logdet() - self._n * math.log(self._lam)

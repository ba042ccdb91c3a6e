"""Primal (feature-form) ridge posterior on a fixed finite arm set — the form of the GP baselines
of Hong, Li & Tewari (AISTATS 2023, Section 6 and Appendix E: every GP baseline uses the
feature map of the finite arm set).

With ``Φ`` the Cholesky factor of the arms' kernel matrix (``ΦΦᵀ = K``), observation weights
``w_s`` and ``λ > 0``:

* ``V = Σ_s w_s φ(x_s)φ(x_s)ᵀ + λI``, ``b = Σ_s w_s φ(x_s) y_s``;
* mean ``μ(x) = φ(x)ᵀV⁻¹b`` (= ``k_Sᵀ(K_S + λW⁻¹)⁻¹Y``);
* variance on the **GP** scale ``σ²(x) = λ‖φ(x)‖²_{V⁻¹}`` (= ``k(x,x) − k_Sᵀ(K_S + λW⁻¹)⁻¹k_S``), or the
  D-LinUCB sandwich ``λ φᵀV⁻¹ṼV⁻¹φ`` with ``Ṽ = Σ w_s² φφᵀ + λI`` (``width="sandwich"``);
* ``log_det() = log det(V/λ)``.

Three ways to weight: all data (``w = 1``, GP-UCB), a sliding window (``remove_oldest`` downdates
``V −= φφᵀ``, i.e. the Sherman–Morrison removal divides by ``1 − φᵀV⁻¹φ``; the released
code of Hong, Li & Tewari has the wrong sign) and discounting with the stable recursion
``V_t = η(V_{t−1} − λI) + φφᵀ + λI``, ``b_t = ηb_{t−1} + φy`` (no ``η^{−t}`` overflow).
Updates are O(N²); a scoring round factorises ``V`` once (O(N³), N = number of arms), however long
the history. This is the finite-arm counterpart of :class:`~torchbandits.models.ExactKernelRidge`
(kernel form, any candidates) and of the weighted / window models of
:mod:`torchbandits.models.weighted`, with the same ``mean_var``/``log_det``/``append``/
``remove_oldest``/``reset`` interface, so the policies and confidence rules of
:mod:`torchbandits.policies.time_varying` run on it unchanged (hand it in with ``model=``).
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import ResizableModule, grow_rows
from ..linalg import logdet_from_cholesky
from ..validation import as_matrix, as_point, as_scalar_reward, check_positive, match_rows, same_rows
from .features import kernel_features
from .posterior import colsum_sq, whitened_solve

__all__ = ["FiniteArmRidge"]


class FiniteArmRidge(ResizableModule):
    """Weighted ridge posterior in the primal of the arms' Cholesky features (module docstring).

    Args:
        kernel: GPyTorch kernel; lam: λ > 0 (GP noise variance / ridge).
        discount: ``η ∈ (0, 1]`` (1: no discounting).
        width: ``"gp"`` (``λ‖φ‖²_{V⁻¹}``) or ``"sandwich"`` (``λφᵀV⁻¹ṼV⁻¹φ``).
        arms: the fixed arm set ``[N, d]`` (default: the first candidates scored or appended).
        features: a precomputed factor ``Φ`` of the arms' kernel matrix (with ``arms``).
        jitter: added to ``K`` before its Cholesky factorisation.
    """

    regularisers: tuple[float, ...] = ()

    def __init__(self, kernel: Kernel, lam: float = 1.0, *, discount: float = 1.0,
                 width: str = "gp", arms: Tensor | None = None, features: Tensor | None = None,
                 jitter: float = 1e-10, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.kernel = kernel.to(dtype=dtype, device=device)
        self._lam = check_positive("lam", lam)
        self.discount = float(discount)
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount must lie in (0, 1], got {discount!r}")
        if width not in ("gp", "sandwich"):
            raise ValueError(f"width must be 'gp' or 'sandwich', got {width!r}")
        self.width = width
        self.jitter = float(jitter)
        f = {"dtype": dtype, "device": device}
        for name in ("arms", "phi", "v", "v2", "b"):
            self.register_buffer(name, torch.zeros(0, **f))
        self.register_buffer("h_arm", torch.zeros(0, dtype=torch.long, device=device))
        self.register_buffer("h_y", torch.zeros(0, **f))
        self._n = 0          # points held (window)
        self._first = 0      # index of the oldest held point in the history buffers
        self._version = 0
        self._cache: tuple[int, Tensor, Tensor] | None = None
        if arms is not None:
            self._set_arms(as_matrix("arms", arms, dtype=dtype, device=self.v.device), features)

    # ------------------------------------------------------------------ properties
    @property
    def n(self) -> int:
        """Number of observations held (a sliding window's removals leave it)."""
        return self._n

    @property
    def lam(self) -> float:
        """The regulariser λ."""
        return self._lam

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the state (that of the design matrix ``V``)."""
        return self.v.dtype

    @property
    def device(self) -> torch.device:
        """Device of the state (that of the design matrix ``V``)."""
        return self.v.device

    def get_extra_state(self) -> dict:
        return {"n": self._n, "first": self._first}

    def set_extra_state(self, state: dict) -> None:
        self._n, self._first = int(state["n"]), int(state["first"])
        self._version += 1
        self._cache = None

    # ------------------------------------------------------------------ data
    def _set_arms(self, arms: Tensor, features: Tensor | None = None) -> None:
        self.arms = arms.clone()
        self.phi = (kernel_features(self.kernel, self.arms, self.jitter) if features is None
                    else features.to(dtype=self.dtype, device=self.device))
        r = self.phi.shape[1]
        eye = torch.eye(r, dtype=self.dtype, device=self.device)
        self.v = self._lam * eye
        self.v2 = self._lam * eye.clone()
        self.b = torch.zeros(r, dtype=self.dtype, device=self.device)
        self._version += 1
        self._cache = None

    def _arm_index(self, x: Tensor) -> int:
        return int(match_rows("x", self.arms, x)[0])

    def reset(self) -> None:
        """Forget all observations; the arm set and its features are kept."""
        if self.arms.numel():
            self._set_arms(self.arms, self.phi)
        self._n = 0
        self._first = 0
        self._version += 1
        self._cache = None

    def append(self, x: Tensor, y: float | Tensor) -> None:
        """Add ``(x, y)`` (validated first; ``x`` must be an arm). With discounting, the old data
        are multiplied by ``η`` first."""
        xv = as_point("x", x, dtype=self.dtype, device=self.device)
        yv = as_scalar_reward("y", y)
        if not self.arms.numel():
            raise ValueError("the arm set is unknown: pass arms= or score the candidates first")
        arm = self._arm_index(xv)
        eta = self.discount
        phi = self.phi[arm]
        if eta < 1.0:
            lam_eye = torch.eye(self.phi.shape[1], dtype=self.dtype, device=self.device) * self._lam
            self.v = eta * (self.v - lam_eye) + lam_eye
            self.v2 = (eta * eta) * (self.v2 - lam_eye) + lam_eye
            self.b = eta * self.b
        outer = torch.outer(phi, phi)
        self.v = self.v + outer
        self.v2 = self.v2 + outer
        self.b = self.b + phi * yv
        end = self._first + self._n
        self.h_arm = grow_rows(self.h_arm, end + 1)
        self.h_y = grow_rows(self.h_y, end + 1)
        self.h_arm[end] = arm
        self.h_y[end] = yv
        self._n += 1
        self._version += 1

    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest points (``V −= w φφᵀ`` with their current weights)."""
        if count < 0 or count > self._n:
            raise ValueError(f"count must lie in [0, {self._n}], got {count}")
        for _ in range(count):
            age = self._n - 1
            w = self.discount**age
            arm = int(self.h_arm[self._first])
            phi = self.phi[arm]
            outer = torch.outer(phi, phi)
            self.v = self.v - w * outer
            self.v2 = self.v2 - (w * w) * outer
            self.b = self.b - w * phi * self.h_y[self._first]
            self._first += 1
            self._n -= 1
        if self._n == 0:
            self.reset()
        self._version += 1

    # ------------------------------------------------------------------ posterior
    def _factor(self) -> tuple[Tensor, Tensor]:
        if self._cache is not None and self._cache[0] == self._version:
            return self._cache[1], self._cache[2]
        chol = torch.linalg.cholesky(0.5 * (self.v + self.v.T))
        z = whitened_solve(chol, self.phi.T)                                 # L⁻¹Φᵀ
        self._cache = (self._version, chol, z)
        return chol, z

    @torch.no_grad()
    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Mean and GP-scale variance (or sandwich width²) of the candidates (rows of the arms)."""
        if reg is not None and float(reg) != self._lam:
            raise ValueError(f"reg must be None or the model's λ={self._lam}, got {reg!r}")
        cand = as_matrix("candidates", candidates, dtype=self.dtype, device=self.device)
        if not self.arms.numel():
            self._set_arms(cand)
        idx = None if same_rows(self.arms, cand) else match_rows("candidates", self.arms, cand)
        chol, z = self._factor()
        w = whitened_solve(chol, self.b)                                      # L⁻¹b
        mean = z.T @ w
        if self.width == "gp":
            var = self._lam * colsum_sq(z)
        else:
            a = torch.linalg.solve_triangular(chol.T, z, upper=True)           # V⁻¹Φᵀ
            var = self._lam * (a * (self.v2 @ a)).sum(0)
        var = var.clamp_min(0.0)
        if idx is not None:
            mean, var = mean[idx], var[idx]
        return mean, var

    @torch.no_grad()
    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(V/λ) = log det(I + W^{1/2}K_SW^{1/2}/λ)``."""
        if reg is not None and float(reg) != self._lam:
            raise ValueError(f"reg must be None or the model's λ={self._lam}, got {reg!r}")
        if not self.arms.numel():
            return torch.zeros((), dtype=self.dtype, device=self.device)
        chol, _ = self._factor()
        return logdet_from_cholesky(chol) - chol.shape[0] * math.log(self._lam)

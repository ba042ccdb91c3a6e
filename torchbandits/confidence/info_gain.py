"""Information-gain providers ``γ(t)`` for the widths of Zhou & Shroff (time-varying Bayesian
optimisation: R-GP-UCB and SW-GP-UCB; their Lemmas 1–2 and Theorems 1–2 are stated with the maximum
information gain ``γ_t = max_{|A|=t} ½ ln det(I + λ⁻¹ K_A)`` as given).

The paper treats γ as known; it cannot be computed exactly, so these providers are ours:
:class:`AnalyticGamma` (the rates of Srinivas et al. 2010 times a constant), :class:`GreedyGamma`
(greedy max-variance selection on a finite candidate set, a (1 − 1/e) certificate of the maximum
information gain there) and :class:`ConstantGamma`. The widths of :mod:`.time_varying` also take
``"realised"`` — the information gain of the data actually held, ``½ log det(I + K_S/λ)``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_diag, kernel_matrix
from ..validation import as_matrix, check_positive

__all__ = ["AnalyticGamma", "ConstantGamma", "GammaProvider", "GreedyGamma", "as_provider"]


class GammaProvider:
    """``γ(t)``: an upper bound (or proxy) of the maximum information gain after ``t`` points,
    ``γ_t = max_{|A|=t} ½ ln det(I + λ⁻¹ K_A)`` (Srinivas et al. 2010, as quoted by Zhou & Shroff),
    with ``γ(0) = 0``.

    ``lam`` is the λ the value was computed for (``None``: λ-free proxy); the β of Zhou & Shroff's
    Lemmas 1–2 is valid only when the same λ serves the posterior and γ.
    """

    lam: float | None = None

    def __call__(self, t: int) -> float:
        raise NotImplementedError

    def values(self, horizon: int) -> Tensor:
        """``[γ(0), …, γ(horizon)]`` as a float64 tensor."""
        return torch.tensor([self(t) for t in range(int(horizon) + 1)], dtype=torch.float64)


class ConstantGamma(GammaProvider):
    """``γ(t) = value`` for ``t ≥ 1`` (and 0 at ``t = 0``), for experiments."""

    def __init__(self, value: float) -> None:
        self.value = float(value)
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"value must be a finite number >= 0, got {value!r}")

    def __call__(self, t: int) -> float:
        return 0.0 if t <= 0 else self.value


class AnalyticGamma(GammaProvider):
    """Rates of Srinivas et al. (2010) quoted by Zhou & Shroff, times a user constant ``C``:

    * ``"linear"``: ``C·d·ln(1+t)``, or with ``exact=True`` the bound ``(d/2)·ln(1 + t/(dλ))``
      (valid when ``‖x‖ ≤ 1``; needs ``lam``);
    * ``"rbf"`` (SE): ``C·(ln(1+t))^{d+1}``;
    * ``"matern"``: ``C·t^{d(d+1)/(2ν+d(d+1))}·ln(1+t)``.
    """

    def __init__(self, kind: str, dim: int, *, nu: float = 2.5, scale: float = 1.0,
                 lam: float | None = None, exact: bool = False) -> None:
        kind = kind.lower()
        if kind in ("se", "gaussian"):
            kind = "rbf"
        if kind.startswith("matern"):
            kind = "matern"
        if kind not in ("linear", "rbf", "matern"):
            raise ValueError(f"kind must be 'linear', 'rbf' or 'matern', got {kind!r}")
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.kind, self.dim = kind, int(dim)
        self.nu = check_positive("nu", nu)
        self.scale = check_positive("scale", scale)
        self.exact = bool(exact)
        if self.exact and kind != "linear":
            raise ValueError("exact=True is only available for kind='linear'")
        self.lam = None if lam is None else check_positive("lam", lam)
        if self.exact and self.lam is None:
            raise ValueError("exact=True needs lam (the bound (d/2)·ln(1 + t/(dλ)) depends on λ)")

    def __call__(self, t: int) -> float:
        if t <= 0:
            return 0.0
        d = self.dim
        if self.kind == "linear":
            if self.exact:
                return 0.5 * d * math.log1p(t / (d * self.lam))  # type: ignore[operator]
            return self.scale * d * math.log1p(t)
        if self.kind == "rbf":
            return self.scale * math.log1p(t) ** (d + 1)
        c = d * (d + 1) / (2.0 * self.nu + d * (d + 1))
        return self.scale * t**c * math.log1p(t)


class GreedyGamma(GammaProvider):
    """Greedy max-variance information gain on a finite candidate set (ours; the paper takes γ_t as
    given).

    Picks, ``T`` times and with repeats allowed, the candidate of largest GP posterior variance
    (noise ``λ``) and accumulates ``g_t = Σ_{s≤t} ½ ln(1 + σ²_{s−1}(x_s)/λ)``. The set function
    ``½ ln det(I + λ⁻¹K_A)`` is monotone submodular, so ``γ_t(candidates) ≤ g_t/(1 − 1/e)``:
    that certified bound is returned by default (``tight=False``); ``tight=True`` returns ``g_t``.
    Values are computed on demand and cached (O(t·A) per new ``t``, a one-off cost).
    """

    def __init__(self, candidates: Tensor, kernel: Kernel, lam: float, *, tight: bool = False,
                 horizon: int = 0) -> None:
        self.lam = check_positive("lam", lam)
        # computed on the host (a one-off table): a CPU float64 copy of a kernel on any device
        self.kernel = copy.deepcopy(kernel).to(dtype=torch.float64, device="cpu")
        self.candidates = as_matrix("candidates", candidates, dtype=torch.float64,
                                    device=torch.device("cpu"))
        self.tight = bool(tight)
        self._var = kernel_diag(kernel, self.candidates).clone()
        self._rows = self.candidates.new_zeros(16, self.candidates.shape[0])
        self._g = [0.0]
        self.picks: list[int] = []
        if horizon:
            self._extend(int(horizon))

    @torch.no_grad()
    def _extend(self, t: int) -> None:
        from ..buffers import grow_rows

        while len(self._g) <= t:
            n = len(self.picks)
            i = int(torch.argmax(self._var))
            var_i = float(self._var[i].clamp_min(0.0))
            k_col = kernel_matrix(self.kernel, self.candidates, self.candidates[i : i + 1])[:, 0]
            v = (k_col - self._rows[:n].mT @ self._rows[:n, i]) / math.sqrt(var_i + self.lam)
            self._rows = grow_rows(self._rows, n + 1)
            self._rows[n] = v
            self._var = (self._var - v * v).clamp_min(0.0)
            self.picks.append(i)
            self._g.append(self._g[-1] + 0.5 * math.log1p(var_i / self.lam))

    def greedy_value(self, t: int) -> float:
        """``g_t`` (the information gain of the greedy set itself, a lower bound of ``γ_t``)."""
        if t <= 0:
            return 0.0
        self._extend(int(t))
        return self._g[int(t)]

    def __call__(self, t: int) -> float:
        g = self.greedy_value(t)
        return g if self.tight else g / (1.0 - math.exp(-1.0))


def as_provider(gamma: GammaProvider | float | str | Callable[[int], float]) -> GammaProvider | str:
    """A :class:`GammaProvider` from a provider, a number (constant γ), a callable ``t ↦ γ(t)``,
    or the string ``"realised"`` (returned as is)."""
    if isinstance(gamma, str):
        if gamma != "realised":
            raise ValueError(f"gamma must be a GammaProvider, a number, a callable or 'realised', "
                             f"got {gamma!r}")
        return gamma
    if isinstance(gamma, GammaProvider):
        return gamma
    if callable(gamma):
        return _CallableGamma(gamma)
    return ConstantGamma(float(gamma))


class _CallableGamma(GammaProvider):
    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn

    def __call__(self, t: int) -> float:
        return 0.0 if t <= 0 else float(self.fn(t))

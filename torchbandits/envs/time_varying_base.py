"""The base of the time-varying RKHS environments: a function per round as a kernel expansion.

Every round ``t = 1, 2, …`` has a reward function ``f_t ∈ H_k`` given as a finite kernel
expansion ``f_t = Σ_j α_{t,j} k(·, z_{t,j})``, so ``‖f_t‖_H`` and ``‖f_{t+1} − f_t‖_H`` are exact
and so is the variation budget ``P_T = Σ_{t=1}^{T−1} ‖f_{t+1} − f_t‖_H`` of Zhou & Shroff (2021,
§II), which the environment declares (``budget``); its realised value is recomputed from the
expansions by :meth:`TimeVaryingRKHSEnv.realised_budget` (joint Gram matrices, no closed form).
Arms are a fixed finite set (a regular grid for ``d = 1``, scrambled Sobol points otherwise);
``mean_rewards`` is ``f_t`` on the arms of the *current* round, so the runner's regret is the
dynamic pseudo-regret ``max_x f_t(x) − f_t(x_t)`` (Zhou & Shroff 2021, §II). Rewards are
``f_t(x) + N(0, R²)``. The generators are in :mod:`torchbandits.envs.time_varying`.

Separate generators for the function, the arm set and the noise, all from the ``reset`` seed.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_bound, kernel_matrix, make_kernel
from ..validation import check_positive
from .base import gaussian_reward
from .batched import BatchedEnv, gaussian_noise

__all__ = ["TimeVaryingRKHSEnv", "rkhs_distance"]


def rkhs_distance(kernel: Kernel, z1: Tensor, a1: Tensor, z2: Tensor, a2: Tensor) -> float:
    """``‖Σ a1_j k(·, z1_j) − Σ a2_j k(·, z2_j)‖_H`` from the joint Gram matrix.

    Shared anchors are merged (``a1 − a2`` on ``z1``) and, for stationary kernels, the anchors are
    centred first: both are exact identities that avoid cancellation when the two functions are
    close (per-round changes of order 1e-3).
    """
    if z1.shape == z2.shape and torch.equal(z1, z2):
        z, c = z1, a1 - a2
    else:
        z, c = torch.cat([z1, z2]), torch.cat([a1, -a2])
    if kernel_bound(kernel) is not None:  # translation invariant: centre the anchors
        z = z - z.mean(0, keepdim=True)
    q = c @ kernel_matrix(kernel, z, z) @ c
    return math.sqrt(max(float(q), 0.0))


class TimeVaryingRKHSEnv:
    """Base class: fixed arms, a function per round as a kernel expansion, Gaussian noise.

    Subclasses implement :meth:`expansion` (anchors and coefficients of ``f_t``),
    :meth:`step_variation` (closed form of ``‖f_{t+1} − f_t‖_H``) and may override
    :meth:`_means_at` for speed.

    Args:
        kernel: kernel name or GPyTorch kernel (unit variance: ``k(x, x) ≤ 1``).
        dim, lengthscale: input dimension (domain ``[0,1]^d``) and lengthscale for a named kernel.
        horizon: T, the number of rounds the budget refers to.
        budget: the declared ``P_T`` (see each subclass).
        norm: B, the RKHS norm bound of every ``f_t``. noise_std: R.
        n_arms: arms (200-point grid for d = 1, 1,024 Sobol points otherwise).
    """

    name = "time-varying"

    def __init__(self, kernel: str | Kernel = "rbf", dim: int = 1, lengthscale: float = 0.1, *,
                 horizon: int = 1000, budget: float | None = 5.0, norm: float = 1.0,
                 noise_std: float = 0.1, n_arms: int | None = None,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> None:
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if int(horizon) < 2:
            raise ValueError(f"horizon must be >= 2, got {horizon}")
        self.kernel = (make_kernel(kernel, lengthscale, dtype=dtype) if isinstance(kernel, str)
                       else kernel).to(dtype=dtype, device=device)
        self.kernel_name = kernel if isinstance(kernel, str) else type(kernel).__name__
        self.dim = int(dim)
        self.horizon = int(horizon)
        if budget is not None and (not math.isfinite(float(budget)) or float(budget) < 0):
            raise ValueError(f"budget must be a finite number >= 0 (or None where allowed), got {budget!r}")
        self._budget_arg = None if budget is None else float(budget)
        self.norm = check_positive("norm", norm)
        self.noise_std = float(noise_std)
        if not math.isfinite(self.noise_std) or self.noise_std < 0:
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
        default_arms = 200 if self.dim == 1 else 1024
        self.n_arms = int(n_arms) if n_arms is not None else default_arms
        if self.n_arms < 1:
            raise ValueError(f"n_arms must be >= 1, got {n_arms}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.t = 0
        self.reset(0)

    # ------------------------------------------------------------------ construction
    def _make_arms(self, gen: torch.Generator) -> Tensor:
        if self.dim == 1:
            return torch.linspace(0.0, 1.0, self.n_arms, dtype=self.dtype).reshape(-1, 1)
        seed = int(torch.randint(2**31 - 1, (1,), generator=gen))
        sobol = torch.quasirandom.SobolEngine(self.dim, scramble=True, seed=seed)
        return sobol.draw(self.n_arms, dtype=self.dtype)

    def _build(self, gen: torch.Generator) -> None:
        raise NotImplementedError

    @staticmethod
    def _generators(seed: int) -> tuple[torch.Generator, torch.Generator, torch.Generator]:
        """The function, arm-set and noise generators of ``reset(seed)``."""
        return tuple(torch.Generator().manual_seed(int(seed) * 3 + i)  # type: ignore[return-value]
                     for i in range(3))

    def reset(self, seed: int) -> None:
        """Draw the function sequence and the arms from ``seed``; restart at round 1."""
        self.seed = int(seed)
        g_f, g_arms, self._g_noise = self._generators(self.seed)
        self.arms = self._make_arms(g_arms).to(self.device)
        self._build(g_f)
        self.t = 0
        self._means = self._means_at(1)

    # ------------------------------------------------------------------ the function sequence
    @property
    def budget(self) -> float:
        """The declared variation budget ``P_T`` over ``horizon`` rounds."""
        raise NotImplementedError

    @property
    def variation_budget(self) -> float:
        """Alias of :attr:`budget`."""
        return self.budget

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        """Anchors ``[m, d]`` and coefficients ``[m]`` of ``f_t`` (round ``t ≥ 1``)."""
        raise NotImplementedError

    def step_variation(self, t: int) -> float:
        """Closed form of ``‖f_{t+1} − f_t‖_H``."""
        raise NotImplementedError

    def f(self, x: Tensor, t: int | None = None) -> Tensor:
        """``f_t(x)`` for ``x`` of shape ``[n, d]`` (default: the current round)."""
        z, a = self.expansion(self.t + 1 if t is None else int(t))
        return kernel_matrix(self.kernel, x.to(self.dtype), z) @ a

    def _means_at(self, t: int) -> Tensor:
        return self.f(self.arms, t)

    def round_means(self, t: int) -> Tensor:
        """``f_t`` on the arms ``[A]`` at round ``t ≥ 1`` (what :meth:`mean_rewards` returns
        after ``t − 1`` pulls; the values of :meth:`_means_at`, which subclasses override)."""
        return self._means_at(t)

    def rkhs_norm(self, t: int) -> float:
        """``‖f_t‖_H = sqrt(αᵀ K_Z α)``."""
        z, a = self.expansion(t)
        return math.sqrt(max(float(a @ kernel_matrix(self.kernel, z, z) @ a), 0.0))

    def realised_variations(self) -> Tensor:
        """``[‖f_{t+1} − f_t‖_H for t = 1..T−1]`` recomputed from the expansions (joint Gram)."""
        out = []
        prev = self.expansion(1)
        for t in range(1, self.horizon):
            nxt = self.expansion(t + 1)
            out.append(rkhs_distance(self.kernel, prev[0], prev[1], nxt[0], nxt[1]))
            prev = nxt
        return torch.tensor(out, dtype=torch.float64)

    def realised_budget(self) -> float:
        """``Σ_{t<T} ‖f_{t+1} − f_t‖_H`` from the expansions (should equal :attr:`budget`)."""
        return float(self.realised_variations().sum())

    # ------------------------------------------------------------------ bandit contract
    def candidates(self) -> Tensor:
        """The fixed arm set ``[A, d]``."""
        return self.arms

    def mean_rewards(self) -> Tensor:
        """Noiseless means ``f_t(x)`` ``[A]`` of the arms at the current round ``t``."""
        return self._means

    def pull(self, index: int) -> float:
        """Noisy reward ``f_t(x_index) + ε`` of arm ``index``; moves to ``f_{t+1}``."""
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std, self.dtype)
        self.t += 1
        self._means = self._means_at(self.t + 1)
        return reward

    # ------------------------------------------------------------------ batched runs
    batch_fields: tuple[str, ...] = ("arms",)

    def why_not_batched(self) -> str | None:
        """Always ``None``: every configuration runs under
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return None

    def batch_generators(self) -> dict[str, torch.Generator]:
        """The per-round generators after ``reset`` (``noise``), for
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return {"noise": self._g_noise}

    def batch_means(self, b: BatchedEnv, t: int) -> Tensor:
        """``f_t`` of every run on its arms ``[R, A]`` (round ``t ≥ 1``). This default asks each
        run's copy (:meth:`round_means`); subclasses with stacked fields override it."""
        return torch.stack([run.round_means(t) for run in b.copies])

    def batch_round(self, b: BatchedEnv) -> tuple[Tensor, Tensor]:
        """Fixed arms ``[R, A, d]`` and ``f_{t+1}`` on them for ``t = b.t`` rounds played."""
        return b.fields["arms"], self.batch_means(b, b.t + 1)

    def batch_noise(self, b: BatchedEnv, means: Tensor) -> Tensor:
        """Gaussian noise ``[R]`` for the chosen means ``[R]`` of every run, one draw per run."""
        return gaussian_noise(b, self.noise_std, self.dtype)

    def __repr__(self) -> str:
        return self._describe(self.budget)

    def _describe(self, budget: float) -> str:
        """The ``repr`` with ``budget`` in place of :attr:`budget` (a batch's run ``r``)."""
        return (f"{type(self).__name__}(kernel={self.kernel_name!r}, dim={self.dim}, "
                f"horizon={self.horizon}, budget={budget:.4g}, norm={self.norm}, "
                f"noise_std={self.noise_std}, n_arms={self.n_arms})")

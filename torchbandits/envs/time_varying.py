"""Time-varying RKHS bandits with an exactly known variation budget (seed 004 spec §4).

Every round ``t = 1, 2, …`` has a reward function ``f_t ∈ H_k`` given as a finite kernel
expansion ``f_t = Σ_j α_{t,j} k(·, z_{t,j})``, so ``‖f_t‖_H`` and ``‖f_{t+1} − f_t‖_H`` are exact
(spec §4.1). The budget ``P_T = Σ_{t=1}^{T−1} ‖f_{t+1} − f_t‖_H`` is declared by the environment
(``budget``) and its realised value is recomputed from the expansions by
:meth:`TimeVaryingRKHSEnv.realised_budget` (joint Gram matrices, no closed form). Arms are a fixed
finite set (a regular grid for ``d = 1``, scrambled Sobol points otherwise); ``mean_rewards`` is
``f_t`` on the arms of the *current* round, so the runner's regret is the dynamic pseudo-regret
``max_x f_t(x) − f_t(x_t)`` (spec §1.5). Rewards are ``f_t(x) + N(0, R²)``.

Generators (spec §4.2):

* :class:`RotatingRKHSEnv` — ``α_t = B(cos(ωt)a + sin(ωt)b)`` with ``a, b`` orthonormal in the
  ``K_Z`` inner product: ``‖f_t‖ = B``, ``‖f_{t+1} − f_t‖ = 2B sin(ω/2)``,
  ``ω = 2 arcsin(P_T/(2B(T−1)))``; ``budget=0`` is the stationary control; ``kernel="linear"``
  with anchors ``e_1..e_d`` is the linear-kernel instance (``θ_t`` on the sphere of radius B,
  arms in the unit ball; :class:`LinearRotatingEnv`).
* :class:`MovingBumpEnv` — ``f_t = B k(·, c_t)``; ``‖f_{t+1} − f_t‖ = B sqrt(2 − 2k(c_t, c_{t+1}))``;
  the centre moves by a fixed distance per round (a bouncing walk for d = 1, a circle for d ≥ 2)
  chosen so the per-round changes add up to ``P_T``.
* :class:`SwitchingRKHSEnv` — ``S + 1`` segments with equally spaced switches. ``budget=None``:
  independent random expansions of norm B (realised ``P_T ≤ 2BS``); a number: each new segment
  is ``cos φ g_j + sin φ h_j`` with ``h_j ⊥ g_j``, ``‖h_j‖ = B``, so every switch changes the
  function by exactly ``P_T/S`` (``φ = 2 arcsin(P_T/(2BS))``).

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

__all__ = [
    "LinearRotatingEnv",
    "MovingBumpEnv",
    "RotatingRKHSEnv",
    "StationaryRKHSEnv",
    "SwitchingRKHSEnv",
    "TimeVaryingRKHSEnv",
    "rkhs_distance",
]


def rkhs_distance(kernel: Kernel, z1: Tensor, a1: Tensor, z2: Tensor, a2: Tensor) -> float:
    """``‖Σ a1_j k(·, z1_j) − Σ a2_j k(·, z2_j)‖_H`` from the joint Gram matrix (spec §4.1).

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
        n_arms: arms (200-point grid for d = 1, Sobol points otherwise; spec §4.3).
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
                       else kernel).to(dtype=dtype)
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

    def reset(self, seed: int) -> None:
        """Draw the function sequence and the arms from ``seed``; restart at round 1."""
        self.seed = int(seed)
        g_f = torch.Generator().manual_seed(self.seed * 3 + 0)
        g_arms = torch.Generator().manual_seed(self.seed * 3 + 1)
        self._g_noise = torch.Generator().manual_seed(self.seed * 3 + 2)
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
        return self.arms

    def mean_rewards(self) -> Tensor:
        return self._means

    def pull(self, index: int) -> float:
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std, self.dtype)
        self.t += 1
        self._means = self._means_at(self.t + 1)
        return reward

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kernel={self.kernel_name!r}, dim={self.dim}, "
                f"horizon={self.horizon}, budget={self.budget:.4g}, norm={self.norm}, "
                f"noise_std={self.noise_std}, n_arms={self.n_arms})")


def _k_orthonormal(gram: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Gram–Schmidt of two coefficient vectors in the ``⟨u, v⟩ = uᵀ K v`` inner product."""
    a = a / torch.sqrt(a @ gram @ a)
    b = b - (a @ gram @ b) * a
    b = b / torch.sqrt(b @ gram @ b)
    return a, b


class RotatingRKHSEnv(TimeVaryingRKHSEnv):
    """Smooth drift with an exact budget: a rotation in a 2-D subspace of ``H_k`` (spec §4.2.1).

    ``f_t = Σ_j α_{t,j} k(·, z_j)`` with ``α_t = B(cos(ωt)a + sin(ωt)b)``; ``budget`` must satisfy
    ``0 ≤ P_T ≤ 2B(T−1)``. Extra argument ``n_anchors`` (m = 30).
    """

    name = "rotation"

    def __init__(self, kernel: str | Kernel = "rbf", dim: int = 1, lengthscale: float = 0.1, *,
                 n_anchors: int = 30, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if int(n_anchors) < 2:
            raise ValueError(f"n_anchors must be >= 2, got {n_anchors}")
        self.n_anchors = int(n_anchors)
        super().__init__(kernel, dim, lengthscale, **kwargs)

    def _anchors(self, gen: torch.Generator) -> Tensor:
        return torch.rand(self.n_anchors, self.dim, generator=gen, dtype=self.dtype)

    def _build(self, gen: torch.Generator) -> None:
        budget = 0.0 if self._budget_arg is None else self._budget_arg
        if budget > 2 * self.norm * (self.horizon - 1):
            raise ValueError(f"budget must be <= 2B(T-1) = {2 * self.norm * (self.horizon - 1)}, "
                             f"got {budget}")
        self.anchors = self._anchors(gen).to(self.device)
        m = self.anchors.shape[0]
        gram = kernel_matrix(self.kernel, self.anchors, self.anchors)
        a0 = torch.randn(m, generator=gen, dtype=self.dtype).to(self.device)
        b0 = torch.randn(m, generator=gen, dtype=self.dtype).to(self.device)
        self.a, self.b = _k_orthonormal(gram, a0, b0)
        self.omega = 2.0 * math.asin(budget / (2.0 * self.norm * (self.horizon - 1)))
        k_arms = kernel_matrix(self.kernel, self.arms, self.anchors)
        self._fa, self._fb = self.norm * (k_arms @ self.a), self.norm * (k_arms @ self.b)

    @property
    def budget(self) -> float:
        return (self.horizon - 1) * self.step_variation(1)

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        w = self.omega * t
        return self.anchors, self.norm * (math.cos(w) * self.a + math.sin(w) * self.b)

    def step_variation(self, t: int) -> float:
        return 2.0 * self.norm * math.sin(self.omega / 2.0)

    def _means_at(self, t: int) -> Tensor:
        w = self.omega * t
        return math.cos(w) * self._fa + math.sin(w) * self._fb


class StationaryRKHSEnv(RotatingRKHSEnv):
    """Stationary control (``P_T = 0``, spec §4.2.4): the rotation generator at ω = 0."""

    name = "stationary"

    def __init__(self, kernel: str | Kernel = "rbf", dim: int = 1, lengthscale: float = 0.1,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs["budget"] = 0.0
        super().__init__(kernel, dim, lengthscale, **kwargs)


class LinearRotatingEnv(RotatingRKHSEnv):
    """Linear-kernel instance (spec §4.2.5): ``f_t(x) = θ_tᵀx`` with ``θ_t`` rotating on the sphere
    of radius B in ``R^d`` (anchors ``e_1..e_d``, so ``θ_t = α_t``), arms uniform in the unit ball
    (``k(x, x) = ‖x‖² ≤ 1``); ``‖f_{t+1} − f_t‖_H = ‖θ_{t+1} − θ_t‖₂``."""

    name = "linear"

    def __init__(self, dim: int = 5, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs.setdefault("n_arms", 200)
        super().__init__("linear", dim, 1.0, n_anchors=max(int(dim), 2), **kwargs)

    def _anchors(self, gen: torch.Generator) -> Tensor:
        return torch.eye(self.dim, dtype=self.dtype)

    def _make_arms(self, gen: torch.Generator) -> Tensor:
        x = torch.randn(self.n_arms, self.dim, generator=gen, dtype=self.dtype)
        r = torch.rand(self.n_arms, 1, generator=gen, dtype=self.dtype) ** (1.0 / self.dim)
        return x / x.norm(dim=1, keepdim=True) * r

    @property
    def theta(self) -> Tensor:
        """``θ_t`` of the current round."""
        return self.expansion(self.t + 1)[1]


class MovingBumpEnv(TimeVaryingRKHSEnv):
    """A bump ``f_t = B k(·, c_t)`` whose centre moves (spec §4.2.2).

    Every round the centre moves by the distance ``r`` with ``B²(2 − 2k(r)) = (P_T/(T−1))²``
    (found by bisection on the kernel profile, so any isotropic stationary kernel works): for
    d = 1 a walk that reverses direction instead of leaving ``[0, 1]``; for d ≥ 2 a circle of
    radius 0.3 around the centre of the cube in the first two coordinates. Needs ``r ≤ 0.5``
    (d = 1) or ``r ≤ 0.6`` (the circle's diameter).
    """

    name = "bump"

    def _kernel_at(self, r: float) -> float:
        x0 = torch.zeros(1, self.dim, dtype=self.dtype)
        x1 = x0.clone()
        x1[0, 0] = r
        return float(kernel_matrix(self.kernel, x0, x1)[0, 0])

    def _build(self, gen: torch.Generator) -> None:
        budget = 0.0 if self._budget_arg is None else self._budget_arg
        step = budget / (self.horizon - 1)
        target = 1.0 - step * step / (2.0 * self.norm**2)  # required k(c_t, c_{t+1})
        if step > 0 and target <= self._kernel_at(0.5 if self.dim == 1 else 0.6):
            raise ValueError(f"budget {budget} needs per-round moves beyond the domain's reach")
        lo, hi = 0.0, 0.5 if self.dim == 1 else 0.6
        if step > 0:
            for _ in range(200):  # k is decreasing in r: bisection on k(r) = target
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if self._kernel_at(mid) > target else (lo, mid)
        self.radius_step = 0.5 * (lo + hi) if step > 0 else 0.0
        n = self.horizon + 1
        if self.dim == 1:
            start = float(torch.rand((), generator=gen, dtype=self.dtype))
            direction = 1.0 if float(torch.rand((), generator=gen)) < 0.5 else -1.0
            pos = [start]
            for _ in range(n):  # one-off construction of the path
                nxt = pos[-1] + direction * self.radius_step
                if not 0.0 <= nxt <= 1.0:
                    direction = -direction
                    nxt = pos[-1] + direction * self.radius_step
                pos.append(nxt)
            centres = torch.tensor(pos, dtype=self.dtype).reshape(-1, 1)
        else:
            rad = 0.3
            dtheta = 2.0 * math.asin(min(self.radius_step / (2 * rad), 1.0))
            theta0 = 2 * math.pi * float(torch.rand((), generator=gen, dtype=self.dtype))
            theta = theta0 + dtheta * torch.arange(n + 1, dtype=self.dtype)
            centres = torch.full((n + 1, self.dim), 0.5, dtype=self.dtype)
            centres[:, 0] = 0.5 + rad * torch.cos(theta)
            centres[:, 1] = 0.5 + rad * torch.sin(theta)
        self.centres = centres.to(self.device)  # row t−1 is c_t
        diff = self.centres[1:] - self.centres[:-1]  # k(c_t, c_{t+1}) = k(0, c_{t+1} − c_t)
        self._k_cc = kernel_matrix(self.kernel, torch.zeros_like(diff[:1]), diff)[0]

    @property
    def budget(self) -> float:
        return float(sum(self.step_variation(t) for t in range(1, self.horizon)))

    def _centre(self, t: int) -> Tensor:
        return self.centres[min(int(t), self.centres.shape[0]) - 1]

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        return self._centre(t)[None], torch.full((1,), self.norm, dtype=self.dtype,
                                                  device=self.device)

    def step_variation(self, t: int) -> float:
        if t >= self.centres.shape[0]:
            return 0.0
        return self.norm * math.sqrt(max(2.0 - 2.0 * float(self._k_cc[t - 1]), 0.0))


class SwitchingRKHSEnv(TimeVaryingRKHSEnv):
    """Abrupt switches (spec §4.2.3): ``S + 1`` segments of equal length.

    ``budget=None``: independent random expansions (``n_anchors`` anchors each) normalised to
    ``‖g_j‖ = B`` — the realised ``P_T ≤ 2BS`` is computed exactly. ``budget=P`` (``≤ 2BS``):
    ``g_{j+1} = cos φ g_j + sin φ h_j`` with a fresh ``h_j ⊥ g_j`` of norm B, so each switch
    moves the function by exactly ``P/S``.
    """

    name = "switch"

    def __init__(self, kernel: str | Kernel = "rbf", dim: int = 1, lengthscale: float = 0.1, *,
                 n_switches: int = 4, n_anchors: int = 30, budget: float | None = None,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        if int(n_switches) < 0:
            raise ValueError(f"n_switches must be >= 0, got {n_switches}")
        self.n_switches = int(n_switches)
        self.n_anchors = int(n_anchors)
        if self.n_anchors < 1:
            raise ValueError(f"n_anchors must be >= 1, got {n_anchors}")
        super().__init__(kernel, dim, lengthscale, budget=budget, **kwargs)

    def _build(self, gen: torch.Generator) -> None:
        S, m, B = self.n_switches, self.n_anchors, self.norm
        if S >= self.horizon:
            raise ValueError(f"n_switches must be < horizon ({self.horizon}), got {S}")
        if self._budget_arg is not None and S == 0 and self._budget_arg > 0:
            raise ValueError(f"a positive budget needs n_switches >= 1, got budget={self._budget_arg}")
        if self._budget_arg is not None and S and self._budget_arg > 2 * B * S:
            raise ValueError(f"budget must be <= 2BS = {2 * B * S}, got {self._budget_arg}")
        z = torch.rand((S + 1) * m, self.dim, generator=gen, dtype=self.dtype).to(self.device)
        gram = kernel_matrix(self.kernel, z, z)
        coef = torch.zeros(S + 1, (S + 1) * m, dtype=self.dtype, device=self.device)
        for j in range(S + 1):  # one-off construction, S + 1 segments
            h = torch.zeros((S + 1) * m, dtype=self.dtype, device=self.device)
            h[j * m:(j + 1) * m] = torch.randn(m, generator=gen, dtype=self.dtype).to(self.device)
            if j == 0 or self._budget_arg is None:
                coef[j] = B * h / torch.sqrt(h @ gram @ h)
                continue
            prev = coef[j - 1] / B
            h = h - (prev @ gram @ h) * prev
            h = h / torch.sqrt(h @ gram @ h)
            phi = 2.0 * math.asin(self._budget_arg / (2.0 * B * S)) if S else 0.0
            coef[j] = B * (math.cos(phi) * prev + math.sin(phi) * h)
        self.anchors, self.coefficients, self._gram = z, coef, gram
        # switch after rounds s_j = round(j T/(S+1)): segment j holds rounds s_j+1 .. s_{j+1}
        self.switch_times = [round(j * self.horizon / (S + 1)) for j in range(1, S + 1)]
        self._segment_means = kernel_matrix(self.kernel, self.arms, z) @ coef.T  # [A, S+1]

    def segment(self, t: int) -> int:
        """Index of the segment that round ``t`` belongs to."""
        return sum(1 for s in self.switch_times if t > s)

    @property
    def budget(self) -> float:
        if self._budget_arg is not None:
            return self._budget_arg  # exact by construction: S switches of P/S each
        return float(sum(self.step_variation(s) for s in self.switch_times))

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        return self.anchors, self.coefficients[self.segment(t)]

    def step_variation(self, t: int) -> float:
        j, k = self.segment(t), self.segment(t + 1)
        if j == k:
            return 0.0
        d = self.coefficients[k] - self.coefficients[j]
        return math.sqrt(max(float(d @ self._gram @ d), 0.0))

    def _means_at(self, t: int) -> Tensor:
        return self._segment_means[:, self.segment(t)]

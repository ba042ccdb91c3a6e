"""Time-varying RKHS bandits with an exactly known variation budget ``P_T``.

Zhou & Shroff (2021) define the budget ``P_T = Σ_{t=1}^{T−1} ‖f_{t+1} − f_t‖_H`` and the dynamic
regret (§II) but report no experiment; these generators are this library's benchmark for their
R-GP-UCB and SW-GP-UCB. Each is a :class:`~torchbandits.envs.time_varying_base.TimeVaryingRKHSEnv`
(``f_t`` a finite kernel expansion, so ``‖f_{t+1} − f_t‖_H`` and ``P_T`` are exact):

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_matrix
from .batched import BatchedEnv, stack_to
from .switching_batch import SwitchingBatch
from .time_varying_base import TimeVaryingRKHSEnv, rkhs_distance

__all__ = [
    "LinearRotatingEnv",
    "MovingBumpEnv",
    "RotatingRKHSEnv",
    "StationaryRKHSEnv",
    "SwitchingRKHSEnv",
    "TimeVaryingRKHSEnv",
    "rkhs_distance",
]


def _k_orthonormal(gram: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Gram–Schmidt of two coefficient vectors in the ``⟨u, v⟩ = uᵀ K v`` inner product."""
    a = a / torch.sqrt(a @ gram @ a)
    b = b - (a @ gram @ b) * a
    b = b / torch.sqrt(b @ gram @ b)
    return a, b


def _k_orthonormal_batched(gram: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_k_orthonormal` of every run: ``gram`` ``[R, m, m]``, ``a``, ``b`` ``[R, m]``."""
    def inner(u: Tensor, v: Tensor) -> Tensor:   # uᵀ K v per run, [R, 1]
        return torch.matmul(torch.matmul(u[:, None, :], gram), v[:, :, None])[:, :, 0]

    a = a / torch.sqrt(inner(a, a))
    b = b - inner(a, b) * a
    return a, b / torch.sqrt(inner(b, b))


class RotatingRKHSEnv(TimeVaryingRKHSEnv):
    """Smooth drift with an exact budget: a rotation in a 2-D subspace of ``H_k``.

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

    def _omega(self) -> float:
        """The angle per round ``ω = 2 arcsin(P_T / (2B(T−1)))`` (checks ``P_T ≤ 2B(T−1)``)."""
        budget = 0.0 if self._budget_arg is None else self._budget_arg
        if budget > 2 * self.norm * (self.horizon - 1):
            raise ValueError(f"budget must be <= 2B(T-1) = {2 * self.norm * (self.horizon - 1)}, "
                             f"got {budget}")
        return 2.0 * math.asin(budget / (2.0 * self.norm * (self.horizon - 1)))

    def _function_draws(self, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """What ``_build`` draws from ``gen``, on the host: anchors ``[m, d]``, ``a₀``, ``b₀``
        ``[m]``."""
        anchors = self._anchors(gen)
        m = anchors.shape[0]
        a0 = torch.randn(m, generator=gen, dtype=self.dtype)
        return anchors, a0, torch.randn(m, generator=gen, dtype=self.dtype)

    def _build(self, gen: torch.Generator) -> None:
        omega = self._omega()
        anchors, a0, b0 = self._function_draws(gen)
        self.anchors = anchors.to(self.device)
        gram = kernel_matrix(self.kernel, self.anchors, self.anchors)
        self.a, self.b = _k_orthonormal(gram, a0.to(self.device), b0.to(self.device))
        self.omega = omega
        k_arms = kernel_matrix(self.kernel, self.arms, self.anchors)
        self._fa, self._fb = self.norm * (k_arms @ self.a), self.norm * (k_arms @ self.b)

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: each run's arms, anchors, ``a₀`` and ``b₀``
        drawn on the host from its own generators in ``reset``'s order, stacked and moved with
        one copy per kind; the ``K_Z``-orthonormalisation and ``F_a = B K_{XZ} a``,
        ``F_b = B K_{XZ} b`` over the batch. Fields ``[R, ...]``, generators per name."""
        self._omega()   # the budget check of reset, before any draw
        arms, anchors, a0, b0, noise = [], [], [], [], []
        for s in seeds:
            g_f, g_arms, g_noise = self._generators(s)
            arms.append(self._make_arms(g_arms))
            for out, t in zip((anchors, a0, b0), self._function_draws(g_f), strict=True):
                out.append(t)
            noise.append(g_noise)
        x, z, a, b = (stack_to(t, self.device) for t in (arms, anchors, a0, b0))
        a, b = _k_orthonormal_batched(kernel_matrix(self.kernel, z, z), a, b)
        k_arms = kernel_matrix(self.kernel, x, z)                             # [R, A, m]
        fa = self.norm * (k_arms @ a[:, :, None])[:, :, 0]
        fb = self.norm * (k_arms @ b[:, :, None])[:, :, 0]
        return {"arms": x, "_fa": fa, "_fb": fb}, {"noise": noise}

    @property
    def budget(self) -> float:
        """The variation budget ``P_T``: ``T − 1`` times the per-round variation ``step_variation(1)``
        (the same every round).
        """
        return (self.horizon - 1) * self.step_variation(1)

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        w = self.omega * t
        return self.anchors, self.norm * (math.cos(w) * self.a + math.sin(w) * self.b)

    def step_variation(self, t: int) -> float:
        return 2.0 * self.norm * math.sin(self.omega / 2.0)

    def _means_at(self, t: int) -> Tensor:
        w = self.omega * t
        return math.cos(w) * self._fa + math.sin(w) * self._fb

    batch_fields = ("arms", "_fa", "_fb")

    def batch_means(self, b: BatchedEnv, t: int) -> Tensor:
        """``cos(ωt) F_a + sin(ωt) F_b`` ``[R, A]`` (ω is the same for every run)."""
        w = self.omega * t
        return math.cos(w) * b.fields["_fa"] + math.sin(w) * b.fields["_fb"]


class StationaryRKHSEnv(RotatingRKHSEnv):
    """Stationary control (``P_T = 0``): the rotation generator at ω = 0."""

    name = "stationary"

    def __init__(self, kernel: str | Kernel = "rbf", dim: int = 1, lengthscale: float = 0.1,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs["budget"] = 0.0
        super().__init__(kernel, dim, lengthscale, **kwargs)


class LinearRotatingEnv(RotatingRKHSEnv):
    """Linear-kernel instance: ``f_t(x) = θ_tᵀx`` with ``θ_t`` rotating on the sphere
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
    """A bump ``f_t = B k(·, c_t)`` whose centre moves.

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

    def _radius_step(self) -> float:
        """The distance ``r`` the centre moves per round: ``B²(2 − 2k(r)) = (P_T/(T−1))²`` by
        bisection on the kernel profile (the same for every seed)."""
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
        return 0.5 * (lo + hi) if step > 0 else 0.0

    def _centres(self, gen: torch.Generator, radius_step: float) -> Tensor:
        """The centres ``[T + 2, d]`` (row ``t − 1`` is ``c_t``) from ``gen``'s draws, on the host."""
        n = self.horizon + 1
        if self.dim == 1:
            start = float(torch.rand((), generator=gen, dtype=self.dtype))
            direction = 1.0 if float(torch.rand((), generator=gen)) < 0.5 else -1.0
            pos = [start]
            for _ in range(n):  # one-off construction of the path
                nxt = pos[-1] + direction * radius_step
                if not 0.0 <= nxt <= 1.0:
                    direction = -direction
                    nxt = pos[-1] + direction * radius_step
                pos.append(nxt)
            return torch.tensor(pos, dtype=self.dtype).reshape(-1, 1)
        rad = 0.3
        dtheta = 2.0 * math.asin(min(radius_step / (2 * rad), 1.0))
        theta0 = 2 * math.pi * float(torch.rand((), generator=gen, dtype=self.dtype))
        theta = theta0 + dtheta * torch.arange(n + 1, dtype=self.dtype)
        centres = torch.full((n + 1, self.dim), 0.5, dtype=self.dtype)
        centres[:, 0] = 0.5 + rad * torch.cos(theta)
        centres[:, 1] = 0.5 + rad * torch.sin(theta)
        return centres

    def _build(self, gen: torch.Generator) -> None:
        self.radius_step = self._radius_step()
        self.centres = self._centres(gen, self.radius_step).to(self.device)  # row t−1 is c_t
        diff = self.centres[1:] - self.centres[:-1]  # k(c_t, c_{t+1}) = k(0, c_{t+1} − c_t)
        self._k_cc = kernel_matrix(self.kernel, torch.zeros_like(diff[:1]), diff)[0]

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: the step found once per batch (it depends on
        neither seed nor draw), each run's arms and centre path made on the host from its own
        generators, stacked and moved with one copy per kind. Fields ``[R, ...]``."""
        radius = self._radius_step()
        arms, centres, noise = [], [], []
        for s in seeds:
            g_f, g_arms, g_noise = self._generators(s)
            arms.append(self._make_arms(g_arms))
            centres.append(self._centres(g_f, radius))
            noise.append(g_noise)
        return ({"arms": stack_to(arms, self.device), "centres": stack_to(centres, self.device)},
                {"noise": noise})

    @property
    def budget(self) -> float:
        """The variation budget ``P_T = Σ_{t<T} step_variation(t)`` of the moving bump."""
        return float(sum(self.step_variation(t) for t in range(1, self.horizon)))

    def _centre(self, t: int) -> Tensor:
        return self.centres[min(int(t), self.centres.shape[0]) - 1]

    batch_fields = ("arms", "centres")

    def batch_means(self, b: BatchedEnv, t: int) -> Tensor:
        """``B k(x, c_{r,t})`` on every run's arms ``[R, A]`` (each run's centre path)."""
        c = b.fields["centres"][:, min(int(t), self.centres.shape[0]) - 1]
        return kernel_matrix(self.kernel, b.fields["arms"], c[:, None, :])[:, :, 0] * self.norm

    def expansion(self, t: int) -> tuple[Tensor, Tensor]:
        return self._centre(t)[None], torch.full((1,), self.norm, dtype=self.dtype,
                                                  device=self.device)

    def step_variation(self, t: int) -> float:
        if t >= self.centres.shape[0]:
            return 0.0
        return self.norm * math.sqrt(max(2.0 - 2.0 * float(self._k_cc[t - 1]), 0.0))


class SwitchingRKHSEnv(SwitchingBatch, TimeVaryingRKHSEnv):
    """Abrupt switches: ``S + 1`` segments of equal length.

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

    def _check_switches(self) -> None:
        """The checks of ``n_switches`` and ``budget`` that ``reset`` makes before any draw."""
        S, B = self.n_switches, self.norm
        if S >= self.horizon:
            raise ValueError(f"n_switches must be < horizon ({self.horizon}), got {S}")
        if self._budget_arg is not None and S == 0 and self._budget_arg > 0:
            raise ValueError(f"a positive budget needs n_switches >= 1, got budget={self._budget_arg}")
        if self._budget_arg is not None and S and self._budget_arg > 2 * B * S:
            raise ValueError(f"budget must be <= 2BS = {2 * B * S}, got {self._budget_arg}")

    def _switch_draws(self, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """What ``_build`` draws from ``gen``, on the host: the anchors ``[(S+1)m, d]``, then one
        ``N(0, I_m)`` block per segment ``[S + 1, m]`` (one call each)."""
        S, m = self.n_switches, self.n_anchors
        z = torch.rand((S + 1) * m, self.dim, generator=gen, dtype=self.dtype)
        return z, torch.stack([torch.randn(m, generator=gen, dtype=self.dtype)
                               for _ in range(S + 1)])

    def _build(self, gen: torch.Generator) -> None:
        S, m, B = self.n_switches, self.n_anchors, self.norm
        self._check_switches()
        z, blocks = self._switch_draws(gen)
        z, blocks = z.to(self.device), blocks.to(self.device)
        gram = kernel_matrix(self.kernel, z, z)
        coef = torch.zeros(S + 1, (S + 1) * m, dtype=self.dtype, device=self.device)
        for j in range(S + 1):  # one-off construction, S + 1 segments
            h = torch.zeros((S + 1) * m, dtype=self.dtype, device=self.device)
            h[j * m:(j + 1) * m] = blocks[j]
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
        """The variation budget ``P_T``: the declared ``budget``, or the sum of the switches' steps."""
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

    batch_fields = ("arms", "_segment_means")

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once (:class:`~torchbandits.envs.switching_batch.
        SwitchingBatch`)."""
        return self._switching_batch_reset(seeds)

    def batch_repr(self, b: BatchedEnv, r: int) -> str:
        """``repr`` of run ``r`` of a batch set up by :meth:`batch_reset` (with ``budget=None``
        the realised budget of that run: one host read of its ``S`` switch steps)."""
        return self._switching_batch_repr(b, r)

    def batch_means(self, b: BatchedEnv, t: int) -> Tensor:
        """Every run's segment ``segment(t)`` means ``[R, A]`` (switch times depend on T only)."""
        return b.fields["_segment_means"][:, :, self.segment(t)]

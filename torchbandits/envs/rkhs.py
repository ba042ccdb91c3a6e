"""RKHS test functions of Flynn & Reeb (2024, §7), with fresh or fixed finite arm sets.

``f*(x) = b Σ_{i=1}^{m} w_i k(x, z_i)`` with ``m`` inducing points ``z_i ~ U[0,1]^d``,
``w ~ N(0, I_m)`` and ``b = B / sqrt(wᵀ K_ZZ w)``, so that ``‖f*‖_H = B`` exactly. Rewards are
``f*(x) + N(0, σ²)``. Each round offers ``n_arms`` points: a fresh i.i.d. ``U[0,1]^d`` draw
(the paper's setting) or, with ``fixed_arms=True``, the same set every round.

Three independent generators, all derived from the ``reset`` seed: one for ``f*``, one for the
arm sets and one for the noise. So two policies run with the same seed face the same function,
the same arm sets and the same noise sequence (common random numbers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import kernel_matrix, make_kernel
from ..validation import check_positive
from .base import gaussian_reward
from .batched import BatchedEnv, gaussian_noise, stack_to

__all__ = ["RKHSFunctionEnv"]

#: kernel entries ``k(x, z)`` per block of rounds when a chunk's fresh means are computed (a
#: block's temporaries hold a few times this many values): cache-sized on the CPU, larger
#: elsewhere, where each block costs the same kernel launches whatever its size
MEANS_BLOCK_CPU = 1 << 17
MEANS_BLOCK_DEVICE = 1 << 23


class RKHSFunctionEnv:
    """Finite-armed bandit on a random RKHS function of known norm (Flynn & Reeb 2024, §7).

    Args:
        kernel: a kernel name (``"rbf"``, ``"matern52"``, …) or a GPyTorch kernel.
        dim: input dimension d (domain ``[0, 1]^d``).
        lengthscale: used when ``kernel`` is a name.
        n_inducing: m, the number of inducing points (20).
        norm: B, the RKHS norm of ``f*`` (10).
        noise_std: σ of the Gaussian noise (0.1).
        n_arms: arms per round (100).
        fixed_arms: one arm set for the whole run instead of a fresh set per round.
    """

    def __init__(
        self,
        kernel: str | Kernel = "rbf",
        dim: int = 3,
        lengthscale: float = 0.5,
        *,
        n_inducing: int = 20,
        norm: float = 10.0,
        noise_std: float = 0.1,
        n_arms: int = 100,
        fixed_arms: bool = False,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if int(n_arms) < 1:
            raise ValueError(f"n_arms must be >= 1, got {n_arms}")
        if int(n_inducing) < 1:
            raise ValueError(f"n_inducing must be >= 1, got {n_inducing}")
        self.kernel = (
            make_kernel(kernel, lengthscale, dtype=dtype) if isinstance(kernel, str) else kernel
        ).to(dtype=dtype, device=device)
        self.dim = int(dim)
        self.n_inducing = int(n_inducing)
        self.norm = check_positive("norm", norm)
        self.noise_std = float(noise_std)
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.n_arms = int(n_arms)
        self.fixed_arms = bool(fixed_arms)
        self.dtype = dtype
        self.device = torch.device(device)
        self.t = 0
        self.reset(0)

    def _rand(self, gen: torch.Generator, *shape: int) -> Tensor:
        return torch.rand(*shape, generator=gen, dtype=self.dtype).to(self.device)

    def _draws(self, seed: int) -> tuple[dict[str, torch.Generator], Tensor, Tensor, Tensor]:
        """What ``reset(seed)`` draws, on the host: the per-round generators (``arms`` and
        ``noise``, after the first arm set), the inducing points ``[m, d]``, the weights ``w``
        ``[m]`` and the first arm set ``[A, d]``."""
        g_f = torch.Generator().manual_seed(int(seed) * 3 + 0)
        gens = {"arms": torch.Generator().manual_seed(int(seed) * 3 + 1),
                "noise": torch.Generator().manual_seed(int(seed) * 3 + 2)}
        z = torch.rand(self.n_inducing, self.dim, generator=g_f, dtype=self.dtype)
        w = torch.randn(self.n_inducing, generator=g_f, dtype=self.dtype)
        arms = torch.rand(self.n_arms, self.dim, generator=gens["arms"], dtype=self.dtype)
        return gens, z, w, arms

    def reset(self, seed: int) -> None:
        """Draw ``f*`` and (for fixed arms) the arm set from ``seed``; restart time."""
        self.seed = int(seed)
        gens, z, w, arms = self._draws(self.seed)
        self._g_arms, self._g_noise = gens["arms"], gens["noise"]
        self.inducing, w = z.to(self.device), w.to(self.device)
        k_zz = kernel_matrix(self.kernel, self.inducing, self.inducing)
        self.coefficients = w * (self.norm / torch.sqrt(w @ k_zz @ w))
        self.t = 0
        self._arms = arms.to(self.device)
        self._means = self.f(self._arms)

    def f(self, x: Tensor) -> Tensor:
        """Noiseless ``f*(x)`` for ``x`` of shape ``[n, d]``."""
        return kernel_matrix(self.kernel, x.to(self.dtype), self.inducing) @ self.coefficients

    def rkhs_norm(self) -> float:
        """``‖f*‖_H = sqrt(cᵀ K_ZZ c)`` (equals ``norm`` by construction)."""
        k_zz = kernel_matrix(self.kernel, self.inducing, self.inducing)
        return float(torch.sqrt(self.coefficients @ k_zz @ self.coefficients))

    def candidates(self) -> Tensor:
        """This round's arm set ``[A, d]`` (fixed, or redrawn every round)."""
        return self._arms

    def mean_rewards(self) -> Tensor:
        """Noiseless means ``f*(x)`` ``[A]`` of this round's arms."""
        return self._means

    def pull(self, index: int) -> float:
        """Noisy reward ``f*(x_index) + ε`` of arm ``index``; time advances (and fresh arms are drawn
        unless ``fixed_arms``).
        """
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std, self.dtype)
        self.t += 1
        if not self.fixed_arms:
            self._arms = self._rand(self._g_arms, self.n_arms, self.dim)
            self._means = self.f(self._arms)
        return reward

    # ------------------------------------------------------------------ batched runs
    batch_fields = ("inducing", "coefficients", "_arms", "_means")
    batch_fresh = True   # stacked fields, or views of stream chunks that nobody writes

    def why_not_batched(self) -> str | None:
        """Always ``None``: every configuration runs under
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return None

    def batch_generators(self) -> dict[str, torch.Generator]:
        """The per-round generators after ``reset`` (``arms`` and ``noise``), for
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return {"arms": self._g_arms, "noise": self._g_noise}

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: the draws per run on the host (its own
        generators, in ``reset``'s order), stacked and moved with one copy per kind, then
        ``b_r = B / sqrt(w_rᵀ K_{Z_r Z_r} w_r)`` and the first means over the batch (one
        batched kernel evaluation each). Fields ``[R, ...]``, generators per name."""
        gens, zs, ws, arms = zip(*(self._draws(s) for s in seeds), strict=True)
        z, w, x = (stack_to(t, self.device) for t in (zs, ws, arms))
        k_zz = kernel_matrix(self.kernel, z, z)                              # [R, m, m]
        quad = torch.matmul(torch.matmul(w[:, None, :], k_zz), w[:, :, None])[:, 0, 0]
        coef = w * (self.norm / torch.sqrt(quad))[:, None]
        fields = {"inducing": z, "coefficients": coef, "_arms": x,
                  "_means": self._batch_means(x, z, coef)}
        return fields, {name: [g[name] for g in gens] for name in gens[0]}

    def _batch_means(self, arms: Tensor, z: Tensor, coef: Tensor) -> Tensor:
        """``f*_r(x) = k(x, Z_r) c_r`` of arms ``[*K, R, A, d]`` → ``[*K, R, A]`` (``Z`` ``[R, m, d]``,
        ``c`` ``[R, m]``; ``K``: rounds of a chunk, broadcast)."""
        return (kernel_matrix(self.kernel, arms, z) @ coef[..., None])[..., 0]

    def batch_round(self, b: BatchedEnv) -> tuple[Tensor, Tensor]:
        """Round ``b.t``: the stacked arms of ``reset`` first (every round with fixed arms), then
        a fresh ``U[0,1]^d`` set per run; means ``f*_r(x) = k(x, Z_r) c_r`` ``[R, A]``, made
        for a whole chunk of the arms stream at once (:meth:`RunStreams.mapped`), so a round
        costs three indexings instead of the kernel's operators."""
        if self.fixed_arms or b.t == 0:
            return b.fields["_arms"], b.fields["_means"]
        z, coef = b.fields["inducing"], b.fields["coefficients"]

        def chunk(draws: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            """A chunk's arms ``[K, R, A, d]`` (on the device), means ``[K, R, A]`` and best
            means ``[K, R]``, in blocks of rounds (row-wise: each round's means are the bits
            of :meth:`_batch_means` of that round alone, the same batched products)."""
            arms = draws.to(self.device)
            per_round = z.shape[0] * arms.shape[2] * z.shape[1]
            budget = MEANS_BLOCK_CPU if arms.device.type == "cpu" else MEANS_BLOCK_DEVICE
            step = max(1, budget // per_round)
            means = torch.cat([self._batch_means(arms[k:k + step], z, coef)
                               for k in range(0, arms.shape[0], step)])
            return arms, means, means.max(dim=-1).values

        arms, means, best = b.streams["arms"].mapped(
            chunk, ("rkhs-means", id(z), id(coef), self.device), "uniform", self.n_arms,
            self.dim, dtype=self.dtype)
        b.keep_best(means, best)
        return arms, means

    def batch_noise(self, b: BatchedEnv, means: Tensor) -> Tensor:
        """Gaussian noise ``[R]`` for the chosen means ``[R]`` of every run, one draw per run."""
        return gaussian_noise(b, self.noise_std, self.dtype)

    def __repr__(self) -> str:
        return (f"RKHSFunctionEnv(dim={self.dim}, n_arms={self.n_arms}, norm={self.norm}, "
                f"noise_std={self.noise_std}, fixed_arms={self.fixed_arms})")

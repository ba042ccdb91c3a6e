"""Non-stationary environments of Hong, Li & Tewari (AISTATS 2023, §6 and App. J).

* :class:`SwitchingKernelEnv` — §6: ``N`` arms uniform on the unit sphere of ``R^d``, a base
  reward vector ``r ~ N(0, K)`` (RBF kernel, length scale ℓ) rescaled to ``max|r| = 0.8``; at each
  switch the reward vector changes: sign flip of the same vector (default, authors' code; the
  paper does not say) or a fresh draw from ``N(0, K)`` (``mode="resample"``). A switch at ``τ``
  means the new function is used from round ``τ + 1`` (1-based). Env 1: ``switches=(3000,)``;
  Env 2: ``(1500, 5000)``.
* :class:`CosineBandit` — App. J: ``r_t(x) = 0.8·cos(3xᵀθ + φ(t))`` with arms and θ uniform on the
  sphere; ``phase="stationary"`` (φ ≡ 0, J.2) or ``"slow"`` (J.3: 0 on [0, 1000), linear to π on
  [1000, 3000), π on [3000, 4000), linear to 2π on [4000, 6000), 2π afterwards; ``t`` = rounds
  already played).

Noise (the paper, §6: Gaussian with s.d. 0.1; its analysis, §2: zero-mean and bounded):

* ``"truncated"`` (default): ``N(0, σ²)`` truncated to ``[−(1 − |r|), 1 − |r|]`` — zero mean, and
  ``|y| ≤ 1``; the authors' code draws the same law. One uniform per pull, by the inverse CDF;
* ``"rejected"``: ``N(0, σ²)`` redrawn until ``|r + ε| ≤ 1`` (one-sided near ``|r| = 1``, so its
  mean is not zero: ``−0.0055`` at ``r = 0.8``); the default of earlier versions;
* ``"gaussian"``: plain ``N(0, σ²)``.

Randomness:
``reset(seed)`` derives separate generators for the instance (arms, θ, reward vectors) and for the
noise from ``seed`` (the *env seed*: the run index), so every algorithm faces the same instance
and noise sequence for a given seed, whatever its own (algorithm) seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..kernels import kernel_matrix, make_kernel
from ..validation import check_positive
from .batched import BatchedEnv, gaussian_noise, stack_to

__all__ = ["CosineBandit", "SwitchingKernelEnv", "slow_phase"]

_ENV_STREAM = 1_000_003   # offsets keep env streams apart from policy generators seeded alike


def _sphere(n: int, d: int, gen: torch.Generator, dtype: torch.dtype) -> Tensor:
    return _to_sphere(torch.randn(n, d, generator=gen, dtype=dtype))


def _to_sphere(x: Tensor) -> Tensor:
    """The rows of ``x`` ``[..., n, d]`` scaled to unit norm (the draws of :func:`_sphere`)."""
    return x / x.norm(dim=-1, keepdim=True)


class _FixedArmEnv:
    """Common parts: fixed arm set, time, noise, regret bookkeeping."""

    def __init__(self, n_arms: int, dim: int, noise_std: float, noise: str,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        if int(n_arms) < 1:
            raise ValueError(f"n_arms must be >= 1, got {n_arms}")
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if noise not in ("truncated", "rejected", "gaussian"):
            raise ValueError(f"noise must be 'truncated', 'rejected' or 'gaussian', got {noise!r}")
        self.noise_std = float(noise_std)
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.n_arms, self.dim, self.noise = int(n_arms), int(dim), noise
        self.dtype, self.device = dtype, torch.device(device)
        self.t = 0

    @staticmethod
    def _seed_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
        """The instance and noise generators of ``reset(seed)``."""
        return (torch.Generator().manual_seed(_ENV_STREAM + 2 * int(seed)),
                torch.Generator().manual_seed(_ENV_STREAM + 2 * int(seed) + 1))

    def _generators(self, seed: int) -> torch.Generator:
        self.seed = int(seed)
        g_inst, self._g_noise = self._seed_generators(self.seed)
        self.t = 0
        return g_inst

    def _noise(self, mean: float) -> float:
        if self.noise == "truncated":
            return self._truncated_noise(mean)
        for _ in range(100):
            eps = float(torch.randn((), generator=self._g_noise, dtype=torch.float64)) * self.noise_std
            if self.noise == "gaussian" or abs(mean + eps) <= 1.0:
                return eps
        return max(-1.0, min(1.0, mean + eps)) - mean   # pragma: no cover - |mean| ≈ 1

    def _truncated_noise(self, mean: float) -> float:
        """``ε ~ N(0, σ²)`` conditioned on ``|ε| ≤ w = 1 − |mean|``, by the inverse CDF:
        ``ε = σ Φ⁻¹(Φ(−w/σ) + u (Φ(w/σ) − Φ(−w/σ)))``, ``u ~ U(0, 1)``."""
        u = torch.rand((), generator=self._g_noise, dtype=torch.float64)
        width = max(1.0 - abs(mean), 0.0)
        if self.noise_std == 0.0 or width == 0.0:
            return 0.0
        z = torch.tensor(width / self.noise_std, dtype=torch.float64)
        lo = torch.special.ndtr(-z)
        eps = self.noise_std * float(torch.special.ndtri(lo + u * (1.0 - 2.0 * lo)))
        return max(-width, min(width, eps))

    def candidates(self) -> Tensor:
        """The fixed arm set ``[N, d]`` (the same every round)."""
        return self.arms

    def mean_rewards(self) -> Tensor:
        """Noiseless means ``[N]`` of the arms at the current round."""
        return self.means_at(self.t)

    def means_at(self, t: int) -> Tensor:  # pragma: no cover - abstract
        """Noiseless means ``[N]`` of the arms at round ``t`` (0-based rounds played)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ batched runs
    def why_not_batched(self) -> str | None:
        """Why :class:`~torchbandits.envs.batched.BatchedEnv` refuses this configuration (``None``: it
        accepts it).
        """
        if self.noise == "rejected":
            return "noise='rejected' redraws a run-dependent number of times (not batched)"
        return None

    def batch_generators(self) -> dict[str, torch.Generator]:
        """The per-round generators after ``reset`` (``noise``), for
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return {"noise": self._g_noise}

    def batch_noise(self, b: BatchedEnv, means: Tensor) -> Tensor:
        """The noise of :meth:`_noise` for every run ``[R]`` (float64), from one draw per run."""
        if self.noise == "gaussian":
            return gaussian_noise(b, self.noise_std, torch.float64)
        u = b.streams["noise"].uniform(dtype=torch.float64).to(b.device)
        mean = means.to(torch.float64)
        width = (1.0 - mean.abs()).clamp_min(0.0)
        if self.noise_std == 0.0:
            return torch.zeros_like(mean)
        lo = torch.special.ndtr(-(width / self.noise_std))
        eps = self.noise_std * torch.special.ndtri(lo + u * (1.0 - 2.0 * lo))
        eps = torch.minimum(torch.maximum(eps, -width), width)
        return torch.where(width == 0.0, torch.zeros_like(eps), eps)

    def pull(self, index: int) -> float:
        """Noisy reward of arm ``index`` (in ``[0, N)``, noise per ``noise``); time advances one round."""
        if not 0 <= int(index) < self.n_arms:
            raise ValueError(f"index must lie in [0, {self.n_arms}), got {index}")
        mean = float(self.means_at(self.t)[int(index)])
        self.t += 1
        return mean + self._noise(mean)


class SwitchingKernelEnv(_FixedArmEnv):
    """Kernel bandit whose reward vector switches at given rounds (Hong, Li & Tewari 2023, §6).

    Args:
        n_arms, dim: ``N = 100``, ``d = 10`` (the authors' configuration; not in the text).
        lengthscale: RBF ℓ of nature's kernel (0.2); ``kernel`` is exposed to the policies.
        switches: rounds after which the function changes ((3000,) = Env 1, (1500, 5000) = Env 2).
        mode: ``"sign"`` (flip the sign of the same vector) or ``"resample"`` (fresh ``N(0, K)``).
        max_abs: rescale so that ``max_x |r(x)| = max_abs`` (0.8).
        noise_std, noise: s.d. 0.1; ``"truncated"`` (zero mean, ``|y| ≤ 1``), ``"rejected"`` or
            ``"gaussian"`` (see the module docstring).
    """

    def __init__(self, n_arms: int = 100, dim: int = 10, lengthscale: float = 0.2, *,
                 switches: Sequence[int] = (3000,), mode: str = "sign", max_abs: float = 0.8,
                 noise_std: float = 0.1, noise: str = "truncated", seed: int = 0,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> None:
        super().__init__(n_arms, dim, noise_std, noise, dtype, device)
        if mode not in ("sign", "resample"):
            raise ValueError(f"mode must be 'sign' or 'resample', got {mode!r}")
        sw = [int(s) for s in switches]
        if any(s < 1 for s in sw) or sw != sorted(set(sw)):
            raise ValueError(f"switches must be increasing positive rounds, got {switches}")
        self.lengthscale = check_positive("lengthscale", lengthscale)
        self.kernel = make_kernel("rbf", self.lengthscale, dtype=dtype).to(self.device)
        self.switches, self.mode = tuple(sw), mode
        self.max_abs = check_positive("max_abs", max_abs)
        self.norm = self.max_abs
        self.reset(seed)

    def _draw(self, chol: Tensor, gen: torch.Generator) -> Tensor:
        r = chol @ torch.randn(self.n_arms, generator=gen, dtype=self.dtype)
        return r * (self.max_abs / r.abs().max())

    def reset(self, seed: int) -> None:
        """Draw the arms and the reward vectors of every segment from ``seed``; restart at round 0."""
        g = self._generators(seed)
        arms = _sphere(self.n_arms, self.dim, g, self.dtype)
        k = kernel_matrix(self.kernel.cpu(), arms, arms)
        self.kernel.to(self.device)
        chol = torch.linalg.cholesky(k + 1e-10 * torch.eye(self.n_arms, dtype=self.dtype))
        base = self._draw(chol, g)
        vecs = [base]
        for i in range(len(self.switches)):
            vecs.append(self._draw(chol, g) if self.mode == "resample" else base * (-1) ** (i + 1))
        self.arms = arms.to(self.device)
        self.reward_vectors = torch.stack(vecs).to(self.device)

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: each run's arm and reward-vector normals drawn
        on the host from its own generator in ``reset``'s order, stacked and moved with one copy
        per kind; the sphere projection, ``K = k(X_r, X_r) + 10⁻¹⁰I`` ``[R, N, N]``, its Cholesky
        ``L_r``, ``r = L_r ξ`` rescaled to ``max|r| = max_abs`` and the sign flips over the batch.
        Fields ``[R, ...]`` (``reward_vectors`` ``[R, S + 1, N]``), generators per name.

        A kernel matrix that is not positive definite raises as ``reset`` does on the CPU; on
        another device (no host read) that run's reward vectors are NaN."""
        n_draws = 1 + (len(self.switches) if self.mode == "resample" else 0)
        arms, normals, noise = [], [], []
        for s in seeds:
            g, g_noise = self._seed_generators(s)
            arms.append(torch.randn(self.n_arms, self.dim, generator=g, dtype=self.dtype))
            normals.append(torch.stack([torch.randn(self.n_arms, generator=g, dtype=self.dtype)
                                        for _ in range(n_draws)]))   # one call each, as _draw
            noise.append(g_noise)
        x = _to_sphere(stack_to(arms, self.device))                          # [R, N, d]
        eye = torch.eye(self.n_arms, dtype=self.dtype, device=self.device)
        chol, info = torch.linalg.cholesky_ex(kernel_matrix(self.kernel, x, x) + 1e-10 * eye)
        if chol.device.type == "cpu" and bool(info.any()):
            raise torch.linalg.LinAlgError("the arms' kernel matrix is not positive definite "
                                           f"(run {int(info.nonzero()[0, 0])})")
        chol = torch.where(info[:, None, None] == 0, chol, torch.nan)
        r = torch.matmul(chol, stack_to(normals, self.device).transpose(1, 2)).transpose(1, 2)
        r = r * (self.max_abs / r.abs().amax(dim=-1, keepdim=True))       # [R, V, N]
        if self.mode == "sign":
            r = torch.stack([r[:, 0] * (-1) ** i for i in range(len(self.switches) + 1)], dim=1)
        return {"arms": x, "reward_vectors": r}, {"noise": noise}

    def segment(self, t: int) -> int:
        """Index of the function in force at 0-based round ``t`` (round ``t + 1``)."""
        return sum(1 for s in self.switches if t >= s)

    def means_at(self, t: int) -> Tensor:
        return self.reward_vectors[self.segment(t)]

    batch_fields = ("arms", "reward_vectors")

    def batch_round(self, b: BatchedEnv) -> tuple[Tensor, Tensor]:
        """Fixed arms ``[R, N, d]``; every run's reward vector of segment ``segment(b.t)``."""
        return b.fields["arms"], b.fields["reward_vectors"][:, self.segment(b.t)]

    def __repr__(self) -> str:
        return (f"SwitchingKernelEnv(n_arms={self.n_arms}, dim={self.dim}, ls={self.lengthscale}, "
                f"switches={self.switches}, mode={self.mode!r}, noise={self.noise!r})")


def slow_phase(t: int) -> float:
    """Phase φ(t) of the slowly varying cosine bandit (App. J.3), ``t`` = rounds played."""
    if t < 1000:
        return 0.0
    if t < 3000:
        return math.pi * (t - 1000) / 2000.0
    if t < 4000:
        return math.pi
    if t < 6000:
        return math.pi + math.pi * (t - 4000) / 2000.0
    return 2.0 * math.pi


class CosineBandit(_FixedArmEnv):
    """``r_t(x) = amplitude·cos(frequency·xᵀθ + φ(t))`` (App. J).

    Args:
        n_arms, dim: 256 and 8 (J.2) or 100 and 10 (J.3).
        phase: ``"stationary"`` (φ ≡ 0), ``"slow"`` (:func:`slow_phase`) or a callable ``t → φ``.
        lengthscale: RBF ℓ of the kernel the kernel policies are given (``kernel`` attribute).
    """

    def __init__(self, n_arms: int = 256, dim: int = 8, *, phase: str = "stationary",
                 amplitude: float = 0.8, frequency: float = 3.0, lengthscale: float = 0.2,
                 noise_std: float = 0.1, noise: str = "truncated", seed: int = 0,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> None:
        super().__init__(n_arms, dim, noise_std, noise, dtype, device)
        if callable(phase):
            self._phase = phase
        elif phase == "stationary":
            self._phase = lambda t: 0.0
        elif phase == "slow":
            self._phase = slow_phase
        else:
            raise ValueError(f"phase must be 'stationary', 'slow' or a callable, got {phase!r}")
        self.phase_name = phase if isinstance(phase, str) else "custom"
        self.amplitude = check_positive("amplitude", amplitude)
        self.frequency = float(frequency)
        self.norm = self.amplitude
        self.lengthscale = check_positive("lengthscale", lengthscale)
        self.kernel = make_kernel("rbf", self.lengthscale, dtype=dtype).to(self.device)
        self._cache: tuple[float, Tensor] | None = None
        self.reset(seed)

    def reset(self, seed: int) -> None:
        """Draw the arms and ``θ`` from ``seed``; restart at round 0."""
        g = self._generators(seed)
        self.arms = _sphere(self.n_arms, self.dim, g, self.dtype).to(self.device)
        self.theta = _sphere(1, self.dim, g, self.dtype).flatten().to(self.device)
        self._proj = self.frequency * (self.arms @ self.theta)
        self._cache = None

    def means_at(self, t: int) -> Tensor:
        phi = float(self._phase(t))
        if self._cache is None or self._cache[0] != phi:
            self._cache = (phi, self.amplitude * torch.cos(self._proj + phi))
        return self._cache[1]

    batch_fields = ("arms", "_proj")

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: each run's arm and ``θ`` normals drawn on the
        host from its own generator in ``reset``'s order, stacked and moved with one copy per
        kind; the sphere projections and ``frequency·X_r θ_r`` ``[R, N]`` over the batch."""
        arms, theta, noise = [], [], []
        for s in seeds:
            g, g_noise = self._seed_generators(s)
            arms.append(torch.randn(self.n_arms, self.dim, generator=g, dtype=self.dtype))
            theta.append(torch.randn(1, self.dim, generator=g, dtype=self.dtype))
            noise.append(g_noise)
        x = _to_sphere(stack_to(arms, self.device))                          # [R, N, d]
        th = _to_sphere(stack_to(theta, self.device))                        # [R, 1, d]
        proj = self.frequency * torch.matmul(x, th.transpose(1, 2))[:, :, 0]
        return {"arms": x, "_proj": proj}, {"noise": noise}

    def batch_round(self, b: BatchedEnv) -> tuple[Tensor, Tensor]:
        """Fixed arms ``[R, N, d]``; ``amplitude·cos(frequency·x_iᵀθ_r + φ(b.t))`` ``[R, N]``."""
        phi = float(self._phase(b.t))
        return b.fields["arms"], self.amplitude * torch.cos(b.fields["_proj"] + phi)

    def __repr__(self) -> str:
        return (f"CosineBandit(n_arms={self.n_arms}, dim={self.dim}, phase={self.phase_name!r}, "
                f"noise={self.noise!r})")

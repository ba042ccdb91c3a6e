"""scikit-learn's handwritten digits as a contextual bandit (the standard classification-to-bandit
reduction, e.g. Dudík, Langford & Li 2011, "Doubly robust policy evaluation and learning", §5).

The dataset ships with scikit-learn (1,797 images of 8×8 pixels, 64 features in 0..16, 10
classes; no download). Each round a context ``x ∈ [0, 1]^64`` (pixels / 16) is drawn **without
replacement within an epoch** (a fresh seeded permutation of the 1,797 images per epoch); the
actions are the 10 classes; the mean reward of action ``a`` is ``1[a = label(x)]``, observed with
optional Gaussian noise ``N(0, noise_std²)``. The best arm is always the label, so the
pseudo-regret is 1 for a wrong class and 0 for the right one.

**Features: joint ``[x; one-hot(a)]`` (74 dimensions).** Every policy of the library takes joint
feature vectors (EK-UCB, BKB, OPNN and Random included), so this works with all of them
unchanged. And it loses nothing against a product kernel with a delta kernel on the actions: a
stationary kernel on the joint vector factorises, e.g. for the RBF

    k([x; e_a], [x'; e_b]) = k_x(x, x') · exp(−‖e_a − e_b‖² / 2ℓ_a²)
                           = k_x(x, x') · (1 if a = b else exp(−1/ℓ_a²)),

a product kernel whose action factor is a delta kernel *softened* by one parameter: ``ℓ_a → 0``
gives the delta kernel (ten independent regressions), a large ``ℓ_a`` shares information between
classes. :attr:`kernel` is exactly this product (RBF on the pixels with ``ℓ_x`` = 3, about the
median pairwise distance, times an RBF on the one-hot block with ``ℓ_a`` = 0.5, correlation
``e⁻⁴ ≈ 0.018`` between classes), and a marginal-likelihood refit
(:func:`~torchbandits.fitting.fit_kernel`, ``refit_every=``) learns ``ℓ_x`` and ``ℓ_a``.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import make_kernel, product_kernel
from ..models.neural import ReLUNetwork
from .base import gaussian_reward

__all__ = ["DigitsEnv", "load_digits_tensors", "ntk_features"]

N_CLASSES = 10


def load_digits_tensors(dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """``(X [1797, 64] in [0, 1], labels [1797])`` of scikit-learn's digits."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError("the digits environment needs scikit-learn: "
                          "pip install 'torchbandits[bo]'") from err
    data = load_digits()
    x = torch.as_tensor(data.data, dtype=dtype) / 16.0
    return x, torch.as_tensor(data.target, dtype=torch.long)


def ntk_features(network: ReLUNetwork, z: Tensor) -> Tensor:
    """Per-row gradients ``∇_W net(z_i; W)`` of ``network`` stacked as ``[n, p]`` (``p`` = number
    of weights), so that ``φ φᵀ`` equals :func:`~torchbandits.models.neural.ntk_gram`."""
    params = {k: v.detach() for k, v in network.named_parameters()}

    def net(p: dict[str, Tensor], row: Tensor) -> Tensor:
        return torch.func.functional_call(network, p, (row[None],)).squeeze() / math.sqrt(
            network.width)  # forward is √m · net

    jac = torch.func.vmap(torch.func.jacrev(net), in_dims=(None, 0))(params, z)
    return torch.cat([jac[k].flatten(1) for k in params], dim=1)


class DigitsEnv:
    """Contextual bandit on scikit-learn's digits; candidates ``[10, 74]`` = ``[x; one-hot(a)]``.

    Args:
        noise_std: σ of the Gaussian noise added to the 0/1 reward (0: exact rewards).
        context_lengthscale, action_lengthscale: of the product kernel :attr:`kernel`.
        n_samples: use only the first ``n_samples`` images (``None``: all 1,797).
        features: ``"joint"`` (``[x; one-hot(a)]``, 74 dimensions) or ``"ntk"`` (the network
            gradients of the module docstring, ``ntk_width · 641`` dimensions, linear kernel).
        ntk_width, ntk_seed: hidden width and weight seed of the NTK network.
    """

    name = "digits"

    def __init__(self, noise_std: float = 0.0, context_lengthscale: float = 3.0,
                 action_lengthscale: float = 0.5, *, n_samples: int | None = None,
                 features: str = "joint", ntk_width: int = 16, ntk_seed: int = 0,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> None:
        if not math.isfinite(noise_std) or noise_std < 0:
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std}")
        if features not in ("joint", "ntk"):
            raise ValueError(f"features must be 'joint' or 'ntk', got {features!r}")
        if isinstance(ntk_width, bool) or int(ntk_width) != ntk_width or ntk_width < 1:
            raise ValueError(f"ntk_width must be an int >= 1, got {ntk_width!r}")
        x, labels = load_digits_tensors(dtype)
        if n_samples is not None:
            if not 1 <= int(n_samples) <= x.shape[0]:
                raise ValueError(f"n_samples must lie in [1, {x.shape[0]}], got {n_samples}")
            x, labels = x[: int(n_samples)], labels[: int(n_samples)]
        self.dtype = dtype
        self.device = torch.device(device)
        self.features = x.to(self.device)
        self.labels = labels.to(self.device)
        self.context_dim = x.shape[1]
        self.dim = self.context_dim + N_CLASSES
        self.noise_std = float(noise_std)
        self.norm = 1.0
        ctx = list(range(self.context_dim))
        act = list(range(self.context_dim, self.dim))
        self.kernel: Kernel = product_kernel(
            make_kernel("rbf", context_lengthscale, active_dims=ctx, dtype=dtype),
            make_kernel("rbf", action_lengthscale, active_dims=act, dtype=dtype),
        ).to(self.device)
        self._onehot = torch.eye(N_CLASSES, dtype=dtype, device=self.device)
        self.features_kind = features
        self.network: ReLUNetwork | None = None
        if features == "ntk":
            gen = torch.Generator().manual_seed(int(ntk_seed))
            self.network = ReLUNetwork(N_CLASSES * self.context_dim, int(ntk_width), 0,
                                       generator=gen, dtype=dtype, device=self.device)
            self.dim = self.network.n_params
            self.kernel = make_kernel("linear", dtype=dtype).to(self.device)
        self.reset(0)

    def reset(self, seed: int) -> None:
        """Restart the context stream (epoch permutations) and the noise from ``seed``."""
        self.seed = int(seed)
        self._g_ctx = torch.Generator().manual_seed(2 * self.seed)
        self._g_noise = torch.Generator().manual_seed(2 * self.seed + 1)
        self.t = 0
        self.epoch = 0
        self._order = torch.randperm(self.features.shape[0], generator=self._g_ctx)
        self._pos = 0
        self._set_round()

    def _set_round(self) -> None:
        if self._pos == self._order.shape[0]:  # a new epoch: a fresh permutation
            self._order = torch.randperm(self.features.shape[0], generator=self._g_ctx)
            self._pos = 0
            self.epoch += 1
        self.index = int(self._order[self._pos])
        x = self.features[self.index]
        self.label = int(self.labels[self.index])
        if self.network is None:
            self._cand = torch.cat([x.expand(N_CLASSES, -1), self._onehot], dim=1)
        else:  # block inputs e_a ⊗ x/‖x‖, [10, 640], through the network's gradient
            z = (self._onehot[:, :, None] * (x / x.norm())[None, None, :]).flatten(1)
            self._cand = ntk_features(self.network, z)
        self._means = self._onehot[self.label].clone()

    def context(self) -> Tensor:
        """This round's image ``[64]``."""
        return self.features[self.index]

    def candidates(self) -> Tensor:
        """This round's candidates ``[10, d]``: the image joined to each class's one-hot action (their
        NTK features when a ``network`` is given).
        """
        return self._cand

    def mean_rewards(self) -> Tensor:
        """Noiseless means ``[A]`` of this round's candidates (1 for the true class, 0 otherwise)."""
        return self._means

    def why_not_batched(self) -> str | None:
        """Why :class:`~torchbandits.envs.batched.BatchedEnv` refuses this environment."""
        return "its contexts are drawn without replacement from the data set (not batched yet)"

    def pull(self, index: int) -> float:
        """Noisy reward of candidate ``index`` (in ``[0, A)``); moves to the next context."""
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std, self.dtype)
        self.t += 1
        self._pos += 1
        self._set_round()
        return reward

    def __repr__(self) -> str:
        return (f"DigitsEnv(n={self.features.shape[0]}, features={self.features_kind!r}, "
                f"dim={self.dim}, noise_std={self.noise_std})")

"""OPNN, OPNN0 (Algorithm 5, App. J.2) and ADA-OPNN (Algorithm 7, App. B) of Hong, Li & Tewari
(AISTATS 2023, §5.2).

OPKB / ADA-OPKB with a *dynamic* feature map: the empirical NTK of a ReLU network
(:mod:`torchbandits.models.neural`). At ``W⁽⁰⁾`` (drawn from the policy's generator) the Gram
``K^{W⁽⁰⁾}`` gives ``Φ₀``, ``π_{Φ₀}(X)`` and ``γ = γ_{Φ₀,T}`` — ``γ, E, α, β_j, μ_j`` are never
recomputed. At the start of every block ``j ≥ 1``: ``W⁽ʲ⁾ = TrainNN(epoch history, W⁽⁰⁾)``,
``Φ_j = chol(K^{W⁽ʲ⁾} + εI)``, ``π_{Φ_j}(X)``; with ``feature_map="current"`` (Algorithms 5/7 and
the authors' code) the IPS matrices of all earlier strategies of the epoch and the cached
reference gaps ``G[k]`` are recomputed with ``Φ_j``; ``"at_play_time"`` keeps each step's matrix
of the map current when it was played (the analysis, Lemma G.13). Then OP with ``Φ_j`` and
``P⁽ʲ⁾ = (1 − μ_j)Q⁽ʲ⁾ + μ_j π_{Φ_j}(X)``. After a restart block 0 plays ``π_{Φ₀}(X)`` of the
initial map (the paper does not say; ``restart_features="last"`` keeps the last trained map, as
the authors' code).
``OPNN0`` freezes the map at ``W⁽⁰⁾`` (= ``train_steps = 0``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..design import optimal_design
from ..models.features import cholesky_features
from ..models.neural import ReLUNetwork, ntk_gram, train_nn
from .opkb import OPPolicyBase

__all__ = ["ADAOPNN", "OPNN", "OPNN0"]


class ADAOPNN(OPPolicyBase):
    """ADA-OPNN (Algorithm 7): ADA-OPKB on the trained network's NTK features.

    Args:
        horizon: ``T``.
        width: ``m`` (2048 in the paper's experiments).
        n_square_layers: number of ``m × m`` layers (authors' code: ``L = 3``; the paper's depth
            ``L`` corresponds to ``L − 2``, §5.1).
        nn_lam: TrainNN ridge ``λ`` (10).  eta: step size ``η`` (1e-8).  train_steps: ``J`` (100).
        feature_map: ``"current"`` (Algorithms 5/7) or ``"at_play_time"`` (Lemma G.13).
        restart_features: ``"initial"`` (default) or ``"last"`` (authors' code).
        net_dtype: dtype of the network (float32); Grams and all OP algebra stay in float64.
        jitter: added to ``K^W`` before the Cholesky factorisation.
        preset, constants, solver, **overrides: as :class:`~.opkb.ADAOPKB` (family ``"opnn"``).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import ADAOPNN
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = ADAOPNN(16, width=8, n_square_layers=0, train_steps=2, eta=1e-4)
        >>> for _ in range(10):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> p = policy.distribution(arms)  # sampling distribution of the next round, [A]
        >>> p.shape, round(float(p.sum()), 6)
        (torch.Size([11]), 1.0)
        >>> 'train_seconds' in policy.diagnostics()
        True
    """

    adaptive = True
    family = "opnn"
    trains = True

    def __init__(self, horizon: int, *, width: int = 2048, n_square_layers: int = 3,
                 nn_lam: float = 10.0, eta: float = 1e-8, train_steps: int = 100,
                 feature_map: str = "current", restart_features: str = "initial",
                 net_dtype: torch.dtype = torch.float32, jitter: float = 1e-10,
                 stationary_preset: bool = False, **kwargs: Any) -> None:
        self._stationary_preset = bool(stationary_preset)
        super().__init__(horizon, **kwargs)
        if feature_map not in ("current", "at_play_time"):
            raise ValueError(f"feature_map must be 'current' or 'at_play_time', got {feature_map!r}")
        if restart_features not in ("initial", "last"):
            raise ValueError(f"restart_features must be 'initial' or 'last', got {restart_features!r}")
        if int(width) < 1 or int(n_square_layers) < 0 or int(train_steps) < 0:
            raise ValueError("width must be >= 1, n_square_layers >= 0 and train_steps >= 0")
        if not (nn_lam > 0 and eta > 0):
            raise ValueError(f"nn_lam and eta must be > 0, got {nn_lam}, {eta}")
        self.width, self.n_square_layers = int(width), int(n_square_layers)
        self.nn_lam, self.eta, self.train_steps = float(nn_lam), float(eta), int(train_steps)
        self.feature_map, self.restart_features = feature_map, restart_features
        self.net_dtype, self.jitter = net_dtype, float(jitter)
        self.network: ReLUNetwork | None = None
        self._init_weights: list[Tensor] = []
        f = {"dtype": self.dtype, "device": self.device}
        self.register_buffer("phi_cur", torch.zeros(0, **f))
        self.register_buffer("pi_cur", torch.zeros(0, **f))
        self.train_seconds = 0.0
        self.n_trains = 0

    def _preset_kwargs(self) -> dict[str, Any]:
        return {"stationary": self._stationary_preset}

    def _extra_state(self) -> dict[str, Any]:
        return {**super()._extra_state(), "init_weights": [w.cpu() for w in self._init_weights],
                "train_seconds": self.train_seconds, "n_trains": self.n_trains}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        super()._set_extra_state(state)
        self.train_seconds, self.n_trains = state["train_seconds"], state["n_trains"]
        init = state["init_weights"]
        self._init_weights = [w.to(self.device) for w in init]
        if init and self.network is None:   # the network's weights load right after this
            self.network = ReLUNetwork(init[0].shape[1], self.width, self.n_square_layers,
                                       dtype=self.net_dtype, device=self.device)
            for w in self.network.weights:
                w.requires_grad_(True)

    # ------------------------------------------------------------------ feature maps
    def _features(self) -> Tensor:
        gram = ntk_gram(self.network, self.arms.to(self.net_dtype), dtype=self.dtype)
        return cholesky_features(gram, self.jitter)

    def _initial_features(self, arms: Tensor) -> Tensor:
        gen = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=self.generator)))
        self.network = ReLUNetwork(arms.shape[1], self.width, self.n_square_layers, generator=gen,
                                   dtype=self.net_dtype, device=self.device)
        for w in self.network.weights:
            w.requires_grad_(True)
        self._init_weights = [w.detach().clone() for w in self.network.weights]
        phi0 = self._features()
        self.phi_cur = phi0
        return phi0

    def _epoch_features(self) -> tuple[Tensor, Tensor]:
        if self.restart_features == "initial" or self.pi_cur.numel() == 0:
            self.phi_cur, self.pi_cur = self.phi, self.pi_x
            if self.network is not None:
                with torch.no_grad():
                    for w, w0 in zip(self.network.weights, self._init_weights, strict=True):
                        w.copy_(w0)
        return self.phi_cur, self.pi_cur

    def _block_features(self, j: int) -> tuple[Tensor, Tensor]:
        if not self.trains or self.train_steps == 0:
            return self.phi, self.pi_x
        import time

        t0 = time.perf_counter()
        n = self.arms.shape[0]
        arm = self.h_arm[: self.h_n]
        counts = torch.bincount(arm, minlength=n).to(self.dtype)
        sums = torch.zeros(n, dtype=self.dtype, device=self.device).index_add_(0, arm, self.h_y[: self.h_n])
        train_nn(self.network, self._init_weights, self.arms, counts, sums, lam=self.nn_lam,
                 eta=self.eta, steps=self.train_steps)
        phi = self._features()
        design = optimal_design(phi, self.lam, solver=self.solver, kkt_tol=self.kkt_tol)
        self._account(design.seconds, design.certificate.gap)
        self.phi_cur, self.pi_cur = phi, design.p
        if self.feature_map == "current":
            for m in range(j):
                self._set_strategy(m, self.strategies[m].clone(), phi)
            for k in range(j - 1):
                end = self.E * (2 ** (k + 1) - 1)        # C(k) = the first blocks 0..k
                self.ref_gaps[k] = self.interval_gaps(0, min(end, self.h_n))
        self.train_seconds += time.perf_counter() - t0
        self.n_trains += 1
        return phi, design.p

    def _reset(self) -> None:
        super()._reset()
        self.network = None
        self._init_weights = []
        self.phi_cur = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.pi_cur = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.train_seconds = 0.0
        self.n_trains = 0

    def diagnostics(self) -> dict[str, float]:
        return {**super().diagnostics(), "train_seconds": self.train_seconds}


class OPNN(ADAOPNN):
    """OPNN (Algorithm 5): doubling blocks without replays or change tests.

    Examples:
        The usage is that of :class:`ADAOPNN`; TrainNN runs once at the start of every block
        ``j ≥ 1``, so the features ``Φ_j`` in use are no longer the initial ``Φ₀``:

        >>> import torch
        >>> from torchbandits.policies import OPNN
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> policy = OPNN(16, width=8, n_square_layers=0, train_steps=2, eta=1e-4)
        >>> for _ in range(10):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], torch.tensor(float(i == 7)))  # reward 1 at arm 7 only
        >>> policy.n_trains == policy.diagnostics()["block"] == 3  # blocks 1, 2, 3 have started
        True
        >>> torch.equal(policy.phi_cur, policy.phi)  # Φ_3 (trained) against Φ₀
        False
    """

    adaptive = False


class OPNN0(OPNN):
    """OPNN0 (App. J.2 ablation): OPNN with the feature map frozen at ``W⁽⁰⁾``.

    Examples:
        The rounds of :class:`OPNN`'s example, with the map frozen: no training, and every block
        uses ``Φ₀`` of ``W⁽⁰⁾``:

        >>> import torch
        >>> from torchbandits.policies import OPNN0
        >>> policy = OPNN0(16, width=8, n_square_layers=0)
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> for _ in range(10):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], torch.tensor(float(i == 7)))
        >>> policy.n_trains, policy.diagnostics()["block"], torch.equal(policy.phi_cur, policy.phi)
        (0, 3.0, True)
    """

    trains = False

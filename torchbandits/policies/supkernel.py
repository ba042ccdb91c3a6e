"""SupKernelUCB (Valko et al. 2013), the textbook version of the baseline of Zenati et al. (2022, Section 5).

Levels ``s = 1..S`` (``S = ⌈log₂ T⌉``) with disjoint sets ``Ψ^s`` of past rounds, each with its own
exact kernel ridge posterior (:class:`~torchbandits.models.ExactKernelRidge`, regulariser λ). At a
round: ``Â ← all candidates``, ``s ← 1``, repeat with the posterior of level ``s`` only:

* width ``w(a) = η σ̂_s(a)`` with the **ridge** sd ``σ̂² = (k − k_Ψᵀ(K_Ψ + λI)⁻¹k_Ψ)/λ``;
* (a) all ``w ≤ 1/√T``: play ``argmax(m̂ + w)`` and store the round in no set;
* (b) else all ``w ≤ 2^{−s}``: keep ``{a: m̂(a) + w(a) ≥ max(m̂ + w) − 2^{1−s}}`` and go to ``s + 1``;
* (c) else play a candidate with ``w > 2^{−s}`` (the first, or uniformly at random with
  ``selection="random"`` as the code) and store the round in ``Ψ^s``.

Past the last level the policy plays as in (a). The authors' reference code had three bugs: it stored
the round under the action index instead of the level, used ``K_Ψ + 10⁻⁶ I`` instead of ``+ λI``,
and capped the levels at the number of actions; none is reproduced. ``eta`` defaults to the code's
``0.1`` (``η = 0.1·b`` with ``b = 1``); the theory value is ``1 + sqrt(2 log(2TN/δ))``.

The level of a round is decided in :meth:`select`; :meth:`update` files the played point under
that level when it is one of the candidates of the last ``select`` (otherwise in no set).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernels import check_kernel
from ..models import ExactKernelRidge
from ..validation import check_positive
from .base import Policy

__all__ = ["SupKernelUCB"]


class SupKernelUCB(Policy):
    """Textbook SupKernelUCB (finite candidate sets).

    Args:
        kernel: GPyTorch kernel on the joint features.
        lam: regulariser λ of every level's posterior.
        eta: width multiplier η (on the ridge sd).
        horizon: T, which sets ``S = ⌈log₂ T⌉`` and the threshold ``1/√T``.
        selection: ``"first"`` or ``"random"`` in case (c).
        seed, n_warmup, dtype, device: see :class:`~torchbandits.policies.base.Policy`.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import SupKernelUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = SupKernelUCB(make_kernel("rbf", 0.2), lam=0.01, eta=0.1, horizon=40)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        eta: float = 0.1,
        *,
        horizon: int = 2000,
        selection: Literal["first", "random"] = "random",
        seed: int = 0,
        n_warmup: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        check_kernel(kernel)
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        self.lam = check_positive("lam", lam)
        self.eta = check_positive("eta", eta)
        if int(horizon) < 2:
            raise ValueError(f"horizon must be >= 2, got {horizon}")
        if selection not in ("first", "random"):
            raise ValueError(f"selection must be 'first' or 'random', got {selection!r}")
        self.horizon = int(horizon)
        self.selection = selection
        self.n_levels = max(1, math.ceil(math.log2(self.horizon)))
        self.levels = torch.nn.ModuleList(
            ExactKernelRidge(kernel, self.lam, dtype=dtype, device=device, cache_candidates=False)
            for _ in range(self.n_levels)
        )
        self._pending: tuple[Tensor, int] | None = None  # (point, level) chosen by select
        self.exploit_rounds = 0

    def _level_scores(self, level: int, cand: Tensor) -> tuple[Tensor, Tensor]:
        mean, var = self.levels[level].mean_var(cand)
        return mean, self.eta * torch.sqrt(var / self.lam)

    def _decide(self, cand: Tensor) -> tuple[int, int | None, Tensor]:
        """``(index, level or None, scores)`` of the elimination scheme."""
        active = torch.arange(cand.shape[0], device=cand.device)
        thresh = 1.0 / math.sqrt(self.horizon)
        scores = torch.full((cand.shape[0],), -math.inf, dtype=self.dtype, device=cand.device)
        for s in range(self.n_levels):
            mean, width = self._level_scores(s, cand[active])
            ucb = mean + width
            scores[active] = ucb
            if bool((width <= thresh).all()):  # (a) exploit
                return int(active[int(torch.argmax(ucb))]), None, scores
            level_w = 2.0 ** -(s + 1)
            wide = width > level_w
            if bool(wide.any()):  # (c) explore at this level
                idx = torch.nonzero(wide)[:, 0]
                if self.selection == "random":
                    pick = idx[int(torch.randint(idx.numel(), (1,), generator=self.generator))]
                else:
                    pick = idx[0]
                return int(active[pick]), s, scores
            keep = ucb >= ucb.max() - 2.0 * level_w  # (b) eliminate
            active = active[keep]
            scores = torch.full_like(scores, -math.inf)
        mean, width = self._level_scores(self.n_levels - 1, cand[active])
        ucb = mean + width
        scores[active] = ucb
        return int(active[int(torch.argmax(ucb))]), None, scores

    def forward(self, candidates: Tensor) -> Tensor:
        """Scores whose argmax is the exploit choice: ``m̂ + w`` at the level where the scheme
        stopped, ``−inf`` for eliminated candidates (randomised case (c) is not reflected)."""
        cand = self.check_candidates(candidates)
        with torch.no_grad():
            return self._decide(cand)[2]

    def select(self, candidates: Any) -> int:
        cand = self.check_candidates(candidates)
        if self.t < self.n_warmup:
            i = self.warmup_choice(cand)
            self._pending = (cand[i].clone(), 0)  # the warm-start round seeds level 1
            return i
        with torch.no_grad():
            i, level, _ = self._decide(cand)
        self._pending = None if level is None else (cand[i].clone(), level)
        return i

    def _update(self, x: Tensor, reward: float) -> None:
        pending = self._pending
        self._pending = None
        if pending is not None and pending[0].shape == x.shape and torch.equal(pending[0], x):
            self.levels[pending[1]].append(x, reward)
        else:
            self.exploit_rounds += 1

    def _reset(self) -> None:
        for lv in self.levels:
            lv.reset()
        self._pending = None
        self.exploit_rounds = 0

    def _extra_state(self) -> dict[str, Any]:
        return {"pending": self._pending, "exploit_rounds": self.exploit_rounds}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self._pending = state["pending"]
        self.exploit_rounds = int(state["exploit_rounds"])

    def diagnostics(self) -> dict[str, float]:
        """Points stored per level (``psi_s``), total stored, rounds stored nowhere."""
        out = {f"psi_{s + 1}": float(lv.n) for s, lv in enumerate(self.levels)}
        out["stored"] = float(sum(lv.n for lv in self.levels))
        out["exploit_rounds"] = float(self.exploit_rounds)
        return out

    def extra_repr(self) -> str:
        return (f"lam={self.lam}, eta={self.eta}, horizon={self.horizon}, levels={self.n_levels}, "
                f"selection={self.selection!r}")

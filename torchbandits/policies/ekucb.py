"""EK-UCB: Efficient Kernel UCB (Zenati, Bietti, Diemert, Mairal, Martin & Gaillard, AISTATS 2022,
§4.3, Algorithms 2 and 4).

``UCB_t(s) = μ̃_{t−1}(s) + β_t · σ̃_{t−1}(s)`` with the projected (Nyström) posterior of
:class:`~torchbandits.models.NystromKernelRidge` on a dictionary grown by
:class:`~torchbandits.models.KORS`. A float ``beta`` multiplies the **ridge** sd
``σ̃ = ‖φ(s)‖_{Ṽ⁻¹}`` (GP variance divided by λ), as in the paper (§3.2; UCB = mean + β·σ̃, the radius β
multiplying the sd as in Algorithms 2–4, not ``β^{1/2}`` as eq. 6 writes); pass
``variance="gp"`` for the GP sd, or a :class:`~torchbandits.confidence.ConfidenceRule`
(e.g. :class:`~torchbandits.confidence.ekucb.EKUCBTheoryBeta`).

Per round (§4.3, App. E.2): scoring ``O(A m²)``; after the reward, the data update with the current
dictionary (Sherman–Morrison, ``O(m²)``), then the KORS decision for the played state and, if it
is accepted, the dictionary growth (``O(nm + m²)``). The first played state is always the first
anchor (``p̃ = 1``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..confidence import ConfidenceRule, ConstantBeta, Variance, as_rule
from ..kernels import check_kernel
from ..models.kors import KORS, KorsScore
from ..models.nystrom import NystromKernelRidge, Parametrisation
from ..validation import as_point, as_scalar_reward, check_positive
from .base import RuleUCB
from .ekucb_batched import EKUCBBatchMixin

__all__ = ["EKUCB", "NystromUCB"]


class NystromUCB(RuleUCB):
    """Shared part of the Nyström UCB policies (EK-UCB, CBKB, CBBKB): a
    :class:`NystromKernelRidge` model and a confidence rule (float ``beta`` → constant radius on
    the ``variance`` sd, ridge by default).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import NystromUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> policy = NystromUCB(make_kernel("rbf", 0.2), lam=0.01, beta=0.1)
        >>> policy.update(arms[3], 0.5)  # the base class adds no anchor (subclasses choose them)
        >>> policy(arms).shape
        torch.Size([11])
        >>> sorted(policy.diagnostics())
        ['beta', 'n']
    """

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        beta: float | ConfidenceRule = 0.1,
        *,
        variance: Variance = "ridge",
        jitter: float = 0.0,
        min_residual: float = 1e-8,
        parametrisation: Parametrisation = "whitened",
        seed: int = 0,
        n_warmup: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        check_kernel(kernel)
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        lam = check_positive("lam", lam)
        self.rule = as_rule(beta, variance)
        if self.rule.required_regularisers(lam):
            raise ValueError("a Nyström policy keeps its posterior at λ only; the rule needs "
                             f"regularisers {self.rule.required_regularisers(lam)}")
        self.model = NystromKernelRidge(kernel, lam, jitter=jitter, min_residual=min_residual,
                                        parametrisation=parametrisation, dtype=dtype, device=device)

    @property
    def kernel(self) -> Kernel:
        """The model's kernel (GPyTorch)."""
        return self.model.kernel

    def _ucb(self, cand: Tensor) -> Tensor:
        """UCB of validated candidates; a constant β takes a lean path (no re-validation)."""
        rule = self.rule
        if type(rule) is ConstantBeta:
            mean, var = self.model.score(cand)
            scale = rule.beta / math.sqrt(self.lam) if rule.variance == "ridge" else rule.beta
            return mean.add_(var.sqrt_(), alpha=scale)  # ridge sd = GP sd / √λ
        return rule.bounds(self.model, cand, self.t + 1)[0]

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB of every candidate ``[A]``."""
        return self._ucb(self.check_candidates(candidates))

    def select(self, candidates: Any) -> int:
        """Argmax of the UCB (first index on ties; uniform during the warm-up rounds)."""
        cand = self.check_candidates(candidates)
        if self.t < self.n_warmup:
            return self.warmup_choice(cand)
        with torch.no_grad():
            return int(torch.argmax(self._ucb(cand)))

    def update(self, x: Any, reward: Any) -> None:
        """As :meth:`Policy.update` (validate, then update), with ``dim`` written once and ``t``
        without ``nn.Module.__setattr__`` (measurable in EK-UCB's ~0.2-0.6 ms step)."""
        xv = as_point("x", x, dtype=self.dtype, device=self.device, dim=self.dim)
        r = as_scalar_reward("reward", reward)
        with torch.no_grad():
            self._update(xv, r)
        if self.dim is None:
            self.dim = xv.shape[0]
        # nn.Module.__setattr__ measured ~15 µs here (~3% of an EK-UCB step on Chessboard); t is a
        # plain int of Policy, never a parameter, buffer or submodule, so the plain write is the same
        object.__setattr__(self, "t", self.t + 1)

    def mean_var(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and **ridge** variance ``σ̃²`` (GP variance / λ) of every candidate."""
        mean, var = self.model.mean_var(self.check_candidates(candidates))
        return mean, var / self.lam


class KorsStats:
    """EK-UCB's KORS counters: the last acceptance probability ``p̃_t``, ``Σ p̃`` and
    ``Σ p̃(1 − p̃)``. A slotted plain object, written every round without
    ``nn.Module.__setattr__`` (~5 µs a write, ~1% of an EK-UCB step)."""

    __slots__ = ("last_p", "sum_p", "sum_pq")

    def __init__(self) -> None:
        self.last_p = float("nan")
        self.sum_p = 0.0
        self.sum_pq = 0.0


class EKUCB(EKUCBBatchMixin, NystromUCB):
    """Efficient Kernel UCB (Zenati et al. 2022, Algorithms 2 and 4).

    Args:
        kernel: GPyTorch kernel on joint ``[context; action]`` features.
        lam: ridge regulariser λ.
        beta: constant radius (float; multiplies the ridge sd by default) or a confidence rule.
        kors_mu: KORS regulariser μ (default λ, as Algorithms 2/4 call KORS; §5 varies μ).
        kors_eps: KORS ε (0.5).
        kors_gamma: KORS budget γ (default 1; theory ``12 log(T/δ)``, Prop. 4.1; the authors' code
            uses ``b·λ`` with b ≤ 0.1).
        kors_score: ``"correct"`` (eq. 41) or ``"reference"`` (the authors' code, see
            :mod:`~torchbandits.models.kors`).
        min_residual, jitter, parametrisation: see :class:`NystromKernelRidge`.
        variance, seed, n_warmup, dtype, device: see :class:`NystromUCB` / ``Policy``.

    **Batched mode** (:mod:`~torchbandits.policies.ekucb_batched`): ``reset(seed=[s_1, …, s_R])``
    steps ``R`` runs together, each on its own padded dictionary; ``select(candidates [R, A, d])``
    returns a ``LongTensor [R]``, ``update(x [R, d], reward [R])``; run ``r`` plays what the
    sequential policy with ``seed=s_r`` plays (constant β, whitened parametrisation).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import EKUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = EKUCB(make_kernel("rbf", 0.2), lam=0.01, beta=0.1, seed=0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> sorted(policy.diagnostics())
        ['beta', 'dict_size', 'kors_prob', 'kors_prob_sum', 'kors_prob_var_sum', 'n', 'refused']
    """
    batch_pays_from = 4  # --batch auto on the CPU: from 4 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        beta: float | ConfidenceRule = 0.1,
        *,
        kors_mu: float | None = None,
        kors_eps: float = 0.5,
        kors_gamma: float = 1.0,
        kors_score: KorsScore = "correct",
        **kwargs: Any,
    ) -> None:
        super().__init__(kernel, lam, beta, **kwargs)
        mu = self.lam if kors_mu is None else kors_mu
        self.kors = KORS(mu, kors_eps, kors_gamma, kors_score, dtype=self.dtype, device=self.device)
        self.kors_stats = KorsStats()

    def _update(self, x: Tensor, reward: float) -> None:
        model, kors, stats = self.model, self.kors, self.kors_stats
        m = model.m
        feat = None
        cached = model.scored_column(x) if m else None  # the played candidate was just scored
        if cached is not None:
            kz, feat = cached
        else:
            kz = model.kernel_column(x)
        kss = model.prior_variance(x)
        model.append_column(x, reward, kz, feat)  # data update with the current dictionary
        if m == 0:  # round 0: s_0 is the first anchor with p̃ = 1
            p = 1.0
            accept = True
        else:  # KORS decision for the played state
            p = kors.probability(kz, kss)
            accept = p >= 1.0 or float(torch.rand((), generator=self.generator, dtype=torch.float64)) < p
            stats.sum_p += p
            stats.sum_pq += p * (1.0 - p)
        stats.last_p = p
        # dictionary update, unless the min_residual guard refuses (ω is known from the append)
        if accept and model.add_last_to_dictionary(kz):
            kors.add(kz, kss, p)

    def _reset(self) -> None:
        self.model.reset()
        self.kors.reset()
        self.kors_stats = KorsStats()

    def _extra_state(self) -> dict[str, Any]:
        st = self.kors_stats
        return {"last_p": st.last_p, "sum_p": st.sum_p, "sum_pq": st.sum_pq,
                "batch": self.batch_state()}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        st = self.kors_stats
        st.last_p = float(state["last_p"])
        st.sum_p = float(state["sum_p"])
        st.sum_pq = float(state["sum_pq"])
        self.load_batch_state(state.get("batch"))

    def diagnostics(self) -> dict[str, float]:
        """Dictionary size ``m``, the last KORS acceptance probability, ``Σ p̃`` (so that
        ``m − 1 − Σ p̃`` is the KORS martingale), anchors refused by the guard, and β (in
        batched mode tensors ``[R]``, one entry per run)."""
        if self.coins is not None:
            return self.batch_diagnostics()
        return {"dict_size": float(self.model.m), "n": float(self.model.n),
                "kors_prob": self.kors_stats.last_p, "kors_prob_sum": self.kors_stats.sum_p,
                "kors_prob_var_sum": self.kors_stats.sum_pq, "refused": float(self.model.refused),
                **self.rule.diagnostics()}

    def extra_repr(self) -> str:
        k = self.kors
        return (f"lam={self.lam}, mu={k.mu}, eps={k.eps}, gamma={k.gamma}, score={k.score!r}, "
                f"rule={self.rule!r}")

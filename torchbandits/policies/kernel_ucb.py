"""K-UCB (Zenati et al. 2022, Algorithm 3) and GP-UCB / CGP-UCB on the exact posterior.

Both score ``UCB_t(x) = μ_{t−1}(x) + β_t · sd_{t−1}(x)`` with the exact kernel-ridge posterior of
:class:`~torchbandits.models.ExactKernelRidge`; they differ only in their defaults:

* :class:`KernelUCB` — β multiplies the **ridge** sd ``ρ_λ/√λ = ‖φ(x)‖_{V⁻¹}`` (Zenati et al.
  2022, §3.2); a float ``beta`` is a constant radius (the paper's experiments use 0.1 with λ = 10).
* :class:`GPUCB` — β multiplies the **GP** sd ``ρ_λ`` with noise variance λ (Srinivas et al.;
  Chowdhury–Gopalan). CGP-UCB (Krause & Ong 2011) is GP-UCB on joint ``[context; action]``
  features, which is what every contextual environment hands a policy.

Any :class:`~torchbandits.confidence.ConfidenceRule` may be passed as ``beta`` (Algorithm 1 of
Flynn & Reeb 2024): the model then also maintains the regularisers the rule needs.

**Batched mode** (a leading run dimension, :mod:`torchbandits.experiments.batch`):
``reset(seed=[s_1, …, s_R])`` starts ``R`` runs on a
:class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge`; ``select(candidates
[R, A, d])`` returns a ``LongTensor [R]`` (first index on ties) and ``update(x [R, d],
reward [R])`` appends to every run. Run ``r`` plays what the sequential policy reset with
``seed=s_r`` plays. Batched bounds (:mod:`torchbandits.confidence.batched`): a constant β (per
run ``[R]`` allowed), the radii of Zenati et al. (2022, Lemma 3.1), IGP-UCB (Chowdhury & Gopalan
2017, Thm 2), Srinivas et al. (2010) and Abbasi-Yadkori (2012), and the mixture bounds AMM, DMM
and CMM (dual) of Flynn & Reeb (2024), each with every run's own log-det and data; per-run λ
``[R]`` with the rules that take the posterior at the model's λ (:meth:`KernelUCB.set_per_run`).
Other rules, refits, ``refresh_every`` and custom models say why in
:meth:`KernelUCB.why_not_batched`, and the
runner falls back to sequential runs.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ..batching import (
    RunStreams,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
)
from ..buffers import set_plain
from ..confidence import ConfidenceRule, ConstantBeta, IGPBeta, RadiusRule, Variance, as_rule
from ..confidence.batched import (
    BATCHED_RULES,
    batched_bounds,
    batched_radius,
    why_not_per_run_lam,
    why_not_rule,
)
from ..confidence.radii import ucb_form
from ..kernels import check_kernel
from ..models import ExactKernelRidge
from ..models.batched_exact import BatchedExactKernelRidge, check_run_values
from ..validation import check_positive, chosen_row, is_chosen_row
from .base import RuleUCB, check_model
from .batch_mode import BatchModeMixin, check_run_lengths
from .lean_step import LEAN_FORWARDS, LeanStep
from .refit import RefitMixin

__all__ = ["BATCHED_RULES", "GPUCB", "KernelUCB", "batched_radius"]

_BATCH_NEUTRAL = {"__init__", "__doc__", "__module__", "__qualname__", "__annotations__",
                  "__dict__", "__weakref__", "__firstlineno__", "__static_attributes__",
                  "default_variance", "batch_pays_from"}


def _batch_safe_subclass(cls: type) -> bool:
    """Whether a subclass of :class:`KernelUCB` only presets KernelUCB (its constructor, and a
    single-run ``forward`` that scores with the rule's UCB — the martingale-mixture policies of
    Flynn & Reeb 2024): then its batched steps are KernelUCB's."""
    for klass in cls.__mro__:
        if klass is KernelUCB or klass is GPUCB:
            return True
        extra = set(vars(klass)) - _BATCH_NEUTRAL
        if extra - {"forward"} or ("forward" in extra and not klass.__name__.startswith("_Mixture")):
            return False
    return False


class KernelUCB(BatchModeMixin, LeanStep, RefitMixin, RuleUCB):
    """Kernel UCB with the exact posterior (K-UCB of Zenati et al. 2022, Algorithm 3;
    Algorithm 1 of Flynn & Reeb 2024).

    Args:
        kernel: GPyTorch kernel on the joint features.
        lam: ridge regulariser λ > 0 (= GP noise variance).
        beta: constant radius (float) or a confidence rule.
        variance: which sd a float ``beta`` multiplies, ``"ridge"`` (default, Zenati et al.) or
            ``"gp"``. Ignored when ``beta`` is a rule (the rule states its own).
        refresh_every: refactorise the model from scratch every that many updates (0: never).
        refit_every, refit_warmup, refit_options: marginal-likelihood refits of the kernel and
            noise (:mod:`torchbandits.policies.refit`; 0: never, the default).
        seed, n_warmup, dtype, device: see :class:`~torchbandits.policies.base.Policy`.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import KernelUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = KernelUCB(make_kernel("rbf", 0.2), lam=0.1, beta=0.5)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """
    batch_pays_from = 4  # --batch auto on the CPU: from 4 seeds (benchmarks/bench_batch_crossover.py)

    default_variance: Variance = "ridge"

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        beta: float | ConfidenceRule = 1.0,
        *,
        variance: Variance | None = None,
        refresh_every: int = 0,
        refit_every: int = 0,
        refit_warmup: int = 5,
        refit_options: dict[str, Any] | None = None,
        model: nn.Module | None = None,
        seed: int = 0,
        n_warmup: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        check_kernel(kernel)
        lam = check_positive("lam", lam)
        rule = as_rule(beta, variance or self.default_variance)
        if model is not None:
            check_model(model, lam=lam, rule=rule, dtype=dtype)
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        self.rule = rule
        self.model = model if model is not None else ExactKernelRidge(
            kernel, lam, rule.required_regularisers(lam), dtype=dtype, device=device,
            refresh_every=refresh_every,
        )
        self.init_refit(kernel, refit_every, refit_warmup, refit_options)
        self.run_streams: RunStreams | None = None
        self.per_run: dict[str, Tensor | None] = {"lam": None, "beta": None}
        self._batch_beta: Tensor | None = None   # β_t [R] of the last batched bounds

    # ---------------------------------------------------------------- batched mode
    def why_not_batched(self) -> str | None:
        """``None`` if this policy can step a batch of runs, else the reason."""
        name = type(self).__name__
        if type(self.rule) not in BATCHED_RULES:
            return f"{why_not_rule(self.rule, self.model.regularisers)}; {name} runs sequentially"
        if type(self) not in (KernelUCB, GPUCB) and not _batch_safe_subclass(type(self)):
            return f"{type(self).__name__} changes KernelUCB's steps (runs sequentially)"
        if self.refit_every:
            return "marginal-likelihood refits (refit_every > 0) run sequentially"
        if type(self.model) is not ExactKernelRidge:
            return f"a custom model ({type(self.model).__name__}) runs sequentially"
        if self.model.refresh_every:
            return "refresh_every > 0 (periodic refactorisation) runs sequentially"
        reason = why_not_rule(self.rule, self.model.regularisers)
        if reason is not None:
            return f"{reason}; {name} runs sequentially"
        return None

    def set_per_run(self, *, lam: Any = None, beta: Any = None) -> None:
        """Per-run settings of the next batches: ``lam`` ``[R]`` (> 0) and, with a constant
        radius, ``beta`` ``[R]`` (>= 0); ``None`` clears one (the policy's value for every run).
        Run ``r`` of a batch then plays what a sequential policy built with ``lam[r]``,
        ``beta[r]`` plays. Validated here (``ValueError`` naming the argument); their length
        must be the batch's ``R`` at ``reset(seed=[…])``. Values are held in float64 (a float32
        tensor brings its float32 rounding: ``torch.tensor([0.1])`` is not 0.1)."""
        if beta is not None and type(self.rule) is not ConstantBeta:
            raise ValueError(f"beta: per-run β needs a constant radius, not {type(self.rule).__name__}")
        if lam is not None and getattr(self.rule, "reg", None) is not None:
            raise ValueError(f"lam: {type(self.rule).__name__} takes the posterior at its own "
                             f"regulariser {self.rule.reg}; per-run λ is not batched with it")
        new = {}
        for name, value, positive in (("lam", lam, True), ("beta", beta, False)):
            if value is None:
                new[name] = None
                continue
            n = torch.as_tensor(value).numel() if not isinstance(value, (int, float)) else 0
            if n < 1 or torch.as_tensor(value).ndim != 1:
                raise ValueError(f"{name} must be a 1-D sequence or tensor [R] of per-run values")
            new[name] = check_run_values(name, value, n, positive=positive, dtype=torch.float64)
        self.per_run = new

    def _prepare_batch(self, seeds: list[int]) -> dict[str, Tensor | None]:
        """The per-run λ / β of :meth:`set_per_run` for ``R = len(seeds)`` runs (checked)."""
        settings = check_run_lengths(self.per_run, len(seeds))
        if settings["lam"] is not None and why_not_per_run_lam(self.rule) is not None:
            raise ValueError(f"lam: {why_not_per_run_lam(self.rule)}")
        return settings

    def _begin_batch(self, seeds: list[int], settings: dict[str, Tensor | None]) -> None:
        lam = settings["lam"] if settings["lam"] is not None else self.lam
        self.batched = BatchedExactKernelRidge(self.model.kernel, lam, len(seeds), dtype=self.dtype,
                                               device=self.device,
                                               cache_candidates=self.model.cache_candidates)
        self.run_streams = RunStreams.from_seeds(seeds)
        self._batch_settings = settings

    def _leave_batch(self) -> None:
        if "batched" in self._modules:
            del self.batched
        self.run_streams = None
        self._batch_beta = None
        self._batch_diag = None

    def _batch_bounds(self, cand: Tensor, which: str = "both") -> tuple[Tensor, Tensor | None]:
        """``(UCB, LCB)`` ``[R, A]`` of checked candidates ``[R, A, d]`` (``which="ucb"``: the
        LCB may be ``None``, CMM then skips its search; ``"argmax"``: ``(index [R], None)``)."""
        model = self.batch_model
        assert model is not None
        beta = self._batch_settings["beta"]
        ucb, lcb, diag = batched_bounds(self.rule, model, cand, self.t + 1,
                                        None if beta is None else beta.to(cand), which=which,
                                        per_run_lam=self._batch_settings["lam"] is not None)
        set_plain(self, "_batch_beta", diag.get("beta"))   # (plain attributes: no module checks)
        set_plain(self, "_batch_diag", diag)
        return ucb, lcb

    def _check_batch(self, candidates: Any) -> Tensor:
        assert self.run_streams is not None
        return check_batched_candidates("candidates", candidates, self.run_streams.n_runs,
                                        dtype=self.dtype, device=self.device, dim=self.dim)

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of candidates ``[A, d]``; in batched mode ``[R, A]`` of ``[R, A, d]``."""
        if self.run_streams is None:
            return super().forward(candidates)
        return self._batch_bounds(self._check_batch(candidates))[0]

    def bounds(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(UCB, LCB)``, ``[A]`` each (``[R, A]`` in batched mode)."""
        if self.run_streams is None:
            return super().bounds(candidates)
        return self._batch_bounds(self._check_batch(candidates))

    def select(self, candidates: Any) -> Any:
        """One index (single run), or a ``LongTensor [R]`` for candidates ``[R, A, d]``: each
        run's UCB argmax (first index on ties), uniform from its own stream in the warm-up."""
        if self.run_streams is None:
            if self._lean_ok():  # the same step without its layers (policies.lean_step)
                index = self._fused_select(candidates)
                return index if index is not None else self._lean_select(candidates)
            return super().select(candidates)
        cand = self._check_batch(candidates)
        if self.t < self.n_warmup:
            index = self.warmup_index
            if index is None:
                return self.run_streams.randint(cand.shape[1]).to(self.device, non_blocking=True)
            if index >= cand.shape[1]:
                raise ValueError(f"warmup_index {index} is out of range for {cand.shape[1]} "
                                 f"candidates")
            return torch.full((cand.shape[0],), index, dtype=torch.long, device=self.device)
        with torch.no_grad():   # (the UCB argmax in one compiled call where it qualifies)
            return self._batch_bounds(cand, "argmax")[0]

    def update(self, x: Any, reward: Any) -> None:
        """Single run: as before. Batch: ``x [R, d]`` and ``reward [R]``, both checked before
        any run's state changes (``ValueError`` naming the argument)."""
        model = self.batch_model
        if self.run_streams is None or model is None:
            chosen = self._lean_choice  # the fused step's choice, else the lean step's
            if chosen is None or not (self._fused_update(x, reward, chosen)
                                      or self._lean_update(x, reward)):
                super().update(x, reward)
            return
        n = self.run_streams.n_runs
        xv = check_batch_points("x", x, n, dtype=self.dtype, device=self.device, dim=self.dim)
        y = check_batch_rewards("reward", reward, n, dtype=self.dtype, device=self.device)
        model.append(xv, y, validate=False)
        self.dim = xv.shape[1]
        self.t += 1

    def _fused_select(self, candidates: Any) -> int | None:
        """The single-run ``select`` after the warm-up as one compiled call (the model's
        ``fused_select``: float64 CPU contiguous ``[A, d]``, finite, checked there) for a rule
        with a closed form (``ucb_form``), the choice recorded as the lean step records it;
        ``None`` (nothing recorded): the lean step runs."""
        if self.t < self.n_warmup or type(candidates) is not Tensor or candidates.requires_grad \
                or self.refit_offset:
            return None
        model = self._modules["model"]
        fused = getattr(model, "fused_select", None)
        if fused is None or candidates.ndim != 2 or candidates.shape[1] != self.dim:
            return None
        rule, t = self.rule, self.t + 1
        index = fused(candidates, lambda: ucb_form(rule, model, candidates.shape[0], t))
        if index is not None:
            if self._choice is not None:
                set_plain(self, "_choice", None)
            set_plain(self, "_lean_choice", chosen_row(candidates, index))
        return index

    def _fused_update(self, x: Any, reward: Any, chosen: tuple[Tensor, int, int]) -> bool:
        """The single-run ``update`` of the row :meth:`_fused_select` chose as one compiled call
        (the model's ``fused_append``); ``False`` (nothing done) for any other point or step."""
        if not is_chosen_row(x, chosen) or self.refit_offset:
            return False
        fused = getattr(self._modules["model"], "fused_append", None)
        if fused is None or not fused(x, reward, (chosen[0], chosen[1])):
            return False
        set_plain(self, "_lean_choice", None)
        if self.dim is None:
            self.dim = x.shape[0]
        set_plain(self, "t", self.t + 1)
        return True

    def diagnostics(self) -> dict[str, Any]:
        """As before; in batched mode ``n`` and the rule's numbers per run (tensors ``[R]``:
        ``beta`` of a radius rule, ``r2`` and ``log_alpha_ratio`` of DMM and CMM)."""
        model = self.batch_model
        if self.run_streams is None or model is None:
            return super().diagnostics()
        diag = getattr(self, "_batch_diag", None)
        if diag is None:   # before the first batched bounds, as the sequential rule says
            return {"n": float(model.n), **({"beta": float("nan")}
                                            if isinstance(self.rule, RadiusRule) else {})}
        return {"n": float(model.n), **diag}

    def _extra_state(self) -> dict[str, Any]:
        out = dict(super()._extra_state())
        out["per_run"] = dict(self.per_run)
        model = self.batch_model
        if self.run_streams is None or model is None:
            out["batch"] = None
            return out
        out["batch"] = {"rng": self.run_streams.states(),
                        "lam": model.lam.detach().cpu(), "settings": dict(self._batch_settings)}
        return out

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        """Restores the batch: an empty batched model of the right ``R`` is installed here, its
        buffers load right after (children load after their parent's extra state)."""
        super()._set_extra_state(state)
        self.per_run = dict(state.get("per_run") or {"lam": None, "beta": None})
        batch = state.get("batch")
        self._leave_batch()
        if batch is None:
            return
        streams = RunStreams.from_states(batch["rng"])
        self.batched = BatchedExactKernelRidge(self.model.kernel, batch["lam"], streams.n_runs,
                                               dtype=self.dtype, device=self.device,
                                               cache_candidates=self.model.cache_candidates)
        self.run_streams = streams
        self._batch_settings = dict(batch["settings"])


LEAN_FORWARDS.add(KernelUCB.forward)


class GPUCB(KernelUCB):
    """GP-UCB / CGP-UCB: same model, β multiplies the GP posterior sd.

    ``beta`` defaults to IGP-UCB's radius (Chowdhury & Gopalan 2017) built from ``norm_bound``,
    ``noise_std``, ``delta`` and ``eta`` with the model regulariser ``λ = 1 + η``; pass a float
    for a constant radius or any other rule (e.g. :class:`~torchbandits.confidence.SrinivasBeta`).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import GPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = GPUCB(make_kernel("rbf", 0.2), noise_std=0.1, norm_bound=1.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
    """

    default_variance: Variance = "gp"

    def __init__(
        self,
        kernel: Kernel,
        lam: float | None = None,
        beta: float | ConfidenceRule | None = None,
        *,
        norm_bound: float = 1.0,
        noise_std: float = 0.1,
        delta: float = 0.01,
        eta: float = 0.01,
        **kwargs: Any,
    ) -> None:
        if beta is None:
            beta = IGPBeta(norm_bound, noise_std, delta=delta, eta=eta)
            lam = 1.0 + eta if lam is None else lam
        super().__init__(kernel, 1.0 if lam is None else lam, beta, variance="gp", **kwargs)

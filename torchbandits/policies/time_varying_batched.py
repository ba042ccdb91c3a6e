"""Batched R-GP-UCB and SW-GP-UCB (Zhou & Shroff 2021, Algorithms 1 and 2): ``R`` runs as one
tensor program, run ``r`` playing what the sequential policy reset with ``seed=s_r`` plays.

``reset(seed=[s_1, …, s_R])`` starts a batch on a
:class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` (R-GP-UCB) or a
:class:`~torchbandits.models.batched_window.BatchedWindowKernelRidge` (SW-GP-UCB);
``select(candidates [R, A, d])`` returns a ``LongTensor [R]``; ``update(x [R, d], reward [R])``
appends to every run and then forgets as the algorithm does. Every run holds ``min(t, w)``
points (SW-GP-UCB) or ``t mod H`` points (R-GP-UCB, all runs reset after the rounds
``H, 2H, …``), so the state keeps one shape.

The width ``β_t`` is the sequential rule's, per run ``[R]``:

* a constant β (:class:`~torchbandits.confidence.ConstantBeta`; per-run values by
  :meth:`BatchedTimeVaryingMixin.set_per_run`);
* :class:`~torchbandits.confidence.time_varying.RestartBeta` (Lemma 1) and
  :class:`~torchbandits.confidence.time_varying.WindowBeta` (Lemma 2) with a γ provider: γ
  depends only on the round and the number of points, the same in every run, so the rule's own
  ``beta_at`` gives the one β of all runs; with ``gamma="realised"`` (``½ log det(I + K_r/λ)``,
  run by run) ``beta_at`` is evaluated per run on that run's log-det.

Ties of the UCB (every candidate ties on the prior: round 1 and, for R-GP-UCB, the first round of
every block) are broken as the sequential ``tie_break``: ``"first"`` is the argmax, ``"random"``
takes in every tied run its generator's next 32-bit output, as the sequential ``randint`` does,
from outputs drawn ahead (:class:`~torchbandits.policies.batched_tie_break.RunTieDraws`): no
host read in a round.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor

from ..batching import (
    RunStreams,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
    to_device,
)
from ..confidence import ConstantBeta
from ..confidence.time_varying import RestartBeta, WindowBeta
from ..models import ExactKernelRidge
from ..models.batched_exact import BatchedExactKernelRidge, check_run_values
from ..models.batched_window import BatchedWindowKernelRidge
from ..models.window import SlidingWindowKernelRidge
from .batch_mode import BatchModeMixin, check_run_lengths
from .batched_tie_break import RANGE_32, RunTieDraws

__all__ = [
    "TV_BATCHED_RULES",
    "BatchedRestartMixin",
    "BatchedTimeVaryingMixin",
    "BatchedWindowMixin",
]

#: the confidence rules whose width the batched time-varying policies compute
TV_BATCHED_RULES = (ConstantBeta, RestartBeta, WindowBeta)


class _RunLogDet:
    """A model view for a rule's ``beta_at``: ``n`` and a host ``log_det`` (a Python float)."""

    def __init__(self, n: int, log_det: float) -> None:
        self.n = n
        self._log_det = log_det

    def log_det(self, reg: float | None = None) -> float:
        return self._log_det


class _GammaTable:
    """A γ provider's values ``γ(0..L)`` read once, on the host, when the batch starts: the
    rounds then look them up (no tensor is read inside a round); beyond ``L`` (R-GP-UCB without
    a period) the provider is asked, once per new index."""

    def __init__(self, provider: Any, upto: int) -> None:
        self.provider = provider
        self.values = [float(provider(i)) for i in range(upto + 1)]

    def __call__(self, index: int) -> float:
        while index >= len(self.values):
            self.values.append(float(self.provider(len(self.values))))
        return self.values[index]


def _host_rule(rule: Any, policy: Any) -> Any:
    """``rule`` for the batched rounds: a γ provider's table built now (see :class:`_GammaTable`);
    the rule itself for a constant β or the realised γ."""
    if type(rule) is ConstantBeta or rule.gamma == "realised":
        return rule
    length = getattr(policy, "period", None) or getattr(policy, "window", None) or 0
    out = copy.copy(rule)
    out.gamma = _GammaTable(rule.gamma, int(length) + 1)
    return out


def _realised_beta(rule: Any, n: int, t: int, log_det: Tensor) -> Tensor:
    """The width of ``rule`` (Zhou & Shroff 2021, Lemmas 1–2) at the realised γ_r = ½ log det
    ``[R]`` of every run, on the device: ``β_r = s·(B + a·sqrt(2γ_r + c))`` with ``a = σ/√λ``
    (``mode="lemma"``) or ``σ`` (``"igp_ucb"``); ``c`` is read off the rule's own β at γ = 0
    (host arithmetic), so the confidence term of the rule is not written twice."""
    s, b = rule.beta_scale, rule.norm_bound
    a = rule.noise_std / math.sqrt(rule.lam) if rule.mode == "lemma" else rule.noise_std
    if a == 0.0:
        return log_det.new_full(log_det.shape, rule.beta_at(_RunLogDet(n, 0.0), t))
    root_c = (rule.beta_at(_RunLogDet(n, 0.0), t) / s - b) / a
    return s * (b + a * torch.sqrt(log_det + root_c * root_c))


class BatchedTimeVaryingMixin(BatchModeMixin):
    """Batched mode of a time-varying UCB (module docstring). Subclasses implement
    :meth:`_batch_forget` (what the algorithm drops after an update) and may extend
    :meth:`why_not_batched` and :meth:`_new_batch_model`."""

    model: Any
    rule: Any
    tie_break: str
    t: int
    n_warmup: int
    dim: int | None
    dtype: torch.dtype
    device: torch.device
    lam: float
    refit_every: int
    tie_draws: RunTieDraws | None = None

    _sequential_model = ExactKernelRidge

    # ---------------------------------------------------------------- capability
    def why_not_batched(self) -> str | None:
        """``None`` if this policy can step a batch of runs, else the reason."""
        name = type(self).__name__
        if type(self.rule) not in TV_BATCHED_RULES:
            return (f"{type(self.rule).__name__} has no batched width (batched: constant β, "
                    f"RestartBeta, WindowBeta); {name} runs sequentially")
        if getattr(self, "refit_every", 0):
            return "marginal-likelihood refits (refit_every > 0) run sequentially"
        if type(self.model) not in (ExactKernelRidge, SlidingWindowKernelRidge):
            return f"a custom model ({type(self.model).__name__}) runs sequentially"
        if getattr(self.model, "removal", "rank_one") != "rank_one":
            return "removal='refactorise' runs sequentially"
        if self.model.refresh_every:
            return "refresh_every > 0 (periodic refactorisation) runs sequentially"
        if len(self.model.regularisers) > 1:
            return (f"{type(self.rule).__name__} takes the posterior at a second regulariser "
                    f"{self.model.regularisers[1:]} (not batched)")
        return None

    def set_per_run(self, *, lam: Any = None, beta: Any = None) -> None:
        """Per-run settings of the next batches, with a constant radius only: ``lam`` ``[R]``
        (> 0) and ``beta`` ``[R]`` (>= 0); ``None`` clears one. Run ``r`` then plays what the
        sequential policy built with ``lam[r]`` and ``beta=beta[r]`` plays (the theory widths
        take γ and the posterior at the rule's own λ, so they keep one λ). Values are held in
        float64; ``ValueError`` naming the argument otherwise."""
        if (lam is not None or beta is not None) and type(self.rule) is not ConstantBeta:
            arg = "beta" if beta is not None else "lam"
            raise ValueError(f"{arg}: per-run values need a constant radius, not "
                             f"{type(self.rule).__name__}")
        new: dict[str, Tensor | None] = {}
        for name, value, positive in (("lam", lam, True), ("beta", beta, False)):
            if value is None:
                new[name] = None
                continue
            if isinstance(value, (int, float)) or torch.as_tensor(value).ndim != 1 \
                    or torch.as_tensor(value).numel() < 1:
                raise ValueError(f"{name} must be a 1-D sequence or tensor [R] of per-run values")
            new[name] = check_run_values(name, value, len(value), positive=positive)
        self.per_run = new

    # ---------------------------------------------------------------- start / leave a batch
    def _new_batch_model(self, lam: Any, n_runs: int) -> BatchedExactKernelRidge:
        return BatchedExactKernelRidge(self.model.kernel, lam, n_runs, dtype=self.dtype,
                                       device=self.device,
                                       cache_candidates=self.model.cache_candidates)

    def _prepare_batch(self, seeds: list[int]) -> tuple[dict[str, Tensor | None], Any]:
        """The per-run λ / β for ``R = len(seeds)`` runs (checked) and the rounds' rule."""
        per_run = getattr(self, "per_run", {"lam": None, "beta": None})
        return check_run_lengths(per_run, len(seeds)), _host_rule(self.rule, self)

    def _begin_batch(self, seeds: list[int], prepared: tuple[dict[str, Tensor | None], Any]) -> None:
        settings, self._batch_rule = prepared
        lam = settings["lam"] if settings.get("lam") is not None else self.lam
        self.batched = self._new_batch_model(lam, len(seeds))
        self.run_streams = RunStreams.from_seeds(seeds, device=self.device)
        self._batch_settings = settings

    def _leave_batch(self) -> None:
        if "batched" in self._modules:  # type: ignore[attr-defined]
            del self.batched
        self.run_streams = None
        self.tie_draws = None
        self._batch_beta = None

    # ---------------------------------------------------------------- scoring
    def _batch_radius(self, model: BatchedExactKernelRidge) -> Tensor:
        """β_t of every run ``[R]`` at round ``t + 1`` (module docstring)."""
        rule, t = self.rule, self.t + 1
        if type(rule) is ConstantBeta:
            beta = self._batch_settings.get("beta")
            return beta if beta is not None else model.lam.new_full((model.n_runs,), rule.beta)
        if rule.gamma != "realised":
            return model.lam.new_full((model.n_runs,), self._batch_rule.beta_at(model, t))
        return _realised_beta(rule, model.n, t, model.log_det().to(torch.float64))

    def _batch_bounds(self, cand: Tensor) -> tuple[Tensor, Tensor]:
        """``(UCB, LCB)`` ``[R, A]`` of checked candidates ``[R, A, d]``."""
        model = self.batch_model
        assert model is not None
        mean, var = model.mean_var(cand, self.rule.variance, validate=False)
        beta = self._batch_radius(model).to(var)
        self._batch_beta = beta
        width = beta[:, None] * torch.sqrt(var)
        return mean + width, mean - width

    def _check_batch(self, candidates: Any) -> Tensor:
        return check_batched_candidates("candidates", candidates, self.run_streams.n_runs,
                                        dtype=self.dtype, device=self.device, dim=self.dim)

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of candidates ``[A, d]``; in batched mode ``[R, A]`` of ``[R, A, d]``."""
        if getattr(self, "run_streams", None) is None:
            return super().forward(candidates)  # type: ignore[misc,no-any-return]
        return self._batch_bounds(self._check_batch(candidates))[0]

    def bounds(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(UCB, LCB)``, ``[A]`` each (``[R, A]`` in batched mode)."""
        if getattr(self, "run_streams", None) is None:
            return super().bounds(candidates)  # type: ignore[misc,no-any-return]
        return self._batch_bounds(self._check_batch(candidates))

    def select(self, candidates: Any) -> Any:
        """One index (single run), or a ``LongTensor [R]`` for candidates ``[R, A, d]``."""
        if getattr(self, "run_streams", None) is None:
            return super().select(candidates)  # type: ignore[misc]
        cand = self._check_batch(candidates)
        n_runs, n_cand = cand.shape[0], cand.shape[1]
        if self.t < self.n_warmup:
            index = self.warmup_index  # type: ignore[attr-defined]
            if index is None:
                if self.tie_draws is not None:
                    self._sync_tie_draws()
                return to_device(self.run_streams.randint(n_cand), self.device)
            if index >= n_cand:
                raise ValueError(f"warmup_index {index} is out of range for {n_cand} candidates")
            return torch.full((n_runs,), index, dtype=torch.long, device=self.device)
        with torch.no_grad():
            scores = self._batch_bounds(cand)[0]
        best = torch.argmax(scores, dim=1)
        if self.tie_break == "first":
            return best
        top = scores.gather(1, best[:, None])
        tied = scores >= top - 1e-12 * torch.clamp(top.abs(), min=1.0)
        if n_cand < RANGE_32:
            if self.tie_draws is None:   # the warm-up's draws end here: close their chunk
                self.tie_draws = RunTieDraws(self.run_streams.sync(), device=self.device)
            return self.tie_draws.choose(best, tied)
        gens = self._sync_tie_draws()    # 2^28 candidates or more: a 64-bit draw, on the host
        for r in (tied.sum(1) > 1).nonzero()[:, 0].tolist():
            ties = torch.nonzero(tied[r])[:, 0]
            best[r] = ties[int(torch.randint(ties.numel(), (1,), generator=gens[r]))]
        return best

    def _sync_tie_draws(self) -> list[torch.Generator]:
        """Every run's generator at exactly the draws used so far (tie-breaks included)."""
        if self.tie_draws is not None:
            self.tie_draws.sync()
            self.tie_draws = None
        return self.run_streams.sync()

    # ---------------------------------------------------------------- updates
    def _batch_forget(self, model: BatchedExactKernelRidge, round_t: int) -> None:
        raise NotImplementedError

    def update(self, x: Any, reward: Any) -> None:
        """Single run: as before. Batch: ``x [R, d]`` and ``reward [R]``, both checked before
        any run's state changes (``ValueError`` naming the argument)."""
        model = self.batch_model
        if getattr(self, "run_streams", None) is None or model is None:
            super().update(x, reward)  # type: ignore[misc]
            return
        n = self.run_streams.n_runs
        xv = check_batch_points("x", x, n, dtype=self.dtype, device=self.device, dim=self.dim)
        y = check_batch_rewards("reward", reward, n, dtype=self.dtype, device=self.device)
        model.append(xv, y, validate=False)
        self._batch_forget(model, self.t + 1)
        self.dim = xv.shape[1]
        self.t += 1

    def diagnostics(self) -> dict[str, Any]:
        """As before; in batched mode ``n`` and ``beta`` per run (``beta`` a tensor ``[R]``)."""
        model = self.batch_model
        if getattr(self, "run_streams", None) is None or model is None:
            return super().diagnostics()  # type: ignore[misc,no-any-return]
        beta = self._batch_beta if self._batch_beta is not None else float("nan")
        return {"n": float(model.n), "beta": beta}

    # ---------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        out = dict(super()._extra_state())  # type: ignore[misc]
        out["per_run"] = dict(getattr(self, "per_run", {"lam": None, "beta": None}))
        model = self.batch_model
        if getattr(self, "run_streams", None) is None or model is None:
            out["batch"] = None
            return out
        self._sync_tie_draws()
        out["batch"] = {"rng": self.run_streams.states(),
                        "lam": model.lam.detach().cpu(), "settings": dict(self._batch_settings)}
        return out

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        """Restores the batch: an empty batched model of the right ``R`` is installed here, its
        buffers load right after (children load after their parent's extra state)."""
        super()._set_extra_state(state)  # type: ignore[misc]
        self.per_run = dict(state.get("per_run") or {"lam": None, "beta": None})
        batch = state.get("batch")
        self._leave_batch()
        if batch is None:
            return
        streams = RunStreams.from_states(batch["rng"], device=self.device)
        self.batched = self._new_batch_model(batch["lam"], streams.n_runs)
        self.run_streams = streams
        self._batch_settings = dict(batch["settings"])
        self._batch_rule = _host_rule(self.rule, self)
        self._batch_beta = None
        self.tie_draws = None


class BatchedRestartMixin(BatchedTimeVaryingMixin):
    """R-GP-UCB's batch: every run's posterior is emptied after the rounds ``H, 2H, …``."""

    period: int | None

    def _batch_forget(self, model: BatchedExactKernelRidge, round_t: int) -> None:
        if self.period is not None and round_t % self.period == 0:
            model.reset()


class BatchedWindowMixin(BatchedTimeVaryingMixin):
    """SW-GP-UCB's batch: every run drops its oldest point once it holds more than ``w``."""

    window: int | None

    def _new_batch_model(self, lam: Any, n_runs: int) -> BatchedExactKernelRidge:
        return BatchedWindowKernelRidge(
            self.model.kernel, lam, n_runs, dtype=self.dtype, device=self.device,
            cache_candidates=self.model.cache_candidates,
            carry_cache=isinstance(self.model, SlidingWindowKernelRidge),
            refresh_cache_every=getattr(self.model, "refresh_cache_every", 256))

    def _batch_forget(self, model: BatchedExactKernelRidge, round_t: int) -> None:
        if self.window is not None and model.n > self.window:
            model.remove_oldest(model.n - self.window)  # type: ignore[attr-defined]

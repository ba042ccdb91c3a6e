"""The policy contract (docs/design.md): ``forward`` → scores, ``select``, ``update``, ``reset``.

Every policy is an ``nn.Module`` whose state lives in registered buffers (and in
``get_extra_state`` for counters and the generator), so ``.to(device)``, ``.double()`` and
``state_dict()``/``load_state_dict()`` work, and a policy reloaded mid-run continues with identical
choices. Randomness comes from the policy's own ``torch.Generator`` (kept on the CPU so seeded runs
choose the same on every device; only scalars and small vectors are drawn from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..buffers import ResizableModule
from ..kernels import check_kernel
from ..validation import as_matrix, as_point, as_scalar_reward, check_int, require_finite, trusted

__all__ = ["IndexPolicy", "Policy", "RuleUCB", "check_model"]

POSTERIOR_METHODS = ("mean_var", "log_det", "append", "reset")


def check_model(model: object, *, lam: float | None = None, rule: Any = None,
                dtype: torch.dtype | None = None, needs: Sequence[str] = ()) -> nn.Module:
    """Validate a posterior model handed to a policy (``model=``) and return it unchanged.

    The contract (docs/design.md, "the model= contract"): ``model`` is an ``nn.Module`` with a
    usable GPyTorch ``kernel`` and the methods ``mean_var``, ``log_det``, ``append``, ``reset``
    (plus ``needs``, e.g. ``remove_oldest`` for a sliding window); it holds no data yet
    (``model.n == 0``, the policy owns it from round 1); its ``lam`` equals the policy's λ; its
    dtype is the policy's; and it maintains every regulariser ``rule.required_regularisers(λ)``
    asks for. Raises ``ValueError`` naming ``model`` otherwise; never modifies ``model``.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module posterior model, got {type(model).__name__}")
    name = type(model).__name__
    missing = [m for m in (*POSTERIOR_METHODS, *needs) if not callable(getattr(model, m, None))]
    if missing:
        raise ValueError(f"model ({name}) lacks the method(s) {missing} this policy calls")
    try:
        check_kernel(getattr(model, "kernel", None))
    except ValueError as err:
        raise ValueError(f"model ({name}) needs a usable kernel: {err}") from None
    if int(model.n) != 0:
        raise ValueError(f"model ({name}) must be empty when handed to a policy, holds {int(model.n)} points")
    if lam is not None and float(model.lam) != float(lam):
        raise ValueError(f"model ({name}) has lam={float(model.lam)!r} but the policy uses lam={lam!r}")
    model_dtype = getattr(model, "dtype", None)
    if dtype is not None and model_dtype is not None and model_dtype != dtype:
        raise ValueError(f"model ({name}) has dtype {model_dtype} but the policy uses {dtype}")
    if rule is not None and lam is not None:
        held = set(getattr(model, "regularisers", ()) or ())
        lacking = [r for r in rule.required_regularisers(lam) if r not in held]
        if lacking:
            raise ValueError(f"model ({name}) does not maintain the regularisers {lacking} that "
                             f"{type(rule).__name__} needs (it holds {sorted(held)})")
    return model


class Policy(ResizableModule):
    """Base class of every bandit policy.

    Subclasses implement :meth:`forward` (scores of candidates ``[A, d] → [A]``),
    :meth:`_update` (state change after validation) and :meth:`_reset`. ``n_warmup`` rounds are
    played uniformly at random first (the prior UCB is flat; the reference codes of Zenati et al.
    2022 and of Flynn & Reeb 2024 play one random round first).
    """

    def __init__(self, *, seed: int = 0, n_warmup: int = 1, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        if n_warmup < 0:
            raise ValueError(f"n_warmup must be >= 0, got {n_warmup}")
        self.n_warmup = int(n_warmup)
        self.seed = int(seed)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.seed)
        self.register_buffer("_probe", torch.zeros((), dtype=dtype, device=device))
        self._spec = (self._probe.dtype, self._probe.device)
        self.t = 0  # number of updates so far; the next select is round t + 1
        self.dim: int | None = None
        self._warmup_index: int | None = None
        # (candidates, index, copy of the row) of the last select's argmax (see RuleUCB)
        self._choice: tuple[Tensor, int, Tensor] | None = None

    @property
    def warmup_index(self) -> int | None:
        """Candidate index played in the warm-up rounds (``None``: uniform at random, the default).
        Seed 000's reference code plays ``RandomState(123).choice(10) = 2`` first for every seed
        (on Bump that is action 0.82, 0.01 from the best; see the README)."""
        return self._warmup_index

    @warmup_index.setter
    def warmup_index(self, index: int | None) -> None:
        self._warmup_index = None if index is None else check_int("warmup_index", index, 0)

    def warmup_choice(self, cand: Tensor) -> int:
        """The warm-up round's choice among ``cand`` (``warmup_index`` or uniform)."""
        if self._warmup_index is not None:
            if self._warmup_index >= cand.shape[0]:
                raise ValueError(f"warmup_index {self._warmup_index} is out of range for "
                                 f"{cand.shape[0]} candidates")
            return self._warmup_index
        return int(torch.randint(cand.shape[0], (1,), generator=self.generator))

    # ---------------------------------------------------------------- dtype / device / state
    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype the policy computes in (follows ``.to(...)``)."""
        return self._spec[0]

    @property
    def device(self) -> torch.device:
        """Device of the policy's state (follows ``.to(...)``)."""
        return self._spec[1]

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super()._apply(fn, *args, **kwargs)
        self._spec = (self._probe.dtype, self._probe.device)  # read per call without a buffer lookup
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return {"t": self.t, "dim": self.dim, "rng": self.generator.get_state(),
                "seed": self.seed, "warmup_index": self._warmup_index, **self._extra_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.dim = state["dim"]
        self.seed = int(state["seed"])
        self.generator.set_state(state["rng"])
        self._warmup_index = state.get("warmup_index")
        self._set_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        """Further picklable state of a subclass (counters, flags)."""
        return {}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        """Reseed the policy's generator."""
        self.seed = int(seed)
        self.generator.manual_seed(self.seed)

    # ---------------------------------------------------------------- contract
    def check_candidates(self, candidates: Any) -> Tensor:
        """Candidates as a finite ``[A, d]`` tensor on the policy's device/dtype."""
        return as_matrix("candidates", candidates, dtype=self.dtype, device=self.device,
                         dim=self.dim)

    def forward(self, candidates: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def select(self, candidates: Any) -> int:
        """Index of the candidate to play this round (argmax of :meth:`forward`, first on ties;
        uniform during the warm-up rounds). The candidates are validated once here."""
        if self._choice is not None:
            self._choice = None
        cand = self.check_candidates(candidates)
        if self.t < self.n_warmup:
            return self.warmup_choice(cand)
        with torch.no_grad(), trusted(cand):
            scores = self(cand)
        index = int(torch.argmax(scores))
        self._chose(cand, index)
        return index

    def _chose(self, cand: Tensor, index: int) -> None:
        """Hook: ``select`` chose row ``index`` of the validated ``cand`` by its scores (a
        subclass may keep ``self._choice = (cand, index, copy of the row)``: :meth:`update`
        then tells :meth:`_update` whether the played point is that row, see :meth:`played`)."""

    def played(self) -> tuple[Tensor, int] | None:
        """Inside :meth:`_update`: ``(candidates, index)`` of the last ``select`` if the point
        being recorded is that chosen row (checked equal), else ``None``."""
        choice = self._choice
        return None if choice is None else (choice[0], choice[1])

    def update(self, x: Any, reward: Any) -> None:
        """Record that ``x`` (the played joint feature vector ``[d]``) returned ``reward``.

        Both are validated before any state changes.
        """
        choice = self._choice
        xv = as_point("x", x, dtype=self.dtype, device=self.device, dim=self.dim, finite=False)
        if choice is None or not torch.equal(xv, choice[2]):
            if choice is not None:
                self._choice = None
            require_finite("x", xv)  # the chosen row was finite; anything else is checked here
        r = as_scalar_reward("reward", reward)
        try:
            with torch.no_grad(), trusted(xv):
                self._update(xv, r)
        finally:
            if self._choice is not None:
                self._choice = None
        if self.dim is None:
            self.dim = xv.shape[0]
        self.t += 1

    def _update(self, x: Tensor, reward: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self, seed: int | None = None) -> None:
        """Forget all observations (and reseed if ``seed`` is given)."""
        self.t = 0
        self._reset()
        if seed is not None:
            self.manual_seed(seed)

    def _reset(self) -> None:
        pass

    def diagnostics(self) -> dict[str, float]:
        """Numbers worth logging each round (dictionary size, β, restarts, …)."""
        return {}


class IndexPolicy(Policy):
    """A policy that plays the argmax of an index (UCB) computed by :meth:`forward`."""


class RuleUCB(IndexPolicy):
    """An index policy on a posterior ``model`` with a confidence ``rule``: the UCB is
    ``rule.bounds(model, candidates, t + 1)[0]``; an update appends to the model. Subclasses set
    ``self.model`` and ``self.rule`` (KernelUCB, the time-varying UCBs, the Nyström UCBs)."""

    model: Any
    rule: Any

    @property
    def lam(self) -> float:
        """The model's ridge regulariser λ."""
        return float(self.model.lam)

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB of every candidate ``[A]`` for the next round ``t + 1`` (the rule's ``ucb`` when
        it has one: no lower bound computed)."""
        cand = self.check_candidates(candidates)
        with trusted(cand):
            ucb = getattr(self.rule, "ucb", None)
            if ucb is not None:
                return ucb(self.model, cand, self.t + 1)
            return self.rule.bounds(self.model, cand, self.t + 1)[0]

    def bounds(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(UCB, LCB)`` of every candidate."""
        cand = self.check_candidates(candidates)
        with trusted(cand):
            return self.rule.bounds(self.model, cand, self.t + 1)

    def _chose(self, cand: Tensor, index: int) -> None:
        # an exact model reuses the scoring of the played candidate in the next append
        if getattr(self.model, "reused_column", None) is not None:
            self._choice = (cand, index, cand[index].clone())

    def _update(self, x: Tensor, reward: float) -> None:
        played = self.played()
        if played is not None:
            self.model.append(x, reward, column=played)
        else:
            self.model.append(x, reward)

    def _reset(self) -> None:
        self.model.reset()

    def diagnostics(self) -> dict[str, float]:
        return {"n": float(self.model.n), **self.rule.diagnostics()}

    def extra_repr(self) -> str:
        return f"lam={self.lam}, rule={self.rule!r}"

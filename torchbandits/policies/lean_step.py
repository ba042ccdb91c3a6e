"""The single-run step of :class:`~torchbandits.policies.KernelUCB` without its layers.

``select`` of a policy is ``check → forward (module call, refit bookkeeping, the rule) → argmax``
and ``update`` is ``validate → refit offset → compare with the chosen row → model append``: some
ten Python calls and, per step, a copy of the chosen row and a comparison with it. At the sizes
of the papers' experiments (t ≤ 200 points, 100 candidates) a step costs tens of microseconds of
arithmetic, so these layers are a large share of it. :class:`LeanStep` does the same two steps
directly, for the classes whose steps are KernelUCB's (no override of the pieces it skips, no
forward hooks, no refits):

* ``select``: the candidates are validated once; where the model scores a rule's bound in one
  compiled call (:meth:`~torchbandits.models.ExactKernelRidge.ucb_argmax` with the rule's
  :func:`~torchbandits.confidence.radii.ucb_form`: the posterior, the bound and its argmax in C,
  no tensor operation) that is the step, else the UCB is the rule's own (``rule.ucb``, or the
  upper bound of ``rule.bounds``) and the argmax is the one host read; the choice is recorded as
  the candidate tensor, the index and the tensor's version counter (no copy,
  :func:`~torchbandits.validation.chosen_row`);
* ``update``: when the played point is that row of that tensor, unmodified
  (:func:`~torchbandits.validation.is_chosen_row`, no tensor operation), it is appended with the
  scoring's column (the exact model's O(n) append); any other point goes through the general
  ``update``, which compares it with the row by value.

The numbers are those of the general path (the same calls to the rule and the model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..buffers import set_plain
from ..confidence.radii import ucb_form
from ..validation import as_scalar_reward, chosen_row, chosen_row_unmodified, is_chosen_row, trusted

__all__ = ["LEAN_FORWARDS", "LeanStep"]

LEAN_FORWARDS: set = set()
"""``forward`` functions whose single-run UCB is ``rule.ucb(model, candidates, t + 1)`` plus the
refit offset (KernelUCB's and the mixture policies'); a subclass with another forward steps
through the general path."""

_STEP_PIECES = frozenset({"select", "update", "_update", "_chose", "played", "check_candidates",
                          "warmup_choice", "__call__", "_call_impl", "_lean_select", "_lean_update"})
_LEAN_TYPES: dict[type, bool] = {}


class LeanStep:
    """Mixin of :class:`~torchbandits.policies.KernelUCB`: see the module docstring."""

    _lean_choice: tuple[Tensor, int, int] | None = None

    def _lean_ok(self) -> bool:
        """Whether this policy's single-run step can take the lean path now."""
        if self.refit_every or self._forward_hooks or self._forward_pre_hooks:  # type: ignore[attr-defined]
            return False
        cls = type(self)
        ok = _LEAN_TYPES.get(cls)
        if ok is None:
            ok = True
            for klass in cls.__mro__:
                if klass.__name__ == "KernelUCB" and klass.__module__.endswith("kernel_ucb"):
                    break
                own = vars(klass)
                if _STEP_PIECES & set(own) or ("forward" in own and own["forward"] not in LEAN_FORWARDS):
                    ok = False
                    break
            _LEAN_TYPES[cls] = ok
        return ok

    def _lean_select(self, candidates: Any) -> int:
        """``select`` of one run (see the module docstring)."""
        if self._choice is not None:  # type: ignore[has-type]
            set_plain(self, "_choice", None)
        if self._lean_choice is not None:
            set_plain(self, "_lean_choice", None)
        cand = self.check_candidates(candidates)  # type: ignore[attr-defined]
        if self.t < self.n_warmup:  # type: ignore[attr-defined]
            return self.warmup_choice(cand)  # type: ignore[attr-defined]
        model = self._modules["model"]  # type: ignore[attr-defined]  # (no nn.Module.__getattr__)
        rule, t = self.rule, self.t + 1  # type: ignore[attr-defined]
        fused = getattr(model, "ucb_argmax", None)
        if fused is not None and not self.refit_offset:  # type: ignore[attr-defined]
            # (outside ``no_grad``: the compiled step does no autograd operation, the model
            # switches it off itself before any torch work)
            with trusted(cand):
                index = fused(cand, lambda: ucb_form(rule, model, cand.shape[0], t))
            if index is not None:
                set_plain(self, "_lean_choice", chosen_row(cand, index))
                return index
        with torch.no_grad(), trusted(cand):
            ucb = getattr(rule, "ucb", None)
            scores = ucb(model, cand, t) if ucb is not None else rule.bounds(model, cand, t)[0]
        offset = self.refit_offset  # type: ignore[attr-defined]
        if offset:
            scores = scores + offset
        index = int(torch.argmax(scores))
        if getattr(model, "reused_column", None) is not None:
            set_plain(self, "_lean_choice", chosen_row(cand, index))
        return index

    def _lean_update(self, x: Any, reward: Any) -> bool:
        """``update`` of one run when ``x`` is the chosen row itself; ``False`` (nothing done,
        the general ``update`` takes over with the choice to compare by value) otherwise."""
        chosen = self._lean_choice
        if chosen is None:
            return False
        set_plain(self, "_lean_choice", None)
        if not is_chosen_row(x, chosen):
            if chosen_row_unmodified(chosen):
                cand, index, _ = chosen
                self._choice = (cand, index, cand[index])
            return False
        r = as_scalar_reward("reward", reward)
        offset = self.refit_offset  # type: ignore[attr-defined]
        if offset:  # (r − 0 is r: checked once)
            r = as_scalar_reward("reward", r - offset)
        with trusted(x):  # (the model's append switches autograd off for its torch work)
            self._modules["model"].append(x, r, column=(chosen[0], chosen[1]))  # type: ignore[attr-defined]
        if self.dim is None:  # type: ignore[attr-defined]
            self.dim = x.shape[0]
        set_plain(self, "t", self.t + 1)  # type: ignore[attr-defined]
        return True

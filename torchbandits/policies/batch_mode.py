"""The batched-mode properties every batched policy shares: :class:`BatchModeMixin`.

A policy in batched mode (``reset(seed=[s_1, …, s_R])``) holds its runs' random streams in one
attribute (``run_streams`` by default: a :class:`~torchbandits.batching.RunStreams`, or any
object with ``n_runs``) and, if it learns, the ``R`` posteriors as the submodule ``batched``.

``reset`` is one template for all of them (:meth:`BatchModeMixin.reset`): it dispatches on the
seed and calls the policy's hooks, and every check of a batch start runs before any state
changes, so a rejected ``reset(seed=[…])`` leaves the policy as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ..batching import check_seeds

__all__ = ["BatchModeMixin", "batch_seeds", "check_run_lengths"]

#: the seeds ``torch.Generator.manual_seed`` takes: ``[-2^63, 2^64)``
SEED_RANGE = (-(1 << 63), 1 << 64)


def batch_seeds(seed: Any) -> list[int]:
    """``seed`` (a sequence or 1-D tensor of ints) as the list of the batch's seeds; a
    ``ValueError`` naming ``seed`` for a string, a bool, a non-integer or an empty sequence,
    and for a seed a ``torch.Generator`` cannot take (outside ``[-2^63, 2^64)``)."""
    if isinstance(seed, (str, bytes)):
        raise ValueError(f"seed: a string is neither a seed nor a sequence of seeds, got {seed!r}")
    seeds = check_seeds(seed)
    low, high = SEED_RANGE
    outside = [s for s in seeds if not low <= s < high]
    if outside:
        raise ValueError(f"seeds must lie in [-2**63, 2**64) (torch.Generator), got {outside}")
    return seeds


def check_run_lengths(settings: Mapping[str, Tensor | None], n_runs: int) -> dict[str, Tensor | None]:
    """A copy of the per-run settings ``{name: values [R] or None}`` (``set_per_run``'s β, λ),
    each checked to hold ``R = n_runs`` values (``ValueError`` naming the setting)."""
    for name, values in settings.items():
        if values is not None and values.shape[0] != n_runs:
            raise ValueError(f"{name} holds {values.shape[0]} per-run values but the batch has "
                             f"R = {n_runs} seeds")
    return dict(settings)


class BatchModeMixin:
    """``reset``, ``batchable``, ``n_runs`` and ``batch_model`` of a batched policy (listed
    before the :class:`~torchbandits.policies.base.Policy` base, whose ``batchable`` is
    ``False``; ``super().reset`` is the base's single-run reset).

    A subclass provides ``why_not_batched()`` (``None`` when it can batch), names the attribute
    holding its per-run streams in ``_batch_streams`` (``None`` outside a batch) and implements
    the hooks of :meth:`reset`: :meth:`_prepare_batch` (every check of a batch start, no state
    change), :meth:`_begin_batch` (install the batch), :meth:`_restart_batch` (``reset()``
    inside a batch) and :meth:`_leave_batch` (drop the per-run state)."""

    #: the attribute that holds the runs' streams in batched mode (``None`` for one run)
    _batch_streams = "run_streams"

    def why_not_batched(self) -> str | None:
        """``None`` if this policy can step a batch of runs, else the reason."""
        return None

    @property
    def batchable(self) -> bool:
        """Whether ``reset(seed=[…])`` can start a batch (see :meth:`why_not_batched`)."""
        return self.why_not_batched() is None

    @property
    def n_runs(self) -> int | None:
        """``R`` in batched mode, ``None`` for a single run."""
        streams = getattr(self, self._batch_streams, None)
        return None if streams is None else int(streams.n_runs)

    @property
    def batch_model(self) -> Any:
        """The posterior of the ``R`` runs in batched mode (the submodule ``batched``), else
        ``None``."""
        return self._modules.get("batched")  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- reset (template)
    def reset(self, seed: int | Sequence[int] | Tensor | None = None) -> None:
        """Forget all observations; an int seeds one run, a sequence of seeds
        ``[s_1, …, s_R]`` starts a batch of ``R`` runs (run ``r`` plays what the single run
        seeded ``s_r`` plays).

        * ``None``: the base reset (``t = 0``, no data); in a batch the runs keep their streams
          and forget their data (:meth:`_restart_batch`).
        * an int (or a 0-d tensor): leave the batch (:meth:`_leave_batch`), reset and reseed.
        * a sequence: the seeds checked, :meth:`why_not_batched`, then :meth:`_prepare_batch`
          (the per-run settings against ``R``) — a ``ValueError`` naming the argument (``seed``,
          ``lam``, ``beta``) changes nothing — then :meth:`_leave_batch`, the base reset and
          :meth:`_begin_batch`.
        """
        if seed is None or isinstance(seed, int) or (isinstance(seed, Tensor) and seed.ndim == 0):
            single = None if seed is None else int(seed)
            if single is not None:
                batch_seeds([single])
                self._leave_batch()
            super().reset(single)  # type: ignore[misc]
            if single is None and self.n_runs is not None:
                self._restart_batch()
            return
        seeds = batch_seeds(seed)
        reason = self.why_not_batched()
        if reason is not None:
            raise ValueError(f"seed: a list of seeds starts a batch, but {reason}")
        prepared = self._prepare_batch(seeds)
        self._leave_batch()
        super().reset(None)  # type: ignore[misc]
        self._begin_batch(seeds, prepared)

    def _prepare_batch(self, seeds: list[int]) -> Any:
        """Every check of a batch of ``R = len(seeds)`` runs beyond the seeds and
        :meth:`why_not_batched` (e.g. per-run β / λ ``[R]``), with no change of state (a
        ``ValueError`` naming the argument); returns what :meth:`_begin_batch` installs."""
        return None

    def _begin_batch(self, seeds: list[int], prepared: Any) -> None:
        """Install a batch of ``R = len(seeds)`` runs, run ``r``'s streams seeded ``seeds[r]``,
        on a single-run policy just reset; ``prepared`` is :meth:`_prepare_batch`'s."""
        raise NotImplementedError

    def _restart_batch(self) -> None:
        """``reset()`` inside a batch, after the base reset: the runs forget their data and keep
        their streams (default: the batched posterior emptied)."""
        model = self.batch_model
        if model is not None:
            model.reset()

    def _leave_batch(self) -> None:
        """Drop the per-run state (default: the submodule ``batched`` and the streams)."""
        if "batched" in self._modules:  # type: ignore[attr-defined]
            del self.batched  # type: ignore[attr-defined]
        setattr(self, self._batch_streams, None)

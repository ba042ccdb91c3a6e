"""The batched-mode properties every batched policy shares: :class:`BatchModeMixin`.

A policy in batched mode (``reset(seed=[s_1, …, s_R])``) holds its runs' random streams in one
attribute (``run_streams`` by default: a :class:`~torchbandits.batching.RunStreams`, or any
object with ``n_runs``) and, if it learns, the ``R`` posteriors as the submodule ``batched``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchModeMixin"]


class BatchModeMixin:
    """``batchable``, ``n_runs`` and ``batch_model`` of a batched policy (listed before the
    :class:`~torchbandits.policies.base.Policy` base, whose ``batchable`` is ``False``).

    A subclass provides ``why_not_batched()`` (``None`` when it can batch) and names the
    attribute holding its per-run streams in ``_batch_streams`` (``None`` outside a batch)."""

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

"""The policy's diagnostics of a batched run, kept on the device and split per run at the end.

:func:`~torchbandits.experiments.simulate_batch` logs ``policy.diagnostics()`` every
``diagnostics_every`` rounds: a dict whose values are per-run tensors ``[R]`` or numbers shared
by all runs. A policy may hand out live buffers (running sums), so each logged round keeps a copy;
the per-run tensors of a round that share one dtype and device are copied by **one** ``stack``
(``[K, R]``, ``K`` keys) instead of one clone per key. At the end, while every logged round had
the same keys and kinds (the usual case), all the rounds' stacks become one ``[T, K, R]`` tensor
read to the host by one copy (``tolist``), already in the per-run order ``[R][K][T]``; other
values are split per run key by key. The lists are those of the per-round split (same floats,
same order); rounds whose keys or kinds change fall back to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["DiagnosticsLog", "per_run"]


def per_run(value: Any, n_runs: int) -> list[float]:
    """A diagnostic as one float per run (a tensor of ``n_runs`` entries, or one number shared by
    all runs)."""
    if isinstance(value, Tensor) and value.numel() == n_runs:
        return [float(v) for v in value.reshape(-1).tolist()]
    return [float(value)] * n_runs


def _stackable(v: Any, n_runs: int) -> bool:
    """A per-run ``[R]`` tensor of real numbers (kept in the round's stack)."""
    return (isinstance(v, Tensor) and v.ndim == 1 and v.shape[0] == n_runs
            and not v.is_complex())


class DiagnosticsLog:
    """The logged rounds' diagnostics of ``n_runs`` runs (:meth:`add` per logged round, no host
    read; :meth:`per_run` at the end: per run, key → one float per logged round)."""

    def __init__(self, n_runs: int) -> None:
        self.n_runs = int(n_runs)
        self.steps: list[int] = []
        self._signature: tuple[Any, ...] | None = None   # of the first round
        self._uniform = True                             # every round has that signature
        #: per round: its keys, the keys in its stack, the stack [K, R] (or None), the others
        self._rounds: list[tuple[tuple[str, ...], tuple[str, ...], Tensor | None,
                                 dict[str, Any]]] = []

    def add(self, step: int, values: Mapping[str, Any]) -> None:
        """Keep the diagnostics ``values`` of round ``step`` (copies of its tensors)."""
        n, runs, tensors = self.n_runs, [], []
        kind: tuple[Any, Any] | None = None
        mixed = False
        for k, v in values.items():
            if _stackable(v, n):
                runs.append(k)
                tensors.append(v)
                if kind is None:
                    kind = (v.dtype, v.device)
                mixed = mixed or kind != (v.dtype, v.device)
        if mixed:   # mixed dtypes or devices: each kept alone
            runs, tensors, kind = [], [], None
        block = torch.stack(tensors) if tensors else None
        others = {k: v.clone() if isinstance(v, Tensor) else v
                  for k, v in values.items() if k not in runs}
        keys, stacked = tuple(values), tuple(runs)
        self._rounds.append((keys, stacked, block, others))
        signature = (keys, stacked, kind)
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            self._uniform = False
        self.steps.append(int(step))

    def per_run(self) -> list[dict[str, list[float]]]:
        """Per run, key → its floats over the logged rounds (one host copy of the stacked
        values while the rounds are uniform)."""
        n = self.n_runs
        out: list[dict[str, list[float]]] = [{} for _ in range(n)]
        if not self._uniform:
            for keys, runs, block, others in self._rounds:   # round by round
                for k in keys:
                    v = others[k] if k in others else block[runs.index(k)]  # type: ignore[index]
                    for r, value in enumerate(per_run(v, n)):
                        out[r].setdefault(k, []).append(value)
            return out
        if self._signature is None:
            return out
        keys, runs, _ = self._signature
        nested: list[Any] = []
        if runs:
            blocks = torch.stack([b for _, _, b, _ in self._rounds])          # [T, K, R]
            if not blocks.is_floating_point():
                blocks = blocks.to(torch.float64)
            nested = blocks.permute(2, 1, 0).tolist()                         # [R][K][T]
        for k in keys:
            if k in runs:
                j = runs.index(k)
                for r in range(n):
                    out[r][k] = nested[r][j]
                continue
            values = [others[k] for _, _, _, others in self._rounds]
            if not any(isinstance(v, Tensor) for v in values):   # numbers shared by all runs
                shared = [float(v) for v in values]
                for r in range(n):
                    out[r][k] = list(shared)
                continue
            columns = [per_run(v, n) for v in values]                         # [T][R]
            for r, values in enumerate(zip(*columns, strict=True)):
                out[r][k] = list(values)
        return out

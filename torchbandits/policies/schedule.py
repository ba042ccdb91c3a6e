"""Replay schedule of ADA-OPKB / ADA-OPNN (Hong, Li & Tewari 2023, Algorithm 4).

For block ``j`` starting at round ``t`` with base length ``E`` the schedule holds the block itself
``(j, [t, t + 2^j E − 1])`` and, for every index ``m < j`` and each of the ``2^{j−m}`` aligned slots
of length ``2^m E`` inside the block, the replay ``(m, slot)`` with probability ``2^{(m−j)/2}``
(independent coins drawn once, at the start of the block, from the policy's generator). At round
``s`` the **active index** is the smallest index of a scheduled interval covering ``s`` (their Algorithm 4).
``min_index`` (``j*`` in the authors' code) schedules replays only for ``m ≥ min_index``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Replay", "Schedule", "sample_schedule"]


@dataclass(frozen=True)
class Replay:
    """Strategy ``index`` replayed on rounds ``start..end`` (inclusive, global 1-based rounds)."""

    index: int
    start: int
    end: int


class Schedule:
    """The scheduled intervals of one block, with O(1) active-index and interval-end lookups."""

    def __init__(self, start: int, j: int, base: int, replays: list[Replay]) -> None:
        self.start, self.j, self.base = int(start), int(j), int(base)
        self.replays = list(replays)
        length = (2**self.j) * self.base
        self.end = self.start + length - 1
        active = [self.j] * length
        ends: dict[int, list[Replay]] = {}
        for r in sorted(self.replays, key=lambda r: -r.index):   # smaller indices overwrite
            if r.index < self.j:
                active[r.start - self.start: r.end - self.start + 1] = \
                    [r.index] * (r.end - r.start + 1)
            ends.setdefault(r.end, []).append(r)
        self._active = active
        self._ends = ends

    def active_index(self, s: int) -> int:
        """Smallest index of a scheduled interval covering round ``s``."""
        return self._active[s - self.start]

    def ending_at(self, s: int) -> list[Replay]:
        """Scheduled intervals whose last round is ``s`` (several nested ones may end together)."""
        return self._ends.get(s, [])

    def counts(self) -> dict[int, int]:
        """Number of rounds of the block played with each index."""
        out: dict[int, int] = {}
        for m in self._active:
            out[m] = out.get(m, 0) + 1
        return out

    def to_state(self) -> tuple:
        """Plain-data state ``(start, j, base, [(index, start, end), ...])`` for ``get_extra_state``."""
        return (self.start, self.j, self.base, [(r.index, r.start, r.end) for r in self.replays])

    @classmethod
    def from_state(cls, state: tuple) -> Schedule:
        """Inverse of :meth:`to_state`."""
        start, j, base, reps = state
        return cls(start, j, base, [Replay(*r) for r in reps])


def sample_schedule(start: int, j: int, base: int, generator: torch.Generator, *,
                    min_index: int = 0, replays: bool = True) -> Schedule:
    """Algorithm 4: the block ``(j, B(j))`` plus random replays of indices ``min_index..j−1``."""
    length = (2**j) * base
    out = [Replay(j, start, start + length - 1)]
    if replays:
        for m in range(max(min_index, 0), j):
            slot = (2**m) * base
            n_slots = 2 ** (j - m)
            coins = torch.rand(n_slots, generator=generator, dtype=torch.float64)
            prob = 2.0 ** ((m - j) / 2.0)
            for k in torch.nonzero(coins < prob).flatten().tolist():
                out.append(Replay(m, start + k * slot, start + (k + 1) * slot - 1))
    return Schedule(start, j, base, out)

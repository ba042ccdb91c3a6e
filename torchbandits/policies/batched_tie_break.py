"""Sync-free random tie-breaks for a batch of runs, each drawing from its own generator exactly
as the sequential ``tie_break="random"`` does.

The sequential policy (:class:`~torchbandits.policies.time_varying.TimeVaryingUCB`) draws only
in a round whose maximum ties: ``ties[randint(m, (1,), generator=g)]`` among the ``m`` tied
candidates, in increasing index order. A CPU ``torch.randint`` with a range ``m < 2^28`` takes
**one** 32-bit Mersenne-Twister output ``u`` and returns ``u mod m`` (ATen's
``uniform_int_from_to_distribution``; ranges from ``2^28`` on take a 64-bit output). So run
``r``'s ``j``-th tie is decided by the ``j``-th 32-bit output of its generator after the
warm-up, whatever ``m`` is.

:class:`RunTieDraws` holds those outputs, drawn ahead on the host in chunks, as a device tensor
``[R, D]`` (the stream positions ``0..D−1`` of every run, stored as ``u − 2^31`` in int32), and
a device counter ``[R]`` of the positions used. A round reads position ``used_r`` of every
run, keeps it only in the runs that tie and advances their counters: no host read, and run
``r`` consumes its stream exactly as the sequential run. A run uses at most one output per
``select``, so the host keeps ``D`` above the number of selects (the only host-side
condition; ``D`` doubles when reached). The outputs of runs that did not tie stay in the
buffer, which thus holds at most 8 bytes per run and select (8 MB for R = 1024 over 1000
rounds) until :meth:`RunTieDraws.sync`.

No CPU draw hands out a whole 32-bit output: ``int32.random_()`` gives ``u mod 2^31`` and
``randint(3)`` gives ``u mod 3``, both one output per element. Both are drawn from the same
generator state, and the top bit follows from ``u mod 3 = (u mod 2^31 + 2·top) mod 3``
(``2^31 ≡ 2 (mod 3)``). ``tests/policies/test_batched_tie_break.py`` checks the stream and
the choices against sequential ``randint`` calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..batching import RunDrawsAhead

__all__ = ["RANGE_32", "RunTieDraws", "draw_outputs", "tie_index"]

#: ranges below this take one 32-bit output in a CPU ``torch.randint`` (above: a 64-bit one)
RANGE_32 = 1 << 28
_HALF = 1 << 31   # the outputs are stored as u − 2^31 (int32)


def draw_outputs(gen: torch.Generator, count: int) -> Tensor:
    """The next ``count`` 32-bit outputs ``u`` of ``gen`` (int64 ``[count]``, ``0 ≤ u < 2^32``);
    ``gen`` ends advanced by ``count`` outputs, as after ``count`` calls ``randint(m, (1,))``
    with ``m < 2^28``."""
    state = gen.get_state()
    mod3 = torch.randint(3, (count,), generator=gen)
    gen.set_state(state)
    low = torch.empty(count, dtype=torch.int32).random_(generator=gen).to(torch.int64)
    top = torch.remainder(mod3 - low, 3) // 2         # 0 or 1: (2·top) mod 3 ∈ {0, 2}
    return low + (top << 31)


def tie_index(tied: Tensor, pick: Tensor) -> Tensor:
    """Index ``[R]`` of the ``pick``-th (0-based, ``[R]``) set entry of every row of ``tied``
    ``[R, A]`` (bool): the number of positions before it, whose running count is ``≤ pick``."""
    running = torch.cumsum(tied, dim=1)
    return (running <= pick[:, None]).sum(dim=1)


def _stored_outputs(gen: torch.Generator, count: int) -> Tensor:
    """The next ``count`` outputs of ``gen`` stored as ``u − 2^31`` (int32 ``[count]``)."""
    return (draw_outputs(gen, count) - _HALF).to(torch.int32)


class RunTieDraws(RunDrawsAhead):
    """Per-run 32-bit generator outputs for random tie-breaks, drawn ahead and consumed on the
    device (module docstring): a :class:`~torchbandits.batching.RunDrawsAhead` of
    :func:`draw_outputs`, stored as ``u − 2^31`` in int32.

    Args:
        generators: one ``torch.Generator`` per run (CPU), used from their current state; the
            caller does not draw from them until :meth:`sync`.
        device: where the outputs and counters live.
        chunk: the least number of outputs drawn per run at a refill (64).
    """

    def __init__(self, generators: Sequence[torch.Generator], *,
                 device: torch.device | str | None = None, chunk: int = 64) -> None:
        super().__init__(generators, _stored_outputs, device=device, block=chunk)

    def choose(self, best: Tensor, tied: Tensor) -> Tensor:
        """The sequential random tie-break of every run: ``best`` ``[R]`` (the argmax) where a
        run's row of ``tied`` ``[R, A]`` (bool, includes ``best``) has one entry, else its
        ``(u mod m)``-th tied index, ``u`` the run's next output and ``m`` its number of ties
        (``m < 2^28``). No host read."""
        if best.device != self.device:                   # the policy moved (``.to(device)``)
            self.move_to(best.device)
        counts = tied.sum(dim=1)
        has_tie = counts > 1
        u = self.take(has_tie).to(torch.int64) + _HALF
        pick = torch.remainder(u, counts.clamp(min=1))
        return torch.where(has_tie, tie_index(tied, pick), best)

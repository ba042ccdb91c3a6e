"""Per-run random streams and input checks for batched runs (a leading run dimension ``R``).

A batch of ``R`` runs must make, in run ``r``, exactly the draws that a sequential run with seed
``r`` makes. :class:`RunStreams` keeps one ``torch.Generator`` per run and hands out draws of the
shape one round uses, ``[R, *shape]``, from a buffer refilled in chunks of many rounds, so the
per-generator call overhead is paid once per chunk instead of once per round.

Chunks are exact because of how the CPU generators fill a tensor (checked in
``tests/test_batch_streams.py``): ``rand`` and ``randint`` fill element by element, so one call
for ``K`` rounds returns the ``K`` per-round draws back to back; ``randn`` does so only for fewer
than 16 elements per call or into a non-contiguous output (a contiguous call of 16 and more
takes a vectorised Box–Muller path whose order differs), so a chunk of rounds of at most 15
normals is drawn by one call into a strided scratch row (the serial path: one Box–Muller draw
after another, as the per-round calls), and a round of 16 or more normals is drawn alone. When
the spec of a stream changes (another shape, range or dtype), the stream rewinds to
the state saved at the start of its chunk and redraws only what was consumed, so no draw is lost
or invented.

The checks raise ``ValueError`` naming the argument, before any state changes.

**Host synchronisation.** An eager check reads one flag back to the host (``float``/``bool`` of
a reduction): fine for a call from user code, a stall per check on a CUDA device. Inside
:func:`deferred_checks` (entered by :func:`~torchbandits.experiments.simulate_batch`, which feeds
the policy tensors made by the library's own batched environment) the same functions keep the
shape checks (host metadata, no device read) and turn every value check (finite candidates,
points and rewards, index range, the batched posterior's positive pivots) into a per-run flag
accumulated *on the device* (:class:`DeferredChecks`, the first failing round of each run); the
runner reads all flags at once every ``sync_every`` rounds and at the end, and raises
:class:`BatchCheckError` (a ``ValueError``) naming the check, the run, its seed and the round.
A deferred check does not reject the call: a failing run computes on (its numbers become NaN)
until that read. :class:`RunStreams` given a ``device`` moves each chunk there with one
non-blocking copy, so a round's draws are device tensors and need no per-round transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .deferred_checks import (
    BatchCheckError,
    DeferredChecks,
    active_checks,
    check_runs,
    deferred_checks,
    to_device,
)
from .run_draw_threads import (
    ChunkAhead,
    RunDrawsAhead,
    chunk_layout,
    default_draw_ahead,
    default_draw_threads,
    draw_chunk,
    draw_one,
    run_sliced,
)

__all__ = [
    "BatchCheckError",
    "DeferredChecks",
    "RunDrawsAhead",
    "RunStreams",
    "active_checks",
    "check_batch_index",
    "check_batch_points",
    "check_batch_rewards",
    "check_batched_candidates",
    "check_runs",
    "check_seeds",
    "deferred_checks",
    "to_device",
]

def check_seeds(seeds: Any) -> list[int]:
    """``seeds`` as a non-empty list of ints (one per run)."""
    if isinstance(seeds, Tensor):
        seeds = seeds.tolist()
    try:
        out = [int(s) for s in seeds]
    except (TypeError, ValueError):
        raise ValueError(f"seeds must be a sequence of ints, got {seeds!r}") from None
    if not out:
        raise ValueError("seeds must hold at least one seed")
    if any(isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be ints, got {seeds!r}")
    return out


class RunStreams:
    """One generator per run; ``uniform``/``normal``/``randint`` give ``[R, *shape]`` per round.

    Args:
        generators: the runs' generators (``R`` of them), used from their current state.
        chunk: rounds drawn per refill (64).
        device: where the draws are handed out (CPU by default); each refill is moved there with
            one non-blocking copy from page-locked memory (the generators stay on the CPU).
        draw_threads: threads drawing a refill, a slice of the runs each (the same numbers for
            any value); ``None``: :func:`~torchbandits.run_draw_threads.default_draw_threads`.
        draw_ahead: draw the next chunk on a background thread while this one is handed out
            (the same numbers; :class:`~torchbandits.run_draw_threads.ChunkAhead`); ``None``:
            :func:`~torchbandits.run_draw_threads.default_draw_ahead` (on a GPU, for large
            generator calls, on a host of 4 CPUs or more).

    Draw ``n`` rounds of ``shape`` and run ``r`` gets what ``n`` calls of
    ``torch.rand(*shape, generator=g_r)`` (or ``randn``, ``randint(high, shape)``) would give.
    """

    def __init__(self, generators: Sequence[torch.Generator], *, chunk: int = 64,
                 device: torch.device | str | None = None,
                 draw_threads: int | None = None, draw_ahead: bool | None = None) -> None:
        self.generators = list(generators)
        if not self.generators:
            raise ValueError("generators must hold at least one generator")
        if int(chunk) < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if draw_threads is not None and int(draw_threads) < 1:
            raise ValueError(f"draw_threads must be >= 1, got {draw_threads}")
        self.chunk = int(chunk)
        self.draw_threads = None if draw_threads is None else int(draw_threads)
        if draw_ahead is not None and not isinstance(draw_ahead, bool):
            raise ValueError(f"draw_ahead must be True, False or None, got {draw_ahead!r}")
        self.draw_ahead = draw_ahead
        self._ahead: ChunkAhead | None = None   # the next chunk, being drawn
        self.device = torch.device("cpu" if device is None else device)
        self._spec: tuple[Any, ...] | None = None
        self._buffer: Tensor | None = None   # [R, K, numel]
        self._used = 0
        self._states: list[Tensor | None] = []
        self._mapped: tuple[Tensor, Any, tuple[Tensor, ...]] | None = None   # :meth:`mapped`

    @classmethod
    def from_seeds(cls, seeds: Sequence[int], *, chunk: int = 64,
                   device: torch.device | str | None = None,
                   draw_threads: int | None = None, draw_ahead: bool | None = None
                   ) -> RunStreams:
        """Fresh generators ``torch.Generator().manual_seed(s)`` for every seed."""
        return cls([torch.Generator().manual_seed(int(s)) for s in check_seeds(seeds)],
                   chunk=chunk, device=device, draw_threads=draw_threads,
                   draw_ahead=draw_ahead)

    @classmethod
    def from_states(cls, states: Sequence[Tensor], *, chunk: int = 64,
                    device: torch.device | str | None = None,
                    draw_threads: int | None = None, draw_ahead: bool | None = None
                    ) -> RunStreams:
        """Generators restored from :meth:`states` (a saved batch continues its draws)."""
        gens = [torch.Generator() for _ in states]
        for g, state in zip(gens, states, strict=True):
            g.set_state(state)
        return cls(gens, chunk=chunk, device=device, draw_threads=draw_threads,
                   draw_ahead=draw_ahead)

    def states(self) -> list[Tensor]:
        """Every run's generator state, rewound to the draws handed out so far (:meth:`sync`)."""
        return [g.get_state() for g in self.sync()]

    @property
    def n_runs(self) -> int:
        """Number of runs R (one generator each)."""
        return len(self.generators)

    def _flush(self) -> None:
        """Rewind every generator to the start of the open chunk and redraw what was used (the
        chunk being drawn ahead, if any, stopped and dropped first)."""
        self.cancel_ahead()
        if self._spec is None or self._buffer is None:
            return
        kind, numel, dtype, high = self._spec
        used = self._used

        def rewind(lo: int, hi: int) -> None:
            for g, state in zip(self.generators[lo:hi], self._states[lo:hi], strict=True):
                assert state is not None
                g.set_state(state)
                for _ in range(used):
                    draw_one(g, kind, numel, dtype, high)

        run_sliced(rewind, self.n_runs, self._threads(numel))
        self._spec, self._buffer, self._used, self._mapped = None, None, 0, None

    def _take(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype, high: int) -> Tensor:
        j = self._next(kind, shape, dtype, high)
        assert self._buffer is not None
        return self._buffer[:, j].reshape(self.n_runs, *shape)

    def mapped(self, fn: Callable[[Tensor], Sequence[Tensor]], key: Any, kind: str,
               *shape: int, dtype: torch.dtype = torch.float64, high: int = 0
               ) -> tuple[Tensor, ...]:
        """This round's draws (what ``uniform``/``normal``/``randint(high, …)`` of ``kind`` would
        hand out, consumed alike) passed through ``fn``, which is applied once per chunk: to the
        chunk's draws ``[K, R, *shape]`` (round-major; a view of the buffer: read only, its row
        ``k`` laid out as the plain draw of round ``k``), returning tensors of leading size ``K``
        whose row ``k`` is round ``k``'s result (made contiguous, so a row is contiguous too).
        ``fn`` must treat the rounds (and runs) independently — elementwise or row-wise
        arithmetic — so that row ``k`` is, to the bit, ``fn`` of round ``k``'s draws alone.
        ``key`` (compared with ``==``) names ``fn`` and its parameters: the kept results are
        reused while the chunk and the key are the same. A round then costs one index per result
        instead of ``fn``'s operators; draws made and never handed out are mapped too."""
        if kind not in ("uniform", "normal", "randint"):
            raise ValueError(f"kind must be 'uniform', 'normal' or 'randint', got {kind!r}")
        j = (self._next(kind, tuple(shape), dtype, 0) if kind != "randint" else
             self._next(kind, tuple(shape), torch.int64, int(high)))
        kept = self._mapped
        if kept is None or kept[0] is not self._buffer or kept[1] != key:
            assert self._buffer is not None
            block = self._buffer.transpose(0, 1).reshape(-1, self.n_runs, *shape)
            kept = self._mapped = (self._buffer, key,
                                   tuple(m.contiguous() for m in fn(block)))
        return tuple(m[j] for m in kept[2])

    def _next(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype, high: int) -> int:
        """Consume one round of draws of this spec (refilling as needed); its row in the
        buffer ``[R, K, numel]``."""
        numel = math.prod(shape)
        spec = (kind, numel, dtype, high)
        if spec != self._spec:
            self._flush()
        if self._buffer is None or self._used == self._buffer.shape[1]:
            width = chunk_layout(kind, numel, self.chunk)[0] * numel   # draws per call
            pin, threads = self.device.type == "cuda", self._threads(width)
            ahead, self._ahead = self._ahead, None
            if ahead is not None:
                assert ahead.spec == spec   # a change of spec flushed it
                host, self._states = ahead.result()
            else:
                host, self._states = draw_chunk(self.generators, spec, self.chunk, pin=pin,
                                                threads=threads)
            self._buffer = to_device(host, self.device)
            self._spec, self._used = spec, 0
            if self._ahead_on(width):
                self._ahead = ChunkAhead(self.generators, spec, self.chunk, pin=pin,
                                         threads=threads)
        self._used += 1
        return self._used - 1

    def _threads(self, per_call: int) -> int:
        return self.draw_threads or default_draw_threads(self.n_runs, per_call)

    @property
    def drawing_ahead(self) -> bool:
        """Whether the next chunk is being (or has been) drawn ahead and not yet handed out."""
        return self._ahead is not None

    def __getstate__(self) -> dict[str, Any]:
        """For a copy or a pickle: the chunk ahead is stopped and dropped first (the copy and
        this stream then draw the same numbers)."""
        self.cancel_ahead()
        return dict(self.__dict__)

    def _ahead_on(self, per_call: int) -> bool:
        if self.draw_ahead is not None:
            return self.draw_ahead
        return default_draw_ahead(per_call, self.device)

    def cancel_ahead(self) -> None:
        """Stop the chunk being drawn ahead and drop it: the generators stand again at the end of
        the open chunk, where it began, as without drawing ahead. Called by :meth:`sync`; call
        it when the batch ends (:meth:`~torchbandits.envs.batched.BatchedEnv.close`)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()

    def uniform(self, *shape: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """``U[0, 1)`` draws ``[R, *shape]`` (one round of ``torch.rand(*shape)`` per run)."""
        return self._take("uniform", tuple(shape), dtype, 0)

    def normal(self, *shape: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """``N(0, 1)`` draws ``[R, *shape]`` (one round of ``torch.randn(*shape)`` per run)."""
        return self._take("normal", tuple(shape), dtype, 0)

    def randint(self, high: int, *shape: int) -> Tensor:
        """Integers in ``[0, high)`` ``[R, *shape]`` (``torch.randint(high, shape)`` per run)."""
        return self._take("randint", tuple(shape), torch.int64, int(high))

    def sync(self) -> list[torch.Generator]:
        """The generators rewound to exactly the draws handed out so far (for a hand-over to
        sequential code or a state save)."""
        self._flush()
        return self.generators


# ---------------------------------------------------------------------- input checks
def _all_finite(x: Tensor) -> bool:
    """Every entry finite: one reduction (a NaN or ±inf makes the sum non-finite); the entries
    are looked at one by one only when the sum is not finite (or overflows)."""
    return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())


def _check_finite(name: str, x: Tensor) -> None:
    """Every entry of ``x`` ``[R, ...]`` finite (deferred per run inside :func:`deferred_checks`)."""
    checks = active_checks()
    if checks is not None:
        if not checks.inputs_checked:
            checks.flag_finite(f"{name} must be finite", x)
    elif not _all_finite(x):
        raise ValueError(f"{name} must be finite (found NaN or inf)")


def _tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}") from None


def check_batched_candidates(name: str, value: Any, n_runs: int, *, dtype: torch.dtype,
                             device: torch.device, dim: int | None = None) -> Tensor:
    """Candidates ``[R, A, d]`` (finite, real) on ``device``/``dtype``; raises naming ``name``."""
    x = _tensor(name, value)
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be real numbers, got dtype {x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"{name} must be [R, A, d] for a batch of R = {n_runs} runs, "
                         f"got shape {tuple(x.shape)}")
    if x.shape[0] != n_runs:
        raise ValueError(f"{name} has leading dimension {x.shape[0]} but the batch has "
                         f"R = {n_runs} runs")
    if x.shape[1] < 1:
        raise ValueError(f"{name} must hold at least one candidate per run")
    if dim is not None and x.shape[2] != dim:
        raise ValueError(f"{name} must have d = {dim} columns, got {x.shape[2]}")
    x = x.to(dtype=dtype, device=device)
    _check_finite(name, x)
    return x


def check_batch_points(name: str, value: Any, n_runs: int, *, dtype: torch.dtype,
                       device: torch.device, dim: int | None = None) -> Tensor:
    """Played points ``[R, d]``, finite, on ``device``/``dtype``; raises naming ``name``."""
    x = _tensor(name, value)
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must be real numbers, got dtype {x.dtype}")
    if x.ndim != 2 or x.shape[0] != n_runs:
        raise ValueError(f"{name} must be [R, d] with R = {n_runs}, got shape {tuple(x.shape)}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} must have d = {dim} columns, got {x.shape[1]}")
    x = x.to(dtype=dtype, device=device)
    _check_finite(name, x)
    return x


def check_batch_rewards(name: str, value: Any, n_runs: int, *, dtype: torch.dtype,
                        device: torch.device) -> Tensor:
    """Rewards ``[R]``, finite, on ``device``/``dtype``; names the first bad run."""
    y = _tensor(name, value)
    if y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{name} must be real numbers, got dtype {y.dtype}")
    if y.shape != (n_runs,):
        raise ValueError(f"{name} must be [R] with R = {n_runs}, got shape {tuple(y.shape)}")
    y = y.to(dtype=dtype, device=device)
    checks = active_checks()
    if checks is not None:
        if not checks.inputs_checked:
            checks.flag_finite(f"{name} must be finite", y)
    elif not _all_finite(y):
        run = int((~torch.isfinite(y)).nonzero()[0, 0])
        raise ValueError(f"{name} must be finite: run {run} has {float(y[run])}")
    return y


def check_batch_index(name: str, value: Any, n_runs: int, n_candidates: int,
                      device: torch.device) -> Tensor:
    """Chosen indices ``[R]`` (integers in ``[0, n_candidates)``) as a LongTensor on ``device``."""
    i = _tensor(name, value)
    if i.is_floating_point() or i.is_complex() or i.dtype == torch.bool:
        raise ValueError(f"{name} must be integers, got dtype {i.dtype}")
    if i.shape != (n_runs,):
        raise ValueError(f"{name} must be [R] with R = {n_runs}, got shape {tuple(i.shape)}")
    if i.dtype != torch.long or i.device != device:
        i = i.to(device=device, dtype=torch.long)
    checks = active_checks()
    if checks is not None:   # flagged, and clamped so that a gather stays in range until then
        inside = i.clamp(0, n_candidates - 1)
        checks.flag(f"{name} must lie in [0, {n_candidates})", inside.ne(i))
        return inside
    lo, hi = torch.aminmax(i)
    if int(lo) < 0 or int(hi) >= n_candidates:
        raise ValueError(f"{name} must lie in [0, {n_candidates}), got {i.tolist()}")
    return i

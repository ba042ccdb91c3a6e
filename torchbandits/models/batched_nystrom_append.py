"""The compiled append of a batched EK-UCB round (Zenati et al. 2022, Algorithm 2 in the whitened
form of their Prop. 4.2) for :meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.append_scored`:
after a compiled score, every run's played candidate is appended by one C call
(:func:`torchbandits.native.ekucb_append.append_played`) that takes the candidate's columns
``k_Z(x)``, ``e(x)``, ``Q e(x)`` from the score, adds ``y·e(x)`` to ``g``, writes the point's row
of ``E``, ``X`` and the rewards, adds ``log1p(e(x)ᵀQe(x))`` to ``log det A`` and defers the
Sherman–Morrison step ``Q ← Q − (Qe)(Qe)ᵀ/(1 + eᵀQe)`` to the next score — the numbers of
:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.scored_columns` followed by
:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.append` up to the rounding of the two
sums ``eᵀQe`` and ``‖e‖²``, in one call instead of about twenty tensor operations.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..deferred_checks import active_checks, check_runs
from ..native import ekucb_append as native_append

__all__ = ["CompiledAppend"]


class CompiledAppend:
    """The compiled append of :class:`~torchbandits.models.batched_nystrom.BatchedNystrom` (a
    mixin: the model's own state, read and written through ``self``)."""

    _scored_full: Any
    _version: int
    _n: int
    _mmax: int
    _pending: Any
    _q_kept: Any
    _g: Tensor
    _e: Tensor
    _x: Tensor
    _s: Tensor
    _logdet: Tensor
    jitter: float
    kernel_constant: float | None

    def _append_compiled(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """Append the played candidates ``x`` ``[R, d]`` with rewards ``y`` ``[R]`` by the
        compiled call: ``(k_Z(x), e(x), ω)`` (``[R, M]``, ``[R, M]``, ``[R]``), or ``None`` with
        nothing changed (the caller's torch path): no compiled score since the last change, a
        deferred step still pending, compiled kernels unavailable, or (user code) some ``x_r``
        that is not one of the last candidates. Under deferred checks such a run is flagged
        instead (it takes candidate 0's columns, as the torch path does)."""
        full, n, mm = self._scored_full, self._n, self._mmax
        # the compiled score's columns, current (no change since) and at the round's width
        if full is None or full[0] != self._version or self._pending is not None \
                or self._q_kept is not None or mm == 0 or full[3].shape[-1] != mm:
            return None
        _, cand, kz, f, qf = full
        self._ensure(n + 1, mm, x.shape[1])  # type: ignore[attr-defined]
        const = self.kernel_constant
        deferred = active_checks() is not None
        got = native_append.append_played(
            cand, x, y, kz, f, qf,
            const if const is not None else self.prior_variance(x),  # type: ignore[attr-defined]
            self.jitter, self._g, self._e, self._x, self._s, n, self._logdet,
            write_missing=deferred)
        if got is None or (got.n_missing and not deferred):
            return None    # nothing written: the torch path (fresh columns for a missing x)
        if got.n_missing:
            check_runs("x must be a candidate of the last select", got.missing,
                       lambda r: f"x of run {r} is not a candidate of the last select")
        self._version += 1
        self._defer_q_step(got.a, got.b)  # type: ignore[attr-defined]
        self._n = n + 1
        return got.kz, got.f, got.omega

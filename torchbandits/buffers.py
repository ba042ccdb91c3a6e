"""Module state helpers: capacity-doubling buffers and shape-tolerant ``load_state_dict``.

All state of models and policies lives in registered buffers so that ``.to(device)``,
``.double()`` and ``state_dict()`` work. Growing histories use buffers whose capacity doubles
(amortised O(1) per append instead of a per-step concatenation). Their shapes therefore change
during a run, so :class:`ResizableModule` resizes its own buffers to the incoming shapes before
``load_state_dict`` copies the values in.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SLOW_GROWTH", "ResizableModule", "StoredData", "grow_rows", "set_plain"]

#: ``set_plain(module, name, value)``: set a plain attribute of a module (an int, a float, a
#: record; never a parameter, buffer or submodule) without ``nn.Module.__setattr__``'s checks
#: (about 3 µs each, a noticeable share of a single-run step at the papers' sizes).
set_plain = object.__setattr__


#: :func:`grow_rows` arguments for a capacity that grows by at most one a round and whose
#: padding is streamed every round (EK-UCB's anchors: the blocks of ``P``, ``Q`` and KORS's ``N``
#: of every run): by a quarter, in steps of 16, so that the padding costs few cache lines and
#: pages (doubling 64 anchors to 128 made each run's blocks four times their size)
SLOW_GROWTH: dict[str, Any] = {"factor": 1.25, "align": 16}


def grow_rows(buf: Tensor, needed: int, *, dims: tuple[int, ...] = (0,), factor: float = 2.0,
              align: int = 1) -> Tensor:
    """Return ``buf`` if every dimension in ``dims`` holds ``needed`` entries, otherwise a new
    zero buffer with those dimensions at ``max(⌈factor·capacity⌉, needed)`` rounded up to a
    multiple of ``align`` (doubling by default), and the old content copied. A smaller
    ``factor`` keeps the overshoot (memory, pages, cache lines of padding) small where each
    growth is cheap relative to the work on the buffer."""
    shape = list(buf.shape)
    if all(shape[d] >= needed for d in dims):
        return buf
    new_shape = list(shape)
    for d in dims:
        size = max(math.ceil(factor * shape[d]), needed, 1)
        new_shape[d] = -(-size // align) * align
    out = buf.new_zeros(new_shape)
    out[tuple(slice(0, s) for s in shape)] = buf
    return out


class ResizableModule(nn.Module):
    """``nn.Module`` whose own buffers take the shape of the incoming state on load."""

    def _load_from_state_dict(  # type: ignore[override]
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        for name, buf in list(self._buffers.items()):
            key = prefix + name
            if buf is not None and key in state_dict and state_dict[key].shape != buf.shape:
                self._buffers[name] = torch.empty(
                    state_dict[key].shape, dtype=buf.dtype, device=buf.device
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class StoredData(ResizableModule):
    """A resizable module that stores observations in capacity buffers ``_x`` ``[cap, d]`` and
    ``_y`` ``[cap]`` with ``_n`` of them in use; the shared read-only views and properties of the
    exact and the weighted kernel ridge models."""

    _n: int

    @property
    def n(self) -> int:
        """Number of stored observations."""
        return self._n

    @property
    def dim(self) -> int | None:
        """Feature dimension (``None`` before the first observation)."""
        return self._x.shape[1] if self._x.shape[0] > 0 else None

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the stored targets (and inputs)."""
        return self._y.dtype

    @property
    def device(self) -> torch.device:
        """Device of the stored tensors."""
        return self._y.device

    @property
    def x(self) -> Tensor:
        """Stored inputs ``[n, d]`` (a view)."""
        return self._x[: self._n]

    @property
    def y(self) -> Tensor:
        """Stored targets ``[n]`` (a view)."""
        return self._y[: self._n]

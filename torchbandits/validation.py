"""Argument checks shared by every layer.

Each check raises a ``ValueError`` that names the argument and says what was expected. Callers run
them *before* touching any state, so a rejected call changes nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "as_matrix",
    "as_point",
    "as_scalar_reward",
    "check_int",
    "check_positive",
    "check_probability",
    "chosen_row",
    "chosen_row_unmodified",
    "is_chosen_row",
    "match_rows",
    "require_finite",
    "same_rows",
    "trusted",
]

_TRUSTED: list[Tensor | None] = [None]


class trusted:
    """Within ``with trusted(x):``, :func:`as_matrix` and :func:`as_point` hand back this very
    tensor ``x`` (already checked by the caller, in the asked dtype and device) without checking
    it again: a policy validates its candidates once per call, and the model and the rule it
    calls do not repeat the check. Only the identical object is passed through, and only inside
    the block (nothing is remembered across calls)."""

    __slots__ = ("_prev", "_x")

    def __init__(self, x: Tensor) -> None:
        self._x = x

    def __enter__(self) -> Tensor:
        self._prev = _TRUSTED[0]
        _TRUSTED[0] = self._x
        return self._x

    def __exit__(self, *exc: object) -> None:
        _TRUSTED[0] = self._prev


def _trusted(value: Any, dtype: torch.dtype, device: torch.device, ndim: int,
             dim: int | None) -> bool:
    return (value is _TRUSTED[0] and value.ndim == ndim and value.dtype is dtype
            and (value.is_cpu if device.type == "cpu" else value.device == device)
            and (dim is None or value.shape[-1] == dim))


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise if it is not a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value``, or raise naming ``name`` if it is not an ``int`` (a ``bool`` is not) of at
    least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_probability(name: str, value: Any, *, open_right: bool = True) -> float:
    """Return ``value`` as a float in (0, 1) (or (0, 1] if ``open_right`` is false)."""
    v = check_positive(name, value)
    if v > 1.0 or (open_right and v == 1.0):
        raise ValueError(f"{name} must lie in (0, 1{')' if open_right else ']'}, got {value!r}")
    return v


_HOST_FLOATS = (torch.float64, torch.float32)


def require_finite(name: str, x: Tensor) -> None:
    """Raise unless every entry is finite. One reduction: a NaN or ±inf makes ``Σ x²`` (a CPU
    float tensor without autograd: NumPy's ``vdot`` on its memory, no tensor operation) or ``Σ x``
    non-finite; only when it is non-finite (or overflows) are the entries checked one by one."""
    if x.is_cpu and x.dtype in _HOST_FLOATS and not x.requires_grad:
        a = x.numpy()
        total = float(np.vdot(a, a))
    else:
        total = float(x.sum())
    if not math.isfinite(total) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite (found NaN or inf)")


def _as_real_tensor(name: str, value: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``value`` converted to ``dtype``/``device``; complex input is refused (a cast would drop the
    imaginary part silently), as is input that is not numeric."""
    if isinstance(value, Tensor):
        if value.dtype is dtype and (value.is_cpu if device.type == "cpu" else value.device == device):
            return value  # (``to`` would return it too, at a dispatch's cost)
        src = value
    else:
        try:
            src = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name} must be a real numeric tensor, got {type(value).__name__}") from None
    if src.is_complex():
        raise ValueError(f"{name} must be real, got a complex tensor ({src.dtype})")
    return src.to(dtype=dtype, device=device)


def as_matrix(
    name: str,
    value: Any,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dim: int | None = None,
) -> Tensor:
    """``value`` as a finite ``[n, d]`` tensor with ``n ≥ 1`` on ``device``/``dtype`` (any real
    dtype is converted first, so float32 or int64 input is compared in the policy's dtype)."""
    if _trusted(value, dtype, device, 2, dim) and value.shape[0] > 0:
        return value
    x = _as_real_tensor(name, value, dtype, device)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D tensor [n, d], got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one row is needed")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} columns (feature dimension), got {x.shape[1]}")
    require_finite(name, x)
    return x


def as_point(
    name: str,
    value: Any,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dim: int | None = None,
    finite: bool = True,
) -> Tensor:
    """``value`` as a finite ``[d]`` vector (a ``[1, d]`` row is accepted; ``finite=False``: the
    caller checks finiteness itself)."""
    if _trusted(value, dtype, device, 1, dim):
        return value
    x = _as_real_tensor(name, value, dtype, device)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-D feature vector [d], got shape {tuple(x.shape)}")
    if dim is not None and x.shape[0] != dim:
        raise ValueError(f"{name} must have {dim} entries (feature dimension), got {x.shape[0]}")
    if finite:
        require_finite(name, x)
    return x


def as_scalar_reward(name: str, value: Any) -> float:
    """``value`` as a finite Python float (a one-element tensor is accepted)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        if value.dtype.is_complex:
            raise ValueError(f"{name} must be real, got a complex tensor")
        value = value.item()
    if isinstance(value, complex):
        raise ValueError(f"{name} must be real, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _rows_equal(points: Tensor, query: Tensor) -> Tensor:
    """``[q, n]`` boolean matrix: query row ``i`` equals point row ``j`` exactly, or after both are
    rounded to float32 (so float32 or integer input of the same points is recognised: the
    conversion to the policy's dtype keeps the rounding of the source)."""
    eq = (query[:, None, :] == points[None, :, :]).all(-1)
    if points.dtype != torch.float32 and not bool(eq.any(1).all()):
        p32, q32 = points.to(torch.float32), query.to(torch.float32)
        eq = eq | (q32[:, None, :] == p32[None, :, :]).all(-1)
    return eq


def same_rows(points: Tensor, query: Tensor) -> bool:
    """Whether ``query`` ``[n, d]`` is the point set ``points`` ``[n, d]`` row by row (exactly, or
    up to float32 rounding; see :func:`match_rows`)."""
    if query.shape != points.shape:
        return False
    if torch.equal(query, points):
        return True
    q32, p32 = query.to(torch.float32), points.to(torch.float32)
    return points.dtype != torch.float32 and torch.equal(q32, p32)


def match_rows(name: str, points: Tensor, query: Tensor) -> Tensor:
    """Index ``[q]`` of the first row of ``points`` ``[n, d]`` equal to each row of ``query``
    ``[q, d]`` (exactly, or after rounding both to float32, so a float32 / int64 copy of the points
    matches); a ``ValueError`` naming ``name`` if a query row is none of the points."""
    q = query.reshape(-1, points.shape[-1]) if query.ndim == 1 else query
    if q.shape[-1] != points.shape[-1]:
        raise ValueError(f"{name} must have {points.shape[-1]} entries per row, got {q.shape[-1]}")
    eq = _rows_equal(points, q)
    found = eq.any(1)
    if not bool(found.all()):
        raise ValueError(f"{name} must be one of the arms of the fixed arm set ({points.shape[0]} arms)")
    return eq.to(torch.int8).argmax(1)


def chosen_row(cand: Tensor, index: int) -> tuple[Tensor, int, int]:
    """A record of row ``index`` of the scored candidates ``cand`` ``[A, d]`` (no copy): the tensor,
    the index and the tensor's version counter (bumped by every in-place write to it or to a
    view of it)."""
    return cand, index, cand._version


def is_chosen_row(x: Any, chosen: tuple[Tensor, int, int]) -> bool:
    """Whether ``x`` is row ``index`` of the recorded candidates, unmodified since the record: a
    view of that very row (same memory, dtype, device and stride) of a tensor whose version
    counter has not moved. No tensor operation; ``False`` says nothing (compare by value then)."""
    cand, index, version = chosen
    return (isinstance(x, Tensor) and cand._version == version and x._version == version
            and x.ndim == 1
            and x.dtype is cand.dtype and ((x.is_cpu and cand.is_cpu) or x.device == cand.device)
            and x.shape[0] == cand.shape[1] and x.stride(0) == cand.stride(1)
            and x.data_ptr() == cand.data_ptr() + index * cand.stride(0) * cand.element_size())


def chosen_row_unmodified(chosen: tuple[Tensor, int, int]) -> bool:
    """Whether the recorded candidates have not been written in place since the record."""
    return chosen[0]._version == chosen[2]

"""Argument checks shared by every layer.

Each check raises a ``ValueError`` that names the argument and says what was expected. Callers run
them *before* touching any state, so a rejected call changes nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "as_matrix",
    "as_point",
    "as_scalar_reward",
    "check_positive",
    "check_probability",
]


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise if it is not a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_probability(name: str, value: Any, *, open_right: bool = True) -> float:
    """Return ``value`` as a float in (0, 1) (or (0, 1] if ``open_right`` is false)."""
    v = check_positive(name, value)
    if v > 1.0 or (open_right and v == 1.0):
        raise ValueError(f"{name} must lie in (0, 1{')' if open_right else ']'}, got {value!r}")
    return v


def _require_finite(name: str, x: Tensor) -> None:
    """Raise unless every entry is finite. One reduction: a NaN or ±inf makes the sum non-finite;
    only when the sum is non-finite (or overflows) are the entries checked one by one."""
    if not math.isfinite(float(x.sum())) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite (found NaN or inf)")


def as_matrix(
    name: str,
    value: Any,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dim: int | None = None,
) -> Tensor:
    """``value`` as a finite ``[n, d]`` tensor with ``n ≥ 1`` on ``device``/``dtype``."""
    x = torch.as_tensor(value, dtype=dtype, device=device)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D tensor [n, d], got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one row is needed")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} columns (feature dimension), got {x.shape[1]}")
    _require_finite(name, x)
    return x


def as_point(
    name: str,
    value: Any,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dim: int | None = None,
) -> Tensor:
    """``value`` as a finite ``[d]`` vector (a ``[1, d]`` row is accepted)."""
    x = torch.as_tensor(value, dtype=dtype, device=device)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-D feature vector [d], got shape {tuple(x.shape)}")
    if dim is not None and x.shape[0] != dim:
        raise ValueError(f"{name} must have {dim} entries (feature dimension), got {x.shape[0]}")
    _require_finite(name, x)
    return x


def as_scalar_reward(name: str, value: Any) -> float:
    """``value`` as a finite Python float (a one-element tensor is accepted)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        value = value.item()
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v

"""Symbols of torch's own CPU library that the compiled kernels call through ``ctypes``, looked
up once per process: the Fortran BLAS/LAPACK routines its linear algebra uses
(:func:`blas_pointers`), MKL's vector square root when it is ``torch.sqrt``'s arithmetic
(:func:`vector_sqrt`), and MKL's per-thread thread count (:func:`mkl_threads_local`). Each is
``None`` where the library lacks it (another BLAS, another platform); the callers then take
their torch path or do without.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["VML_MODE", "blas_pointers", "mkl_threads_local", "torch_cpu", "vector_sqrt"]

_P = ctypes.c_void_p
_BLAS_NAMES = ("dpotrf_", "dtrsm_", "dgemm_", "dgemv_", "ddot_")  # the order bkb_step.c reads
_BLAS: list[ctypes.Array[ctypes.c_void_p] | None] = []  # resolved once per process
_MKL_LOCAL: list[Any] = []  # MKL_Set_Num_Threads_Local or None, resolved once per process
_SQRT: list[int | None] = []  # vmdSqrt's address once it is known to be torch.sqrt's arithmetic
#: the mode torch's CPU ``sqrt`` passes to MKL's ``vmdSqrt``: VML_HA | VML_FTZDAZ_OFF |
#: VML_ERRMODE_IGNORE (ATen's ``vml.h``)
VML_MODE = 0x2 | 0x140000 | 0x100


def torch_cpu() -> ctypes.CDLL:
    """torch's CPU library (raises ``OSError`` when it cannot be opened)."""
    folder = Path(torch.__file__).resolve().parent / "lib"
    names = {"win32": "torch_cpu.dll", "darwin": "libtorch_cpu.dylib"}
    return ctypes.CDLL(str(folder / names.get(sys.platform, "libtorch_cpu.so")))


def mkl_threads_local() -> Any:
    """MKL's ``MKL_Set_Num_Threads_Local`` in torch's CPU library (it sets the calling thread's
    MKL thread count and returns the previous one; 0: the global count), or ``None``."""
    if not _MKL_LOCAL:
        try:
            fn = torch_cpu().MKL_Set_Num_Threads_Local   # (the C interface: by value)
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _MKL_LOCAL.append(fn)
    return _MKL_LOCAL[0]


def blas_pointers() -> ctypes.Array[ctypes.c_void_p] | None:
    """The addresses of the Fortran BLAS/LAPACK routines ``dpotrf_``, ``dtrsm_``, ``dgemm_``,
    ``dgemv_``, ``ddot_`` that torch's CPU library calls (looked up through its handle, so they
    are the ones its linear algebra uses), or ``None`` when one is missing (the torch path runs)."""
    if _BLAS:
        return _BLAS[0]
    found = None
    try:
        handle = torch_cpu()
        found = (ctypes.c_void_p * len(_BLAS_NAMES))(
            *(ctypes.cast(getattr(handle, name), ctypes.c_void_p).value for name in _BLAS_NAMES))
    except (OSError, AttributeError):
        found = None
    _BLAS.append(found)
    return found


def vector_sqrt() -> int | None:
    """The address of MKL's ``vmdSqrt`` in torch's CPU library when ``torch.sqrt`` of a float64
    CPU tensor is its arithmetic (checked once per process: 4096 values of many magnitudes, taken
    in rows of 1000 at unaligned offsets, against ``torch.sqrt`` bit for bit; the vector sqrt is
    not the correctly rounded one, so a C ``sqrt`` would not do), else ``None``."""
    if _SQRT:
        return _SQRT[0]
    found = None
    try:
        fn = torch_cpu().vmdSqrt
        fn.argtypes, fn.restype = [ctypes.c_int, _P, _P, ctypes.c_longlong], None
        g = torch.Generator().manual_seed(12345)
        x = torch.rand(4099, generator=g, dtype=torch.float64)
        x = (x * torch.exp(20 * torch.randn(4099, generator=g, dtype=torch.float64)))[3:]
        x[:4] = torch.tensor([0.0, 1.0, 2.0, 1e-300], dtype=torch.float64)
        out = torch.empty_like(x)
        for lo in range(0, x.shape[0], 1000):
            hi = min(lo + 1000, x.shape[0])
            fn(hi - lo, x.data_ptr() + 8 * lo, out.data_ptr() + 8 * lo, VML_MODE)
        if torch.equal(out, torch.sqrt(x)):
            found = ctypes.cast(fn, ctypes.c_void_p).value
    except (OSError, AttributeError):
        found = None
    _SQRT.append(found)
    return found

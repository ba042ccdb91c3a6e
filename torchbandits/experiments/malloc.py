"""Keep glibc from returning every large tensor buffer to the kernel (a big speed-up here).

Per-round updates allocate several fresh ``n×n`` temporaries (e.g. the Cholesky rank-one update
of a sliding window). glibc serves blocks above ``M_MMAP_THRESHOLD`` (128 KiB initially) with a
fresh ``mmap`` and unmaps them on free, so every round page-faults its temporaries back in. On a
loaded machine with memory monitoring this made a w = 400 window removal ~20× slower than its
arithmetic (≈15 ms instead of ≈0.6 ms, measured for issue 6). Raising the mmap and trim
thresholds keeps those blocks in the heap and reuses them.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["tune_malloc"]

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def tune_malloc(mmap_threshold: int = 256 << 20, trim_threshold: int = 1 << 30,
                top_pad: int = 256 << 20) -> bool:
    """Raise glibc's mmap / trim thresholds for this process (``mallopt``); ``False`` if not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)))
    ok &= bool(mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))
    ok &= bool(mallopt(_M_TOP_PAD, int(top_pad)))
    return ok

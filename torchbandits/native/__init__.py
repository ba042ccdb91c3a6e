"""Optional compiled kernels: small C libraries for the dispatch-bound single-run steps on the CPU.

At the papers' sizes (t ≤ a few hundred points, 100 candidates, one run) a step of a kernel
bandit does tens of microseconds of arithmetic spread over dozens of small tensor operations, each
costing 2–10 µs of dispatch on the CPU (docs/benchmarks.md, "Against the authors' per-step
loops"). A C function that does the whole piece in one call removes that overhead. The libraries
here are plain C (no PyTorch headers: a build takes about a second), compiled on first use with the
system's C compiler and called through :mod:`ctypes` on the tensors' memory.

Nothing here is required: when the compiler is missing, the build fails, or the environment
variable ``TORCHBANDITS_NATIVE=0`` is set, :func:`library` returns ``None`` and every caller takes
its torch path (which stays the reference: the tests hold the two to rounding). The torch path
is also the one used on other devices, for most batched runs and for tensors that are not float64 /
float32 contiguous CPU tensors.

Builds are cached per source text, compiler flags and machine in ``$TORCHBANDITS_CACHE/native``
(default ``~/.cache/torchbandits/native``, else a temporary folder), written to a temporary name
and renamed into place, so concurrent processes may build at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["CFLAGS", "MIN_RUNS_PER_THREAD", "cache_dir", "disabled", "enabled", "forget",
           "library", "pointer", "set_threads", "signed", "threads", "threads_for",
           "use_threads"]

CFLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno",
                           "-std=c99")
"""Compiler flags of every build (no ``-ffast-math``: the C code rounds as written)."""

_SOURCES = Path(__file__).resolve().parent
_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL | None] = {}
_OFF: list[bool] = []  # a stack of :func:`disabled` scopes


def enabled() -> bool:
    """Whether compiled kernels may be used now (not ``TORCHBANDITS_NATIVE=0``, not inside
    :func:`disabled`; the variable is read at every call, so setting it takes effect at once)."""
    return not _OFF and os.environ.get("TORCHBANDITS_NATIVE", "1") != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """A scope in which :func:`library` returns ``None`` (every caller takes its torch path)."""
    _OFF.append(True)
    try:
        yield
    finally:
        _OFF.pop()


_THREADS: list[int] = []   # set_threads' value, if set


def threads() -> int:
    """Threads for the compiled calls that split a batch's runs (the batched exact posterior's
    select and scoring, :mod:`~torchbandits.native.exact_batch`; batched BKB's rounds,
    :mod:`~torchbandits.native.bkb`): :func:`set_threads`' value,
    else ``$TORCHBANDITS_THREADS``, else 1. Separate from torch's intra-op threads: torch's
    OpenMP workers spin for a while after each parallel operator, and C calls on more threads
    beside them only contend (keep ``torch.set_num_threads(1)`` with this, or set
    ``OMP_WAIT_POLICY=PASSIVE``)."""
    if _THREADS:
        return _THREADS[0]
    try:
        return max(1, int(os.environ.get("TORCHBANDITS_THREADS", "1")))
    except ValueError:
        return 1


def set_threads(count: int | None) -> None:
    """Set :func:`threads` for this process (``None``: back to ``$TORCHBANDITS_THREADS`` / 1);
    ``ValueError`` for a count below 1. The numbers do not depend on it."""
    if count is None:
        _THREADS.clear()
        return
    from ..validation import check_int

    _THREADS[:] = [check_int("count", count, 1)]


#: a slice of a compiled call split over threads holds at least this many runs (a slice's
#: dispatch to a pool thread costs tens of µs; a run's exact select at n = 50 about 15 µs)
MIN_RUNS_PER_THREAD = 8


def threads_for(n_runs: int) -> int:
    """Threads for a compiled call over ``n_runs`` runs: :func:`threads`, at most one per
    :data:`MIN_RUNS_PER_THREAD` runs, at least 1."""
    return max(1, min(threads(), n_runs // MIN_RUNS_PER_THREAD))


def use_threads(torch_threads: int = 0, run_threads: int = 0) -> None:
    """Apply a command's two thread options (``torchbandits run``, a reproduction, a sweep
    trial) — at run time, never at import.

    ``run_threads > 0`` sets :func:`threads` (a batch's runs split over that many threads in the
    compiled CPU calls); ``torch_threads > 0`` sets ``torch.set_num_threads``. With
    ``run_threads > 1`` and ``torch_threads == 0`` torch is set to one thread, since its OpenMP
    workers would spin beside the run threads (the combination measured in docs/batch.md).
    0 leaves a setting as it is. ``ValueError`` names a negative or non-int argument, before
    anything is set."""
    import torch

    from ..validation import check_int

    check_int("torch_threads", torch_threads, 0)
    check_int("run_threads", run_threads, 0)
    if run_threads:
        set_threads(run_threads)
    if torch_threads or run_threads > 1:
        torch.set_num_threads(torch_threads or 1)


def cache_dir() -> Path:
    """Where builds are kept: ``$TORCHBANDITS_CACHE/native`` or ``~/.cache/torchbandits/native``."""
    root = os.environ.get("TORCHBANDITS_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "torchbandits"
    return base / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _source_text(source: Path, seen: frozenset[Path] = frozenset()) -> bytes:
    """The bytes of ``source`` followed by those of every file it includes by ``#include "..."``
    (recursively, relative to its folder), so a build's cache key changes with any of them."""
    text = source.read_bytes()
    parts = [text]
    for match in _INCLUDE.finditer(text):
        inc = (source.parent / match.group(1).decode()).resolve()
        if inc not in seen and inc.is_file():
            parts.append(_source_text(inc, seen | {source.resolve(), inc}))
    return b"\n".join(parts)


def _build(name: str) -> ctypes.CDLL | None:
    source = _SOURCES / f"{name}.c"
    cc = _compiler()
    if cc is None or not source.is_file():
        return None
    text = _source_text(source)
    key = hashlib.sha256(text + " ".join((cc, *CFLAGS, platform.machine(), platform.node()))
                         .encode()).hexdigest()[:16]
    suffix = ".dll" if os.name == "nt" else ".so"
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / "torchbandits-native"):
        target = folder / f"{name}-{key}{suffix}"
        if target.is_file():
            try:
                return ctypes.CDLL(str(target))
            except OSError:
                pass
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=suffix, dir=folder)
            os.close(fd)
        except OSError:
            continue  # not writable: the next folder
        try:
            done = subprocess.run([cc, *CFLAGS, "-o", tmp, str(source), "-lm"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                warnings.warn(f"torchbandits.native: building {name}.c failed; the torch path is "
                              f"used instead ({done.stderr.strip()[:500]})", RuntimeWarning,
                              stacklevel=3)
                return None
            os.replace(tmp, target)
            return ctypes.CDLL(str(target))
        except (OSError, subprocess.SubprocessError) as err:
            warnings.warn(f"torchbandits.native: {name}.c not available ({err}); the torch path "
                          "is used instead", RuntimeWarning, stacklevel=3)
            return None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return None


def library(name: str) -> ctypes.CDLL | None:
    """The compiled library of ``torchbandits/native/<name>.c`` (built once per process and cached
    on disk), or ``None`` when compiled kernels are off or unavailable (see the module docstring).
    A failed build warns once and is not retried in this process."""
    if not enabled():
        return None
    try:
        return _LIBS[name]
    except KeyError:
        pass
    with _LOCK:
        if name not in _LIBS:
            _LIBS[name] = _build(name)
        return _LIBS[name]


_SIGNED: dict[str, ctypes.CDLL] = {}   # name -> the loaded library whose signatures are set


def signed(name: str, signatures: Mapping[str, tuple[Sequence[Any], Any]]) -> ctypes.CDLL | None:
    """:func:`library` ``(name)`` with the argument and result types of its functions set from
    ``signatures`` (``{function: (argtypes, restype)}``) once per loaded library, or ``None``.
    The hot path (a library already loaded and signed, switched on) is the switch and two dict
    lookups."""
    if not enabled():
        return None
    lib = _SIGNED.get(name)
    if lib is not None and _LIBS.get(name) is lib:
        return lib
    lib = library(name)
    if lib is None or _SIGNED.get(name) is lib:
        return lib
    for fn, (args, result) in signatures.items():
        entry = getattr(lib, fn)
        entry.argtypes = list(args)
        entry.restype = result
    _SIGNED[name] = lib
    return lib


def forget(name: str) -> None:
    """Drop this process's record of ``name`` (the next :func:`library` call loads or builds it
    again, e.g. after ``CC`` changed)."""
    with _LOCK:
        _LIBS.pop(name, None)


def pointer(tensor: Tensor, row: int = 0) -> ctypes.c_void_p:
    """The address of a tensor's first element, or of row ``row`` along its first dimension (a
    slice's pointer without making a view), for a C argument (the caller checks that it is a CPU
    tensor of the dtype and layout the C function expects)."""
    if not row:
        return ctypes.c_void_p(tensor.data_ptr())
    return ctypes.c_void_p(tensor.data_ptr() + row * tensor.stride(0) * tensor.element_size())

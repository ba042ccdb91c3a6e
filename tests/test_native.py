"""The loader of the optional compiled kernels (torchbandits.native)."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from torchbandits import native

needs_cc = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")),
                              reason="no C compiler")


def _axpy(lib: ctypes.CDLL, a: float, x: torch.Tensor, y: torch.Tensor) -> None:
    lib.axpy.argtypes = [ctypes.c_long, ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p]
    lib.axpy.restype = None
    lib.axpy(x.numel(), a, native.pointer(x), native.pointer(y))


@needs_cc
def test_builds_once_and_computes(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHBANDITS_CACHE", str(tmp_path))
    native.forget("selftest")
    lib = native.library("selftest")
    assert lib is not None and native.library("selftest") is lib
    assert len(list((tmp_path / "native").glob("selftest-*"))) == 1
    x = torch.arange(7, dtype=torch.float64)
    y = torch.full((7,), 0.5, dtype=torch.float64)
    _axpy(lib, -3.0, x, y)
    assert torch.equal(y, 0.5 - 3.0 * torch.arange(7, dtype=torch.float64))
    native.forget("selftest")  # a new process finds the cached build: no second file
    assert native.library("selftest") is not None
    assert len(list((tmp_path / "native").glob("selftest-*"))) == 1
    native.forget("selftest")


def test_switches_off():
    with native.disabled():
        assert not native.enabled() and native.library("selftest") is None
        with native.disabled():
            pass
        assert not native.enabled()
    assert native.enabled() or native.library("selftest") is None


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("TORCHBANDITS_NATIVE", "0")
    assert native.library("selftest") is None


def test_failed_build_warns_and_falls_back(tmp_path, monkeypatch):
    if shutil.which("false") is None:
        pytest.skip("no `false` program")
    monkeypatch.setenv("TORCHBANDITS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    native.forget("selftest")
    with pytest.warns(RuntimeWarning, match="selftest.c"):
        assert native.library("selftest") is None
    assert native.library("selftest") is None  # not retried
    native.forget("selftest")


def test_unknown_source_is_none():
    native.forget("no_such_kernel")
    assert native.library("no_such_kernel") is None


def test_cache_key_text_follows_quoted_includes(tmp_path):
    """A build's key covers the files a source includes by ``#include "..."`` (recursively, once
    each), so editing a shared header rebuilds every library that includes it."""
    from torchbandits.native import _source_text

    (tmp_path / "a.c").write_text('#include "b.h"\n#include <math.h>\nint a;\n')
    (tmp_path / "b.h").write_text('#include "c.h"\n#include "a.c"\nint b;\n')  # a cycle back to a.c
    (tmp_path / "c.h").write_text("int c;\n")
    text = _source_text(tmp_path / "a.c")
    assert text.count(b"int a;") == 1 and b"int b;" in text and b"int c;" in text
    (tmp_path / "c.h").write_text("int c2;\n")
    assert _source_text(tmp_path / "a.c") != text


@needs_cc
def test_signed_sets_the_signatures_once_per_loaded_library(tmp_path, monkeypatch):
    """``signed`` returns the library with its functions' argument and result types set, sets them
    again for a library loaded anew (after ``forget``), and is ``None`` while switched off."""
    monkeypatch.setenv("TORCHBANDITS_CACHE", str(tmp_path))
    native.forget("selftest")
    sig = {"axpy": ([ctypes.c_long, ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p], None)}
    lib = native.signed("selftest", sig)
    assert lib is not None and lib.axpy.restype is None and len(lib.axpy.argtypes) == 4
    lib.axpy.argtypes = []                 # not reset while the same library stays loaded
    assert native.signed("selftest", sig).axpy.argtypes == []
    native.forget("selftest")
    again = native.signed("selftest", sig)
    assert again is not lib and len(again.axpy.argtypes) == 4
    x = torch.ones(3, dtype=torch.float64)
    y = torch.zeros(3, dtype=torch.float64)
    again.axpy(3, 2.0, x.data_ptr(), y.data_ptr())
    assert torch.equal(y, torch.full((3,), 2.0, dtype=torch.float64))
    with native.disabled():
        assert native.signed("selftest", sig) is None
    native.forget("selftest")

"""The arithmetic of the compiled scoring call (torchbandits/native/exact_step.c) against torch:
``K_SC`` by the closed forms, the blocked forward substitution ``V_r = L_r⁻¹ K_SC`` (4 × 12 register
tiles over packed panels, padded rows and columns), ``μ_r = z_rᵀ V_r``, ``colsum V_r²`` and
``ρ²_r``, at the sizes where the blocking has edges (rows not a multiple of 4, candidates not a
multiple of 4 or 12), on factors stored as a GrowingCholesky head ``[n0, n0]`` plus tail rows (an
empty head, an empty tail), ill-conditioned ones included, with five factors (DMM), and built
without AVX (the portable loops)."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from torchbandits import native
from torchbandits.native import exact as nx

pytestmark = pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")

_F64 = torch.float64
NAN = float("nan")


def _closed_form(kind: str, dist: torch.Tensor) -> torch.Tensor:
    """The kernel of scaled squared distances ``D`` (as kernel_fast.ScaledStationary)."""
    if kind == "rbf":
        return torch.exp(-dist)
    u = dist.sqrt()
    return {"m12": torch.exp(-u), "m32": (1.0 + u) / torch.exp(u),
            "m52": (u + dist / 3.0 + 1.0) / torch.exp(u)}[kind]


CODES = {"rbf": nx.KINDS[("rbf", float("inf"))], "m12": nx.KINDS[("matern", 0.5)],
         "m32": nx.KINDS[("matern", 1.5)], "m52": nx.KINDS[("matern", 2.5)]}


def _data(n: int, a: int, d: int = 3, seed: int = 0, ell: float = 0.3):
    """Points and candidates in ``[0, 1]^d``, per-dimension weights ``w`` (the scaled points
    ``xs = x·w``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=_F64)
    cand = torch.rand(a, d, generator=g, dtype=_F64)
    weight = torch.linspace(0.8, 1.2, d, dtype=_F64) * (5.0 ** 0.5 / ell)
    return (x * weight).contiguous(), cand, weight


def _factor(xs: torch.Tensor, kind: str, reg: float, n0: int, seed: int = 1):
    """``L`` of ``K + reg·I`` as (head ``[n0, n0]``, tail ``[n − n0, n + 3]``), the parts the C code
    must not read (above the diagonal, right of it in the tail) NaN; ``z`` ``[n]``."""
    n = xs.shape[0]
    gram = _closed_form(kind, torch.cdist(xs, xs).square())
    chol = torch.linalg.cholesky(gram + reg * torch.eye(n, dtype=_F64))
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    stored = chol.masked_fill(upper, NAN)
    head = stored[:n0, :n0].contiguous()
    tail = torch.full((n - n0, n + 3), NAN, dtype=_F64)
    tail[:, :n] = stored[n0:]
    z = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=_F64)
    return chol, head, tail, z


def _score(xs, cand, weight, kind: str, factors, outscale=None, kdiag=1.0, lib=None):
    """One call (of ``lib``, default the library) with every output kept:
    ``(kq, v, mean, sumsq, var)``."""
    n, a, r = xs.shape[0], cand.shape[0], len(factors)
    table = [(h.data_ptr(), h.shape[0], t.data_ptr(), t.shape[1], z.data_ptr())
             for _, h, t, z in factors]
    v = torch.full((r, n, a), NAN, dtype=_F64)
    mean, sumsq, var = (torch.full((r, a), NAN, dtype=_F64) for _ in range(3))
    kq = torch.full((n, a), NAN, dtype=_F64)
    cs = torch.full((a, xs.shape[1]), NAN, dtype=_F64)
    nx.score(lib or nx.available(), n, xs, cand, weight, CODES[kind], outscale, kdiag, table,
             (v, mean, sumsq), (cs, kq, var))
    torch.testing.assert_close(cs, cand * weight, rtol=0.0, atol=0.0)
    return kq, v, mean, sumsq, var


def _check(kq, v, mean, sumsq, var, factors, kdiag: float, tol: float) -> None:
    """Each factor's outputs against torch's solve of the kept ``K_SC``."""
    for r, (chol, _, _, z) in enumerate(factors):
        ref = torch.linalg.solve_triangular(chol, kq, upper=False)
        scale = ref.abs().max().clamp_min(1e-300)
        assert float((v[r] - ref).abs().max() / scale) < tol, r
        torch.testing.assert_close(mean[r], z @ ref, rtol=0.0, atol=tol * float(scale * z.abs().sum()))
        sq = (ref * ref).sum(0)
        torch.testing.assert_close(sumsq[r], sq, rtol=tol, atol=tol * float(sq.max().clamp_min(1e-300)))
        torch.testing.assert_close(var[r], (kdiag - sumsq[r]).clamp_min(0.0), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("a", [1, 3, 4, 5, 12, 13, 100, 257])
@pytest.mark.parametrize("n", [1, 5, 6, 7, 13, 64, 257, 500])
def test_solve_matches_torch_at_the_block_edges(n, a):
    xs, cand, weight = _data(n, a)
    fac = _factor(xs, "m52", 0.1, n // 2)
    kq, v, mean, sumsq, var = _score(xs, cand, weight, "m52", [fac])
    ref = _closed_form("m52", torch.cdist(xs, cand * weight).square())
    torch.testing.assert_close(kq, ref, rtol=1e-13, atol=1e-15)
    _check(kq, v, mean, sumsq, var, [fac], 1.0, 1e-13)


@pytest.mark.parametrize("n", [13, 257])
@pytest.mark.parametrize("where", ["empty_head", "head_1", "half", "tail_1", "empty_tail"])
def test_head_and_tail_splits(n, where):
    n0 = {"empty_head": 0, "head_1": 1, "half": n // 2, "tail_1": n - 1, "empty_tail": n}[where]
    xs, cand, weight = _data(n, 29, seed=2)
    fac = _factor(xs, "m32", 0.01, n0)
    _check(*_score(xs, cand, weight, "m32", [fac]), [fac], 1.0, 1e-13)


@pytest.mark.parametrize("n", [64, 257, 500])
def test_ill_conditioned_factors(n):
    """Matérn-5/2 data at λ = 1e-4 (κ(K + λI) = κ(L)² from 3e5 to 4e6): V to 1e-12 of its
    largest entry."""
    xs, cand, weight = _data(n, 100, seed=3, ell=1.0)
    fac = _factor(xs, "m52", 1e-4, n - n // 3)
    assert float(torch.linalg.cond(fac[0])) > 500.0
    _check(*_score(xs, cand, weight, "m52", [fac]), [fac], 1.0, 1e-12)


@pytest.mark.parametrize("n", [5, 70, 257])
def test_five_factors_share_one_kernel_block(n):
    """DMM: five regularisers, each factor its own head/tail split; every V_r, μ_r, ρ²_r."""
    xs, cand, weight = _data(n, 100, seed=4)
    regs = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    factors = [_factor(xs, "m52", reg, (n * (r + 1)) // 6, seed=r) for r, reg in enumerate(regs)]
    out = _score(xs, cand, weight, "m52", factors)
    _check(*out, factors, 1.0, 1e-12)
    one = _score(xs, cand, weight, "m52", factors[2:3])  # a factor alone: the same numbers
    torch.testing.assert_close(one[1][0], out[1][2], rtol=0.0, atol=0.0)


def _kernel_only(xs, cand, weight, kind: str, outscale=None) -> torch.Tensor:
    """``K_SC`` of one call without factors."""
    n, a = xs.shape[0], cand.shape[0]
    kq = torch.full((n, a), NAN, dtype=_F64)
    v, empty = torch.empty(0, n, a, dtype=_F64), torch.empty(0, a, dtype=_F64)
    nx.score(nx.available(), n, xs, cand, weight, CODES[kind], outscale, 1.0, [], (v, empty, empty),
             (None, kq, None))
    return kq


@pytest.mark.parametrize("kind", list(CODES))
def test_closed_forms_with_an_output_scale(kind):
    """``K_SC`` of every closed form with an output scale against torch (the distances rounded in
    another order: 1e-13), and the solve from it."""
    xs, cand, weight = _data(37, 23, seed=5)
    ref = 2.5 * _closed_form(kind, torch.cdist(xs, cand * weight).square())
    torch.testing.assert_close(_kernel_only(xs, cand, weight, kind, 2.5), ref, rtol=1e-13,
                               atol=1e-300)
    fac = _factor(xs, kind, 0.1, 20)
    kq, v, mean, sumsq, var = _score(xs, cand, weight, kind, [fac], 2.5, 2.5)
    torch.testing.assert_close(kq, ref, rtol=1e-13, atol=1e-300)
    _check(kq, v, mean, sumsq, var, [fac], 2.5, 1e-13)


@pytest.mark.parametrize("kind", list(CODES))
def test_vectorised_exp_to_a_few_ulps(kind):
    """Exactly representable distances (multiples of 1/8 on a line: ``D`` and ``u = √D`` exact
    in both), so ``K_SC`` differs from torch's only by the vectorised exp: a few units in the last
    place over exp arguments in [-784, 0] and u in [0, 800]; the arguments past [-708, 709]
    (subnormal results, underflow to 0) are redone by libm."""
    near = torch.arange(0, 28 * 8, 3, dtype=_F64) / 8.0  # D up to 784: exp(-D) down to 0
    far = torch.arange(0, 800 * 8, 97, dtype=_F64) / 8.0  # u up to 800: exp(u) overflows
    xs = torch.cat([near, far]).unsqueeze(1).contiguous()
    cand = (torch.arange(0, 23, dtype=_F64) * 11.0 / 8.0).unsqueeze(1)
    weight = torch.ones(1, dtype=_F64)
    dist = (xs - cand.T).square()
    ref = _closed_form(kind, dist)
    got = _kernel_only(xs, cand, weight, kind)
    tiny = torch.finfo(_F64).tiny
    normal = ref.abs() >= tiny
    assert int(normal.sum()) > 500 and bool((~normal).any())
    torch.testing.assert_close(got[normal], ref[normal], rtol=1e-15, atol=0.0)
    torch.testing.assert_close(got[~normal], ref[~normal], rtol=0.0, atol=tiny * 1e-3)


def _build(tmp_path_factory, tag: str, arch: list[str]):  # type: ignore[no-untyped-def]
    """exact_step.c built with ``-march=native`` replaced by ``arch``, its argument types those
    of the native build."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs a C compiler for x86-64")
    out = tmp_path_factory.mktemp(tag) / f"exact_step_{tag}.so"
    flags = [g for f in native.CFLAGS for g in (arch if f == "-march=native" else [f])]
    source = Path(nx.__file__).with_name("exact_step.c")
    subprocess.run([cc, *flags, "-o", str(out), str(source), "-lm"], check=True, timeout=120)
    lib = ctypes.CDLL(str(out))
    for name in ("tb_exact_score", "tb_exact_append"):
        ref = getattr(nx.available(), name)
        getattr(lib, name).argtypes, getattr(lib, name).restype = ref.argtypes, ref.restype
    return lib


@pytest.fixture(scope="module")
def plain_library(tmp_path_factory):
    """exact_step.c built for plain x86-64 (no AVX, no FMA instructions: the portable loops of
    the forward substitution, fma() from libm)."""
    return _build(tmp_path_factory, "plain", ["-march=x86-64"])


@pytest.fixture(scope="module")
def avx2_library(tmp_path_factory):
    """exact_step.c built for this CPU without AVX-512 (the 4-wide tiles), where it has it."""
    if not _has_avx512():
        pytest.skip("the native build is the AVX2 build already")
    return _build(tmp_path_factory, "avx2", ["-march=native", "-mno-avx512f"])


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize(("n", "a"), [(1, 1), (7, 5), (13, 29), (64, 100), (70, 28), (257, 13),
                                      (33, 57)])
def test_avx512_tiles_give_the_avx2_bits(avx2_library, n, a):
    """The 8-wide tiles and panel sums make every entry by the 4-wide ones' operations in the same
    order: the same bits for every panel cut (A = 100: 24·3 + 16 + 16; 28: 24 + 8, 57: …)."""
    xs, cand, weight = _data(n, a, seed=8)
    factors = [_factor(xs, "m52", reg, n // 3, seed=r) for r, reg in enumerate((1e-3, 0.1))]
    narrow = _score(xs, cand, weight, "m52", factors, lib=avx2_library)
    wide = _score(xs, cand, weight, "m52", factors)
    for got, want in zip(narrow, wide, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("n", "a"), [(1, 1), (7, 5), (13, 29), (64, 100), (257, 13)])
def test_portable_loops_match(plain_library, n, a):
    """Without AVX and FMA: the same numbers as torch (and as the vectorised build)."""
    xs, cand, weight = _data(n, a, seed=6)
    factors = [_factor(xs, "m52", reg, n // 3, seed=r) for r, reg in enumerate((1e-3, 0.1))]
    out = _score(xs, cand, weight, "m52", factors, lib=plain_library)
    _check(*out, factors, 1.0, 1e-13)
    vec = _score(xs, cand, weight, "m52", factors)
    for got, want in zip(out, vec):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-300)

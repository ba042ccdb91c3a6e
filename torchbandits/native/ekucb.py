"""The compiled CPU products of a batched EK-UCB round (``ekucb_batch.c``; Zenati et al. 2022,
Prop. 4.2 and Algorithms 2, 4 and 5), run by run at each run's own dictionary size: the scores,
the KORS quadratic form and probabilities, the deferred Sherman–Morrison step, the RBF blocks and
the compacted growth of the posterior and of KORS (:func:`grow`, :func:`kors_grow`, whose
arguments reach C packed in two arrays).

Each function returns ``None`` (the caller takes its torch path, the reference) when compiled
kernels are off or unavailable (:func:`torchbandits.native.library`) or when a tensor does not
qualify: every tensor must be a float64 CPU tensor whose last dimension is contiguous (the per-run
matrices may be views of padded buffers: their run and row strides are passed), the sizes an int64
CPU tensor ``[R]``. Every run's matrices are read on ``[:m_r, :m_r]`` (the sizes), where the torch
path multiplies padded chunks: the padding is zero, so the results agree up to rounding.
"""

from __future__ import annotations

import ctypes
import functools
from array import array
from collections.abc import Callable

import torch
from torch import Tensor

from . import pointer, signed

__all__ = ["RBF_MAX_DIM", "available", "f64_rows", "grow", "kors_grow", "kors_probability",
           "rank_one_sub", "rbf_block", "rbf_exponent", "score"]

_I64, _PTR, _F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
#: columns of a tile of ``ekucb_score`` (its scratch is ``3·W·TILE_COLUMNS`` doubles)
TILE_COLUMNS = 12
_SIGNATURES = {
    "ekucb_score": [_I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _I64,
                    _PTR, _F64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64],
    "ekucb_rank1_sub": [_I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR],
    "ekucb_rbf_exponent": [_I64, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64, _F64, _PTR],
    "ekucb_rbf_block": [_I64, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64, _F64, _PTR],
}
_PACKED = {   # packed arguments (int64 and double arrays): (argument types, result type)
    "ekucb_grow": ([_PTR, _PTR], _I64),
    "ekucb_kors_grow": ([_PTR, _PTR], _I64),
    "ekucb_kors_prob": ([_PTR, _PTR], None),
}
#: the input dimensions where :func:`rbf_exponent` is torch's ``cdist`` to the bit (its loop sums
#: the coordinates' squares in order there; for some larger dimensions it does not, measured)
RBF_MAX_DIM = 2
_SIGNED_ARGS = {**{name: (args, None) for name, args in _SIGNATURES.items()},
                **_PACKED}  # built once: hot path


#: the library with its signatures set (once per loaded library), or ``None`` (a partial: one
#: Python frame fewer on a lookup made ~10 times a round)
_lib: Callable[[], ctypes.CDLL | None] = functools.partial(signed, "ekucb_batch", _SIGNED_ARGS)


def f64_rows(*tensors: Tensor) -> bool:
    """Whether every tensor is a float64 CPU tensor with a contiguous last dimension (what the
    compiled EK-UCB kernels take: run and row strides are passed)."""
    for t in tensors:   # a plain loop: called ~30 times a round
        if t.dtype != torch.float64 or not t.is_cpu or t.stride(-1) != 1:
            return False
    return True


def _sizes_ok(sizes: Tensor, runs: int) -> bool:
    return (sizes.device.type == "cpu" and sizes.dtype == torch.int64 and sizes.dim() == 1
            and sizes.shape[0] == runs and sizes.is_contiguous())


def available(*tensors: Tensor) -> bool:
    """Whether the compiled path would run on ``tensors`` (float64 CPU, last dimension
    contiguous) — no build is attempted when they do not qualify."""
    return f64_rows(*tensors) and _lib() is not None


def score(kz: Tensor, p: Tensor, q: Tensor, g: Tensor, sizes: Tensor, kdiag: Tensor, lam: float,
          p_lower: bool = False, pending: tuple[Tensor, Tensor, Tensor] | None = None
          ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """The posterior scores of ``R`` runs of ``A`` candidates (``ekucb_score``): kernel columns
    ``kz`` ``[R, A, W]`` (made contiguous), ``P`` and ``Q`` ``[R, ≥W, ≥W]``, ``g`` ``[R, ≥W]``,
    sizes ``m_r ≤ W`` ``[R]``, ``k(x, x)`` ``kdiag`` ``[R, A]``. Returns ``(mean, var, f, qf)``:
    ``μ̃ = e(x)ᵀQg`` and ``((k − ‖e‖²)₊ + λ e(x)ᵀQe(x))₊`` ``[R, A]`` (not yet clamped at ``k``),
    ``f = P k_Z(x)`` ``[R, A, W]`` and ``[Q e(x); Qg]`` ``[R, A + 1, W]``, zero beyond ``m_r``;
    ``None`` where the compiled path does not apply. ``p_lower``: every ``P_r`` is lower triangular
    (its product skips the zeros above the diagonal: the same numbers, half the reads).
    ``pending = (a, b, flags)``: the runs with ``flags[r]`` (int64 ``[R]``) first take a deferred
    Sherman–Morrison step ``Q_r −= a_r b_rᵀ`` (``a``, ``b`` ``[R, ≥m_r]``: the caller keeps a
    flagged run's size where it was at the append; the numbers of :func:`rank_one_sub`), fused
    into the pass over ``Q`` (``Q`` is written)."""
    r, a, w = kz.shape
    if (a == 0 or not f64_rows(kz, p, q, g, kdiag) or not _sizes_ok(sizes, r)
            or min(p.shape[1], p.shape[2], q.shape[1], q.shape[2], g.shape[1]) < w
            or p.shape[0] != r or q.shape[0] != r or g.shape[0] != r
            or tuple(kdiag.shape) != (r, a)):
        return None
    if pending is not None and (not f64_rows(pending[0], pending[1]) or not _sizes_ok(pending[2], r)
                                or pending[0].shape[0] != r or pending[1].shape[0] != r):
        return None
    lib = _lib()
    if lib is None:
        return None
    kz = kz.contiguous()
    kdiag = kdiag.contiguous()
    f = kz.new_empty(r, a, w)
    qf = kz.new_empty(r, a + 1, w)
    mean = kz.new_empty(r, a)
    var = kz.new_empty(r, a)
    work = kz.new_empty(3 * w * TILE_COLUMNS)
    lib.ekucb_score(r, a, w, pointer(sizes), pointer(kz), pointer(p), p.stride(0), p.stride(1),
                    int(bool(p_lower)), pointer(q), q.stride(0), q.stride(1), pointer(g), g.stride(0),
                    pointer(kdiag), float(lam), pointer(f), pointer(qf), pointer(mean),
                    pointer(var), pointer(work),
                    None if pending is None else pointer(pending[2]),
                    None if pending is None else pointer(pending[0]),
                    None if pending is None else pointer(pending[1]),
                    0 if pending is None else pending[0].stride(0),
                    0 if pending is None else min(pending[0].shape[1], pending[1].shape[1]))
    return mean, var, f, qf


def rank_one_sub(q: Tensor, a: Tensor, b: Tensor, sizes: Tensor, runs: Tensor | None = None
                 ) -> bool:
    """``Q_r[:m_r, :m_r] −= a_r b_rᵀ`` in place (``ekucb_rank1_sub``): ``Q`` ``[R, ≥m, ≥m]``,
    ``a``, ``b`` ``[R, ≥m]``, for every run or only the distinct ``runs`` (int64 ``[k]``).
    Returns whether it ran (else the caller does it in torch)."""
    r = q.shape[0]
    if not f64_rows(q, a, b) or not _sizes_ok(sizes, r):
        return False
    if runs is not None and not (runs.device.type == "cpu" and runs.dtype == torch.int64
                                 and runs.dim() == 1 and runs.is_contiguous()):
        return False
    lib = _lib()
    if lib is None:
        return False
    width = min(q.shape[1], q.shape[2], a.shape[1], b.shape[1])
    lib.ekucb_rank1_sub(r if runs is None else runs.shape[0], width, pointer(sizes), pointer(q),
                        q.stride(0), q.stride(1), pointer(a), a.stride(0), pointer(b), b.stride(0),
                        None if runs is None else pointer(runs))
    return True


def rbf_exponent(a: Tensor, b: Tensor, c: float) -> Tensor | None:
    """``c·‖a_i − b_j‖²`` ``[R, na, nb]`` of ``a`` ``[R, na, d]`` and ``b`` ``[R, nb, d]``
    (``ekucb_rbf_exponent``), bit for bit ``torch.cdist(a, b, compute_mode=
    "donot_use_mm_for_euclid_dist").square_().mul_(c)``: the exponent of the RBF block, whose
    ``exp_`` the caller takes in torch (so the block keeps torch's rounding). ``None`` (the caller
    takes the torch path) unless both are float64 CPU tensors with contiguous coordinates, the
    same ``R`` and ``d ≤`` :data:`RBF_MAX_DIM`."""
    return _rbf("ekucb_rbf_exponent", a, b, c, RBF_MAX_DIM)


def rbf_block(a: Tensor, b: Tensor, c: float) -> Tensor | None:
    """The RBF block ``exp(c·‖a_i − b_j‖²)`` ``[R, na, nb]`` itself (``ekucb_rbf_block``), for
    the compiled score: the exponent as :func:`rbf_exponent`'s, the exponential vectorised in C
    (within about an ulp of torch's ``exp_``, **not** bit for bit). Any ``d``; ``None`` where the
    tensors do not qualify (as :func:`rbf_exponent`)."""
    return _rbf("ekucb_rbf_block", a, b, c, None)


def _rbf(name: str, a: Tensor, b: Tensor, c: float, max_dim: int | None) -> Tensor | None:
    if (a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]
            or (max_dim is not None and a.shape[2] > max_dim) or not f64_rows(a, b)):
        return None
    lib = _lib()
    if lib is None:
        return None
    r, na, d = a.shape
    nb = b.shape[1]
    out = a.new_empty(r, na, nb)
    if out.numel():
        getattr(lib, name)(r, na, nb, d, pointer(a), a.stride(0), a.stride(1), pointer(b),
                           b.stride(0), b.stride(1), float(c), pointer(out))
    return out


def _runs_ok(runs: Tensor) -> bool:
    return (runs.device.type == "cpu" and runs.dtype == torch.int64 and runs.dim() == 1
            and runs.is_contiguous())


def _address(t: Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def grow(runs: Tensor, f: Tensor, omega: Tensor, accept: Tensor, kzz: Tensor | float,
         min_residual: float, n: int, x: Tensor, krow: Tensor | float, e: Tensor, p: Tensor,
         p_lower: bool, q: Tensor, pending: tuple[Tensor, Tensor, Tensor] | None, g: Tensor,
         s: Tensor, c: Tensor | None, z: Tensor, logdet: Tensor, sizes: Tensor, refused: Tensor,
         lam: float, strict: bool) -> tuple[Tensor, int, Tensor, int] | None:
    """The posterior's growth of the distinct ``runs`` (int64 ``[k]``) in place (``ekucb_grow``;
    Zenati et al. 2022, Algorithm 4), each at its own size ``m_r``: the last point
    ``z = x_{n−1}`` joins run ``r``'s dictionary where ``accept`` (bool ``[k]``) holds and the
    guard ``ω > min_residual·k(z,z)`` passes (``omega`` ``[k]``, ``kzz`` ``[k]`` or a float;
    ``refused[r]`` ``+= 1`` where it fails), with ``f = e(z)`` ``f[j, :m_r]`` (``f`` ``[k, W]``,
    ``W ≥ m_r``) and ``d = √ω``. ``krow``: the kernel rows ``k_S(z)`` ``[k, n]``, or the RBF
    constant ``c`` (``k = exp(c‖x − z‖²)``, computed in C as :func:`rbf_block` does). A growing
    run first takes its ``pending`` Sherman–Morrison step of ``Q`` (``(a, b, flags)`` as the
    model defers it; then ``flags[r] = 0``, ``a[r] = 0``). Writes ``E[r, :n, m_r]`` ``= e =
    (k_S(z) − E f)/d``, ``Q ← Q + u uᵀ/s`` (``u = [Q b; −1]``, ``b = Eᵀ C e``, ``s = eᵀCe + λ −
    bᵀQb``), ``P[r, m_r] = [−Pᵀf/d, 1/d]``, ``g[r, m_r] = eᵀs``, ``z[r, m_r]``, ``log det += log
    s``, ``m_r += 1`` — unless ``strict`` and some ``s`` is not positive (then none of these).
    ``x`` ``[R, ≥n, d]``, ``E`` ``[R, ≥n, ≥W+1]``, ``P``, ``Q`` ``[R, ≥W+1, ≥W+1]``, ``g``
    ``[R, ≥W+1]``, reward sums ``s`` and counts ``c`` ``[R, ≥n]`` (``None``: unit counts),
    anchors ``z`` ``[R, ≥W+1, d]``, ``logdet`` ``[R]``, ``sizes`` and ``refused`` int64 ``[R]``.
    Returns ``(ok, failed, bad, grown)``: the mask ``[k]`` of the runs that passed the guard,
    the number of runs whose ``s`` is not positive and their flags ``[R]``, the number of runs
    that grew; ``None`` where the compiled path does not apply (nothing written).

    Rounding: each row of ``E`` is read once (``E f`` by :func:`dot4`'s four partial sums, then
    ``Eᵀ C e`` accumulated row by row with one FMA a term, while the row is in L1), ``Qb`` by
    ``dot4`` rows, ``Pᵀf`` by ``P``'s rows in order, the RBF's exponential ``exp4`` (within about
    an ulp of torch's) — not the batched torch products' order: the state agrees with the torch
    border to rounding (~1e-12 relative on well-conditioned runs), not bit for bit."""
    k, w = f.shape
    r, d = x.shape[0], x.shape[2]
    const, kconst = not isinstance(krow, Tensor), not isinstance(kzz, Tensor)
    if (k == 0 or not f64_rows(f, omega, x, e, p, q, g, s, z, logdet) or not _runs_ok(runs)
            or not _sizes_ok(sizes, r) or not _sizes_ok(refused, r) or runs.shape[0] != k
            or omega.shape[0] != k or accept.dtype != torch.bool or accept.shape != (k,)
            or not (f.is_contiguous() and omega.is_contiguous() and logdet.is_contiguous()
                    and accept.is_contiguous() and accept.is_cpu)
            or min(e.shape[2], p.shape[1], p.shape[2], q.shape[1], q.shape[2], g.shape[1],
                   z.shape[1]) < w + 1 or min(e.shape[1], x.shape[1], s.shape[1]) < n or n < 1
            or (c is not None and (not f64_rows(c) or c.shape[1] < n))
            or (not const and (not f64_rows(krow) or krow.shape != (k, n)))  # type: ignore[union-attr]
            or (not kconst and (not f64_rows(kzz) or not kzz.is_contiguous()  # type: ignore[arg-type]
                                or kzz.shape != (k,)))  # type: ignore[union-attr]
            or not (e.shape[0] == p.shape[0] == q.shape[0] == g.shape[0] == s.shape[0]
                    == z.shape[0] == logdet.shape[0] == r)):
        return None
    pa, pb, flags = pending if pending is not None else (None, None, None)
    if pa is not None and (not f64_rows(pa, pb) or not _sizes_ok(flags, r)  # type: ignore[arg-type]
                           or not pa.is_contiguous() or pa.shape[0] != r
                           or pb.stride() != pa.stride() or pb.shape != pa.shape):  # type: ignore[union-attr]
        return None
    lib = _lib()
    if lib is None:
        return None
    work = f.new_empty(n + w + 1 + k * (2 * w + 3))
    ok = torch.empty(k, dtype=torch.bool)
    bad = torch.zeros(r, dtype=torch.bool)
    iv = array("q", (
        k, runs.data_ptr(), w, n, d, accept.data_ptr(), 0 if kconst else kzz.data_ptr(),  # type: ignore[union-attr]
        refused.data_ptr(), ok.data_ptr(), x.data_ptr(), x.stride(0), x.stride(1),
        0 if const else krow.data_ptr(), 0 if const else krow.stride(0),  # type: ignore[union-attr]
        e.data_ptr(), e.stride(0), e.stride(1), p.data_ptr(), p.stride(0), p.stride(1),
        int(bool(p_lower)), q.data_ptr(), q.stride(0), q.stride(1), _address(flags),
        _address(pa), _address(pb), 0 if pa is None else pa.stride(0),
        0 if pa is None else pa.shape[1], g.data_ptr(), g.stride(0), s.data_ptr(), s.stride(0),
        _address(c), 0 if c is None else c.stride(0), z.data_ptr(), z.stride(0), z.stride(1),
        logdet.data_ptr(), sizes.data_ptr(), f.data_ptr(), f.stride(0), omega.data_ptr(),
        int(bool(strict)), work.data_ptr(), bad.data_ptr(), 0))
    dv = array("d", (float(kzz) if kconst else 0.0, float(min_residual),  # type: ignore[arg-type]
                     float(krow) if const else 0.0, float(lam)))  # type: ignore[arg-type]
    failed = lib.ekucb_grow(iv.buffer_info()[0], dv.buffer_info()[0])
    return None if failed < 0 else (ok, failed, bad, iv[46])


def kors_grow(runs: Tensor, accept: Tensor, kz: Tensor, kss: Tensor | float, p: Tensor,
              nz: Tensor, pt: Tensor, sizes: Tensor, mu: float, strict: bool
              ) -> tuple[int, Tensor] | None:
    """KORS's border of the distinct ``runs`` (int64 ``[k]``) where ``accept`` (bool ``[k]``)
    holds, in place (``ekucb_kors_grow``; Zenati et al. 2022, §4.2), each at its own size
    ``m_r``: with ``k = kz[j, :m_r]`` (``kz`` ``[k, W]``, ``W ≥ m_r``), ``u = [N k; −1]`` and
    ``s = k(z,z) + μ p̃ − kᵀNk`` (``kss`` ``[k]`` or a float, ``p`` ``[k]``), ``N ← N + u uᵀ/s``
    on ``[:m_r+1, :m_r+1]``, ``p̃[r, m_r] = p[j]``, ``m_r += 1`` — unless ``strict`` and some
    ``s`` is not positive (then nothing). ``N`` ``[R, ≥W+1, ≥W+1]``, ``pt`` ``[R, ≥W+1]``,
    ``sizes`` int64 ``[R]``. Returns ``(failed, bad)``: the number of runs whose ``s`` is not
    positive and their flags ``[R]``; ``None`` (nothing written) where the compiled path does
    not apply. Rounding: ``N k`` by ``dot4`` rows and ``kᵀNk`` in order (the torch border's
    batched product sums in another order: the same to rounding)."""
    k, w = kz.shape
    r = nz.shape[0]
    const = not isinstance(kss, Tensor)
    if (k == 0 or not f64_rows(kz, p, nz, pt) or not _runs_ok(runs) or not _sizes_ok(sizes, r)
            or runs.shape[0] != k or p.shape != (k,) or not p.is_contiguous()
            or accept.dtype != torch.bool or accept.shape != (k,) or not accept.is_contiguous()
            or not accept.is_cpu
            or (not const and (not f64_rows(kss) or not kss.is_contiguous()  # type: ignore[arg-type]
                               or kss.shape != (k,)))  # type: ignore[union-attr]
            or min(nz.shape[1], nz.shape[2], pt.shape[1]) < w + 1 or pt.shape[0] != r):
        return None
    lib = _lib()
    if lib is None:
        return None
    work = kz.new_empty((k + 1) * (w + 1) + k)
    bad = torch.zeros(r, dtype=torch.bool)
    iv = array("q", (
        k, runs.data_ptr(), accept.data_ptr(), w, nz.data_ptr(), nz.stride(0), nz.stride(1),
        pt.data_ptr(), pt.stride(0), sizes.data_ptr(), kz.data_ptr(), kz.stride(0),
        0 if const else kss.data_ptr(), p.data_ptr(), int(bool(strict)),  # type: ignore[union-attr]
        work.data_ptr(), bad.data_ptr()))
    dv = array("d", (float(kss) if const else 0.0, float(mu)))  # type: ignore[arg-type]
    failed = lib.ekucb_kors_grow(iv.buffer_info()[0], dv.buffer_info()[0])
    return None if failed < 0 else (failed, bad)


def kors_probability(kz: Tensor, n: Tensor, sizes: Tensor, kss: Tensor | float, mu: float,
                     eps: float, gamma: float, reference: bool) -> tuple[Tensor, Tensor] | None:
    """KORS's quadratic form ``u`` and ``p̃ = min(γ τ̃, 1)``, each ``[R]`` (``ekucb_kors_prob``;
    Zenati et al. 2022, §4.2, eq. 41 in closed form), of points with kernel columns ``kz``
    ``[R, ≥m]`` against ``N`` ``[R, ≥m, ≥m]`` at the sizes ``m_r``: ``u = kᵀNk`` over each
    run's ``m_r`` anchors (``ekucb_quad``, from ``N``'s lower triangle), then ``ρ = (k(s,s) −
    u)₊``, ``τ̃ = (1 + ε)ρ/(ρ + μ)`` (``reference``: ``((1 + ε)k(s,s)/μ − τ̃)₊``) — the numbers
    of :meth:`~torchbandits.models.batched_kors.BatchedKORS.probability`'s tensor operations on
    that ``u``, to the bit, in one call. ``kss`` ``[R]`` or a float. ``None`` where the compiled
    path does not apply."""
    r = kz.shape[0]
    const = not isinstance(kss, Tensor)
    if not const:
        kss = kss.contiguous()  # type: ignore[union-attr]
    if (not f64_rows(kz, n) or not _sizes_ok(sizes, r) or n.shape[0] != r
            or (not const and (not f64_rows(kss) or kss.shape != (r,)))):  # type: ignore[arg-type,union-attr]
        return None
    lib = _lib()
    if lib is None:
        return None
    out = kz.new_empty(2, r)   # u, p̃
    width = min(kz.shape[1], n.shape[1], n.shape[2])   # a size beyond the tensors is cut there
    iv = array("q", (r, width, sizes.data_ptr(), kz.data_ptr(), kz.stride(0), n.data_ptr(),
                     n.stride(0), n.stride(1), out.data_ptr(),
                     0 if const else kss.data_ptr(), int(bool(reference)),  # type: ignore[union-attr]
                     out.data_ptr() + 8 * r))
    dv = array("d", (float(kss) if const else 0.0, 1.0 + float(eps), float(mu),  # type: ignore[arg-type]
                     float(gamma)))
    lib.ekucb_kors_prob(iv.buffer_info()[0], dv.buffer_info()[0])
    return out[0], out[1]

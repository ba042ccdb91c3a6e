"""KORS (Zenati et al. 2022, §4.2, Algorithms 1 and 5) for ``R`` runs at once, each on its own
dictionary: the batched twin of :class:`~torchbandits.models.kors.KORS`.

Per run ``r``: acceptance probabilities ``p̃`` ``[R, cap]`` of the anchors and
``N_r = (K_ZZ + μ diag(p̃))⁻¹`` ``[R, cap, cap]``, both **zero** beyond ``m_r`` (so a padded
kernel column ``k_Z`` ``[R, M]`` adds nothing). Leverage (eq. 41 in closed form):
``u = k_Zᵀ N k_Z``, ``ρ = (k(s,s) − u)₊``, ``τ̃ = (1 + ε) ρ/(ρ + μ)`` (``score="reference"``:
``((1 + ε) k(s,s)/μ − τ̃)₊``), ``p̃ = min(γ τ̃, 1)``. Adding an anchor borders ``N`` with ``k_Z``
and ``k(s,s) + μ p̃``. The coins are the caller's (each run's own stream).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..buffers import SLOW_GROWTH, ResizableModule, grow_rows
from ..deferred_checks import active_checks, check_runs
from ..native import ekucb as native_ekucb

__all__ = ["BatchedKORS"]


class BatchedKORS(ResizableModule):
    """KORS of ``R`` runs (see the module docstring); ``mu``, ``eps``, ``gamma``, ``score`` as
    :class:`~torchbandits.models.kors.KORS` (checked there)."""

    def __init__(self, mu: float, eps: float, gamma: float, score: str, n_runs: int, *,
                 dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.mu, self.eps, self.gamma, self.score = float(mu), float(eps), float(gamma), score
        r = int(n_runs)
        self.register_buffer("_nz", torch.zeros(r, 16, 16, dtype=dtype, device=device))
        self.register_buffer("_p", torch.zeros(r, 16, dtype=dtype, device=device))
        self.register_buffer("_m", torch.zeros(r, dtype=torch.long, device=device))
        self._cache: dict[Any, Tensor] = {}   # aranges and an identity on the device
        #: ``(k_Z, N k_Z, k_Zᵀ N k_Z)`` of the last torch-path :meth:`probability` (its border
        #: reuses them: :meth:`border_terms`)
        self._probed: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def sizes(self) -> Tensor:
        """Anchors per run ``[R]``."""
        return self._m

    def probabilities(self, run: int) -> Tensor:
        """``p̃`` of the anchors of run ``run`` ``[m_r]`` (a view; one host read of ``m_r``)."""
        return self._p[run, : int(self._m[run])]

    def reset(self) -> None:
        """Empty every dictionary."""
        self._nz.zero_()
        self._p.zero_()
        self._m.zero_()
        self._probed = None

    def probability(self, kz: Tensor, kss: Tensor | float,
                    chunks: list[tuple[int, int, int]] | None = None) -> Tensor:
        """``p̃ = min(γ τ̃, 1)`` ``[R]`` of points with ``k_Z = kz`` ``[R, M]`` (``M`` at most the
        capacity; padded entries are cancelled) and ``k(s,s) = kss`` ``[R]`` (or a float). ``chunks``:
        ``(a, b, M_g)`` runs ``a..b−1`` whose dictionaries fit in ``M_g`` (computed on that slice).
        On the CPU in float64 one compiled call
        (:func:`torchbandits.native.ekucb.kors_probability`: ``k_Zᵀ N k_Z`` from ``N``'s lower
        triangle, then the operations below, the same numbers to the bit on that ``u``)."""
        mm = kz.shape[1]
        self._probed = None
        got = native_ekucb.kors_probability(kz, self._nz, self._m, kss, self.mu, self.eps,
                                            self.gamma, self.score == "reference")
        if got is not None:   # compiled, each run at m_r: the numbers of the lines below on its u
            return got[1]
        # the torch path: N k_Z as the sequential KORS (and the border) orients it, kept
        spans = chunks if chunks is not None else [(0, kz.shape[0], mm)]
        if len(spans) == 1 and spans[0][2] == mm:   # one program: no scatter
            q = (self._nz[:, :mm, :mm] @ kz[..., None])[..., 0]
            u = (kz * q).sum(-1)
        else:
            u, q = kz.new_zeros(kz.shape[0]), torch.zeros_like(kz)
            for a, b, mg in spans:
                if mg:
                    qc = (self._nz[a:b, :mg, :mg] @ kz[a:b, :mg, None])[..., 0]
                    q[a:b, :mg] = qc
                    u[a:b] = (kz[a:b, :mg] * qc).sum(-1)
        self._probed = (kz, q, u)
        rho = (kss - u).clamp_(min=0.0)
        tau = (1.0 + self.eps) * rho / (rho + self.mu)
        if self.score == "reference":
            tau = ((1.0 + self.eps) * kss / self.mu - tau).clamp_(min=0.0)
        return (self.gamma * tau).clamp_(max=1.0)

    def border_terms(self, kz: Tensor, runs: slice, w: int) -> tuple[Tensor, Tensor]:
        """``(N k_Z [k, w], k_Zᵀ N k_Z [k])`` of the runs ``runs`` at width ``w`` (``kz``
        ``[R, M]``): those of the last :meth:`probability` when it was given this ``kz`` (the
        same products, at the same chunk widths), else computed."""
        probed = self._probed
        if probed is not None and probed[0] is kz:
            return probed[1][runs, :w], probed[2][runs]
        kc = kz[runs, :w]
        q = (self._nz[runs, :w, :w] @ kc[..., None])[..., 0]
        return q, (kc * q).sum(-1)

    def add_border(self, runs: slice, rows: Tensor, pos: Tensor, v: Tensor, scaled: Tensor,
                   p: Tensor, ok: Tensor) -> None:
        """The masked KORS border of the runs ``runs`` (``k`` of them; ``rows`` their indices
        ``[k]``, ``pos`` their sizes ``[k]``) that the posterior's masked growth computed with its
        own (:meth:`~torchbandits.models.batched_nystrom.BatchedNystrom.grow_masked`, one pass for
        both): ``N ← N + v vᵀ/s'`` on the ``[w+1, w+1]`` blocks with ``v = [N k_Z; −1]`` and
        ``scaled = v/s'`` ``[k, w+1]`` (zero where refused), ``p̃`` gains ``p`` ``[k]`` where
        ``ok`` ``[k]`` holds (zero otherwise: the padding), and the sizes grow by ``ok``."""
        w1 = v.shape[1]
        self._nz[runs, :w1, :w1].addcmul_(v[:, :, None], scaled[:, None, :])
        self._p[rows, pos] = torch.where(ok, p, 0.0)
        self._m[runs].add_(ok)

    def release_probe(self) -> None:
        """Forget the last :meth:`probability`'s products (after a growth changed ``N``)."""
        self._probed = None

    def reserve(self, m: int) -> None:
        """Capacity for ``m`` anchors per run (zero padding)."""
        nz = grow_rows(self._nz, m, dims=(1, 2), **SLOW_GROWTH)
        p = grow_rows(self._p, m, dims=(1,), **SLOW_GROWTH)
        if nz is not self._nz or p is not self._p:   # (a module's buffer assignment is slow)
            self._nz, self._p = nz, p

    def add(self, kz: Tensor, kss: Tensor | float, p: Tensor, accept: Tensor,
            chunks: list[tuple[int, int, int]] | None = None, runs: Tensor | None = None) -> None:
        """The point with ``k_Z = kz`` joins the dictionaries where ``accept`` holds, with
        probabilities ``p``: ``N`` bordered with ``k_Z`` and ``k(s,s) + μ p̃``.

        ``runs=None`` (sync-free): ``kz`` ``[R, M]``, ``kss``, ``p``, ``accept`` ``[R]``; every
        run is bordered on the slices of ``chunks`` (``(a, b, W_g)``, the model's widths before
        the growth) with masked writes (a run that does not accept writes zeros into its zero
        padding). ``runs`` a LongTensor ``[k]`` of distinct runs: the arguments are ``[k, M]`` /
        ``[k]`` and only those where ``accept`` holds are touched (one host read)."""
        mm = kz.shape[1]
        self.reserve(mm + 1)
        if runs is not None:
            if self._border_compiled(runs, accept, kz, kss, p):
                return
            keep = accept.nonzero()[:, 0]   # the compacted path reads: only the growing runs
            if keep.numel():
                self._border(runs[keep], kz[keep], kss if isinstance(kss, float) else kss[keep],
                             p[keep], accept[keep], mm)
            return
        for a, b, w in chunks if chunks is not None else [(0, kz.shape[0], mm)]:
            self._border(slice(a, b), kz[a:b, :w], kss if isinstance(kss, float) else kss[a:b],
                         p[a:b], accept[a:b], w)

    def _border(self, idx: slice | Tensor, kz: Tensor, kss: Tensor | float, p: Tensor, ok: Tensor,
                w: int) -> None:
        """:meth:`add` of the runs ``idx`` (a slice: views written in place; a LongTensor:
        gathered and written back) at width ``w``. ``N`` is bordered as one rank-one update of
        its ``[w+1, w+1]`` block, ``N ← N + u uᵀ/s`` with ``u = N k_Z − e_pos`` (``N k_Z`` is
        zero from ``pos`` on): the update ``N k_Z k_Zᵀ N/s``, the border ``−N k_Z/s`` and the
        corner ``1/s`` in one write, the same numbers as three (``1/s = 0`` where refused)."""
        k, r = kz.shape[0], self._m.shape[0]
        okf = ok.to(kz.dtype)
        pos = self._m[idx]
        rows = idx if isinstance(idx, Tensor) else self._arange(idx.start, idx.stop)
        nz = self._nz[idx, : w + 1, : w + 1]
        q = (nz[:, :w, :w] @ kz[..., None])[..., 0]          # N k_Z
        s = kss + self.mu * p - (kz * q).sum(-1)
        bad = ok & ~(s > 0)
        if k != r:
            bad = torch.zeros(r, dtype=torch.bool, device=kz.device).index_put_((rows,), bad)
        check_runs("KORS add: a Schur complement must be positive", bad,
                   lambda r: f"KORS add: a Schur complement is not positive (run {r})")
        inv_s = okf / torch.where(ok, s, 1.0)                 # 0 where not accepted
        u = torch.nn.functional.pad(q, (0, 1)) - self._unit(pos, w + 1)
        nz.addcmul_(u[:, :, None], (u * inv_s[:, None])[:, None, :])
        if isinstance(idx, Tensor):
            self._nz[idx, : w + 1, : w + 1] = nz
        self._p[rows, pos] = p * okf
        if isinstance(idx, Tensor):
            self._m[idx] = pos + ok
        else:
            pos.add_(ok)          # a view of the sizes

    def _border_compiled(self, runs: Tensor, accept: Tensor, kz: Tensor, kss: Tensor | float,
                         p: Tensor) -> bool:
        """:meth:`add` of the distinct ``runs`` where ``accept`` holds by the compiled border
        (:func:`torchbandits.native.ekucb.kors_grow`: each run's ``N`` in place at its own size,
        nothing gathered, no read), or ``False`` (nothing done) where it does not apply. ``N k_Z`` and
        ``k_Zᵀ N k_Z`` are summed in another order than the torch border's batched product: the
        same to rounding, not bit for bit. A Schur complement that is not positive raises
        (nothing written) or is flagged under deferred checks (written, as the torch path)."""
        strict = active_checks() is None
        out = native_ekucb.kors_grow(runs, accept, kz, kss, p, self._nz, self._p, self._m,
                                     self.mu, strict)
        if out is None:
            return False
        failed, bad = out
        if failed or not strict:
            check_runs("KORS add: a Schur complement must be positive", bad,
                       lambda r: f"KORS add: a Schur complement is not positive (run {r})")
        return True

    def _arange(self, start: int, stop: int) -> Tensor:
        """``arange(start, stop)`` on the device (cached)."""
        key = (start, stop)
        got = self._cache.get(key)
        if got is None or got.device != self._m.device:
            got = self._cache[key] = torch.arange(start, stop, device=self._m.device)
        return got

    def _unit(self, pos: Tensor, width: int) -> Tensor:
        """Unit rows ``e_pos`` ``[k, width]`` (one gather from a cached identity)."""
        eye = self._cache.get("eye")
        nz = self._nz
        if eye is None or eye.shape[0] < width or eye.device != nz.device or eye.dtype != nz.dtype:
            eye = self._cache["eye"] = torch.eye(max(width, 2 * nz.shape[1]), dtype=nz.dtype,
                                                 device=nz.device)
        return eye[:width, :width][pos]

    def permute(self, order: Tensor) -> None:
        """Reorder the runs: new run ``i`` is old run ``order[i]``."""
        self._probed = None
        for name, buf in list(self._buffers.items()):
            if buf is not None:
                self._buffers[name] = buf.index_select(0, order.to(buf.device))

    def get_extra_state(self) -> dict[str, Any]:
        return {"mu": self.mu, "eps": self.eps, "gamma": self.gamma, "score": self.score}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.mu, self.eps, self.gamma = float(state["mu"]), float(state["eps"]), float(state["gamma"])
        self.score = state["score"]

    def extra_repr(self) -> str:
        return f"n_runs={self._m.shape[0]}, mu={self.mu}, eps={self.eps}, gamma={self.gamma}"

"""The posteriors of ``R`` batched runs at ``G`` further regularisers, as one companion model of
``R·G`` runs (the grid of DMM, Flynn & Reeb 2024, §5.4), and its scoring with the kernel
columns shared by the ``G`` members of a group (:mod:`torchbandits.models.batched_exact`).

Run ``r·G + g`` of the companion is run ``r`` at ``λ_{r,g} = m_g·λ_r``: the same points, its
own factor. Scoring fresh candidates ``[R, A, d]`` evaluates the kernel rows ``K_CS``
``[R, A, n]`` once per original run; every member then whitens them with its own factor —
``G`` batched products with the explicit inverses while they are kept
(:class:`~torchbandits.models.batched_inverse.InverseFactor`), else one batched triangular solve
of the ``R·G`` factors. On the CPU in float64 (closed-form kernels) the scoring and the one-point
append of all members are one compiled call each
(:mod:`~torchbandits.models.batched_exact_native`).

:class:`BatchedGroups` is a mixin of
:class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge`: its methods run on the
model (:meth:`~BatchedGroups.at_regularisers`) or on its companion (the others), both instances
of that class.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..batching import active_checks, check_runs, to_device
from ..buffers import grow_rows
from ..kernels import kernel_matrix
from .batched_inverse import inverse_max_n
from .batched_kernel import kernel_rows_into
from .batched_solve import block_solve, storage_key

if TYPE_CHECKING:
    from .batched_exact import BatchedExactKernelRidge

__all__ = ["BatchedGroups", "repeat_candidates"]


def _members(t: Tensor, groups: int) -> Tensor:
    """``t`` ``[R, ...]`` repeated for the ``G`` members of every group: ``[R·G, ...]``."""
    r = t.shape[0]
    return t[:, None].expand(r, groups, *t.shape[1:]).reshape(r * groups, *t.shape[1:])


def repeat_candidates(candidates: Tensor, groups: int) -> Tensor:
    """Candidates ``[R, A, d]`` as ``[R·G, A, d]`` (run ``r``'s set for each of its ``G``
    regularisers)."""
    r, a, d = candidates.shape
    return candidates[:, None].expand(r, groups, a, d).reshape(r * groups, a, d)


class BatchedGroups:
    """The companion of :class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge` at
    further regularisers, mixed into that class (whose state it reads and writes): see the
    module docstring."""

    _extra: dict
    _inverse: Any
    _n: int
    kernel: Any
    workspace: Any

    @torch.no_grad()
    def at_regularisers(self, multipliers: tuple[float, ...]
                        ) -> BatchedExactKernelRidge:
        """The posteriors of every run at ``G`` further regularisers ``λ_{r,g} = m_g·λ_r``, as one
        companion model of ``R·G`` runs (run ``r·G + g``), built lazily, kept in this model's
        derived state and caught up before it is returned: the points appended since the last
        call join it as one block
        (:meth:`append_block`; one point per round in a bandit loop, the whole data after a state
        load or a move). Dropped by ``reset``, by loading a ``state_dict`` and by ``.to()``; a
        rebuilt companion replays the same appends, so it holds the same numbers. Not saved in
        the ``state_dict``."""
        from .batched_exact import BatchedExactKernelRidge

        key = ("reg", tuple(float(m) for m in multipliers))
        if not all(math.isfinite(m) and m > 0 for m in key[1]):
            raise ValueError(f"multipliers must be finite and > 0, got {multipliers!r}")
        comp = self._extra.get(key)
        if comp is None:   # built on the device from checked values: no host read
            mult = to_device(torch.tensor(key[1], dtype=self.dtype), self.device)
            lam = (mult[None, :] * self.lam[:, None]).reshape(-1)     # m_g·λ_r, [R·G]
            comp = BatchedExactKernelRidge(self.kernel, lam, self.n_runs * len(key[1]),
                                           dtype=self.dtype, device=self.device,
                                           cache_candidates=self.cache_candidates,
                                           lam_checked=True)
            self._extra[key] = comp
        if comp.n < self.n:
            comp.append_block(self.x[:, comp.n:], self.y[:, comp.n:], self.x[:, :comp.n])
        return comp

    def repeat_candidates(self, candidates: Tensor, groups: int) -> Tensor:
        """Candidates ``[R, A, d]`` as ``[R·G, A, d]``, the input of :meth:`at_regularisers`'
        model (:func:`repeat_candidates`)."""
        return repeat_candidates(candidates, groups)

    @torch.no_grad()
    def append_block(self, x: Tensor, y: Tensor, x_old: Tensor) -> None:
        """Append ``k`` points ``x`` ``[R, k, d]`` with targets ``y`` ``[R, k]`` to every member of
        the companion (groups of ``G = self.n_runs / R`` runs sharing their data ``x_old``
        ``[R, n0, d]``): the block-bordered Cholesky step

        ``W = L₁₁⁻¹ K_{S,X}`` ``[R·G, n0, k]``, ``L₂₂ = chol(K_XX + λI − WᵀW)``,
        ``z₂ = L₂₂⁻¹(y − Wᵀz₁)``, and the explicit inverse's new rows
        ``[−L₂₂⁻¹WᵀL₁₁⁻¹, L₂₂⁻¹]`` while it is kept,

        with the kernel blocks evaluated once per group. ``k = 1`` is the one-point bordering of
        :meth:`~torchbandits.models.batched_exact.BatchedExactKernelRidge.append`. A non-positive
        pivot is a deferred flag inside :func:`~torchbandits.batching.deferred_checks` (no host read),
        else a ``ValueError``."""
        n0, k = self.n, x.shape[1]
        n, r, g = n0 + k, x.shape[0], self.n_runs // x.shape[0]
        if k == 1 and self.append_native(x[:, 0].contiguous(), y[:, 0].contiguous(), g):
            return   # the compiled one-point bordering of every member (CPU, float64)
        inv = self._inverse
        with_inverse = n <= inverse_max_n(self._L.device) and inv.ready_for_append(self._L, n0)
        k_xx = kernel_matrix(self.kernel, x, x)                                    # [R, k, k]
        k_xx.diagonal(dim1=-2, dim2=-1).copy_(self._kdiag(x))      # the diagonal as append's k(x,x)
        s = _members(k_xx, g) + torch.diag_embed(self.lam[:, None].expand(-1, k))   # K_XX + λI
        y_g = _members(y, g)
        if n0:
            k_sx = _members(kernel_matrix(self.kernel, x_old, x), g)              # [R·G, n0, k]
            w = inv.matvec(n0, k_sx) if with_inverse else \
                block_solve(self._L, self._factor_head(), n0, k_sx)  # type: ignore[attr-defined]
            s = s - w.mT @ w
            rhs = y_g - (w.mT @ self._z[:, :n0, None])[..., 0]
        else:
            w, rhs = s.new_zeros(r * g, 0, k), y_g
        l22, info = torch.linalg.cholesky_ex(s)
        check_runs("append: Cholesky pivot not positive", info != 0,
                   lambda run: f"append: pivot not positive in run {run} of the regulariser "
                               f"companion (λ = {float(self.lam[run])})")
        z2 = torch.linalg.solve_triangular(l22, rhs[..., None], upper=False)[..., 0]
        if self._x.shape[2] != x.shape[2]:
            self._x = x.new_zeros(r * g, self._x.shape[1], x.shape[2])
        self._L = grow_rows(self._L, n, dims=(1, 2))
        self._x = grow_rows(self._x, n, dims=(1,))
        self._y = grow_rows(self._y, n, dims=(1,))
        self._z = grow_rows(self._z, n, dims=(1,))
        self._L[:, n0:n, :n0] = w.mT
        self._L[:, n0:n, n0:n] = l22
        self._x[:, n0:n] = _members(x, g)
        self._y[:, n0:n] = y_g
        self._z[:, n0:n] = z2
        if with_inverse:
            eye = torch.eye(k, dtype=s.dtype, device=s.device).expand(r * g, k, k)
            l22_inv = torch.linalg.solve_triangular(l22, eye, upper=False)            # [R·G, k, k]
            buf = inv.inv if inv.inv is not None else s.new_zeros(r * g, max(16, n), max(16, n))
            buf = grow_rows(buf, n, dims=(1, 2))
            if n0:
                buf[:, n0:n, :n0] = -(l22_inv @ (w.mT @ buf[:, :n0, :n0]))
            buf[:, n0:n, n0:n] = l22_inv
            inv.inv, inv.chol, inv.version, inv.n = buf, self._L, self._L._version, n
        self._n = n


    def _last_set(self, candidates: Tensor) -> Tensor | None:
        """The repeated ``[R·G, A, d]`` of the previous call's set if ``candidates`` is that set,
        matched by storage and version counter (no host read), or in an eager call by value; a
        match reuses the repeated tensor, so the companion's own cache hits by storage (made here if the
        previous call did not make it). ``None``: a fresh set."""
        prev = self._extra.get(("last_candidates",))
        if prev is None or prev[0].shape != candidates.shape or not (
                prev[1] == storage_key(candidates)
                or (active_checks() is None and torch.equal(prev[0], candidates))):
            return None
        g = self.n_runs // candidates.shape[0]
        return prev[2] if prev[2] is not None else repeat_candidates(prev[0], g)


    def _remember_set(self, candidates: Tensor, cand: Tensor | None) -> None:
        """Record ``candidates`` (and its repetition ``cand``, or ``None``: made if it comes again)
        as the last set (a reference pins the storage)."""
        self._extra[("last_candidates",)] = (candidates, storage_key(candidates), cand)


    @torch.no_grad()
    def ucb_argmax_groups(self, candidates: Tensor, beta: Tensor,
                          div: Tensor, groups: int, want_arg: bool
                          ) -> tuple[Tensor, Tensor | None] | None:
        """:meth:`~torchbandits.models.batched_exact_native.BatchedExactNative.ucb_argmax` of a
        companion (runs in groups of ``groups``) at the checked candidates ``[R, A, d]`` of the ``R``
        original runs: one compiled call for a fresh set (remembered as :meth:`mean_var_groups`
        remembers it); ``None`` for the previous call's set (its caches serve it) or where the
        compiled step does not qualify."""
        if self._last_set(candidates) is not None:
            return None
        got = self.ucb_argmax_native(candidates, beta, div, groups, want_arg=want_arg)
        if got is not None:
            self._remember_set(candidates, None)
        return got


    @torch.no_grad()
    def mean_var_groups(self, candidates: Tensor, groups: int
                        ) -> tuple[Tensor, Tensor]:
        """GP mean and variance ``[R·G, A]`` of a companion (runs in groups of ``groups`` sharing
        their data) at the checked candidates ``[R, A, d]`` of the ``R`` original runs.

        A candidate set seen twice in a row goes through ``self.mean_var`` and its fixed-set cache
        (O(n·A) per round); a fresh set is not cached. Otherwise the kernel rows ``[R, A, n]`` are
        evaluated once per original run and member ``g`` of every group gets
        ``Vᵀ_g = K_CS (L_g⁻¹)ᵀ``, ``μ = Vᵀ_g z_g``, ``ρ² = k_CC − rowsum(Vᵀ_g ⊙ Vᵀ_g)`` (with the
        explicit inverses; else one triangular solve of the ``R·G`` factors)."""
        n, g = self.n, int(groups)
        prev = self._last_set(candidates)
        cand = prev if prev is not None else repeat_candidates(candidates, g)
        self._remember_set(candidates, cand)
        if n == 0 or prev is not None:
            return self.mean_var(cand, "gp", validate=False)
        got = self.mean_var_native(candidates, g)   # one compiled call (CPU, float64)
        if got is not None:
            return got
        r, a = candidates.shape[:2]
        kdiag = self._kdiag(candidates)[:, None].expand(r, g, a).reshape(r * g, a)
        z = self._z[:, :n]
        if self.inverse_valid():
            kq_t = kernel_rows_into(self.kernel, candidates, self.x[::g], self.workspace)  # [R, A, n]
            inv = self.inverse_factor(n).reshape(r, g, n, n)
            vt = self.workspace.get("vt_groups", (g, r, a, n), kq_t)
            for j in range(g):
                torch.bmm(kq_t, inv[:, j].mT, out=vt[j])                           # [R, A, n]
            zg = z.reshape(r, g, n).transpose(0, 1)                                # [G, R, n]
            mean = (zg[..., None, :] @ vt.mT)[..., 0, :].transpose(0, 1).reshape(r * g, a)
            sumsq = vt.mul_(vt).sum(-1).transpose(0, 1).reshape(r * g, a)     # vt is spent
            return mean, torch.clamp(kdiag - sumsq, min=0.0)
        kq = kernel_matrix(self.kernel, self.x[::g], candidates)                   # [R, n, A]
        kq = kq[:, None].expand(r, g, n, a).reshape(r * g, n, a)
        v = torch.linalg.solve_triangular(self._L[:, :n, :n], kq, upper=False)
        sumsq = (v * v).sum(1)
        mean = (z[:, None] @ v)[:, 0]
        return mean, torch.clamp(kdiag - sumsq, min=0.0)

"""The posteriors of ``R`` batched runs at ``G`` further regularisers, as one companion model of
``R·G`` runs (the grid of DMM, Flynn & Reeb 2024, §5.4), and its scoring with the kernel
columns shared by the ``G`` members of a group (:mod:`torchbandits.models.batched_exact`).

Run ``r·G + g`` of the companion is run ``r`` at ``λ_{r,g} = m_g·λ_r``: the same points, its
own factor. Scoring fresh candidates ``[R, A, d]`` evaluates the kernel rows ``K_CS``
``[R, A, n]`` once per original run; every member then whitens them with its own factor —
``G`` batched products with the explicit inverses while they are kept
(:class:`~torchbandits.models.batched_inverse.InverseFactor`), else one batched triangular solve
of the ``R·G`` factors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..batching import active_checks, to_device
from ..kernels import kernel_matrix
from .batched_kernel import kernel_rows_into
from .batched_solve import storage_key

if TYPE_CHECKING:
    from .batched_exact import BatchedExactKernelRidge

__all__ = ["at_regularisers", "mean_var_groups", "repeat_candidates"]


@torch.no_grad()
def at_regularisers(model: BatchedExactKernelRidge, multipliers: tuple[float, ...]
                    ) -> BatchedExactKernelRidge:
    """The companion of ``model`` at ``λ_{r,g} = m_g·λ_r`` (``R·G`` runs, run ``r·G + g``),
    built lazily, kept in ``model``'s derived state and caught up before it is returned: the
    points appended to ``model`` since the last call are appended to it, in order (one bordered
    Cholesky step each, the steps a sequential model maintaining these regularisers makes)."""
    from .batched_exact import BatchedExactKernelRidge

    key = ("reg", tuple(float(m) for m in multipliers))
    if not all(math.isfinite(m) and m > 0 for m in key[1]):
        raise ValueError(f"multipliers must be finite and > 0, got {multipliers!r}")
    comp = model._extra.get(key)
    g = len(key[1])
    if comp is None:   # built on the device from checked values: no host read
        mult = to_device(torch.tensor(key[1], dtype=model.dtype), model.device)
        lam = (mult[None, :] * model.lam[:, None]).reshape(-1)     # m_g·λ_r, [R·G]
        comp = BatchedExactKernelRidge(model.kernel, lam, model.n_runs * g,
                                       dtype=model.dtype, device=model.device,
                                       cache_candidates=model.cache_candidates,
                                       lam_checked=True)
        model._extra[key] = comp
    x_all, y_all = model.x, model.y
    for k in range(comp.n, model.n):
        x = x_all[:, k]
        comp.append(x[:, None].expand(-1, g, -1).reshape(-1, x.shape[-1]),
                    y_all[:, k, None].expand(-1, g).reshape(-1), validate=False)
    return comp


def repeat_candidates(candidates: Tensor, groups: int) -> Tensor:
    """Candidates ``[R, A, d]`` as ``[R·G, A, d]`` (run ``r``'s set for each of its ``G``
    regularisers)."""
    r, a, d = candidates.shape
    return candidates[:, None].expand(r, groups, a, d).reshape(r * groups, a, d)


@torch.no_grad()
def mean_var_groups(comp: BatchedExactKernelRidge, candidates: Tensor, groups: int
                    ) -> tuple[Tensor, Tensor]:
    """GP mean and variance ``[R·G, A]`` of a companion (runs in groups of ``groups`` sharing
    their data) at the checked candidates ``[R, A, d]`` of the ``R`` original runs.

    A candidate set seen twice in a row goes through ``comp.mean_var`` and its fixed-set cache
    (O(n·A) per round); a fresh set is not cached. Otherwise the kernel rows ``[R, A, n]`` are
    evaluated once per original run and member ``g`` of every group gets
    ``Vᵀ_g = K_CS (L_g⁻¹)ᵀ``, ``μ = Vᵀ_g z_g``, ``ρ² = k_CC − rowsum(Vᵀ_g ⊙ Vᵀ_g)`` (with the
    explicit inverses; else one triangular solve of the ``R·G`` factors)."""
    n, g = comp.n, int(groups)
    # the previous call's set, matched by storage and version counter (no host read), or in an
    # eager call by value; a match reuses its repeated tensor, so comp's own cache hits by storage
    key = storage_key(candidates)
    prev = comp._extra.get(("last_candidates",))
    same = prev is not None and prev[0].shape == candidates.shape and (
        prev[1] == key or (active_checks() is None and torch.equal(prev[0], candidates)))
    cand = prev[2] if same else repeat_candidates(candidates, g)
    comp._extra[("last_candidates",)] = (candidates, key, cand)   # a reference pins the storage
    if n == 0 or same:
        return comp.mean_var(cand, "gp", validate=False)
    r, a = candidates.shape[:2]
    kdiag = comp._kdiag(candidates)[:, None].expand(r, g, a).reshape(r * g, a)
    z = comp._z[:, :n]
    if comp.inverse_valid():
        kq_t = kernel_rows_into(comp.kernel, candidates, comp.x[::g], comp.workspace)  # [R, A, n]
        inv = comp.inverse_factor(n).reshape(r, g, n, n)
        vt = comp.workspace.get("vt_groups", (g, r, a, n), kq_t)
        for j in range(g):
            torch.bmm(kq_t, inv[:, j].mT, out=vt[j])                           # [R, A, n]
        zg = z.reshape(r, g, n).transpose(0, 1)                                # [G, R, n]
        mean = (zg[..., None, :] @ vt.mT)[..., 0, :].transpose(0, 1).reshape(r * g, a)
        sumsq = vt.mul_(vt).sum(-1).transpose(0, 1).reshape(r * g, a)     # vt is spent
        return mean, torch.clamp(kdiag - sumsq, min=0.0)
    kq = kernel_matrix(comp.kernel, comp.x[::g], candidates)                   # [R, n, A]
    kq = kq[:, None].expand(r, g, n, a).reshape(r * g, n, a)
    v = torch.linalg.solve_triangular(comp._L[:, :n, :n], kq, upper=False)
    sumsq = (v * v).sum(1)
    mean = (z[:, None] @ v)[:, 0]
    return mean, torch.clamp(kdiag - sumsq, min=0.0)

"""``batch_reset`` of :class:`~torchbandits.envs.time_varying.SwitchingRKHSEnv`: ``R`` runs'
switching functions set up at once.

Run ``r`` draws, on the host and from its own generators in the order of ``reset(seeds[r])``,
its arms, its anchors ``Z_r`` ``[(S+1)m, d]`` and one ``N(0, I_m)`` block per segment; these are
stacked and moved to the device with one copy per kind. The construction of the coefficients
(Zhou & Shroff 2021, §II: ``S`` switches of exactly ``P_T/S`` each when a budget is declared)
then runs once over the batch: the Gram matrices ``K_r = k(Z_r, Z_r)`` ``[R, M, M]``
(``M = (S+1)m``), ``g_0 = B h_0/‖h_0‖_{K_r}`` and, per segment ``j``, either
``g_j = B h_j/‖h_j‖_{K_r}`` (``budget=None``) or ``g_j = cos φ g_{j-1} + sin φ B ĥ_j`` with
``ĥ_j`` the ``K_r``-orthonormalisation of ``h_j`` against ``g_{j-1}``; the segment means
``k(X_r, Z_r) G_rᵀ`` ``[R, A, S+1]``. ``O(S)`` device operations a batch, none per run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import kernel_matrix
from .batched import BatchedEnv, stack_to

if TYPE_CHECKING:
    from gpytorch.kernels import Kernel

__all__ = ["SwitchingBatch", "switching_coefficients"]


def _quad(gram: Tensor, u: Tensor, v: Tensor) -> Tensor:
    """``u_rᵀ K_r v_r`` of every run ``[R]`` (``gram`` ``[R, M, M]``, ``u``, ``v`` ``[R, M]``)."""
    return torch.matmul(torch.matmul(u[:, None, :], gram), v[:, :, None])[:, 0, 0]


def switching_coefficients(gram: Tensor, blocks: Tensor, norm: float,
                           budget: float | None) -> Tensor:
    """The coefficients ``[R, S+1, M]`` of every run's ``S + 1`` segment functions from its Gram
    matrix ``gram`` ``[R, M, M]`` and its segment blocks ``blocks`` ``[R, S+1, m]`` (the
    construction of ``SwitchingRKHSEnv``'s ``reset``, over the batch)."""
    n_seg, m = blocks.shape[1], blocks.shape[2]
    S, B = n_seg - 1, norm
    phi = 2.0 * math.asin(budget / (2.0 * B * S)) if budget is not None and S else 0.0
    rows: list[Tensor] = []
    for j in range(n_seg):   # S + 1 segments: O(S) device operations whatever R
        h = F.pad(blocks[:, j], (j * m, (S - j) * m))                       # [R, M]
        if j == 0 or budget is None:
            rows.append(B * h / torch.sqrt(_quad(gram, h, h))[:, None])
            continue
        prev = rows[-1] / B
        h = h - _quad(gram, prev, h)[:, None] * prev
        h = h / torch.sqrt(_quad(gram, h, h))[:, None]
        rows.append(B * (math.cos(phi) * prev + math.sin(phi) * h))
    return torch.stack(rows, dim=1)


class SwitchingBatch:
    """``batch_reset`` and ``batch_repr`` of
    :class:`~torchbandits.envs.time_varying.SwitchingRKHSEnv` (a mixin: the environment's own
    settings and draws, read through ``self``)."""

    kernel: Kernel
    norm: float
    dtype: torch.dtype
    device: torch.device
    switch_times: list[int]
    _budget_arg: float | None

    def _switching_batch_reset(self, seeds: Sequence[int]) -> tuple[
            dict[str, Tensor], dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once. Fields ``[R, ...]``: ``arms`` ``[R, A, d]``,
        ``_segment_means`` ``[R, A, S+1]`` and, for :meth:`_switching_batch_repr`, ``_switch_sq``
        ``[R, S]`` (``‖g_k − g_j‖²_{K_r}`` of each switch; ``[R, 0]`` with a declared budget);
        generators per name."""
        self._check_switches()  # type: ignore[attr-defined]  # reset's checks, before any draw
        arms, anchors, blocks, noise = [], [], [], []
        for s in seeds:
            g_f, g_arms, g_noise = self._generators(s)  # type: ignore[attr-defined]
            arms.append(self._make_arms(g_arms))  # type: ignore[attr-defined]
            z, blk = self._switch_draws(g_f)  # type: ignore[attr-defined]
            anchors.append(z)
            blocks.append(blk)
            noise.append(g_noise)
        x, z, blk = (stack_to(t, self.device) for t in (arms, anchors, blocks))
        gram = kernel_matrix(self.kernel, z, z)                                 # [R, M, M]
        coef = switching_coefficients(gram, blk, self.norm, self._budget_arg)   # [R, S+1, M]
        means = torch.matmul(kernel_matrix(self.kernel, x, z), coef.transpose(1, 2))
        seg = self.segment  # type: ignore[attr-defined]
        pairs = [(seg(s), seg(s + 1)) for s in self.switch_times]
        diffs = [coef[:, k] - coef[:, j] for j, k in pairs if j != k and self._budget_arg is None]
        sq = (torch.stack([_quad(gram, d, d) for d in diffs], dim=1) if diffs
              else torch.zeros(len(seeds), 0, dtype=self.dtype, device=self.device))
        return {"arms": x, "_segment_means": means, "_switch_sq": sq}, {"noise": noise}

    def _switching_batch_repr(self, b: BatchedEnv, r: int) -> str:
        """``repr`` of run ``r`` (its realised budget ``Σ_k sqrt(max(q_k, 0))`` when the
        environment declares none, summed in the order of the ``budget`` property: one host
        read)."""
        if self._budget_arg is not None:
            return repr(self)
        steps = (math.sqrt(max(q, 0.0)) for q in b.fields["_switch_sq"][r].tolist())
        return self._describe(float(sum(steps)))  # type: ignore[attr-defined]

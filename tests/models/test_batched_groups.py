"""The regulariser companion of a batched posterior (DMM's grid, Flynn & Reeb 2024, §5.4) catches
up by one block-bordered Cholesky step.

Against one-run models built from scratch at every ``λ_{r,g} = m_g·λ_r``: the factor, the
whitened targets, the log-det and the scores after catching up blocks of 12, 1 and 5 points,
and with the explicit inverse kept (equal to the factor's inverse) and beyond its size (the
blocked triangular solve); the block of one point against the model's own ``append``; a
non-positive pivot rejects the call and changes nothing.
"""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.models.batched_inverse import INVERSE_MAX_N

GRID = (0.1, 1.0, 10.0)


def _check(model: BatchedExactKernelRidge, comp: BatchedExactKernelRidge, lams: list[float],
           cand: torch.Tensor) -> None:
    """``comp`` (run ``r·G + g``) against one-run models from scratch at ``m_g·λ_r``."""
    g = len(GRID)
    n = model.n
    assert comp.n == n
    mean, var = comp.mean_var_groups(cand, g)
    for r, lam in enumerate(lams):
        for j, m in enumerate(GRID):
            ref = ExactKernelRidge(model.kernel, m * lam)
            ref.extend(model.x[r], model.y[r])
            i = r * g + j
            torch.testing.assert_close(comp.cholesky()[i], ref.cholesky(), atol=1e-10, rtol=0)
            torch.testing.assert_close(comp.log_det()[i], torch.as_tensor(ref.log_det(),
                                       dtype=torch.float64), atol=1e-10, rtol=0)
            rm, rv = ref.mean_var(cand[r])
            torch.testing.assert_close(mean[i], rm, atol=1e-10, rtol=0)
            torch.testing.assert_close(var[i], rv, atol=1e-10, rtol=0)
            torch.testing.assert_close(comp.x[i], model.x[r], atol=0, rtol=0)


@pytest.mark.parametrize("blocks", [(12, 1, 5), (INVERSE_MAX_N - 4, 9)])
def test_blocks_equal_models_from_scratch(blocks: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(3)
    lams = [0.05, 0.5, 2.0]
    model = BatchedExactKernelRidge(make_kernel("matern52", 0.3),
                                    torch.tensor(lams, dtype=torch.float64), 3)
    cand = torch.rand(3, 7, 2, dtype=torch.float64, generator=gen)
    for size in blocks:
        for _ in range(size):
            model.append(torch.rand(3, 2, dtype=torch.float64, generator=gen),
                         torch.randn(3, dtype=torch.float64, generator=gen))
        comp = model.at_regularisers(GRID)                # one block of `size` points
        _check(model, comp, lams, cand.clone())
        if comp.n <= INVERSE_MAX_N:
            assert comp.inverse_valid()
            eye = torch.eye(comp.n, dtype=torch.float64).expand(9, comp.n, comp.n)
            ref = torch.linalg.solve_triangular(comp.cholesky(), eye, upper=False)
            torch.testing.assert_close(comp.inverse_factor(comp.n), ref, atol=1e-8, rtol=1e-8)
        else:
            assert not comp.inverse_valid()               # beyond its size: the solve


def test_one_point_block_equals_append() -> None:
    gen = torch.Generator().manual_seed(0)
    kernel = make_kernel("rbf", 0.4)
    lam = torch.tensor([0.1, 1.0, 0.3, 3.0], dtype=torch.float64)
    a = BatchedExactKernelRidge(kernel, lam, 4)
    b = BatchedExactKernelRidge(kernel, lam, 4)
    x_old = torch.zeros(2, 0, 2, dtype=torch.float64)
    for _ in range(9):
        x = torch.rand(2, 2, dtype=torch.float64, generator=gen)
        y = torch.randn(2, dtype=torch.float64, generator=gen)
        a.append(x.repeat_interleave(2, 0), y.repeat_interleave(2, 0))
        b.append_block(x[:, None], y[:, None], x_old)
        x_old = torch.cat([x_old, x[:, None]], dim=1)
        torch.testing.assert_close(b.cholesky(), a.cholesky(), atol=1e-14, rtol=0)
        torch.testing.assert_close(b.quad_y(), a.quad_y(), atol=1e-13, rtol=0)
        assert b.inverse_valid() and a.inverse_valid()
        torch.testing.assert_close(b.inverse_factor(b.n), a.inverse_factor(a.n), atol=1e-12, rtol=0)


def test_non_positive_pivot_rejects_and_changes_nothing() -> None:
    kernel = make_kernel("linear")
    comp = BatchedExactKernelRidge(kernel, torch.tensor([1.0, 1e-300], dtype=torch.float64), 2)
    x = torch.tensor([[[1.0], [1.0]]], dtype=torch.float64)       # the same point twice
    y = torch.zeros(1, 2, dtype=torch.float64)
    comp.append_block(x[:, :1], y[:, :1], x[:, :0])
    before = comp.cholesky()
    with pytest.raises(ValueError, match="pivot"):
        comp.append_block(x[:, 1:], y[:, 1:], x[:, :1])          # K + λI singular at λ ≈ 0
    assert comp.n == 1 and torch.equal(comp.cholesky(), before)

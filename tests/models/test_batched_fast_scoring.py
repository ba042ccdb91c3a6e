"""The fast scoring of the batched exact posterior: kernel rows written into a workspace equal
GPyTorch's kernels; the explicit inverse kept by bordering equals the factor's inverse and
scores as the triangular solve does; it is dropped when the factor changes otherwise, rebuilt
after a state load, carried by a deep copy; the workspace reuses its memory."""

from __future__ import annotations

import copy

import gpytorch
import pytest
import torch

from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.models.batched_inverse import INVERSE_MAX_N, Workspace
from torchbandits.models.batched_kernel import kernel_rows_into


@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
@pytest.mark.parametrize("scale", [None, 2.5])
def test_kernel_rows_equal_gpytorch(name: str, scale: float | None) -> None:
    k = make_kernel(name, [0.3, 0.7, 0.5], outputscale=scale)
    torch.manual_seed(0)
    x = torch.rand(4, 9, 3, dtype=torch.float64)
    y = torch.cat([torch.rand(4, 6, 3, dtype=torch.float64), x[:, :2]], dim=1)  # r = 0 too
    ws = Workspace()
    got = kernel_rows_into(k, x, y, ws)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        ref = torch.stack([k(x[r], y[r]).to_dense() for r in range(4)])
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(got, kernel_matrix(k, x, y), atol=1e-15, rtol=0)
    again = kernel_rows_into(k, x, y, ws)             # the same buffer, overwritten
    assert again.data_ptr() == got.data_ptr()


def test_kernel_rows_of_other_kernels_go_through_kernel_matrix() -> None:
    k = make_kernel("linear")
    x = torch.rand(2, 5, 3, dtype=torch.float64)
    torch.testing.assert_close(kernel_rows_into(k, x, x, Workspace()), kernel_matrix(k, x, x))


def _filled(n: int, lam: float = 0.01, runs: int = 3) -> tuple[BatchedExactKernelRidge, torch.Tensor]:
    torch.manual_seed(1)
    model = BatchedExactKernelRidge(make_kernel("matern52", 0.4), lam, runs)
    x = torch.rand(runs, n, 2, dtype=torch.float64)
    for i in range(n):
        model.append(x[:, i], torch.randn(runs, dtype=torch.float64))
    return model, x


def test_bordered_inverse_equals_the_inverse_of_the_factor() -> None:
    model, _ = _filled(40, lam=1e-4)                  # ill-conditioned: small λ
    assert model.inverse_valid()
    chol = model.cholesky()
    eye = torch.eye(40, dtype=torch.float64).expand(3, 40, 40)
    ref = torch.linalg.solve_triangular(chol, eye, upper=False)
    inv = model.inverse_factor(40)
    assert torch.equal(torch.triu(inv, 1), torch.zeros_like(inv))
    err = (inv @ chol - eye).abs().max()
    assert err < 1e-9 and (inv - ref).abs().max() < 1e-9 * ref.abs().max()


@pytest.mark.parametrize("lam", [1e-4, 0.01, 1.0])
def test_scores_equal_the_sequential_solve(lam: float) -> None:
    model, x = _filled(60, lam=lam)
    cand = torch.rand(3, 25, 2, dtype=torch.float64)
    mean, var = model.mean_var(cand)
    for r in range(3):
        seq = ExactKernelRidge(model.kernel, lam)
        seq.extend(x[r], model.y[r])
        sm, sv = seq.mean_var(cand[r])
        torch.testing.assert_close(mean[r], sm, atol=1e-10, rtol=0)
        torch.testing.assert_close(var[r], sv, atol=1e-10, rtol=0)


def test_inverse_dropped_on_foreign_change_and_beyond_its_size() -> None:
    model, _ = _filled(10)
    assert model.inverse_valid()
    cand = torch.rand(3, 7, 2, dtype=torch.float64)
    before = model.mean_var(cand)
    model._L.mul_(1.0)                                # an in-place change by someone else
    assert not model.inverse_valid()
    after = model.mean_var(cand.clone())              # fresh set: the triangular solve
    torch.testing.assert_close(after, before, atol=1e-12, rtol=0)
    model.reset()
    big, _ = _filled(INVERSE_MAX_N + 2, lam=1.0, runs=1)
    assert not big.inverse_valid()


def test_state_load_rebuilds_and_deep_copy_keeps_the_same_numbers() -> None:
    model, _ = _filled(30)
    cand = torch.rand(3, 11, 2, dtype=torch.float64)
    ref = model.mean_var(cand)
    twin = BatchedExactKernelRidge(model.kernel, 0.01, 3)
    twin.load_state_dict(model.state_dict())
    assert twin.inverse_valid()                       # rebuilt by replaying the bordering
    assert torch.equal(twin.inverse_factor(30), model.inverse_factor(30))
    clone = copy.deepcopy(model)
    assert clone.inverse_valid()
    for other in (twin, clone):
        got = other.mean_var(cand.clone())
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_the_inverse_at_the_gpu_size_scores_as_the_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the inverse is kept to ``INVERSE_MAX_N_CUDA`` points; its bordering accuracy at
    that size, checked on the CPU with the CPU limit raised to it: 600 appends (λ = 0.01), scores
    equal the sequential model's triangular solves to 1e-9, and the device rule picks the sizes."""
    import torchbandits.models.batched_inverse as bi

    assert bi.inverse_max_n(torch.device("cpu")) == INVERSE_MAX_N
    assert bi.inverse_max_n(torch.device("cuda")) == bi.INVERSE_MAX_N_CUDA >= 600
    monkeypatch.setattr(bi, "INVERSE_MAX_N", bi.INVERSE_MAX_N_CUDA)
    model, x = _filled(600, lam=0.01, runs=2)
    assert model.inverse_valid()
    cand = torch.rand(2, 30, 2, dtype=torch.float64)
    mean, var = model.mean_var(cand)
    for r in range(2):
        seq = ExactKernelRidge(model.kernel, 0.01)
        seq.extend(x[r], model.y[r])
        sm, sv = seq.mean_var(cand[r])
        torch.testing.assert_close(mean[r], sm, atol=1e-9, rtol=0)
        torch.testing.assert_close(var[r], sv, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name,scale", [("rbf", None), ("matern52", 2.5), ("matern32", None)])
def test_scaled_points_give_the_numbers_of_kernel_matrix(name: str, scale: float | None) -> None:
    """The kept ``x/ℓ``, ``‖x/ℓ‖²`` of the stored points (appended one row at a time) score and
    border with exactly the numbers of ``kernel_matrix`` / ``kernel_rows_into`` from scratch."""
    torch.manual_seed(3)
    k = make_kernel(name, [0.3, 0.7], outputscale=scale)
    model = BatchedExactKernelRidge(k, 0.05, 3)
    x = torch.rand(3, 40, 2, dtype=torch.float64)
    cand = torch.rand(3, 11, 2, dtype=torch.float64)
    ls = k.base_kernel.lengthscale if scale is not None else k.lengthscale
    for i in range(40):
        if i:
            new = model._scaled.scaled(k, x[:, i], model._x, i)
            assert new is not None
            col = model._scaled.column(k, model._x, i, *new)
            assert torch.equal(col, kernel_matrix(k, x[:, :i], x[:, i, None]))
        model.append(x[:, i], torch.randn(3, dtype=torch.float64))
    xs, sq = model._scaled.points(k, model._x, 40)
    assert torch.equal(xs, x / ls.reshape(-1))
    assert torch.equal(sq, (xs * xs).sum(-1))
    got = model._scaled.rows(k, cand, model._x, 40, Workspace()).clone()
    assert torch.equal(got, kernel_rows_into(k, cand, x, Workspace()))
    kd = model._kdiag(cand)
    assert torch.equal(kd, kernel_matrix(k, cand[:, :, None], cand[:, :, None])[..., 0, 0])


def test_scaled_points_follow_the_kernel_and_foreign_writes() -> None:
    """An in-place change of a raw hyper-parameter, a write to the stored inputs by anyone else,
    and a reset after GPyTorch's setter (a ``.data`` copy) all make the kept points be rebuilt."""
    torch.manual_seed(4)
    k = make_kernel("matern52", 0.4)
    model = BatchedExactKernelRidge(k, 0.05, 2)
    x = torch.rand(2, 6, 3, dtype=torch.float64)
    cand = torch.rand(2, 5, 3, dtype=torch.float64)
    for i in range(6):
        model.append(x[:, i], torch.randn(2, dtype=torch.float64))

    def rows() -> torch.Tensor:
        return model._scaled.rows(k, cand, model._x, 6, Workspace()).clone()

    def ref(points: torch.Tensor) -> torch.Tensor:     # from scratch, the kernel read now
        return kernel_rows_into(k, cand, points, Workspace()).clone()

    before = rows()
    with torch.no_grad():
        k.raw_lengthscale.add_(0.3)                     # in place: the version counter moves
    after = rows()
    assert not torch.equal(before, after)
    assert torch.equal(after, ref(x))
    with torch.no_grad():
        model._x[:, 0] += 0.25                           # a foreign write (a window's shift)
    assert torch.equal(rows(), ref(model.x))
    k.lengthscale = 0.9                                  # GPyTorch's setter: seen at reset
    model.reset()
    for i in range(6):
        model.append(x[:, i], torch.randn(2, dtype=torch.float64))
    assert torch.equal(rows(), ref(x))

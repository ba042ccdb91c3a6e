"""The public fast path of NystromKernelRidge equals the validated calls and a from-scratch
computation (Zenati et al. 2022, Prop. 4.2), and BKB's arm-row cache equals evaluated kernels."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.linalg import bordered_inverse
from torchbandits.models.arm_rows import ArmRowCache, match_rows
from torchbandits.models.nystrom import NystromKernelRidge, nystrom_posterior_reference
from torchbandits.models.nystrom_updates import border_apply, border_prepare

PARAMS = ("whitened", "plain")
TOL = dict(atol=1e-9, rtol=0)


def _data(n: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x.sum(1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _grown(param: str, n: int = 30, every: int = 3, **kw) -> NystromKernelRidge:
    """Appends, with every ``every``-th point also made an anchor (EK-UCB's order)."""
    x, y = _data(n)
    nys = NystromKernelRidge(make_kernel("rbf", 0.4), 0.5, parametrisation=param, **kw)
    for i, (xi, yi) in enumerate(zip(x, y)):
        nys.append(xi, yi)
        if i % every == 0:
            assert nys.add_to_dictionary(xi)
    return nys


def _reference(nys: NystromKernelRidge, cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return nystrom_posterior_reference(nys.kernel, nys.dictionary, nys.x, nys.target_sums, cand,
                                       nys.lam, nys.counts)


@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("n_cand", [4, 40])  # fewer / more candidates than anchors: both branches
def test_score_equals_mean_var_and_from_scratch(param: str, n_cand: int) -> None:
    nys = _grown(param)
    cand, _ = _data(n_cand, seed=1)
    mean, var = nys.score(cand)
    ref_mean, ref_var = _reference(nys, cand)
    assert torch.allclose(mean, ref_mean, **TOL) and torch.allclose(var, ref_var, **TOL)
    m2, v2 = nys.mean_var(cand)
    assert torch.equal(mean, m2) and torch.equal(var, v2)
    # with the kernel columns handed in: the same numbers, and the columns are really used
    kz = nys.kernel_block(nys.dictionary, cand)
    m3, v3 = nys.score(cand, kz)
    assert torch.allclose(m3, mean, atol=1e-12, rtol=0) and torch.allclose(v3, var, atol=1e-12, rtol=0)
    m4, _ = nys.score(cand, 0.5 * kz)
    assert not torch.allclose(m4, mean, atol=1e-6, rtol=0)


def test_kernel_evaluations_equal_gpytorch() -> None:
    x, _ = _data(7, seed=2)
    z, _ = _data(5, seed=3)
    for kernel in (make_kernel("rbf", 0.3), make_kernel("matern52", 0.3)):
        nys = NystromKernelRidge(kernel, 1.0)
        assert torch.allclose(nys.kernel_block(z, x), kernel_matrix(nys.kernel, z, x), atol=1e-14, rtol=0)
        assert torch.allclose(nys.kernel_diagonal(x), kernel_diag(nys.kernel, x), atol=1e-14, rtol=0)
        assert nys.prior_variance(x[0]) == pytest.approx(float(kernel_diag(nys.kernel, x[:1])[0]))
        nys.append(z[0], 1.0)
        assert nys.add_to_dictionary(z[0]) and nys.add_to_dictionary(z[1])
        assert torch.allclose(nys.kernel_column(x[3]), kernel_matrix(nys.kernel, z[:2], x[3:4])[:, 0],
                              atol=1e-14, rtol=0)


@pytest.mark.parametrize("param", PARAMS)
def test_scored_column_is_the_column_of_the_last_scoring(param: str) -> None:
    nys = _grown(param)
    cand, _ = _data(6, seed=4)
    nys.score(cand)
    kz, f = nys.scored_column(cand[2])
    assert torch.allclose(kz, nys.kernel_column(cand[2]), atol=1e-14, rtol=0)
    assert torch.allclose(f, nys.features(cand[2:3])[:, 0], atol=1e-12, rtol=0)
    kz_copy, _ = nys.scored_column(cand[2].clone())  # equal values, other memory: still found
    assert torch.equal(kz_copy, kz)
    assert nys.scored_column(cand[2] + 1.0) is None  # not a candidate
    nys.append(cand[0], 0.1)
    assert nys.scored_column(cand[2]) is None  # the model changed since


@pytest.mark.parametrize("param", PARAMS)
def test_append_column_equals_append_and_from_scratch(param: str) -> None:
    a, b = _grown(param), _grown(param)
    x, _ = _data(5, seed=5)
    cand, _ = _data(12, seed=6)
    for i, xi in enumerate(x):
        a.append(xi, 0.3 * i)
        b.score(x)  # the played point was just scored: reuse its column
        kz, f = b.scored_column(xi)
        b.append_column(xi, 0.3 * i, kz, f)
        # ω before the append, from scratch: k(x,x) − k_Zᵀ K_ZZ⁻¹ k_Z
        k_zx = kernel_matrix(b.kernel, b.dictionary, xi[None])[:, 0]
        omega = 1.0 - k_zx @ torch.linalg.solve(kernel_matrix(b.kernel, b.dictionary, b.dictionary), k_zx)
        assert b.last_residual == pytest.approx(float(omega), abs=1e-9)
        assert a.last_residual == pytest.approx(b.last_residual, abs=1e-12)
    for m in (a, b):
        ref = _reference(m, cand)
        out = m.score(cand)
        assert torch.allclose(out[0], ref[0], **TOL) and torch.allclose(out[1], ref[1], **TOL)
    assert torch.allclose(a.score(cand)[1], b.score(cand)[1], atol=1e-12, rtol=0)
    assert a.log_det_running == pytest.approx(b.log_det_running, abs=1e-12)


@pytest.mark.parametrize("param", PARAMS)
def test_add_last_to_dictionary_equals_add_to_dictionary(param: str) -> None:
    a, b = _grown(param, every=4), _grown(param, every=4)
    x, _ = _data(3, seed=7)
    for xi in x:
        kz = a.kernel_column(xi)
        a.append_column(xi, 0.2, kz)
        b.append_column(xi, 0.2, kz)
        assert a.add_to_dictionary(xi, kz=kz)
        assert b.add_last_to_dictionary(kz)
    assert torch.allclose(a.Lambda, b.Lambda, atol=1e-12, rtol=0)
    assert torch.allclose(a.Gamma, b.Gamma, atol=1e-12, rtol=0)
    cand, _ = _data(9, seed=8)
    ref = _reference(b, cand)
    assert torch.allclose(b.score(cand)[1], ref[1], **TOL)
    # a duplicate of an anchor: ω = 0 ⇒ refused by the guard, nothing but the counter changes
    m, refused, lam_before = b.m, b.refused, b.Lambda
    b.append_column(x[0], 0.0, b.kernel_column(x[0]))
    assert b.last_residual == pytest.approx(0.0, abs=1e-9)
    assert not b.add_last_to_dictionary(b.kernel_column(x[0]))
    assert b.m == m and b.refused == refused + 1 and b.Lambda.shape == lam_before.shape


def test_refused_and_last_residual_are_read_only() -> None:
    nys = _grown("whitened")
    for name in ("refused", "last_residual", "n", "m"):
        with pytest.raises(AttributeError):
            setattr(nys, name, 0)


@pytest.mark.parametrize("param", PARAMS)
def test_rebuild_from_counts_equals_rebuild_and_from_scratch(param: str) -> None:
    x, y = _data(15)
    counts = torch.arange(1.0, 16.0, dtype=torch.float64)
    sums = counts * y
    z = x[::3]
    a = NystromKernelRidge(make_kernel("rbf", 0.4), 0.5, parametrisation=param)
    b = NystromKernelRidge(make_kernel("rbf", 0.4), 0.5, parametrisation=param)
    a.rebuild(z, x, sums, counts)
    kxz = b.kernel_block(x, z)
    b.rebuild_from_counts(z, x, sums, counts, kzz=kxz[::3], kxz=kxz)
    cand, _ = _data(11, seed=9)
    ref = _reference(b, cand)
    for m in (a, b):
        mean, var = m.score(cand)
        assert torch.allclose(mean, ref[0], **TOL) and torch.allclose(var, ref[1], **TOL)
    assert float(a.log_det()) == pytest.approx(float(b.log_det()), abs=1e-10)


def test_tracked_data_variances_equal_a_fresh_pass() -> None:
    nys = _grown("whitened", track_data_variances=True)
    x, _ = _data(4, seed=10)
    for xi in x:
        kz = nys.kernel_column(xi)
        nys.append_column(xi, 0.5, kz)
        assert torch.allclose(nys.data_variances(), _reference(nys, nys.x)[1], **TOL)
    assert nys.add_last_to_dictionary(kz)
    assert torch.allclose(nys.data_variances(), _reference(nys, nys.x)[1], **TOL)


def test_slotted_state_survives_copies_and_state_dict() -> None:
    nys = _grown("whitened")
    cand, _ = _data(8, seed=11)
    mean, var = nys.score(cand)
    for other in (copy.deepcopy(nys), pickle.loads(pickle.dumps(nys))):
        assert (other.n, other.m, other.refused) == (nys.n, nys.m, nys.refused)
        assert torch.equal(other.score(cand)[1], var)
    fresh = NystromKernelRidge(make_kernel("rbf", 0.4), 0.5)
    fresh.load_state_dict(nys.state_dict())
    m2, v2 = fresh.score(cand)
    assert torch.equal(m2, mean) and torch.equal(v2, var)
    assert float(fresh.log_det()) == float(nys.log_det())


def test_in_place_border_equals_bordered_inverse() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64)
    a = a @ a.mT + 6 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, generator=g, dtype=torch.float64)
    c = float(b @ torch.linalg.solve(a, b)) + 2.0
    buf = torch.zeros(9, 9, dtype=torch.float64)
    buf[:6, :6] = torch.linalg.inv(a)
    border_apply(buf, 6, *border_prepare(buf[:6, :6], b, c))
    expected = bordered_inverse(torch.linalg.inv(a), b, c)
    assert torch.allclose(buf[:7, :7], expected, atol=1e-14, rtol=0)
    full = torch.cat([torch.cat([a, b[:, None]], 1), torch.cat([b, b.new_tensor([c])])[None]])
    assert torch.allclose(buf[:7, :7] @ full, torch.eye(7, dtype=torch.float64), atol=1e-12, rtol=0)
    with pytest.raises(ValueError):
        border_prepare(buf[:6, :6], b, c - 10.0)


def test_arm_row_cache_equals_evaluated_kernels() -> None:
    nys = NystromKernelRidge(make_kernel("rbf", 0.3), 1.0)
    arms, _ = _data(20, seed=12)
    pulled = arms[[4, 0, 17, 9]]
    cache = ArmRowCache()
    idx = cache.fixed_rows(pulled, arms)
    assert idx.tolist() == [4, 0, 17, 9]
    assert match_rows(torch.cat([pulled, pulled[:1] + 1.0]), arms).tolist() == [4, 0, 17, 9, -1]
    mask = torch.tensor([True, False, True, True])
    rows = cache.dictionary_rows(nys.kernel_block, arms, idx, mask)
    assert torch.allclose(rows, kernel_matrix(nys.kernel, pulled[mask], arms), atol=1e-14, rtol=0)
    # a new pulled arm: its row is computed once, on demand
    cache.push(11)
    idx = cache.fixed_rows(torch.cat([pulled, arms[11:12]]), arms)
    rows = cache.dictionary_rows(nys.kernel_block, arms, idx, torch.tensor([False, True, False, False, True]))
    assert cache.n_rows == 5
    assert torch.allclose(rows, kernel_matrix(nys.kernel, arms[[0, 11]], arms), atol=1e-14, rtol=0)
    # a pulled point that is not an arm: no fixed rows; past the budget: no rows
    assert ArmRowCache().fixed_rows(torch.cat([pulled, pulled[:1] + 1.0]), arms) is None
    small = ArmRowCache(max_entries=0)
    assert small.dictionary_rows(nys.kernel_block, arms, idx, torch.ones(5, dtype=torch.bool)) is None
    # the arm set changes: restart twice, then give up (contextual use)
    fresh = ArmRowCache()
    for k in range(3):
        out = fresh.pulled_rows(pulled, arms + k)
        assert (out is None) == (k == 2)

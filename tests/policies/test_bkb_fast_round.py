"""BKB's per-round fast path (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, §3.1
and §3.2): the scoring by ``[HᵀP; wᵀP]`` (``HHᵀ = I − λA⁻¹``) against the model's
``[P; (λA⁻¹ − I)P; wᵀP]``, the resampling draw without clamps against the clamped law, and the
chosen row that ``update`` does not validate again unless the candidates changed in place."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import make_kernel
from torchbandits.models.nystrom import NystromKernelRidge, whitened_scores, whitened_scoring_matrix
from torchbandits.models.nystrom_arms import dtc_round, identity, tensor_version
from torchbandits.models.nystrom_updates import whitened_system, whitening
from torchbandits.models.rls import RLSResampler, inclusion_probabilities
from torchbandits.policies import BKB

LAM = 0.01


@pytest.mark.parametrize(("ell", "m"), [(0.5, 25), (0.5, 50), (0.2, 60), (1.5, 40)])
def test_half_width_scoring_equals_the_model_scoring_matrix(ell: float, m: int) -> None:
    """``k − ‖HᵀPk_Z‖²`` and ``wᵀPk_Z`` equal ``k − ‖f‖² + λfᵀA⁻¹f`` and ``wᵀf`` of the full
    ``[2m+1, m]`` product on the same whitened system (ℓ = 1.5: pivoted, compact ``P``), and the
    product has ``r + 1`` rows instead of ``2r + 1``."""
    g = torch.Generator().manual_seed(m)
    arms = torch.rand(1000, 2, generator=g, dtype=torch.float64)
    n = 4 * m
    idx = torch.randperm(1000, generator=g)[:n]
    sel = torch.randperm(n, generator=g)[:m].sort().values
    counts = torch.randint(1, 20, (n,), generator=g).double()
    sums = counts * torch.sin(4 * arms[idx, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    model = NystromKernelRidge(make_kernel("rbf", ell), LAM)
    kza = model.kernel_block(arms[idx[sel]], arms)
    mean, var = dtc_round(kza, kza.index_select(1, idx), sel, counts, sums, LAM, 1.0)
    var = var * LAM                                   # the GP-scale variance λσ̃²
    kxz = kza.index_select(1, idx).mT
    p = whitening(kxz.index_select(0, sel), torch.eye(m, dtype=torch.float64), 1.0)
    _, _, a_inv, rhs = whitened_system(kxz, p, counts, sums, LAM)
    em, ev = whitened_scores(whitened_scoring_matrix(p, a_inv, a_inv @ rhs, LAM) @ kza, m, 1.0)
    assert float((mean - em).abs().max()) < 1e-10 * float(em.abs().max())
    assert float((var - ev.clamp(0.0, 1.0)).abs().max()) < 1e-10
    compact = whitening(kxz.index_select(0, sel), identity(m, kza), 1.0, compact=True)
    assert compact.shape[0] == int((p.abs().sum(1) > 0).sum())
    assert (compact.shape[0] < m) == (ell == 1.5)


@pytest.mark.parametrize(("ell", "m", "jitter"), [(0.5, 25, 0.0), (0.2, 60, 0.0), (1.5, 40, 0.0),
                                                  (0.5, 30, 1e-6)])
def test_round_posterior_from_the_pulled_gram_equals_the_column_gather(ell: float, m: int,
                                                                       jitter: float) -> None:
    """:func:`dtc_round` with ``K_ZP`` from the pulled points' own Gram block (what the policy
    gathers by rows) equals it with ``K_ZP`` gathered as columns of ``K_ZA`` to rounding, and the
    ridge variance lies in ``[0, k/λ]`` (ℓ = 1.5: a pivoted, compact whitening; a jitter on
    ``K_ZZ``)."""
    g = torch.Generator().manual_seed(7 * m)
    arms = torch.rand(800, 2, generator=g, dtype=torch.float64)
    n = 3 * m
    idx = torch.randperm(800, generator=g)[:n]
    sel = torch.randperm(n, generator=g)[:m].sort().values
    counts = torch.randint(1, 9, (n,), generator=g).double()
    sums = counts * torch.cos(3 * arms[idx, 1]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    kza = NystromKernelRidge(make_kernel("rbf", ell), LAM).kernel_block(arms[idx[sel]], arms)
    model = NystromKernelRidge(make_kernel("rbf", ell), LAM)
    gram = model.kernel_block(arms[idx[sel]], arms[idx])            # K_ZP evaluated afresh
    mean0, var0 = dtc_round(kza, kza.index_select(1, idx), sel, counts, sums, LAM, 1.0, jitter)
    mean1, var1 = dtc_round(kza, gram, sel, counts, sums, LAM, 1.0, jitter)
    assert float((mean1 - mean0).abs().max()) <= 1e-10 * float(mean0.abs().max())
    assert float((var1 - var0).abs().max()) <= 1e-10 / LAM
    assert float(var1.min()) >= 0.0 and float(var1.max()) <= 1.0 / LAM


def test_pulled_gram_holds_the_cached_rows_at_the_pulled_arms() -> None:
    """The pulled points' Gram matrix that the rounds gather ``K_ZP`` from equals the cached
    kernel rows read at the pulled arms, entry for entry, as it grows, after the arm set changes
    (restarted) and in a deep copy (made again); the UCBs of the copy equal the original's."""
    import copy

    arms = torch.rand(60, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pol = BKB(make_kernel("rbf", 0.3), LAM, qbar=3.0, seed=2)
    f = torch.sin(5 * arms[:, 0])
    for t in range(80):
        cand = arms if t < 50 else arms.flip(0)  # a changed arm set after 50 rounds
        i = pol.select(cand)
        if t in (10, 49, 50, 79):  # after a select: every pulled point's row is cached
            idx = pol.arm_rows.fixed_rows(pol.pulled, cand)
            n = pol.n_distinct
            gram = pol._pulled_gram(idx)[:n]
            assert torch.equal(gram, pol.arm_rows.rows[:n].index_select(1, idx))
        pol.update(cand[i], f[i if t < 50 else 59 - i])
    twin = copy.deepcopy(pol)
    assert torch.equal(twin(arms.flip(0)), pol(arms.flip(0)))


@pytest.mark.parametrize("qbar", [1.0, 2.0])
@pytest.mark.parametrize("sampler", ["linearized", "binomial", "uniform", "all"])
def test_draw_keeps_what_the_clamped_law_keeps(sampler: str, qbar: float) -> None:
    """``draw`` (no clamps; with q̄ = 1 no multiplication by q̄) keeps the same points as the
    comparison with the clamped probabilities, from the same generator state, negative and
    over-one variances included; written into an ``out`` buffer (the policy's dictionary mask) it
    is the same mask and returns that buffer; its copies (or the mask where every kept point is
    one copy) give ``resample``'s ``m_theory``."""
    g = torch.Generator().manual_seed(0)
    var = torch.cat([torch.tensor([-0.3, 0.0, 5.0], dtype=torch.float64),
                     torch.rand(200, generator=g, dtype=torch.float64) * 0.2])
    cnt = torch.randint(1, 6, (203,), generator=g).double()
    rs = RLSResampler(qbar, sampler)
    for seed in range(20):
        mask, copies = rs.draw(var, cnt, torch.Generator().manual_seed(seed))
        res = rs.resample(var, cnt, torch.Generator().manual_seed(seed))
        buf = torch.zeros(203, dtype=torch.bool)
        into, _ = rs.draw(var, cnt, torch.Generator().manual_seed(seed), out=buf)
        assert into is buf and torch.equal(buf, mask)
        assert torch.equal(mask, res.mask)
        assert res.m_theory == (int(mask.sum()) if copies is None else int(copies.sum()))
        if sampler in ("linearized", "uniform"):
            u = torch.rand(203, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            assert torch.equal(mask, u < inclusion_probabilities(var, cnt, qbar, sampler))


def test_update_revalidates_a_row_changed_in_place() -> None:
    """``update(arms[i], r)`` after ``select(arms)`` skips validating the row, but an in-place
    change of the candidates in between (version counter) sends it through validation: a NaN
    written into the chosen row is refused."""
    arms = torch.rand(40, 2, dtype=torch.float64)
    pol = BKB(make_kernel("rbf", 0.3), LAM, seed=0)
    for _ in range(6):
        i = pol.select(arms)
        pol.update(arms[i], 0.5)
    i = pol.select(arms)
    before = tensor_version(arms)
    arms[i, 0] = float("nan")
    assert tensor_version(arms) != before
    with pytest.raises(ValueError, match="finite"):
        pol.update(arms[i], 0.5)
    assert pol.t == 6


def test_select_compares_candidates_changed_in_place() -> None:
    """``select(arms)`` on the same tensor object skips comparing it with the cached arm set only
    while its version counter stands still: a value changed in place is seen (the cached rows
    restart on the changed set, a NaN is refused), and the UCBs equal those of a fresh copy."""
    arms = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    pol = BKB(make_kernel("rbf", 0.3), LAM, seed=0)
    for _ in range(6):
        i = pol.select(arms)
        pol.update(arms[i], 0.5)
    arms[5, 1] = 0.25  # in place: the next select compares and restarts the row cache
    assert torch.equal(pol(arms), pol(arms.clone()))
    i = pol.select(arms)
    assert pol.arm_rows.arms is not None and torch.equal(pol.arm_rows.arms, arms)
    arms[i, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        pol.select(arms)

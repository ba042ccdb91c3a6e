"""BKB's per-round fast path (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, §3.1
and §3.2): the scoring by ``[HᵀP; wᵀP]`` (``HHᵀ = I − λA⁻¹``) against the model's
``[P; (λA⁻¹ − I)P; wᵀP]``, the resampling draw without clamps against the clamped law, and the
chosen row that ``update`` does not validate again unless the candidates changed in place."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import make_kernel
from torchbandits.models.nystrom import NystromKernelRidge, whitened_scores, whitened_scoring_matrix
from torchbandits.models.nystrom_arms import arm_posterior, identity, tensor_version
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
    mean, var = arm_posterior(kza, idx, sel, counts, sums, LAM, 1.0)
    kxz = kza.index_select(1, idx).mT
    p = whitening(kxz.index_select(0, sel), torch.eye(m, dtype=torch.float64), 1.0)
    _, _, a_inv, rhs = whitened_system(kxz, p, counts, sums, LAM)
    em, ev = whitened_scores(whitened_scoring_matrix(p, a_inv, a_inv @ rhs, LAM) @ kza, m, 1.0)
    assert float((mean - em).abs().max()) < 1e-10 * float(em.abs().max())
    assert float((var - ev.clamp(0.0, 1.0)).abs().max()) < 1e-10
    compact = whitening(kxz.index_select(0, sel), identity(m, kza), 1.0, compact=True)
    assert compact.shape[0] == int((p.abs().sum(1) > 0).sum())
    assert (compact.shape[0] < m) == (ell == 1.5)


@pytest.mark.parametrize("sampler", ["linearized", "binomial", "uniform", "all"])
def test_draw_keeps_what_the_clamped_law_keeps(sampler: str) -> None:
    """``draw`` (no clamps) keeps the same points as the comparison with the clamped
    probabilities, from the same generator state, negative and over-one variances included; its
    copies (or the mask where every kept point is one copy) give ``resample``'s ``m_theory``."""
    g = torch.Generator().manual_seed(0)
    var = torch.cat([torch.tensor([-0.3, 0.0, 5.0], dtype=torch.float64),
                     torch.rand(200, generator=g, dtype=torch.float64) * 0.2])
    cnt = torch.randint(1, 6, (203,), generator=g).double()
    rs = RLSResampler(2.0, sampler)
    for seed in range(20):
        mask, copies = rs.draw(var, cnt, torch.Generator().manual_seed(seed))
        res = rs.resample(var, cnt, torch.Generator().manual_seed(seed))
        assert torch.equal(mask, res.mask)
        assert res.m_theory == (int(mask.sum()) if copies is None else int(copies.sum()))
        if sampler in ("linearized", "uniform"):
            u = torch.rand(203, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            assert torch.equal(mask, u < inclusion_probabilities(var, cnt, 2.0, sampler))


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

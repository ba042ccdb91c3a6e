"""BKB's fused per-round posterior on a fixed arm set (Calandriello et al., COLT 2019, §3.1 eq. 4,
§3.2): :func:`~torchbandits.models.nystrom_arms.dtc_round` against the model's rebuild and
scoring, and the policy's fused rounds against its model route."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import make_kernel
from torchbandits.models.arm_rows import ArmRowCache
from torchbandits.models.nystrom import NystromKernelRidge
from torchbandits.models.nystrom_arms import dtc_round, identity, ones
from torchbandits.policies import BKB

LAM = 0.01


def _problem(n_arms: int, n_pulled: int, m: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(n_arms, 2, generator=g, dtype=torch.float64)
    idx = torch.randperm(n_arms, generator=g)[:n_pulled]
    sel = torch.randperm(n_pulled, generator=g)[:m].sort().values
    counts = torch.randint(1, 6, (n_pulled,), generator=g).double()
    noise = torch.randn(n_pulled, generator=g, dtype=torch.float64)
    sums = counts * torch.sin(4 * arms[idx, 0]) + 0.1 * noise
    return arms, idx, sel, counts, sums


@pytest.mark.parametrize(("ell", "m", "jitter"), [(0.3, 12, 0.0), (0.3, 12, 1e-6), (1.5, 40, 0.0)])
def test_dtc_round_equals_the_model_rebuild_and_score(ell: float, m: int, jitter: float) -> None:
    """Same numbers as ``rebuild_from_counts`` + ``score`` (to BLAS rounding), including a
    numerically singular ``K_ZZ`` (ℓ = 1.5, 40 anchors in [0, 1]²: the pivoted whitening) and a
    nugget."""
    arms, idx, sel, counts, sums = _problem(300, 80, m)
    model = NystromKernelRidge(make_kernel("rbf", ell), LAM, jitter=jitter)
    kza = model.kernel_block(arms[idx[sel]], arms)
    mean, var = dtc_round(kza, kza.index_select(1, idx), sel, counts, sums, LAM, 1.0, jitter)
    var = var * LAM                                   # the GP-scale variance λσ̃²
    model.rebuild(arms[idx[sel]], arms[idx], sums, counts)
    em, ev = model.mean_var(arms)
    scale = float(em.abs().max())
    assert float((mean - em).abs().max()) < 1e-11 * scale
    assert float((var - ev).abs().max()) < 1e-11
    assert float(var.min()) >= 0.0 and float(var.max()) <= 1.0
    if ell == 1.5:  # the pivoted branch was taken: plain Cholesky pivots below the tolerance
        chol = torch.linalg.cholesky_ex(model.kernel_block(arms[idx[sel]], arms[idx[sel]]))[0]
        assert float(torch.diagonal(chol).min()) ** 2 < 1e-14


@pytest.mark.parametrize("sampler", ["binomial", "linearized"])
def test_fused_rounds_equal_the_model_route(sampler: str) -> None:
    """On a fixed arm set the policy scores with the fused pass; its UCBs equal, round after
    round, those from the model rebuilt from the same counts with kernels evaluated afresh
    (``posterior``, the route the policy takes on other candidates)."""
    g = torch.Generator().manual_seed(3)
    arms = torch.rand(150, 2, generator=g, dtype=torch.float64)
    f = torch.sin(5 * arms[:, 0]) * torch.cos(3 * arms[:, 1])
    pol = BKB(make_kernel("rbf", 0.3), LAM, noise_std=0.1, sampler=sampler, qbar=2.0, seed=0)
    worst = 0.0
    for t in range(120):
        i = pol.select(arms)
        if t > 2 and pol.dictionary_size:
            ucb = pol(arms)
            mean, var, _ = pol.posterior(arms)  # the model route
            beta = pol.diagnostics()["beta"]
            worst = max(worst, float((ucb - (mean + beta * var.sqrt())).abs().max()))
        pol.update(arms[i], float(f[i]) + 0.1 * float(torch.randn((), generator=g, dtype=torch.float64)))
    assert worst < 1e-9


def test_same_arms_sees_an_in_place_change() -> None:
    """The arm set is validated once: an equal tensor (another object too) is recognised, an
    in-place change or a NaN is not, and the policy then validates (and refuses the NaN)."""
    arms = torch.rand(30, 2, dtype=torch.float64)
    cache = ArmRowCache()
    assert not cache.same_arms(arms)  # nothing cached yet
    pol = BKB(make_kernel("rbf", 0.3), LAM, seed=0)
    for _ in range(5):
        i = pol.select(arms)
        pol.update(arms[i], 0.5)
    assert pol.arm_rows.same_arms(arms.clone())
    assert not pol.arm_rows.same_arms(arms.float())
    bad = arms.clone()
    bad[3, 0] = float("nan")
    assert not pol.arm_rows.same_arms(bad)
    with pytest.raises(ValueError, match="finite"):
        pol.select(bad)
    moved = arms.clone()
    moved[0, 0] += 0.5
    pol.select(moved)  # a changed arm set: matched anew, the rows restart
    assert pol.arm_rows.changes == 2


def test_model_read_from_outside_is_current() -> None:
    """The fused rounds write no model buffer; ``policy.model`` read from outside is rebuilt for
    the current dictionary and counts (what the soak benchmark checks against a from-scratch
    posterior)."""
    g = torch.Generator().manual_seed(5)
    arms = torch.rand(80, 2, generator=g, dtype=torch.float64)
    pol = BKB(make_kernel("rbf", 0.3), LAM, noise_std=0.1, qbar=2.0, seed=0)
    for _ in range(40):
        i = pol.select(arms)
        pol.update(arms[i], float(torch.sin(3 * arms[i, 0])))
    model = pol.model
    assert model.m == pol.dictionary_size > 0 and model.n == pol.n_distinct
    assert torch.equal(model.counts, pol.counts) and torch.equal(model.dictionary, pol.dictionary)
    mean, _, var_gp = pol.posterior(arms)
    em, ev = model.mean_var(arms)
    assert torch.equal(mean, em) and float((var_gp - ev).abs().max()) < 1e-14


def test_shared_round_constants_are_made_once_with_the_asked_shape() -> None:
    """``identity`` and ``ones`` (the round's constants) are ``I_m`` and all-ones tensors of the
    asked shape and of the reference tensor's dtype, the same object on every call, and distinct
    per shape and dtype (``ones(())`` is the scalar 1 that the variance's product starts from)."""
    x64 = torch.zeros(3, dtype=torch.float64)
    x32 = torch.zeros(3, dtype=torch.float32)
    assert torch.equal(identity(4, x64), torch.eye(4, dtype=torch.float64))
    assert identity(4, x64) is identity(4, x64) and identity(4, x32).dtype == torch.float32
    one, row = ones((), x64), ones((1, 5), x64)
    assert one.shape == () and float(one) == 1.0 and row.shape == (1, 5) and bool((row == 1).all())
    assert ones((1, 5), x64) is row and ones((1, 5), x32) is not row and ones((5,), x64) is not row

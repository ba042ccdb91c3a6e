"""The exact-posterior family on one solve-and-score step (models/posterior.py) and the model=
contract of the UCB policies (policies.base.check_model).

* every model's incremental / cached posterior equals a from-scratch solve of its own formula;
* a policy handed a model plays exactly like the default construction;
* a bad model is refused with a ValueError naming ``model`` and is left as it was.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from torchbandits import GPUCB, KernelUCB
from torchbandits.confidence import AMMBound
from torchbandits.confidence.gain import GainBeta
from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.linalg import GrowingCholesky, logdet_from_cholesky, logdet_from_diagonal
from torchbandits.models import (
    DiscountedKernelRidge,
    ExactKernelRidge,
    SlidingWindowKernelRidge,
    TimeDecayKernelRidge,
    exact_posterior_reference,
)
from torchbandits.models.finite_arm import FiniteArmRidge
from torchbandits.models.posterior import (
    CandidateCache,
    colsum_sq,
    gp_scores,
    score_whitened,
    whitened_solve,
)
from torchbandits.policies.base import check_model
from torchbandits.policies.op_baselines import sw_gp_ucb, wgp_ucb
from torchbandits.policies.time_varying import RGPUCB, SWGPUCB, TVGPUCB, WGPUCB

from ..conftest import rand

F64 = torch.float64


def _kernel():
    return make_kernel("rbf", 0.3)


def _reference(kernel, x, y, cand, reg_diag):
    """From scratch: ``μ = k_Sᵀ M⁻¹ Y``, ``ρ² = k − k_Sᵀ M⁻¹ k_S`` with ``M = K + diag(reg_diag)``
    (explicit inverse, no factor shared with the models), and ``a = M⁻¹ k_S``."""
    gram = kernel_matrix(kernel, x, x) + torch.diag(reg_diag)
    inv = torch.linalg.inv(gram)
    kq = kernel_matrix(kernel, x, cand)
    a = inv @ kq
    return kq.T @ inv @ y, kernel_diag(kernel, cand) - (kq * a).sum(0), a


# ---------------------------------------------------------------- the shared helpers
def test_helpers_equal_direct_solves(gen):
    n, a_count = 12, 7
    b = rand(gen, n, n)
    chol = torch.linalg.cholesky(b @ b.T + n * torch.eye(n, dtype=F64))
    kq, y, kdiag = rand(gen, n, a_count), rand(gen, n), 5.0 + rand(gen, a_count)
    v = torch.linalg.solve(chol, kq)
    z = torch.linalg.solve(chol, y[:, None])[:, 0]
    assert torch.allclose(whitened_solve(chol, kq), v, atol=1e-12)
    assert torch.allclose(whitened_solve(chol, y), z, atol=1e-12)
    grow = GrowingCholesky(block=4)
    grow.set_dense(chol)
    assert torch.allclose(whitened_solve(grow, kq), v, atol=1e-12)
    mean, var, v2 = gp_scores(chol, kq, y, kdiag)
    assert torch.allclose(mean, z @ v, atol=1e-12)
    assert torch.allclose(var, kdiag - (v * v).sum(0), atol=1e-12)
    assert torch.allclose(v2, v, atol=1e-12)
    m1, s1 = score_whitened(z, v, kdiag, colsum_sq(v))
    m2, s2 = score_whitened(z, v, kdiag, colsum_sq(v), scale=0.5)
    assert torch.allclose(m2, 0.5 * m1, atol=1e-12)
    assert torch.allclose(s2, (kdiag - 0.25 * colsum_sq(v)).clamp_min(0.0), atol=1e-12)
    assert bool((s1 >= 0).all()) and float(score_whitened(z, v, kdiag * 0, colsum_sq(v))[1].max()) == 0.0
    gram = chol @ chol.T
    assert torch.allclose(logdet_from_cholesky(chol), torch.logdet(gram), atol=1e-10)
    assert torch.allclose(logdet_from_diagonal(torch.diagonal(chol)), torch.logdet(gram), atol=1e-10)
    assert torch.allclose(grow.logdet(), torch.logdet(gram), atol=1e-10)


def test_candidate_cache_extension_equals_full_solve(gen):
    n0, n, a_count = 5, 11, 6
    b = rand(gen, n, n)
    chol = torch.linalg.cholesky(b @ b.T + n * torch.eye(n, dtype=F64))
    kq = rand(gen, n, a_count)
    cand = rand(gen, a_count, 2)
    grow = GrowingCholesky(block=4)
    grow.set_dense(chol[:n0, :n0])
    v0 = grow.solve(kq[:n0])
    cache = CandidateCache.build(cand, torch.ones(a_count, dtype=F64), v0, colsum_sq(v0), version=3)
    assert cache.serves(cand, n0, 3) and cache.serves(cand, n, 3)
    assert not cache.serves(cand, n0, 4) and not cache.serves(cand + 1e-9, n0, 3)
    for i in range(n0, n):  # append the rows of the full factor one at a time
        grow.append(chol[i, :i], chol[i, i])
    cache.extend(grow, kq[n0:])
    full = torch.linalg.solve_triangular(chol, kq, upper=False)
    assert cache.n_at == n
    assert torch.allclose(cache.v[:n], full, atol=1e-12)
    assert torch.allclose(cache.sumsq, (full * full).sum(0), atol=1e-12)


# ---------------------------------------------------------------- each model vs from scratch
def test_exact_cached_and_fresh_candidates_equal_from_scratch(gen):
    k = _kernel()
    x, y, fixed = rand(gen, 40, 2), rand(gen, 40), rand(gen, 25, 2)
    m = ExactKernelRidge(k, 0.1, (0.5,))
    for i in range(40):  # the fixed set is scored every round: the cache gains one row a round
        m.append(x[i], y[i])
        if i % 7 == 3:
            mu, var = m.mean_var(fixed)
            mu_r, var_r = exact_posterior_reference(k, x[: i + 1], y[: i + 1], fixed, 0.1)
            assert torch.allclose(mu, mu_r, atol=1e-9) and torch.allclose(var, var_r, atol=1e-9)
    fresh = rand(gen, 9, 2)
    means, variances = m.mean_var_many(fresh, [0.1, 0.5, 2.0])  # maintained, maintained, scratch
    for r, reg in enumerate((0.1, 0.5, 2.0)):
        mu_r, var_r, _ = _reference(k, x, y, fresh, torch.full((40,), reg, dtype=F64))
        assert torch.allclose(means[r], mu_r, atol=1e-9)
        assert torch.allclose(variances[r], var_r.clamp_min(0), atol=1e-9)


@pytest.mark.parametrize("cls, kw", [(SlidingWindowKernelRidge, {}),
                                     (ExactKernelRidge, {"removal": "rank_one"}),
                                     (ExactKernelRidge, {"removal": "refactorise"})])
def test_window_removals_equal_from_scratch(gen, cls, kw):
    k, w = _kernel(), 10
    x, y, fixed = rand(gen, 35, 2), rand(gen, 35), rand(gen, 15, 2)
    m = cls(k, 0.05, **kw)
    for i in range(35):
        m.append(x[i], y[i])
        if m.n > w:
            m.remove_oldest(m.n - w)
        mu, var = m.mean_var(fixed)
        lo = max(0, i + 1 - w)
        mu_r, var_r = exact_posterior_reference(k, x[lo : i + 1], y[lo : i + 1], fixed, 0.05)
        assert torch.allclose(mu, mu_r, atol=1e-8) and torch.allclose(var, var_r, atol=1e-8)
        ld = torch.logdet(torch.eye(m.n, dtype=F64) + kernel_matrix(k, x[lo : i + 1], x[lo : i + 1]) / 0.05)
        assert torch.allclose(m.log_det(), ld, atol=1e-8)


def test_refactorise_removal_is_refused_by_the_carrying_window():
    with pytest.raises(ValueError, match="removal"):
        SlidingWindowKernelRidge(_kernel(), 1.0, removal="refactorise")
    with pytest.raises(ValueError, match="removal"):
        ExactKernelRidge(_kernel(), 1.0, removal="downdate")


@pytest.mark.parametrize("width", ["sandwich", "weighted"])
def test_discounted_equals_from_scratch(gen, width):
    k, lam, g = _kernel(), 0.2, 0.9
    x, y, cand = rand(gen, 20, 2), rand(gen, 20), rand(gen, 11, 2)
    m = DiscountedKernelRidge(k, lam, g, width=width, weight_floor=0.0)
    for i in range(20):
        m.append(x[i], y[i])
    inv_w = g ** -torch.arange(19, -1, -1, dtype=F64)
    mu_r, var_r, a = _reference(k, x, y, cand, lam * inv_w)
    if width == "sandwich":  # k − k_Sᵀa − λ Σ a_i² (1/w_i − 1)
        var_r = var_r - lam * ((inv_w - 1.0)[:, None] * a * a).sum(0)
    mu, var = m.mean_var(cand)
    assert torch.allclose(mu, mu_r, atol=1e-9) and torch.allclose(var, var_r.clamp_min(0), atol=1e-9)
    w_half = (1.0 / inv_w).sqrt()
    gram = kernel_matrix(k, x, x)
    ld = torch.logdet(torch.eye(20, dtype=F64) + w_half[:, None] * gram * w_half[None, :] / lam)
    assert torch.allclose(m.log_det(), ld, atol=1e-9)


def test_time_decay_cached_equals_from_scratch(gen):
    k, lam, eps = _kernel(), 0.1, 0.05
    rho = math.sqrt(1 - eps)
    x, y, fixed = rand(gen, 30, 2), rand(gen, 30), rand(gen, 13, 2)
    m = TimeDecayKernelRidge(k, lam, eps)
    for i in range(30):
        m.append(x[i], y[i])
        if i % 4 == 1:  # the cache of the fixed set gains rows between checks
            n, tau = i + 1, torch.arange(1, i + 2, dtype=F64)
            lag = (tau[:, None] - tau[None, :]).abs()
            gram = kernel_matrix(k, x[:n], x[:n]) * rho**lag + lam * torch.eye(n, dtype=F64)
            kq = kernel_matrix(k, x[:n], fixed) * (rho ** (n + 1 - tau))[:, None]
            inv = torch.linalg.inv(gram)
            mu, var = m.mean_var(fixed)
            assert torch.allclose(mu, kq.T @ inv @ y[:n], atol=1e-9)
            assert torch.allclose(var, (1.0 - (kq * (inv @ kq)).sum(0)).clamp_min(0), atol=1e-9)


@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_finite_arm_equals_kernel_form(gen, discount):
    k, lam = _kernel(), 0.3
    arms = rand(gen, 15, 2)
    fa = FiniteArmRidge(k, lam, discount=discount, arms=arms)
    idx = torch.randint(15, (25,), generator=gen)
    y = rand(gen, 25)
    for i, r in zip(idx.tolist(), y):
        fa.append(arms[i], r)
    x = arms[idx]
    inv_w = discount ** -torch.arange(24, -1, -1, dtype=F64)
    mu_r, var_r, _ = _reference(k, x, y, arms, lam * inv_w)
    mu, var = fa.mean_var(arms)
    assert torch.allclose(mu, mu_r, atol=1e-7) and torch.allclose(var, var_r.clamp_min(0), atol=1e-7)
    w_half = (1.0 / inv_w).sqrt()
    ld = torch.logdet(torch.eye(25, dtype=F64) + w_half[:, None] * kernel_matrix(k, x, x) * w_half / lam)
    assert torch.allclose(fa.log_det(), ld, atol=1e-7)


# ---------------------------------------------------------------- model= equals the default
def _play(pol, arms, rounds=25, seed=0):
    gen = torch.Generator().manual_seed(seed)
    actions, scores = [], []
    for _ in range(rounds):
        i = pol.select(arms)
        actions.append(i)
        pol.update(arms[i], float(torch.sin(4 * arms[i]).sum()) + 0.1 * float(
            torch.randn((), generator=gen, dtype=F64)))
        scores.append(pol(arms))
    return actions, torch.stack(scores)


POLICIES = {
    "KernelUCB": (lambda k, m=None: KernelUCB(k, 0.5, 0.3, **({} if m is None else {"model": m})),
                  lambda k: ExactKernelRidge(k, 0.5)),
    "GPUCB": (lambda k, m=None: GPUCB(k, beta=AMMBound(0.1, 1.0), lam=0.5,
                                      **({} if m is None else {"model": m})),
              lambda k: ExactKernelRidge(k, 0.5, AMMBound(0.1, 1.0).required_regularisers(0.5))),
    "RGPUCB": (lambda k, m=None: RGPUCB(k, 0.5, 8, 1.0, **({} if m is None else {"model": m})),
               lambda k: ExactKernelRidge(k, 0.5)),
    "SWGPUCB": (lambda k, m=None: SWGPUCB(k, 0.5, 8, 1.0, **({} if m is None else {"model": m})),
                lambda k: SlidingWindowKernelRidge(k, 0.5)),
    "TVGPUCB": (lambda k, m=None: TVGPUCB(k, 0.5, 0.05, 1.0, **({} if m is None else {"model": m})),
                lambda k: TimeDecayKernelRidge(k, 0.5, 0.05)),
    "WGPUCB": (lambda k, m=None: WGPUCB(k, 0.5, 0.9, 1.0, **({} if m is None else {"model": m})),
               lambda k: DiscountedKernelRidge(k, 0.5, 0.9)),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_model_argument_plays_like_the_default(gen, name):
    make, make_model = POLICIES[name]
    arms = rand(gen, 20, 2)
    model = make_model(_kernel())
    handed = make(_kernel(), model)
    assert handed.model is model
    a_def, s_def = _play(make(_kernel()), arms)
    a_mod, s_mod = _play(handed, arms)
    assert a_def == a_mod
    assert torch.equal(s_def, s_mod)


def test_finite_arm_presets_hand_their_model_in(gen):
    arms = rand(gen, 12, 2)
    presets = ((sw_gp_ucb(_kernel(), 0.5, 1.0, 6), SWGPUCB), (wgp_ucb(_kernel(), discount=0.9), WGPUCB))
    for pol, kind in presets:
        assert isinstance(pol, kind) and isinstance(pol.model, FiniteArmRidge)
        assert isinstance(pol.rule, GainBeta)
        _play(pol, arms, rounds=10)
        assert pol.model.n == (6 if kind is SWGPUCB else 10)
    # SW-GP-UCB on the finite-arm model equals the kernel-form window posterior
    k = _kernel()
    fa = SWGPUCB(k, 0.5, 6, 1.0, tie_break="first", model=FiniteArmRidge(k, 0.5, arms=arms))
    ex = SWGPUCB(k, 0.5, 6, 1.0, tie_break="first")
    a_fa, s_fa = _play(fa, arms, rounds=15)
    a_ex, s_ex = _play(ex, arms, rounds=15)
    assert a_fa == a_ex and torch.allclose(s_fa, s_ex, atol=1e-7)


# ---------------------------------------------------------------- a bad model is refused
class _NoRemoval(nn.Module):
    """Has the posterior methods but no ``remove_oldest``."""

    regularisers = (0.5,)
    n = 0
    lam = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.kernel = _kernel()

    def mean_var(self, candidates, reg=None):  # pragma: no cover - never called
        raise AssertionError

    log_det = append = reset = mean_var


def _bad_models():
    k = _kernel()
    full = ExactKernelRidge(k, 0.5)
    full.append(torch.tensor([0.1, 0.2], dtype=F64), 1.0)
    return {
        "not a module": (lambda m: KernelUCB(k, 0.5, 1.0, model=m), object()),
        "wrong lam": (lambda m: RGPUCB(k, 0.5, None, 1.0, model=m), ExactKernelRidge(k, 0.25)),
        "holds data": (lambda m: KernelUCB(k, 0.5, 1.0, model=m), full),
        "wrong dtype": (lambda m: WGPUCB(k, 0.5, 0.9, 1.0, model=m),
                        DiscountedKernelRidge(k, 0.5, 0.9, dtype=torch.float32)),
        "missing regulariser": (lambda m: GPUCB(k, 0.5, AMMBound(0.1, 1.0), model=m),
                                ExactKernelRidge(k, 0.5)),
        "no remove_oldest": (lambda m: SWGPUCB(k, 0.5, 5, 1.0, model=m), _NoRemoval()),
        "finite arm for extra regulariser": (lambda m: KernelUCB(k, 0.5, AMMBound(0.1, 1.0), model=m),
                                             FiniteArmRidge(k, 0.5)),
    }


@pytest.mark.parametrize("case", list(_bad_models()))
def test_a_bad_model_is_refused_and_left_unchanged(case):
    build, model = _bad_models()[case]
    before = ({k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
               for k, v in model.state_dict().items()} if isinstance(model, nn.Module) else None)
    n_before = getattr(model, "n", None)
    with pytest.raises(ValueError, match="model"):
        build(model)
    if before is not None:
        after = model.state_dict()
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) if isinstance(before[k], torch.Tensor)
                   else before[k] == after[k] for k in before)
        assert getattr(model, "n", None) == n_before


def test_check_model_returns_the_model_untouched():
    m = SlidingWindowKernelRidge(_kernel(), 0.5)
    assert check_model(m, lam=0.5, dtype=F64, needs=("remove_oldest",)) is m
    assert m.n == 0

"""Full-dictionary accuracy of BKB's Nyström posterior (Calandriello et al., COLT 2019, §3.1, eq. 4).

With every pulled arm in the dictionary the DTC posterior *is* the exact kernel ridge / GP one
(the projection onto the span of the data loses nothing), whatever the conditioning of ``K_ZZ``.
On 260 arms in [0, 1]² with an RBF kernel, ``cond(K_ZZ)`` is 6e18 at ℓ = 0.2 (numerically
singular: plain Cholesky fails) and 2e10 at ℓ = 0.1. The exact answer is computed here from
``(C^½ K C^½ + λI)`` (eigenvalues ≥ λ, so well posed) in numpy's extended precision; the model and
the policy must match it, and the independent extended-precision DTC reference
(:func:`~torchbandits.models.nystrom.nystrom_posterior_reference` with ``extended=True``), to 1e-9
(mean relative to its largest value; GP-scale variance, ``k(x,x) = 1``). A 1e-10 nugget on
``K_ZZ`` (what the rebuild did before the pivoted whitening) is 8e-8 off on the mean at ℓ = 0.2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchbandits.kernels import make_kernel
from torchbandits.linalg import pivoted_cholesky
from torchbandits.models.nystrom import NystromKernelRidge, nystrom_posterior_reference
from torchbandits.models.nystrom_updates import whitening
from torchbandits.policies import BKB

LAM = 0.01


def _problem(n: int = 260, max_count: int = 5, seed: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` arms in [0, 1]², pull counts 1..max_count, reward sums; candidates = arms + 200
    other points."""
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(n, 2, generator=g, dtype=torch.float64)
    counts = torch.randint(1, max_count + 1, (n,), generator=g).double()
    f = torch.sin(3 * arms[:, 0]) + torch.cos(4 * arms[:, 1])
    sums = counts * f + 0.1 * counts.sqrt() * torch.randn(n, generator=g, dtype=torch.float64)
    cand = torch.cat([arms, torch.rand(200, 2, generator=g, dtype=torch.float64)])
    return arms, counts, sums, cand


def _exact(k_pp: torch.Tensor, k_pc: torch.Tensor, counts: torch.Tensor, sums: torch.Tensor,
           lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact kernel ridge with repeated arms as counts, extended precision:
    ``μ = k_Pᵀ C^½ B⁻¹ C^{-½} s``, ``σ² = k − k_Pᵀ C^½ B⁻¹ C^½ k_P``, ``B = C^½ K C^½ + λI``."""
    ld = np.longdouble
    rc = np.sqrt(counts.numpy().astype(ld))
    b = rc[:, None] * k_pp.numpy().astype(ld) * rc[None, :] + lam * np.eye(len(rc), dtype=ld)
    n = b.shape[0]
    chol = np.zeros_like(b)
    for j in range(n):
        chol[j, j] = np.sqrt(b[j, j] - chol[j, :j] @ chol[j, :j])
        chol[j + 1:, j] = (b[j + 1:, j] - chol[j + 1:, :j] @ chol[j, :j]) / chol[j, j]

    def lsolve(rhs: np.ndarray) -> np.ndarray:
        out = np.zeros_like(rhs)
        for i in range(n):
            out[i] = (rhs[i] - chol[i, :i] @ out[:i]) / chol[i, i]
        return out

    v = lsolve(rc[:, None] * k_pc.numpy().astype(ld))
    u = lsolve((sums.numpy().astype(ld) / rc)[:, None])[:, 0]
    return (v.T @ u).astype(np.float64), (1.0 - (v * v).sum(0)).astype(np.float64)


def _errors(mean: torch.Tensor, var_gp: torch.Tensor, em: np.ndarray, ev: np.ndarray) -> tuple[float, float]:
    return (float(np.abs(mean.numpy() - em).max() / np.abs(em).max()),
            float(np.abs(var_gp.numpy() - ev).max()))


@pytest.mark.parametrize("ell", [0.2, 0.1])
def test_full_dictionary_model_matches_exact_and_reference(ell: float) -> None:
    arms, counts, sums, cand = _problem()
    kern = make_kernel("rbf", ell)
    model = NystromKernelRidge(kern, LAM)
    model.rebuild(arms, arms, sums, counts)
    mean, var = model.mean_var(cand)
    em, ev = _exact(model.kernel_block(arms, arms), model.kernel_block(arms, cand), counts, sums, LAM)
    err_m, err_v = _errors(mean, var, em, ev)
    assert err_m < 1e-9 and err_v < 1e-9, (err_m, err_v)
    rm, rv = nystrom_posterior_reference(kern, arms, arms, sums, cand, LAM, counts, extended=True)
    assert float((mean - rm).abs().max()) < 1e-9 * float(rm.abs().max())
    assert float((var - rv).abs().max()) < 1e-9
    # the printed formula with explicit inverses is the inaccurate one here, not the model
    if ell == 0.2:
        pm, _ = nystrom_posterior_reference(kern, arms, arms, sums, cand, LAM, counts)
        assert float((pm - rm).abs().max()) > 1e-3


@pytest.mark.parametrize("ell", [0.2, 0.1])
def test_full_dictionary_bkb_posterior_matches_exact(ell: float) -> None:
    """The policy (``sampler="all"``, rebuilt from counts every round with kernel rows gathered
    from its arm-row cache) after pulling arm ``a`` ``n_a`` times: its posterior on the arms
    (200 arms, counts 1..2, to keep the ~300 full rebuilds short; at ℓ = 0.2 ``K_ZZ`` is still
    numerically singular, ``cond`` 2e18)."""
    arms, counts, sums, _ = _problem(200, 2)
    rewards = sums / counts  # each pull of arm a returns s_a / n_a: the sums are the same
    bkb = BKB(make_kernel("rbf", ell), LAM, noise_std=0.1, sampler="all", beta_rule="constant",
              beta=1.0, seed=0)
    bkb.select(arms)
    for rep in range(int(counts.max())):
        for a in torch.nonzero(counts > rep)[:, 0].tolist():
            bkb.update(arms[a], float(rewards[a]))
    assert bkb.dictionary_size == 200
    mean, var_ridge, var_gp = bkb.posterior(arms)
    em, ev = _exact(bkb.model.kernel_block(arms, arms), bkb.model.kernel_block(arms, arms), counts,
                    rewards * counts, LAM)
    err_m, err_v = _errors(mean, var_gp, em, ev)
    assert err_m < 1e-9 and err_v < 1e-9, (err_m, err_v)
    assert float((var_ridge * LAM - torch.from_numpy(ev)).abs().max()) < 1e-9


def test_whitening_falls_back_to_pivoting_on_a_singular_kzz() -> None:
    """A duplicated anchor makes ``K_ZZ`` exactly singular: the whitening drops one copy (a zero
    row of ``P``) and keeps ``P K_ZZ Pᵀ`` the identity on the rest; a well-conditioned ``K_ZZ``
    gets the plain ``L⁻¹``."""
    g = torch.Generator().manual_seed(1)
    z = torch.rand(12, 2, generator=g, dtype=torch.float64)
    z = torch.cat([z, z[3:4]])
    model = NystromKernelRidge(make_kernel("rbf", 0.3), LAM)
    kzz = model.kernel_block(z, z)
    eye = torch.eye(13, dtype=torch.float64)
    p = whitening(kzz, eye)
    gram = p @ kzz @ p.mT
    kept = p.abs().sum(1) > 0
    assert int(kept.sum()) == 12
    assert torch.allclose(gram[kept][:, kept], torch.eye(12, dtype=torch.float64), atol=1e-8)
    assert torch.equal(p[~kept], torch.zeros(1, 13, dtype=torch.float64))
    ok = whitening(kzz[:12, :12], eye[:12, :12])
    assert torch.allclose(ok, torch.linalg.inv(torch.linalg.cholesky(kzz[:12, :12])), atol=1e-8)


def test_pivoted_cholesky_reconstructs_and_spans() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.rand(200, 2, generator=g, dtype=torch.float64)
    k = NystromKernelRidge(make_kernel("rbf", 0.4), LAM).kernel_block(x, x)
    chol, piv = pivoted_cholesky(k, 1e-14)
    r = piv.shape[0]
    assert 10 < r < 200
    assert torch.allclose(chol @ chol.mT, k[piv][:, piv], atol=1e-12, rtol=0)
    # every left-out row's residual variance is below the tolerance (it lies in the span)
    emb = torch.linalg.solve_triangular(chol, k[piv], upper=False)
    assert float((torch.diagonal(k) - (emb * emb).sum(0)).max()) < 1e-13

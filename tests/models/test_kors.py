"""KORS (Zenati et al., AISTATS 2022, Algorithm 5): closed form vs eq. 41, limits, the reference score."""

from __future__ import annotations

import pytest
import torch

from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.linalg import bordered_inverse
from torchbandits.models.kors import KORS, kors_leverage_eq41


def _filled(kernel, anchors, probs, mu, eps, score="correct") -> KORS:
    k = KORS(mu, eps, gamma=1.0, score=score)
    for i in range(anchors.shape[0]):
        kz = kernel_matrix(kernel, anchors[:i], anchors[i : i + 1])[:, 0]
        k.add(kz, 1.0, float(probs[i]))
    return k


@pytest.mark.parametrize("mu", [0.1, 1.0, 10.0])
def test_closed_form_equals_eq41(mu: float) -> None:
    g = torch.Generator().manual_seed(int(mu * 10))
    kernel = make_kernel("rbf", 0.3)
    for trial in range(5):
        m = 3 + 4 * trial
        anchors = torch.rand(m, 2, generator=g, dtype=torch.float64)
        probs = 0.05 + 0.95 * torch.rand(m, generator=g, dtype=torch.float64)
        kors = _filled(kernel, anchors, probs, mu, 0.5)
        # N is (S K_ZZ S + μI)⁻¹
        w = 1.0 / torch.sqrt(probs)
        n_ref = torch.linalg.inv(w[:, None] * kernel_matrix(kernel, anchors, anchors) * w[None]
                                 + mu * torch.eye(m, dtype=torch.float64))
        assert torch.allclose(kors.n_matrix, n_ref, atol=1e-10, rtol=1e-10)
        for pt in torch.rand(6, 2, generator=g, dtype=torch.float64):
            kz = kernel_matrix(kernel, anchors, pt[None])[:, 0]
            closed = kors.leverage(kz, 1.0)
            ref = kors_leverage_eq41(kernel, anchors, probs, pt, mu, 0.5)
            assert abs(float(closed) - float(ref)) < 1e-10
            # the reference score is (1+ε)k/μ − τ̃ (authors' code)
            kref = KORS(mu, 0.5, score="reference")
            kref.load_state_dict(kors.state_dict())
            assert abs(float(kref.leverage(kz, 1.0)) - (1.5 / mu - float(ref))) < 1e-10


def test_limits_and_redundancy_ordering() -> None:
    kernel = make_kernel("rbf", 0.1)
    mu, eps = 2.0, 0.5
    anchor = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    kors = _filled(kernel, anchor, torch.ones(1, dtype=torch.float64), mu, eps)
    # orthogonal point: (1+ε) k / (k + μ)
    far = torch.tensor([5.0, 5.0], dtype=torch.float64)
    kz_far = kernel_matrix(kernel, anchor, far[None])[:, 0]
    assert abs(float(kors.leverage(kz_far, 1.0)) - 1.5 / 3.0) < 1e-12
    # exact duplicate of a p̃ = 1 anchor: (1+ε)/(2+μ)
    kz_dup = kernel_matrix(kernel, anchor, anchor)[:, 0]
    assert abs(float(kors.leverage(kz_dup, 1.0)) - 1.5 / 4.0) < 1e-12
    # decreasing in redundancy: near-duplicate < halfway point < novel point
    near = torch.tensor([0.51, 0.5], dtype=torch.float64)
    mid = torch.tensor([0.6, 0.55], dtype=torch.float64)
    scores = [float(kors.leverage(kernel_matrix(kernel, anchor, p[None])[:, 0], 1.0))
              for p in (near, mid, far)]
    assert scores[0] < scores[1] < scores[2]
    # ... and the authors' score orders them the other way round
    ref = KORS(mu, eps, score="reference")
    ref.load_state_dict(kors.state_dict())
    rscores = [float(ref.leverage(kernel_matrix(kernel, anchor, p[None])[:, 0], 1.0))
               for p in (near, mid, far)]
    assert rscores[0] > rscores[1] > rscores[2]
    # empty dictionary: (1+ε) k/(k+μ), and p̃ = min(γ τ̃, 1)
    empty = KORS(mu, eps, gamma=3.0)
    assert abs(empty.probability(torch.zeros(0, dtype=torch.float64), 1.0) - 1.0) < 1e-12
    empty2 = KORS(mu, eps, gamma=1.0)
    assert abs(empty2.probability(torch.zeros(0, dtype=torch.float64), 1.0) - 0.5) < 1e-12


def test_sherman_morrison_and_border_utilities() -> None:
    """Zenati et al. 2022, Algorithm 5 and App. E.2: the two incremental inverse updates against
    torch.linalg.inv."""
    g = torch.Generator().manual_seed(0)
    b = torch.randn(7, 7, generator=g, dtype=torch.float64)
    a = b @ b.T + 0.5 * torch.eye(7, dtype=torch.float64)
    a_inv = torch.linalg.inv(a[:6, :6])
    bordered = bordered_inverse(a_inv, a[:6, 6], a[6, 6])
    assert torch.allclose(bordered, torch.linalg.inv(a), atol=1e-10)
    v = torch.randn(7, generator=g, dtype=torch.float64)
    ainv = torch.linalg.inv(a)
    gv = ainv @ v
    sm = ainv - torch.outer(gv, gv) / (1.0 + v @ gv)
    assert torch.allclose(sm, torch.linalg.inv(a + torch.outer(v, v)), atol=1e-10)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mu"):
        KORS(0.0)
    with pytest.raises(ValueError, match="gamma"):
        KORS(1.0, gamma=-1.0)
    with pytest.raises(ValueError, match="score"):
        KORS(1.0, score="other")  # type: ignore[arg-type]
    k = KORS(1.0)
    with pytest.raises(ValueError, match="p"):
        k.add(torch.zeros(0, dtype=torch.float64), 1.0, 0.0)
    assert k.m == 0


def test_reference_score_anchors_refused_only_by_the_residual_guard():
    """With the authors' score, redundant points get the *largest* acceptance probability; the
    default ``min_residual`` guard then refuses those already in the span of the dictionary, which
    is what makes the dictionaries smaller than the authors' code's. ``min_residual=0`` with a
    ``1e-8`` nugget lets every KORS acceptance join (the authors' behaviour)."""
    from torchbandits.envs.contextual import ChessboardEnv
    from torchbandits.policies import EKUCB

    sizes = {}
    for name, kw in (("default", {}), ("reference", {"min_residual": 0.0, "jitter": 1e-8})):
        env = ChessboardEnv()
        env.reset(0)
        pol = EKUCB(make_kernel("rbf", 0.1), lam=10.0, beta=0.1, kors_gamma=1.0, kors_score="reference",
                    seed=0, **kw)
        for _ in range(200):
            cand = env.candidates()
            i = pol.select(cand)
            pol.update(cand[i], env.pull(i))
        assert pol.kors.m == pol.model.m  # KORS and the model hold the same anchors
        sizes[name] = (pol.model.m, pol.model.refused)
    assert sizes["default"][1] >= 1 and sizes["reference"][1] == 0

"""EK-UCB (Zenati et al. 2022, §4.3, Algorithms 2 and 4; Prop. 4.1, 4.2)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torchbandits.confidence.ekucb import EKUCBTheoryBeta
from torchbandits.envs import RKHSFunctionEnv
from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.policies import KernelUCB
from torchbandits.policies.ekucb import EKUCB


def _env(ls: float = 0.3) -> RKHSFunctionEnv:
    return RKHSFunctionEnv("rbf", dim=6, lengthscale=ls, n_arms=10, norm=2.0)


def _play(policy, env, rounds: int, seed: int = 0, hook=None):
    env.reset(seed)
    policy.reset(seed=seed)
    actions = []
    for t in range(rounds):
        cand = env.candidates()
        if hook is not None:
            hook(t, policy, cand)
        i = policy.select(cand)
        actions.append(i)
        policy.update(cand[i], env.pull(i))
    return actions


def test_full_dictionary_reproduces_kucb_scores_and_actions() -> None:
    """γ = ∞ (p̃ ≡ 1): every played state is an anchor ⇒ same scores and actions as K-UCB."""
    env = _env()
    kucb = KernelUCB(make_kernel("rbf", 0.3), lam=10.0, beta=0.1)
    ek = EKUCB(make_kernel("rbf", 0.3), lam=10.0, beta=0.1, kors_gamma=1e12)
    diffs = []

    def hook(t, pol, cand):
        if pol is ek and t > 0:
            diffs.append(float((ek(cand) - kucb_scores[t]).abs().max()))

    kucb_scores: dict[int, torch.Tensor] = {}

    def hook_k(t, pol, cand):
        kucb_scores[t] = kucb(cand)

    a1 = _play(kucb, env, 200, hook=hook_k)
    a2 = _play(ek, env, 200, hook=hook)
    assert a1 == a2
    assert ek.model.m == 200 and ek.model.refused == 0
    assert max(diffs) < 1e-6


def test_incremental_state_matches_scratch_in_both_branches() -> None:
    env = _env(0.5)
    lam = 10.0
    ek = EKUCB(make_kernel("rbf", 0.5), lam=lam, beta=0.1, kors_gamma=3.0)
    grew = stayed = 0
    state = {"m": 0}

    def hook(t, pol, cand):
        nonlocal grew, stayed
        model = pol.model
        if t == 0:
            return
        if model.m > state["m"]:
            grew += 1
        else:
            stayed += 1
        state["m"] = model.m
        if t % 10 == 0:
            z, x, y = model.dictionary, model.x, model.target_sums
            kzz = kernel_matrix(model.kernel, z, z)
            ksz = kernel_matrix(model.kernel, x, z)
            lam_ref = torch.linalg.inv(ksz.mT @ ksz + lam * kzz)
            rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
            assert rel(model.Lambda, lam_ref) < 1e-6
            assert rel(model.Gamma, ksz.mT @ y) < 1e-8
            assert rel(model.kzz_inverse, torch.linalg.inv(kzz)) < 1e-6

    _play(ek, env, 150, hook=hook)
    assert grew >= 5 and stayed >= 5  # both branches were exercised


def test_dictionary_invariants_and_kors_martingale() -> None:
    env = _env(0.5)
    ek = EKUCB(make_kernel("rbf", 0.5), lam=1.0, beta=0.1, kors_gamma=1.0)
    history: list[torch.Tensor] = []
    snapshots: list[torch.Tensor] = []

    def hook(t, pol, cand):
        snapshots.append(pol.model.dictionary.clone())
        if t:
            history.append(pol.model.x[-1].clone())

    _play(ek, env, 300, hook=hook)
    snapshots.append(ek.model.dictionary.clone())
    played = ek.model.x
    assert torch.equal(snapshots[1][0], played[0])  # the first anchor is s_0
    for before, after in itertools.pairwise(snapshots[1:]):
        assert after.shape[0] - before.shape[0] in (0, 1)  # at most one anchor per round
        assert torch.equal(after[: before.shape[0]], before)  # Z_t ⊆ Z_{t+1}, never removed
    # every anchor is a played state
    same = (ek.model.dictionary[:, None, :] == played[None, :, :]).all(-1)
    assert bool(same.any(1).all())
    # |m − 1 − Σ p̃| ≤ 4 sqrt(Σ p̃(1−p̃)) + 1  (KORS martingale, Prop. 4.1)
    d = ek.diagnostics()
    assert 5 < d["dict_size"] < 300
    assert abs(d["dict_size"] - 1 - d["kors_prob_sum"]) <= 4 * math.sqrt(d["kors_prob_var_sum"]) + 1


def test_mu_controls_dictionary_size() -> None:
    sizes = []
    for mu in (0.1, 1.0, 10.0):
        ek = EKUCB(make_kernel("rbf", 0.5), lam=1.0, beta=0.1, kors_mu=mu, kors_gamma=2.0)
        _play(ek, _env(0.5), 150)
        sizes.append(ek.model.m)
    assert sizes[0] > sizes[1] > sizes[2]


@pytest.mark.parametrize("lam", [1.0, 10.0, 100.0])
def test_kucb_inverse_after_500_updates(lam: float) -> None:
    """Zenati et al. 2022, Algorithm 3 (bordered inverse) on the foundation model: (K + λI)⁻¹ from
    the incremental factor equals
    the direct inverse for n = 500 joint states of a 1-D environment with σ_k = 0.1."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 2, generator=g, dtype=torch.float64)
    kernel = make_kernel("rbf", 0.1)
    model = ExactKernelRidge(kernel, lam)
    model.extend(x, torch.zeros(500, dtype=torch.float64))
    chol = model.cholesky()
    inv_inc = torch.cholesky_inverse(chol)
    inv_ref = torch.linalg.inv(kernel_matrix(kernel, x, x) + lam * torch.eye(500, dtype=torch.float64))
    assert float((inv_inc - inv_ref).abs().max()) < 1e-8


def test_theory_radius_and_running_logdet() -> None:
    ek = EKUCB(make_kernel("rbf", 0.5), lam=2.0,
               beta=EKUCBTheoryBeta(norm_bound=1.0, mu=2.0, delta=0.01, noise_scale=0.1),
               kors_gamma=1e12)
    env = _env(0.5)
    _play(ek, env, 40)
    # full dictionary: the running sum is the exact log det(I + K/λ) (paper eq. 27)
    exact = ExactKernelRidge(make_kernel("rbf", 0.5), 2.0)
    exact.extend(ek.model.x, ek.model.target_sums)
    assert abs(ek.model.log_det_running - float(exact.log_det())) < 1e-8
    cand = env.candidates()
    ek(cand)
    expected = 2 * math.sqrt(2.0) + 0.1 * math.sqrt(4 * math.log(100) + 2 * float(exact.log_det()))
    assert abs(ek.diagnostics()["beta"] - expected) < 1e-8


def test_state_dict_roundtrip_continues_identically() -> None:
    env = _env(0.5)
    a = EKUCB(make_kernel("rbf", 0.5), lam=1.0, kors_gamma=1.0)
    _play(a, env, 60, seed=3)
    b = EKUCB(make_kernel("rbf", 0.5), lam=1.0, kors_gamma=1.0)
    b.load_state_dict(a.state_dict())
    for _ in range(60):
        cand = env.candidates()
        i, j = a.select(cand), b.select(cand)
        assert i == j
        r = env.pull(i)
        a.update(cand[i], r)
        b.update(cand[i], r)
    assert a.model.m == b.model.m
    assert torch.equal(a.model.dictionary, b.model.dictionary)


def test_bad_input_raises_and_changes_nothing() -> None:
    env = _env(0.5)
    a = EKUCB(make_kernel("rbf", 0.5), lam=1.0)
    _play(a, env, 10)
    before = {k: v.clone() for k, v in a.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="reward"):
        a.update(env.candidates()[0], float("inf"))
    with pytest.raises(ValueError, match="x"):
        a.update(torch.zeros(3, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match="candidates"):
        a.select(torch.zeros(0, 6, dtype=torch.float64))
    for k, v in a.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k])
    assert a.t == 10
    with pytest.raises(ValueError, match="lam"):
        EKUCB(make_kernel("rbf", 0.5), lam=-1.0)
    with pytest.raises(ValueError, match="beta"):
        EKUCB(make_kernel("rbf", 0.5), beta=-0.1)
    with pytest.raises(ValueError, match="score"):
        EKUCB(make_kernel("rbf", 0.5), kors_score="bad")  # type: ignore[arg-type]


def test_dictionary_tracks_effective_dimension_on_bump() -> None:
    """Prop. 4.1 (dictionary size): with γ(1+ε) ≤ 1, m_t / (γ(1+ε) d_eff(μ, t)) stays in [0.25, 8]
    (Bump: nearly orthogonal states, so the guard never interferes)."""
    from torchbandits.envs.contextual import BumpEnv
    from torchbandits.experiments import simulate

    gamma, eps, mu = 0.5, 0.5, 10.0
    pol = EKUCB(make_kernel("rbf", 0.1), lam=mu, beta=0.1, kors_gamma=gamma, kors_eps=eps)
    res = simulate(pol, BumpEnv(), 1000, seed=0, diagnostics_every=500)
    x = pol.model.x
    for t, m_t in zip(res.diagnostic_steps, res.diagnostics["dict_size"]):
        ev = torch.linalg.eigvalsh(kernel_matrix(pol.model.kernel, x[:t], x[:t]))
        d_eff = float((ev / (ev + mu)).sum())
        ratio = m_t / (gamma * (1 + eps) * d_eff)
        assert 0.25 <= ratio <= 8.0, (t, m_t, d_eff)
        assert m_t <= 9 * d_eff * math.log(2 * t / 0.01) ** 2  # Prop. 4.1 (loose)
    assert pol.model.refused == 0

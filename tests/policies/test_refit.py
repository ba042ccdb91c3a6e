"""refit_every on the exact-posterior policies: from-scratch equality, incremental between refits."""

from __future__ import annotations

import pytest
import torch

from torchbandits import RKHSFunctionEnv, make_kernel
from torchbandits.models.exact import exact_posterior_reference
from torchbandits.policies import CMMUCB, GPUCB, IGPUCB, RGPUCB, SWGPUCB, KernelUCB


def play(policy, env, steps: int) -> list[int]:
    actions = []
    for _ in range(steps):
        c = env.candidates()
        i = policy.select(c)
        policy.update(c[i], env.pull(i))
        actions.append(i)
    return actions


def env_2d(seed: int = 0) -> RKHSFunctionEnv:
    env = RKHSFunctionEnv("rbf", dim=2, lengthscale=0.3, n_arms=150, fixed_arms=True, noise_std=0.1)
    env.reset(seed)
    return env


def check_posterior(policy, cand: torch.Tensor) -> None:
    fit = policy.last_fit
    mean, var = policy.model.mean_var(cand)
    y = policy.model.y + policy.refit_offset  # the raw rewards the model holds
    ref_m, ref_v = exact_posterior_reference(fit.kernel, policy.model.x, y - fit.mean, cand,
                                             policy.model.lam)
    assert float((mean - ref_m).abs().max()) < 1e-10
    assert float((var - ref_v).abs().max()) < 1e-10


@pytest.mark.parametrize("make", [
    lambda: GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=7, refit_warmup=8),
    lambda: KernelUCB(make_kernel("matern52", [1.0, 1.0], outputscale=1.0), lam=0.1, beta=0.5,
                      refit_every=7, refit_warmup=8),
    lambda: SWGPUCB(make_kernel("rbf", 1.0), 0.1, window=20, beta=2.0, refit_every=7,
                    refit_warmup=8),
    lambda: RGPUCB(make_kernel("rbf", 1.0), 0.1, period=25, beta=2.0, refit_every=7,
                   refit_warmup=8),
])
def test_after_refit_posterior_equals_from_scratch(make) -> None:
    env = env_2d()
    pol = make()
    play(pol, env, 36)  # refits after updates 8, 15, 22, 29, 36
    assert pol.n_refits + pol.n_refit_skips == 5
    assert pol.n_refits >= 4
    cand = env.candidates()
    check_posterior(pol, cand)
    assert pol.model.lam == pytest.approx(pol.last_fit.noise)  # constant β: λ = fitted σ²
    play(pol, env, 3)  # incremental appends after the refit: still the exact posterior
    check_posterior(pol, cand)
    d = pol.diagnostics()
    assert d["refits"] == pol.n_refits and d["fit_noise"] == pol.last_fit.noise
    assert "fit_lengthscale_0" in d and d["fit_outputscale"] > 0


def test_actions_between_refits_equal_a_fixed_kernel(lockstep) -> None:
    env_a, env_b = env_2d(1), env_2d(1)
    pol = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=10, refit_warmup=10)
    play(pol, env_a, 10)
    play(GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0), env_b, 10)  # same actions so far
    fit = pol.last_fit
    assert pol.n_refits == 1
    # a fixed-kernel GP-UCB with the fitted hyper-parameters, fed the same data from scratch
    fixed = GPUCB(fit.kernel, lam=fit.noise, beta=2.0, n_warmup=0)
    fixed.model.extend(pol.model.x, pol.model.y + pol.refit_offset - fit.mean)
    fixed.t = pol.t
    cand = env_a.candidates()
    assert float((pol(cand) - (fixed(cand) + fit.mean)).abs().max()) < 1e-10

    class Shifted:  # the fixed policy sees rewards minus the fitted mean, as the model does
        def __init__(self, p):
            self.p = p

        def __call__(self, c):
            return self.p(c) + fit.mean

        def select(self, c):
            return self.p.select(c)

        def update(self, x, r):
            self.p.update(x, r - fit.mean)

    worst = lockstep(pol, Shifted(fixed), env_a, env_b, 9)  # rounds 11..19: no refit in between
    assert worst < 1e-9
    assert pol.n_refits == 1
    play(pol, env_a, 1)  # update 20: the second refit
    assert pol.n_refits == 2


def test_refit_every_zero_is_unchanged_and_validation() -> None:
    a, b = GPUCB(make_kernel("rbf", 0.3), lam=0.1, beta=2.0), GPUCB(make_kernel("rbf", 0.3),
                                                                    lam=0.1, beta=2.0, refit_every=0)
    env1, env2 = env_2d(2), env_2d(2)
    assert play(a, env1, 15) == play(b, env2, 15)
    assert "refits" not in b.diagnostics()
    for bad in ({"refit_every": -1}, {"refit_every": 1.5}, {"refit_warmup": 1}):
        with pytest.raises(ValueError, match="refit_"):
            GPUCB(make_kernel("rbf", 0.3), lam=0.1, beta=2.0, **bad)


def test_constant_rewards_skip_and_reset_restores_template() -> None:
    pol = GPUCB(make_kernel("rbf", 0.3), lam=0.1, beta=1.0, refit_every=2, refit_warmup=2)
    cand = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for i in range(4):
        pol.update(cand[i], 0.0)
    assert pol.n_refits == 0 and pol.n_refit_skips == 2
    assert torch.isfinite(pol(cand)).all()
    pol.update(cand[5], 1.0)
    pol.update(cand[6], 0.5)
    assert pol.n_refits == 1
    pol.reset(seed=0)
    assert pol.n_refits == 0 and pol.refit_offset == 0.0 and pol.model.lam == 0.1
    assert float(pol.model.kernel.lengthscale) == pytest.approx(0.3)


def test_state_dict_round_trip_after_refit_and_rule_keeps_its_regulariser() -> None:
    env = env_2d(3)
    pol = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=6)
    play(pol, env, 14)
    clone = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=6)
    clone.load_state_dict(pol.state_dict())
    cand = env.candidates()
    assert float((clone(cand) - pol(cand)).abs().max()) < 1e-12
    # IGP-UCB evaluates the posterior at its own 1 + η: a refit changes the kernel, not λ
    igp = IGPUCB(make_kernel("rbf", 1.0), refit_every=5, refit_warmup=6)
    play(igp, env_2d(4), 12)
    assert igp.n_refits == 2 and igp.model.lam == pytest.approx(1.0 + igp.rule.eta)
    cmm = CMMUCB(make_kernel("rbf", 1.0), refit_every=6, refit_warmup=6)
    env_c = env_2d(5)
    play(cmm, env_c, 12)
    assert cmm.n_refits == 2 and torch.isfinite(cmm(env_c.candidates())).all()


def test_bfgs_curvature_travels_with_the_state_dict() -> None:
    """``optimizer="bfgs"`` warm-starts each refit from the previous inverse Hessian: a policy
    reloaded mid-run keeps it, so its next refits (and choices) equal the original's."""
    opts = {"optimizer": "bfgs"}
    env = env_2d(3)
    pol = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=6,
                refit_options=opts)
    play(pol, env, 14)
    assert pol.last_fit is not None and pol.last_fit.curvature is not None
    clone = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=6,
                  refit_options=opts)
    clone.load_state_dict(pol.state_dict())
    assert torch.equal(clone.last_fit.curvature, pol.last_fit.curvature)
    for _ in range(8):  # two more refits on the same data
        cand = env.candidates()
        i, j = pol.select(cand), clone.select(cand)
        assert i == j
        r = env.pull(i)
        pol.update(cand[i], r)
        clone.update(cand[j], r)
    assert clone.n_refits == pol.n_refits and \
        torch.equal(clone.last_fit.curvature, pol.last_fit.curvature)


def test_refit_rescores_a_fixed_candidate_set_into_its_storage() -> None:
    """With a fixed candidate set a refit rebuilds ``L⁻¹K_SC`` right away, in the stale cache's
    storage; the scores equal the lazy rebuild's and the from-scratch posterior's. Changing
    candidates are not re-scored (no wasted O(n²A) solve)."""
    from torchbandits.models.exact import ExactKernelRidge

    env = env_2d(3)
    cand = env.candidates()
    pol = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=10)
    for _ in range(9):  # up to the update before the first refit: the cache is built
        i = pol.select(cand)
        pol.update(cand[i], env.pull(i))
    assert pol.refit_fixed_candidates
    i = pol.select(cand)  # the select extends the cache to the 9 points (grown lazily)
    store = pol.model._caches[0].v.data_ptr()
    pol.update(cand[i], env.pull(i))  # update 10: refit, re-scored eagerly
    assert pol.n_refits == 1
    cache = pol.model._caches[0]
    assert cache.v.data_ptr() == store and cache.n_at == pol.model.n == 10
    check_posterior(pol, cand)
    lazy = ExactKernelRidge(pol.last_fit.kernel, lam=pol.model.lam)
    lazy.extend(pol.model.x, pol.model.y)
    lazy.set_kernel(pol.last_fit.kernel, (pol.model.lam,))  # rescore=False: rebuilt on query
    m0, v0 = lazy.mean_var(cand)
    m1, v1 = pol.model.mean_var(cand)
    assert float((m0 - m1).abs().max()) < 1e-12 and float((v0 - v1).abs().max()) < 1e-12

    other = GPUCB(make_kernel("rbf", 1.0), lam=0.1, beta=2.0, refit_every=5, refit_warmup=10)
    for t in range(10):  # a new candidate set every round
        c = cand[torch.randperm(cand.shape[0], generator=torch.Generator().manual_seed(t))[:50]]
        i = other.select(c)
        other.update(c[i], env.pull(0))
    assert other.n_refits == 1 and not other.refit_fixed_candidates
    assert not other.model._caches  # dropped by the refit, not re-scored

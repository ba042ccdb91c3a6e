"""Batched K-UCB and GP-UCB: run ``r`` of a batch is the sequential run with seed ``r``.

K-UCB (Zenati et al. 2022, Algorithm 3) with a constant β and with the radius of Lemma 3.1, and
GP-UCB with IGP-UCB's radius (Chowdhury & Gopalan 2017, Thm 2), stepped as one batch on the
RKHS environment of Flynn & Reeb (2024, §7) with fresh and with fixed arm sets and on Bump
(Zenati et al. 2022, §5): the same actions every round and the same UCB values to 1e-9; per-run
β and λ; bad input changes nothing; ``state_dict`` round trip mid-batch.
"""

from __future__ import annotations

import copy

import pytest
import torch

from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import can_batch, why_not_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.policies import GPUCB, KernelUCB

from ..batch_checks import lockstep, play, refuses_bad_input, reloaded, seeded, seeded_runs, started

SEEDS = [0, 1, 2]
ENVS = {"rkhs": ("rkhs", {"dim": 2, "n_arms": 30}),
        "rkhs-fixed": ("rkhs", {"dim": 2, "n_arms": 30, "fixed_arms": True}),
        "bump": ("bump", {})}


def _env(name: str):  # type: ignore[no-untyped-def]
    registry, kwargs = ENVS[name]
    return make_env(registry, **kwargs)


def _lockstep(env, make, seeds, horizon: int, *, batch=None, seqs=None):  # type: ignore[no-untyped-def]
    """Step a batched policy and one sequential policy per seed (``make(None)``, ``make(r)``
    unless given) on the batched env's rounds: the same choice and the same UCB (1e-9) every
    round; return the actions ``[T, R]``."""
    batch = batch if batch is not None else started(make(None), seeds)
    seqs = seqs if seqs is not None else seeded_runs(make, seeds)
    return lockstep(env, seeds, horizon, batch, seqs, atol=1e-9).tolist()


@pytest.mark.parametrize("env_name", list(ENVS))
@pytest.mark.parametrize("policy", ["kucb", "kucb-theory", "gpucb"])
def test_batched_run_equals_sequential_run(policy: str, env_name: str) -> None:
    env = _env(env_name)
    assert can_batch(make_policy(policy, env), env)
    actions = _lockstep(env, lambda r: make_policy(policy, env), SEEDS, 60)
    assert len({tuple(a) for a in actions}) > 5          # the runs do explore


def test_simulate_batch_equals_simulate() -> None:
    env = _env("rkhs")
    runs = simulate_batch(make_policy("gpucb", env), env, 40, [5, 2, 9])
    for run in runs:
        ref = simulate(make_policy("gpucb", env), env, 40, run.seed)
        assert run.actions == ref.actions
        assert run.regret == pytest.approx(ref.regret, abs=1e-12, rel=0)
        assert run.diagnostics["beta"][1:] == pytest.approx(ref.diagnostics["beta"][1:], abs=1e-9)


def test_per_run_beta_equals_sequential_runs() -> None:
    env = _env("rkhs")
    betas = [0.1, 1.0, 10.0]
    policy = make_policy("kucb", env)
    policy.set_per_run(beta=torch.tensor(betas, dtype=torch.float64))
    _lockstep(env, None, SEEDS, 40, batch=started(policy, SEEDS),
              seqs=[seeded(make_policy("kucb", env, beta=b), s) for b, s in zip(betas, SEEDS)])
    runs = simulate_batch(policy, env, 25, SEEDS)                 # the settings persist
    ref = simulate(make_policy("kucb", env, beta=10.0), env, 25, 2)
    assert runs[2].actions == ref.actions


@pytest.mark.parametrize("policy", ["kucb", "kucb-theory"])
def test_per_run_lambda_equals_sequential_runs(policy: str) -> None:
    env = _env("bump")
    lams = [0.1, 1.0, 10.0]
    batch = make_policy(policy, env)
    batch.set_per_run(lam=lams)
    _lockstep(env, None, SEEDS, 40, batch=started(batch, SEEDS),
              seqs=[seeded(make_policy(policy, env, lam=lam), s) for lam, s in zip(lams, SEEDS)])


def test_ties_take_the_first_index() -> None:
    policy = KernelUCB(make_kernel("rbf", 0.3), lam=1.0, beta=1.0, n_warmup=0)
    policy.reset(seed=[0, 1])
    cand = torch.rand(1, 5, 2, dtype=torch.float64).expand(2, 5, 2)
    cand = torch.cat([cand[:, :1].expand(2, 3, 2), cand], dim=1)   # rows 0..3 equal
    assert policy.select(cand).tolist() == [0, 0]
    policy.update(cand[:, 4], torch.tensor([0.5, -0.5]))
    seq = KernelUCB(make_kernel("rbf", 0.3), lam=1.0, beta=1.0, n_warmup=0)
    seq.update(cand[1, 4], -0.5)
    assert int(policy.select(cand)[1]) == seq.select(cand[1])


def test_batched_model_equals_sequential_models() -> None:
    kernel = make_kernel("matern52", 0.4)
    lams = torch.tensor([0.05, 1.0, 3.0])
    model = BatchedExactKernelRidge(kernel, lams, 3)
    seqs = [ExactKernelRidge(kernel, float(lam)) for lam in lams]
    g = torch.Generator().manual_seed(3)
    fixed = torch.rand(3, 20, 2, generator=g, dtype=torch.float64)
    for _ in range(25):
        for cand in (fixed, torch.rand(3, 20, 2, generator=g, dtype=torch.float64)):
            mean, var = model.mean_var(cand)
            _, ridge = model.mean_var(cand, "ridge")
            for r, seq in enumerate(seqs):
                m, v = seq.mean_var(cand[r])
                torch.testing.assert_close(mean[r], m, atol=1e-10, rtol=0)
                torch.testing.assert_close(var[r], v, atol=1e-10, rtol=0)
                torch.testing.assert_close(ridge[r], v / lams[r], atol=1e-9, rtol=0)
        logdet = model.log_det()
        for r, seq in enumerate(seqs):
            assert float(logdet[r]) == pytest.approx(float(seq.log_det()), abs=1e-9)
        x = torch.rand(3, 2, generator=g, dtype=torch.float64)
        y = torch.randn(3, generator=g, dtype=torch.float64)
        model.append(x, y)
        for r, seq in enumerate(seqs):
            seq.append(x[r], y[r])
    for r, seq in enumerate(seqs):   # against a from-scratch factorisation too
        torch.testing.assert_close(model.cholesky()[r], seq.cholesky(), atol=1e-10, rtol=0)
        assert float(model.quad_y()[r]) == pytest.approx(float(seq.quad_y()), abs=1e-9)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="y"):
        model.append(torch.rand(3, 2, dtype=torch.float64), torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="x"):
        model.append(torch.rand(2, 2, dtype=torch.float64), torch.zeros(3))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor))
    with pytest.raises(ValueError, match="lam"):
        BatchedExactKernelRidge(kernel, torch.tensor([1.0, -1.0]), 2)


def test_bad_input_raises_naming_the_argument_and_changes_nothing() -> None:
    env = _env("rkhs")
    policy = make_policy("gpucb", env)
    twin = make_policy("gpucb", env)
    seeds = [0, 1, 2, 3]
    _lockstep(env, None, seeds, 5, batch=started(policy, seeds),
              seqs=[seeded(make_policy("gpucb", env), s) for s in seeds])
    twin.load_state_dict(policy.state_dict())
    cand = torch.rand(4, 30, 2, dtype=torch.float64)
    refuses_bad_input(policy, cand)
    assert policy.t == twin.t
    assert torch.equal(policy(cand), twin(cand))


def test_per_run_settings_and_refusals_are_checked() -> None:
    env = _env("rkhs")
    theory = make_policy("kucb-theory", env)
    with pytest.raises(ValueError, match="beta"):
        theory.set_per_run(beta=[1.0, 2.0])
    with pytest.raises(ValueError, match="lam"):
        make_policy("gpucb", env).set_per_run(lam=[1.0, 2.0])
    kucb = make_policy("kucb", env)
    for bad in ([1.0, -2.0], [1.0, float("nan")], 3.0, [[1.0]]):
        with pytest.raises(ValueError, match="lam"):
            kucb.set_per_run(lam=bad)
    kucb.set_per_run(lam=[1.0, 2.0])
    with pytest.raises(ValueError, match="lam"):
        kucb.reset(seed=[0, 1, 2])                  # R = 3 seeds, two λ
    assert kucb.n_runs is None
    amm = make_policy("cmm-ucb", env, method="socp")   # CMM's SOCP runs sequentially
    assert "socp" in why_not_batch(amm, env)
    with pytest.raises(ValueError, match="seed"):
        amm.reset(seed=[0, 1])
    refit = make_policy("kucb", env, refit_every=5)
    assert "refit" in why_not_batch(refit, env)
    two_regs = GPUCB(make_kernel("rbf", 0.5), lam=2.0)   # IGP at 1 + η ≠ λ
    assert "second regulariser" in two_regs.why_not_batched()
    assert KernelUCB.batchable and GPUCB.batchable


def test_state_dict_round_trip_mid_batch() -> None:
    env = _env("rkhs-fixed")
    seeds = [4, 7, 1]
    policy = started(make_policy("kucb-theory", env), seeds)
    state0 = copy.deepcopy(policy.state_dict())      # before the warm-up draw
    benv = BatchedEnv(env, seeds)
    play(policy, benv, 12)
    fresh = reloaded(policy, make_policy("kucb-theory", env))   # sequential mode until it loads
    assert fresh.n_runs == 3 and fresh.t == 12
    play(policy, benv, 12, twin=fresh, atol=1e-12)
    start = make_policy("kucb-theory", env)
    start.load_state_dict(state0)
    first = BatchedEnv(env, seeds).candidates()
    assert torch.equal(start.select(first), started(make_policy("kucb-theory", env), seeds)
                       .select(first))
    single = make_policy("kucb-theory", env)
    fresh.load_state_dict(single.state_dict())         # back to one run
    assert fresh.n_runs is None and fresh.batch_model is None
    fresh.reset(seed=3)
    assert isinstance(fresh.select(first[0]), int)


def test_to_dtype_mid_batch_moves_the_batched_posterior() -> None:
    env = _env("bump")
    seeds = [0, 1]
    policy = started(make_policy("gpucb", env), seeds)
    _lockstep(env, None, seeds, 6, batch=policy,
              seqs=[seeded(make_policy("gpucb", env), s) for s in seeds])
    cand = BatchedEnv(env, seeds).candidates()
    before = policy(cand)
    policy.to(torch.float32)
    assert policy.batch_model is not None and policy.batch_model.cholesky().dtype == torch.float32
    ucb = policy(cand)
    assert ucb.dtype == torch.float32
    torch.testing.assert_close(ucb.double(), before, atol=1e-5, rtol=0)
    policy.double()
    torch.testing.assert_close(policy(cand), before, atol=1e-5, rtol=0)
    assert policy.select(cand).shape == (2,)

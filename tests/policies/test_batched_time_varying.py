"""Batched R-GP-UCB and SW-GP-UCB (Zhou & Shroff 2021, Algorithms 1 and 2): run ``r`` of a batch
is the sequential run with seed ``r``.

Through ``simulate_batch`` against ``simulate`` on two time-varying environments: the same actions
every round and the same regrets and widths β (1e-10), with window removals (SW-GP-UCB, w = 30 <
T) and several restarts (R-GP-UCB, H = 60 over T = 200); the theory widths with a greedy γ and
with the realised γ, and a constant β; per-run β and λ grids; bad input changes nothing; the
``state_dict`` round trip mid-batch after a window removal; the batched window model against
the sequential one.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import why_not_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_window import BatchedWindowKernelRidge
from torchbandits.models.window import SlidingWindowKernelRidge
from torchbandits.policies import RGPUCB, SWGPUCB

from ..batch_checks import cli_runs_on_off, play, refuses_bad_input, reloaded, started

T = 200
SEEDS = list(range(8))


def _same_runs(batched: list, sequential: list, skip: int = 0) -> None:
    """Same actions, rewards, regrets and diagnostics (from round ``skip + 1``: a sequential
    policy reused across seeds shows its last run's β in its warm-up rounds)."""
    for a, b in zip(batched, sequential, strict=True):
        assert a.seed == b.seed
        assert a.actions == b.actions, a.seed
        torch.testing.assert_close(torch.tensor(a.regret), torch.tensor(b.regret), atol=1e-10, rtol=0)
        torch.testing.assert_close(torch.tensor(a.rewards), torch.tensor(b.rewards), atol=1e-10, rtol=0)
        assert sorted(a.diagnostics) == sorted(b.diagnostics)
        for key in a.diagnostics:
            torch.testing.assert_close(torch.tensor(a.diagnostics[key][skip:]),
                                       torch.tensor(b.diagnostics[key][skip:]), atol=1e-10, rtol=0)


@pytest.mark.parametrize("env_name", ["tv-rotation", "tv-bump"])
@pytest.mark.parametrize("policy, kwargs", [("sw-gpucb", {"window": 30}),
                                            ("r-gpucb", {"period": 60})])
def test_simulate_batch_equals_simulate(env_name: str, policy: str, kwargs: dict) -> None:
    env = make_env(env_name, horizon=T)
    pol = make_policy(policy, env, **kwargs)
    assert why_not_batch(pol, env) is None
    batched = simulate_batch(pol, env, T, SEEDS)
    sequential = [simulate(pol, env, T, s) for s in SEEDS]
    _same_runs(batched, sequential)
    if policy == "r-gpucb":
        assert batched[0].diagnostics["restarts"][-1] == 3.0       # after rounds 60, 120, 180
        assert {sequential[0].actions[t] for t in (0, 60, 120)} != {0}   # random prior ties
    else:
        assert max(batched[0].diagnostics["n"]) == 30.0 and batched[0].diagnostics["n"][-1] == 30


@pytest.mark.parametrize("policy, kwargs", [
    ("sw-gpucb", {"window": 25, "gamma": "realised"}),
    ("r-gpucb", {"period": 40, "gamma": "realised"}),
    ("r-gpucb", {"period": 40, "beta": 1.0, "tie_break": "first"}),
    ("sw-gpucb", {"window": 25, "beta": 0.5, "carry_cache": False, "n_warmup": 3})])
def test_other_widths_and_options(policy: str, kwargs: dict) -> None:
    env = make_env("tv-switch", horizon=120)
    pol = make_policy(policy, env, **kwargs)
    assert why_not_batch(pol, env) is None
    _same_runs(simulate_batch(pol, env, 120, [3, 1, 4]),
               [simulate(pol, env, 120, s) for s in (3, 1, 4)], skip=pol.n_warmup)


@pytest.mark.parametrize("cls, kwargs", [(SWGPUCB, {"window": 20}), (RGPUCB, {"period": 30})])
@pytest.mark.parametrize("setting", ["beta", "lam"])
def test_per_run_grid_equals_sequential_runs(cls, kwargs: dict, setting: str) -> None:
    env = make_env("tv-rotation", horizon=80)
    grid = [0.1, 1.0, 10.0]
    kernel = make_kernel("rbf", 0.1)
    base = {"lam": 1.0, "beta": 1.0, **kwargs}
    policy = cls(kernel, **base)
    policy.set_per_run(**{setting: grid})
    seeds = [5, 6, 7]
    batched = simulate_batch(policy, env, 80, seeds)
    sequential = [simulate(cls(kernel, **{**base, setting: v}), env, 80, s)
                  for v, s in zip(grid, seeds, strict=True)]
    _same_runs(batched, sequential)
    assert len({tuple(r.actions) for r in batched}) == 3


def test_bad_input_raises_naming_the_argument_and_changes_nothing() -> None:
    env = make_env("tv-rotation", horizon=60)
    policy = started(make_policy("sw-gpucb", env, window=10), [0, 1, 2, 3])
    play(policy, BatchedEnv(env, [0, 1, 2, 3]), 15)                  # past a removal
    twin = make_policy("sw-gpucb", env, window=10)
    twin.load_state_dict(policy.state_dict())
    cand = torch.rand(4, 30, 1, dtype=torch.float64)
    refuses_bad_input(policy, cand)
    assert policy.t == twin.t == 15 and policy.batch_model.n == 10
    assert torch.equal(policy(cand), twin(cand))


@pytest.mark.parametrize("policy_name, kwargs", [("sw-gpucb", {"window": 12}),
                                                 ("r-gpucb", {"period": 16})])
def test_state_dict_round_trip_mid_batch(policy_name: str, kwargs: dict) -> None:
    env = make_env("tv-bump", horizon=80)
    seeds = [4, 7, 1]
    benv = BatchedEnv(env, seeds)
    policy = started(make_policy(policy_name, env, **kwargs), seeds)
    first = play(policy, benv, 20)                    # SW: 8 removals; R: one restart
    fresh = reloaded(policy, make_policy(policy_name, env, **kwargs))   # not yet batched
    assert fresh.n_runs == 3 and fresh.t == 20 and fresh.batch_model.n == policy.batch_model.n
    later = play(policy, benv, 40, twin=fresh, atol=1e-10)
    # and both equal the sequential runs
    sequential = [simulate(make_policy(policy_name, env, **kwargs), env, 60, s) for s in seeds]
    for r, res in enumerate(sequential):
        assert res.actions == [a[r] for a in first + later]
    fresh.reset(seed=5)                               # an int leaves the batch
    assert fresh.n_runs is None and fresh.batch_model is None


def test_refusals() -> None:
    env = make_env("tv-rotation", horizon=50)
    refit = make_policy("sw-gpucb", env, window=10, refit_every=5)
    assert "refit" in why_not_batch(refit, env)
    with pytest.raises(ValueError, match="seed"):
        refit.reset(seed=[0, 1])
    custom = SWGPUCB(make_kernel("rbf", 0.1), window=5, beta=1.0,
                     model=ExactKernelRidge(make_kernel("rbf", 0.1), removal="refactorise"))
    assert "refactorise" in custom.why_not_batched()
    theory = make_policy("r-gpucb", env, period=10)
    with pytest.raises(ValueError, match="beta"):
        theory.set_per_run(beta=[1.0, 2.0])
    const = make_policy("r-gpucb", env, period=10, beta=1.0)
    for bad in ([1.0, -2.0], [1.0, float("nan")], 3.0):
        with pytest.raises(ValueError, match="lam"):
            const.set_per_run(lam=bad)
    const.set_per_run(lam=[1.0, 2.0])
    with pytest.raises(ValueError, match="lam"):
        const.reset(seed=[0, 1, 2])
    assert const.n_runs is None


def test_batched_window_model_equals_sequential_models() -> None:
    gen = torch.Generator().manual_seed(0)
    lams = [0.1, 1.0, 10.0]
    kernel = make_kernel("rbf", 0.3)
    batch = BatchedWindowKernelRidge(kernel, torch.tensor(lams, dtype=torch.float64), 3,
                                     refresh_cache_every=7)
    seqs = [SlidingWindowKernelRidge(kernel, lam, refresh_cache_every=7) for lam in lams]
    cand = torch.rand(3, 25, 2, dtype=torch.float64, generator=gen)
    for t in range(40):
        x = torch.rand(3, 2, dtype=torch.float64, generator=gen)
        y = torch.randn(3, dtype=torch.float64, generator=gen)
        batch.append(x, y)
        for r, m in enumerate(seqs):
            m.append(x[r], y[r])
        if t in (20, 30):
            batch.remove_oldest(3)
            for m in seqs:
                m.remove_oldest(3)
        elif batch.n > 8:
            batch.remove_oldest()
            for m in seqs:
                m.remove_oldest()
        mean, var = batch.mean_var(cand if t % 5 else cand + 0.01)
        for r, m in enumerate(seqs):
            ref = ExactKernelRidge(kernel, lams[r])
            ref.extend(m.x, m.y)                          # from scratch
            c = cand[r] if t % 5 else cand[r] + 0.01
            for got, want in zip((mean[r], var[r]), ref.mean_var(c), strict=True):
                torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
            torch.testing.assert_close(batch.cholesky()[r], ref.cholesky(), atol=1e-10, rtol=0)
            torch.testing.assert_close(batch.log_det()[r], ref.log_det(), atol=1e-10, rtol=0)
            torch.testing.assert_close(batch.x[r], m.x, atol=0, rtol=0)
    for bad in (-1, 99, 1.5):
        with pytest.raises(ValueError, match="count"):
            batch.remove_oldest(bad)
    batch.remove_oldest(batch.n)
    assert batch.n == 0
    torch.testing.assert_close(batch.mean_var(cand)[1], torch.ones(3, 25, dtype=torch.float64))


def test_cli_batch_on_equals_batch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--env", "tv-rotation,tv-bump", "--policy", "sw-gpucb,r-gpucb", "--seeds",
            "0", "1", "2", "--horizon", "40", "--no-progress", "--set", "sw-gpucb.window=8",
            "--set", "r-gpucb.period=12", "--set", "env.horizon=40"]
    on, off = cli_runs_on_off(args, tmp_path)
    assert len(on) == 12
    for name in on:
        assert on[name]["regret"] == pytest.approx(off[name]["regret"], abs=1e-10, rel=0)
    capsys.readouterr()


def test_bench_batch_entries(tmp_path: Path) -> None:
    """``benchmarks/bench_batch.py --policies sw-gpucb,r-gpucb`` runs and its batched runs equal
    the sequential ones (no timing asserted)."""
    spec = importlib.util.spec_from_file_location(
        "bench_batch", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_batch.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--policies", "sw-gpucb,r-gpucb", "--runs", "1", "3", "--repeats", "1",
                       "--learning-horizon", "15", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {(r["policy"], r["env"], r["R"]) for r in rows} == {
        (p, e, n) for p in ("sw-gpucb", "r-gpucb") for e in ("tv-rotation", "tv-bump")
        for n in (1, 3)}
    assert all(r["same_actions"] for r in rows)


@pytest.mark.parametrize("env_name", ["tv-rotation", "tv-bump"])
def test_window_beyond_the_factor_head_block(env_name: str) -> None:
    """w = 66 > 64 points: appends after a removal solve with the copied leading 64×64 block of
    the factor, which every removal changes (a stale copy made the pivots non-positive)."""
    env = make_env(env_name, horizon=140)
    pol = make_policy("sw-gpucb", env, window=66)
    _same_runs(simulate_batch(pol, env, 140, [0, 5]), [simulate(pol, env, 140, s) for s in (0, 5)])

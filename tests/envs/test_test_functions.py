"""BoTorch test functions as bandits: values, regrets, seeded streams, GP-UCB vs Random."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("botorch")

from torchbandits.envs.test_functions import FUNCTIONS, TestFunctionEnv
from torchbandits.experiments import simulate
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.policies import RandomPolicy


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_values_equal_botorch(name: str) -> None:
    env = TestFunctionEnv(name, n_arms=64)
    fn = env.function
    lb, ub = fn.bounds[0], fn.bounds[1]
    g = torch.Generator().manual_seed(0)
    u = torch.rand(32, env.dim, generator=g, dtype=torch.float64)
    ref = fn.evaluate_true(lb + u * (ub - lb))
    assert torch.allclose(env.value(u), ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(env.f(u), -ref, rtol=1e-12, atol=1e-12)
    arms = env.candidates()
    assert arms.shape == (64, env.dim) and float(arms.min()) >= 0 and float(arms.max()) <= 1
    assert torch.allclose(env.mean_rewards(), -fn.evaluate_true(lb + arms * (ub - lb)))
    if fn._optimizers is not None:  # the known optimum, mapped to the unit cube
        for x_star in fn.optimizers:
            u_star = ((x_star - lb) / (ub - lb))[None]
            assert float(env.value(u_star)) == pytest.approx(float(fn.evaluate_true(x_star[None])),
                                                             abs=1e-12)
            assert float(env.value(u_star)) == pytest.approx(env.optimal_value, abs=1e-4)
    assert env.noise_std == pytest.approx(0.05 * env.range)


def test_regrets_recorded_and_seeded_streams_repeat() -> None:
    a, b = TestFunctionEnv("hartmann6", n_arms=100), TestFunctionEnv("hartmann6", n_arms=100)
    a.reset(3)
    b.reset(3)
    assert torch.equal(a.candidates(), b.candidates())
    ra = [a.pull(i) for i in range(5)]
    rb = [b.pull(i) for i in range(5)]
    assert ra == rb and a.optimum_regret == b.optimum_regret
    g = a.value(a.candidates()[:5])
    assert a.optimum_regret == pytest.approx((g - a.optimal_value).tolist(), abs=1e-12)
    assert all(r >= a.candidate_gap() - 1e-12 for r in a.optimum_regret)
    a.reset(4)
    assert not torch.equal(a.candidates(), b.candidates())
    fresh = TestFunctionEnv("branin", n_arms=50, fixed_arms=False)
    first = fresh.candidates().clone()
    fresh.pull(0)
    assert not torch.equal(first, fresh.candidates())
    fresh.reset(0)
    assert torch.equal(first, fresh.candidates())


def test_registry_dimensions_and_runner_metrics() -> None:
    env = make_env("ackley", dim=3, n_arms=50)
    assert env.dim == 3 and env.candidates().shape == (50, 3)
    with pytest.raises(ValueError, match="fixed at 2"):
        make_env("branin", dim=3)
    with pytest.raises(ValueError, match="n_arms"):
        TestFunctionEnv("levy", n_arms=0)
    assert math.isnan(TestFunctionEnv("michalewicz", dim=3, n_arms=8).optimal_value)
    res = simulate(RandomPolicy(), env, 6, seed=1)
    assert res.config["env_metrics"]["optimum_regret"] == pytest.approx(env.optimum_regret)


def test_fitted_gpucb_beats_random_on_hartmann6() -> None:
    env = make_env("hartmann6", n_arms=300)
    fit = simulate(make_policy("gpucb-fit", env, refit_every=5), env, 60, seed=0)
    rnd = simulate(RandomPolicy(), env, 60, seed=0)
    assert fit.final_regret < 0.8 * rnd.final_regret
    assert fit.diagnostics["refits"][-1] >= 9  # refits after rounds 13, 18, …, 58


def test_bench_bo_quick(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_bo.py"
    spec = importlib.util.spec_from_file_location("bench_bo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "bench.json").read_text())
    assert set(summary["branin"]) == {"botorch", "tb-refit1", "tb-refit20"}
    assert (tmp_path / "regret_simple.png").exists() and (tmp_path / "regret_cumulative.png").exists()

"""benchmarks/bench_pruning.py --quick runs (its whole runs timed, pruned and full make the same
choices), and its run of alternated pruned and full selects is the run of ``simulate`` with the
same seed (no timing asserted)."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark
from torchbandits.experiments import simulate
from torchbandits.experiments.registry import make_env, make_policy


def test_bench_pruning_quick() -> None:
    rows = load_benchmark("bench_pruning").main(["--quick"])
    if not rows:
        pytest.skip("no compiled library (no C compiler)")
    steps, runs = rows[:2], rows[2:]
    assert [(r["policy"], r["A"], r["n"]) for r in steps] == [("kucb", 40, 20), ("kucb", 40, 100)]
    assert all(r["pruned_s"] > 0 and r["full_s"] > 0 for r in steps)
    assert [(r["policy"], r["T"]) for r in runs] == [("kucb", 110)]     # (same choices: asserted)
    assert all(runs[0][f"{mode}_run_s"] > 0 for mode in ("default", "pruned", "full"))


def test_the_alternated_run_is_the_simulated_run() -> None:
    bench = load_benchmark("bench_pruning")
    _, actions = bench.measure("amm-ucb", 2, 40, [100, 150], 6)
    env = make_env("rkhs", dim=2, n_arms=40)
    assert actions == simulate(make_policy("amm-ucb", env), env, 156, 0).actions


def test_bad_settings_are_named() -> None:
    bench = load_benchmark("bench_pruning")
    with pytest.raises(ValueError, match="--settings"):
        bench.main(["--settings", "kucb:3"])
    with pytest.raises(ValueError, match="--steps"):
        bench.main(["--steps", "1"])
    with pytest.raises(ValueError, match="--horizon"):
        bench.main(["--repeats", "0"])

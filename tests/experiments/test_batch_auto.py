"""``batch="auto"`` batches from the policy family's measured crossover (``batch_pays_from`` on
the batched policy class) on the CPU and from two seeds on a CUDA device; the runs are the same
whichever path ran, a family without a declaration falls back to ``DEFAULT_PAYS_FROM`` and bad
values raise a ``ValueError`` naming the argument."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torchbandits.experiments.batch as batch_mod
from tests.benchmarks import load_benchmark
from torchbandits.experiments.batch import (
    CUDA_PAYS_FROM,
    DEFAULT_PAYS_FROM,
    auto_batches,
    batch_pays_from,
    run_grid_batched,
)
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.policies.random import RandomPolicy

HORIZON = 12


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of seeds of every :func:`simulate_batch` call ``run_jobs_batched`` makes."""
    calls: list[int] = []
    real = batch_mod.simulate_batch

    def counting(policy: Any, env: Any, horizon: int, seeds: Any, **kw: Any) -> Any:
        calls.append(len(seeds))
        return real(policy, env, horizon, seeds, **kw)

    monkeypatch.setattr(batch_mod, "simulate_batch", counting)
    return calls


def _grid(policy: str, env: str, seeds: list[int], batch: str = "auto") -> list[Any]:
    return run_grid_batched({policy: lambda e: make_policy(policy, e)}, {env: lambda: make_env(env)},
                            seeds, HORIZON, batch=batch, progress=False)


@pytest.mark.parametrize(("policy", "env", "pays_from"),
                         [("kucb", "rkhs", 4), ("amm-ucb", "rkhs", 4), ("random", "rkhs", 3),
                          ("ekucb", "chessboard", 4)])
def test_auto_runs_below_the_crossover_sequentially(spy: list[int], policy: str, env: str,
                                                    pays_from: int) -> None:
    assert batch_pays_from(make_policy(policy, make_env(env))) == pays_from
    below = _grid(policy, env, list(range(pays_from - 1)))
    assert spy == []                                    # R = pays_from − 1: the sequential path
    at = _grid(policy, env, list(range(pays_from)))
    assert spy == [pays_from]                           # R = pays_from: one batch
    off = _grid(policy, env, list(range(pays_from)), batch="off")
    assert spy == [pays_from]
    for a, b in zip(at, off, strict=True):              # the choice changes only the speed
        assert a.actions == b.actions
        assert a.regret == pytest.approx(b.regret, abs=1e-10, rel=0)
    assert [r.actions for r in below] == [r.actions for r in off[: pays_from - 1]]


def test_auto_batches_two_seeds_where_that_pays(spy: list[int]) -> None:
    _grid("sw-gpucb", "tv-rotation", [0, 1])
    assert spy == [2]
    _grid("kucb", "rkhs", [0, 1], batch="on")           # "on" whatever the crossover
    assert spy == [2, 2]


def test_cuda_batches_from_two_seeds_whatever_the_family() -> None:
    env = make_env("rkhs")
    for name in ("kucb", "bkb", "random"):
        policy = make_policy(name, env)
        assert batch_pays_from(policy, "cpu") == type(policy).batch_pays_from > 2
        assert batch_pays_from(policy, "cuda") == CUDA_PAYS_FROM == 2
        assert batch_pays_from(policy, "cuda:0") == 2
        assert auto_batches(policy, 2, "cuda") and not auto_batches(policy, 2, "cpu")
        assert not auto_batches(policy, 1, "cuda")
        assert batch_pays_from(policy) == batch_pays_from(policy, "cpu")   # the policy's device


def test_the_threshold_is_the_class_declaration() -> None:
    class Declared(RandomPolicy):
        batch_pays_from = 7

    class Undeclared:
        device = "cpu"

    assert batch_pays_from(Declared()) == 7
    assert not auto_batches(Declared(), 6) and auto_batches(Declared(), 7)
    assert batch_pays_from(Undeclared()) == DEFAULT_PAYS_FROM == 2
    assert auto_batches(Undeclared(), 2) and not auto_batches(Undeclared(), 1)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "3", True])
def test_a_bad_declaration_is_a_value_error(bad: Any) -> None:
    class Bad(RandomPolicy):
        batch_pays_from = bad

    with pytest.raises(ValueError, match="batch_pays_from"):
        batch_pays_from(Bad())
    assert batch_pays_from(Bad(), "cuda") == 2            # not consulted on a CUDA device


def test_bad_arguments_name_themselves(tmp_path: Path) -> None:
    policy = RandomPolicy()
    with pytest.raises(ValueError, match="n_seeds"):
        auto_batches(policy, -1)
    with pytest.raises(ValueError, match="n_seeds"):
        auto_batches(policy, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        batch_pays_from(policy, "not-a-device")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="batch"):
        run_grid_batched({"random": lambda e: make_policy("random", e)},
                         {"rkhs": lambda: make_env("rkhs")}, [0, 1], HORIZON,
                         batch="sometimes", out=out, progress=False)  # type: ignore[arg-type]
    assert not out.exists()                              # rejected before anything was written


def test_crossover_benchmark_quick(capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_benchmark("bench_batch_crossover")
    crossover = mod.main(["--quick"])
    assert set(crossover) == {"random", "kucb"}
    assert all(v is None or v == 2 for v in crossover.values())
    out = capsys.readouterr().out
    assert "| random | 2 |" in out and "| kucb | 2 |" in out and "pays from (R):" in out
    assert mod.pays_from([(2, 0.8), (3, 1.1), (4, 0.95), (6, 1.2), (8, 1.4)]) == 6
    assert mod.pays_from([(2, 1.2), (3, 1.4)]) == 2
    assert mod.pays_from([(2, 0.8), (3, 0.9)]) is None


@pytest.mark.parametrize(("policy", "env", "pays_from"),
                         [("random", "rkhs", 3), ("kucb", "rkhs", 4), ("gpucb", "rkhs", 4),
                          ("igp-ucb", "rkhs", 4), ("amm-ucb", "rkhs", 4), ("dmm-ucb", "rkhs", 4),
                          ("r-gpucb", "tv-rotation", 2), ("sw-gpucb", "tv-rotation", 2),
                          ("ekucb", "chessboard", 4), ("bkb", "rkhs", 3)])
def test_every_measured_family_still_batches(policy: str, env: str, pays_from: int) -> None:
    """The declaration is batch-neutral: a class that declares ``batch_pays_from`` (DMM-UCB its
    own, R-GP-UCB over K-UCB's 4) still batches, and declares the crossover of docs/batch.md."""
    e = make_env(env)
    p = make_policy(policy, e)
    assert batch_mod.why_not_batch(p, e) is None
    assert batch_pays_from(p) == pays_from
    assert auto_batches(p, pays_from) and not auto_batches(p, pays_from - 1)

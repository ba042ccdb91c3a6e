"""The reproductions run their batchable settings (a policy × environment over several seeds) as
one batch, and write the same runs as one seed at a time: for each quick mode, every saved run's
actions are equal (rewards and regrets to 1e-9), and at least one setting did batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchbandits.experiments import batch as batch_module


def _runs(out: Path) -> dict[str, dict]:
    return {str(p.relative_to(out)): json.loads(p.read_text())
            for p in sorted(out.rglob("runs/*.json"))}


def _batched_and_not(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, main, argv: list[str]
                     ) -> tuple[dict[str, dict], dict[str, dict], int]:
    calls = []
    real = batch_module.simulate_batch

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[3]))
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(batch_module, "simulate_batch", spy)
        m.setattr(batch_module, "batch_pays_from", lambda policy, device=None: 2)  # batch from 2
        assert main([*argv, "--out", str(tmp_path / "batched"), "--no-progress"]) == 0
    with monkeypatch.context() as m:   # the reference: every setting one seed at a time
        m.setattr(batch_module, "can_batch", lambda policy, env: False)
        assert main([*argv, "--out", str(tmp_path / "plain"), "--no-progress"]) == 0
    return _runs(tmp_path / "batched"), _runs(tmp_path / "plain"), len(calls)


def _assert_same(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert a[name]["actions"] == b[name]["actions"], name
        assert a[name]["rewards"] == pytest.approx(b[name]["rewards"], abs=1e-9, rel=0), name
        assert a[name]["regret"] == pytest.approx(b[name]["regret"], abs=1e-9, rel=0), name
        assert a[name]["seed"] == b[name]["seed"] and a[name]["policy"] == b[name]["policy"]


def test_bkb_quick_batched_equals_sequential(monkeypatch, tmp_path) -> None:
    from torchbandits.reproduce.bkb import main

    a, b, batches = _batched_and_not(monkeypatch, tmp_path, main,
                                     ["--quick", "--horizon", "25", "--skip-figure"])
    assert batches >= 2   # exact GP-UCB and Random, per setting
    _assert_same(a, b)


def test_cmm_quick_batched_equals_sequential(monkeypatch, tmp_path) -> None:
    from torchbandits.reproduce.cmm import main

    a, b, batches = _batched_and_not(monkeypatch, tmp_path, main,
                                     ["--quick", "--parts", "table1"])
    assert batches >= 1   # Random
    _assert_same(a, b)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_cmm_passes_its_batch_mode_to_the_runner(monkeypatch, tmp_path, mode: str) -> None:
    """``--batch off`` never batches (``on`` batches at any seed count): the mode reaches the
    runner instead of the default ``auto``."""
    from torchbandits.reproduce.cmm import main

    calls = []
    real = batch_module.simulate_batch

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[3]))
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "simulate_batch", spy)
    monkeypatch.setattr(batch_module, "batch_pays_from", lambda policy, device=None: 2)
    assert main(["--quick", "--parts", "table1", "--batch", mode, "--out", str(tmp_path),
                 "--no-progress"]) == 0
    assert (len(calls) >= 1) == (mode == "on")


def test_ekucb_small_batched_equals_sequential(monkeypatch, tmp_path) -> None:
    from torchbandits.reproduce.ekucb import main

    small = ["--figures", "1", "--seeds", "0", "1", "--horizon", "40", "--cbkb-horizon", "10",
             "--lams", "10", "--mus", "10"]   # --quick keeps one seed: nothing to batch
    a, b, batches = _batched_and_not(monkeypatch, tmp_path, main, small)
    assert batches >= 1   # K-UCB
    _assert_same(a, b)


def test_tvbo_quick_batched_equals_sequential(monkeypatch, tmp_path) -> None:
    from torchbandits.reproduce.tvbo import main

    argv = ["--quick", "--horizon", "30", "--budgets", "8", "--seeds", "0", "1"]
    a, b, batches = _batched_and_not(monkeypatch, tmp_path, main, argv)
    assert batches >= 2   # GP-UCB and Random, per environment
    _assert_same(a, b)

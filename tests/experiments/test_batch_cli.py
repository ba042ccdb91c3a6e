"""``torchbandits run --batch on`` writes the runs that ``--batch off`` writes (same actions,
same JSON shape), mixed with policies that run sequentially; resume reads batched runs back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchbandits.cli import main

ARGS = ["run", "--env", "rkhs,chessboard", "--policy", "random,kucb", "--seeds", "0", "1", "2",
        "--horizon", "12", "--no-progress"]


def _runs(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((folder / "runs").glob("*.json"))}


def test_batch_on_equals_batch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ARGS
    for mode in ("on", "off", "auto"):
        assert main([*args, "--batch", mode, "--out", str(tmp_path / mode)]) == 0
    on, off, auto = (_runs(tmp_path / m) for m in ("on", "off", "auto"))
    assert sorted(on) == sorted(off) == sorted(auto) and len(on) == 12
    for name in on:
        assert on[name]["actions"] == off[name]["actions"] == auto[name]["actions"], name
        assert on[name]["rewards"] == pytest.approx(off[name]["rewards"], abs=1e-12, rel=0)
        assert sorted(on[name]) == sorted(off[name])
        assert sorted(on[name]["config"]) == sorted(off[name]["config"])
    capsys.readouterr()


def test_resume_reads_batched_runs_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--env", "bump", "--policy", "random", "--seeds", "4", "5", "--horizon", "10",
            "--no-progress", "--out", str(tmp_path)]
    assert main([*args, "--batch", "on"]) == 0
    first = _runs(tmp_path)
    (tmp_path / "runs" / "bump__random__seed5.json").unlink()
    assert main([*args, "--batch", "on"]) == 0          # seed 4 read back, seed 5 run alone
    again = _runs(tmp_path)
    assert again["bump__random__seed4.json"] == first["bump__random__seed4.json"]
    assert again["bump__random__seed5.json"]["actions"] == first["bump__random__seed5.json"]["actions"]
    capsys.readouterr()


def test_bad_batch_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["run", "--batch", "sometimes"])
    assert err.value.code == 2
    assert "--batch" in capsys.readouterr().err

"""The torchbandits command: list, run (JSON + PNG + table), plot."""

from __future__ import annotations

import json

import pytest

from torchbandits.cli import main
from torchbandits.experiments import RunResult, load_results


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "rkhs" in out and "kucb" in out and "random" in out


def test_run_writes_json_png_table_and_plot_redraws(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--env", "rkhs", "--policy", "kucb,random", "--horizon", "40",
                 "--seeds", "0", "1", "--set", "env.dim=2", "--set", "kucb.lam=0.5",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| rkhs | kucb | 2 | 40 |" in printed
    runs = sorted((out / "runs").glob("*.json"))
    assert len(runs) == 4
    res = RunResult.load(runs[0])
    assert res.horizon == 40 and len(res.agent_seconds) == 40
    assert abs(res.cumulative_regret[-1] - sum(res.regret)) < 1e-9
    assert (out / "regret.png").stat().st_size > 5000 and (out / "time.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert {row["policy"] for row in summary} == {"kucb", "random"}
    assert "policy_repr" in res.config and "lam=0.5" in res.config["policy_repr"]
    (out / "regret.png").unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "regret.png").exists()
    assert len(load_results(out)) == 4


def test_run_rejects_unknown_names(tmp_path):
    with pytest.raises(SystemExit, match="unknown policy"):
        main(["run", "--policy", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"SCOPE\.NAME"):
        main(["run", "--set", "lam=1", "--out", str(tmp_path)])


def test_reproduce_resolves_names_from_the_reproductions_table(capsys):
    with pytest.raises(SystemExit, match="unknown reproduction 'nope'"):
        main(["reproduce", "nope"])
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "bkb", "--help"])  # the reproduction's own parser answers
    assert exit_.value.code == 0
    assert "--quick" in capsys.readouterr().out
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "reproductions:" in listed and "Calandriello et al. 2019" in listed

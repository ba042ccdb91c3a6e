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
    assert {"--quick", "--threads", "--run-threads"} <= set(capsys.readouterr().out.split())
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "reproductions:" in listed and "Calandriello et al. 2019" in listed


def test_run_threads_split_a_batch_and_keep_its_runs(tmp_path, capsys, monkeypatch):
    """``--run-threads 2`` splits a batch of 16 AMM-UCB runs over two threads in the compiled
    calls (torch on one) and writes the same actions as one thread; a negative count (0 for a
    sweep's ``--run-threads-per-trial``) is an argparse error naming the option."""
    import torch

    from torchbandits import native

    monkeypatch.delenv("TORCHBANDITS_THREADS", raising=False)
    before = torch.get_num_threads()
    seeds = [str(s) for s in range(16)]
    actions = {}
    try:
        for count in ("1", "2"):
            out = tmp_path / f"threads{count}"
            assert main(["run", "--env", "rkhs", "--policy", "amm-ucb", "--horizon", "25",
                         "--seeds", *seeds, "--batch", "on", "--run-threads", count,
                         "--out", str(out), "--no-progress"]) == 0
            assert native.threads() == int(count) and torch.get_num_threads() == (
                before if count == "1" else 1)
            actions[count] = {p.name: json.loads(p.read_text())["actions"]
                              for p in (out / "runs").glob("*.json")}
        assert len(actions["1"]) == 16 and actions["1"] == actions["2"]
        with pytest.raises(SystemExit) as exit_:
            main(["run", "--run-threads", "-1", "--out", str(tmp_path)])
        assert exit_.value.code == 2 and "--run-threads" in capsys.readouterr().err
        with pytest.raises(SystemExit) as exit_:   # a sweep's needs at least one
            main(["sweep", "spec.yaml", "--run-threads-per-trial", "0"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "--run-threads-per-trial" in err and ">= 1" in err
    finally:
        native.set_threads(None)
        torch.set_num_threads(before)


def test_a_reproduction_applies_run_threads(monkeypatch):
    """A reproduction's ``--run-threads 2`` sets the compiled calls' threads and torch's to one
    (its default ``--threads 1``), at ``start``, not at import."""
    import torch

    from torchbandits import native
    from torchbandits.reproduce.common import reproduction_parser, start

    monkeypatch.delenv("TORCHBANDITS_THREADS", raising=False)
    before = torch.get_num_threads()
    args = reproduction_parser("x", "doc", quick="q").parse_args(["--run-threads", "2"])
    assert native.threads() == 1
    try:
        start(args)
        assert (native.threads(), torch.get_num_threads()) == (2, 1)
    finally:
        native.set_threads(None)
        torch.set_num_threads(before)

"""``reproduce tvbo --quick`` runs end to end and writes its tables and readable plots (the
time-varying benchmark for Zhou & Shroff 2021)."""

from __future__ import annotations

import json

from torchbandits.reproduce.tvbo import main

from ..figure_checks import assert_readable_figures


def test_reproduce_tvbo_quick(tmp_path, capsys):
    out = tmp_path / "tvbo"
    assert main(["--quick", "--out", str(out), "--horizon", "60", "--budgets", "8", "--no-progress"]) == 0
    for name in ("table.md", "tvbo_table.md", "regret.png", "time.png", "regret_vs_budget.png",
                 "sweep.png", "rate.png", "tvbo_summary.json"):
        assert (out / name).exists(), name
    summary = json.loads((out / "tvbo_summary.json").read_text())
    for env, info in summary["env_info"].items():
        assert info["P_T_max_abs_diff"] < 1e-8 * max(1.0, info["P_T_declared"]), env
    text = (out / "tvbo_table.md").read_text()
    for policy in ("R-GP-UCB", "R-GP-UCB (P_T unknown)", "SW-GP-UCB", "TV-GP-UCB", "W-GP-UCB",
                   "GP-UCB", "Random"):
        assert policy in text
    assert len(list((out / "runs").glob("*.json"))) == 4 * 7  # rotation, bump, switch, stationary
    assert set(summary["rate"]["slopes"]) == {"R-GP-UCB", "SW-GP-UCB"}
    text = capsys.readouterr().out
    assert "tvbo_table.md" in text and text.startswith("QUICK RUN (T = 60")
    assert_readable_figures(out, quick=True, at_least=5)

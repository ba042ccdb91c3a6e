"""The time-varying notebook (Zhou & Shroff 2021) executes end to end (small horizon)."""

from __future__ import annotations


def test_time_varying_notebook_runs(run_notebook):
    text = run_notebook("time_varying.ipynb", timeout=120)
    assert "declared P_T = 3.6" in text
    assert "R-GP-UCB: dynamic regret after 80 rounds" in text
    assert "Random: dynamic regret after 80 rounds" in text

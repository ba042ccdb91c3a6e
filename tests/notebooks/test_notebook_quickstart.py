"""The quickstart notebook executes end to end (small horizon)."""

from __future__ import annotations


def test_quickstart_notebook_runs(run_notebook):
    text = run_notebook("quickstart.ipynb")
    assert "cumulative regret after 60 rounds" in text
    assert "| rkhs d=2 | K-UCB |" in text

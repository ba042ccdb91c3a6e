"""The "your own problem" notebook executes end to end (small size)."""

from __future__ import annotations


def test_your_own_problem_notebook_runs(run_notebook) -> None:
    text = run_notebook("your_own_problem.ipynb")
    assert "lengthscales:" in text
    assert "| GP-UCB (refit every 5) | cumulative regret after 60 rounds" in text
    assert "| EK-UCB (fitted kernel) |" in text and "| Random |" in text

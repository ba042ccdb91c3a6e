"""The time-varying notebook (seed 004) executes end to end (small horizon)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def test_time_varying_notebook_runs(monkeypatch):
    monkeypatch.setenv("TORCHBANDITS_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / "notebooks" / "time_varying.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "declared P_T = 3.6" in text
    assert "R-GP-UCB: dynamic regret after 80 rounds" in text
    assert "Random: dynamic regret after 80 rounds" in text

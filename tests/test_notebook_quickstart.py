"""The quickstart notebook executes end to end (small horizon)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_notebook_runs(monkeypatch):
    monkeypatch.setenv("TORCHBANDITS_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "cumulative regret after 60 rounds" in text
    assert "| rkhs d=2 | K-UCB |" in text
    assert os.environ["TORCHBANDITS_QUICK"] == "1"

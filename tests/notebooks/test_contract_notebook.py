"""In a notebook, importing the library keeps the inline backend (figures are shown) and the
progress bars print no ``TqdmWarning`` (issue 11, defects 5 and 10)."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELLS = [
    "import matplotlib.pyplot as plt\n"
    "import torchbandits, torchbandits.experiments\n"
    "import torchbandits.reproduce.ekucb, torchbandits.reproduce.tvbo, torchbandits.reproduce.cmm\n"
    "fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, 1], [1, 0]); plt.show()",
    "from torchbandits.envs import RKHSFunctionEnv\n"
    "from torchbandits.experiments import run_grid\n"
    "from torchbandits.policies import RandomPolicy\n"
    "res = run_grid({'random': lambda env: RandomPolicy()},\n"
    "               {'rkhs': lambda: RKHSFunctionEnv(dim=2, n_arms=10)}, [0], 5, progress=True)",
]


def test_notebook_shows_figures_and_no_tqdm_warning(monkeypatch, tmp_path):
    monkeypatch.delenv("MPLBACKEND", raising=False)   # the notebook's own (inline) backend
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was shown"
    text = "".join(o.get("text", "") for o in outputs)
    assert "TqdmWarning" not in text and "IProgress not found" not in text

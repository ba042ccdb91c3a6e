"""The EK-UCB reproduction (Zenati et al. 2022), benchmark and notebook run end to end at small
size."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from torchbandits.experiments.registry import resolve
from torchbandits.reproduce import REPRODUCTIONS

from ..figure_checks import assert_readable_figures

ROOT = Path(__file__).resolve().parents[2]


def test_reproduce_quick(tmp_path, capsys) -> None:
    main = resolve(REPRODUCTIONS["ekucb"])
    assert main(["--quick", "--out", str(tmp_path), "--no-progress", "--regret-mode", "reference"]) == 0
    table = (tmp_path / "table.md").read_text()
    for label in ("K-UCB lam=10", "EK-UCB lam=10", "EK-UCB(mu=1) lam=10", "CBBKB(Cb=3) lam=10",
                  "CBKB lam=10", "SupK-UCB lam=10", "reference regret"):
        assert label in table, label
    for fig in range(1, 13):
        assert (tmp_path / f"fig{fig:02d}.png").stat().st_size > 5000
    assert (tmp_path / "dict_size_bump.png").exists()
    runs = sorted((tmp_path / "runs").glob("*.json"))
    # Bump: K, EK (μ = 1, 10, 100), CBBKB × 3 C_b, CBKB, SupK; 1-D envs: the same without the μ sweep
    assert len(runs) == 9 + 2 * 7
    d = json.loads(runs[0].read_text())
    assert len(d["regret"]) in (30, 60) and "reference_regret" in d["config"]
    text = capsys.readouterr().out
    assert "runs in" in text and text.startswith("QUICK RUN (T = 60")
    assert_readable_figures(tmp_path, quick=True, at_least=15)


def test_bench_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("bench_ekucb", ROOT / "benchmarks" / "bench_ekucb.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path), "--no-progress", "--envs", "chessboard"]) == 0
    text = (tmp_path / "bench.md").read_text()
    assert "## Scaling" in text and "overhead ratio" in text and "CBBKB(Cb=10)" in text
    summary = json.loads((tmp_path / "bench.json").read_text())["chessboard"]
    assert summary["kucb_cpu"] > 0 and summary["ekucb_cpu"] > 0 and summary["overhead_ratio"] > 1
    assert summary["m"] >= 1


def test_notebook_runs(run_notebook) -> None:
    text = run_notebook("ekucb.ipynb")
    assert "T = 150" in text
    assert "EK-UCB dictionary:" in text and "| chessboard | EK-UCB |" in text
    assert "mu=  100 gamma=  10" in text

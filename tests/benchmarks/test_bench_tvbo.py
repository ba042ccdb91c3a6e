"""The SW-GP-UCB timing benchmark runs in --quick mode; its three windowed posteriors agree."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..figure_checks import figure_problems

ROOT = Path(__file__).resolve().parents[2]


def test_bench_tvbo_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_tvbo", ROOT / "benchmarks" / "bench_tvbo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--horizon", "80", "--windows", "20", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    (row,) = data
    assert row["window"] == 20 and row["max_score_gap"] < 1e-9
    assert set(row["median_ms"]) == {"SW carry", "SW remove", "SW refactorise", "GP-UCB"}
    assert "SW refactorise" in (tmp_path / "bench.md").read_text()
    assert figure_problems(tmp_path / "time_vs_t.png") == []

"""The SW-GP-UCB timing benchmark runs in --quick mode; its three windowed posteriors agree."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark

from ..figure_checks import figure_problems


def test_bench_tvbo_quick(tmp_path):
    mod = load_benchmark("bench_tvbo")
    assert mod.main(["--quick", "--horizon", "80", "--windows", "20", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    (row,) = data
    assert row["window"] == 20 and row["max_score_gap"] < 1e-9
    assert set(row["median_ms"]) == {"SW carry", "SW remove", "SW refactorise", "GP-UCB"}
    assert "SW refactorise" in (tmp_path / "bench.md").read_text()
    assert figure_problems(tmp_path / "time_vs_t.png") == []

"""The exact-posterior benchmark runs in --quick mode and its two paths agree (no timing asserted)."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark


def test_bench_exact_quick(tmp_path):
    mod = load_benchmark("bench_exact")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_exact.json").read_text())
    assert [r["t"] for r in data["rows"]] == [50, 100, 200]
    for row in data["rows"]:
        assert row["max_score_diff"] < 1e-9  # incremental scores equal the refactorised ones
        assert row["naive_ms"] > 0 and row["incremental_fresh_ms"] > 0
    assert "| 200 |" in (tmp_path / "bench_exact.md").read_text()

"""The exact-posterior benchmark runs in --quick mode and its two paths agree (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_exact_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_exact", ROOT / "benchmarks" / "bench_exact.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_exact.json").read_text())
    assert [r["t"] for r in data["rows"]] == [50, 100, 200]
    for row in data["rows"]:
        assert row["max_score_diff"] < 1e-9  # incremental scores equal the refactorised ones
        assert row["naive_ms"] > 0 and row["incremental_fresh_ms"] > 0
    assert "| 200 |" in (tmp_path / "bench_exact.md").read_text()

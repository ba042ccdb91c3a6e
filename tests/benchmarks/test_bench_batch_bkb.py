"""benchmarks/bench_batch_bkb.py --quick runs, and its batched BKB runs equal the sequential
ones (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks import load_benchmark


def test_bench_batch_bkb_quick(tmp_path: Path) -> None:
    mod = load_benchmark("bench_batch_bkb")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["R"] for r in rows] == [1, 4]
    assert all(r["same_actions"] and r["T"] == 40 and r["A"] == 100 for r in rows)
    assert all(r["batched_s"] >= 0 and r["sequential_s"] > 0 and r["m_max"] >= 1 for r in rows)
    assert "| speedup |" in (tmp_path / "table.md").read_text()

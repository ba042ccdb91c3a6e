"""benchmarks/bench_batch_bkb.py --quick runs, and its batched BKB runs equal the sequential
ones (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_batch_bkb_quick(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_batch_bkb",
                                                  ROOT / "benchmarks" / "bench_batch_bkb.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["R"] for r in rows] == [1, 4]
    assert all(r["same_actions"] and r["T"] == 40 and r["A"] == 100 for r in rows)
    assert all(r["batched_s"] >= 0 and r["sequential_s"] > 0 and r["m_max"] >= 1 for r in rows)
    assert "| speedup |" in (tmp_path / "table.md").read_text()

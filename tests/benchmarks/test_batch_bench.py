"""benchmarks/bench_batch.py --quick runs, and its batched runs equal the sequential ones
(no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_batch_quick(tmp_path: Path) -> None:
    assert _load("bench_batch").main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {(r["env"], r["R"]) for r in rows} == {(e, n) for e in ("rkhs", "chessboard",
                                                                    "tv-rotation") for n in (1, 4)}
    assert all(r["same_actions"] for r in rows)
    assert all(r["T"] == 30 and r["batched_s"] >= 0 and r["sequential_s"] > 0 for r in rows)
    assert "| speedup |" in (tmp_path / "table.md").read_text()

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


def test_bench_batch_bkb_breakdown(tmp_path: Path) -> None:
    """--breakdown: the parts of the batched run add up to its total, the instrumentation is
    removed afterwards (the patched callables are the originals again)."""
    import torch

    import torchbandits.native.bkb as nbkb

    before = (torch.binomial, nbkb.dtc_rounds, nbkb.dtc_round, nbkb.record_rounds)
    mod = load_benchmark("bench_batch_bkb")
    assert mod.main(["--runs", "3", "--horizon", "30", "--arms", "50", "--breakdown", "2",
                     "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "breakdown.json").read_text())
    batch = info["batch_us_per_run_round"]
    parts = sum(v for k, v in batch.items() if k != "total")
    assert abs(parts - batch["total"]) <= 1e-6 * batch["total"]
    assert all(v >= 0 for k, v in batch.items() if k != "runner + env")
    assert info["sequential_runs"] == 2 and info["sequential_us_per_run_round"]["total"] > 0
    assert info["ceiling"] > 0 and info["speedup_here"] > 0
    assert (torch.binomial, nbkb.dtc_rounds, nbkb.dtc_round, nbkb.record_rounds) == before

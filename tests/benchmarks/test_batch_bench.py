"""benchmarks/bench_batch.py --quick runs, and its batched runs equal the sequential ones
(no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks import load_benchmark


def test_bench_batch_quick(tmp_path: Path) -> None:
    assert load_benchmark("bench_batch").main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {(r["env"], r["R"]) for r in rows} == {(e, n) for e in ("rkhs", "chessboard",
                                                                    "tv-rotation") for n in (1, 4)}
    assert all(r["same_actions"] for r in rows)
    assert all(r["T"] == 30 and r["batched_s"] >= 0 and r["sequential_s"] > 0 for r in rows)
    assert "| speedup |" in (tmp_path / "table.md").read_text()


def test_bench_batch_device_option(tmp_path: Path) -> None:
    """``--device cpu`` is the default path (same rows, device recorded); ``--device cuda``
    without CUDA stops with a message (with CUDA it runs R = 64 and 1024 on the GPU)."""
    import pytest
    import torch

    bench = load_benchmark("bench_batch")
    assert bench.main(["--quick", "--device", "cpu", "--envs", "rkhs", "--runs", "2",
                       "--policies", "random,kucb", "--learning-horizon", "12",
                       "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["meta"]["device"] == "cpu"
    assert {(r["policy"], r["device"], r["R"]) for r in data["rows"]} == {
        ("random", "cpu", 2), ("kucb", "cpu", 2)}
    assert all(r["same_actions"] for r in data["rows"])
    seconds, out = bench.device_time(lambda: 7, torch.device("cpu"))
    assert out == 7 and seconds >= 0
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="CUDA"):
            bench.main(["--device", "cuda", "--out", str(tmp_path)])

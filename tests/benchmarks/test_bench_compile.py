"""``benchmarks/bench_compile.py --quick``: the eager and the compiled scoring functions give the
same UCBs (the measured ratios are only reported, not asserted)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.benchmarks import load_benchmark


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_bench_compile_quick(tmp_path):
    mod = load_benchmark("bench_compile")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["n"] for r in rows] == [30]
    assert rows[0]["max_abs_diff"] < 1e-10                     # compiled = eager
    assert all(rows[0][k] > 0 for k in ("eager_us", "static_us", "dynamic_us", "pure_us"))
    assert "| 30 |" in (tmp_path / "table.md").read_text()

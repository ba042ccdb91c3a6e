"""benchmarks/exact_solve_rates.py --quick runs and its compiled solve equals torch's (no timing
asserted)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import load_benchmark
from torchbandits.native import exact as nx


@pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")
def test_exact_solve_rates_quick(tmp_path):
    mod = load_benchmark("exact_solve_rates")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "exact_solve_rates.json").read_text())["rows"]
    assert [r["n"] for r in rows] == [5, 50]
    for r in rows:
        assert r["max_rel_err"] < 1e-13
        assert r["amm_us"] > 0 and r["dmm_us"] > 0 and r["torch_trsm_us"] > 0

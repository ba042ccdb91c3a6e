"""benchmarks/exact_solve_rates.py --quick runs and its compiled solve equals torch's (no timing
asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from torchbandits.native import exact as nx

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")
def test_exact_solve_rates_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("exact_solve_rates",
                                                  ROOT / "benchmarks" / "exact_solve_rates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "exact_solve_rates.json").read_text())["rows"]
    assert [r["n"] for r in rows] == [5, 50]
    for r in rows:
        assert r["max_rel_err"] < 1e-13
        assert r["amm_us"] > 0 and r["dmm_us"] > 0 and r["torch_trsm_us"] > 0

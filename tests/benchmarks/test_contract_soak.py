"""The soak benchmark's quick mode: runs, samples memory and time, and its incremental posteriors
equal the from-scratch ones (the full run is documented in docs/soak.md)."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark


def _soak():
    module = load_benchmark("soak")
    return module


def test_soak_quick_mode(tmp_path):
    soak = _soak()
    assert soak.main(["--quick", "--samples", "10", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "soak.json").read_text())
    assert data["horizon"] == 300
    assert [r["policy"] for r in data["results"]] == ["ekucb", "bkb", "swgpucb"]
    for r in data["results"]:
        assert r["rounds"][-1] == 300 and len(r["rounds"]) == len(r["rss_mib"]) >= 10
        assert all(m > 0 for m in r["rss_mib"]) and all(t > 0 for t in r["step_ms_median"])
        assert r["final"]["mean_rel"] < 1e-6 and r["final"]["var_rel"] < 1e-6
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    merged = tmp_path / "merged"
    assert soak.main(["--merge", str(tmp_path / "soak.json"), "--out", str(merged)]) == 0
    assert len(json.loads((merged / "soak.json").read_text())["results"]) == 3

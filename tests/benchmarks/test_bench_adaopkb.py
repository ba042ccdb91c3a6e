"""The ADA-OPKB restart benchmark runs in --quick mode and counts restarts by where they fall."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import load_benchmark


def test_summary_classifies_restarts():
    mod = load_benchmark("bench_adaopkb")
    runs = [{"seed": 0, "regret": 10.0, "restarts": [100, 3200, 4001, 9000], "cpu_s": 1.0},
            {"seed": 1, "regret": 20.0, "restarts": [3000, 4000], "cpu_s": 3.0}]
    s = mod.summarise(runs, (3000,), 1000)
    assert (s["early"], s["false_alarms"], s["extra"], s["missed"], s["restarts"]) == (2, 2, 2, 0, 6)
    assert s["delay_median"] == 600.0  # detections 200 (run 0) and 1000 (run 1)
    assert mod.classify([100, 3200, 4001, 9000], (1500, 3500)) == {
        "early": [100], "detections": [1700, 501], "missed": [], "extra": [9000]}
    assert mod.classify([2000], (1500, 3500))["missed"] == [3500]
    assert s["regret_mean"] == 15.0 and abs(s["regret_sd"] - 7.0710678) < 1e-6
    assert mod.parse_overrides(["j_star=0", "test_full_block=True", "max_restarts=None"]) == {
        "j_star": 0, "test_full_block": True, "max_restarts": None}
    with pytest.raises(ValueError, match="--set"):
        mod.parse_overrides(["j_star"])


def test_bench_adaopkb_quick(tmp_path):
    mod = load_benchmark("bench_adaopkb")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["summary"]) == {"Env 1", "Env 2"} and data["horizon"] == 600
    for name, runs in data["runs"].items():
        assert len(runs) == 2
        s = data["summary"][name]
        assert s["restarts"] == sum(len(r["restarts"]) for r in runs)
        assert 0 < s["regret_mean"] < 600 * 1.6
    assert "before 1st switch" in (tmp_path / "bench.md").read_text()

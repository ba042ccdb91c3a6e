"""The benchmarks of Flynn & Reeb's bounds and of Hong, Li & Tewari's OP run in --quick mode and
their numbers are consistent (no timing asserted)."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark


def test_bench_confidence_quick(tmp_path):
    assert load_benchmark("bench_confidence").main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    means = data["mean_ms_per_step"]
    assert set(means) == {"AMM", "AY", "IGP", "DMM", "CMM", "CMM-SOCP"}
    assert set(means["CMM"]) == {"20", "50"} and set(means["CMM-SOCP"]) == {"20"}  # SOCP capped
    assert all(v > 0 for m in means.values() for v in m.values())
    assert data["checks"]["cmm_over_amm_max"] > 0
    assert "| CMM dual / AMM |" in (tmp_path / "table.md").read_text()


def test_bench_opkb_quick(tmp_path):
    assert load_benchmark("bench_opkb").main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [row["N"] for row in report["op"]] == [20, 40]
    for row in report["op"]:
        for name in ("OP", "design"):
            r = row[name]
            assert r["kkt_gap_max"] < 1e-6 and r["objective_rel_diff"] < 1e-4   # Newton = CVXPY
    run = report["adaopkb"]
    assert run["T"] == 1000 and run["agent_seconds"] > 0 and run["solves"] >= 1
    assert "ADA-OPKB, T = 1000" in (tmp_path / "bench.md").read_text()


def test_bench_vs_reference_quick(tmp_path):
    """The numpy re-statement of the authors' loops computes the UCBs ours computes (1e-9)."""
    assert load_benchmark("bench_vs_reference").main(["--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    bounds = [r for r in rows if r["family"] == "bound"]
    assert {(r["method"], r["t"]) for r in bounds} == {(m, t) for m in ("AMM", "AY", "IGP", "DMM")
                                                          for t in (20, 40)}
    assert max(r["max_abs_ucb_diff"] for r in bounds) < 1e-9
    assert {r["method"] for r in rows if r["family"] == "bkb"} == {"BKB q̄=1", "BKB q̄=5"}
    assert all(r["ours_ms"] > 0 and r["reference_ms"] > 0 for r in rows)


def test_bench_vs_reference_batched_quick(tmp_path):
    """--batched R: the batched policies' run 0 computes the re-statement's UCBs (1e-9) and plays
    its arms, for AMM, IGP and DMM at t ∈ {20, 40}."""
    mod = load_benchmark("bench_vs_reference")
    assert mod.main(["--quick", "--batched", "3", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {(r["method"], r["t"], r["R"]) for r in rows} == {(m, t, 3) for m in ("AMM", "IGP", "DMM")
                                                            for t in (20, 40)}
    assert all(r["family"] == "bound-batched" and r["same_actions"] for r in rows)
    assert max(r["max_abs_ucb_diff"] for r in rows) < 1e-9
    assert all(r["ours_ms"] > 0 and r["reference_ms"] > 0 for r in rows)
    assert "| batched ms / run-step |" in (tmp_path / "bench.md").read_text()

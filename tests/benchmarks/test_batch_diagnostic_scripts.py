"""The diagnostic options of the batch benchmarks run at small size on the CPU (no timing
asserted): ``profile_batch.py --timeline`` (the batched step's time per window of rounds) and
``ekucb_ops.py --device-profile`` (wall and kernel time of a window), both written for the GPU
measurements of docs/batch-performance.md."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks import load_benchmark


def test_profile_batch_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_benchmark("profile_batch").main(
        ["--policy", "ekucb", "--env", "chessboard", "--runs", "3", "--horizon", "24",
         "--timeline", "10"]) == 0
    out = capsys.readouterr().out
    windows = re.findall(r"rounds\s+(\d+)-\s*(\d+):\s+([\d.]+) ms a step", out)
    assert [(int(a), int(b)) for a, b, _ in windows] == [(0, 9), (10, 19), (20, 23)]
    loop, steps = map(float, re.search(r"loop wall ([\d.]+) s, batched steps ([\d.]+) s",
                                       out).groups())
    assert 0 < steps <= loop
    assert sum(float(ms) * n for (_, _, ms), n in zip(windows, (10, 10, 4))) / 1e3 \
        == pytest.approx(steps, abs=1e-3)   # (the total printed to the millisecond)


def test_ekucb_ops_device_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_benchmark("ekucb_ops").main(
        ["--runs", "3", "--start", "12", "--rounds", "4", "--device-profile"]) == 0
    out = capsys.readouterr().out
    window = re.search(r"window: from n = (\d+), largest dictionary (\d+); wall ([\d.]+) ms", out)
    assert window is not None and int(window.group(1)) == 12 + 2 * 4   # after the timed and counted rounds
    assert 1 <= int(window.group(2)) <= int(window.group(1))
    assert re.search(r"ms/round\s+[\d.]+/round\s+aten::", out)

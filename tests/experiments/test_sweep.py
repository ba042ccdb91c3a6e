"""Sweeps on a local Ray cluster (2 CPUs, started once for the module): equality with
``simulate``, kill-and-resume, the tuning example in quick mode, ``examples/sweeps/quick.yaml``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("yaml")

from torchbandits import cli  # noqa: E402
from torchbandits.experiments import make_env, make_policy, simulate  # noqa: E402
from torchbandits.experiments.results import RunResult  # noqa: E402
from torchbandits.experiments.sweep_report import DETERMINISTIC  # noqa: E402
from torchbandits.experiments.sweeps import sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "equal", "horizon": 60, "seeds": [0, 1, 2],
    "environments": [{"name": "rkhs", "kwargs": {"dim": 2, "n_arms": 15}}],
    "policies": [{"name": "kucb", "label": "K-UCB", "grid": {"lam": [0.1, 1.0]}},
                 {"name": "gpucb", "label": "GP-UCB", "grid": {"beta": [0.3, 3.0]}}],
}


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "full"
    return sweep(SPEC, out, verbose=False)


def _runs(out: Path) -> dict[tuple[str, str, int], RunResult]:
    runs = [RunResult.load(p) for p in sorted(out.glob("trials/*/runs/*.json"))]
    return {(r.config["trial_id"], r.policy, r.seed): r for r in runs}


def _deterministic(rows):
    return [{k: r[k] for k in ("trial_id", "params", *DETERMINISTIC)} for r in rows]


def test_sweep_runs_equal_simulate(uninterrupted):
    runs = _runs(uninterrupted.out)
    assert len(uninterrupted.rows) == 4 and len(runs) == 12
    for row in uninterrupted.rows:
        name = {"K-UCB": "kucb", "GP-UCB": "gpucb"}[row["policy"]]
        for seed in SPEC["seeds"]:
            env = make_env("rkhs", dim=2, n_arms=15)
            ref = simulate(make_policy(name, env, **row["params"]), env, 60, seed)
            got = next(r for (tid, _, s), r in runs.items() if tid == row["trial_id"] and s == seed)
            assert got.actions == ref.actions
            # K-UCB / GP-UCB seeds run as one batch: the RKHS environment's batched kernel
            # product may round its means differently from the sequential one (docs/batch.md)
            assert got.regret == pytest.approx(ref.regret, abs=1e-12, rel=0)
            assert got.rewards == pytest.approx(ref.rewards, abs=1e-12, rel=0)
    # the lam/beta values matter: the four configurations do not all coincide
    assert len({r["final_regret_mean"] for r in uninterrupted.rows}) > 1
    for name in ("table.md", "trials.csv", "trials.json", "regret_vs_run_K-UCB_lam.png"):
        assert (uninterrupted.out / name).is_file()
    assert list((uninterrupted.out / "tune").glob("run-*/*/result.json"))  # Tune's own logs


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_kill_driver_then_resume(ray_cluster, uninterrupted, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "torchbandits.cli", "sweep", str(spec_file), "--out",
                             str(out), "--address", ray_cluster, "--workers", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # a loaded machine starts Ray slowly (minutes)
    while not list(out.glob("trials/*/done.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    children = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)  # the driver dies mid-sweep
    proc.wait()
    for pid in children:  # the driver's own helper processes, if any survived it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finished = {p.parent.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("trials/*/done.json")}
    assert 1 <= len(finished) < 4, f"{len(finished)} trials had finished when the driver was killed"
    runs_before = {p: p.read_bytes() for tid in finished for p in (out / "trials" / tid / "runs").glob("*")}

    resumed = sweep(spec_file, out, resume=True, verbose=False)
    assert sorted(resumed.skipped) == sorted(finished)
    assert len(resumed.ran) == 4 - len(finished)
    for tid, (blob, mtime) in finished.items():  # not recomputed: same marker, one attempt only
        marker = out / "trials" / tid / "done.json"
        assert marker.read_bytes() == blob and marker.stat().st_mtime_ns == mtime
        assert len((out / "trials" / tid / "attempts.log").read_text().splitlines()) == 1
    assert all(p.read_bytes() == blob for p, blob in runs_before.items())
    assert _deterministic(resumed.rows) == _deterministic(uninterrupted.rows)
    full, part = _runs(uninterrupted.out), _runs(out)
    assert full.keys() == part.keys()
    assert all(full[k].actions == part[k].actions and full[k].regret == part[k].regret for k in full)


def test_quick_yaml_via_cli_and_resume(ray_cluster, tmp_path, capsys):
    out = tmp_path / "quick"
    assert cli.main(["sweep", str(ROOT / "examples/sweeps/quick.yaml"), "--out", str(out),
                     "--run-threads-per-trial", "2"]) == 0
    table = (out / "table.md").read_text()
    assert len(list(out.glob("trials/*/done.json"))) == 4 and len(list(out.glob("trials/*/runs/*"))) == 8
    for marker in out.glob("trials/*/done.json"):   # each trial ran its batch's runs on 2 threads
        assert json.loads(marker.read_text())["threads"] == {"torch": 1, "runs": 2}
    with pytest.raises(SystemExit, match="--resume"):
        cli.main(["sweep", str(ROOT / "examples/sweeps/quick.yaml"), "--out", str(out)])
    capsys.readouterr()
    assert cli.main(["sweep", str(ROOT / "examples/sweeps/quick.yaml"), "--out", str(out), "--resume"]) == 0
    assert "0 trial(s) run, 4 already finished" in capsys.readouterr().out
    assert (out / "table.md").read_text() == table  # rebuilt from the same markers
    changed = tmp_path / "changed.yaml"
    text = (ROOT / "examples/sweeps/quick.yaml").read_text()
    changed.write_text(text.replace("horizon: 40", "horizon: 41"))
    with pytest.raises(SystemExit, match="differs"):
        cli.main(["sweep", str(changed), "--out", str(out), "--resume"])


def test_tuning_example_quick(ray_cluster, tmp_path):
    out = tmp_path / "tuning"
    res = sweep(ROOT / "examples/sweeps/opkb_tuning.yaml", out, quick=True, verbose=False)
    tune_rows = [r for r in res.rows if r["phase"] == "tune"]
    eval_rows = [r for r in res.rows if r["phase"] == "eval"]
    assert len(tune_rows) == 4 and len(eval_rows) == 4
    for policy, sel in res.selection.items():  # the chosen configuration is the best on tuning seeds
        best = min((r for r in tune_rows if r["policy"] == policy), key=lambda r: r["final_regret_mean"])
        assert sel["params"] == best["params"]
        assert all(r["params"] == best["params"] for r in eval_rows if r["policy"] == policy)
    assert {r["env"] for r in eval_rows} == {"env1", "env2"}
    assert all(r["seeds"] == 1 for r in res.rows)
    assert (out / "selection.md").is_file() and (out / "regret_eval.png").is_file()


def test_bench_sweep_quick(ray_cluster, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_sweep", ROOT / "benchmarks" / "bench_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--trials", "2", "--horizon", "10", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["workers"] for r in data["runs"]] == [1, 2] and all(r["trials"] == 2 for r in data["runs"])
    assert data["speedup_2_vs_1"] > 0 and "overhead / trial" in (tmp_path / "bench.md").read_text()

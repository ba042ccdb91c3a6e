"""Nothing lost in long experiments: run JSON is written atomically, and `torchbandits run`, the
grid runner and the reproductions resume after an interruption (finished runs are read back, not
recomputed; an unfinished or unreadable file is never used)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchbandits.envs import RKHSFunctionEnv
from torchbandits.experiments import RunResult, load_results, run_grid
from torchbandits.experiments.results import atomic_write_text, resumable_run
from torchbandits.kernels import make_kernel
from torchbandits.policies import KernelUCB, RandomPolicy

ROOT = Path(__file__).resolve().parents[2]


def _env():
    return RKHSFunctionEnv("rbf", dim=2, lengthscale=0.5, n_arms=20)


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_text(path, '{"old": 1}')

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies between writing the temporary file and renaming

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, '{"new": 2}')
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]     # no temporary file left


def test_a_killed_writes_temporary_is_removed_when_its_run_is_computed_again(tmp_path):
    """A process killed inside ``atomic_write_text`` (after ``mkstemp``, before the rename) leaves
    a hidden temporary; the run that computes that file again removes it (and only its own)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    path = runs / "a.json"
    own = [runs / ".a.json.k1l2.tmp", runs / ".a.json.x9.tmp"]
    other = [runs / ".b.json.k1l2.tmp", runs / ".a.jsonx.q.tmp", runs / "a.json.q.tmp"]
    for p in own + other:
        p.write_text('{"policy": "random", "env"')         # a write cut short

    def compute():
        from torchbandits.experiments import simulate
        return simulate(RandomPolicy(), _env(), 5, 0)

    res, reused = resumable_run(path, compute, horizon=5)
    assert not reused and res.horizon == 5
    assert sorted(p.name for p in runs.iterdir()) == sorted(["a.json"] + [p.name for p in other])
    for p in own:                                      # reading a finished run back removes nothing
        p.write_text("{")
    _, reused = resumable_run(path, compute, horizon=5)
    assert reused and all(p.exists() for p in own)


def test_a_partial_file_is_recomputed_never_read(tmp_path):
    path = tmp_path / "runs" / "a.json"
    path.parent.mkdir()
    path.write_text('{"policy": "random", "env": "x", "seed": 0, "rewards": [0.1, ')  # truncated
    calls = []

    def compute():
        calls.append(1)
        from torchbandits.experiments import simulate
        return simulate(RandomPolicy(), _env(), 5, 0)

    res, reused = resumable_run(path, compute, horizon=5)
    assert not reused and calls == [1] and res.horizon == 5
    again, reused = resumable_run(path, compute, horizon=5)
    assert reused and calls == [1] and again.regret == res.regret
    # a finished run of another horizon, or with other settings, is recomputed
    _, reused = resumable_run(path, compute, horizon=6)
    assert not reused
    _, reused = resumable_run(path, compute, horizon=6, match={"lam": 2.0})
    assert not reused and len(calls) == 3
    # temporary files are invisible to load_results
    (path.parent / ".b.json.123.tmp").write_text("{")
    assert len(load_results(tmp_path)) == 1


def test_run_grid_interrupted_mid_grid_resumes(tmp_path):
    built: list[tuple[str, int]] = []
    stop_at = {"n": 3}

    def factory(name):
        def make(env):
            built.append((name, len(built)))
            if len(built) == stop_at["n"]:
                raise KeyboardInterrupt         # killed while the third run starts
            return KernelUCB(make_kernel("rbf", 0.5), lam=1.0) if name == "kucb" else RandomPolicy()
        return make

    policies = {"kucb": factory("kucb"), "random": factory("random")}
    envs = {"rkhs": _env}
    out = tmp_path / "grid"
    with pytest.raises(KeyboardInterrupt):
        run_grid(policies, envs, [0, 1], 30, out=out, progress=False, config={"lam": 1.0})
    done = sorted((out / "runs").glob("*.json"))
    assert [p.name for p in done] == ["rkhs__kucb__seed0.json", "rkhs__kucb__seed1.json"]
    stamps = {p.name: p.stat().st_mtime_ns for p in done}
    built.clear()
    stop_at["n"] = -1
    results = run_grid(policies, envs, [0, 1], 30, out=out, progress=False, config={"lam": 1.0})
    assert [name for name, _ in built] == ["random", "random"]    # only the unfinished runs
    assert {p.name: p.stat().st_mtime_ns for p in done} == stamps  # finished files untouched
    fresh = run_grid(policies, envs, [0, 1], 30, out=tmp_path / "fresh", progress=False,
                     config={"lam": 1.0})
    assert [r.regret for r in results] == [r.regret for r in fresh]
    # other settings: everything is recomputed
    built.clear()
    run_grid(policies, envs, [0, 1], 30, out=out, progress=False, config={"lam": 2.0})
    assert len(built) == 4


def _cli(out: Path, horizon: int) -> list[str]:
    return [sys.executable, "-m", "torchbandits.cli", "run", "--env", "rkhs",
            "--policy", "random,kucb", "--horizon", str(horizon), "--seeds", "0", "1", "2",
            "--set", "env.dim=2", "--set", "env.n_arms=30", "--threads", "1",
            "--out", str(out), "--no-progress"]


def test_cli_run_killed_mid_grid_resumes(tmp_path):
    out = tmp_path / "cli"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(_cli(out, 200), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    runs = out / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(runs.glob("*.json"))) < 3 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)                    # kill mid-grid
    proc.wait()
    first = {p.name: p.read_bytes() for p in runs.glob("*.json")}
    assert 3 <= len(first) < 6, "the kill should land mid-grid"
    for blob in first.values():                         # every file present is a finished run
        assert RunResult.from_dict(json.loads(blob)).horizon == 200
    done = subprocess.run(_cli(out, 200), env=env, capture_output=True, text=True, check=True)
    assert "wrote 6 runs" in done.stdout
    after = {p.name: p.read_bytes() for p in runs.glob("*.json")}
    assert len(after) == 6
    assert all(after[name] == blob for name, blob in first.items())  # read back, not recomputed
    assert not [p for p in runs.iterdir() if p.suffix != ".json"]


def test_reproduction_loops_resume(tmp_path, monkeypatch):
    """cmm's, ekucb's and opkb's runs go through the runner (batched or not) and read finished
    runs back."""
    import torchbandits.experiments.runner as runner
    from torchbandits.reproduce import cmm, ekucb, opkb

    calls = {"n": 0}
    real = runner.simulate

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    import torchbandits.experiments.batch as batch
    real_batch = batch.simulate_batch

    def counting_batch(*args, **kwargs):   # a batch counts one run per seed
        calls["n"] += len(args[3])
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(runner, "simulate", counting)
    monkeypatch.setattr(batch, "simulate_batch", counting_batch)
    # cmm._run (its two random seeds: one batch)
    pols = {"random": RandomPolicy}
    cmm._run(tmp_path / "cmm", "rkhs", _env, pols, {"random": 20}, [0, 1], "t", progress=False)
    assert calls["n"] == 2
    cmm._run(tmp_path / "cmm", "rkhs", _env, pols, {"random": 20}, [0, 1], "t", progress=False)
    assert calls["n"] == 2
    # ekucb main
    argv = ["--figures", "1", "--envs", "bump", "--horizon", "15", "--cbkb-horizon", "10",
            "--lams", "10", "--seeds", "0", "--out", str(tmp_path / "ek"), "--no-progress"]
    calls["n"] = 0
    assert ekucb.main(argv) == 0
    first = calls["n"]
    assert first > 0
    assert ekucb.main(argv) == 0
    assert calls["n"] == first
    assert ekucb.main([*argv, "--eta", "0.2"]) == 0   # another setting: recomputed
    assert calls["n"] == 2 * first
    # opkb.run_figure
    calls["n"] = 0
    kw = dict(horizon=20, seeds=[0], nn_width=8, quick=True, out=tmp_path / "op",
              algos=["WGP-UCB"], progress=False)
    opkb.run_figure("fig1a", **kw)
    assert calls["n"] == 1
    opkb.run_figure("fig1a", **kw)
    assert calls["n"] == 1

"""The runner's batch form: ``run_jobs`` (own file names, annotations, resume on chosen keys) and
``simulate``'s CPU clock and CPU budget."""

from __future__ import annotations

import json

import pytest

from torchbandits.envs import RKHSFunctionEnv
from torchbandits.experiments import run_grid
from torchbandits.experiments.runner import Job, run_jobs, simulate
from torchbandits.kernels import make_kernel
from torchbandits.policies import KernelUCB, RandomPolicy


def _env() -> RKHSFunctionEnv:
    return RKHSFunctionEnv("rbf", dim=2, lengthscale=0.5, n_arms=15)


def _kucb(env) -> KernelUCB:
    return KernelUCB(make_kernel("rbf", 0.5), lam=1.0, beta=1.0)


def test_run_grid_is_run_jobs_over_the_product(tmp_path):
    grid = run_grid({"kucb": _kucb, "random": lambda env: RandomPolicy()}, {"rkhs": _env}, [0, 1], 12,
                    out=tmp_path / "g", progress=False)
    jobs = [Job("rkhs", p, s, 12, _env, f) for p, f in (("kucb", _kucb),
                                                          ("random", lambda env: RandomPolicy()))
            for s in (0, 1)]
    batch = run_jobs(jobs, out=tmp_path / "j", progress=False)
    assert [(r.policy, r.seed) for r in grid] == [(r.policy, r.seed) for r in batch]
    assert [r.actions for r in grid] == [r.actions for r in batch]
    assert sorted(p.name for p in (tmp_path / "g" / "runs").iterdir()) == \
        sorted(p.name for p in (tmp_path / "j" / "runs").iterdir())
    assert grid[0].config["dim"] == 2 and grid[0].config["wall_seconds"] > 0


def test_run_jobs_names_annotates_and_resumes_on_the_match_keys(tmp_path):
    seen = []

    def annotate(policy, env, res):
        seen.append((type(policy).__name__, env.n_arms))
        res.config["extra"] = res.horizon * 2

    def batch(value, match):
        job = Job("rkhs", "kucb", 3, 10, _env, _kucb, {"setting": value, "label": "x"},
                  file="custom.json", annotate=annotate)
        return run_jobs([job], out=tmp_path, progress=False, match=match)

    (res,) = batch(1, ["setting"])
    saved = json.loads((tmp_path / "runs" / "custom.json").read_text())
    assert seen == [("KernelUCB", 15)] and saved["config"]["extra"] == 20
    assert saved["config"]["setting"] == 1 and saved["actions"] == res.actions
    batch(1, ["setting"])                       # same setting: read back, not recomputed
    assert len(seen) == 1
    batch(2, ["label"])                         # only "label" is matched: still read back
    assert len(seen) == 1
    batch(2, ["setting"])                       # another setting: recomputed
    assert len(seen) == 2


def test_cpu_clock_and_budget():
    env = _env()
    full = simulate(_kucb(env), env, 30, seed=1, cpu_clock=True)
    cpu = full.config["agent_cpu_seconds"]
    assert len(cpu) == 30 and all(c >= 0 for c in cpu)
    assert "stopped_at" not in full.config
    cut = simulate(_kucb(env), env, 30, seed=1, cpu_budget=1e-12, diagnostics_every=0)
    assert cut.horizon == cut.config["stopped_at"] == 1      # stopped after the first round
    assert cut.actions == full.actions[:1]
    assert cut.diagnostic_steps == [1] and cut.diagnostics         # diagnostics at the stop
    plain = simulate(_kucb(env), env, 30, seed=1)
    assert "agent_cpu_seconds" not in plain.config and plain.actions == full.actions
    with pytest.raises(ValueError, match="cpu_budget"):
        simulate(_kucb(env), env, 30, cpu_budget=0.0)

"""Batched runs: the seeds of one policy on one environment as one program with a run dimension.

:func:`simulate_batch` runs ``R`` seeds together when the policy and the environment can
(:func:`can_batch`) and otherwise falls back to ``R`` sequential :func:`~.runner.simulate` runs;
either way it returns one :class:`~.results.RunResult` per seed with the fields and ``config``
keys that :func:`~.runner.simulate` gives. The contract: run ``r`` of a batch is the sequential
run with seed ``seeds[r]`` (same actions, same rewards and regrets), whatever runs beside it.
:func:`run_grid_batched` is :func:`~.runner.run_grid` with that choice made per policy × env.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ..batching import check_seeds
from ..envs.batched import BatchedEnv, why_not_batchable
from .results import RunResult, resumable_run
from .runner import EnvFactory, Job, PolicyFactory, run_jobs, simulate, tqdm

__all__ = ["BatchMode", "can_batch", "run_grid_batched", "simulate_batch", "why_not_batch"]

BatchMode = Literal["auto", "on", "off"]


def why_not_batch(policy: Any, env: Any) -> str | None:
    """``None`` if ``policy`` on ``env`` can run batched, else the reason (a policy's own
    ``why_not_batched()`` first, e.g. a K-UCB whose confidence rule has no batched width)."""
    why = getattr(policy, "why_not_batched", None)
    reason = why() if callable(why) else None
    if reason is not None:
        return reason
    if not getattr(policy, "batchable", False):
        return f"{type(policy).__name__} has no batched mode yet (it runs sequentially)"
    if getattr(env, "round_metrics", None) is not None:
        return f"{type(env).__name__} logs round_metrics per run (not batched yet)"
    return why_not_batchable(env)


def can_batch(policy: Any, env: Any) -> bool:
    """Whether :func:`simulate_batch` runs ``policy`` on ``env`` as one batch."""
    return why_not_batch(policy, env) is None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_run(value: Any, n_runs: int) -> list[float]:
    """A diagnostic as one float per run (a ``[R]`` tensor, or one number shared by all)."""
    if isinstance(value, torch.Tensor) and value.numel() == n_runs:
        return [float(v) for v in value.reshape(-1).tolist()]
    return [float(value)] * n_runs


def simulate_batch(
    policy: Any,
    env: Any,
    horizon: int,
    seeds: Sequence[int],
    *,
    policy_name: str | None = None,
    env_name: str | None = None,
    diagnostics_every: int = 1,
    progress: tqdm | bool = False,
    config: Mapping[str, Any] | None = None,
    chunk: int = 64,
) -> list[RunResult]:
    """Run ``policy`` on ``env`` for ``horizon`` rounds once per seed, batched when possible.

    Batched: ``env`` is the template of a :class:`~torchbandits.envs.batched.BatchedEnv` (left
    unchanged), ``policy.reset(seed=seeds)`` puts the policy in batched mode; per round
    ``candidates [R, A, d]`` → ``select`` → ``LongTensor [R]`` → ``pull`` → rewards and regrets
    ``[R]`` → ``update(candidates[r, i_r] [R, d], rewards [R])``. Actions, rewards and regrets
    stay on the device until the end. A run's ``agent_seconds`` per round is its share of the
    batched ``select`` + ``update`` (step time / R), its ``config["wall_seconds"]`` its share
    of the loop's wall time. Otherwise: one :func:`~.runner.simulate` per seed, in order.
    """
    seeds = check_seeds(seeds)
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    names = {"policy_name": policy_name, "env_name": env_name}
    if not can_batch(policy, env):
        return [simulate(policy, env, horizon, s, diagnostics_every=diagnostics_every,
                         progress=progress, config=config, **names) for s in seeds]
    n = len(seeds)
    benv = BatchedEnv(env, seeds, chunk=chunk)
    policy.reset(seed=seeds)
    device = policy.device
    rows = torch.arange(n, device=benv.candidates().device)
    actions, rewards, regrets, seconds = [], [], [], []
    diag_steps: list[int] = []
    diags: list[dict[str, list[float]]] = [{} for _ in range(n)]
    bar = progress if isinstance(progress, tqdm) else None
    own_bar = None
    if progress is True:
        own_bar = bar = tqdm(total=int(horizon) * n, desc=policy_name or type(policy).__name__,
                             leave=False)
    start = time.perf_counter()
    for t in range(int(horizon)):
        cand = benv.candidates()
        _sync(device)
        t0 = time.perf_counter()
        idx = policy.select(cand)
        t1 = time.perf_counter()
        reward, regret = benv.pull(idx)
        t2 = time.perf_counter()
        policy.update(cand[rows, idx.to(rows.device)], reward)
        _sync(device)
        t3 = time.perf_counter()
        seconds.append(((t1 - t0) + (t3 - t2)) / n)
        actions.append(idx)
        rewards.append(reward)
        regrets.append(regret)
        if diagnostics_every and (t + 1) % diagnostics_every == 0:
            diag_steps.append(t + 1)
            for k, v in policy.diagnostics().items():
                for r, value in enumerate(_per_run(v, n)):
                    diags[r].setdefault(k, []).append(value)
        if bar is not None:
            bar.update(n)
    if own_bar is not None:
        own_bar.close()
    wall = time.perf_counter() - start
    acts = torch.stack(actions, dim=1).cpu().tolist()
    rews = torch.stack(rewards, dim=1).cpu().tolist()
    regs = torch.stack(regrets, dim=1).to(torch.float64).cpu().tolist()
    results = []
    for r, seed in enumerate(seeds):
        cfg = {"horizon": int(horizon), "device": str(device), "dtype": str(policy.dtype),
               "policy_repr": repr(policy), "env_repr": benv.run_repr(r),
               "dim": int(cand.shape[-1]), "wall_seconds": wall / n, **(config or {})}
        results.append(RunResult(
            policy=policy_name or type(policy).__name__, env=env_name or type(env).__name__,
            seed=int(seed), rewards=rews[r], regret=regs[r], agent_seconds=list(seconds),
            actions=acts[r], diagnostic_steps=list(diag_steps), diagnostics=diags[r], config=cfg))
    return results


class _NotSaved(Exception):
    """Raised by the probe of :func:`resumable_run` when a run has no finished file."""


def run_grid_batched(
    policies: Mapping[str, PolicyFactory],
    envs: Mapping[str, EnvFactory],
    seeds: Sequence[int],
    horizon: int,
    *,
    batch: BatchMode = "auto",
    out: str | Path | None = None,
    progress: bool = True,
    diagnostics_every: int = 1,
    config: Mapping[str, Any] | None = None,
    resume: bool = True,
    match: Sequence[str] | None = None,
) -> list[RunResult]:
    """:func:`~.runner.run_grid` (same order, files, resume rules) with the seeds of each
    policy × env batched: ``batch="auto"`` when :func:`can_batch` and there is more than one seed
    to run, ``"on"`` whenever :func:`can_batch`, ``"off"`` never (the sequential loop)."""
    if batch not in ("auto", "on", "off"):
        raise ValueError(f"batch must be 'auto', 'on' or 'off', got {batch!r}")
    seeds = check_seeds(seeds)
    cfg = dict(config or {})
    keys = [k for k in cfg if k != "argv"] if match is None else list(match)
    match_values = {k: cfg.get(k) for k in keys}
    results: list[RunResult] = []
    total = len(policies) * len(envs) * len(seeds) * int(horizon)
    bar = tqdm(total=total, desc="runs", disable=not progress)
    for env_name, make_env in envs.items():
        for pol_name, make_policy in policies.items():
            jobs = [Job(env_name, pol_name, s, int(horizon), make_env, make_policy, config)
                    for s in seeds]
            done: dict[int, RunResult] = {}
            if out is not None and resume:
                for job in jobs:
                    path = Path(out) / "runs" / job.filename
                    try:
                        done[job.seed] = resumable_run(path, _raise_not_saved, horizon=horizon,
                                                       match=match_values)[0]
                        bar.update(int(horizon))
                    except _NotSaved:
                        pass
            todo = [job for job in jobs if job.seed not in done]
            env = make_env() if todo and batch != "off" else None
            policy = make_policy(env) if env is not None else None
            batched = (env is not None and can_batch(policy, env)
                       and (batch == "on" or len(todo) > 1))
            if batched:
                bar.set_postfix_str(f"{env_name} / {pol_name} / {len(todo)} seeds batched")
                for job, res in zip(todo, simulate_batch(
                        policy, env, horizon, [j.seed for j in todo], policy_name=pol_name,
                        env_name=env_name, diagnostics_every=diagnostics_every, progress=bar,
                        config=config), strict=True):
                    if out is not None:
                        res.save(Path(out) / "runs" / job.filename)
                    done[job.seed] = res
            elif todo:
                ran = run_jobs(todo, out=out, progress=False, diagnostics_every=diagnostics_every,
                               resume=False, match=match)
                bar.update(len(todo) * int(horizon))
                done.update({job.seed: res for job, res in zip(todo, ran, strict=True)})
            results.extend(done[s] for s in seeds)
    bar.close()
    return results


def _raise_not_saved() -> RunResult:
    raise _NotSaved

"""``simulate`` one policy on one environment; ``run_jobs`` a batch of runs (saved, resumable);
``run_grid`` over policies × envs × seeds."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..envs.base import BanditEnv
from ..policies.base import Policy
from .results import RunResult, resumable_run

if importlib.util.find_spec("ipywidgets") is not None:   # notebook widgets when available
    from tqdm.auto import tqdm
else:  # tqdm.auto would warn "IProgress not found" in a notebook: the plain bar instead
    from tqdm import tqdm

__all__ = ["Job", "policy_memory", "run_grid", "run_jobs", "simulate", "start_memory", "tqdm"]

PolicyFactory = Callable[[BanditEnv], Policy]
EnvFactory = Callable[[], BanditEnv]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_memory(device: torch.device) -> int:
    """Start a run's memory count: on CUDA, reset the peak counter and return the bytes
    allocated now (the baseline); 0 elsewhere."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def policy_memory(policy: Any, device: torch.device, base: int = 0) -> float:
    """Device memory of a run (of a batch: divide by ``R``), in bytes.

    On CUDA: the peak allocated since :func:`start_memory` minus its baseline
    (``torch.cuda.max_memory_allocated``: state and temporaries of policy and environment).
    Elsewhere: the bytes of the policy's parameters and buffers at the end of the run (distinct
    storages, e.g. the posterior's Cholesky factor, inputs and targets) — the state, a lower
    bound of the peak (temporaries and candidate caches are not counted).
    """
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device) - base)
    if not isinstance(policy, torch.nn.Module):
        return 0.0
    seen: dict[int, int] = {}
    for t in (*policy.parameters(), *policy.buffers()):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return float(sum(seen.values()))


def simulate(
    policy: Policy,
    env: BanditEnv,
    horizon: int,
    seed: int = 0,
    *,
    policy_name: str | None = None,
    env_name: str | None = None,
    diagnostics_every: int = 1,
    progress: tqdm | bool = False,
    config: Mapping[str, Any] | None = None,
    cpu_clock: bool = False,
    cpu_budget: float | None = None,
) -> RunResult:
    """Run ``policy`` on ``env`` for ``horizon`` rounds from a fresh ``reset(seed)`` of both.

    Per round: ``candidates()`` → ``select`` → ``pull`` → ``update(candidates[i], reward)``.
    Agent time is ``select`` + ``update`` only (CUDA synchronised); the pseudo-regret is
    ``max mean_rewards() − mean_rewards()[i]``. An environment with ``round_metrics()`` has
    its per-round values stored in ``config["env_metrics"]``; ``config["dim"]`` is the width
    ``d`` of the candidates, ``config["wall_seconds"]`` the wall time of the whole loop
    (environment included), ``memory_bytes`` the run's device memory (:func:`policy_memory`).

    With ``cpu_clock`` the CPU time of the running thread spent in ``select`` + ``update``
    (``time.thread_time``: what the policy itself consumed, robust to other processes on a
    shared machine) is stored per round in ``config["agent_cpu_seconds"]``. With ``cpu_budget``
    (seconds of that CPU time; implies ``cpu_clock``) the run stops after the round in which the
    agent's total passes it: the result is then shorter than ``horizon``, its diagnostics are
    taken at that round, and ``config["stopped_at"]`` is its length.
    """
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if cpu_budget is not None and not cpu_budget > 0:
        raise ValueError(f"cpu_budget must be > 0 seconds, got {cpu_budget}")
    track_cpu = bool(cpu_clock) or cpu_budget is not None
    cpu: list[float] = []
    stopped = None
    device = policy.device
    base_bytes = start_memory(device)
    env.reset(seed)
    policy.reset(seed=seed)
    rewards, regret, seconds, actions = [], [], [], []
    diag_steps: list[int] = []
    diags: dict[str, list[float]] = {}
    round_metrics = getattr(env, "round_metrics", None)
    env_metrics: dict[str, list[float]] = {}
    bar = progress if isinstance(progress, tqdm) else None
    own_bar = None
    if progress is True:
        own_bar = bar = tqdm(total=horizon, desc=policy_name or type(policy).__name__, leave=False)
    start = time.perf_counter()
    for t in range(int(horizon)):
        cand = env.candidates()
        means = env.mean_rewards()
        _sync(device)
        if track_cpu:
            c0 = time.thread_time()
        t0 = time.perf_counter()
        idx = policy.select(cand)
        t1 = time.perf_counter()
        if track_cpu:
            c1 = time.thread_time()
        reward = env.pull(idx)
        if track_cpu:
            c2 = time.thread_time()
        t2 = time.perf_counter()
        policy.update(cand[idx], reward)
        _sync(device)
        t3 = time.perf_counter()
        if track_cpu:
            cpu.append((c1 - c0) + (time.thread_time() - c2))
            if cpu_budget is not None and sum(cpu) > cpu_budget and t + 1 < horizon:
                stopped = t + 1
        seconds.append((t1 - t0) + (t3 - t2))
        rewards.append(float(reward))
        regret.append(float(means.max() - means[idx]))
        actions.append(int(idx))
        if round_metrics is not None:  # e.g. the test functions' regret against the optimum
            for k, v in round_metrics().items():
                env_metrics.setdefault(k, []).append(float(v))
        if (diagnostics_every and (t + 1) % diagnostics_every == 0) or \
                (stopped is not None and diag_steps[-1:] != [t + 1]):
            diag_steps.append(t + 1)
            for k, v in policy.diagnostics().items():
                diags.setdefault(k, []).append(float(v))
        if bar is not None:
            bar.update(1 if stopped is None else int(horizon) - t)
        if stopped is not None:
            break
    if own_bar is not None:
        own_bar.close()
    wall = time.perf_counter() - start
    cfg = {"horizon": int(horizon), "device": str(device), "dtype": str(policy.dtype),
           "policy_repr": repr(policy), "env_repr": repr(env), "dim": int(cand.shape[-1]),
           "wall_seconds": wall,
           **(config or {})}
    if env_metrics:
        cfg["env_metrics"] = env_metrics
    if track_cpu:
        cfg["agent_cpu_seconds"] = cpu
    if stopped is not None:
        cfg["stopped_at"] = stopped
    return RunResult(
        policy=policy_name or type(policy).__name__,
        env=env_name or type(env).__name__,
        seed=int(seed),
        rewards=rewards,
        regret=regret,
        agent_seconds=seconds,
        actions=actions,
        diagnostic_steps=diag_steps,
        diagnostics=diags,
        config=cfg,
        memory_bytes=policy_memory(policy, device, base_bytes),
    )


@dataclass(frozen=True)
class Job:
    """One run of a batch: ``make_policy(make_env())`` for ``horizon`` rounds from ``seed``.

    ``config`` is stored in the run's ``config`` (and, with resume, a saved run must carry the
    same values under the batch's ``match`` keys); ``file`` is the JSON name under ``out/runs/``
    (default ``ENV__POLICY__seedS.json``); ``annotate(policy, env, result)``, if given, adds what
    only the finished policy or environment knows (e.g. restart times) to ``result.config``
    before the run is saved.
    """

    env: str
    policy: str
    seed: int
    horizon: int
    make_env: EnvFactory
    make_policy: PolicyFactory
    config: Mapping[str, Any] | None = None
    file: str | None = None
    annotate: Callable[[Policy, BanditEnv, RunResult], None] | None = None

    @property
    def filename(self) -> str:
        """The JSON file name of this job's run: ``file`` if given, else ``ENV__POLICY__seedS.json``."""
        return self.file or f"{self.env}__{self.policy}__seed{self.seed}.json"


def run_jobs(
    jobs: Iterable[Job],
    *,
    out: str | Path | None = None,
    progress: bool = True,
    diagnostics_every: int = 1,
    resume: bool = True,
    match: Sequence[str] | None = None,
    desc: str = "runs",
) -> list[RunResult]:
    """Every job in order, one progress bar over all their rounds; the run loop of the library.

    A fresh environment and a fresh policy are built for every run (``make_policy(make_env())``).
    With ``out`` each run is saved as JSON under ``out/runs/`` atomically
    (:func:`~torchbandits.experiments.results.atomic_write_text`); with ``resume`` (default) a run
    whose file already holds a finished run (same horizon, and the same job ``config`` values
    under the keys ``match``, default every key but ``"argv"``) is read back instead of
    recomputed, so a batch killed mid-way continues where it stopped.
    """
    jobs = list(jobs)
    results = []
    bar = tqdm(total=sum(int(j.horizon) for j in jobs), desc=desc, disable=not progress)
    for job in jobs:
        bar.set_postfix_str(f"{job.env} / {job.policy} / seed {job.seed}")
        cfg = dict(job.config or {})

        def compute(job: Job = job) -> RunResult:
            env = job.make_env()
            policy = job.make_policy(env)
            res = simulate(policy, env, job.horizon, job.seed, policy_name=job.policy,
                           env_name=job.env, diagnostics_every=diagnostics_every, progress=bar,
                           config=job.config)
            if job.annotate is not None:
                job.annotate(policy, env, res)
            return res

        if out is None:
            res = compute()
        else:
            keys = [k for k in cfg if k != "argv"] if match is None else list(match)
            res, reused = resumable_run(Path(out) / "runs" / job.filename, compute,
                                        horizon=job.horizon, match={k: cfg.get(k) for k in keys},
                                        resume=resume)
            if reused:
                bar.update(int(job.horizon))
        results.append(res)
    bar.close()
    return results


def run_grid(
    policies: Mapping[str, PolicyFactory],
    envs: Mapping[str, EnvFactory],
    seeds: Sequence[int],
    horizon: int,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    diagnostics_every: int = 1,
    config: Mapping[str, Any] | None = None,
    resume: bool = True,
    match: Sequence[str] | None = None,
) -> list[RunResult]:
    """Every policy × env × seed (env outermost, seed innermost) through :func:`run_jobs`; each
    run saved as ``out/runs/ENV__POLICY__seedS.json`` if ``out`` is set, and read back instead of
    recomputed when it is already there and finished (``resume``, ``match`` as in
    :func:`run_jobs`)."""
    jobs = [Job(env_name, pol_name, int(seed), int(horizon), make_env, make_policy, config)
            for env_name, make_env in envs.items()
            for pol_name, make_policy in policies.items() for seed in seeds]
    return run_jobs(jobs, out=out, progress=progress, diagnostics_every=diagnostics_every,
                    resume=resume, match=match)

"""Batched runs: the seeds of one policy on one environment as one program with a run dimension.

:func:`simulate_batch` runs ``R`` seeds together when the policy and the environment can
(:func:`can_batch`) and otherwise falls back to ``R`` sequential :func:`~.runner.simulate` runs;
either way it returns one :class:`~.results.RunResult` per seed with the fields and ``config``
keys that :func:`~.runner.simulate` gives. The contract: run ``r`` of a batch is the sequential
run with seed ``seeds[r]`` (same actions, same rewards and regrets), whatever runs beside it.
:func:`run_grid_batched` is :func:`~.runner.run_grid` with that choice made per policy × env,
:func:`run_jobs_batched` :func:`~.runner.run_jobs` with it made per setting (the reproductions'
runner).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ..batching import check_seeds, deferred_checks
from ..envs.batched import BatchedEnv, tensor_version, why_not_batchable
from ..validation import check_int
from .batch_diagnostics import DiagnosticsLog
from .results import RunResult, resumable_run
from .runner import (
    EnvFactory,
    Job,
    PolicyFactory,
    policy_memory,
    run_jobs,
    simulate,
    start_memory,
    tqdm,
)

__all__ = ["CUDA_PAYS_FROM", "DEFAULT_PAYS_FROM", "BatchMode", "auto_batches", "batch_pays_from",
           "can_batch", "run_grid_batched", "run_jobs_batched", "simulate_batch", "why_not_batch"]

BatchMode = Literal["auto", "on", "off"]

#: ``batch="auto"`` on the CPU for a batched policy class that declares no ``batch_pays_from``:
#: batch from two seeds (the rule before the per-family crossovers were measured)
DEFAULT_PAYS_FROM = 2
#: ``batch="auto"`` on a CUDA device, every family: a GPU round is launch-bound, so one batched
#: round costs about what one sequential round does and the batch pays from two seeds
CUDA_PAYS_FROM = 2


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


def batch_pays_from(policy: Any, device: str | torch.device | None = None) -> int:
    """The number of seeds from which ``batch="auto"`` batches ``policy``'s runs on ``device``
    (default: the policy's own ``device``, else the CPU).

    On a CUDA device :data:`CUDA_PAYS_FROM` (2). Otherwise the policy class's
    ``batch_pays_from`` — the crossover measured over whole runs on one CPU thread
    (``benchmarks/bench_batch_crossover.py``), declared beside the batched implementation — or
    :data:`DEFAULT_PAYS_FROM` (2) for a class that declares none. A declared value that is not an
    int ≥ 1 raises a ``ValueError`` naming ``batch_pays_from``; a device torch cannot parse one
    naming ``device``."""
    if device is None:
        device = getattr(policy, "device", None) or "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: not a torch device, got {device!r}") from err
    if kind == "cuda":
        return CUDA_PAYS_FROM
    value = getattr(type(policy), "batch_pays_from", None)
    if value is None:
        return DEFAULT_PAYS_FROM
    return check_int(f"batch_pays_from of {type(policy).__name__}", value, 1)


def auto_batches(policy: Any, n_seeds: int, device: str | torch.device | None = None) -> bool:
    """Whether ``batch="auto"`` runs ``n_seeds`` seeds of ``policy`` as one batch on ``device``:
    ``n_seeds ≥`` :func:`batch_pays_from` (the caller checks :func:`can_batch` first; the runs
    are the same either way, so this decides only the speed). ``ValueError`` naming ``n_seeds``
    for a negative count or a non-integer."""
    return check_int("n_seeds", n_seeds, 0) >= batch_pays_from(policy, device)


class _StepClock:
    """Agent seconds of every round (``select`` + ``update``) without a host synchronisation:
    ``time.perf_counter`` on the CPU; on a CUDA device, CUDA events recorded in the stream and
    read once, at the end."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        """Four marks per round: before/after ``select``, before/after ``update``."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """``(m1 − m0) + (m3 − m2)`` of every round (synchronises on CUDA: call at the end)."""
        m = self.marks
        if self.cuda:
            if m:
                m[-1].synchronize()
            return [(m[i].elapsed_time(m[i + 1]) + m[i + 2].elapsed_time(m[i + 3])) / 1e3
                    for i in range(0, len(m), 4)]
        return [(m[i + 1] - m[i]) + (m[i + 3] - m[i + 2]) for i in range(0, len(m), 4)]


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
    sync_every: int = 100,
    draw_ahead: bool | None = None,
) -> list[RunResult]:
    """Run ``policy`` on ``env`` for ``horizon`` rounds once per seed, batched when possible.

    Batched: ``env`` is the template of a :class:`~torchbandits.envs.batched.BatchedEnv` (left
    unchanged), ``policy.reset(seed=seeds)`` puts the policy in batched mode; per round
    ``candidates [R, A, d]`` → ``select`` → ``LongTensor [R]`` → ``pull`` → rewards and regrets
    ``[R]`` → ``update(candidates[r, i_r] [R, d], rewards [R])``.

    **No host synchronisation inside a round.** The loop runs inside
    :func:`~torchbandits.batching.deferred_checks`: the policy and the environment are fed the
    library's own tensors, so their value checks (finite candidates and rewards — made here, once
    per round, as they leave the environment — index range, the posterior's positive pivots)
    become per-run device flags; the runner reads them every
    ``sync_every`` rounds (0: only at the end) and at the end, and raises
    :class:`~torchbandits.batching.BatchCheckError` (a ``ValueError``) naming the check, run,
    seed and round. Actions, rewards, regrets and the policy's diagnostics stay on the device
    and are copied to the host at the end; the step clock is ``time.perf_counter`` on the CPU
    and CUDA events on a CUDA device.

    A run's ``agent_seconds`` per round is its share of the batched ``select`` + ``update``
    (step time / R), its ``config["wall_seconds"]`` its share of the loop's wall time, and its
    ``memory_bytes`` its share (/ R) of the batch's device memory (:func:`~.runner.policy_memory`).
    ``draw_ahead``: the environment's per-run draws for the next ``chunk`` rounds are made on a
    background thread while the loop uses the current ones (the same numbers;
    :class:`~torchbandits.envs.batched.BatchedEnv`; ``None``: on a GPU, for large draws).

    Otherwise: one :func:`~.runner.simulate` per seed, in order.
    """
    seeds = check_seeds(seeds)
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if int(sync_every) < 0:
        raise ValueError(f"sync_every must be >= 0, got {sync_every}")
    names = {"policy_name": policy_name, "env_name": env_name}
    if not can_batch(policy, env):
        return [simulate(policy, env, horizon, s, diagnostics_every=diagnostics_every,
                         progress=progress, config=config, **names) for s in seeds]
    n = len(seeds)
    device = policy.device
    base_bytes = start_memory(device)
    benv = BatchedEnv(env, seeds, chunk=chunk, draw_ahead=draw_ahead)
    policy.reset(seed=seeds)
    actions, rewards, regrets = [], [], []
    clock = _StepClock(device)
    diags = DiagnosticsLog(n)
    bar = progress if isinstance(progress, tqdm) else None
    own_bar = None
    if progress is True:
        own_bar = bar = tqdm(total=int(horizon) * n, desc=policy_name or type(policy).__name__,
                             leave=False)
    start = time.perf_counter()
    # closing: the streams' chunks drawn ahead stop with the loop, even when it raises
    with deferred_checks() as checks, contextlib.closing(benv):
        checks.inputs_checked = True   # candidates and rewards flagged here, once per round
        flagged: tuple[Any, int | None] = (None, None)   # the candidates last flagged
        fresh = benv.fresh   # candidates never written afterwards: kept unreduced till the fold
        for t in range(int(horizon)):
            checks.round = t
            cand = benv.candidates()
            # a fixed arm set is the same tensor every round: flagged again only if it changed
            # (a new tensor or an in-place write), as its flags could not differ
            version = tensor_version(cand)
            if cand is not flagged[0] or version is None or version != flagged[1]:
                checks.flag_finite("candidates must be finite", cand, kept=fresh)
                flagged = (cand, version)
            clock.mark()
            idx = policy.select(cand)
            clock.mark()
            reward, regret = benv.pull(idx)
            checks.flag_finite("reward must be finite", reward, kept=True)   # made by pull
            clock.mark()
            gather = idx.to(cand.device)[:, None, None].expand(-1, 1, cand.shape[2])
            policy.update(cand.gather(1, gather)[:, 0], reward)
            clock.mark()
            actions.append(idx)
            rewards.append(reward)
            regrets.append(regret)
            if diagnostics_every and (t + 1) % diagnostics_every == 0:
                diags.add(t + 1, policy.diagnostics())   # copies: live buffers move on
            if bar is not None:
                bar.update(n)
            if sync_every and (t + 1) % int(sync_every) == 0:
                checks.raise_if_failed(seeds)
        checks.raise_if_failed(seeds)
    if own_bar is not None:
        own_bar.close()
    seconds = [s / n for s in clock.seconds()]
    wall = time.perf_counter() - start
    memory = policy_memory(policy, device, base_bytes) / n
    acts = torch.stack(actions, dim=1).cpu().tolist()
    rews = torch.stack(rewards, dim=1).cpu().tolist()
    regs = torch.stack(regrets, dim=1).to(torch.float64).cpu().tolist()
    per_run = diags.per_run()
    results = []
    for r, seed in enumerate(seeds):
        cfg = {"horizon": int(horizon), "device": str(device), "dtype": str(policy.dtype),
               "policy_repr": repr(policy), "env_repr": benv.run_repr(r),
               "dim": int(cand.shape[-1]), "wall_seconds": wall / n, **(config or {})}
        results.append(RunResult(
            policy=policy_name or type(policy).__name__, env=env_name or type(env).__name__,
            seed=int(seed), rewards=rews[r], regret=regs[r], agent_seconds=list(seconds),
            actions=acts[r], diagnostic_steps=list(diags.steps), diagnostics=per_run[r], config=cfg,
            memory_bytes=memory))
    return results


class _NotSaved(Exception):
    """Raised by the probe of :func:`resumable_run` when a run has no finished file."""


def run_jobs_batched(
    jobs: Iterable[Job],
    *,
    batch: BatchMode = "auto",
    out: str | Path | None = None,
    progress: bool = True,
    diagnostics_every: int = 1,
    resume: bool = True,
    match: Sequence[str] | None = None,
    desc: str = "runs",
) -> list[RunResult]:
    """:func:`~.runner.run_jobs` (same results in the same order, same files, same resume rules)
    with the seeds of each setting run as one batch.

    A setting is the jobs with the same environment and policy names, horizon and ``config``
    and no ``annotate`` (which needs each run's own policy and environment): by the runner's
    convention (files ``ENV__POLICY__seedS``) such jobs differ only in their seed. A setting's
    unfinished seeds go through :func:`simulate_batch` when :func:`can_batch` says so and
    ``batch`` is ``"on"``, or ``"auto"`` with at least :func:`batch_pays_from` seeds to run
    (:func:`auto_batches`: the policy family's measured CPU crossover, 2 on a CUDA device);
    otherwise (and with ``"off"``) through :func:`~.runner.run_jobs`, one seed at a time."""
    if batch not in ("auto", "on", "off"):
        raise ValueError(f"batch must be 'auto', 'on' or 'off', got {batch!r}")
    jobs = list(jobs)
    settings: dict[Any, list[int]] = {}
    for i, job in enumerate(jobs):
        key = (("alone", i) if job.annotate is not None else
               (job.env, job.policy, int(job.horizon),
                json.dumps(job.config, sort_keys=True, default=str)))
        settings.setdefault(key, []).append(i)
    done: dict[int, RunResult] = {}
    bar = tqdm(total=sum(int(j.horizon) for j in jobs), desc=desc, disable=not progress)
    for members in settings.values():
        first = jobs[members[0]]
        cfg = dict(first.config or {})
        keys = [k for k in cfg if k != "argv"] if match is None else list(match)
        todo = []
        for i in members:
            if out is not None and resume:
                try:
                    done[i] = resumable_run(Path(out) / "runs" / jobs[i].filename,
                                            _raise_not_saved, horizon=jobs[i].horizon,
                                            match={k: cfg.get(k) for k in keys})[0]
                    bar.update(int(jobs[i].horizon))
                    continue
                except _NotSaved:
                    pass
            todo.append(i)
        env = first.make_env() if todo and batch != "off" else None
        policy = first.make_policy(env) if env is not None else None
        if env is not None and can_batch(policy, env) and (batch == "on"
                                                           or auto_batches(policy, len(todo))):
            bar.set_postfix_str(f"{first.env} / {first.policy} / {len(todo)} seeds batched")
            runs = simulate_batch(policy, env, first.horizon, [jobs[i].seed for i in todo],
                                  policy_name=first.policy, env_name=first.env,
                                  diagnostics_every=diagnostics_every, progress=bar,
                                  config=first.config)
            for i, res in zip(todo, runs, strict=True):
                if out is not None:
                    res.save(Path(out) / "runs" / jobs[i].filename)
                done[i] = res
        elif todo:
            ran = run_jobs([jobs[i] for i in todo], out=out, progress=False,
                           diagnostics_every=diagnostics_every, resume=False, match=match)
            bar.update(sum(int(jobs[i].horizon) for i in todo))
            done.update(zip(todo, ran, strict=True))
    bar.close()
    return [done[i] for i in range(len(jobs))]


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
    policy × env batched: ``batch="auto"`` when :func:`can_batch` and there are at least
    :func:`batch_pays_from` seeds to run (:func:`auto_batches`), ``"on"`` whenever
    :func:`can_batch`, ``"off"`` never (the sequential loop)."""
    seeds = check_seeds(seeds)
    jobs = [Job(env_name, pol_name, s, int(horizon), make_env, make_policy, config)
            for env_name, make_env in envs.items() for pol_name, make_policy in policies.items()
            for s in seeds]
    return run_jobs_batched(jobs, batch=batch, out=out, progress=progress,
                            diagnostics_every=diagnostics_every, resume=resume, match=match)


def _raise_not_saved() -> RunResult:
    raise _NotSaved

"""``simulate`` one policy on one environment, and ``run_grid`` over policies × envs × seeds."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Mapping, Sequence
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

__all__ = ["run_grid", "simulate", "tqdm"]

PolicyFactory = Callable[[BanditEnv], Policy]
EnvFactory = Callable[[], BanditEnv]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
) -> RunResult:
    """Run ``policy`` on ``env`` for ``horizon`` rounds from a fresh ``reset(seed)`` of both.

    Per round: ``candidates()`` → ``select`` → ``pull`` → ``update(candidates[i], reward)``.
    Agent time is ``select`` + ``update`` only (CUDA synchronised); the pseudo-regret is
    ``max mean_rewards() − mean_rewards()[i]``. An environment with ``round_metrics()`` has
    its per-round values stored in ``config["env_metrics"]``.
    """
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    env.reset(seed)
    policy.reset(seed=seed)
    device = policy.device
    rewards, regret, seconds, actions = [], [], [], []
    diag_steps: list[int] = []
    diags: dict[str, list[float]] = {}
    round_metrics = getattr(env, "round_metrics", None)
    env_metrics: dict[str, list[float]] = {}
    bar = progress if isinstance(progress, tqdm) else None
    own_bar = None
    if progress is True:
        own_bar = bar = tqdm(total=horizon, desc=policy_name or type(policy).__name__, leave=False)
    for t in range(int(horizon)):
        cand = env.candidates()
        means = env.mean_rewards()
        _sync(device)
        t0 = time.perf_counter()
        idx = policy.select(cand)
        t1 = time.perf_counter()
        reward = env.pull(idx)
        t2 = time.perf_counter()
        policy.update(cand[idx], reward)
        _sync(device)
        t3 = time.perf_counter()
        seconds.append((t1 - t0) + (t3 - t2))
        rewards.append(float(reward))
        regret.append(float(means.max() - means[idx]))
        actions.append(int(idx))
        if round_metrics is not None:  # e.g. the test functions' regret against the optimum
            for k, v in round_metrics().items():
                env_metrics.setdefault(k, []).append(float(v))
        if diagnostics_every and (t + 1) % diagnostics_every == 0:
            diag_steps.append(t + 1)
            for k, v in policy.diagnostics().items():
                diags.setdefault(k, []).append(float(v))
        if bar is not None:
            bar.update(1)
    if own_bar is not None:
        own_bar.close()
    cfg = {"horizon": int(horizon), "device": str(device), "dtype": str(policy.dtype),
           "policy_repr": repr(policy), "env_repr": repr(env), **(config or {})}
    if env_metrics:
        cfg["env_metrics"] = env_metrics
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
    )


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
    """Every policy × env × seed; each run saved as JSON under ``out/runs/`` if ``out`` is set.

    A fresh environment and a fresh policy are built for every run (``policy_factory(env)``).
    Each file is written atomically (:func:`~torchbandits.experiments.results.atomic_write_text`).
    With ``resume`` (default) a run whose file already holds a finished run (same horizon, and
    the same ``config`` values under the keys ``match``, default every key but ``"argv"``) is read
    back instead of recomputed, so a grid killed mid-way continues where it stopped.
    """
    results = []
    cfg = dict(config or {})
    keys = [k for k in cfg if k != "argv"] if match is None else list(match)
    want = {k: cfg.get(k) for k in keys}
    total = len(policies) * len(envs) * len(seeds) * int(horizon)
    bar = tqdm(total=total, desc="runs", disable=not progress)
    for env_name, make_env in envs.items():
        for pol_name, make_policy in policies.items():
            for seed in seeds:
                bar.set_postfix_str(f"{env_name} / {pol_name} / seed {seed}")

                def compute(env_name=env_name, make_env=make_env, pol_name=pol_name,
                            make_policy=make_policy, seed=seed) -> RunResult:
                    env = make_env()
                    return simulate(make_policy(env), env, horizon, seed, policy_name=pol_name,
                                    env_name=env_name, diagnostics_every=diagnostics_every,
                                    progress=bar, config=config)

                if out is None:
                    res = compute()
                else:
                    path = Path(out) / "runs" / f"{env_name}__{pol_name}__seed{seed}.json"
                    res, reused = resumable_run(path, compute, horizon=horizon, match=want,
                                                resume=resume)
                    if reused:
                        bar.update(int(horizon))
                results.append(res)
    bar.close()
    return results

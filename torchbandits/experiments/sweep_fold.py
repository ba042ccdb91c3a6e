"""Grid folding: the trials of a β or λ grid run as one batch with per-run β/λ.

A sweep's trials that differ only in the regulariser ``lam`` and/or the constant radius ``beta``
of one policy entry — same environment (name, label, keyword arguments), same policy entry, same
seeds, horizon and device, batching on — are *folded*: :func:`fold_trials` groups them, and
:func:`run_group` runs the group as one batch of ``M · S`` runs (``M`` trials × ``S`` seeds)
through :func:`~torchbandits.experiments.simulate_batch`, with run ``m·S + j`` given the ``lam``
and ``beta`` of trial ``m`` (:meth:`~torchbandits.policies.KernelUCB.set_per_run`) and seed
``seeds[j]``. Since run ``r`` of a batch is the sequential run of its own settings and seed, every
trial gets the runs its unfolded batch would give (same actions; rewards, regrets and scores to
rounding); each trial's runs and completion marker are written as :func:`~.sweeps.run_trial`
writes them (the marker says ``folded``: the ids of the group). A group whose policies turn out
not to be foldable (no per-run settings, a β that is not a constant radius, a λ the confidence
rule takes at its own regulariser, a policy or environment that cannot batch) runs trial by
trial, unfolded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .sweep_trials import TrialSpec

__all__ = ["FOLDABLE_PARAMS", "fold_key", "fold_trials", "run_group"]

#: the parameters a folded batch can vary run by run
FOLDABLE_PARAMS = ("lam", "beta")


def fold_key(trial: TrialSpec) -> str | None:
    """What folded trials share (everything but the values of ``lam``/``beta``), or ``None``
    when ``trial`` is not a candidate (batching off, or other swept parameters)."""
    if not trial.batch or not trial.params or not set(trial.params) <= set(FOLDABLE_PARAMS):
        return None
    shared = {k: v for k, v in trial.to_dict().items() if k not in ("trial_id", "params")}
    return json.dumps({**shared, "swept": sorted(trial.params)}, sort_keys=True, default=str)


def fold_trials(trials: Sequence[TrialSpec]) -> list[list[TrialSpec]]:
    """``trials`` in groups to run together, each group at its first member's place; a trial
    that folds with no other is a group of one."""
    groups: list[list[TrialSpec]] = []
    by_key: dict[str, list[TrialSpec]] = {}
    for t in trials:
        key = fold_key(t)
        if key is None:
            groups.append([t])
        elif key in by_key:
            by_key[key].append(t)
        else:
            by_key[key] = [t]
            groups.append(by_key[key])
    return groups


def _folded_batch(trials: list[TrialSpec]) -> tuple[Any, Any, list[Any]] | None:
    """``(env, policy with per-run settings, the trials' own policies)``, or ``None`` if the
    trials cannot share one batch. A run's ``config["policy_repr"]`` is its trial's own policy
    (as built, before the run; an unfolded run records it after the run, with its batch)."""
    from .. import experiments
    from .sweeps import _build

    env, policy = _build(trials[0])
    own = [_build(t)[1] for t in trials]
    if not hasattr(policy, "set_per_run") or not experiments.can_batch(policy, env):
        return None
    if any(type(p) is not type(policy) or type(p.rule) is not type(policy.rule)
           or getattr(p.rule, "variance", None) != getattr(policy.rule, "variance", None)
           for p in own):
        return None
    seeds = len(trials[0].seeds)
    settings = {}
    if "lam" in trials[0].params:
        settings["lam"] = [float(p.lam) for p in own for _ in range(seeds)]
    if "beta" in trials[0].params:
        if not all(hasattr(p.rule, "beta") for p in own):
            return None
        settings["beta"] = [float(p.rule.beta) for p in own for _ in range(seeds)]
    try:
        policy.set_per_run(**settings)
    except ValueError:
        return None
    return env, policy, own


def run_group(trials: Sequence[TrialSpec | Mapping[str, Any]], out: str | Path
              ) -> list[dict[str, Any]]:
    """Run a group of :func:`fold_trials` into ``out``: its unfinished trials as one folded
    batch when they can share one (else one :func:`~.sweeps.run_trial` each); the completion
    records of every trial of the group, in order."""
    from .. import experiments
    from .sweep_report import params_text
    from .sweeps import _marker, finish_trial, run_saver, run_trial, start_trial

    specs = [t if isinstance(t, TrialSpec) else TrialSpec.from_dict(t) for t in trials]
    pending = [t for t in specs if not _marker(out, t.trial_id).is_file()]
    folded = _folded_batch(pending) if len(pending) > 1 else None
    if folded is not None:
        env, policy, own = folded
        starts = [start_trial(t, out) for t in pending]
        t0, c0 = time.perf_counter(), time.process_time()
        seeds = list(pending[0].seeds)
        runs = experiments.simulate_batch(policy, env, pending[0].horizon, seeds * len(pending))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        ids = [t.trial_id for t in pending]
        for m, trial in enumerate(pending):
            mine = runs[m * len(seeds): (m + 1) * len(seeds)]
            name = f"{trial.policy_label}({params_text(trial.params)})"
            cfg = {"trial_id": trial.trial_id, "policy_name": trial.policy,
                   "env_name": trial.env, "params": dict(trial.params),
                   "policy_kwargs": dict(trial.policy_kwargs),
                   "env_kwargs": dict(trial.env_kwargs)}
            save = run_saver(trial, out)
            for r in mine:
                r.policy, r.env = name, trial.env_label
                r.config.update(cfg, batched=True, policy_repr=repr(own[m]))
                save(r)
            finish_trial(trial, out, mine, started=starts[m], seconds=seconds / len(pending),
                         cpu_seconds=cpu / len(pending), folded=ids)
    return [run_trial(t, out) for t in specs]

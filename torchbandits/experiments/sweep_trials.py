"""Trials of a sweep: one configuration (environment, policy, parameters) over its seeds.

:func:`expand_trials` crosses a validated :class:`~torchbandits.experiments.sweep_spec.SweepSpec`'s
environments × policies × configurations; a configuration is a point of the policy's grid
product, times ``num_samples`` draws of its sampled spaces (Ray Tune's ``BasicVariantGenerator``
semantics), drawn here from ``search_seed`` so that every trial is known before the first starts.
Trial ids are readable and content-addressed: the same content gives the same id, run after run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .sweep_spec import SweepSpec

__all__ = ["TrialSpec", "configurations", "expand_trials", "make_trial", "spec_hash"]


@dataclass
class TrialSpec:
    """One configuration (env, policy, parameters) over its seeds: the unit of work and resume."""

    trial_id: str
    phase: str
    env: str
    env_label: str
    env_kwargs: dict[str, Any]
    policy: str
    policy_label: str
    policy_kwargs: dict[str, Any]
    params: dict[str, Any]
    seeds: list[int]
    horizon: int
    device: str = "cpu"
    batch: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the trial's fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**dict(d))


def _sample(space: dict[str, Any], rng: np.random.Generator) -> Any:
    kind, args = next(iter(space.items()))
    if kind == "choice":
        return args[int(rng.integers(len(args)))]
    if kind == "uniform":
        return float(rng.uniform(args[0], args[1]))
    if kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
    return int(rng.integers(args[0], args[1]))  # randint: [low, high)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:40] or "x"


def spec_hash(obj: Any) -> str:
    """sha1 of the canonical JSON of ``obj`` (first 10 hex digits)."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def configurations(spec: SweepSpec, policy: dict[str, Any]) -> list[dict[str, Any]]:
    """The swept parameter values of one policy entry: grid product × ``num_samples`` draws of the
    sampled spaces (seeded by ``search_seed`` and the entry's label, hence reproducible)."""
    grid = {k: v for k, v in policy["grid"].items() if isinstance(v, list)}
    sampled = {k: v for k, v in policy["grid"].items() if not isinstance(v, list)}
    rng = np.random.default_rng([spec.search_seed, int(spec_hash(policy["label"]), 16)])
    out = []
    for combo in itertools.product(*grid.values()):
        point = dict(zip(grid, combo))
        for _ in range(spec.num_samples if sampled else 1):
            out.append({**point, **{k: _sample(v, rng) for k, v in sampled.items()}})
    return out


def make_trial(spec: SweepSpec, phase: str, env: dict[str, Any], policy: dict[str, Any],
               params: dict[str, Any], seeds: list[int]) -> TrialSpec:
    """One trial; its id is readable and content-addressed (same content ⇒ same id)."""
    body = {"phase": phase, "env": env, "policy": {k: policy[k] for k in ("name", "label", "kwargs")},
            "params": params, "seeds": seeds, "horizon": spec.horizon, "device": spec.device}
    tid = f"{phase}-{_slug(policy['label'])}-{_slug(env['label'])}-{spec_hash(body)}"
    return TrialSpec(trial_id=tid, phase=phase, env=env["name"], env_label=env["label"],
                     env_kwargs=dict(env["kwargs"]), policy=policy["name"], policy_label=policy["label"],
                     policy_kwargs=dict(policy["kwargs"]), params=dict(params), seeds=list(seeds),
                     horizon=spec.horizon, device=spec.device, batch=spec.batch)


def expand_trials(spec: SweepSpec, phase: str = "run", *, seeds: list[int] | None = None,
                  env_labels: list[str] | None = None) -> list[TrialSpec]:
    """environments × policies × configurations, in SPEC order (environment-major)."""
    seeds = list(spec.seeds if seeds is None else seeds)
    envs = [e for e in spec.environments if env_labels is None or e["label"] in env_labels]
    return [make_trial(spec, phase, e, p, params, seeds)
            for e in envs for p in spec.policies for params in configurations(spec, p)]

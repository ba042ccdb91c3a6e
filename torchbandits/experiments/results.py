"""``RunResult``: the trace of one policy on one environment with one seed, and summaries."""

from __future__ import annotations

import glob
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RunResult", "atomic_write_text", "discard_partial_writes", "load_results", "resumable_run",
           "summarize"]


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder (named
    ``.NAME.*.tmp``, so no ``*.json`` glob sees it) is written, flushed to disk and renamed over
    ``path`` (``os.replace``). An interrupted write leaves the old file (or none), never a
    partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def discard_partial_writes(path: str | Path) -> int:
    """Remove the temporaries (``.NAME.*.tmp``) that writes of ``path`` by
    :func:`atomic_write_text` killed before their rename left in its folder; how many.

    Call it only where this process owns ``path`` (as :func:`resumable_run` does before it
    computes the run): a temporary of another process writing ``path`` at this moment would go
    too."""
    path = Path(path)
    stale = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def _json_normal(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples → lists, …), for comparisons."""
    return json.loads(json.dumps(value, allow_nan=True, default=str))


@dataclass
class RunResult:
    """Per-step arrays of one run plus its configuration.

    ``regret`` is the instantaneous pseudo-regret ``max_a f(a) − f(a_t)`` over this round's
    candidates; ``agent_seconds`` is the wall time of ``select`` + ``update`` only (environment
    excluded). ``diagnostics[k][i]`` is the policy's diagnostic ``k`` after step
    ``diagnostic_steps[i]``. ``memory_bytes`` is the run's device memory in bytes
    (:func:`~torchbandits.experiments.runner.policy_memory`: the peak allocated on CUDA, the
    policy's tensor state elsewhere; a run of a batch of ``R`` gets the batch's figure / R),
    ``None`` in files written before it was recorded.
    """

    policy: str
    env: str
    seed: int
    rewards: list[float]
    regret: list[float]
    agent_seconds: list[float]
    actions: list[int] = field(default_factory=list)
    diagnostic_steps: list[int] = field(default_factory=list)
    diagnostics: dict[str, list[float]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    memory_bytes: float | None = None

    @property
    def horizon(self) -> int:
        """Number of rounds T recorded (length of ``regret``)."""
        return len(self.regret)

    @property
    def cumulative_regret(self) -> np.ndarray:
        """Cumulative regret R_t = Σ_{s≤t} r_s, shape [T]."""
        return np.cumsum(np.asarray(self.regret, dtype=float))

    @property
    def final_regret(self) -> float:
        """Cumulative regret after the last round, R_T."""
        return float(np.sum(self.regret))

    @property
    def total_agent_seconds(self) -> float:
        """Total wall time spent in the policy's ``select`` + ``update`` over the run (seconds)."""
        return float(np.sum(self.agent_seconds))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus the derived ``cumulative_regret`` list."""
        d = asdict(self)
        d["cumulative_regret"] = self.cumulative_regret.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """Inverse of :meth:`to_dict` (the derived ``cumulative_regret`` is dropped and recomputed)."""
        d = dict(d)
        d.pop("cumulative_regret", None)
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        """Write the run as JSON atomically (:func:`atomic_write_text`)."""
        return atomic_write_text(path, json.dumps(self.to_dict(), allow_nan=True))

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        """Read one run's JSON file (raises on a missing or malformed file; see :meth:`try_load`)."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def try_load(cls, path: str | Path) -> RunResult | None:
        """The run saved at ``path``, or ``None`` if there is none or it does not parse."""
        try:
            return cls.load(path)
        except (OSError, ValueError, TypeError, KeyError):
            return None


def resumable_run(path: str | Path, compute: Callable[[], RunResult], *, horizon: int,
                  match: Mapping[str, Any] | None = None,
                  resume: bool = True) -> tuple[RunResult, bool]:
    """``(result, reused)``: the run saved at ``path`` if ``resume`` and it is finished (``horizon``
    steps) with ``config[k] == v`` for every ``k, v`` in ``match``; otherwise ``compute()``, saved
    atomically to ``path`` before it is returned. Because every save is atomic, a run killed
    mid-way leaves either nothing or a finished file (and perhaps a hidden temporary, removed
    here before the run is computed again); a file that does not parse is recomputed."""
    if resume:
        old = RunResult.try_load(path)
        if old is not None and old.horizon == int(horizon) and all(
                _json_normal(old.config.get(k)) == _json_normal(v) for k, v in (match or {}).items()):
            return old, True
    discard_partial_writes(path)
    res = compute()
    res.save(path)
    return res, False


def load_results(directory: str | Path) -> list[RunResult]:
    """Every ``*.json`` run below ``directory`` (recursively), in name order."""
    out = []
    for p in sorted(Path(directory).rglob("*.json")):
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict) and {"policy", "env", "regret"} <= d.keys():
            out.append(RunResult.from_dict(d))
    return out


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std())  # population std (ddof=0), as Flynn & Reeb (2024)'s plots


def summarize(results: Iterable[RunResult]) -> list[dict[str, Any]]:
    """One row per (env, policy): final regret mean ± std over seeds (ddof = 0), regret at T/2,
    total agent seconds (mean) and per-step agent milliseconds at the end (median of the last
    10% of steps)."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.env, r.policy), []).append(r)
    rows = []
    for (env, policy), runs in groups.items():
        fin_m, fin_s = _mean_std([r.final_regret for r in runs])
        half = [float(r.cumulative_regret[max(r.horizon // 2 - 1, 0)]) for r in runs]
        tot_m, _ = _mean_std([r.total_agent_seconds for r in runs])
        tail = [float(np.median(r.agent_seconds[-max(r.horizon // 10, 1):])) for r in runs]
        rows.append({
            "env": env,
            "policy": policy,
            "seeds": len(runs),
            "horizon": runs[0].horizon,
            "final_regret_mean": fin_m,
            "final_regret_std": fin_s,
            "half_regret_mean": float(np.mean(half)),
            "agent_seconds_mean": tot_m,
            "last_step_ms": 1e3 * float(np.mean(tail)),
        })
    return rows

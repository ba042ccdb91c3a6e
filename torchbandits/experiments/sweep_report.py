"""Per-trial metrics, the sweep's tables (markdown, CSV, JSON), plots and tuning selection.

A trial's metrics summarise its runs (one per seed, horizon ``T``), with ``R_t`` the cumulative
pseudo-regret of a run:

* ``final_regret_mean`` / ``final_regret_std`` — mean and population std (ddof = 0) of ``R_T``;
* ``regret_q1_mean``, ``half_regret_mean``, ``regret_q3_mean`` — mean ``R_t`` at ``t = T/4, T/2,
  3T/4`` (curve summaries);
* ``tail_regret_mean`` — mean instantaneous regret over the last 10% of rounds;
* ``agent_seconds_mean`` — mean over seeds of the agent's total ``select`` + ``update`` seconds.

All but the last are functions of the actions alone, so they are identical between an
uninterrupted sweep and a resumed one.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .results import RunResult

__all__ = ["DETERMINISTIC", "markdown_table", "plot_vs_param", "select_best", "trial_metrics",
           "write_tables"]

DETERMINISTIC = ("final_regret_mean", "final_regret_std", "regret_q1_mean", "half_regret_mean",
                 "regret_q3_mean", "tail_regret_mean")


def trial_metrics(results: Sequence[RunResult]) -> dict[str, float]:
    """The metrics above for the runs of one trial (module docstring)."""
    if not results:
        raise ValueError("results must hold at least one run")
    cum = [r.cumulative_regret for r in results]
    T = min(len(c) for c in cum)

    def at(frac: float) -> float:
        i = max(math.ceil(frac * T) - 1, 0)
        return float(np.mean([c[i] for c in cum]))

    finals = np.asarray([c[-1] for c in cum], dtype=float)
    tail = max(T // 10, 1)
    return {
        "final_regret_mean": float(finals.mean()),
        "final_regret_std": float(finals.std()),
        "regret_q1_mean": at(0.25),
        "half_regret_mean": at(0.5),
        "regret_q3_mean": at(0.75),
        "tail_regret_mean": float(np.mean([np.mean(r.regret[-tail:]) for r in results])),
        "agent_seconds_mean": float(np.mean([r.total_agent_seconds for r in results])),
    }


def _fmt(x: Any, digits: int = 4) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan"
        return f"{x:.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"
    return str(x)


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items()) or "—"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per trial: final regret mean ± std over seeds, regret at T/2, agent seconds."""
    lines = ["| phase | env | policy | parameters | seeds | T | regret at T (mean ± std) | "
             "regret at T/2 | agent s (mean) |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['env']} | {r['policy']} | {params_text(r['params'])} | "
                     f"{r['seeds']} | {r['horizon']} | {_fmt(r['final_regret_mean'])} ± "
                     f"{_fmt(r['final_regret_std'], 3)} | {_fmt(r['half_regret_mean'])} | "
                     f"{_fmt(r['agent_seconds_mean'], 3)} |")
    return "\n".join(lines)


def write_tables(rows: Sequence[dict[str, Any]], out: Path, title: str) -> str:
    """``table.md``, ``trials.csv`` (one column per parameter) and ``trials.json``; returns the
    markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    (out / "table.md").write_text(f"# {title}\n\n{table}\n")
    (out / "trials.json").write_text(json.dumps(list(rows), indent=1, default=str))
    names = sorted({k for r in rows for k in r["params"]})
    metric_keys = [k for k in rows[0] if k not in ("params",)] if rows else []
    with (out / "trials.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(metric_keys + [f"param.{n}" for n in names])
        for r in rows:
            w.writerow([r[k] for k in metric_keys] + [r["params"].get(n, "") for n in names])
    return table


def plot_vs_param(rows: Sequence[dict[str, Any]], out: Path, phase: str) -> list[Path]:
    """For each policy entry and each swept parameter with ≥ 2 values: final regret vs the
    parameter, one line per environment. Where other parameters are swept too, each point is the
    best configuration at that value (the profile); the band is ± one population std over seeds of
    that configuration."""
    from .report import figure_grid

    paths = []
    rows = [r for r in rows if r["phase"] == phase]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        prs = [r for r in rows if r["policy"] == policy]
        for name in dict.fromkeys(k for r in prs for k in r["params"]):
            values = sorted({r["params"][name] for r in prs if name in r["params"]},
                            key=lambda v: (isinstance(v, str), v))
            if len(values) < 2 or not all(isinstance(v, (int, float)) for v in values):
                continue
            fig, ax = figure_grid(figsize=(5.6, 3.9))
            for env in dict.fromkeys(r["env"] for r in prs):
                best = []
                for v in values:
                    cands = [r for r in prs if r["env"] == env and r["params"].get(name) == v]
                    best.append(min(cands, key=lambda r: r["final_regret_mean"]))
                m = np.array([b["final_regret_mean"] for b in best])
                s = np.array([b["final_regret_std"] for b in best])
                ax.plot(values, m, marker="o", label=env)
                ax.fill_between(values, m - s, m + s, alpha=0.2)
            if min(values) > 0 and max(values) / min(values) >= 20:
                ax.set_xscale("log")
            others = len({tuple(sorted((k, str(v)) for k, v in r["params"].items() if k != name))
                          for r in prs}) > 1
            ax.set_xlabel(name)
            ax.set_ylabel(f"cumulative regret at T = {prs[0]['horizon']}")
            ax.set_title(f"{policy}: regret vs {name}", fontsize=10)
            note = ("best over the other parameters; " if others else "") + \
                f"band: ± 1 std over {prs[0]['seeds']} seeds"
            ax.text(0.01, 0.01, note, transform=ax.transAxes, fontsize=7, alpha=0.8)
            ax.legend(fontsize=8, title="environment", title_fontsize=8)
            fig.tight_layout()
            path = out / f"regret_vs_{phase}_{_safe(policy)}_{_safe(name)}.png"
            fig.savefig(path, dpi=110)
            paths.append(path)
    return paths


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)


def select_best(rows: Sequence[dict[str, Any]], metric: str, mode: str,
                env_labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per policy label: the parameters whose ``metric`` averaged over ``env_labels`` is best
    (``min``/``max``); ties go to the first configuration in SPEC order."""
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        scores: dict[str, list[float]] = {}
        params: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["policy"] == policy and r["env"] in env_labels:
                key = json.dumps(r["params"], sort_keys=True)
                scores.setdefault(key, []).append(float(r[metric]))
                params[key] = r["params"]
        sign = 1.0 if mode == "min" else -1.0
        key = min(scores, key=lambda k: sign * float(np.mean(scores[k])))
        out[policy] = {"params": params[key], metric: float(np.mean(scores[key])),
                       "candidates": len(scores)}
    return out

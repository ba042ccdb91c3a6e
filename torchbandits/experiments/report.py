"""Markdown tables and matplotlib plots of run results (regret and agent time vs t)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .results import RunResult, summarize

__all__ = ["figure_grid", "markdown_table", "plot_diagnostic", "plot_regret", "plot_time",
           "write_report"]


def figure_grid(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Figure, Any]:
    """``(Figure, axes)`` like ``pyplot.subplots`` but outside pyplot: no backend is selected and
    no global figure list grows, so the library draws the same in a script, a test or a notebook
    (whose own backend it never changes). ``figsize`` goes to the figure, the rest to
    ``Figure.subplots``."""
    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _fmt(x: float, digits: int = 3) -> str:
    if not math.isfinite(x):
        return "nan"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Final regret (mean ± population std over seeds), regret at T/2, total agent time, and the
    per-step agent time at the end of the run."""
    head = ("| env | policy | seeds | T | regret at T (mean ± std) | regret at T/2 | "
            "agent time (s) | ms/step at end |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['policy']} | {r['seeds']} | {r['horizon']} | "
            f"{_fmt(r['final_regret_mean'])} ± {_fmt(r['final_regret_std'], 2)} | "
            f"{_fmt(r['half_regret_mean'])} | {_fmt(r['agent_seconds_mean'])} | "
            f"{_fmt(r['last_step_ms'])} |"
        )
    return "\n".join(lines)


def _by_env(results: Iterable[RunResult]) -> dict[str, dict[str, list[RunResult]]]:
    out: dict[str, dict[str, list[RunResult]]] = {}
    for r in results:
        out.setdefault(r.env, {}).setdefault(r.policy, []).append(r)
    return out


def _panel_grid(n: int) -> tuple[Figure, np.ndarray]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = figure_grid(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def _plot_curves(results: Iterable[RunResult], path: Path, curve, ylabel: str,
                 logy: bool = False) -> Path:
    grouped = _by_env(results)
    fig, axes = _panel_grid(len(grouped))
    for ax, (env, by_policy) in zip(axes.flat, grouped.items()):
        for policy, runs in by_policy.items():
            horizon = min(r.horizon for r in runs)
            curves = np.stack([curve(r)[:horizon] for r in runs])
            t = np.arange(1, horizon + 1)
            mean, std = curves.mean(0), curves.std(0)
            ax.plot(t, mean, label=policy)
            ax.fill_between(t, mean - std, mean + std, alpha=0.2)
        ax.set_title(env)
        ax.set_xlabel("t")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_regret(results: Iterable[RunResult], path: str | Path) -> Path:
    """Cumulative pseudo-regret vs t, mean ± std band over seeds, one panel per environment."""
    return _plot_curves(results, Path(path), lambda r: r.cumulative_regret,
                        "cumulative regret")


def _smoothed_ms(r: RunResult) -> np.ndarray:
    s = 1e3 * np.asarray(r.agent_seconds, dtype=float)
    w = max(1, len(s) // 50)
    if w == 1:
        return s
    pad = np.concatenate([np.full(w - 1, s[0]), s])
    return np.array([np.median(pad[i : i + w]) for i in range(len(s))])


def plot_time(results: Iterable[RunResult], path: str | Path) -> Path:
    """Agent milliseconds per step vs t (running median over T/50 steps), log scale."""
    return _plot_curves(results, Path(path), _smoothed_ms, "agent ms / step", logy=True)


def plot_diagnostic(results: Iterable[RunResult], key: str, path: str | Path) -> Path:
    """A diagnostic (e.g. ``dictionary_size``) vs t for the runs that report it."""
    runs = [r for r in results if key in r.diagnostics]
    grouped = _by_env(runs)
    fig, axes = _panel_grid(max(len(grouped), 1))
    for ax, (env, by_policy) in zip(axes.flat, grouped.items()):
        for policy, rs in by_policy.items():
            n = min(len(r.diagnostics[key]) for r in rs)
            vals = np.stack([np.asarray(r.diagnostics[key][:n]) for r in rs]).mean(0)
            ax.plot(rs[0].diagnostic_steps[:n], vals, label=policy)
        ax.set_title(env)
        ax.set_xlabel("t")
        ax.set_ylabel(key)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return Path(path)


def write_report(results: Sequence[RunResult], out: str | Path, title: str = "") -> str:
    """Write ``table.md``, ``summary.json``, ``regret.png`` and ``time.png`` into ``out``;
    return the markdown table."""
    import json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(results)
    table = markdown_table(rows)
    text = (f"# {title}\n\n" if title else "") + table + "\n"
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    plot_regret(results, out / "regret.png")
    plot_time(results, out / "time.png")
    return table

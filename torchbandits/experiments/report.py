"""Markdown tables and matplotlib plots of run results (regret and agent time vs t)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .figures import AGENT_MS, CUM_REGRET, ROUND, band_label, figure_grid, plot_band, save_figure
from .results import RunResult, summarize

__all__ = ["figure_grid", "markdown_table", "plot_diagnostic", "plot_regret", "plot_time",
           "write_report"]


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
    fig, axes = figure_grid(rows, cols, figsize=(5.2 * cols, 3.8 * rows + 0.6), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def _setting(results: Sequence[RunResult]) -> str:
    """``"T = 300, 3 seeds"`` (ranges when the runs differ)."""
    hs = sorted({r.horizon for r in results})
    per = [len(v) for by in _by_env(results).values() for v in by.values()]
    T = f"T = {hs[0]}" if len(hs) == 1 else f"T = {hs[0]}–{hs[-1]}"
    lo, hi = (min(per), max(per)) if per else (0, 0)
    seeds = f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}–{hi} seeds"
    return f"{T}, {seeds}"


def _panel_title(env: str, runs: Sequence[RunResult]) -> str:
    dim = runs[0].config.get("dim")
    return env if dim is None or "d" + str(dim) in env or f"d={dim}" in env else f"{env} (d = {dim})"


def _plot_curves(results: Iterable[RunResult], path: Path, curve, ylabel: str, what: str,
                 title: str = "", logy: bool = False) -> Path:
    results = list(results)
    grouped = _by_env(results)
    fig, axes = _panel_grid(len(grouped))
    for ax, (env, by_policy) in zip(axes.flat, grouped.items()):
        for policy, runs in by_policy.items():
            horizon = min(r.horizon for r in runs)
            plot_band(ax, np.stack([curve(r)[:horizon] for r in runs]), label=policy)
        ax.set_title(_panel_title(env, [r for rs in by_policy.values() for r in rs]))
        ax.set_xlabel(ROUND)
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
    seeds = max((len(v) for by in grouped.values() for v in by.values()), default=1)
    head = f"{title}: {what}" if title else what.capitalize()
    return save_figure(fig, path, title=f"{head} — {_setting(results)}", band=band_label(seeds))


def plot_regret(results: Iterable[RunResult], path: str | Path, title: str = "") -> Path:
    """Cumulative pseudo-regret vs t, mean ± std band over seeds, one panel per environment."""
    return _plot_curves(results, Path(path), lambda r: r.cumulative_regret, CUM_REGRET,
                        "cumulative regret", title)


def _smoothed_ms(r: RunResult) -> np.ndarray:
    s = 1e3 * np.asarray(r.agent_seconds, dtype=float)
    w = max(1, len(s) // 50)
    if w == 1:
        return s
    pad = np.concatenate([np.full(w - 1, s[0]), s])
    return np.array([np.median(pad[i : i + w]) for i in range(len(s))])


def plot_time(results: Iterable[RunResult], path: str | Path, title: str = "") -> Path:
    """Agent milliseconds per step vs t (running median over T/50 steps), log scale."""
    return _plot_curves(results, Path(path), _smoothed_ms, AGENT_MS + ", running median",
                        "agent time per round", title, logy=True)


def plot_diagnostic(results: Iterable[RunResult], key: str, path: str | Path, title: str = "",
                    ylabel: str | None = None) -> Path:
    """A diagnostic (e.g. ``dictionary_size``) vs t for the runs that report it (mean over seeds)."""
    runs = [r for r in results if key in r.diagnostics]
    grouped = _by_env(runs)
    fig, axes = _panel_grid(max(len(grouped), 1))
    for ax, (env, by_policy) in zip(axes.flat, grouped.items()):
        for policy, rs in by_policy.items():
            n = min(len(r.diagnostics[key]) for r in rs)
            vals = np.stack([np.asarray(r.diagnostics[key][:n]) for r in rs]).mean(0)
            ax.plot(rs[0].diagnostic_steps[:n], vals, label=policy)
        ax.set_title(_panel_title(env, [r for v in by_policy.values() for r in v]))
        ax.set_xlabel(ROUND)
        ax.set_ylabel(ylabel or key)
    head = f"{title}: {key} (mean over seeds)" if title else f"{key} (mean over seeds)"
    return save_figure(fig, path, title=f"{head} — {_setting(runs)}" if runs else head)


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
    plot_regret(results, out / "regret.png", title)
    plot_time(results, out / "time.png", title)
    return table

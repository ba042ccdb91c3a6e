"""One way to draw and save a figure: explicit matplotlib ``Figure`` objects, never pyplot.

Every figure the library, the reproductions and the benchmarks write goes through
:func:`save_figure`, which gives it a title stating the setting, moves every legend below the
axes (off the data), adds the legend entry that says what a shaded band is, and stores the title
and each panel's labels in the PNG's metadata (``Title``, ``Description``) so a test can check a
saved file without looking at its pixels. Nothing here selects a backend or touches pyplot's
global figure list, so it draws the same in a script, a test or a notebook.

Typical use::

    fig, ax = figure_grid(figsize=(6, 4))
    plot_band(ax, curves, label="K-UCB")                     # curves: [seeds, T]
    ax.set(xlabel=ROUND, ylabel=CUM_REGRET, title="Bump, λ = 10")
    save_figure(fig, "fig.png", title=setting_title("Fig. 1", env="Bump", T=60, seeds=2),
                band=band_label(2))
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

__all__ = ["AGENT_MS", "CUM_REGRET", "CUM_SECONDS", "ROUND", "axes_labels", "band_label",
           "figure_grid", "mark_times", "plot_band", "save_figure", "setting_title"]

#: axis labels with their units, shared by every figure
ROUND = "round t"
CUM_REGRET = "cumulative regret (reward units)"
CUM_SECONDS = "cumulative agent time (s)"
AGENT_MS = "agent time per round (ms)"


def figure_grid(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Figure, Any]:
    """``(Figure, axes)`` like ``pyplot.subplots`` but outside pyplot: no backend is selected and
    no global figure list grows. ``figsize`` and ``layout`` (a layout engine: pass
    ``"constrained"`` before adding colour bars to a figure for :func:`save_figure`) go to the
    figure, the rest to ``Figure.subplots``."""
    fig = Figure(figsize=kwargs.pop("figsize", None), layout=kwargs.pop("layout", None))
    return fig, fig.subplots(nrows, ncols, **kwargs)


def setting_title(what: str, *, env: str | None = None, d: int | None = None,
                  T: int | None = None, seeds: int | None = None, extra: str | None = None,
                  quick: bool = False) -> str:
    """``"Figure 2 — RKHS function, d = 3, T = 25, 2 seeds, … (quick run)"``: what the figure
    shows and the setting it was run in, with the values actually used."""
    parts = [p for p in (env, None if d is None else f"d = {d}", None if T is None else f"T = {T}",
                         None if seeds is None else f"{seeds} seed{'s' if seeds != 1 else ''}",
                         extra) if p]
    text = what + (" — " + ", ".join(parts) if parts else "")
    return text + (" (quick run: small sizes)" if quick else "")


def band_label(seeds: int, kind: str = "std") -> str:
    """What a shaded band is: ``"shaded: mean ± 1 std over 5 seeds"`` (``kind="se"``: standard
    error of the mean). With one seed there is no band: ``""`` (no legend entry)."""
    if seeds < 2:
        return ""
    what = {"std": "1 std", "se": "1 standard error"}[kind]
    return f"shaded: mean ± {what} over {seeds} seeds"


def plot_band(ax: Axes, curves: np.ndarray, *, label: str, t: np.ndarray | None = None,
              kind: str = "std", color: Any = None, alpha: float = 0.2) -> Line2D:
    """Mean of ``curves`` ``[seeds, T]`` as a line, and mean ± 1 std (``kind="std"``, population
    std) or ± 1 standard error (``kind="se"``, ``std(ddof=1)/√seeds``) as a band of the same
    colour. ``t`` defaults to ``1..T``. Returns the line."""
    curves = np.atleast_2d(np.asarray(curves, dtype=float))
    t = np.arange(1, curves.shape[1] + 1) if t is None else np.asarray(t)
    mean = curves.mean(0)
    line, = ax.plot(t, mean, label=label, color=color)
    n = curves.shape[0]
    if n > 1:
        if kind == "se":
            half = curves.std(0, ddof=1) / math.sqrt(n)
        elif kind == "std":
            half = curves.std(0)
        else:
            raise ValueError(f"kind must be 'std' or 'se', got {kind!r}")
        ax.fill_between(t, mean - half, mean + half, alpha=alpha, color=line.get_color(), lw=0)
    return line


def mark_times(ax: Axes, times: Sequence[float], label: str, **style: Any) -> None:
    """Vertical lines at ``times`` (events: switches, restarts, tuned values) with one legend
    entry ``label`` for all of them."""
    style = {"color": "grey", "ls": "--", "lw": 0.9, **style}
    for i, x in enumerate(times):
        ax.axvline(x, label=label if i == 0 else None, **style)


def axes_labels(fig: Figure) -> list[dict[str, str]]:
    """Title, x label and y label of every visible panel of ``fig`` (colour bars excluded)."""
    return [{"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel()}
            for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def _legend_entries(fig: Figure) -> tuple[list[Artist], list[str]]:
    handles: list[Artist] = []
    labels: list[str] = []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    return handles, labels


def save_figure(fig: Figure, path: str | Path, *, title: str, band: str | None = None,
                extra_legend: Sequence[tuple[Artist, str]] = (), ncol: int | None = None,
                dpi: int = 110) -> Path:
    """Title ``fig`` with ``title`` (the setting), gather the legend entries of every panel into
    one legend below the panels (entries with the same label once), add ``band`` (what a shaded
    band is, e.g. :func:`band_label`) and ``extra_legend`` proxies as entries, and save it as PNG
    with ``Title`` and ``Description`` (JSON of :func:`axes_labels`) metadata. Returns the path."""
    if fig.get_layout_engine() is None:   # constrained: makes room for the legend outside
        fig.set_layout_engine("constrained")
    width = float(fig.get_figwidth())
    fig.suptitle("\n".join(textwrap.wrap(title, max(40, int(width * 13)))), fontsize=10)
    handles, labels = _legend_entries(fig)
    if band:
        handles.append(Patch(color="0.6", alpha=0.35))
        labels.append(band)
    for h, lab in extra_legend:
        handles.append(h)
        labels.append(lab)
    if handles:
        longest = max(len(lab) for lab in labels)
        fit = max(1, int(width * 14 / (longest + 6)))   # columns that fit the figure's width
        cols = min(ncol or 4, fit, len(handles))
        fig.legend(handles, labels, loc="outside lower center", ncol=cols, fontsize=8,
                   frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"Title": title, "Description": json.dumps(axes_labels(fig), ensure_ascii=False)}
    fig.savefig(path, dpi=dpi, metadata=meta)
    return path

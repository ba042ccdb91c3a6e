"""What every PNG a reproduction writes must say: read from the metadata that
:func:`torchbandits.experiments.figures.save_figure` stores (``Title``; ``Description`` = the
title and axis labels of every panel)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image


def figure_problems(path: Path, *, quick: bool = False) -> list[str]:
    """Why ``path`` is not a readable figure: no setting title, a panel without a title or an
    axis label, or (``quick``) a title that does not say it is a quick run. ``[]`` when fine."""
    with Image.open(path) as im:
        text = dict(getattr(im, "text", {}))
    title = text.get("Title", "")
    problems = [] if title.strip() else [f"{path.name}: no title"]
    if quick and "quick run" not in title:
        problems.append(f"{path.name}: quick-run figure whose title does not say so: {title!r}")
    try:
        panels = json.loads(text.get("Description", ""))
    except json.JSONDecodeError:
        return [*problems, f"{path.name}: no panel description (not saved by save_figure)"]
    if not panels:
        problems.append(f"{path.name}: no panels")
    for i, ax in enumerate(panels):
        for key in ("title", "xlabel", "ylabel"):
            if not ax.get(key, "").strip():
                problems.append(f"{path.name}: panel {i} has no {key}")
    return problems


def assert_readable_figures(folder: Path, *, quick: bool = False, at_least: int = 1) -> None:
    """Every ``*.png`` below ``folder`` is readable (:func:`figure_problems`); there are some."""
    pngs = sorted(Path(folder).rglob("*.png"))
    assert len(pngs) >= at_least, f"only {len(pngs)} figures under {folder}"
    problems = [p for png in pngs for p in figure_problems(png, quick=quick)]
    assert problems == [], "\n".join(problems)

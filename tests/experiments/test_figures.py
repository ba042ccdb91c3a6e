"""The figure helper: setting titles, band legends, legends below the panels, and the metadata
that lets a test read a saved figure's title and labels (the check itself can fail)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from torchbandits.experiments.figures import (
    CUM_REGRET,
    ROUND,
    band_label,
    figure_grid,
    mark_times,
    plot_band,
    save_figure,
    setting_title,
)

from ..figure_checks import figure_problems


def test_setting_title_and_band_label_say_the_actual_values():
    assert setting_title("Fig. 1", env="Bump", d=5, T=60, seeds=1, quick=True) == \
        "Fig. 1 — Bump, d = 5, T = 60, 1 seed (quick run: small sizes)"
    assert setting_title("Fig. 2", T=1000, seeds=10) == "Fig. 2 — T = 1000, 10 seeds"
    assert band_label(5) == "shaded: mean ± 1 std over 5 seeds"
    assert band_label(3, "se") == "shaded: mean ± 1 standard error over 3 seeds"
    assert band_label(1) == ""
    with pytest.raises(KeyError):
        band_label(2, "iqr")


def test_plot_band_draws_mean_and_the_stated_band():
    _fig, ax = figure_grid()
    curves = np.array([[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]])
    line = plot_band(ax, curves, label="a", kind="se")
    assert np.allclose(line.get_ydata(), [1.0, 2.0, 4.0])
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    half = curves.std(0, ddof=1) / np.sqrt(2)
    assert np.isclose(ys.max(), (curves.mean(0) + half).max())
    assert np.isclose(ys.min(), (curves.mean(0) - half).min())
    with pytest.raises(ValueError, match="kind"):
        plot_band(ax, curves, label="b", kind="iqr")


def test_saved_figure_has_its_title_labels_and_one_legend_below(tmp_path):
    fig, axes = figure_grid(1, 2, figsize=(8, 3.5))
    for ax in axes:
        plot_band(ax, np.random.default_rng(0).random((3, 20)).cumsum(1), label="K-UCB")
        mark_times(ax, [5, 12], "switch")
        ax.set(xlabel=ROUND, ylabel=CUM_REGRET, title="panel")
        ax.legend()
    path = save_figure(fig, tmp_path / "f.png",
                       title=setting_title("Fig", T=20, seeds=3, quick=True), band=band_label(3))
    assert all(ax.get_legend() is None for ax in axes)          # per-panel legends removed
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["K-UCB", "switch", "shaded: mean ± 1 std over 3 seeds"]   # each once
    assert legend.get_window_extent().y1 <= min(ax.get_window_extent().y0 for ax in axes) + 1
    with Image.open(path) as im:
        assert im.text["Title"].startswith("Fig — T = 20, 3 seeds")
        assert json.loads(im.text["Description"])[0]["xlabel"] == ROUND
    assert figure_problems(path, quick=True) == []


def test_the_check_finds_an_unlabelled_panel_and_an_unsaid_quick_run(tmp_path):
    fig, (a, b) = figure_grid(1, 2)
    a.plot([0, 1])
    a.set(title="t", xlabel="x")
    b.set(title="t", xlabel="x", ylabel="y")
    path = save_figure(fig, tmp_path / "bad.png", title="Fig — T = 5")
    assert figure_problems(path) == ["bad.png: panel 0 has no ylabel"]
    assert len(figure_problems(path, quick=True)) == 2
    fig, _ax = figure_grid()
    fig.savefig(tmp_path / "plain.png")                          # not through save_figure
    assert figure_problems(tmp_path / "plain.png")[0] == "plain.png: no title"

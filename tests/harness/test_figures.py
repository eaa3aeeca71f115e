"""The figures a reader compares: the main title clear of every panel, the distance
histograms on one x and one y axis (in units of each method's mean negative distance), the
cost figure's columns on one y axis. Each figure is rendered (Agg) and its laid-out boxes read
back, so an overlap or a panel with its own range fails here, not in a reader's eyes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.core.plugins import load_methods
from harness.report import figures

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
# three methods whose raw distances span 0.15, 2 and 25: one axis must still fit them all
SCALES = ("quadruplet_euclidean", "contrastive", "lifted_structure")


@pytest.fixture
def drawn(monkeypatch):
    """The figures the functions would save, laid out and kept for inspection."""
    kept = []

    def keep(fig, out_png):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig).draw()
        kept.append(fig)
        return Path(out_png)

    monkeypatch.setattr(figures, "_save", keep)
    load_methods([])
    return kept


def _runs(protocol: str, methods=None) -> list[Path]:
    paths = sorted((REFERENCE / "runs" / protocol).glob("*/seed*.json"))
    return [p for p in paths if methods is None or p.parent.name in methods]


def _title_clear_of_panels(fig) -> None:
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        if ax.get_visible() and ax.axison:
            box = ax.get_tightbbox(renderer)
            assert not title.overlaps(box), f"the main title overlaps the panel {ax.get_title()!r}"


def test_distance_histograms_share_both_axes_and_their_title_is_clear(drawn, tmp_path):
    figures.distance_histograms(_runs("default", SCALES), tmp_path / "d.png", "distances")
    fig = drawn[0]
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == sorted(SCALES)
    assert len({ax.get_xlim() for ax in panels}) == 1 and len({ax.get_ylim() for ax in panels}) == 1
    low, high = panels[0].get_xlim()
    assert low == 0 and 1.2 < high <= 4  # the negatives (mean 1) and their tail, all methods
    _title_clear_of_panels(fig)
    # every method's negatives have mean 1 on the shared axis, whatever its raw scale
    for path in _runs("default", SCALES)[::3]:
        edges, dens = figures._relative(json.loads(path.read_text())["distances"])
        centres, widths = (edges[:-1] + edges[1:]) / 2, np.diff(edges)
        assert np.isclose((centres * dens["negative"] * widths).sum(), 1.0)


def test_relative_histogram_is_a_density_around_the_mean_negative():
    hist = {"edges": [0.0, 1.0, 2.0, 3.0, 4.0], "positive": [3, 1, 0, 0],
            "negative": [0, 1, 2, 1]}  # fmt: skip
    edges, dens = figures._relative(hist)
    # mean negative distance: (1.5 + 2 * 2.5 + 3.5) / 4 = 2.5
    assert np.allclose(edges, [0, 0.4, 0.8, 1.2, 1.6])
    for key in ("positive", "negative"):
        assert np.isclose((dens[key] * np.diff(edges)).sum(), 1.0)
    assert np.allclose(dens["positive"], [0.75 / 0.4, 0.25 / 0.4, 0, 0])
    assert figures._relative({"edges": [0, 0, 0], "positive": [1, 0], "negative": [1, 0]}) is None


def test_training_curves_title_is_clear_and_epochs_are_whole(drawn, tmp_path):
    figures.training_curve(_runs("tuning"), tmp_path / "t.png", "Training loss — tuning")
    fig = drawn[0]
    _title_clear_of_panels(fig)
    validation = [ax for ax in fig.axes if ax.get_ylabel().startswith("validation")]
    assert len(validation) > 1 and len({ax.get_ylim() for ax in validation}) == 1
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)


def test_cost_figure_columns_share_y_and_title_is_clear(drawn, tmp_path):
    record = json.loads((REFERENCE / "cost" / "default.json").read_text())
    figures.cost_figure(record, tmp_path / "c.png")
    fig = drawn[0]
    _title_clear_of_panels(fig)
    grid = np.array(fig.axes).reshape(-1, 3)
    for column in grid.T:
        assert len({ax.get_ylim() for ax in column}) == 1

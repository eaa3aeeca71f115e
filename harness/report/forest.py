"""Is a method better than another on one protocol: forest plots, and for a tuned protocol a
dumbbell plot of tuning's effect.

A forest plot draws the leaderboard's main column: each method's mean of the protocol's main
metric and its 95 % t-interval over seeds, best first, the rows the tests cannot tell from
the best shaded apart from those significantly below it, and the row that trained nothing
(the pretrained network's zero-shot features, or `untrained` from scratch) as a reference
line. Its numbers come from the same functions as the table's cells (per_seed, t_interval,
against_best); tests/harness/test_glance.py holds the two to the same strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.records import (
    RunResult,
    completeness,
    main_metric,
    per_seed,
    pretrained,
    row_names,
    tuned_values,
    untrained_row,
)
from harness.report.figures import _figure, _save
from harness.report.tuned import _cell, _mean
from harness.report.verdicts import ALPHA, against_best
from harness.stats import compare, t_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SHADE_TIED = "#dcebd6"  # rows the seeds cannot tell from the best
SHADE_UNTESTED = "#ececec"


@dataclass(frozen=True)
class ForestRow:
    """One row: its name as the table shows it, its per-seed values of the main metric, and
    the table's `vs best` mark."""

    name: str
    values: dict[int, float]
    mark: str
    complete: bool = True

    @property
    def mean(self) -> float:
        return _mean(self.values)

    def cell(self) -> str:
        """The value as the tables write it: `42.7 ± 0.7` (percent), one seed alone."""
        return _cell(self.values)

    @property
    def half(self) -> float:
        """The 95 % t-interval's half-width (NaN for one seed)."""
        return t_interval(list(self.values.values()))[1]


@dataclass(frozen=True)
class Forest:
    """A forest plot's content: the protocol, its main metric, the rows best first, the
    reference row (trained no step) drawn as a line, or None, and whether the rows are the
    protocol's tuned ranking."""

    protocol: str
    metric: str
    rows: list[ForestRow]
    reference: ForestRow | None
    reference_label: str
    tuned: bool = False

    @property
    def title(self) -> str:
        tuned = ", tuned" if self.tuned else ""
        return f"{self.protocol}{tuned}: {self.metric}, {len(self.rows)} methods"


def _rows(values: dict[str, dict[int, float]], complete: dict[str, bool]) -> list[ForestRow]:
    """The rows best first (complete rows before incomplete ones, as the table ranks them),
    marked against the best of the complete rows as the table marks them."""
    _, marks = against_best({n: v for n, v in values.items() if complete.get(n, True)})
    rows = [ForestRow(n, v, marks.get(n, "incomplete: untested"), complete.get(n, True))
            for n, v in values.items() if v]  # fmt: skip
    return sorted(rows, key=lambda r: (not r.complete, -r.mean))


def forest(group: list[RunResult], protocol: str) -> Forest:
    """One protocol's forest: its main table's rows (a protocol with `+tuned` runs: its tuned
    ranking, as the tuned table's `vs best, tuned` column gives it)."""
    metric = main_metric(group)
    if any(r.tuning for r in group):
        _, values, _ = tuned_values(group, metric)
        complete = {n: True for n in values}
    else:
        values = per_seed(group, metric)
        names = row_names(group)
        complete = {n: not completeness([r for r in group if names[id(r)] == n])[2]
                    for n in values}  # fmt: skip
    rows = _rows(values, complete)
    ref = untrained_row(group)
    reference = next((r for r in rows if r.name == ref), None)
    label = "zero-shot features" if pretrained(group) else "random weights"
    rows = [r for r in rows if r is not reference]
    return Forest(protocol, metric, rows, reference, label, any(r.tuning for r in group))


def mark_kind(mark: str) -> str:
    """A table's `vs best` mark as one of STYLE's kinds: best, tied, below, untested."""
    if mark == "best":
        return "best"
    if mark.startswith("≈"):
        return "tied"
    if mark.startswith(("below", "above")):
        return "below"
    return "untested"


STYLE = {  # marker, face colour, label
    "best": ("D", "#1a7f37", "best"),
    "tied": ("o", "#1a7f37", "≈ best: the seeds cannot tell it from the best"),
    "below": ("o", "#555555", "below the best (paired t-test, BH-adjusted, 5 %)"),
    "untested": ("o", "white", "untested (one seed or incomplete)"),
}


def _right_labels(ax: Axes, labels: list[str]) -> None:
    """The values as the table writes them, as tick labels on the right: never overlapping."""
    twin = ax.twinx()
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(range(len(labels)), labels, fontsize=8.5)
    twin.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        twin.spines[side].set_visible(False)


def forest_figure(f: Forest, out_png: Path) -> Path:
    """The forest plot as a PNG (see forest_drawing)."""
    return _save(forest_drawing(f), out_png)


def forest_drawing(f: Forest) -> Figure:
    """The forest plot: one line per method, names in full, best at the top."""
    n = len(f.rows)
    fig = _figure(figsize=(8.4, 1.5 + 0.27 * max(n, 3)))
    ax = fig.subplots()
    for y, row in enumerate(f.rows):
        kind = mark_kind(row.mark)
        if kind in ("best", "tied", "untested"):
            ax.axhspan(y - 0.5, y + 0.5, color=SHADE_TIED if kind != "untested" else SHADE_UNTESTED,
                       zorder=0, lw=0)  # fmt: skip
        marker, face, _ = STYLE[kind]
        half = 0.0 if math.isnan(row.half) else row.half
        ax.errorbar(100 * row.mean, y, xerr=100 * half, fmt=marker, ms=6 if kind == "best" else 5,
                    mfc=face, mec="#222222", ecolor="#333333", elinewidth=1.3, capsize=2.5)  # fmt: skip
    kinds = {mark_kind(r.mark) for r in f.rows}
    handles = [ax.scatter([], [], marker=m, c=c, edgecolors="#222222", label=label)
               for kind, (m, c, label) in STYLE.items() if kind in kinds]  # fmt: skip
    if f.reference is not None:
        ref = f.reference
        name = f"{ref.name} ({f.reference_label})"
        handles.append(ax.axvline(100 * ref.mean, color="#b42318", ls="--", lw=1.3,
                                  label=f"{name}: {ref.cell()}"))  # fmt: skip
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [r.name for r in f.rows], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    ax.grid(True, axis="x", alpha=0.35)
    ax.set_xlabel(f"{f.metric} (%): mean and 95 % t-interval over seeds", fontsize=9)
    _right_labels(ax, [r.cell() for r in f.rows])
    ax.set_title(f.title, fontsize=11)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06 - 1.2 / (n + 6)),
              ncol=2, frameon=False)  # fmt: skip
    return fig


@dataclass(frozen=True)
class Dumbbell:
    """One line of the dumbbell plot: a method's paper-default and tuned values, and what
    tuning did (`up`, `down`, `noise`: the paired test of the tuned table's `tuning moved it`;
    `not tuned`)."""

    name: str
    default: ForestRow | None
    tuned: ForestRow
    moved: str


def dumbbells(group: list[RunResult]) -> list[Dumbbell]:
    """Each method of a tuned protocol, best tuned first (the tuned table's order)."""
    metric = main_metric(group)
    default, tuned, notes = tuned_values(group, metric)
    lines = []
    for name, values in tuned.items():
        before = default.get(name)
        moved = "not tuned"
        if before and name not in notes:
            c = compare(values, before)
            moved = "noise" if not c.p < ALPHA else ("up" if c.difference > 0 else "down")
        lines.append(Dumbbell(name, ForestRow(name, before, "") if before else None,
                              ForestRow(name, values, ""), moved))  # fmt: skip
    return sorted(lines, key=lambda d: -d.tuned.mean)


MOVED = {"up": "#1a7f37", "down": "#b42318", "noise": "#9a9a9a", "not tuned": "#9a9a9a"}


def dumbbell_figure(lines: list[Dumbbell], protocol: str, metric: str, out_png: Path) -> Path:
    """The dumbbell plot as a PNG (see dumbbell_drawing)."""
    return _save(dumbbell_drawing(lines, protocol, metric), out_png)


def dumbbell_drawing(lines: list[Dumbbell], protocol: str, metric: str) -> Figure:
    """Paper default (hollow) and tuned (filled) per method, joined by a line coloured by
    whether tuning moved it significantly."""
    n = len(lines)
    fig = _figure(figsize=(8.4, 1.5 + 0.27 * max(n, 3)))
    ax = fig.subplots()
    for y, d in enumerate(lines):
        tuned = 100 * d.tuned.mean
        if d.default is not None:
            before = 100 * d.default.mean
            ax.plot([before, tuned], [y, y], color=MOVED[d.moved], lw=2.2, zorder=1)
            ax.scatter([before], [y], s=30, facecolors="white", edgecolors="#222222", zorder=2)
        ax.scatter([tuned], [y], s=34, c="#222222", zorder=3)
    labels = [f"{100 * d.default.mean:.1f} → {100 * d.tuned.mean:.1f}" if d.default and
              d.moved != "not tuned" else f"{100 * d.tuned.mean:.1f} (not tuned)" for d in lines]  # fmt: skip
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [d.name for d in lines], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    ax.grid(True, axis="x", alpha=0.35)
    ax.set_xlabel(f"{metric} (%): mean over seeds", fontsize=9)
    _right_labels(ax, labels)
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", ls="", mfc="white", mec="#222222", label="paper default"),
        Line2D([], [], marker="o", ls="", color="#222222", label="tuned"),
        *[Line2D([], [], color=MOVED[k], lw=2.2, label=label) for k, label in (
            ("up", "tuning moved it up (paired t-test, 5 %)"),
            ("down", "tuning moved it down"), ("noise", "within the seeds' noise"))],
    ]  # fmt: skip
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06 - 1.2 / (n + 6)),
              ncol=3, frameon=False)  # fmt: skip
    ax.set_title(f"{protocol}: tuned against paper defaults, {metric}", fontsize=11)
    return fig

"""Figures: the cost of mining against the batch size, training curves, and the distances of
positive and negative pairs (as in HDC's histogram figure).

matplotlib through its object API and the Agg canvas: no pyplot, no display, no global
backend switch, so this works in tests, on servers and inside other programs alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core import FAMILIES, family_of
from harness.records import read_result

if TYPE_CHECKING:  # matplotlib loads when a figure is drawn, not with every command
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _figure(**options: Any) -> Figure:
    """A matplotlib Figure (imported here: see TYPE_CHECKING above) with the constrained
    layout, which, unlike tight_layout, makes room for the main title and outside legends, so
    the title never overlaps the first row of panels."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **options)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")


def MaxNLocator(**options: Any) -> Any:  # noqa: N802 (matplotlib's class, loaded on use)
    """matplotlib's MaxNLocator (imported here: see TYPE_CHECKING above)."""
    from matplotlib.ticker import MaxNLocator as locator

    return locator(**options)


def _save(fig: Figure, out_png: Path) -> Path:
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    tmp = out_png.with_name(f".{out_png.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    tmp.replace(out_png)
    return out_png


# matplotlib's default cycle without its grey (the guide lines are grey), then darker extras
COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9",
           "#000000", "#17365c", "#7a1f1f", "#2f5f1f", "#6b4a00", "#5a2a6e", "#00646e")  # fmt: skip


def _style(i: int) -> dict[str, Any]:
    """Distinct colour and marker per line, readable for up to ~20 methods."""
    return {
        "color": COLOURS[i % len(COLOURS)],
        "marker": MARKERS[i % len(MARKERS)],
        "linestyle": "-" if i < len(COLOURS) else "--",
    }


def _guides(ax: Axes, sizes: Sequence[float], anchor: float) -> None:
    """Grey reference lines through (smallest m, anchor) growing as m and as m^2."""
    m = np.array([min(sizes), max(sizes)], dtype=float)
    for power, style in ((1, ":"), (2, "--")):
        label = "∝ m" if power == 1 else "∝ m²"
        ax.plot(m, anchor * (m / m[0]) ** power, style, color="0.55", lw=1.2, label=label)


def _log_axes(ax: Axes, sizes: Sequence[int], ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(sizes))
    ax.set_xticklabels([str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size m")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)


def by_family(names: Iterable[str], family: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Method names grouped by family (harness.core.FAMILIES order, then "other"); `family`
    overrides the registry's answer (a cost record carries each method's family)."""

    family = family or {}
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(family.get(name) or family_of(name), []).append(name)
    order = [*FAMILIES, "other"]
    return {
        f: groups[f] for f in sorted(groups, key=lambda f: order.index(f) if f in order else 99)
    }


def _context(ax: Axes, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Another family's line, thin and grey behind the panel's own: where this family lies
    among all methods, without a legend entry."""
    ax.plot(xs, ys, color="0.82", lw=0.8, zorder=1, label="_context")


def cost_figure(record: dict[str, Any], out_png: Path) -> Path:
    """From a cost record (results/cost/<protocol>.json): mining time, loss forward+backward
    time and pair scores evaluated against m, log-log, with m and m^2 guide lines. One row of
    panels per family of methods (pairs, triplets, quadruplets, ...), the row's methods in
    colour and every other method in light grey, so the figure stays readable at any number
    of methods. Methods without a miner have no mining line (nothing to draw on log axes)."""
    sizes = record["settings"]["batch_sizes"]
    panels = (
        ("mining_ms", "milliseconds", "mining time"),
        ("loss_ms", "milliseconds", "loss forward + backward time"),
        ("evaluated", "pair distances / scores", "work of the miner (pairs evaluated)"),
    )
    entries = {e["method"]: e for e in record["methods"] if e.get("status") == "ok"}
    families = by_family(entries, {n: e.get("family", "") for n, e in entries.items()})
    rows = max(1, len(families))
    fig = _figure(figsize=(16, 3.9 * rows + 0.6))
    # one y range per column: a family's mining time reads against the other families'
    grid = np.atleast_2d(fig.subplots(rows, 3, squeeze=False, sharey="col"))
    for r, (family, names) in enumerate(families.items() or [("", [])]):
        handles: dict[str, Any] = {}
        for ax, (key, ylabel, title) in zip(grid[r], panels, strict=True):
            lowest = []
            for name, entry in entries.items():
                cells = [c for c in entry["measurements"] if c.get(key)]
                if not cells:
                    continue
                xs = [c["batch_size"] for c in cells]
                ys = [c[key] for c in cells]
                if name not in names:
                    _context(ax, xs, ys)
                    continue
                style = _style(names.index(name))
                (line,) = ax.plot(xs, ys, label=name, ms=5, lw=1.6, zorder=3, **style)
                handles.setdefault(name, line)
                lowest.append(ys[0] if xs[0] == min(sizes) else ys[0] / (xs[0] / min(sizes)))
            _log_axes(ax, sizes, ylabel, f"{family}: {title}" if family else title)
            if lowest:
                _guides(ax, sizes, float(np.exp(np.mean(np.log(lowest)))))
            else:
                ax.text(0.5, 0.5, "nothing measured", ha="center", va="center",
                        transform=ax.transAxes)  # fmt: skip
        guides = [h for h in grid[r][1].get_lines() if h.get_label().startswith("∝")]
        grid[r][2].legend(
            list(handles.values()) + guides,
            list(handles) + [h.get_label() for h in guides],
            loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, fontsize=9,
        )  # fmt: skip
    p = record["protocol"]
    device = record.get("environment", {}).get("hardware", {}).get("device", "?")
    fig.suptitle(
        f"Cost against batch size m = P x {record['settings']['images_per_class']} — protocol "
        f"{p['name']} v{p['version']}, {device}, median of up to {record['settings']['repeats']} "
        "repeats; grey: the other families; each column shares its y axis",
        fontsize=12,
    )
    return _save(fig, out_png)


def _read_curves(
    result_paths: Iterable[Path],
) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]], str, set[str]]:
    """Per method, the training-loss curve and the validation curve of each finished seed."""
    curves: dict[str, list[list[float]]] = {}
    validation: dict[str, list[list[float]]] = {}
    metric = ""
    protocols = set()
    for path in result_paths:
        result = read_result(path)
        losses = result.training.epoch_loss or []
        if not result.ok or not losses:
            continue
        name = result.method.name
        curves.setdefault(name, []).append([float(v) for v in losses])
        selection = result.selection
        if selection is not None and selection.per_epoch:
            validation.setdefault(name, []).append([float(v) for v in selection.per_epoch])
            metric = selection.metric or metric
        protocols.add(result.protocol.name)
    return curves, validation, metric, protocols


def _plot_runs(ax: Axes, name: str, runs: list[list[float]], style: dict[str, Any]) -> None:
    """The mean over seeds, with a band from the lowest to the highest seed."""
    length = min(len(r) for r in runs)
    values = np.array([r[:length] for r in runs])
    epochs = np.arange(1, length + 1)
    label = name if len(runs) == 1 else f"{name} ({len(runs)} seeds)"
    ax.plot(epochs, values.mean(0), label=label, ms=4, lw=1.6, **style)
    if len(runs) > 1:
        ax.fill_between(epochs, values.min(0), values.max(0), color=style["color"], alpha=0.15)


def training_curve(result_paths: Iterable[Path], out_png: Path, title: str | None = None) -> Path:
    """Training loss against epoch from run results (results/runs/<protocol>/<method>/
    seed<k>.json, `training.epoch_loss`): one panel per family of methods, one line per
    method, the mean over its seeds (a band from the lowest to the highest seed when there
    are several). Runs without a loss curve (failed, untrained) are left out. Log y where
    every loss is positive, because the methods' losses differ by orders of magnitude. When
    the runs selected on a validation split, a second column shows the selection metric per
    epoch (the PDDM paper's Fig. 4)."""
    curves, validation, metric, protocols = _read_curves(result_paths)
    families = by_family(curves) or {"": []}
    cols = 2 if validation else 1
    fig = _figure(figsize=(8 * cols, 3.8 * len(families) + 0.6))
    # one epoch axis for all; the validation column on one y range, so families compare (the
    # losses are each method's own and are not comparable across methods)
    grid = np.atleast_2d(fig.subplots(len(families), cols, squeeze=False, sharex=True))
    if cols == 2:
        for panel in grid[1:, 1]:
            panel.sharey(grid[0][1])
    for r, (family, names) in enumerate(families.items()):
        ax = grid[r][0]
        for i, name in enumerate(names):
            _plot_runs(ax, name, curves[name], _style(i))
            if cols == 2 and name in validation:
                _plot_runs(grid[r][1], name, validation[name], _style(i))
        if names and all(v > 0 for n in names for run in curves[n] for v in run):
            ax.set_yscale("log")
        ax.set_ylabel("mean training loss over the epoch")
        ax.set_title(f"{family}: training loss" if family else "training loss", fontsize=11)
        if cols == 2:
            grid[r][1].set_ylabel(f"validation {metric}")
            grid[r][1].set_title(f"{family}: selection metric on the validation classes",
                                 fontsize=11)  # fmt: skip
        for panel in grid[r]:
            panel.set_xlabel("epoch")
            panel.xaxis.set_major_locator(MaxNLocator(integer=True))
            panel.xaxis.set_tick_params(labelbottom=True)
            panel.grid(True, alpha=0.3)
        if names:
            grid[r][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False,
                               fontsize=9)  # fmt: skip
    if not curves:
        grid[0][0].text(0.5, 0.5, "no finished run with a training loss", ha="center",
                        va="center", transform=grid[0][0].transAxes)  # fmt: skip
    fig.suptitle(title or f"Training loss — {', '.join(sorted(protocols)) or 'no runs'}")
    return _save(fig, out_png)


def _relative(hist: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """A method's histogram with distances in units of its mean negative-pair distance, as
    densities (None when every distance is 0 or there are no negatives): rankings and
    thresholds do not change with the embedding's scale, so on this axis the 29 methods'
    overlaps compare, where raw distances span 0.1 for one method and 25 for another."""
    edges = np.asarray(hist["edges"], dtype=float)
    negative = np.asarray(hist["negative"], dtype=float)
    centres = (edges[:-1] + edges[1:]) / 2
    if negative.sum() <= 0 or not (np.diff(edges) > 0).all():
        return None
    scale = float((centres * negative).sum() / negative.sum())
    if scale <= 0:
        return None
    rel = edges / scale
    densities = {}
    for key in ("positive", "negative"):
        counts = np.asarray(hist[key], dtype=float)
        if counts.sum() > 0:
            densities[key] = counts / counts.sum() / np.diff(rel)
    return rel, densities


def distance_histograms(result_paths: Iterable[Path], out_png: Path, title: str) -> Path:
    """One panel per method: the densities of its test split's positive and negative pair
    distances (`distances` in its result, the first finished seed), as in HDC's figure: the
    less the two overlap, the better one distance threshold separates same from different.
    Densities, so the many more negatives do not flatten the positives; distances divided by
    the method's mean negative distance, and every panel on the same x and y axes, so that
    any two panels compare."""
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(result_paths):
        result = read_result(path)
        if result.ok and result.distances:
            records.setdefault(result.method.name, result.distances)
    names = sorted(records)
    cols = min(4, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig = _figure(figsize=(3.4 * cols, 2.5 * rows + 0.7))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)).ravel()
    right = 0.0
    for ax, name in zip(axes, names, strict=False):
        relative = _relative(records[name])
        if relative is None:  # a collapsed embedding: every distance 0, no density
            ax.text(0.5, 0.5, "all distances 0", ha="center", va="center", fontsize=8,
                    transform=ax.transAxes)  # fmt: skip
        else:
            edges, densities = relative
            for key, colour in (("positive", "C2"), ("negative", "C3")):
                if key in densities:
                    ax.stairs(densities[key], edges, fill=True, color=colour, alpha=0.55,
                              label=f"{key} pairs")  # fmt: skip
                    mass = np.cumsum(densities[key] * np.diff(edges))
                    right = max(right, float(edges[1:][mass >= 0.995].min()))
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(names) :]:
        ax.axis("off")
    for ax in axes[max(0, len(names) - cols) : len(names)]:  # the lowest panel of each column
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("distance ÷ mean negative", fontsize=8)
    if right > 0:  # 99.5 % of every method's pairs
        axes[0].set_xlim(0, min(right, 4.0))
    if not names:
        axes[0].text(0.5, 0.5, "no finished run with distances", ha="center", va="center",
                     transform=axes[0].transAxes)  # fmt: skip
    elif axes[0].get_legend_handles_labels()[0]:  # a panel with bars to name
        axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"{title}\nx: Euclidean distance ÷ the method's mean negative-pair distance; "
                 "y: density; all panels share both axes", fontsize=11)  # fmt: skip
    return _save(fig, out_png)

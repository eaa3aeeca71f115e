"""What the model retrieves: a grid of test queries, each followed by its top-k retrieved
images, framed green (same class as the query) or red (another class), drawn from a run's
saved embeddings folder (`run --save-embeddings`) and the protocol's own data.

Which rows: harness.evaluate.retrieval_rows (the worst, the best, then random ones, the same
for the same folder and options). Which neighbours: those the run itself ranked (neighbours.npy, by its own scorer,
Euclidean or learned); a format-1 folder (saved before neighbours.npy) is ranked again by
Euclidean distance, which only a Euclidean run's ranking is.

matplotlib through its object API and the Agg canvas, as harness.report.figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from harness.core import HarnessError
from harness.core.page_style import CORRECT_COLOUR, QUERY_COLOUR, WRONG_COLOUR
from harness.data import prepare_data
from harness.evaluate import AVERAGE_PRECISION, load_embeddings
from harness.evaluate.ranked import (
    dataset_indices,
    query_average_precision,
    query_gallery_rows,
    ranked_neighbours,
    ranking_name,
    run_protocol,
)
from harness.evaluate.retrieval_rows import RetrievalRow, RowChoice, select_rows

if TYPE_CHECKING:  # matplotlib loads when a grid is drawn, not with every command
    from matplotlib.figure import Figure

# the grid's geometry, in inches at DPI dots per inch (fixed: a grid's pixel size is known)
DPI = 100
CELL = 0.9  # one image's square
GAP = 0.1  # between two cells
QUERY_GAP = 0.3  # between the query and its first neighbour
LEFT = 1.5  # the row labels
TOP = 0.85  # the title and the column headers
MARGIN = 0.15  # right and bottom
FRAME_POINTS = 4.0  # frame line width


def draw_retrieval_grid(
    folder: Path, out_png: Path, choice: RowChoice | None = None, data_root: Path | None = None
) -> Path:
    """Draw the retrieval grid of a run's saved embeddings folder (seed<k>.embeddings) into
    `out_png` (the rows `choice` says, show's defaults if None); returns its path. The images
    come from the run's protocol's data (the result beside the folder says which protocol; `data_root` for a dataset read from disk), checked
    to be the run's: their labels must equal the saved ones. HarnessError, one line, for a
    folder that cannot be drawn (see harness.cli.show)."""
    folder = Path(folder)
    choice = RowChoice() if choice is None else choice  # show's defaults
    choice.check()
    k = choice.k
    saved = load_embeddings(folder)
    query_rows, gallery_rows = query_gallery_rows(saved)
    ranked = len(gallery_rows) - int(saved.is_query is None)  # all-vs-all: not the query itself
    if k > ranked:
        raise HarnessError(f"--k {k} is more than the {ranked} gallery images each query ranks; "
                           "pass a smaller --k")  # fmt: skip
    protocol = run_protocol(folder, saved)
    prepared = prepare_data(protocol, None if data_root is None else str(data_root))
    indices = dataset_indices(saved, prepared.split)
    data = prepared.data
    if indices.max(initial=-1) >= len(data.labels) or not np.array_equal(
        data.labels[indices], saved.labels
    ):
        where = f"under --data-root {data_root}" if data_root else "built without --data-root"
        raise HarnessError(f"the data {where} is not what this run used: its labels differ "
                           "from the saved ones; pass the run's --data-root")  # fmt: skip
    neighbours = ranked_neighbours(folder, saved, k)
    ap = query_average_precision(saved)
    query_labels, gallery_labels = saved.labels[query_rows], saved.labels[gallery_rows]
    rows = select_rows(ap, neighbours, query_labels, gallery_labels, choice)
    if not rows:
        raise HarnessError(f"{folder}: no query has another image of its class to retrieve")
    title = (f"What {saved.meta.get('method')} retrieves: {protocol.name} v{protocol.version}, "
             f"seed {saved.meta.get('seed')}, top {k} by {ranking_name(saved)}")  # fmt: skip
    fig = _grid(rows, k, title)
    for r, row in enumerate(rows):
        dataset_rows = [indices[query_rows[row.query]]]
        dataset_rows += [indices[gallery_rows[g]] for g in row.neighbours]
        pictures = _images(data.images, np.asarray(dataset_rows, dtype=np.int64))
        _draw_row(fig, rows, k, r, pictures, int(query_labels[row.query]))
    return _save(fig, Path(out_png))


def _draw_row(fig: Figure, rows: list[RetrievalRow], k: int, r: int,
              pictures: list[np.ndarray], query_class: int) -> None:  # fmt: skip
    """Row r of the grid: the query framed blue, its neighbours green or red, its label."""
    row = rows[r]
    for c, picture in enumerate(pictures):
        colour = QUERY_COLOUR if c == 0 else (
            CORRECT_COLOUR if row.correct[c - 1] else WRONG_COLOUR)  # fmt: skip
        _cell(fig, rows, k, r, c, picture, colour)
    x, y, _, h = cell_rect(len(rows), k, r, 0)
    label = (f"{row.kind} #{row.query}\nclass {query_class}\n"
             f"MAP@R {row.average_precision:.2f}")  # fmt: skip
    fig.text(x - 0.1 / grid_size(len(rows), k)[0], y + h / 2, label, ha="right",
             va="center", fontsize=8)  # fmt: skip


def _images(images: object, rows: np.ndarray) -> list[np.ndarray]:
    """The images at `rows` as [H, W] or [H, W, 3] floats in [0, 1], each scaled to its own
    range (uint8 pixels or normalised floats alike)."""
    batch = images[rows]  # type: ignore[index]
    if not isinstance(batch, torch.Tensor):
        batch = batch.load()  # a lazy image store's view
    out = []
    for image in batch.detach().cpu().to(torch.float64).numpy():
        low, high = float(image.min()), float(image.max())
        scaled = (image - low) / (high - low) if high > low else np.zeros_like(image)
        out.append(scaled[0] if scaled.shape[0] == 1 else np.moveaxis(scaled[:3], 0, -1))
    return out


def grid_size(num_rows: int, k: int) -> tuple[float, float]:
    """The grid's (width, height) in inches: its pixel size is these times DPI."""
    width = LEFT + CELL * (k + 1) + GAP * (k - 1) + QUERY_GAP + MARGIN
    height = TOP + CELL * num_rows + GAP * (num_rows - 1) + MARGIN
    return width, height


def cell_rect(num_rows: int, k: int, row: int, column: int) -> tuple[float, float, float, float]:
    """(left, bottom, width, height) of one cell in figure fractions; column 0 is the query."""
    width, height = grid_size(num_rows, k)
    left = LEFT + column * CELL + (QUERY_GAP + (column - 1) * GAP if column else 0.0)
    top = TOP + row * (CELL + GAP)
    return left / width, 1.0 - (top + CELL) / height, CELL / width, CELL / height


def _grid(rows: list[RetrievalRow], k: int, title: str) -> Figure:
    from matplotlib.figure import Figure

    width, height = grid_size(len(rows), k)
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.suptitle(title, x=0.5, y=1.0 - 0.1 / height, va="top", fontsize=10)
    legend = (f"frame: green = same class as the query, red = another class; "
              f"rows: worst and best by {AVERAGE_PRECISION.upper()}, then random")  # fmt: skip
    fig.text(0.5, 1.0 - 0.38 / height, legend, ha="center", va="top", fontsize=8)
    for column in range(k + 1):
        x, y, w, h = cell_rect(len(rows), k, 0, column)
        fig.text(x + w / 2, y + h + 0.04 / height, "query" if column == 0 else str(column),
                 ha="center", va="bottom", fontsize=8)  # fmt: skip
    return fig


def _cell(fig: Figure, rows: list[RetrievalRow], k: int, row: int, column: int,
          picture: np.ndarray, colour: str) -> None:  # fmt: skip
    ax = fig.add_axes(cell_rect(len(rows), k, row, column))
    gray = picture.ndim == 2
    ax.imshow(picture, cmap="gray" if gray else None, vmin=0.0, vmax=1.0,
              interpolation="nearest", aspect="auto")  # fmt: skip
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor(colour)
        spine.set_linewidth(FRAME_POINTS)


def _save(fig: Figure, out_png: Path) -> Path:
    """Write the PNG atomically at DPI, its size exactly grid_size * DPI (no tight bbox)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    tmp = out_png.with_name(f".{out_png.name}.tmp")
    fig.savefig(tmp, format="png", dpi=DPI)
    tmp.replace(out_png)
    return out_png


def default_out(result_or_folder: Path) -> Path:
    """Beside the run: seed<k>.retrieval.png."""
    return Path(result_or_folder).with_suffix(".retrieval.png")

"""The HTML report's page of one run folder (`<protocol>/<run>.html`): its leaderboard row,
training loss per epoch and per seed, the test pairs' distance histograms, a retrieval grid
from each seed's saved embeddings, and each seed's provenance.
"""

from __future__ import annotations

import html
import logging
from typing import Any

import pandas as pd

from harness.core import HarnessError
from harness.records import RunResult, embeddings_dir, provenance_fields
from harness.report.figures import distance_histograms, training_curve
from harness.report.glance import safe_name
from harness.report.leaderboard import _groups
from harness.report.markup import html_page, table_html
from harness.report.site import ASSETS, Build, Run, group_id, quantise, shown_names
from harness.report.table import leaderboard_frame

log = logging.getLogger("harness")

NO_EMBEDDINGS = "no saved embeddings: rerun with --save-embeddings to see what it retrieves"


def _frame_html(frame: pd.DataFrame) -> str:
    return table_html([str(c) for c in frame.columns],
                       [[str(v) for v in row] for row in frame.itertuples(index=False)],
                       sortable=False)  # fmt: skip


def run_page(build: Build, folder_runs: list[Run], frames: dict[Any, pd.DataFrame],
             all_results: list[RunResult]) -> str:  # fmt: skip
    """The page of one run folder (see the module's docstring); `frames` keeps the
    leaderboard frame of each protocol group, made once for all its pages."""
    first = folder_runs[0]
    protocol, folder = first.protocol_folder, first.run_folder
    stem = f"{safe_name(protocol)}/{safe_name(folder)}"
    results = [r.result for r in folder_runs]
    body = [f"<h1>{html.escape(folder)} <small>on {html.escape(protocol)}</small></h1>"]

    # the leaderboard's row(s) of this folder, from the same frame as the index
    groups = _groups(all_results)
    mine = {id(r) for r in results}
    for key, group in sorted(groups.items(), key=str):
        rows = {shown_names(group)[id(r)] for r in group if id(r) in mine}
        if not rows:
            continue
        if key not in frames:  # once per protocol group, not once per page (setdefault would)
            frames[key] = leaderboard_frame(group)
        frame = frames[key]
        body += [f'<p>In the leaderboard: <a href="../index.html#{group_id(key)}">'
                 f"{html.escape(key[0])} (protocol v{key[1]}, hash <code>{key[2]}</code>)"
                 "</a></p>", _frame_html(frame[frame["method"].isin(rows)])]  # fmt: skip

    paths = sorted(r.path for r in folder_runs)
    body.append("<h2>Training loss</h2>")
    curve = build.asset(f"{stem}_training.png")
    title = f"Training loss per epoch — {folder}, {protocol}"
    quantise(training_curve(paths, curve, title=title))
    body.append(f'<p><img src="../{ASSETS}/{stem}_training.png" alt="training loss per epoch"></p>')
    body.append(_loss_table(folder_runs))

    body.append("<h2>Distances of test pairs</h2>")
    if any(r.result.ok and r.result.distances for r in folder_runs):
        hist = build.asset(f"{stem}_distances.png")
        quantise(distance_histograms(paths, hist, f"Test pair distances — {folder}, {protocol}"))
        body.append(f'<p><img src="../{ASSETS}/{stem}_distances.png" '
                    'alt="positive and negative pair distances"></p>')  # fmt: skip
    else:
        body.append('<p class="note">no finished run recorded its test pair distances</p>')

    body.append("<h2>What it retrieves</h2>")
    body += _retrieval(build, folder_runs, stem)

    body.append("<h2>Provenance</h2>")
    body.append(_provenance(build, folder_runs))
    return html_page(f"{folder} — {protocol}", "\n".join(body), depth=1)


def _loss_table(runs: list[Run]) -> str:
    """Mean training loss of each epoch, one row per seed (and its seconds per epoch)."""
    losses = {r.result.seed: r.result.training.epoch_loss or [] for r in runs}
    epochs = max((len(v) for v in losses.values()), default=0)
    if not epochs:
        return '<p class="note">no seed recorded a training loss (untrained or failed)</p>'
    header = ["seed", *[f"epoch {e + 1}" for e in range(epochs)], "s/epoch (mean)"]
    rows = []
    for r in sorted(runs, key=lambda r: r.result.seed):
        loss = r.result.training.epoch_loss or []
        seconds = r.result.training.epoch_seconds or []
        rows.append([str(r.result.seed), *[f"{v:.4g}" for v in loss],
                     *["-"] * (epochs - len(loss)),
                     f"{sum(seconds) / len(seconds):.2f}" if seconds else "-"])  # fmt: skip
    return table_html(header, rows)


def _retrieval(build: Build, runs: list[Run], stem: str) -> list[str]:
    """The retrieval grid of each seed whose embeddings were saved (harness.report.retrieval,
    imported on use: it loads the data), or a line saying why there is none."""
    saved = [
        r for r in sorted(runs, key=lambda r: r.result.seed) if embeddings_dir(r.path).is_dir()
    ]
    if not saved:
        return [f'<p class="note">{html.escape(NO_EMBEDDINGS)}</p>']
    from harness.report.retrieval import draw_retrieval_grid

    lines = []
    for r in saved:
        name = f"{stem}_retrieval_seed{r.result.seed}.png"
        try:
            draw_retrieval_grid(embeddings_dir(r.path), build.asset(name))
        except HarnessError as exc:
            lines.append(f'<p class="note">seed {r.result.seed}: no retrieval grid '
                         f"({html.escape(str(exc))})</p>")  # fmt: skip
            continue
        quantise(build.asset(name))
        lines.append(f'<h3>seed {r.result.seed}</h3>\n<p><img src="../{ASSETS}/{name}" '
                     f'alt="retrieval grid, seed {r.result.seed}"></p>')  # fmt: skip
    return lines


def _provenance(build: Build, runs: list[Run]) -> str:
    """One column per seed: where each number came from."""
    ordered = sorted(runs, key=lambda r: r.result.seed)
    columns = [provenance_fields(r.result, r.path.relative_to(build.results_dir).as_posix())
               for r in ordered]  # fmt: skip
    head = "<th></th>" + "".join(f"<th>seed {r.result.seed}</th>" for r in ordered)
    rows = []
    for name in columns[0]:
        cells = "".join(f'<td class="wrap">{html.escape(c[name])}</td>' for c in columns)
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    return (f'<div class="scroll"><table class="provenance">\n<thead><tr>{head}</tr></thead>\n'
            "<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table></div>")  # fmt: skip

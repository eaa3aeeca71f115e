"""Results -> a static HTML report: plain files, opened with file://, nothing fetched.

`index.html` holds the leaderboard of every protocol (the same tables, intervals and `vs
best` marks as LEADERBOARD.md: the markdown the leaderboard renders is turned into HTML, so
the two cannot disagree), each table sortable by clicking a column header, with the ranking
agreement, tuning and reference sections and each protocol's figures. Each (protocol, run
folder) gets a page, `<protocol>/<run>.html`: its leaderboard row, training loss per epoch
and per seed, the test pairs' distance histograms, a retrieval grid from saved embeddings,
and each seed's provenance. `cost.html` holds the cost tables and figures. Figures are PNG
files under `assets/`, palette-quantised and saved without metadata, so that the same
results give the same bytes.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.core import HarnessError, program_name
from harness.records import RunResult, describe, embeddings_dir, read_result, result_paths
from harness.report.agreement import agreement_section
from harness.report.cost_tables import cost_section
from harness.report.figures import distance_histograms, training_curve
from harness.report.glance import draw_glance, safe_name
from harness.report.leaderboard import (
    _groups,
    leaderboard_frame,
    paper_comparison,
    render,
    tuning_section,
)
from harness.report.markup import GENERATOR, html_page, inline, markdown_html, table_html
from harness.report.posteriors import cache_for
from harness.report.reference import reference_section
from harness.report.verdicts import row_names, zero_shot_label, zero_shot_row

log = logging.getLogger("harness")

ASSETS = "assets"
PALETTE_COLOURS = 96  # plots have few colours: a palette PNG is a quarter of the RGBA one

NO_EMBEDDINGS = "no saved embeddings: rerun with --save-embeddings to see what it retrieves"


@dataclass
class _Run:
    path: Path
    result: RunResult

    @property
    def protocol_folder(self) -> str:
        return self.path.parent.parent.name

    @property
    def run_folder(self) -> str:
        return self.path.parent.name


@dataclass
class _Build:
    """The folder being written and what the pages share."""

    results_dir: Path
    out: Path  # the report's final folder (relative links to the results are made from it)
    tmp: Path  # where it is built, moved to `out` at the end
    copied: dict[Path, str] = field(default_factory=dict)

    def asset(self, name: str) -> Path:
        path = self.tmp / ASSETS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def _quantise(png: Path) -> Path:
    """Rewrite a PNG as a palette image without metadata (no Software, no dates): smaller, and
    the same bytes for the same figure."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
    small = rgb.quantize(colors=PALETTE_COLOURS, dither=Image.Dither.NONE)
    small.save(png, format="PNG", optimize=True)
    return png


# ----------------------------------------------------------------------------- pages


def _group_id(key: tuple[str, int, str, Any]) -> str:
    name, version, hash_, max_steps = key
    steps = f"-steps{max_steps}" if max_steps is not None else ""
    return f"protocol-{safe_name(name)}-v{version}-{hash_}{steps}"


def _page_path(run: _Run) -> str:
    """A run folder's page, relative to the report's folder."""
    return f"{safe_name(run.protocol_folder)}/{safe_name(run.run_folder)}.html"


def _resolver(build: _Build, depth: int) -> Callable[[str], str | None]:
    """Links in the leaderboard's markdown are relative to the results folder: a PNG there
    is copied into assets/ (quantised), another file there is linked where it lies, a file
    that is not there becomes text; web addresses and anchors are kept."""
    up = "../" * depth

    def link(href: str) -> str | None:
        if re.match(r"^[a-z]+:", href) or href.startswith("#"):
            return href
        if href.startswith(f"{ASSETS}/"):  # drawn for the report itself
            return up + href
        source = (build.results_dir / href).resolve()
        if not source.is_file():
            return None
        if source.suffix.lower() == ".png":
            if source not in build.copied:
                name = "copied/" + safe_name(Path(href).as_posix().replace("/", "__"))
                shutil.copyfile(source, build.asset(name))
                _quantise(build.asset(name))
                build.copied[source] = f"{ASSETS}/{name}"
            return up + build.copied[source]
        return up + Path(os.path.relpath(source, build.out.resolve())).as_posix()

    return link


def _index(build: _Build, runs: list[_Run], pages: dict[int, str]) -> str:
    results = [r.result for r in runs]
    link = _resolver(build, 0)
    used: set[str] = set()
    rendered = render(results).split("\n")
    intro = rendered[2].split("do not edit by hand. ", 1)[-1]  # how to read the tables
    parts = [_protocol_section(key, group, pages, link, used)
             for key, group in sorted(_groups(results).items(), key=str)]  # fmt: skip
    parts += _extra_sections(build, results, link, used)
    figures = _protocol_figures(build, runs)
    if figures:
        used.add("figures")
        parts.append(('<li><a href="#figures">Figures</a></li>',
                      f'<section id="figures"><h2>Figures</h2>\n{figures}</section>'))  # fmt: skip
    contents = [item for item, _ in parts]
    contents.append('<li><a href="cost.html">Cost (mining cost and throughput)</a></li>')
    glance = _glance(build, results)
    if glance:
        used.add("glance")
        contents.insert(0, '<li><a href="#glance">At a glance</a></li>')
    body = "\n".join([
        "<h1>Leaderboard</h1>", *glance,
        f"<p>Generated by <code>{program_name()} report</code> from the result files of "
        "<code>runs/</code>, the same numbers as LEADERBOARD.md (<code>leaderboard</code>). "
        "Click a column header to sort by it (again: the other way); a method's name opens "
        "its page: training curves, distances, retrieval and provenance.</p>",
        '<details class="how"><summary>How to read the tables</summary>',
        f"<p>{inline(intro, link)}</p></details>",
        "<h2>Contents</h2>", "<ul>", *contents, "</ul>", *[section for _, section in parts],
    ])  # fmt: skip
    return html_page("Leaderboard", body)


def _glance(build: _Build, results: list[RunResult]) -> list[str]:
    """The front page's first screen: the critical-difference diagram and the bump chart,
    then each protocol's forest plot linking to its table (harness.report.glance)."""
    log.info("report: figures at a glance")
    posteriors = cache_for(build.results_dir)  # the leaderboard's hierarchical posteriors
    figures = draw_glance(results, build.tmp / ASSETS / "glance", posteriors)
    posteriors.save()
    if not figures:
        return []
    lines = ['<section id="glance"><h2>At a glance</h2>']
    forests = []
    for g in figures:
        _quantise(g.png)
        image = f'<img src="{ASSETS}/glance/{g.png.name}" alt="{html.escape(g.title)}">'
        if g.protocol_key is None:
            lines.append(f'<figure id="figure-{g.name}">{image}'
                         f"<figcaption>{html.escape(g.caption)}</figcaption></figure>")  # fmt: skip
            continue
        table = f"#{_group_id(g.protocol_key)}"
        forests.append(f'<figure id="figure-{g.name}"><a href="{table}">{image}</a>'
                       f"<figcaption>{html.escape(g.caption)} "
                       f'<a href="{table}">Its table</a>.</figcaption></figure>')  # fmt: skip
    if forests:
        lines += ['<div class="forests">', *forests, "</div>"]
    return [*lines, "</section>"]


def _protocol_section(
    key: tuple[str, int, str, Any], group: list[RunResult], pages: dict[int, str],
    link: Callable[[str], str | None], used: set[str],
) -> tuple[str, str]:  # fmt: skip
    """One protocol's leaderboard section (the leaderboard's own markdown, its main table
    sortable with each method linked to its page) and its line in the contents."""
    section = _group_id(key)
    used.add(section)
    paper_md = "\n".join(paper_comparison(group))
    # render(group) is the leaderboard's section for this group, headed like the whole
    text = "\n".join(render(group).split("\n")[3:])
    if paper_md:
        text = text.replace(paper_md, "", 1)
    heading, text = text.strip().split("\n", 1)
    names = _shown_names(group)
    row_page: dict[str, str] = {}
    for r in group:
        row_page.setdefault(names[id(r)], pages[id(r)])
    cell = _method_links(row_page)

    def hook(index: int, header: list[str], rows: list[list[str]]) -> str | None:
        if index == 0 and header[:2] == ["method", "seeds"]:  # the main table
            return table_html(header, rows, cell_html=cell, link=link,
                              table_id=f"table-{section}")  # fmt: skip
        return None

    body = [f'<section id="{section}">',
            f"<h2>{inline(heading.lstrip('#').strip(), link)}</h2>"]  # fmt: skip
    title = f"{key[0]} (protocol v{key[1]}, hash `{key[2]}`)"
    item = f'<li><a href="#{section}">{inline(title, link)}</a>'
    if paper_md:
        paper_id = f"paper-{section}"
        used.add(paper_id)
        body += [f'<section id="{paper_id}"><h3>Paper vs reproduction</h3>',
                 markdown_html(paper_md, link, heading_ids=used), "</section>"]  # fmt: skip
        item += f' (<a href="#{paper_id}">paper vs reproduction</a>)'
    body += [markdown_html(text, link, hook, used), "</section>"]
    return item + "</li>", "\n".join(body)


def _shown_names(group: list[RunResult]) -> dict[int, str]:
    """Each run's row as the leaderboard's main table names it (row_names, with the zero-shot
    row of a pretrained protocol labelled so)."""
    names, zero = row_names(group), zero_shot_row(group)
    return {key: zero_shot_label(name) if name == zero else name for key, name in names.items()}


def _extra_sections(
    build: _Build, results: list[RunResult], link: Callable[[str], str | None], used: set[str]
) -> list[tuple[str, str]]:
    """The leaderboard's sections after the protocols' (agreement, the committed reference,
    tuning), each (its line in the contents, its HTML); an empty one is left out."""
    extra = [
        ("agreement", "Do the protocols agree on the ranking?", agreement_section(results)),
        ("reference", "Against the committed reference",
         reference_section(build.results_dir, results)),
        ("tuning", "Tuning", tuning_section(build.results_dir)),
    ]  # fmt: skip
    parts = []
    for anchor, title, markdown in extra:
        if not markdown.strip():
            continue
        used.add(anchor)
        markdown = re.sub(r"^## .*\n", "", markdown.lstrip("\n"), count=1)
        parts.append((f'<li><a href="#{anchor}">{html.escape(title)}</a></li>',
                      f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n'
                      f"{markdown_html(markdown, link, heading_ids=used)}</section>"))  # fmt: skip
    return parts


def _method_links(row_page: dict[str, str]) -> Callable[[str, str], str | None]:
    def cell(column: str, text: str) -> str | None:
        if column == "method" and text in row_page:
            return f'<a href="{html.escape(row_page[text])}">{html.escape(text)}</a>'
        return None

    return cell


def _protocol_figures(build: _Build, runs: list[_Run]) -> str:
    """Each protocol folder's training curves and distance histograms, all methods."""
    parts = []
    for folder in sorted({r.protocol_folder for r in runs}):
        paths = sorted(r.path for r in runs if r.protocol_folder == folder)
        log.info("report: figures of %s", folder)
        training = build.asset(f"{safe_name(folder)}/training.png")
        _quantise(training_curve(paths, training, title=f"Training loss per epoch — {folder}"))
        hist = build.asset(f"{safe_name(folder)}/distances.png")
        _quantise(distance_histograms(paths, hist, f"Test pair distances — {folder}"))
        parts.append(
            f'<h3 id="figures-{safe_name(folder)}">{html.escape(folder)}</h3>\n'
            f'<p><img src="{ASSETS}/{safe_name(folder)}/training.png" alt="training loss per epoch, '
            f'{html.escape(folder)}"></p>\n<p><img src="{ASSETS}/{safe_name(folder)}/distances.png" '
            f'alt="positive and negative pair distances, {html.escape(folder)}"></p>'
        )
    return "\n".join(parts)


def _frame_html(frame: pd.DataFrame) -> str:
    return table_html([str(c) for c in frame.columns],
                       [[str(v) for v in row] for row in frame.itertuples(index=False)],
                       sortable=False)  # fmt: skip


def _method_page(build: _Build, folder_runs: list[_Run], frames: dict[Any, pd.DataFrame],
                 all_results: list[RunResult]) -> str:  # fmt: skip
    first = folder_runs[0]
    protocol, folder = first.protocol_folder, first.run_folder
    stem = f"{safe_name(protocol)}/{safe_name(folder)}"
    results = [r.result for r in folder_runs]
    body = [f"<h1>{html.escape(folder)} <small>on {html.escape(protocol)}</small></h1>"]

    # the leaderboard's row(s) of this folder, from the same frame as the index
    groups = _groups(all_results)
    mine = {id(r) for r in results}
    for key, group in sorted(groups.items(), key=str):
        rows = {_shown_names(group)[id(r)] for r in group if id(r) in mine}
        if not rows:
            continue
        frame = frames.setdefault(key, leaderboard_frame(group))
        body += [f'<p>In the leaderboard: <a href="../index.html#{_group_id(key)}">'
                 f"{html.escape(key[0])} (protocol v{key[1]}, hash <code>{key[2]}</code>)"
                 "</a></p>", _frame_html(frame[frame["method"].isin(rows)])]  # fmt: skip

    paths = sorted(r.path for r in folder_runs)
    body.append("<h2>Training loss</h2>")
    curve = build.asset(f"{stem}_training.png")
    title = f"Training loss per epoch — {folder}, {protocol}"
    _quantise(training_curve(paths, curve, title=title))
    body.append(f'<p><img src="../{ASSETS}/{stem}_training.png" alt="training loss per epoch"></p>')
    body.append(_loss_table(folder_runs))

    body.append("<h2>Distances of test pairs</h2>")
    if any(r.result.ok and r.result.distances for r in folder_runs):
        hist = build.asset(f"{stem}_distances.png")
        _quantise(distance_histograms(paths, hist, f"Test pair distances — {folder}, {protocol}"))
        body.append(f'<p><img src="../{ASSETS}/{stem}_distances.png" '
                    'alt="positive and negative pair distances"></p>')  # fmt: skip
    else:
        body.append('<p class="note">no finished run recorded its test pair distances</p>')

    body.append("<h2>What it retrieves</h2>")
    body += _retrieval(build, folder_runs, stem)

    body.append("<h2>Provenance</h2>")
    body.append(_provenance(build, folder_runs))
    return html_page(f"{folder} — {protocol}", "\n".join(body), depth=1)


def _loss_table(runs: list[_Run]) -> str:
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


def _retrieval(build: _Build, runs: list[_Run], stem: str) -> list[str]:
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
        _quantise(build.asset(name))
        lines.append(f'<h3>seed {r.result.seed}</h3>\n<p><img src="../{ASSETS}/{name}" '
                     f'alt="retrieval grid, seed {r.result.seed}"></p>')  # fmt: skip
    return lines


def _provenance(build: _Build, runs: list[_Run]) -> str:
    """One column per seed: where each number came from."""
    ordered = sorted(runs, key=lambda r: r.result.seed)
    columns = [_provenance_of(r, build.results_dir) for r in ordered]
    head = "<th></th>" + "".join(f"<th>seed {r.result.seed}</th>" for r in ordered)
    rows = []
    for name in columns[0]:
        cells = "".join(f'<td class="wrap">{html.escape(c[name])}</td>' for c in columns)
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    return (f'<div class="scroll"><table class="provenance">\n<thead><tr>{head}</tr></thead>\n'
            "<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table></div>")  # fmt: skip


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _provenance_of(run: _Run, results_dir: Path) -> dict[str, str]:
    r = run.result
    training = r.training
    capped = f", capped at {training.max_steps} steps" if training.max_steps is not None else ""
    dataset = (
        r.dataset.name + (f" ({r.dataset.source})" if r.dataset.source else "")
        if r.dataset
        else "-"
    )
    fields = {
        "result file": run.path.relative_to(results_dir).as_posix(),
        "status": r.status + (f" ({r.failure})" if r.failure else ""),
        "protocol": f"{r.protocol.name} v{r.protocol.version}, hash {r.protocol.hash}",
        "method": f"{r.method.name} v{r.method.version}"
        + (f" ({r.method.paper})" if r.method.paper else ""),
        "hyperparameters": _json(r.method.hyperparameters),
        "tuned by": _json(r.tuning) if r.tuning else "-",
        "method source": _json(r.method.source) if r.method.source else "built in",
        "seeds of the sweep": ", ".join(map(str, r.sweep_seeds or [])) or "-",
        "training": f"{training.steps} steps, {training.epochs} epochs{capped}",
        "dataset": dataset,
        "split": str((r.split or {}).get("hash", "-")),
        "harness version": r.harness_version or "-",
    }
    env = r.environment
    if env is None:
        fields["environment"] = "not recorded"
    else:
        hardware = env.hardware.to_json()
        fields.update({
            "git commit": (env.git_commit or "?")
            + (" (dirty: uncommitted changes)" if env.git_dirty else ""),
            "python": env.python or "-",
            "packages": ", ".join(f"{k} {v}" for k, v in sorted((env.packages or {}).items())),
            "hardware": ", ".join(f"{k}: {v}" for k, v in hardware.items() if v is not None),
            "machine": describe(env.fingerprint),
        })  # fmt: skip
    fields["started"] = r.started_at or "-"
    fields["finished"] = r.finished_at or "-"
    return fields


def _cost_page(build: _Build) -> str:
    log.info("report: cost page")
    markdown = cost_section(build.results_dir, build.tmp / ASSETS, ASSETS)
    for png in sorted((build.tmp / ASSETS).glob("cost_*.png")):
        _quantise(png)
    if not markdown.strip():
        body = ("<h1>Cost</h1>\n<p class=\"note\">No cost records under "
                f"<code>{html.escape(str(build.results_dir / 'cost'))}</code>: measure them "
                f"with <code>{program_name()} cost</code>.</p>")  # fmt: skip
    else:
        body = "<h1>Cost</h1>\n" + markdown_html(markdown, _resolver(build, 0))
    return html_page("Cost", body)


def _prepare(out: Path) -> Path:
    """The temporary folder to build in, beside `out`; refuses an `out` that holds files
    other than a report's."""
    if out.exists():
        index = out / "index.html"
        ours = index.is_file() and GENERATOR in index.read_text(encoding="utf-8", errors="replace")
        if not out.is_dir() or (any(out.iterdir()) and not ours):
            raise HarnessError(f"--out {out} exists and is not a report this command wrote; "
                               "pass a new or empty folder")  # fmt: skip
    tmp = out.parent / f".{out.name}.building"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def write_report(results_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of `results_dir` into `out` (default results_dir/report) and
    return the path of its index.html. The same results give the same files."""
    results_dir = Path(results_dir)
    paths = result_paths(results_dir)
    if not paths:
        raise HarnessError(f"no run results under {results_dir / 'runs'}: run "
                           f"`{program_name()} run` first, or pass --results-dir")  # fmt: skip
    out = Path(out) if out is not None else results_dir / "report"
    log.info("report: reading %d result files under %s", len(paths), results_dir / "runs")
    runs = [_Run(p, read_result(p)) for p in paths]
    build = _Build(results_dir, out, _prepare(out))
    try:
        pages = {id(r.result): _page_path(r) for r in runs}
        folders: dict[tuple[str, str], list[_Run]] = {}
        for r in runs:
            folders.setdefault((r.protocol_folder, r.run_folder), []).append(r)
        frames: dict[Any, pd.DataFrame] = {}
        results = [r.result for r in runs]
        for i, ((protocol, folder), folder_runs) in enumerate(sorted(folders.items()), 1):
            log.info("report: page %d/%d, %s on %s", i, len(folders), folder, protocol)
            page = build.tmp / _page_path(folder_runs[0])
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(_method_page(build, folder_runs, frames, results), encoding="utf-8")
        (build.tmp / "cost.html").write_text(_cost_page(build), encoding="utf-8")
        log.info("report: index")
        (build.tmp / "index.html").write_text(_index(build, runs, pages), encoding="utf-8")
    except BaseException:
        shutil.rmtree(build.tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    build.tmp.replace(out)
    return out / "index.html"

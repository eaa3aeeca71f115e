"""Results -> markdown leaderboard: one table per protocol, mean +- std over seeds.

Always regenerated from the result files, never edited by hand. Runs of an older protocol
version (another hash) or with a shortened budget (--max-steps) get tables of their own:
numbers from different protocols are not comparable and are never averaged together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.cost import cost_section
from harness.errors import HarnessError
from harness.fingerprint import describe
from harness.metrics import UNBOUNDED_METRICS
from harness.results import Environment, RunResult, load_results, parse_result

METRIC_ORDER = ("recall@", "precision@1", "r_precision", "map@r", "map", "nmi", "f1", "lda")


def _metric_key(name: str) -> tuple[int, int]:
    for rank, prefix in enumerate(METRIC_ORDER):
        if name == prefix or (prefix.endswith("@") and name.startswith(prefix)):
            return rank, int(name.split("@")[1]) if prefix == "recall@" else 0
    return len(METRIC_ORDER), 0


def _mean_std(values: pd.Series, scale: float, digits: int) -> str:
    values = values.dropna()
    if values.empty:
        return "-"
    if len(values) == 1:
        return f"{values.iloc[0] * scale:.{digits}f}"
    return f"{values.mean() * scale:.{digits}f} ± {values.std(ddof=1) * scale:.{digits}f}"


def _coerce(runs: Iterable[RunResult | dict[str, Any]]) -> list[RunResult]:
    """Results as RunResults; a dict (a result file's JSON) is read with its schema checks."""
    return [r if isinstance(r, RunResult) else parse_result(r, "(in memory)") for r in runs]


def _row(r: RunResult, name: str, metrics: dict[str, float], timed: bool) -> dict[str, Any]:
    timings = (r.timings or {}) if timed else {}
    return {"method": name, "seed": r.seed, "status": r.status, **metrics,
            "img/s": timings.get("images_per_second"),
            "s/epoch": timings.get("seconds_per_epoch"), "failure": r.failure}  # fmt: skip


def completeness(runs: list[RunResult]) -> tuple[int, int, list[int]]:
    """(finished, asked, missing) seeds of one method's runs: asked is every seed the runs'
    sweeps asked for (the protocol's seeds for files that predate `sweep_seeds`)."""
    asked = {s for r in runs for s in r.asked_seeds()}
    finished = {r.seed for r in runs if r.ok}
    return len(finished & asked) if asked else len(finished), len(asked), sorted(asked - finished)


def _seeds_cell(runs: list[RunResult]) -> tuple[int | str, list[int]]:
    """`3` for a complete row; `2/3 (incomplete)` when seeds asked for have not finished
    (returned with the missing seeds; none for a complete row)."""
    finished, asked, missing = completeness(runs)
    if not missing:
        return sum(r.ok for r in runs), []
    return f"{finished}/{asked} (incomplete)", missing


def _table(
    runs: list[RunResult], ranked: bool = True, parts: bool = False
) -> str:  # fmt: skip
    """One row per method (mean +- std over its seeds), best first unless not `ranked`; a row
    with unfinished seeds is marked and ranked below every complete row. With `parts`, one
    row per method and part of a composite embedding, named `method / part`."""
    rows, by_name = [], {}
    for r in runs:
        named = ([(f"{r.method.name} / {part}", m) for part, m in (r.metrics_by_part or {}).items()]
                 if parts else [(r.method.name, r.metrics or {})])  # fmt: skip
        for name, metrics in named:
            rows.append(_row(r, name, metrics, timed=not parts))
            by_name.setdefault(name, []).append(r)
    df = pd.DataFrame(rows)
    metrics = sorted(
        (c for c in df.columns if _metric_key(c)[0] < len(METRIC_ORDER)), key=_metric_key
    )
    out = [_line(method, group, metrics, by_name[method])
           for method, group in df.groupby("method", sort=False)]  # fmt: skip
    if ranked:  # complete rows first, each part best first (stable: ties keep their order)
        out.sort(key=lambda line: (not line["_complete"], -_finite(line["_sort"])))
    table = pd.DataFrame(out).drop(columns=["_sort", "_complete"])
    if not (table["notes"] != "").any():
        table = table.drop(columns="notes")
    return tabulate(
        table, headers="keys", tablefmt="github", showindex=False, disable_numparse=True
    )


def _finite(value: float) -> float:
    return value if value == value else -math.inf  # NaN ranks last


def _line(
    method: str, group: pd.DataFrame, metrics: list[str], runs: list[RunResult]
) -> dict[str, Any]:
    """One method's row: seeds, mean +- std of each metric, speed, and notes."""
    ok = group[group["status"] == "ok"]
    seeds, missing = _seeds_cell(runs)
    line: dict[str, Any] = {"method": method, "seeds": seeds}
    for name in metrics:
        if name in UNBOUNDED_METRICS:  # a ratio, not a fraction: as is, two decimals
            line[name] = _mean_std(ok[name], 1, 2) if name in ok else "-"
        else:
            line[f"{name} (%)"] = _mean_std(ok[name], 100, 1) if name in ok else "-"
    trained = ok["s/epoch"].dropna()
    line["img/s"] = _mean_std(ok["img/s"], 1, 0) if not trained.empty else "-"
    line["s/epoch"] = _mean_std(trained, 1, 2) if not trained.empty else "-"
    bad = group[group["status"] != "ok"]
    notes = [f"seed {s}: {st} ({f})"
             for s, st, f in bad[["seed", "status", "failure"]].itertuples(index=False)]  # fmt: skip
    if missing:
        notes.append(f"not finished: seed{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))}")  # fmt: skip
    line["notes"] = "; ".join(notes)
    sort_metric = metrics[0] if metrics else None
    line["_sort"] = ok[sort_metric].mean() if sort_metric and not ok.empty else -1.0
    line["_complete"] = not missing
    return line


def _parts_table(runs: list[RunResult]) -> str:
    """Each part of a composite embedding scored alone, one row per method and part, named
    `method / part`; empty when no run has parts."""
    with_parts = [r for r in runs if r.metrics_by_part]
    return _table(with_parts, ranked=False, parts=True) if with_parts else ""


def _groups(runs: Iterable[RunResult]) -> dict[tuple[str, int, str, Any], list[RunResult]]:
    groups: dict[tuple[str, int, str, Any], list[RunResult]] = {}
    for r in runs:
        key = (r.protocol.name, r.protocol.version, r.protocol.hash, r.training.max_steps)
        groups.setdefault(key, []).append(r)
    return groups


def paper_comparison(runs: list[RunResult]) -> list[str]:
    """For a protocol with a `paper:` entry: how it differs from the paper, then each of our
    metrics (mean over finished seeds) next to the published value and the difference, from
    protocols/reference/paper_results.yaml. Empty for other protocols."""
    from harness.data.reference import paper_results

    paper = (runs[0].protocol.content or {}).get("paper") or {}
    if not paper.get("reference"):
        return []
    lines = []
    if paper.get("differences"):
        lines += [f"**Differs from the paper:** {paper['differences']}", ""]
    try:
        source, published = paper_results(paper["reference"], paper["dataset"])
    except (KeyError, HarnessError):
        return [*lines, f"(no published values for {paper['reference']} / {paper['dataset']})", ""]
    aliases = paper.get("methods") or {}
    rows = []
    for method in sorted({r.method.name for r in runs}):
        theirs = published.get(aliases.get(method, method))
        if not theirs:
            continue
        mine = [r for r in runs if r.method.name == method]
        finished, asked, missing = completeness(mine)
        partial = f" ({finished}/{asked} seeds, incomplete)" if missing else ""
        ok = [r for r in mine if r.ok]
        for metric, value in theirs.items():
            ours = [100 * r.metrics[metric] for r in ok if metric in (r.metrics or {})]
            mean = sum(ours) / len(ours) if ours else None
            rows.append({
                "method": (method if method == aliases.get(method, method)
                           else f"{method} (paper: {aliases[method]})") + partial,
                "metric": metric,
                "ours (%)": "-" if mean is None else f"{mean:.1f}",
                "paper (%)": f"{value:g}",
                "ours − paper": "-" if mean is None else f"{mean - value:+.1f}",
            })  # fmt: skip
    if not rows:
        return [*lines, f"No method run here has a published value in {source}.", ""]
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                     disable_numparse=True)  # fmt: skip
    return [*lines, f"Against the published values ({source}):", "", table, ""]


def render(runs: Iterable[RunResult | dict[str, Any]]) -> str:
    """The whole leaderboard as markdown (dicts are read as result files' JSON)."""
    runs = _coerce(runs)
    lines = [
        "# Leaderboard",
        "",
        "Generated by `python -m harness leaderboard` from the result files under `runs/`; "
        "do not edit by hand. Metrics in percent, mean ± sample std over seeds (one seed: the "
        "value alone); `seeds` counts finished runs, and `2/3 (incomplete)` marks a method whose "
        "seeds asked for have not all finished: it ranks below every complete row. Retrieval is all-vs-all on the test "
        "classes, which no model saw in training.",
    ]
    for (name, version, hash_, max_steps), group in sorted(_groups(runs).items(), key=str):
        envs = [r.environment or Environment() for r in group]
        commits = sorted({(e.git_commit or "?")[:10] for e in envs})
        devices = sorted({e.hardware.device or "?" for e in envs})
        machines = sorted({describe(e.fingerprint) for e in envs})
        dates = sorted(r.finished_at or r.started_at or "?" for r in group)
        title = f"## {name} (protocol v{version}, hash `{hash_}`)"
        if max_steps is not None:
            title += f" — shortened to {max_steps} steps, not comparable to full runs"
        lines += ["", title, "", *paper_comparison(group), _table(group), ""]
        parts = _parts_table(group)
        if parts:
            lines += ["Parts of composite embeddings, each part scored alone as `method / part` "
                      "(training cost is the whole method's):", "", parts, ""]  # fmt: skip
        split = next((r.split for r in group if r.split), None)
        if split:
            lines.append(
                f"Split `{split['hash']}`: {split['train_classes']} train classes "
                f"({split['train_images']} images), {split['test_classes']} test classes "
                f"({split['test_images']} images)."
            )
        lines.append(
            f"Runs: {len(group)}; commits {', '.join(commits)}; devices {', '.join(devices)}; "
            f"finished {dates[0][:10]} to {dates[-1][:10]}; made on {'; '.join(machines)}."
        )
    return "\n".join(lines) + "\n"


def training_figures(results_dir: Path) -> str:
    """Per protocol: the training-loss figure (results/figures/training_<protocol>.png) and
    the pair-distance histograms of every method (distances_<protocol>.png)."""
    from harness.figures import distance_histograms, training_curve

    lines = []
    for folder in sorted(p for p in (results_dir / "runs").iterdir() if p.is_dir()):
        paths = sorted(folder.glob("*/seed*.json"))
        if not paths:
            continue
        out = results_dir / "figures" / f"training_{folder.name}.png"
        training_curve(paths, out, title=f"Training loss per epoch — {folder.name}")
        hist = results_dir / "figures" / f"distances_{folder.name}.png"
        distance_histograms(paths, hist, f"Test pair distances — {folder.name}")
        lines.append(f"- {folder.name}: [training loss per epoch](figures/{out.name}), "
                     f"[positive/negative pair distances](figures/{hist.name})")  # fmt: skip
    return "\n## Figures\n\n" + "\n".join(lines) + "\n" if lines else ""


def write_leaderboard(results_dir: Path) -> Path:
    runs = load_results(results_dir)
    if not runs:
        raise HarnessError(
            f"no run results under {Path(results_dir) / 'runs'}: run `python -m harness run` first"
        )
    path = Path(results_dir) / "LEADERBOARD.md"
    text = render(runs) + training_figures(Path(results_dir)) + cost_section(Path(results_dir))
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path

"""Results -> markdown leaderboard: one table per protocol, mean +- std over seeds.

Always regenerated from the result files, never edited by hand. Runs of an older protocol
version (another hash) or with a shortened budget (--max-steps) get tables of their own:
numbers from different protocols are not comparable and are never averaged together.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.cost import cost_section
from harness.errors import HarnessError
from harness.fingerprint import describe
from harness.metrics import UNBOUNDED_METRICS
from harness.results import load_results

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


def _table(runs: list[dict[str, Any]], ranked: bool = True) -> str:
    """One row per method (mean +- std over its seeds), best first unless not `ranked`."""
    rows = []
    for r in runs:
        row: dict[str, Any] = {
            "method": r["method"]["name"],
            "seed": r["seed"],
            "status": r["status"],
        }
        row.update(r.get("metrics", {}))
        timings = r.get("timings", {})
        row["img/s"] = timings.get("images_per_second")
        row["s/epoch"] = timings.get("seconds_per_epoch")
        row["failure"] = r.get("failure")
        rows.append(row)
    df = pd.DataFrame(rows)
    metrics = sorted(
        (c for c in df.columns if _metric_key(c)[0] < len(METRIC_ORDER)), key=_metric_key
    )
    out = []
    for method, group in df.groupby("method", sort=False):
        ok = group[group["status"] == "ok"]
        line: dict[str, Any] = {"method": method, "seeds": len(ok)}
        for name in metrics:
            if name in UNBOUNDED_METRICS:  # a ratio, not a fraction: as is, two decimals
                line[name] = _mean_std(ok[name], 1, 2) if name in ok else "-"
            else:
                line[f"{name} (%)"] = _mean_std(ok[name], 100, 1) if name in ok else "-"
        trained = ok["s/epoch"].dropna()
        line["img/s"] = _mean_std(ok["img/s"], 1, 0) if not trained.empty else "-"
        line["s/epoch"] = _mean_std(trained, 1, 2) if not trained.empty else "-"
        bad = group[group["status"] != "ok"]
        line["notes"] = "; ".join(
            f"seed {s}: {st} ({f})"
            for s, st, f in bad[["seed", "status", "failure"]].itertuples(index=False)
        )
        sort_metric = metrics[0] if metrics else None
        line["_sort"] = ok[sort_metric].mean() if sort_metric and not ok.empty else -1.0
        out.append(line)
    table = pd.DataFrame(out)
    if ranked:
        table = table.sort_values("_sort", ascending=False, kind="stable")
    table = table.drop(columns="_sort")
    if not (table["notes"] != "").any():
        table = table.drop(columns="notes")
    return tabulate(
        table, headers="keys", tablefmt="github", showindex=False, disable_numparse=True
    )


def _parts_table(runs: list[dict[str, Any]]) -> str:
    """Each part of a composite embedding scored alone (HDC's single heads), one row per
    method and part, named `method / part`; empty when no run has parts."""
    parts = [
        {**r, "method": {**r["method"], "name": f"{r['method']['name']} / {part}"},
         "metrics": metrics, "timings": {}}
        for r in runs
        for part, metrics in r.get("metrics_by_part", {}).items()
    ]  # fmt: skip
    return _table(parts, ranked=False) if parts else ""


def _groups(
    runs: Iterable[dict[str, Any]],
) -> dict[tuple[str, int, str, Any], list[dict[str, Any]]]:
    groups: dict[tuple[str, int, str, Any], list[dict[str, Any]]] = {}
    for r in runs:
        p = r["protocol"]
        key = (p["name"], p["version"], p["hash"], r.get("training", {}).get("max_steps"))
        groups.setdefault(key, []).append(r)
    return groups


def paper_comparison(runs: list[dict[str, Any]]) -> list[str]:
    """For a protocol with a `paper:` entry: how it differs from the paper, then each of our
    metrics (mean over finished seeds) next to the published value and the difference, from
    protocols/reference/paper_results.yaml. Empty for other protocols."""
    from harness.data.reference import paper_results

    paper = runs[0]["protocol"].get("content", {}).get("paper") or {}
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
    for method in sorted({r["method"]["name"] for r in runs}):
        theirs = published.get(aliases.get(method, method))
        if not theirs:
            continue
        ok = [r for r in runs if r["method"]["name"] == method and r["status"] == "ok"]
        for metric, value in theirs.items():
            ours = [100 * r["metrics"][metric] for r in ok if metric in r.get("metrics", {})]
            mean = sum(ours) / len(ours) if ours else None
            rows.append({
                "method": method if method == aliases.get(method, method)
                else f"{method} (paper: {aliases[method]})",
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


def render(runs: list[dict[str, Any]]) -> str:
    """The whole leaderboard as markdown."""
    lines = [
        "# Leaderboard",
        "",
        "Generated by `python -m harness leaderboard` from the result files under `runs/`; "
        "do not edit by hand. Metrics in percent, mean ± sample std over seeds (one seed: the "
        "value alone); `seeds` counts finished runs. Retrieval is all-vs-all on the test "
        "classes, which no model saw in training.",
    ]
    for (name, version, hash_, max_steps), group in sorted(_groups(runs).items(), key=str):
        commits = sorted({r.get("environment", {}).get("git_commit", "?")[:10] for r in group})
        devices = sorted(
            {r.get("environment", {}).get("hardware", {}).get("device", "?") for r in group}
        )
        machines = sorted({describe(r.get("environment", {}).get("fingerprint")) for r in group})
        dates = sorted(r.get("finished_at") or r.get("started_at") or "?" for r in group)
        title = f"## {name} (protocol v{version}, hash `{hash_}`)"
        if max_steps is not None:
            title += f" — shortened to {max_steps} steps, not comparable to full runs"
        lines += ["", title, "", *paper_comparison(group), _table(group), ""]
        parts = _parts_table(group)
        if parts:
            lines += ["Parts of composite embeddings, each scored alone (HDC's single heads; "
                      "training cost is the whole method's):", "", parts, ""]  # fmt: skip
        split = next((r["split"] for r in group if "split" in r), None)
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

"""Results -> markdown leaderboard: one table per protocol, mean and 95 % t-interval over seeds.

Always regenerated from the result files, never edited by hand. Runs of an older protocol
version (another hash) or with a shortened budget (--max-steps) get tables of their own:
numbers from different protocols are not comparable and are never averaged together. A
results folder with a committed reference inside it (results/reference) gets a section that
sets its runs beside the reference's (harness.report.reference).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.core import (
    UNBOUNDED_METRICS,
    HarnessError,
    paper_results,
    program_name,
    t_interval,
)
from harness.records import (
    Environment,
    RunResult,
    describe,
    load_results,
    parse_result,
    write_text_atomic,
)
from harness.report.agreement import agreement_section, protocol_groups
from harness.report.bayes import within
from harness.report.beside import beside_section, reference_runs
from harness.report.claims import claims_across_section, claims_section
from harness.report.cost_tables import cost_section
from harness.report.equivalence import section as equivalence_section
from harness.report.figures import distance_histograms, training_curve
from harness.report.glance import glance_section
from harness.report.posteriors import cache_for
from harness.report.ranks import protocol_blocks
from harness.report.reference import reference_section
from harness.report.trunk import method_sources, trunk_lines
from harness.report.tuned import tuned_section
from harness.report.tuned_verdict import tuned_verdict_section
from harness.report.verdicts import (
    against,
    against_best,
    completeness,
    main_metric,
    per_seed,
    row_names,
    zero_shot_label,
    zero_shot_row,
)

METRIC_ORDER = ("recall@", "precision@1", "r_precision", "map@r", "map", "nmi", "f1", "lda")


def _metric_key(name: str) -> tuple[int, int]:
    for rank, prefix in enumerate(METRIC_ORDER):
        if name == prefix or (prefix.endswith("@") and name.startswith(prefix)):
            return rank, int(name.split("@")[1]) if prefix == "recall@" else 0
    return len(METRIC_ORDER), 0


def _mean_std(values: pd.Series, scale: float, digits: int) -> str:
    """`mean ± h`, h the half-width of the 95 % t-interval over seeds; one seed: the value."""
    values = values.dropna()
    if values.empty:
        return "-"
    mean, half = t_interval(values.tolist())
    if math.isnan(half):
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ± {half * scale:.{digits}f}"


def _test_set_spread(runs: list[RunResult], metric: str) -> str:
    """Mean over seeds of the half-width of the bootstrap interval over test queries."""
    halves = [(hi - lo) / 2 for r in runs if r.ok and r.bootstrap
              for lo, hi in [r.bootstrap.get("intervals", {}).get(metric, (math.nan,) * 2)]
              if not math.isnan(lo)]  # fmt: skip
    return f"± {100 * sum(halves) / len(halves):.1f}" if halves else "-"


def _coerce(runs: Iterable[RunResult | dict[str, Any]]) -> list[RunResult]:
    """Results as RunResults; a dict (a result file's JSON) is read with its schema checks."""
    return [r if isinstance(r, RunResult) else parse_result(r, "(in memory)") for r in runs]


def _row(r: RunResult, name: str, metrics: dict[str, float]) -> dict[str, Any]:
    return {"method": name, "seed": r.seed, "status": r.status, **metrics, "failure": r.failure}


def _seeds_cell(runs: list[RunResult]) -> tuple[int | str, list[int]]:
    """`3` for a complete row; `2/3 (incomplete)` when seeds asked for have not finished
    (returned with the missing seeds; none for a complete row)."""
    finished, asked, missing = completeness(runs)
    if not missing:
        return sum(r.ok for r in runs), []
    return f"{finished}/{asked} (incomplete)", missing


def _table(
    runs: list[RunResult], ranked: bool = True, parts: bool = False,
    names: dict[int, str] | None = None,
) -> str:  # fmt: skip
    """leaderboard_frame as a GitHub markdown table."""
    table = leaderboard_frame(runs, ranked, parts, names)
    return tabulate(
        table, headers="keys", tablefmt="github", showindex=False, disable_numparse=True
    )


def leaderboard_frame(
    runs: list[RunResult], ranked: bool = True, parts: bool = False,
    names: dict[int, str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """One row per method (mean +- std over its seeds), best first unless not `ranked`; a row
    with unfinished seeds is marked and ranked below every complete row. With `parts`, one
    row per method and part of a composite embedding, named `method / part`. `names`: each
    run's row name (row_names; default: over `runs`). Cells are the leaderboard's strings
    (the markdown table and the HTML report show this frame)."""
    rows, by_name = [], {}
    names = names or row_names(runs)
    for r in runs:
        row = names[id(r)]
        named = ([(f"{row} / {part}", m) for part, m in (r.metrics_by_part or {}).items()]
                 if parts else [(row, r.metrics or {})])  # fmt: skip
        for name, metrics in named:
            rows.append(_row(r, name, metrics))
            by_name.setdefault(name, []).append(r)
    df = pd.DataFrame(rows)
    metrics = sorted(
        (c for c in df.columns if _metric_key(c)[0] < len(METRIC_ORDER)), key=_metric_key
    )
    main = main_metric(runs)
    if main in metrics:  # the main metric first: the table ranks by it
        metrics = [main] + [m for m in metrics if m != main]
    out = [_line(method, group, metrics, by_name[method])
           for method, group in df.groupby("method", sort=False)]  # fmt: skip
    if not parts and main in metrics:
        values, best = _mark_against_best(out, runs, main)
        _mark_equivalence(out, runs, values, best)
        _mark_against_zero_shot(out, runs, main)
    if ranked:  # complete rows first, each part best first (stable: ties keep their order)
        out.sort(key=lambda line: (not line["_complete"], -_finite(line["_sort"])))
    table = pd.DataFrame(out).drop(columns=["_sort", "_complete"])
    if parts:  # the bootstrap was made for the whole embedding, not for each part
        table = table.drop(columns=[c for c in table.columns if c.startswith("test-set")])
    first = ["method", "seeds", *_verdict_columns(list(table.columns))]
    if metrics:
        main_col = next(c for c in table.columns if c.startswith(metrics[0]))
        first += [main_col, *[c for c in table.columns if c.startswith("test-set")]]
    table = table[first + [c for c in table.columns if c not in first]]
    if not (table["notes"] != "").any():
        table = table.drop(columns="notes")
    if _same_column(table, "precision@1 (%)", "recall@1 (%)"):  # all-vs-all: always equal
        table = table.drop(columns="precision@1 (%)")
    return table


def _verdict_columns(columns: list[str]) -> list[str]:
    """The `vs` columns, each followed by its `P(worse · ≈ · better)` column against the same
    row, then any `P(` column with no `vs` twin (against the untrained row)."""
    probs = [c for c in columns if c.startswith("P(")]
    out = []
    for c in (c for c in columns if c.startswith("vs ")):
        label = c.removeprefix("vs ").split(" (")[0]
        out += [c, *[p for p in probs if f" vs {label}," in p]]
    return out + [p for p in probs if p not in out]


def _same_column(table: pd.DataFrame, column: str, twin: str) -> bool:
    """Whether `column` repeats `twin` cell for cell (then the table shows `twin` alone)."""
    return column in table and twin in table and bool((table[column] == table[twin]).all())


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
    bad = group[group["status"] != "ok"]
    notes = [f"seed {s}: {st} ({f})"
             for s, st, f in bad[["seed", "status", "failure"]].itertuples(index=False)]  # fmt: skip
    if missing:
        notes.append(f"not finished: seed{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))}")  # fmt: skip
    line["notes"] = "; ".join(notes)
    sort_metric = metrics[0] if metrics else None
    line["_sort"] = ok[sort_metric].mean() if sort_metric and not ok.empty else -1.0
    if sort_metric:
        line[f"test-set ± ({sort_metric})"] = _test_set_spread(runs, sort_metric)
    line["_complete"] = not missing
    return line


def _mark_against_best(
    lines: list[dict[str, Any]], runs: list[RunResult], main: str
) -> tuple[dict[str, dict[int, float]], str | None]:
    """Add the `vs best` column: which complete rows the tests cannot tell from the best.
    Returns the complete rows' per-seed values and the best row, which the other marks use."""
    complete = {line["method"] for line in lines if line["_complete"]}
    values = {n: v for n, v in per_seed(runs, main).items() if n in complete}
    best, marks = against_best(values)
    for line in lines:
        line[f"vs best ({main})"] = marks.get(line["method"], "incomplete: untested")
    return values, best


def _mark_equivalence(
    lines: list[dict[str, Any]], runs: list[RunResult],
    values: dict[str, dict[int, float]], best: str | None,
) -> None:  # fmt: skip
    """Add the `P(worse · ≈ · better)` columns (harness.report.bayes.within) from the
    complete rows' per-seed `values`: against the `best`, and against the zero-shot or
    untrained row, at the protocol's ROPE."""
    for column, cells in within(values, best, runs).items():
        for line in lines:
            line[column] = cells.get(line["method"], "incomplete: untested")


def _mark_against_zero_shot(lines: list[dict[str, Any]], runs: list[RunResult], main: str) -> None:
    """Under a pretrained backbone with a zero-shot row (verdicts.zero_shot_row): the `vs
    zero-shot` column, each complete row tested against it as `vs best` tests against the
    best, and that row named `<row> (zero-shot)`."""
    zero = zero_shot_row(runs)
    if zero is None:
        return
    complete = {line["method"] for line in lines if line["_complete"]}
    values = {n: v for n, v in per_seed(runs, main).items() if n in complete}
    marks = against(values, zero, "zero-shot") if zero in values else {}
    for line in lines:
        untested = "untested: zero-shot incomplete" if line["_complete"] else "incomplete: untested"
        line[f"vs zero-shot ({main})"] = marks.get(line["method"], untested)
        if line["method"] == zero:
            line["method"] = zero_shot_label(zero)


def _zero_shot_lines(group: list[RunResult]) -> list[str]:
    """The sentence above a table with a zero-shot row; none for other tables."""
    zero = zero_shot_row(group)
    if zero is None:
        return []
    return [
        f"`{zero_shot_label(zero)}` is the pretrained backbone's own features: it trained no "
        "step, no metric learning. `vs zero-shot` tests each complete row against it on the "
        "main metric as `vs best` does (paired t-test over seeds, Benjamini-Hochberg over the "
        "rows): `above` or `below` where the difference is significant at 5 %, `≈ zero-shot` "
        "where the seeds cannot tell the two apart.",
        "",
    ]  # fmt: skip


def _diagnostics_table(runs: list[RunResult]) -> str:
    """Method-specific numbers a result records (`diagnostics`, e.g. a learned metric's AUC
    on test pairs beside the Euclidean distance's), mean ± t-interval over seeds."""
    values: dict[str, dict[str, list[float]]] = {}
    names = row_names(runs)
    for r in runs:
        for key, value in (getattr(r, "diagnostics", None) or {}).items():
            if r.ok and isinstance(value, (int, float)):
                values.setdefault(names[id(r)], {}).setdefault(key, []).append(float(value))
    if not values:
        return ""
    rows = [{"method": name, **{k: _mean_std(pd.Series(v), 1, 3) for k, v in sorted(d.items())}}
            for name, d in sorted(values.items())]  # fmt: skip
    table = pd.DataFrame(rows).fillna("-")
    return tabulate(table, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def _parts_table(runs: list[RunResult]) -> str:
    """Each part of a composite embedding scored alone, one row per method and part, named
    `method / part`; empty when no run has parts."""
    with_parts = [r for r in runs if r.metrics_by_part]
    names = row_names(runs)  # the same row names as the main table
    return _table(with_parts, ranked=False, parts=True, names=names) if with_parts else ""


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

    paper = (runs[0].protocol.content or {}).get("paper") or {}
    runs = [r for r in runs if not r.tuning]  # the papers' numbers are at their defaults
    if not paper.get("reference") or not runs:
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
    names = row_names(runs)  # one row per method version (and hyperparameters), never mixed
    for row in sorted(set(names.values())):
        mine = [r for r in runs if names[id(r)] == row]
        method = mine[0].method.name
        theirs = published.get(aliases.get(method, method))
        if not theirs:
            continue
        finished, asked, missing = completeness(mine)
        partial = f" ({finished}/{asked} seeds, incomplete)" if missing else ""
        ok = [r for r in mine if r.ok]
        for metric, value in theirs.items():
            ours = [100 * r.metrics[metric] for r in ok if metric in (r.metrics or {})]
            mean = sum(ours) / len(ours) if ours else None
            rows.append({
                "method": (row if method == aliases.get(method, method)
                           else f"{row} (paper: {aliases[method]})") + partial,
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


def _protocol_lines(key: tuple[str, int, str, Any], group: list[RunResult]) -> list[str]:
    """One protocol's section: its paper comparison and tuned table where it has them, every
    run's table, the parts and diagnostics tables, and where the numbers came from."""
    name, version, hash_, max_steps = key
    envs = [r.environment or Environment() for r in group]
    commits = sorted({(e.git_commit or "?")[:10] for e in envs})
    devices = sorted({e.hardware.device or "?" for e in envs})
    machines = sorted({describe(e.fingerprint) for e in envs})
    dates = sorted(r.finished_at or r.started_at or "?" for r in group)
    title = f"## {name} (protocol v{version}, hash `{hash_}`)"
    if max_steps is not None:
        title += f" — shortened to {max_steps} steps, not comparable to full runs"
    lines = ["", title, "", *trunk_lines(group), *paper_comparison(group), *tuned_section(group)]
    if any(r.tuning for r in group):
        lines += ["### Every run of the protocol", ""]
    lines += [*_zero_shot_lines(group), _table(group), "", *claims_section(group)]
    parts = _parts_table(group)
    if parts:
        lines += ["Parts of composite embeddings, each part scored alone as `method / part`:",
                  "", parts, ""]  # fmt: skip
    diagnostics = _diagnostics_table(group)
    if diagnostics:
        lines += ["Diagnostics recorded by the methods (see docs/methods.md):", "",
                  diagnostics, ""]  # fmt: skip
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
    return lines + method_sources(group)


def render(runs: Iterable[RunResult | dict[str, Any]]) -> str:
    """The whole leaderboard as markdown (dicts are read as result files' JSON)."""
    runs = _coerce(runs)
    lines = [
        "# Leaderboard",
        "",
        "Generated by `python -m harness leaderboard` from the result files under `runs/`; "
        "do not edit by hand. Metrics in percent. `54.1 ± 1.9` is the mean over seeds ± the "
        "half-width of its 95 % Student t-interval (t quantile with n - 1 degrees of freedom "
        "times the standard error; one seed: the value alone). `seeds` counts finished runs; "
        "`2/3 (incomplete)` marks a method whose seeds asked for have not all finished: it "
        "ranks below every complete row. Rows rank by the protocol's main metric (its "
        "`evaluation.select_by`, MAP@R unless it says). `vs best` tests each complete row "
        "against the best one on that metric: a paired t-test over the seeds both ran (Welch's "
        "t-test when they share fewer than two), p-values adjusted over the rows by "
        "Benjamini-Hochberg (at most 5 % of the `below` marks are expected to be false); `≈ best` "
        "means not significantly different at 5 %: the seeds cannot tell the row from the best, "
        "which is not the same as equal (with 3 seeds the paired test has 2 degrees of freedom, "
        "so only consistent gaps are resolved; more seeds sharpen it). `P(worse · ≈ · better) "
        "vs best, ±1` tells those apart: the posterior probabilities that the row is worse "
        "than the best by more than the protocol's region of practical equivalence "
        "(`evaluation.rope`, in points), within it, or better, by the Bayesian correlated "
        "t-test over the seeds both ran (docs/verdicts.md); a probability of 0.95 or more "
        "is a verdict, anything less is undecided. `test-set ±` is the "
        "half-width of the 95 % "
        "percentile bootstrap interval over test queries (1,000 seeded resamples), averaged "
        "over seeds: how much the test set alone moves the number (`-`: a result made before "
        "runs recorded it). precision@1 is shown only where it differs from recall@1 (in "
        "all-vs-all retrieval the two are the same number). Speed is not in these tables: "
        "runs made at different times share the machine with different loads, so their "
        "img/s compare the load, not the methods; the Cost section measures every method side "
        "by side in one process (`harness cost`). A `+tuned` row uses the configuration `harness tune` found on "
        "validation classes (see Tuning); the others use the paper's defaults. Retrieval is "
        "all-vs-all on the test classes, which no model saw in training.",
    ]
    for key, group in sorted(_groups(runs).items(), key=str):
        lines += _protocol_lines(key, group)
    return "\n".join(lines) + "\n"


def training_figures(results_dir: Path) -> str:
    """Per protocol: the training-loss figure (results/figures/training_<protocol>.png) and
    the pair-distance histograms of every method (distances_<protocol>.png)."""

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


def tuning_section(results_dir: Path) -> str:
    """One row per tuning study (results/tuning/<protocol>/<method>.yaml): trials, folds, the
    validation objective of the best and of the paper-default configuration, the tuned
    hyperparameters, and the study's figure."""
    rows = []
    for path in sorted(Path(results_dir).glob("tuning/*/*.yaml")):
        data = _read_tuning(path)
        study = data.get("study") or {}
        capped = f" (trials capped at {study['max_steps']} steps)" if study.get("max_steps") else ""
        changed = {k: v for k, v in (data.get("hyperparameters") or {}).items()
                   if k in (study.get("searched") or data.get("hyperparameters") or {})}  # fmt: skip
        default = study.get("paper_default_value")
        rows.append({
            "protocol": f"{data.get('protocol')} (hash `{data.get('protocol_hash')}`)",
            "method": f"{data.get('method')}{capped}",
            "trials (pruned)": f"{study.get('trials')} ({study.get('pruned', 0)})",
            "folds": study.get("folds"),
            "best (validation)": f"{100 * study['best_value']:.1f}" if "best_value" in study else "-",
            "paper default (validation)": "-" if default is None else f"{100 * default:.1f}",
            "tuned hyperparameters": ", ".join(f"{k}={_short(v)}" for k, v in changed.items()),
            "figure": f"[objective per trial](tuning/{path.parent.name}/{study.get('figure')})",
        })  # fmt: skip
    if not rows:
        return ""
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                     disable_numparse=True)  # fmt: skip
    return ("\n## Tuning\n\nGenerated from `results/tuning/` (`python -m harness tune`): equal "
            "trials per method, Optuna TPE (seeded), each trial scored by the protocol's "
            "selection metric on validation classes (%), never on the test classes. `run "
            "--tuned` rows in the tables above use these configurations.\n\n" + table + "\n")  # fmt: skip


def _read_tuning(path: Path) -> dict[str, Any]:
    """A tuning file as the tuning section reads it, or a one-line error naming the file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())
    else:
        problem = _tuning_problem(data)
    if problem:
        raise HarnessError(
            f"tuning file {path} is unreadable ({problem}); rerun `{program_name()} tune` "
            "for it, or move it out of the results folder"
        )
    return data


def _tuning_problem(data: Any) -> str | None:
    """What in a tuning file's YAML does not have the shape the tuning section reads."""
    if not isinstance(data, dict):
        return "not a mapping"
    for key in ("study", "hyperparameters"):
        if not isinstance(data.get(key) or {}, dict):
            return f"{key}: not a mapping"
    study = data.get("study") or {}
    for key in ("best_value", "paper_default_value"):
        value = study.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"study.{key}: not a number"
    if not isinstance(study.get("searched") or {}, (dict, list)):
        return "study.searched: not a mapping or list"
    return None


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_leaderboard(results_dir: Path, reference: Path | None = None) -> Path:
    """Write results_dir/LEADERBOARD.md from its runs (with the figures, tuning and cost
    sections, and the comparison with a committed reference inside it; with `reference`,
    your runs and its runs of the same hashes in one table each); returns its path."""
    runs = load_results(results_dir)
    if not runs:
        raise HarnessError(
            f"no run results under {Path(results_dir) / 'runs'}: run `{program_name()} run` first"
        )
    beside = beside_section(runs, reference_runs(reference, runs), reference) if reference else ""
    path = Path(results_dir) / "LEADERBOARD.md"
    rendered = render(runs)
    head, sep, tables = rendered.partition("\n## ")  # the glance goes before the tables
    posteriors = cache_for(Path(results_dir))  # the hierarchical model's, kept between runs
    groups = protocol_groups(runs, tuned=True)
    text = (head + glance_section(runs, Path(results_dir), posteriors)
            + tuned_verdict_section(groups) + claims_across_section(groups) + sep + tables
            + agreement_section(runs) + equivalence_section(protocol_blocks(runs), posteriors)
            + reference_section(Path(results_dir), runs) + beside
            + training_figures(Path(results_dir)) + tuning_section(Path(results_dir))
            + cost_section(Path(results_dir)))  # fmt: skip
    write_text_atomic(path, text)  # a unique temporary file: two writers never share one
    posteriors.save()
    return path

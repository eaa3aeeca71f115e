"""Results -> markdown leaderboard: one table per protocol (harness.report.table), mean and
95 % t-interval over seeds, in one document with its sections.

Always regenerated from the result files, never edited by hand. Runs of an older protocol
version (another hash) or with a shortened budget (--max-steps) get tables of their own:
numbers from different protocols are not comparable and are never averaged together. A
results folder with a committed reference inside it (results/reference) gets a section that
sets its runs beside the reference's (harness.report.reference).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.core import (
    HarnessError,
    paper_results,
    program_name,
)
from harness.records import (
    Environment,
    RunResult,
    completeness,
    describe,
    load_results,
    parse_result,
    protocol_groups,
    row_names,
    write_text_atomic,
)
from harness.report.agreement import agreement_section
from harness.report.beside import beside_section, reference_runs
from harness.report.claims import claims_across_section, claims_section
from harness.report.cost_tables import cost_section
from harness.report.datasets_table import datasets_section
from harness.report.equivalence import section as equivalence_section
from harness.report.figures import distance_histograms, training_curve
from harness.report.glance import glance_section
from harness.report.reference import reference_section
from harness.report.table import diagnostics_table, leaderboard_table, parts_table, zero_shot_lines
from harness.report.trunk import method_sources, trunk_lines
from harness.report.tuned import tuned_section
from harness.report.tuned_verdict import tuned_verdict_section
from harness.stats import cache_for, protocol_blocks
from harness.sweep import read_tuning_file


def _coerce(runs: Iterable[RunResult | dict[str, Any]]) -> list[RunResult]:
    """Results as RunResults; a dict (a result file's JSON) is read with its schema checks."""
    return [r if isinstance(r, RunResult) else parse_result(r, "(in memory)") for r in runs]


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
    lines += [*zero_shot_lines(group), leaderboard_table(group), "", *claims_section(group)]
    parts = parts_table(group)
    if parts:
        lines += ["Parts of composite embeddings, each part scored alone as `method / part`:",
                  "", parts, ""]  # fmt: skip
    diagnostics = diagnostics_table(group)
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
        data = read_tuning_file(path)
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
    text = (head + datasets_section(groups) + glance_section(runs, Path(results_dir), posteriors)
            + tuned_verdict_section(groups) + claims_across_section(groups) + sep + tables
            + agreement_section(runs) + equivalence_section(protocol_blocks(runs), posteriors)
            + reference_section(Path(results_dir), runs) + beside
            + training_figures(Path(results_dir)) + tuning_section(Path(results_dir))
            + cost_section(Path(results_dir)))  # fmt: skip
    write_text_atomic(path, text)  # a unique temporary file: two writers never share one
    posteriors.save()
    return path

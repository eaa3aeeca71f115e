"""Which method is better once each is tuned (Musgrave et al., "A Metric Learning Reality
Check", ECCV 2020): for a protocol whose results hold both paper-default runs and `+tuned`
runs (`run --tuned`, each configuration found by `tune` on validation classes with the same
budget), one table with every method's tuned and default numbers side by side, how much
tuning moved each (a paired interval over the seeds both ran), and how sure the verdicts
are before and after: how many methods the best is significantly better than, and which
pairwise orderings of the default table flip.

A method that has no `+tuned` runs enters the tuned ranking with its paper-default runs and
says why: no search space (nothing to tune, e.g. `untrained`) or not tuned yet.
"""

from __future__ import annotations

import itertools
import math
import statistics

import pandas as pd
from tabulate import tabulate

from harness.core import METHODS, benjamini_hochberg, compare, load_methods, t_interval
from harness.records import RunResult
from harness.report.bayes import within
from harness.report.verdicts import (
    ALPHA,
    against,
    against_best,
    main_metric,
    per_seed,
    row_names,
    untrained_row,
    zero_shot_label,
    zero_shot_row,
)

TUNED = "+tuned"


def _cell(values: dict[int, float], scale: float = 100.0) -> str:
    mean, half = t_interval(list(values.values()))
    if math.isnan(mean):
        return "-"
    return f"{mean * scale:.1f}" + ("" if math.isnan(half) else f" ± {half * scale:.1f}")


def _count(n: int) -> str:
    return f"{n} method" + ("" if n == 1 else "s")


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values) if values else math.nan


def _why_untuned(method: str) -> str:
    """Why a method has no tuned runs, from its registry entry where it is registered."""
    load_methods()  # `leaderboard` does not load them up front: only a tuned table asks
    spec = METHODS.get(method) if method in METHODS else None
    if spec is not None and not spec.search:
        return "not tuned: no search space"
    return "not tuned yet"


def tuned_values(
    runs: list[RunResult], metric: str
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]], dict[str, str]]:
    """(default, tuned, notes): each method's per-seed values at its paper defaults and tuned,
    keyed by the default row's name. A method without tuned runs gets its default values in
    `tuned` too, and a note saying why it was not tuned."""
    values = per_seed(runs, metric)
    names = row_names(runs)
    method_of = {names[id(r)]: r.method.name for r in runs}
    default = {n: v for n, v in values.items() if TUNED not in n}
    tuned_runs = {n.replace(TUNED, "", 1): v for n, v in values.items() if TUNED in n}
    tuned: dict[str, dict[int, float]] = {}
    notes: dict[str, str] = {}
    for name in sorted(set(default) | set(tuned_runs)):
        if name in tuned_runs:
            tuned[name] = tuned_runs[name]
            if name not in default:
                notes[name] = "no paper-default runs"
        else:
            tuned[name] = default[name]
            notes[name] = _why_untuned(method_of[name])
    return default, tuned, notes


def tuned_view(runs: list[RunResult]) -> tuple[list[RunResult], dict[int, str]]:
    """The tuned ranking's runs and their rows (run id -> row): each method's `+tuned` runs
    named as its default row, and the default runs of a method that has no tuned runs; the
    rule `tuned_values` applies to per-seed values, for a caller that needs the runs."""
    names = row_names(runs)
    tuned_rows = {names[id(r)].replace(TUNED, "", 1) for r in runs if r.tuning}
    kept = [r for r in runs if r.tuning or names[id(r)] not in tuned_rows]
    return kept, {id(r): names[id(r)].replace(TUNED, "", 1) for r in kept}


def _significant_wins(values: dict[str, dict[int, float]]) -> tuple[str | None, int]:
    """The best row and how many rows it is significantly better than (the leaderboard's
    `below` marks: paired t-tests against the best, Benjamini-Hochberg adjusted)."""
    best, marks = against_best(values)
    return best, sum(mark.startswith("below") for mark in marks.values())


def flipped_pairs(
    default: dict[str, dict[int, float]], tuned: dict[str, dict[int, float]]
) -> tuple[int, int, list[tuple[str, str]], list[tuple[str, str]]]:
    """(pairs, flips, resolved flips, reversed verdicts): how many pairs of methods the two
    tables share, how many are ordered the other way round after tuning (by mean), those
    flips that reverse an ordering the default table resolved, and those of them that the
    tuned table resolves the other way (paired t-tests, Benjamini-Hochberg adjusted over all
    pairs of each table, 5 %): the verdicts tuning overturned."""
    names = sorted(set(default) & set(tuned))
    pairs = list(itertools.combinations(names, 2))
    flips = [(a, b) for a, b in pairs
             if (_mean(default[a]) - _mean(default[b])) * (_mean(tuned[a]) - _mean(tuned[b])) < 0]  # fmt: skip
    before = benjamini_hochberg({f"{a}|{b}": compare(default[a], default[b]).p for a, b in pairs})
    after = benjamini_hochberg({f"{a}|{b}": compare(tuned[a], tuned[b]).p for a, b in pairs})
    resolved = [(a, b) for a, b in flips if before[f"{a}|{b}"] < ALPHA]
    reversed_ = [(a, b) for a, b in resolved if after[f"{a}|{b}"] < ALPHA]
    return len(pairs), len(flips), resolved, reversed_


def _tuned_verdicts(runs: list[RunResult], tuned: dict[str, dict[int, float]], best: str | None
                    ) -> dict[str, dict[str, str]]:  # fmt: skip
    """Column -> row -> cell of the tuned ranking's verdicts beyond `vs best`: P(worse · ≈ ·
    better) against the best tuned row; under a pretrained backbone, `vs zero-shot` and its
    P(worse · ≈ · better) (the zero-shot row has nothing to tune: its default runs)."""
    probs = within(tuned, best, runs, tag=", tuned")
    zero = zero_shot_row(runs)
    if zero is None or zero not in tuned:
        return probs
    out = {c: v for c, v in probs.items() if " vs best," in c}
    out["vs zero-shot, tuned"] = against(tuned, zero, "zero-shot")
    out.update({c: v for c, v in probs.items() if " vs best," not in c})
    return out


def tuned_frame(runs: list[RunResult]) -> pd.DataFrame:
    """One row per method, best tuned first: tuned and default main metric with their `vs
    best` marks (each within its own table), how much tuning moved it, tuned recall@1, and
    the tuned ranking's P(worse · ≈ · better) against its best (and against zero-shot)."""
    metric = main_metric(runs)
    default, tuned, notes = tuned_values(runs, metric)
    best, tuned_marks = against_best(tuned)
    _, default_marks = against_best(default)
    verdicts = _tuned_verdicts(runs, tuned, best)
    zero = zero_shot_row(runs)
    recall_default, recall_tuned, _ = tuned_values(runs, "recall@1")
    won = default_won(runs)
    rows = []
    for name in sorted(tuned, key=lambda n: -_mean(tuned[n])):
        moved = "-"
        if name in default and name not in notes:
            c = compare(tuned[name], default[name])
            moved = f"{100 * c.difference:+.1f}"
            if not math.isnan(c.half_width):
                moved += f" [{100 * (c.difference - c.half_width):+.1f}, "
                moved += f"{100 * (c.difference + c.half_width):+.1f}]"
        rows.append({
            "method": zero_shot_label(name) if name == zero else name,
            f"tuned {metric} (%)": _cell(tuned[name]),
            "vs best, tuned": tuned_marks.get(name, "-"),
            "tuning moved it": moved,
            f"paper default {metric} (%)": _cell(default.get(name, {})),
            "vs best, default": default_marks.get(name, "-"),
            "tuned recall@1 (%)": _cell(recall_tuned.get(name, recall_default.get(name, {}))),
            **{column: cells.get(name, "-") for column, cells in verdicts.items()},
            "notes": notes.get(name, "the paper default won its study" if name in won else ""),
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if not (frame["notes"] != "").any():
        frame = frame.drop(columns="notes")
    return frame


def tuned_table(runs: list[RunResult]) -> str:
    """tuned_frame as a GitHub markdown table (the leaderboard's, and the README's copy)."""
    return tabulate(tuned_frame(runs), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def default_won(runs: list[RunResult]) -> set[str]:
    """The rows (default names) whose study found nothing better than its first trial, the
    paper's configuration: their tuned runs repeat the default runs."""
    names = row_names(runs)
    won: dict[str, bool] = {}
    for r in runs:
        if r.tuning:
            row = names[id(r)].replace(TUNED, "", 1)
            won[row] = won.get(row, True) and r.tuning.get("best_trial") == 0
    return {row for row, w in won.items() if w}


def gaps(values: dict[str, dict[int, float]], rows: list[str]) -> tuple[float, float]:
    """(best - median, best - worst) of the rows' means, in points: how far apart the methods
    of one ranking lie."""
    means = sorted(100 * _mean(values[n]) for n in rows)
    return means[-1] - statistics.median(means), means[-1] - means[0]


def _gaps_line(runs: list[RunResult], default: dict[str, dict[int, float]],
               tuned: dict[str, dict[int, float]], ties: int, default_ties: int) -> str:  # fmt: skip
    """The Reality Check's finding tested on one protocol: do the gaps between methods shrink
    once every method is tuned? (The row that trained no step is not a method here.)"""
    reference = untrained_row(runs)
    rows = [n for n in tuned if n in default and n != reference]
    if len(rows) < 2:
        return "- **Gaps:** fewer than two methods to compare."
    (median_d, worst_d), (median_t, worst_t) = gaps(default, rows), gaps(tuned, rows)
    return (f"- **Gaps** (Musgrave et al. found published gaps shrink once every method is "
            f"tuned): the best of {len(rows)} methods leads the median one by {median_d:.1f} "
            f"points at the papers' defaults and by {median_t:.1f} tuned, the worst by "
            f"{worst_d:.1f} and {worst_t:.1f}; {ties} rows are `≈ best` tuned, {default_ties} "
            "at the defaults.")  # fmt: skip


def tuned_section(runs: list[RunResult]) -> list[str]:
    """The markdown of one protocol's tuned comparison (empty without tuned runs)."""
    if not any(r.tuning for r in runs):
        return []
    metric = main_metric(runs)
    default, tuned, notes = tuned_values(runs, metric)
    table = tuned_table(runs)
    best_tuned, wins_tuned = _significant_wins(tuned)
    best_default, wins_default = _significant_wins(default)
    ties = sum(m.startswith("≈") for m in against_best(tuned)[1].values())
    default_ties = sum(m.startswith("≈") for m in against_best(default)[1].values())
    pairs, flips, resolved, reversed_ = flipped_pairs(default, tuned)
    moved = {n: compare(tuned[n], default[n]) for n in tuned if n in default and n not in notes}
    up = sum(c.p < ALPHA and c.difference > 0 for c in moved.values())
    down = sum(c.p < ALPHA and c.difference < 0 for c in moved.values())
    most = sorted(moved, key=lambda n: -abs(moved[n].difference))[:3]
    lines = [
        f"### Tuned against paper defaults ({metric})", "",
        "Each method's `+tuned` runs use the configuration `tune` found on validation "
        "classes with the same budget as every other method (see Tuning); `tuning moved it` "
        "is tuned − default with its 95 % interval over the seeds both ran. `vs best` is "
        "tested within each column's own table.", "", table, "",
        f"- **How sure:** tuned, the best ({best_tuned}) is significantly better than "
        f"{wins_tuned} of {len(tuned) - 1} methods and {ties} cannot be told from it; at the "
        f"papers' defaults, the best ({best_default}) was significantly better than "
        f"{wins_default} of {len(default) - 1}.",
        _gaps_line(runs, default, tuned, ties, default_ties),
        f"- **Orderings that flipped:** {flips} of the {pairs} pairs of methods are ordered "
        f"the other way round after tuning; {len(resolved)} of those reverse an ordering the "
        f"default table resolved (paired t-tests, Benjamini-Hochberg over all pairs, 5 %), and "
        f"{len(reversed_)} of these the tuned table resolves the other way"
        + (": " + ", ".join(f"{a} / {b}" for a, b in reversed_[:10]) if reversed_ else "")
        + (" ..." if len(reversed_) > 10 else "") + ". Every other flip is within the seeds' "
        "noise on at least one side.",
        f"- **What tuning moved:** {_count(up)} significantly up, {down} significantly down, "
        f"{len(moved) - up - down} within their seeds' noise; most: "
        + ", ".join(f"{n} {100 * moved[n].difference:+.1f}" for n in most) + ".",
    ]  # fmt: skip
    won = sorted(default_won(runs))
    if won:
        lines.append(f"- **The paper default won its study** ({len(won)}; their tuned runs "
                     f"repeat the default ones): {', '.join(won)}.")  # fmt: skip
    if notes:
        lines.append(f"- **Not tuned** ({len(notes)}): " + ", ".join(
            f"{n} ({why.removeprefix('not tuned: ')})" for n, why in sorted(notes.items())) + ".")  # fmt: skip
    return [*lines, ""]

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

import math
import statistics
from dataclasses import dataclass

import pandas as pd
from tabulate import tabulate

from harness.records import (
    TUNED,
    RunResult,
    main_metric,
    row_names,
    tuned_values,
    untrained_row,
    zero_shot_row,
)
from harness.report.machines import tuned_machines_line
from harness.report.verdicts import ALPHA, against, against_best, within, zero_shot_label
from harness.stats import compare, flipped_pairs, t_interval


def _cell(values: dict[int, float], scale: float = 100.0) -> str:
    mean, half = t_interval(list(values.values()))
    if math.isnan(mean):
        return "-"
    return f"{mean * scale:.1f}" + ("" if math.isnan(half) else f" ± {half * scale:.1f}")


def _count(n: int) -> str:
    return f"{n} method" + ("" if n == 1 else "s")


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values) if values else math.nan


@dataclass(frozen=True)
class TunedSummary:
    """One protocol's tuned comparison, computed once for its table, its section and the
    tuned verdict: the per-seed values both ways, the `vs best` marks of each table and the
    orderings tuning flipped (see `flipped_pairs`)."""

    metric: str
    default: dict[str, dict[int, float]]
    tuned: dict[str, dict[int, float]]
    notes: dict[str, str]
    best: str | None  # of the tuned ranking
    marks: dict[str, str]
    best_default: str | None
    default_marks: dict[str, str]
    pairs: int
    flips: int
    resolved: list[tuple[str, str]]
    reversed_: list[tuple[str, str]]

    @property
    def ties(self) -> list[str]:
        """The tuned rows that cannot be told from the best, best first."""
        tied = (n for n, m in self.marks.items() if m.startswith("≈"))
        return sorted(tied, key=lambda n: -_mean(self.tuned[n]))

    @property
    def default_ties(self) -> int:
        return sum(m.startswith("≈") for m in self.default_marks.values())

    def wins(self, tuned: bool = True) -> int:
        """How many rows the best is significantly better than, tuned or at the defaults."""
        return sum(
            m.startswith("below") for m in (self.marks if tuned else self.default_marks).values()
        )

    def gaps(self, rows: list[str]) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """((best - median, best - worst) at the defaults, the same tuned) over `rows`, in
        points; None with fewer than two rows (no gap to compare)."""
        if len(rows) < 2:
            return None
        return gaps(self.default, rows), gaps(self.tuned, rows)


def tuned_summary(runs: list[RunResult]) -> TunedSummary:
    """The protocol's TunedSummary on its main metric."""
    metric = main_metric(runs)
    default, tuned, notes = tuned_values(runs, metric)
    best, marks = against_best(tuned)
    best_default, default_marks = against_best(default)
    pairs, flips, resolved, reversed_ = flipped_pairs(default, tuned)
    return TunedSummary(metric, default, tuned, notes, best, marks, best_default, default_marks,
                        pairs, flips, resolved, reversed_)  # fmt: skip


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
    return _frame(runs, tuned_summary(runs))


def _frame(runs: list[RunResult], s: TunedSummary) -> pd.DataFrame:
    metric, default, tuned, notes = s.metric, s.default, s.tuned, s.notes
    tuned_marks, default_marks = s.marks, s.default_marks
    verdicts = _tuned_verdicts(runs, tuned, s.best)
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
    return _table(tuned_frame(runs))


def _table(frame: pd.DataFrame) -> str:
    return tabulate(frame, headers="keys", tablefmt="github", showindex=False,
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


def gap_rows(runs: list[RunResult], s: TunedSummary) -> list[str]:
    """The rows whose gaps are compared: methods with runs both ways (the row that trained no
    step is not a method here)."""
    reference = untrained_row(runs)
    return [n for n in s.tuned if n in s.default and n != reference]


def _gaps_line(runs: list[RunResult], s: TunedSummary) -> str:
    """The Reality Check's finding tested on one protocol: do the gaps between methods shrink
    once every method is tuned?"""
    rows = gap_rows(runs, s)
    both = s.gaps(rows)
    if both is None:
        return "- **Gaps:** fewer than two methods to compare."
    (median_d, worst_d), (median_t, worst_t) = both
    return (f"- **Gaps** (Musgrave et al. found published gaps shrink once every method is "
            f"tuned): the best of {len(rows)} methods leads the median one by {median_d:.1f} "
            f"points at the papers' defaults and by {median_t:.1f} tuned, the worst by "
            f"{worst_d:.1f} and {worst_t:.1f}; {len(s.ties)} rows are `≈ best` tuned, "
            f"{s.default_ties} at the defaults.")  # fmt: skip


def tuned_section(runs: list[RunResult]) -> list[str]:
    """The markdown of one protocol's tuned comparison (empty without tuned runs)."""
    if not any(r.tuning for r in runs):
        return []
    s = tuned_summary(runs)
    metric, default, tuned, notes = s.metric, s.default, s.tuned, s.notes
    table = _table(_frame(runs, s))
    moved = {n: compare(tuned[n], default[n]) for n in tuned if n in default and n not in notes}
    up = sum(c.p < ALPHA and c.difference > 0 for c in moved.values())
    down = sum(c.p < ALPHA and c.difference < 0 for c in moved.values())
    most = sorted(moved, key=lambda n: -abs(moved[n].difference))[:3]
    pairs, flips, resolved, reversed_ = s.pairs, s.flips, s.resolved, s.reversed_
    lines = [
        f"### Tuned against paper defaults ({metric})", "",
        "Each method's `+tuned` runs use the configuration `tune` found on validation "
        "classes with the same budget as every other method (see Tuning); `tuning moved it` "
        "is tuned − default with its 95 % interval over the seeds both ran. `vs best` is "
        "tested within each column's own table.", "", table, "",
        f"- **How sure:** tuned, the best ({s.best}) is significantly better than "
        f"{s.wins()} of {len(tuned) - 1} methods and {len(s.ties)} cannot be told from it; at "
        f"the papers' defaults, the best ({s.best_default}) was significantly better than "
        f"{s.wins(tuned=False)} of {len(default) - 1}.",
        _gaps_line(runs, s),
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
    lines += tuned_machines_line(runs)  # which machines, where seeds pair across two
    won = sorted(default_won(runs))
    if won:
        lines.append(f"- **The paper default won its study** ({len(won)}; their tuned runs "
                     f"repeat the default ones): {', '.join(won)}.")  # fmt: skip
    if notes:
        lines.append(f"- **Not tuned** ({len(notes)}): " + ", ".join(
            f"{n} ({why.removeprefix('not tuned: ')})" for n, why in sorted(notes.items())) + ".")  # fmt: skip
    return [*lines, ""]

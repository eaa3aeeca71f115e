"""The tuned real-photo verdict as a table and a paragraph, over every pretrained protocol (a
table row each, marked while its studies have not run): which tuned methods cannot be told
from the best, how many orderings tuning flipped,
whether the gaps between methods shrink once each is tuned (the Reality Check's finding),
and which of the seed papers' claims hold only untuned. The leaderboard carries it and the
README's first screen quotes it; both come from this one computation (a test checks it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.records import RunResult, pretrained, zero_shot_row
from harness.report.claims import claim_rows
from harness.report.tuned import TunedSummary, _mean, gap_rows, tuned_summary

SHOWN = 2  # tied names listed per protocol; the rest are counted


@dataclass(frozen=True)
class ProtocolVerdict:
    """One protocol's tuned ranking, in the few numbers the paragraph quotes."""

    name: str
    metric: str
    best: str
    ties: list[str]  # `≈ best` tuned, best first
    pairs: int
    flips: int
    resolved_flips: int  # of those, orderings the default table had resolved
    reversed_flips: int  # of these, resolved the other way round tuned
    gap_default: float  # best - median method, points
    gap_tuned: float
    trials: set[int]
    seeds: int  # of the tuned runs, per method at most
    only_untuned: list[str]  # claims that hold at the defaults and not tuned
    only_tuned: list[str]  # claims that hold tuned and not at the defaults


def protocol_verdict(name: str, runs: list[RunResult], s: TunedSummary | None = None
                     ) -> ProtocolVerdict | None:  # fmt: skip
    """The tuned verdict of one protocol (`s`: its tuned_summary, when the caller has it);
    None without tuned runs or under random weights."""
    if not runs or not pretrained(runs) or not any(r.tuning for r in runs):
        return None
    s = s or tuned_summary(runs)
    # gaps need two methods with runs both ways (a protocol tuned before its defaults ran has none)
    both = s.gaps(gap_rows(runs, s))
    (gap_default, _), (gap_tuned, _) = both or ((math.nan, math.nan), (math.nan, math.nan))
    judged = [r for r in claim_rows(runs) if "tuned verdict" in r]
    untuned = [r["claim"] for r in judged if r["tuned verdict"].endswith("holds only untuned")]
    tuned_only = [r["claim"] for r in judged if r["tuned verdict"].endswith("holds only tuned")]
    return ProtocolVerdict(
        name, s.metric, str(s.best), s.ties, s.pairs, s.flips,
        len(s.resolved), len(s.reversed_), gap_default, gap_tuned,
        {int(r.tuning["trials"]) for r in runs if r.tuning and "trials" in r.tuning},
        len({r.seed for r in runs if r.tuning}), untuned, tuned_only,
    )  # fmt: skip


def _ties(ties: list[str]) -> str:
    if not ties:
        return "none"
    more = len(ties) - SHOWN
    return f"{len(ties)}: " + ", ".join(ties[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def verdict_table(groups: dict[str, list[RunResult]], given: dict[str, TunedSummary]) -> str:
    """The per-dataset verdicts, one row per real-photo protocol: the leader once each method
    is tuned (at the papers' defaults, marked, while the protocol's studies have not run), the
    rows the seeds cannot tell from it (`vs best`), the zero-shot and the leader's MAP@R, and
    the leader's lead over the median method at the defaults and tuned (the Reality Check's
    gap). `given`: each protocol's tuned_summary, computed once for the table and paragraph."""
    lines = ["| dataset | leader | ≈ leader | zero-shot | leader's | its lead over the median, "
             "defaults → tuned |", "|---|---|---|---:|---:|---|"]  # fmt: skip
    for name, runs in sorted(groups.items()):
        if not runs or not pretrained(runs):
            continue
        s, tuned, zero = given[name], any(r.tuning for r in runs), zero_shot_row(runs)
        both = s.gaps(gap_rows(runs, s))
        lead = "-" if both is None else f"{both[0][0]:.1f} → " + (
            f"{both[1][0]:.1f}" if tuned else "not tuned yet")  # fmt: skip
        zero_shot = f"{100 * _mean(s.default[zero]):.1f}" if s.default.get(zero or "") else "-"
        lines.append(f"| {name} | {s.best}{'' if tuned else ' (*defaults*)'} | {_ties(s.ties)} "
                     f"| {zero_shot} | {100 * _mean(s.tuned[str(s.best)]):.1f} | {lead} |")  # fmt: skip
    return "\n".join(lines)


def tuned_verdict(groups: dict[str, list[RunResult]], flips: bool = True) -> str:
    """The per-dataset table and the paragraph under it (empty when no pretrained protocol has
    tuned runs); without `flips`, the README's copy, which leaves the count of flipped
    orderings to the leaderboard."""
    given = {name: tuned_summary(g) for name, g in groups.items() if g and pretrained(g)}
    verdicts = [v for n, g in sorted(groups.items()) if (v := protocol_verdict(n, g, given.get(n)))]
    if not verdicts:
        return ""
    trials = set().union(*(v.trials for v in verdicts))
    seeds = max(v.seeds for v in verdicts)
    budget = f"{min(trials)}" if len(trials) == 1 else f"{min(trials)} to {max(trials)}"
    flipped = ", ".join(f"{v.flips} of {v.pairs} pairs on {v.name} ({v.resolved_flips} resolved "
                        f"at the defaults, {v.reversed_flips} of them resolved the other way "
                        "tuned)" for v in verdicts)  # fmt: skip
    flipped = f" Tuning flipped the ordering of {flipped}." if flips else ""
    gap = _gaps([v for v in verdicts if not math.isnan(v.gap_default)])
    claims = _claims(verdicts)
    metric = {"map@r": "MAP@R"}.get(verdicts[0].metric, verdicts[0].metric)
    table = verdict_table(groups, given)
    waiting = (" (a dataset marked *defaults*: its paper-default runs only, its studies still "
               "to run)") if "*defaults*" in table else ""  # fmt: skip
    return (
        f"{table}\n\n{metric} in percent, the mean over seeds. Tuned, each "
        f"method with the same {budget} Optuna trials on validation classes (the first its "
        f"paper default), then {seeds} seeds on the test classes{waiting}.{flipped}{gap} {claims}"
    )  # fmt: skip


def _gaps(verdicts: list[ProtocolVerdict]) -> str:
    """The sentence on the Reality Check's finding (empty when no protocol has two methods
    with runs at the defaults and tuned)."""
    if not verdicts:
        return ""
    shrink = sum(v.gap_tuned < v.gap_default for v in verdicts)
    return (f" The Reality Check's finding, that gaps shrink once every method is tuned, holds "
            f"on {shrink} of {len(verdicts)} tuned datasets (the last column).")  # fmt: skip


def _claims(verdicts: list[ProtocolVerdict]) -> str:
    """The sentence on the seed papers' claims judged again tuned."""
    untuned = [f"{c} ({v.name})" for v in verdicts for c in v.only_untuned]
    tuned = [f"{c} ({v.name})" for v in verdicts for c in v.only_tuned]
    if not untuned and not tuned:
        return "Every seed-paper claim gets the same verdict tuned as at the defaults."
    parts = [f"{len(names)} hold{'s' if len(names) == 1 else ''} only {when}: {', '.join(names)}"
             for names, when in ((untuned, "untuned"), (tuned, "tuned")) if names]  # fmt: skip
    return f"Of the seed papers' claims judged again tuned, {'; '.join(parts)}."


def tuned_verdict_section(groups: dict[str, list[RunResult]]) -> str:
    """The leaderboard's section holding the paragraph (empty without tuned photo runs)."""
    text = tuned_verdict(groups)
    if not text:
        return ""
    return "\n".join(["", "## The tuned real-photo verdict", "", text, "",
                      "Each protocol's section below has its tuned table.", ""])  # fmt: skip

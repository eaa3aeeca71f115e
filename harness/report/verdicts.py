"""Which method is better, and how sure, as the tables mark it: the methods not significantly
different from the best (tests against the best's seeds, Benjamini-Hochberg) and, under a
pretrained backbone, above or below the zero-shot row (the same tests); and each row's
P(worse · ≈ · better) against those rows (the correlated t-test of harness.stats.bayes)."""

from __future__ import annotations

import math

from harness.records import RunResult, pretrained, untrained_row
from harness.stats import (
    SCALE,
    benjamini_hochberg,
    compare,
    protocol_rope,
    seed_probs,
)

ALPHA = 0.05


def against_best(values: dict[str, dict[int, float]]) -> tuple[str | None, dict[str, str]]:
    """The best row by mean, and per row a mark: `best`, `≈ best (p = …)` when the
    test against the best, Benjamini-Hochberg-adjusted over the rows, does not reject at 5 %,
    `below (p = …)` when it does,
    or `1 seed: untested`."""
    means = {name: sum(v.values()) / len(v) for name, v in values.items() if v}
    if not means:
        return None, {}
    best = max(means, key=lambda n: means[n])
    return best, against({n: values[n] for n in means}, best, "best")


def zero_shot_label(row: str) -> str:
    """How the leaderboard names the zero-shot row: `row (zero-shot)`."""
    return f"{row} (zero-shot)"


def against(
    values: dict[str, dict[int, float]], reference: str, label: str
) -> dict[str, str]:  # fmt: skip
    """Per row, a mark against the `reference` row, by the tests of `against_best` (p-values
    Benjamini-Hochberg-adjusted over the rows): `above (p = …)` or `below (p = …)` where
    the test rejects at 5 %, `≈ {label} (p = …)` where it does not, `{label}` for the
    reference itself, `n seed: untested` where a side has one seed."""
    tests = {n: compare(v, values[reference]) for n, v in values.items() if n != reference and v}
    adjusted = benjamini_hochberg({n: c.p for n, c in tests.items()})
    marks = {reference: label}
    for name, p in adjusted.items():
        if math.isnan(p):
            marks[name] = f"{min(len(values[name]), len(values[reference]))} seed: untested"
        elif p >= ALPHA:
            marks[name] = f"≈ {label} (p = {p:.2g})"
        else:
            marks[name] = f"{'above' if tests[name].difference > 0 else 'below'} (p = {p:.2g})"
    return marks


def within_column(label: str, rope: float, tag: str = "") -> str:
    """The leaderboard's column of probabilities against the `label` row (best, zero-shot);
    `tag` names a table of its own (", tuned")."""
    return f"P(worse · ≈ · better) vs {label}{tag}, ±{rope:g}"


def within(values: dict[str, dict[int, float]], best: str | None, runs: list[RunResult],
           tag: str = "") -> dict[str, dict[str, str]]:  # fmt: skip
    """Within one protocol: column -> row -> cell, each row's probabilities against the
    `best` row and against the zero-shot (pretrained) or untrained (from scratch) row, by the
    correlated t-test over the seeds both ran (`values`: row -> seed -> main metric, the
    complete rows). The reference's own cell names it; a row with one shared seed is
    untested. `tag` goes into the column names (within_column)."""
    rope = protocol_rope(runs[0].protocol.content if runs else None)
    untrained = untrained_row(runs)
    # the row that trained no step is named by its role under a pretrained backbone, else
    # by its own name (random weights)
    references = [(best, "best"), (untrained, "zero-shot" if pretrained(runs) else untrained)]
    out = {}
    for reference, label in references:
        if reference not in values:
            continue
        ref = {s: SCALE * v for s, v in values[reference].items()}
        cells = {reference: label}
        for name, seeds in values.items():
            if name != reference:
                p = seed_probs({s: SCALE * v for s, v in seeds.items()}, ref, rope)
                cells[name] = p.cell() if p else f"{min(len(seeds), len(ref))} seed: untested"
        out[within_column(label, rope, tag)] = cells
    return out
